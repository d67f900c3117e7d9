/* The CPython side of corral's native WSGI worker: starting the interpreter the pool names
 * (so a virtualenv is found from its pyvenv.cfg, as its bin/python would find it), the
 * environ's strings, start_response with its checks, calling the app and iterating its
 * result. Bytes in and out go through the Rust side's callbacks (corral_wsgi_*), which own
 * the connection. Everything here runs on the worker's one thread with the GIL held.
 *
 * A Python error in the app or in what it returns never leaves this file: cw_call logs it
 * with its traceback and says whether a 500 can still be sent. */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

/* One response header, pointing into Python strings that live across the callback. */
typedef struct {
    const char *name;
    size_t name_len;
    const char *value;
    size_t value_len;
} cw_header;

/* The Rust side (src/python.rs). */
extern long corral_wsgi_read(void *ctx, char *dst, size_t len);
extern int corral_wsgi_head(void *ctx, int status, const cw_header *headers, size_t count,
                            char *err, size_t err_len);
extern int corral_wsgi_write(void *ctx, const char *data, size_t len, int flush);
extern int corral_wsgi_head_sent(void *ctx);
extern void corral_wsgi_what(void *ctx, char *dst, size_t len);

/* What cw_call says. */
enum { CW_OK = 0, CW_ERROR_UNSENT = 1, CW_ERROR_SENT = 2, CW_GONE = 3 };

/* Most header lines put on the stack; more are allocated. */
#define STACK_HEADERS 32

static PyObject *app, *base, *make_input, *canonical, *bytes_io, *k_input, *k_close, *k_write;
static void *current_ctx;
static unsigned long long current_gen;

/* ---------------------------------------------------------------------------------------
 * start_response: one object per request, callable, with a write method. */

typedef struct {
    PyObject_HEAD
    void *ctx;
    int code;           /* 0 until start_response */
    PyObject *status;   /* the status string */
    PyObject *headers;  /* list of (name, value) checked */
    int head_queued;
    int gone;
    PyObject *write;    /* the bound write(), made on the first start_response and kept */
} Req;

/* The last request's start_response object when nothing but this file held it at its end:
 * the next request reuses it rather than making one (an app that kept its start_response
 * keeps a dead one, as before: that object is never reused). */
static Req *spare_req;

