/*
 * corral-php-worker's SAPI module: the one piece of C between the worker (Rust) and PHP's
 * embed library (libphp8.2). It defines the SAPI callbacks PHP calls during a request
 * (output, headers, POST body, cookies, server variables, log lines) and forwards each to the
 * Rust side (src/php.rs) through the `corral_rs_*` functions, with the request's context as
 * an opaque pointer held in SG(server_context). Nothing here reads the network or allocates
 * outside PHP's own allocators.
 *
 * The module calls itself "litespeed": OPcache runs only under SAPI names it knows (php-fpm's,
 * Apache's, LiteSpeed's ...), and the worker is, like lsphp, an LSAPI backend answering one
 * request at a time, so PHP_SAPI reads "litespeed" as it does under lsphp.
 *
 * Worker mode (corral_php_worker): the worker script runs as one long PHP request (its
 * "boot" request, whose output goes to the log) and calls corral_handle_request($handler)
 * in a loop. Each call waits for the next request (Rust: corral_rs_worker_next), makes it
 * PHP's current request without ending the script (a fresh output layer and SAPI state,
 * $_GET, $_POST, $_COOKIE, $_FILES, $_SERVER and $_REQUEST rebuilt, php://input and the
 * timeout reset), calls the handler, and ends that request (output flushed, headers sent,
 * POST data and uploaded files released) before it returns true. Objects the script keeps
 * survive; the superglobals and output state do not. A fatal error, an uncaught exception
 * or exit() in the handler ends the script: the request in progress is answered by PHP's
 * own shutdown, and the worker process then exits, so that the next request meets a fresh
 * process (src/worker.rs, retire).
 */

#include <main/php.h>
#include <main/SAPI.h>
#include <main/php_main.h>
#include <main/php_variables.h>
#include <main/php_ini.h>
#include <zend_ini.h>
#include <zend_stream.h>
#include <zend_signal.h>
#include <zend_exceptions.h>

/* The Rust side (src/php.rs). `ctx` is the request context SG(server_context) holds. */
extern size_t corral_rs_write(void *ctx, const char *buf, size_t len);
extern void corral_rs_flush(void *ctx);
/* One response header line as PHP holds it ("Name: value"), borrowed for one call. */
struct corral_line {
    const char *text;
    size_t len;
};
extern void corral_rs_send_head(void *ctx, int status, const struct corral_line *lines,
                                size_t count);
extern size_t corral_rs_read_body(void *ctx, char *buf, size_t len);
extern void corral_rs_register_variables(void *ctx, zval *track_vars_array, int keep_keys);
extern void corral_rs_release_keys(void);
extern void corral_rs_log(const char *message, size_t len);
extern int corral_rs_finish_early(void *ctx);
struct corral_request;
extern void *corral_rs_worker_next(struct corral_request *out);
extern void corral_rs_worker_finish(void *ctx);

/* What one request hands PHP before php_request_startup(); every string is NUL-terminated
 * and lives until corral_php_run returns. */
struct corral_request {
    const char *method;
    char *query_string;
    char *request_uri;
    const char *content_type; /* NULL: none */
    int64_t content_length;
    char *script_filename;
    char *cookie;              /* NULL: none */
    const char *authorization; /* NULL: none */
};

static char *request_cookie;

/* Response header lines passed on the stack; more take one allocation. */
#define CORRAL_STACK_LINES 32

/* The folder the worker last entered for a script (classic mode), and whether the process
 * may have left it since (a script called chdir()). See enter_script_dir. */
static char cwd_now[4096];
static size_t cwd_len;
static bool cwd_unknown = true;
static zif_handler php_chdir_handler;

