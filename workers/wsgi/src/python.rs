//! The boundary with `python.c`: its functions as safe calls, and the callbacks it makes
//! into the request being answered ([`crate::response::Exchange`]). Every call happens on the
//! worker's one thread, which holds the GIL from start to exit.

use std::ffi::{c_char, c_int, c_long, c_void, CString};
use std::ptr::NonNull;

use crate::response::Exchange;

/// A Python object (opaque here).
#[repr(C)]
pub struct PyObject {
    _private: [u8; 0],
}

/// One response header as python.c hands it over.
#[repr(C)]
pub struct Header {
    name: *const c_char,
    name_len: usize,
    value: *const c_char,
    value_len: usize,
}

/// What [`call`] says about a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// The app answered; the head and body are queued or written.
    Answered,
    /// The app failed before any of the answer was written: a 500 can replace it.
    FailedUnsent,
    /// The app failed after part of the answer was written: the connection must close.
    FailedSent,
    /// corral's connection went away while answering.
    Gone,
}

extern "C" {
    fn cw_start(python: *const c_char, glue: *const c_char, spec: *const c_char) -> c_int;
    fn cw_key(s: *const c_char, len: usize) -> *mut PyObject;
    fn cw_decref(o: *mut PyObject);
    fn cw_incref(o: *mut PyObject);
    fn cw_environ() -> *mut PyObject;
    fn cw_set(
        env: *mut PyObject,
        key: *mut PyObject,
        v: *const c_char,
        len: usize,
        join: c_int,
    ) -> c_int;
    fn cw_str(s: *const c_char, len: usize) -> *mut PyObject;
    fn cw_set_obj(env: *mut PyObject, key: *mut PyObject, value: *mut PyObject) -> c_int;
    fn cw_set_int(env: *mut PyObject, key: *mut PyObject, v: u64) -> c_int;
    fn cw_del(env: *mut PyObject, key: *mut PyObject);
    fn cw_call(ctx: *mut c_void, env: *mut PyObject, body_len: u64) -> c_int;
    fn cw_finalize();
}

/// An owned reference to a Python object.
pub struct Obj(NonNull<PyObject>);

impl Drop for Obj {
    fn drop(&mut self) {
        // SAFETY: the reference is owned and dropped once.
        unsafe { cw_decref(self.0.as_ptr()) }
    }
}

impl Clone for Obj {
    fn clone(&self) -> Obj {
        // SAFETY: the reference is live; the clone owns the new one.
        unsafe { cw_incref(self.0.as_ptr()) };
        Obj(self.0)
    }
}

fn c_string(s: &str) -> Result<CString, ()> {
    CString::new(s).map_err(|_| crate::log(&format!("{s:?} holds a NUL byte")))
}

/// Starts Python as `python` would start and runs `glue`; with `spec`, loads the app (else
/// only checks that the interpreter starts). Errors are on stderr already.
pub fn start(python: &str, glue: &str, spec: Option<&str>) -> Result<(), ()> {
    let python = c_string(python)?;
    let glue = c_string(glue)?;
    let spec = spec.map(c_string).transpose()?;
    let spec_ptr = spec.as_ref().map_or(std::ptr::null(), |s| s.as_ptr());
    // SAFETY: three valid C strings (or NULL for spec) that outlive the call.
    match unsafe { cw_start(python.as_ptr(), glue.as_ptr(), spec_ptr) } {
        0 => Ok(()),
        _ => Err(()),
    }
}

/// Ends the interpreter (atexit handlers run).
pub fn finalize() {
    // SAFETY: called once, after the last request, on the thread that started Python.
    unsafe { cw_finalize() }
}

/// An interned Python str of latin-1 bytes, for environ keys.
pub fn key(bytes: &[u8]) -> Option<Obj> {
    // SAFETY: `bytes` is valid for `len` bytes during the call; the result is a new
    // reference or NULL.
    NonNull::new(unsafe { cw_key(bytes.as_ptr().cast(), bytes.len()) }).map(Obj)
}