static void req_dealloc(Req *self) {
    Py_XDECREF(self->status);
    Py_XDECREF(self->headers);
    Py_XDECREF(self->write);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static int is_tchar(Py_UCS4 c) {
    if (c >= '0' && c <= '9') return 1;
    if ((c | 0x20) >= 'a' && (c | 0x20) <= 'z') return 1;
    return c != 0 && strchr("!#$%&'*+-.^_`|~", (int)c) != NULL;
}

/* A value: latin-1 text without control characters (a tab is allowed). */
static int good_value(PyObject *s) {
    Py_ssize_t n = PyUnicode_GET_LENGTH(s);
    int kind = PyUnicode_KIND(s);
    const void *data = PyUnicode_DATA(s);
    for (Py_ssize_t i = 0; i < n; i++) {
        Py_UCS4 c = PyUnicode_READ(kind, data, i);
        if ((c < 0x20 && c != '\t') || c == 0x7f || c > 0xff) return 0;
    }
    return 1;
}

static const char *const HOP_BY_HOP[] = {"connection", "keep-alive", "proxy-authenticate",
                                         "proxy-authorization", "te", "trailer",
                                         "transfer-encoding", "upgrade", NULL};

/* 1: a header to send; 0: a hop-by-hop header to drop; -1: refused (an exception set). */
static int check_name(PyObject *name) {
    if (!PyUnicode_Check(name) || PyUnicode_GET_LENGTH(name) == 0 ||
        !PyUnicode_IS_ASCII(name)) {
        PyErr_Format(PyExc_ValueError, "header name %R is not an HTTP token", name);
        return -1;
    }
    Py_ssize_t n = PyUnicode_GET_LENGTH(name);
    const char *s = (const char *)PyUnicode_DATA(name);
    for (Py_ssize_t i = 0; i < n; i++) {
        if (!is_tchar((unsigned char)s[i])) {
            PyErr_Format(PyExc_ValueError, "header name %R is not an HTTP token", name);
            return -1;
        }
    }
    if (n == 6 && strncasecmp(s, "status", 6) == 0) {
        PyErr_SetString(PyExc_ValueError,
                        "a header named Status would be read as the CGI status");
        return -1;
    }
    for (const char *const *h = HOP_BY_HOP; *h; h++) {
        if ((size_t)n == strlen(*h) && strncasecmp(s, *h, (size_t)n) == 0) return 0;
    }
    return 1;
}

static int check_status(PyObject *status) {
    if (!PyUnicode_Check(status)) goto bad;
    Py_ssize_t n = PyUnicode_GET_LENGTH(status);
    int kind = PyUnicode_KIND(status);
    const void *data = PyUnicode_DATA(status);
    if (n < 4) goto bad;
    for (int i = 0; i < 3; i++) {
        Py_UCS4 c = PyUnicode_READ(kind, data, i);
        if (c < (i == 0 ? '1' : '0') || c > '9') goto bad;
    }
    if (PyUnicode_READ(kind, data, 3) != ' ') goto bad;
    for (Py_ssize_t i = 4; i < n; i++) {
        Py_UCS4 c = PyUnicode_READ(kind, data, i);
        if (c < 0x20 || c == 0x7f || c > 0xff) goto bad;
    }
    return 0;
bad:
    PyErr_Format(PyExc_ValueError, "status %R is not '<3 digits> <reason>'", status);
    return -1;
}

static PyObject *start_response(Req *self, PyObject *args, PyObject *kwargs) {
    PyObject *status, *headers, *exc_info = Py_None;
    static char *names[] = {"status", "headers", "exc_info", NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OO|O:start_response", names, &status,
                                     &headers, &exc_info))
        return NULL;
    if (self->ctx == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "start_response of a finished request");
        return NULL;
    }
    if (exc_info != Py_None) {
        if (corral_wsgi_head_sent(self->ctx)) {
            /* Too late to change the answer: PEP 3333 says re-raise. */
            PyObject *value = PyTuple_Check(exc_info) && PyTuple_GET_SIZE(exc_info) >= 2
                                  ? PyTuple_GET_ITEM(exc_info, 1)
                                  : NULL;
            if (value && PyExceptionInstance_Check(value)) {
                PyErr_SetObject((PyObject *)Py_TYPE(value), value);
            } else {
                PyErr_SetString(PyExc_RuntimeError, "start_response with exc_info after the head was sent");
            }
            return NULL;
        }
        self->head_queued = 0;
    } else if (self->code) {
        PyErr_SetString(PyExc_AssertionError, "start_response() called twice without exc_info");
        return NULL;
    }
    if (check_status(status) < 0) return NULL;
    if (!PyList_Check(headers)) {
        PyErr_Format(PyExc_TypeError, "headers must be a list, not %s", Py_TYPE(headers)->tp_name);
        return NULL;
    }
    Py_ssize_t n = PyList_GET_SIZE(headers);
    PyObject *checked = PyList_New(0);
    if (!checked) return NULL;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *item = PyList_GET_ITEM(headers, i);
        if (!PyTuple_Check(item) || PyTuple_GET_SIZE(item) != 2) {
            PyErr_Format(PyExc_TypeError, "header %R is not a (name, value) tuple", item);
            goto fail;
        }
        PyObject *name = PyTuple_GET_ITEM(item, 0), *value = PyTuple_GET_ITEM(item, 1);
        int keep = check_name(name);
        if (keep < 0) goto fail;
        if (!PyUnicode_Check(value) || !good_value(value)) {
            PyErr_Format(PyExc_ValueError, "header %S has a value that is not latin-1 text "
                         "without control characters", name);
            goto fail;
        }
        if (!keep) {
            PySys_FormatStderr("corral-wsgi-worker: dropped hop-by-hop header %U: %.200U "
                               "(the gateway owns the connection)\n", name, value);
            continue;
        }
        if (PyList_Append(checked, item) < 0) goto fail;
    }
    Py_INCREF(status);
    Py_XSETREF(self->status, status);
    Py_XSETREF(self->headers, checked);
    self->code = (int)((PyUnicode_READ_CHAR(status, 0) - '0') * 100 +
                       (PyUnicode_READ_CHAR(status, 1) - '0') * 10 +
                       (PyUnicode_READ_CHAR(status, 2) - '0'));
    if (!self->write && !(self->write = PyObject_GetAttr((PyObject *)self, k_write))) return NULL;
    Py_INCREF(self->write);
    return self->write;
fail:
    Py_DECREF(checked);
    return NULL;
}