/* Worker mode: the boot request's context and request info, restored between requests. */
static void *boot_ctx;
static sapi_request_info boot_info;
/* Worker mode's execution timer (max_execution_time, an ITIMER_PROF timer: it counts the
 * process's CPU time). Each request's start arms it afresh (worker_request_startup), which
 * replaces whatever was running: the boot request's timer before the first request, the
 * last request's before the next. A request's end leaves its timer running rather than
 * stopping it (one setitimer(2) per request fewer): waiting for the next request costs no
 * CPU time, so it cannot run out there but for a request that ended a hair's breadth from
 * its limit; if it does, its flag is cleared by the next start before any PHP code runs
 * (PHP acts on it only when its VM is interrupted), and corral_handle_request stops the
 * timer when it returns false (the worker is told to stop), so that the script's end is
 * not timed by a request that is over. */

static size_t corral_ub_write(const char *str, size_t len)
{
    void *ctx = SG(server_context);
    if (!ctx) {
        return len;
    }
    return corral_rs_write(ctx, str, len);
}

static void corral_flush(void *server_context)
{
    if (server_context) {
        corral_rs_flush(server_context);
    }
}

static int corral_send_headers(sapi_headers_struct *headers)
{
    void *ctx = SG(server_context);
    if (!ctx) {
        return SAPI_HEADER_SENT_SUCCESSFULLY;
    }
    /* The lines are handed over in one call, borrowed from PHP's list (on the stack for
     * the usual few; PHP's allocator for more), so the Rust side copies none of them. */
    struct corral_line stack[CORRAL_STACK_LINES];
    size_t count = zend_llist_count(&headers->headers);
    struct corral_line *lines = count <= CORRAL_STACK_LINES
        ? stack : safe_emalloc(count, sizeof(struct corral_line), 0);
    size_t n = 0;
    zend_llist_position pos;
    sapi_header_struct *h = zend_llist_get_first_ex(&headers->headers, &pos);
    while (h && n < count) {
        lines[n].text = h->header;
        lines[n].len = h->header_len;
        n++;
        h = zend_llist_get_next_ex(&headers->headers, &pos);
    }
    int status = headers->http_response_code;
    corral_rs_send_head(ctx, status > 0 ? status : 200, lines, n);
    if (lines != stack) {
        efree(lines);
    }
    return SAPI_HEADER_SENT_SUCCESSFULLY;
}

static size_t corral_read_post(char *buffer, size_t count)
{
    void *ctx = SG(server_context);
    if (!ctx) {
        return 0;
    }
    return corral_rs_read_body(ctx, buffer, count);
}

static char *corral_read_cookies(void)
{
    return request_cookie;
}

/* Worker mode: the process environment as $_SERVER holds it, imported once and copied
 * into each request's $_SERVER (keys and values shared, their hashes already computed)
 * rather than parsed from environ again: importing it was a tenth of a worker-mode
 * request's instructions (callgrind). It lives in the worker script's own request memory;
 * putenv() drops it (corral_putenv), so that a variable a script sets is seen by the
 * requests after, as when environ is read each time. */
static zend_array *env_cache;
static zif_handler php_putenv_handler;

static void drop_env_cache(void)
{
    if (env_cache) {
        zend_array_release(env_cache);
        env_cache = NULL;
    }
}

static ZEND_NAMED_FUNCTION(corral_putenv)
{
    drop_env_cache();
    php_putenv_handler(INTERNAL_FUNCTION_PARAM_PASSTHRU);
}

/* The environment's entries into `track_vars_array`: from the cache in a worker script's
 * request, else read from environ as PHP does. */
static void import_environment(void *ctx, zval *track_vars_array)
{
    if (!boot_ctx || !ctx || ctx == boot_ctx || Z_TYPE_P(track_vars_array) != IS_ARRAY) {
        php_import_environment_variables(track_vars_array);
        return;
    }
    if (!env_cache) {
        zval env;
        array_init(&env);
        php_import_environment_variables(&env);
        env_cache = Z_ARR(env);
    }
    zend_hash_copy(Z_ARRVAL_P(track_vars_array), env_cache, zval_add_ref);
}

