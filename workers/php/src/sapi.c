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
 */

#include <main/php.h>
#include <main/SAPI.h>
#include <main/php_main.h>
#include <main/php_variables.h>
#include <main/php_ini.h>
#include <zend_ini.h>
#include <zend_stream.h>
#include <zend_signal.h>

/* The Rust side (src/php.rs). `ctx` is the request context SG(server_context) holds. */
extern size_t corral_rs_write(void *ctx, const char *buf, size_t len);
extern void corral_rs_flush(void *ctx);
extern void corral_rs_header(void *ctx, const char *line, size_t len);
extern void corral_rs_send_head(void *ctx, int status);
extern size_t corral_rs_read_body(void *ctx, char *buf, size_t len);
extern void corral_rs_register_variables(void *ctx, zval *track_vars_array);
extern void corral_rs_log(const char *message, size_t len);

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
    zend_llist_position pos;
    sapi_header_struct *h = zend_llist_get_first_ex(&headers->headers, &pos);
    while (h) {
        corral_rs_header(ctx, h->header, h->header_len);
        h = zend_llist_get_next_ex(&headers->headers, &pos);
    }
    int status = headers->http_response_code;
    corral_rs_send_head(ctx, status > 0 ? status : 200);
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

static void corral_register_variables(zval *track_vars_array)
{
    void *ctx = SG(server_context);
    if (ctx) {
        corral_rs_register_variables(ctx, track_vars_array);
    }
}

static void corral_log_message(const char *message, int syslog_type)
{
    (void)syslog_type;
    corral_rs_log(message, strlen(message));
}

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

/* Registers one $_SERVER entry; `key` is NUL-terminated. Called back from
 * corral_rs_register_variables. */
void corral_php_register_variable(zval *track_vars_array, const char *key, const char *value,
                                  size_t value_len)
{
    php_register_variable_safe(key, value, value_len, track_vars_array);
}

/* Starts PHP once per process: signals, the SAPI, php.ini, every extension's MINIT.
 * `ini` ("key=value\n" lines, NUL-terminated) overrides php.ini; it must outlive PHP.
 * Returns 0 on success. */
int corral_php_startup(char *ini)
{
    zend_signal_startup();
    sapi_startup(&corral_module);
    corral_module.ini_entries = ini;
    if (corral_module.startup(&corral_module) == FAILURE) {
        return -1;
    }
    return 0;
}

/* Runs one request: startup, the script, shutdown, as php-cgi does for each request.
 * Returns 0 when the script ran (whatever it answered), -1 when the request could not start. */
int corral_php_run(void *ctx, const struct corral_request *r)
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
    SG(sapi_headers).http_response_code = 200;
    request_cookie = r->cookie;
    if (r->authorization) {
        php_handle_auth_data(r->authorization);
    }
    if (php_request_startup() == FAILURE) {
        /* PHP answered nothing and is in no state to go on (php-fpm exits here too): the
         * caller answers 500 and ends the worker, which corral replaces. */
        SG(server_context) = NULL;
        request_cookie = NULL;
        return -1;
    }
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

/* Ends PHP: every extension's MSHUTDOWN, then the SAPI. */
void corral_php_shutdown(void)
{
    php_module_shutdown();
    sapi_shutdown();
}