/* Latin-1 bytes of `s` that stay valid while `*keep` lives: ASCII text as it is stored,
 * other text encoded into a bytes object appended to `*keep` (a list made on first need:
 * most heads are all ASCII). */
static const char *latin1(PyObject *s, size_t *len, PyObject **keep) {
    if (PyUnicode_IS_COMPACT_ASCII(s)) {
        *len = (size_t)PyUnicode_GET_LENGTH(s);
        return (const char *)PyUnicode_DATA(s);
    }
    if (!*keep && !(*keep = PyList_New(0))) return NULL;
    PyObject *b = PyUnicode_AsLatin1String(s);
    if (!b) return NULL;
    int rc = PyList_Append(*keep, b);
    Py_DECREF(b);
    if (rc < 0) return NULL;
    *len = (size_t)PyBytes_GET_SIZE(b);
    return PyBytes_AS_STRING(b);
}

/* Queues RESP_HEADER once (before the first body bytes, or at the end). */
static int queue_head(Req *self) {
    if (self->head_queued) return 0;
    if (!self->code) {
        PyErr_SetString(PyExc_AssertionError,
                        "the application gave a body before calling start_response()");
        return -1;
    }
    Py_ssize_t n = PyList_GET_SIZE(self->headers);
    int status_line = !PySet_Contains(canonical, self->status);
    size_t count = (size_t)n + (status_line ? 1 : 0);
    cw_header stack[STACK_HEADERS];
    cw_header *h = count <= STACK_HEADERS ? stack : PyMem_Malloc(count * sizeof(cw_header));
    PyObject *keep = NULL;
    int rc = -1;
    if (!h) {
        PyErr_NoMemory();
        goto out;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *item = PyList_GET_ITEM(self->headers, i);
        h[i].name = latin1(PyTuple_GET_ITEM(item, 0), &h[i].name_len, &keep);
        h[i].value = latin1(PyTuple_GET_ITEM(item, 1), &h[i].value_len, &keep);
        if (!h[i].name || !h[i].value) goto out;
    }
    if (status_line) {
        h[n].name = "Status";
        h[n].name_len = 6;
        h[n].value = latin1(self->status, &h[n].value_len, &keep);
        if (!h[n].value) goto out;
    }
    char err[200] = "";
    if (corral_wsgi_head(self->ctx, self->code, h, count, err, sizeof err) != 0) {
        PyErr_Format(PyExc_ValueError, "the response head cannot be sent: %s", err);
        goto out;
    }
    self->head_queued = 1;
    rc = 0;
out:
    if (h && h != stack) PyMem_Free(h);
    Py_XDECREF(keep);
    return rc;
}

/* Body bytes; `flush`: written now rather than queued. */
static int send_body(Req *self, PyObject *data, int flush) {
    if (!PyBytes_Check(data)) {
        PyErr_Format(PyExc_TypeError, "the app gave %s, not bytes", Py_TYPE(data)->tp_name);
        return -1;
    }
    Py_ssize_t n = PyBytes_GET_SIZE(data);
    if (n == 0) return 0;
    if (queue_head(self) < 0) return -1;
    if (corral_wsgi_write(self->ctx, PyBytes_AS_STRING(data), (size_t)n, flush) != 0) {
        self->gone = 1;
        PyErr_SetString(PyExc_OSError, "the connection to corral was lost while answering");
        return -1;
    }
    return 0;
}

static PyObject *req_write(Req *self, PyObject *data) {
    if (self->ctx == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "write() of a finished request");
        return NULL;
    }
    if (!self->code) {
        PyErr_SetString(PyExc_AssertionError, "write() before start_response()");
        return NULL;
    }
    if (send_body(self, data, 1) < 0) return NULL;
    Py_RETURN_NONE;
}

static PyMethodDef req_methods[] = {
    {"write", (PyCFunction)req_write, METH_O, "PEP 3333's write(): sent at once."},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject ReqType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "corral_wsgi.start_response",
    .tp_basicsize = sizeof(Req),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_dealloc = (destructor)req_dealloc,
    .tp_call = (ternaryfunc)start_response,
    .tp_methods = req_methods,
};

/* ---------------------------------------------------------------------------------------
 * The _corral_wsgi module: wsgi.input's reads. */