static void corral_register_variables(zval *track_vars_array)
{
    void *ctx = SG(server_context);
    /* The process environment first (the pool's `env`), then the request's variables over
     * it, as php-cgi and php-fpm fill $_SERVER. */
    import_environment(ctx, track_vars_array);
    if (ctx) {
        /* A request the worker script serves reuses the keys of the one before. */
        corral_rs_register_variables(ctx, track_vars_array, boot_ctx && ctx != boot_ctx);
    }
}

static void corral_log_message(const char *message, int syslog_type)
{
    (void)syslog_type;
    corral_rs_log(message, strlen(message));
}

/* SG(request_info) and friends for one request, before sapi_activate(). */
static void set_request(void *ctx, const struct corral_request *r)
{
    SG(server_context) = ctx;
    SG(request_info).request_method = r->method;
    SG(request_info).query_string = r->query_string;
    SG(request_info).request_uri = r->request_uri;
    SG(request_info).content_type = r->content_type;
    SG(request_info).content_length = r->content_length;
    SG(request_info).path_translated = r->script_filename;
    SG(request_info).proto_num = 1001;
    SG(request_info).headers_only = 0;
    SG(request_info).no_headers = 0;
    SG(request_info).auth_user = NULL;
    SG(request_info).auth_password = NULL;
    SG(request_info).auth_digest = NULL;
    SG(sapi_headers).http_response_code = 200;
    request_cookie = r->cookie;
    if (r->authorization) {
        php_handle_auth_data(r->authorization);
    }
}

/* A script runs in its own folder, as under php-cgi, which asks PHP to do it
 * (php_execute_script: getcwd, chdir there, chdir back after the script: three system calls
 * per request). The worker sets SAPI_OPTION_NO_CHDIR and enters the folder itself, only when
 * it is not already there: the folder of the last script, unless a script has called chdir()
 * since (PHP's chdir() is wrapped to say so: corral_chdir). The cwd is not put back after the
 * script, so shutdown functions and destructors run in the script's folder (under php-cgi,
 * in the worker's start folder; PHP's manual leaves it to the SAPI). A chdir that fails
 * leaves the cwd where it was and is tried again next request. */
static void enter_script_dir(const char *path)
{
    const char *slash = strrchr(path, '/');
    if (!slash) {
        return; /* no folder to enter (PHP does nothing either) */
    }
    size_t len = slash == path ? 1 : (size_t)(slash - path);
    if (!cwd_unknown && len == cwd_len && memcmp(path, cwd_now, len) == 0) {
        return;
    }
    cwd_unknown = true;
    if (len >= sizeof(cwd_now)) {
        return; /* longer than any path chdir(2) takes */
    }
    memcpy(cwd_now, path, len);
    cwd_now[len] = '\0';
    if (chdir(cwd_now) == 0) {
        cwd_len = len;
        cwd_unknown = false;
    }
}

/* PHP's chdir(), wrapped: the worker's idea of its cwd is void once a script moves it. */
static ZEND_NAMED_FUNCTION(corral_chdir)
{
    cwd_unknown = true;
    php_chdir_handler(INTERNAL_FUNCTION_PARAM_PASSTHRU);
}

/* Puts `wrapper` in place of PHP's function `name` (nothing when disable_functions removed
 * it); `saved` keeps PHP's own, which the wrapper calls. */
static void wrap_function(const char *name, size_t len, zif_handler *saved, zif_handler wrapper)
{
    zend_function *f = zend_hash_str_find_ptr(CG(function_table), name, len);
    if (f && f->type == ZEND_INTERNAL_FUNCTION && f->internal_function.handler) {
        *saved = f->internal_function.handler;
        f->internal_function.handler = wrapper;
    }
}

/* Makes the next request PHP's current one inside the running worker script: what
 * php_request_startup() does for a request, minus what lasts the script's whole life
 * (the engine, the compiled script, its objects). */