/// A Python str of latin-1 bytes.
pub fn text(bytes: &[u8]) -> Option<Obj> {
    // SAFETY: `bytes` is valid for `len` bytes during the call; the result is a new
    // reference or NULL.
    NonNull::new(unsafe { cw_str(bytes.as_ptr().cast(), bytes.len()) }).map(Obj)
}

/// A request's environ while it is built.
pub struct Environ(Obj);

impl Environ {
    /// A copy of the base environ (wsgi.* and PEP 3333's defaults).
    pub fn new() -> Option<Environ> {
        // SAFETY: returns a new reference or NULL.
        NonNull::new(unsafe { cw_environ() }).map(|p| Environ(Obj(p)))
    }

    /// `environ[key] = value` (latin-1); `join` 1 or 2 appends to a value already there
    /// with ", " or "; ".
    pub fn set(&mut self, key: &Obj, value: &[u8], join: c_int) -> bool {
        // SAFETY: both objects are live references; `value` is valid for its length.
        unsafe {
            cw_set(
                self.0 .0.as_ptr(),
                key.0.as_ptr(),
                value.as_ptr().cast(),
                value.len(),
                join,
            ) == 0
        }
    }

    /// `environ[key] = value`, a str made before.
    pub fn set_obj(&mut self, key: &Obj, value: &Obj) -> bool {
        // SAFETY: all three objects are live references.
        unsafe { cw_set_obj(self.0 .0.as_ptr(), key.0.as_ptr(), value.0.as_ptr()) == 0 }
    }

    /// `environ[key] = value` as an int.
    pub fn set_int(&mut self, key: &Obj, value: u64) -> bool {
        // SAFETY: both objects are live references.
        unsafe { cw_set_int(self.0 .0.as_ptr(), key.0.as_ptr(), value) == 0 }
    }

    /// Removes `key` if there.
    pub fn remove(&mut self, key: &Obj) {
        // SAFETY: both objects are live references.
        unsafe { cw_del(self.0 .0.as_ptr(), key.0.as_ptr()) }
    }
}

/// Calls the app with `environ` for the request `exchange` answers.
pub fn call(exchange: &mut Exchange<'_>, environ: Environ, body_len: u64) -> Outcome {
    let env = environ.0 .0.as_ptr();
    // python.c takes the environ's reference over.
    std::mem::forget(environ);
    let ctx: *mut Exchange<'_> = exchange;
    // SAFETY: `ctx` points at the exchange, which outlives the call and is only reached
    // through the callbacks below during it; `env` is an owned reference handed over.
    match unsafe { cw_call(ctx.cast(), env, body_len) } {
        0 => Outcome::Answered,
        2 => Outcome::FailedSent,
        3 => Outcome::Gone,
        _ => Outcome::FailedUnsent,
    }
}

/// The exchange a callback's `ctx` names.
///
/// # Safety
/// `ctx` is the pointer [`call`] handed to `cw_call`, whose exchange is alive and not
/// otherwise borrowed while python.c runs.
unsafe fn exchange<'a>(ctx: *mut c_void) -> &'a mut Exchange<'a> {
    // SAFETY: as the caller guarantees.
    unsafe { &mut *ctx.cast::<Exchange<'a>>() }
}

/// What names the request in python.c's log lines ("GET /path"), NUL-terminated in `dst`
/// (`len` bytes, cut to fit; a NUL inside becomes `?`).
#[no_mangle]
extern "C" fn corral_wsgi_what(ctx: *mut c_void, dst: *mut c_char, len: usize) {
    if ctx.is_null() || dst.is_null() || len == 0 {
        return;
    }
    // SAFETY: python.c passes the ctx of the running call and a buffer of `len` bytes.
    let (exchange, dst) = unsafe {
        (
            exchange(ctx),
            std::slice::from_raw_parts_mut(dst.cast::<u8>(), len),
        )
    };
    let what = exchange.what();
    let n = what.len().min(len - 1);
    for (d, &s) in dst
        .iter_mut()
        .zip(what.as_bytes().get(..n).unwrap_or_default())
    {
        *d = if s == 0 { b'?' } else { s };
    }
    if let Some(end) = dst.get_mut(n) {
        *end = 0;
    }
}