static PyObject *readinto(PyObject *mod, PyObject *args) {
    unsigned long long gen;
    Py_buffer buf;
    if (!PyArg_ParseTuple(args, "Kw*:readinto", &gen, &buf)) return NULL;
    if (gen != current_gen || current_ctx == NULL) {
        PyBuffer_Release(&buf);
        PyErr_SetString(PyExc_ValueError, "wsgi.input of a finished request");
        return NULL;
    }
    long n = corral_wsgi_read(current_ctx, buf.buf, (size_t)buf.len);
    PyBuffer_Release(&buf);
    if (n < 0) {
        PyErr_SetString(PyExc_OSError, "the request body could not be read (see the log)");
        return NULL;
    }
    return PyLong_FromLong(n);
}

static PyMethodDef module_methods[] = {
    {"readinto", readinto, METH_VARARGS, "Reads request `gen`'s body into a buffer."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT, "_corral_wsgi", "corral's native WSGI worker.", -1, module_methods,
};

/* ---------------------------------------------------------------------------------------
 * Start */

static void report(void) {
    if (PyErr_ExceptionMatches(PyExc_SystemExit)) {
        PyObject *type, *value, *tb;
        PyErr_Fetch(&type, &value, &tb);
        PyErr_NormalizeException(&type, &value, &tb);
        PyObject *code = value ? PyObject_GetAttrString(value, "code") : NULL;
        if (code && PyUnicode_Check(code))
            PySys_FormatStderr("corral-wsgi-worker: %U\n", code);
        else
            PyErr_Display(type, value, tb);
        Py_XDECREF(code);
        Py_XDECREF(type);
        Py_XDECREF(value);
        Py_XDECREF(tb);
        PyErr_Clear();
        return;
    }
    PyErr_Print();
}

/* Starts Python as `python` would start (its program name locates the prefix and a
 * virtualenv), runs the glue, and with `spec` loads the app. 0 on success; else the reason
 * is on stderr. */
int cw_start(const char *python, const char *glue, const char *spec) {
    PyConfig config;
    PyConfig_InitPythonConfig(&config);
    config.install_signal_handlers = 0; /* the worker's own (SIGTERM finishes a request) */
    config.buffered_stdio = 0;          /* print() reaches corral's log at once */
    config.parse_argv = 0;
    config.safe_path = 1;               /* the app's directory is put first by the glue */
    PyStatus st = PyConfig_SetBytesString(&config, &config.program_name, python);
    char *argv[] = {(char *)python};
    if (!PyStatus_Exception(st)) st = PyConfig_SetBytesArgv(&config, 1, argv);
    if (!PyStatus_Exception(st)) st = Py_InitializeFromConfig(&config);
    PyConfig_Clear(&config);
    if (PyStatus_Exception(st)) {
        fprintf(stderr, "corral-wsgi-worker: Python (as %s) cannot start: %s%s%s\n", python,
                st.func ? st.func : "", st.func ? ": " : "", st.err_msg ? st.err_msg : "");
        return -1;
    }
    if (PyType_Ready(&ReqType) < 0) goto fail;
    PyObject *mod = PyModule_Create(&module_def);
    if (!mod || PyDict_SetItemString(PyImport_GetModuleDict(), "_corral_wsgi", mod) < 0) goto fail;
    Py_DECREF(mod);
    PyObject *glue_mod = PyImport_AddModule("corral_wsgi_glue"); /* borrowed */
    if (!glue_mod) goto fail;
    PyObject *g = PyModule_GetDict(glue_mod);
    if (PyDict_SetItemString(g, "__builtins__", PyEval_GetBuiltins()) < 0) goto fail;
    PyObject *r = PyRun_String(glue, Py_file_input, g, g);
    if (!r) goto fail;
    Py_DECREF(r);
    if (!spec) {
        PyObject *ok = PyObject_CallMethod(glue_mod, "check", NULL);
        if (!ok) goto fail;
        Py_DECREF(ok);
        return 0;
    }
    base = PyDict_GetItemString(g, "BASE");
    make_input = PyDict_GetItemString(g, "make_input");
    canonical = PyDict_GetItemString(g, "CANONICAL");
    PyObject *io = PyImport_ImportModule("io");
    bytes_io = io ? PyObject_GetAttrString(io, "BytesIO") : NULL;
    Py_XDECREF(io);
    k_input = PyUnicode_InternFromString("wsgi.input");
    k_close = PyUnicode_InternFromString("close");
    k_write = PyUnicode_InternFromString("write");
    if (!base || !make_input || !canonical || !bytes_io || !k_input || !k_close || !k_write)
        goto fail;
    Py_INCREF(base);
    Py_INCREF(make_input);
    Py_INCREF(canonical);
    app = PyObject_CallMethod(glue_mod, "load", "s", spec);
    if (!app) goto fail;
    return 0;
fail:
    report();
    return -1;
}

/* ---------------------------------------------------------------------------------------
 * Per request */

/* An environ key: an interned str of latin-1 bytes (a new reference; NULL on failure). */
PyObject *cw_key(const char *s, size_t n) {
    PyObject *k = PyUnicode_DecodeLatin1(s, (Py_ssize_t)n, NULL);
    if (k) PyUnicode_InternInPlace(&k);
    else PyErr_Clear();
    return k;
}

void cw_decref(PyObject *o) { Py_XDECREF(o); }
void cw_incref(PyObject *o) { Py_XINCREF(o); }

/* A fresh environ: the base keys. */
PyObject *cw_environ(void) {
    PyObject *d = PyDict_Copy(base);
    if (!d) PyErr_Clear();
    return d;
}

/* environ[key] = the latin-1 text of `v`; `join` 1 or 2 adds to a value already there with
 * ", " or "; " (repeated request headers). 0 on success. */
int cw_set(PyObject *env, PyObject *key, const char *v, size_t n, int join) {
    PyObject *value = PyUnicode_DecodeLatin1(v, (Py_ssize_t)n, NULL);
    if (!value) goto fail;
    PyObject *old = join ? PyDict_GetItemWithError(env, key) : NULL;
    if (old && PyUnicode_Check(old)) {
        PyObject *joined = PyUnicode_FromFormat("%U%s%U", old, join == 2 ? "; " : ", ", value);
        Py_DECREF(value);
        if (!joined) goto fail;
        value = joined;
    }
    int rc = PyDict_SetItem(env, key, value);
    Py_DECREF(value);
    if (rc == 0) return 0;
fail:
    PyErr_Clear();
    return -1;
}

/* environ[key] = an int. */
int cw_set_int(PyObject *env, PyObject *key, unsigned long long v) {
    PyObject *value = PyLong_FromUnsignedLongLong(v);
    int rc = value ? PyDict_SetItem(env, key, value) : -1;
    Py_XDECREF(value);
    if (rc) PyErr_Clear();
    return rc;
}

/* A str of latin-1 bytes (a new reference; NULL on failure). */
PyObject *cw_str(const char *s, size_t n) {
    PyObject *v = PyUnicode_DecodeLatin1(s, (Py_ssize_t)n, NULL);
    if (!v) PyErr_Clear();
    return v;
}

/* environ[key] = value (both str). 0 on success. */
int cw_set_obj(PyObject *env, PyObject *key, PyObject *value) {
    int rc = PyDict_SetItem(env, key, value);
    if (rc) PyErr_Clear();
    return rc;
}

/* environ.pop(key) if there (asked first: deleting a missing key costs a KeyError made and
 * cleared). */
void cw_del(PyObject *env, PyObject *key) {
    if (PyDict_Contains(env, key) == 1 && PyDict_DelItem(env, key) < 0) PyErr_Clear();
    else if (PyErr_Occurred()) PyErr_Clear();
}

/* Logs the Python error set, with the request `ctx` answers ("GET /path") and what failed. */
static void log_error(void *ctx, const char *doing) {
    char what[304];
    what[0] = 0;
    corral_wsgi_what(ctx, what, sizeof what);
    PySys_WriteStderr("corral-wsgi-worker: %.300s: %s:\n", what, doing);
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb);
    PyErr_NormalizeException(&type, &value, &tb);
    if (type) PyErr_Display(type, value, tb);
    Py_XDECREF(type);
    Py_XDECREF(value);
    Py_XDECREF(tb);
    PyErr_Clear();
}