static int worker_request_startup(void *ctx, const struct corral_request *r)
{
    int ok = SUCCESS;
    set_request(ctx, r);
    zend_try {
        php_output_activate();
        PG(header_is_being_sent) = 0;
        PG(connection_status) = PHP_CONNECTION_NORMAL;
        sapi_activate();
        SG(sapi_headers).http_response_code = 200;
        if (PG(expose_php)) {
            sapi_add_header(SAPI_PHP_VERSION_HEADER, sizeof(SAPI_PHP_VERSION_HEADER) - 1, 1);
        }
        if (PG(output_handler) && PG(output_handler)[0]) {
            zval handler;
            ZVAL_STRING(&handler, PG(output_handler));
            php_output_start_user(&handler, 0, PHP_OUTPUT_HANDLER_STDFLAGS);
            zval_ptr_dtor(&handler);
        } else if (PG(output_buffering)) {
            php_output_start_user(NULL, PG(output_buffering) > 1 ? PG(output_buffering) : 0,
                                  PHP_OUTPUT_HANDLER_STDFLAGS);
        } else if (PG(implicit_flush)) {
            php_output_set_implicit_flush(1);
        }
        /* The previous request's superglobals: released here, rebuilt from this request
         * (php_hash_environment forgets them without releasing them). */
        for (int i = 0; i < NUM_TRACK_VARS; i++) {
            zval_ptr_dtor_nogc(&PG(http_globals)[i]);
            ZVAL_UNDEF(&PG(http_globals)[i]);
        }
        php_hash_environment();
        /* $_SERVER and $_REQUEST are built when a script using them is compiled; the
         * handler was compiled once, at boot, so they are built now. */
        zend_is_auto_global_str(ZEND_STRL("_SERVER"));
        zend_is_auto_global_str(ZEND_STRL("_REQUEST"));
        /* The running timer, if any, is replaced by this request's (see above); without a
         * limit it is stopped (only a running one costs a system call to stop). */
        zend_long seconds = INI_INT("max_execution_time");
        if (seconds <= 0) {
            zend_unset_timeout();
        }
        zend_set_timeout(seconds, 0);
    } zend_catch {
        ok = FAILURE;
    } zend_end_try();
    return ok;
}

/* The filter extension keeps a raw copy of every GET, POST, cookie and server variable
 * (for filter_input()) until its request shutdown, which a worker script's requests never
 * reach: without this, those copies pile up request after request (measured: the size of
 * every query string and cookie header, kept). Its request shutdown only releases them. */
static void release_filter_copies(void)
{
    zend_module_entry *filter = zend_hash_str_find_ptr(&module_registry, ZEND_STRL("filter"));
    if (filter && filter->request_shutdown_func) {
        filter->request_shutdown_func(filter->type, filter->module_number);
    }
}

/* Ends the current request inside the running worker script: output flushed and the
 * headers sent (php_output_deactivate), then the SAPI's per-request state released (POST
 * data, uploaded files, auth strings) with the filter extension's copies of the request's
 * variables, and the boot request's state put back. */
static void worker_request_shutdown(void)
{
    zend_try {
        php_output_end_all();
    } zend_end_try();
    /* The request's timer runs on until the next request's start replaces it (see the
     * timer's note at the top). */
    zend_try {
        php_output_deactivate();
    } zend_end_try();
    zend_try {
        sapi_deactivate();
    } zend_end_try();
    zend_try {
        release_filter_copies();
    } zend_end_try();
    zend_set_memory_limit(PG(memory_limit));
    request_cookie = NULL;
    SG(server_context) = boot_ctx;
    SG(request_info) = boot_info;
    SG(headers_sent) = 1;
    php_output_activate();
}

ZEND_BEGIN_ARG_WITH_RETURN_TYPE_INFO_EX(arginfo_corral_handle_request, 0, 1, _IS_BOOL, 0)
    ZEND_ARG_TYPE_INFO(0, handler, IS_CALLABLE, 0)
ZEND_END_ARG_INFO()

/* corral_handle_request(callable $handler): bool -- FrankenPHP's frankenphp_handle_request
 * shape: false when the worker should end (a stop signal), else true once $handler ran for
 * one request and that request was answered. */