/// wsgi.input's reads: up to `len` body bytes into `dst`; 0 at the end, -1 on failure.
#[no_mangle]
extern "C" fn corral_wsgi_read(ctx: *mut c_void, dst: *mut c_char, len: usize) -> c_long {
    if ctx.is_null() || dst.is_null() {
        return -1;
    }
    // SAFETY: python.c passes the ctx of the running call and a buffer of `len` bytes.
    let (exchange, dst) = unsafe {
        (
            exchange(ctx),
            std::slice::from_raw_parts_mut(dst.cast::<u8>(), len),
        )
    };
    exchange.read_body(dst).map_or(-1, |n| n as c_long)
}

/// The response head: `status` and `count` header lines. 0, or -1 with the reason in
/// `err` (a NUL-terminated message of at most `err_len` bytes).
#[no_mangle]
extern "C" fn corral_wsgi_head(
    ctx: *mut c_void,
    status: c_int,
    headers: *const Header,
    count: usize,
    err: *mut c_char,
    err_len: usize,
) -> c_int {
    if ctx.is_null() || (headers.is_null() && count > 0) {
        return -1;
    }
    // SAFETY: python.c passes the ctx of the running call and `count` headers whose
    // strings live across the call.
    let (exchange, headers) = unsafe {
        (
            exchange(ctx),
            if count == 0 {
                &[][..]
            } else {
                std::slice::from_raw_parts(headers, count)
            },
        )
    };
    // SAFETY: each header's pointers are valid for their lengths (python.c keeps the
    // strings alive during the call).
    let pairs: Vec<(&[u8], &[u8])> = headers
        .iter()
        .map(|h| unsafe {
            (
                std::slice::from_raw_parts(h.name.cast::<u8>(), h.name_len),
                std::slice::from_raw_parts(h.value.cast::<u8>(), h.value_len),
            )
        })
        .collect();
    let status = u16::try_from(status).unwrap_or(0);
    match exchange.head(status, &pairs) {
        Ok(()) => 0,
        Err(why) => {
            if !err.is_null() && err_len > 0 {
                let n = why.len().min(err_len - 1);
                // SAFETY: `err` has room for `err_len` bytes; `n + 1 <= err_len`.
                unsafe {
                    std::ptr::copy_nonoverlapping(why.as_ptr(), err.cast::<u8>(), n);
                    *err.add(n) = 0;
                }
            }
            -1
        }
    }
}

/// Body bytes; `flush`: written now. 0, or -1 when the connection is gone.
#[no_mangle]
extern "C" fn corral_wsgi_write(
    ctx: *mut c_void,
    data: *const c_char,
    len: usize,
    flush: c_int,
) -> c_int {
    if ctx.is_null() || (data.is_null() && len > 0) {
        return -1;
    }
    // SAFETY: python.c passes the ctx of the running call and `len` bytes of a live bytes
    // object.
    let (exchange, data) = unsafe {
        (
            exchange(ctx),
            if len == 0 {
                &[][..]
            } else {
                std::slice::from_raw_parts(data.cast::<u8>(), len)
            },
        )
    };
    if exchange.write(data, flush != 0) {
        0
    } else {
        -1
    }
}

/// Whether any of the head was written (past that, the answer can no longer change).
#[no_mangle]
extern "C" fn corral_wsgi_head_sent(ctx: *mut c_void) -> c_int {
    if ctx.is_null() {
        return 1;
    }
    // SAFETY: python.c passes the ctx of the running call.
    c_int::from(unsafe { exchange(ctx) }.head_sent())
}