/* Iterates the app's result into body bytes: a list or tuple is queued whole (RESP_END
 * goes in the same write), any other iterable written as it yields (PEP 3333 forbids
 * holding a block back). The chunk that completes the announced Content-Length takes
 * RESP_END along (src/response.rs); bytes past it fail the write, as a lost connection
 * does, and the connection closes. */
static int send_result(Req *req, PyObject *result) {
    if (PyList_CheckExact(result) || PyTuple_CheckExact(result)) {
        PyObject *seq = result;
        Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
        for (Py_ssize_t i = 0; i < n; i++) {
            if (send_body(req, PySequence_Fast_GET_ITEM(seq, i), 0) < 0) return -1;
        }
    } else {
        PyObject *it = PyObject_GetIter(result);
        if (!it) return -1;
        PyObject *chunk;
        while ((chunk = PyIter_Next(it))) {
            int rc = send_body(req, chunk, 1);
            Py_DECREF(chunk);
            if (rc < 0) {
                Py_DECREF(it);
                return -1;
            }
        }
        Py_DECREF(it);
        if (PyErr_Occurred()) return -1;
    }
    return queue_head(req);
}

/* Calls the app for one request whose environ is `env` (taken over) and whose body has
 * `body_len` bytes, read on demand through `ctx` (which also names it in log lines). */