PHP_FUNCTION(corral_handle_request)
{
    zend_fcall_info fci;
    zend_fcall_info_cache fcc;
    ZEND_PARSE_PARAMETERS_START(1, 1)
        Z_PARAM_FUNC(fci, fcc)
    ZEND_PARSE_PARAMETERS_END();
    if (!boot_ctx || SG(server_context) != boot_ctx) {
        zend_throw_error(NULL, "corral_handle_request() works only in corral's worker script "
                               "(worker_script), outside a request");
        RETURN_THROWS();
    }
    /* The boot request's output so far goes to the log. */
    php_output_end_all();
    struct corral_request r;
    void *ctx = corral_rs_worker_next(&r);
    if (!ctx) {
        /* The script goes on to its end untimed by the last request. */
        zend_unset_timeout();
        RETURN_FALSE;
    }
    php_output_deactivate();
    if (worker_request_startup(ctx, &r) == FAILURE) {
        /* The exchange stays current: the script's end answers it (src/worker.rs). */
        zend_throw_error(NULL, "corral could not start PHP's request");
        RETURN_THROWS();
    }
    zval retval;
    ZVAL_UNDEF(&retval);
    fci.retval = &retval;
    zend_call_function(&fci, &fcc);
    zval_ptr_dtor(&retval);
    if (EG(exception)) {
        if (zend_is_unwind_exit(EG(exception)) || zend_is_graceful_exit(EG(exception))) {
            /* exit(): the script ends; its shutdown answers this request. */
            return;
        }
        /* Uncaught, as at a script's top level: a fatal error, which ends the script. */
        zend_exception_error(EG(exception), E_ERROR);
        return;
    }
    worker_request_shutdown();
    corral_rs_worker_finish(ctx);
    RETURN_TRUE;
}

ZEND_BEGIN_ARG_WITH_RETURN_TYPE_INFO_EX(arginfo_corral_finish_request, 0, 0, _IS_BOOL, 0)
ZEND_END_ARG_INFO()

/* fastcgi_finish_request(): bool -- php-fpm's early flush (lsphp calls it
 * litespeed_finish_request): the output buffers are flushed, the headers sent and the answer
 * completed for the client now; the script goes on running, and what it writes afterwards
 * goes nowhere. false outside a request or when the answer was already completed. */
PHP_FUNCTION(fastcgi_finish_request)
{
    ZEND_PARSE_PARAMETERS_NONE();
    void *ctx = SG(server_context);
    if (!ctx || ctx == boot_ctx) {
        RETURN_FALSE;
    }
    php_output_end_all();
    if (!SG(headers_sent)) {
        sapi_send_headers();
    }
    RETURN_BOOL(corral_rs_finish_early(ctx));
}

static const zend_function_entry corral_functions[] = {
    PHP_FE(corral_handle_request, arginfo_corral_handle_request)
    PHP_FE(fastcgi_finish_request, arginfo_corral_finish_request)
    PHP_FALIAS(litespeed_finish_request, fastcgi_finish_request, arginfo_corral_finish_request)
    PHP_FE_END
};

static int corral_startup(sapi_module_struct *module)
{
    return php_module_startup(module, NULL) == SUCCESS ? SUCCESS : FAILURE;
}

static sapi_module_struct corral_module = {
    "litespeed",                    /* name: see the file comment */
    "corral native PHP worker",     /* pretty name */
    corral_startup,
    php_module_shutdown_wrapper,
    NULL,                           /* activate */
    NULL,                           /* deactivate */
    corral_ub_write,
    corral_flush,
    NULL,                           /* get uid */
    NULL,                           /* getenv */
    php_error,
    NULL,                           /* header handler */
    corral_send_headers,
    NULL,                           /* send header */
    corral_read_post,
    corral_read_cookies,
    corral_register_variables,
    corral_log_message,
    NULL,                           /* get request time */
    NULL,                           /* terminate process */
    STANDARD_SAPI_MODULE_PROPERTIES
};

/* Starts PHP once per process: signals, the SAPI, php.ini, every extension's MINIT.
 * `ini` ("key=value\n" lines, NUL-terminated) overrides php.ini; it must outlive PHP.
 * Returns 0 on success. */
int corral_php_startup(char *ini)
{
    zend_signal_startup();
    sapi_startup(&corral_module);
    corral_module.ini_entries = ini;
    corral_module.additional_functions = corral_functions;
    if (corral_module.startup(&corral_module) == FAILURE) {
        return -1;
    }
    /* The worker enters each script's folder itself (enter_script_dir). */
    SG(options) |= SAPI_OPTION_NO_CHDIR;
    wrap_function(ZEND_STRL("chdir"), &php_chdir_handler, corral_chdir);
    wrap_function(ZEND_STRL("putenv"), &php_putenv_handler, corral_putenv);
    return 0;
}

/* PHP's request startup puts its signal handlers in place (zend_signal_activate: one
 * sigaction(2) per signal it defers, seven, each request) and its shutdown leaves them there;
 * from the second request on, each call only reads back the handler already installed. Once
 * the first request has installed them, the worker tells PHP not to look again: the state
 * is the same, without the seven system calls. (PHP's own record of the handlers it
 * replaced is reset every request either way.) */
static void keep_signal_handlers(void)
{
#ifdef ZEND_SIGNALS
    SIGG(reset) = 0;
#endif
}

/* Runs one request: startup, the script, shutdown, as php-cgi does for each request.
 * Returns 0 when the script ran (whatever it answered), -1 when the request could not start. */
int corral_php_run(void *ctx, const struct corral_request *r)
{
    set_request(ctx, r);
    /* php_request_startup arms the timer for max_input_time, the time PHP may spend on the
     * request's input; php_execute_script re-arms it for max_execution_time. A request with
     * no body has no input to spend it on (its query string and cookies are parsed before
     * the script starts, bounded by corral's header limits), so that first setitimer(2) is
     * skipped for it; a request with a body keeps the limit. */
    zend_long input_time = PG(max_input_time);
    if (r->content_length == 0) {
        PG(max_input_time) = 0;
    }
    int started = php_request_startup();
    PG(max_input_time) = input_time;
    if (started == FAILURE) {
        /* PHP answered nothing and is in no state to go on (php-fpm exits here too): the
         * caller answers 500 and ends the worker, which corral replaces. */
        SG(server_context) = NULL;
        request_cookie = NULL;
        return -1;
    }
    keep_signal_handlers();
    enter_script_dir(r->script_filename);
    zend_try {
        zend_file_handle file;
        zend_stream_init_filename(&file, r->script_filename);
        php_execute_script(&file);
        zend_destroy_file_handle(&file);
    } zend_end_try();
    php_request_shutdown(NULL);
    SG(server_context) = NULL;
    request_cookie = NULL;
    return 0;
}

/* Runs the worker script `r->script_filename` as one long request whose context is `ctx`
 * (its output goes to the log); corral_handle_request serves requests while it runs.
 * Returns when the script ends: 0 when it ran, -1 when its request could not start. */
int corral_php_worker(void *ctx, const struct corral_request *r)
{
    set_request(ctx, r);
    if (php_request_startup() == FAILURE) {
        SG(server_context) = NULL;
        return -1;
    }
    keep_signal_handlers();
    enter_script_dir(r->script_filename);
    /* The boot request has no client: nothing it writes is a response head. */
    SG(headers_sent) = 1;
    SG(request_info).no_headers = 1;
    boot_ctx = ctx;
    boot_info = SG(request_info);
    zend_try {
        zend_file_handle file;
        zend_stream_init_filename(&file, r->script_filename);
        php_execute_script(&file);
        zend_destroy_file_handle(&file);
    } zend_end_try();
    drop_env_cache();
    corral_rs_release_keys();
    php_request_shutdown(NULL);
    boot_ctx = NULL;
    SG(server_context) = NULL;
    request_cookie = NULL;
    return 0;
}

/* Ends PHP: every extension's MSHUTDOWN, then the SAPI. */
void corral_php_shutdown(void)
{
    php_module_shutdown();
    sapi_shutdown();
}