int cw_call(void *ctx, PyObject *env, unsigned long long body_len) {
    current_ctx = ctx;
    current_gen++;
    int rc = CW_OK;
    PyObject *result = NULL;
    Req *req = spare_req;
    spare_req = NULL;
    if (!req && (req = PyObject_New(Req, &ReqType))) req->write = NULL;
    if (!req) {
        log_error(ctx, "cannot make start_response");
        Py_DECREF(env);
        current_ctx = NULL;
        return CW_ERROR_UNSENT;
    }
    req->ctx = ctx;
    req->code = 0;
    req->status = NULL;
    req->headers = NULL;
    req->head_queued = 0;
    req->gone = 0;
    PyObject *input = body_len ? PyObject_CallFunction(make_input, "K", current_gen)
                               : PyObject_CallNoArgs(bytes_io);
    if (!input || PyDict_SetItem(env, k_input, input) < 0) {
        log_error(ctx, "cannot make wsgi.input");
        rc = CW_ERROR_UNSENT;
        goto out;
    }
    result = PyObject_CallFunctionObjArgs(app, env, (PyObject *)req, NULL);
    if (!result || send_result(req, result) < 0) {
        if (req->gone) {
            PyErr_Clear();
            rc = CW_GONE;
        } else {
            log_error(ctx, "the application raised an error");
            rc = CW_ERROR_UNSENT;
        }
    }
    /* A list or tuple has no close(); looking for it would make an AttributeError. */
    if (result && !PyList_CheckExact(result) && !PyTuple_CheckExact(result)) {
        PyObject *close = PyObject_GetAttr(result, k_close);
        if (!close) {
            PyErr_Clear();
        } else {
            PyObject *r = PyObject_CallNoArgs(close);
            Py_DECREF(close);
            if (!r) log_error(ctx, "the response iterable's close() raised");
            Py_XDECREF(r);
        }
    }
out:
    if (rc == CW_ERROR_UNSENT && corral_wsgi_head_sent(ctx)) rc = CW_ERROR_SENT;
    /* The body's reader is closed (an empty body's BytesIO holds nothing to release). */
    if (input && body_len) {
        PyObject *r = PyObject_CallMethodNoArgs(input, k_close);
        if (!r) PyErr_Clear();
        Py_XDECREF(r);
    }
    req->ctx = NULL;
    current_ctx = NULL;
    Py_XDECREF(input);
    Py_XDECREF(result);
    Py_DECREF(env);
    /* Only now: the result or the environ may have held it. Its kept write() holds it
     * too; nothing else may. Otherwise that cycle is broken and the object let go. */
    Py_CLEAR(req->status);
    Py_CLEAR(req->headers);
    if (Py_REFCNT(req) == 1 + (req->write != NULL) &&
        (!req->write || Py_REFCNT(req->write) == 1)) {
        spare_req = req;
    } else {
        Py_CLEAR(req->write);
        Py_DECREF(req);
    }
    return rc;
}

/* fork(2) the way Python's os.fork does it: 0 in the child, the pid in the parent, -1. */
long cw_fork(void) {
    PyOS_BeforeFork();
    pid_t pid = fork();
    if (pid == 0) PyOS_AfterFork_Child();
    else PyOS_AfterFork_Parent();
    return (long)pid;
}

/* gc.collect() then gc.freeze(): preloaded objects out of the collector's sight, so a
 * worker's collections do not write to (and unshare) their pages. */
void cw_freeze(void) {
    PyObject *gc = PyImport_ImportModule("gc");
    PyObject *r = gc ? PyObject_CallMethod(gc, "collect", NULL) : NULL;
    Py_XDECREF(r);
    r = gc ? PyObject_CallMethod(gc, "freeze", NULL) : NULL;
    Py_XDECREF(r);
    Py_XDECREF(gc);
    PyErr_Clear();
}

void cw_finalize(void) { Py_FinalizeEx(); }
