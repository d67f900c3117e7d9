//! The FFI with PHP: starting it once (`startup`), running one request (`run`), and the
//! `corral_rs_*` callbacks the SAPI module (`sapi.c`) makes during a request, each of which
//! forwards to the [`Exchange`] that `SG(server_context)` points at.
//!
//! PHP runs on this one thread only (libphp is built without thread safety): `run` is called
//! with the exchange borrowed mutably, and the callbacks reach it through the raw pointer only
//! while that call lasts. A callback never unwinds into C: it catches nothing because nothing
//! in it panics (no indexing, no unwrap), and its errors become what PHP expects (a short
//! write, no body).

use std::ffi::{c_char, c_int, c_void, CString};
use std::ptr::NonNull;

use crate::exchange::Exchange;

/// The C `struct corral_request` of `sapi.c`: what PHP reads about a request before
/// `php_request_startup`. Every pointer is NUL-terminated and outlives the `run` call.
#[repr(C)]
pub struct CRequest {
    method: *const c_char,
    query_string: *mut c_char,
    request_uri: *mut c_char,
    content_type: *const c_char,
    content_length: i64,
    script_filename: *mut c_char,
    cookie: *mut c_char,
    authorization: *const c_char,
}

/// PHP's `zval`, only ever passed back to C by pointer.
#[repr(C)]
pub struct Zval {
    _opaque: [u8; 0],
}

/// PHP's `zend_string`, only ever passed back to C by pointer.
#[repr(C)]
pub struct ZendString {
    _opaque: [u8; 0],
}

extern "C" {
    fn corral_php_startup(ini: *mut c_char) -> c_int;
    fn corral_php_run(ctx: *mut c_void, request: *const CRequest) -> c_int;
    fn corral_php_worker(ctx: *mut c_void, request: *const CRequest) -> c_int;
    fn corral_php_shutdown();
    fn corral_php_register_variable(
        track_vars: *mut Zval,
        key: *const c_char,
        value: *const c_char,
        value_len: usize,
    );
    fn corral_php_register_known(
        track_vars: *mut Zval,
        key: *const c_char,
        key_len: usize,
        value: *const c_char,
        value_len: usize,
    );
    fn corral_php_key_new(key: *const c_char, key_len: usize) -> *mut ZendString;
    fn corral_php_key_release(key: *mut ZendString);
    fn corral_php_register_key(
        track_vars: *mut Zval,
        key: *mut ZendString,
        value: *const c_char,
        value_len: usize,
    );
}

pub use crate::request::RequestInfo;

/// Starts PHP: php.ini (the embed SAPI's, `/etc/php/8.2/embed/php.ini` on Debian) with
/// `ini` ("key=value" lines) on top, and every extension's module startup. Once per process.
pub fn startup(ini: &str) -> Result<(), String> {
    let ini = CString::new(ini).map_err(|_| "an ini override holds a NUL byte".to_owned())?;
    // PHP keeps the pointer for its whole life: leaked on purpose, once.
    let ini = ini.into_raw();
    // SAFETY: called once, before any other PHP function, on the only thread that runs PHP;
    // `ini` is a valid NUL-terminated string that is never freed.
    let rc = unsafe { corral_php_startup(ini) };
    if rc == 0 {
        Ok(())
    } else {
        Err("PHP's module startup failed (see the lines above)".to_owned())
    }
}

/// Ends PHP (every extension's module shutdown) before the process exits.
pub fn shutdown() {
    // SAFETY: PHP was started by `startup` and no request is running.
    unsafe { corral_php_shutdown() }
}

/// The C view of `info`; its pointers are valid while `info` lives.
pub fn c_request(info: &RequestInfo) -> CRequest {
    use crate::request::field;
    let ptr = |i: usize| -> *const c_char {
        match info.at.get(i).copied().flatten() {
            Some(at) => info
                .text
                .get(at..)
                .map_or(std::ptr::null(), |t| t.as_ptr().cast()),
            None => std::ptr::null(),
        }
    };
    CRequest {
        method: ptr(field::METHOD),
        query_string: ptr(field::QUERY).cast_mut(),
        request_uri: ptr(field::URI).cast_mut(),
        content_type: ptr(field::CONTENT_TYPE),
        content_length: info.content_length,
        script_filename: ptr(field::SCRIPT).cast_mut(),
        cookie: ptr(field::COOKIE).cast_mut(),
        authorization: ptr(field::AUTHORIZATION),
    }
}

/// Runs one request through PHP, which calls back into `exchange` for its output, headers,
/// body and variables. `Err` when PHP could not start the request (the process should end).
pub fn run(exchange: &mut Exchange, info: &RequestInfo) -> Result<(), ()> {
    let request = c_request(info);
    let ctx: *mut Exchange = exchange;
    // SAFETY: PHP is started; `request`'s strings live in `info` for the whole call and PHP
    // only reads them (the `*mut` are the types of PHP's struct fields, which it does not
    // write through); `ctx` is a unique borrow for the whole call, reached only by the
    // callbacks below, which run on this thread during the call.
    let rc = unsafe { corral_php_run(ctx.cast(), &request) };
    if rc == 0 {
        Ok(())
    } else {
        Err(())
    }
}

/// Runs the worker script `info.script_filename` as one long request whose own context is
/// `boot` (worker mode, `crate::worker`); returns when the script ends.
pub fn run_worker(boot: &mut Exchange, info: &RequestInfo) -> Result<(), ()> {
    let request = c_request(info);
    let ctx: *mut Exchange = boot;
    // SAFETY: as in `run`; the requests served meanwhile have contexts of their own, boxed
    // by `crate::worker`, and PHP switches back to `ctx` between them.
    let rc = unsafe { corral_php_worker(ctx.cast(), &request) };
    if rc == 0 {
        Ok(())
    } else {
        Err(())
    }
}

/// Whether PHP would register `key` as it is: letters, digits and `_`, not starting with a
/// digit. Anything else (a `.`, a space or a `[` PHP rewrites or parses, a numeric key)
/// takes PHP's full registration.
pub fn plain_key(key: &[u8]) -> bool {
    // One table look-up per byte (and no early exit to predict): the character-class tests
    // it replaces were a tenth of a worker-mode request's instructions (callgrind), thirty
    // keys a request.
    let mut plain = key.first().is_some_and(|b| !b.is_ascii_digit());
    for &b in key {
        plain &= PLAIN_BYTE[usize::from(b)];
    }
    plain
}

/// The bytes a plain key is made of: ASCII letters, digits and `_`.
static PLAIN_BYTE: [bool; 256] = {
    let mut t = [false; 256];
    let mut b = 0;
    while b < 256 {
        let c = b as u8;
        t[b] = c.is_ascii_alphanumeric() || c == b'_';
        b += 1;
    }
    t
};

/// Registers one `$_SERVER` entry (`key` any bytes but NUL, which leaves the entry out;
/// `value` any bytes). A plain key (nearly all of them: CGI names) is stored as given,
/// with its length (`php_register_known_variable`, what PHP itself uses for PHP_SELF and
/// REQUEST_TIME), skipping the name parsing that only an odd key needs.
pub fn register_variable(track_vars: *mut Zval, key: &[u8], value: &[u8]) {
    if plain_key(key) {
        // SAFETY: `track_vars` is the array PHP passed to the callback that calls this, still
        // being filled; `key` and `value` are read for their lengths only.
        unsafe {
            corral_php_register_known(
                track_vars,
                key.as_ptr().cast(),
                key.len(),
                value.as_ptr().cast(),
                value.len(),
            )
        }
        return;
    }
    let Ok(key) = CString::new(key) else { return };
    if key.as_bytes().is_empty() {
        return;
    }
    // SAFETY: as above; `key` is NUL-terminated.
    unsafe {
        corral_php_register_variable(track_vars, key.as_ptr(), value.as_ptr().cast(), value.len())
    }
}

/// PHP's string for the plain `$_SERVER` key `key`, hash computed, owned by the caller until
/// [`key_release`] (`None` for `GLOBALS`, which PHP never registers). Only during a request.
pub fn key_new(key: &[u8]) -> Option<NonNull<ZendString>> {
    // SAFETY: PHP is in a request (the caller registers variables); `key` is read for its
    // length only.
    NonNull::new(unsafe { corral_php_key_new(key.as_ptr().cast(), key.len()) })
}

/// Gives back a string from [`key_new`].
pub fn key_release(key: NonNull<ZendString>) {
    // SAFETY: `key` came from `key_new` and its request has not ended; released once.
    unsafe { corral_php_key_release(key.as_ptr()) }
}

/// Registers one `$_SERVER` entry under `key`, a string from [`key_new`].
pub fn register_key(track_vars: *mut Zval, key: NonNull<ZendString>, value: &[u8]) {
    // SAFETY: as in `register_variable`; `key` is alive (kept by `crate::keys`).
    unsafe { corral_php_register_key(track_vars, key.as_ptr(), value.as_ptr().cast(), value.len()) }
}

/// The exchange `ctx` points at.
///
/// # Safety
/// `ctx` must be the pointer `run` handed PHP, during that call.
unsafe fn exchange<'a>(ctx: *mut c_void) -> &'a mut Exchange {
    // SAFETY: per the contract, a unique borrow that `run` holds for the whole call.
    unsafe { &mut *ctx.cast::<Exchange>() }
}

/// `len` bytes at `buf` as a slice (empty for a null pointer).
///
/// # Safety
/// `buf` must be valid for reads of `len` bytes, or null.
unsafe fn bytes<'a>(buf: *const c_char, len: usize) -> &'a [u8] {
    if buf.is_null() || len == 0 {
        return &[];
    }
    // SAFETY: per the contract.
    unsafe { std::slice::from_raw_parts(buf.cast(), len) }
}

/// ub_write: the script's output.
#[no_mangle]
extern "C" fn corral_rs_write(ctx: *mut c_void, buf: *const c_char, len: usize) -> usize {
    // SAFETY: PHP passes its server context and a buffer of `len` bytes.
    let (ex, data) = unsafe { (exchange(ctx), bytes(buf, len)) };
    ex.write(data)
}

/// flush(): what is buffered goes out now.
#[no_mangle]
extern "C" fn corral_rs_flush(ctx: *mut c_void) {
    // SAFETY: PHP passes its server context.
    unsafe { exchange(ctx) }.flush();
}

/// fastcgi_finish_request(): the answer completed now; 1 when this call completed it.
#[no_mangle]
extern "C" fn corral_rs_finish_early(ctx: *mut c_void) -> c_int {
    // SAFETY: PHP passes its server context.
    c_int::from(unsafe { exchange(ctx) }.finish_early())
}

/// The C `struct corral_line` of `sapi.c`: one response header line PHP holds.
#[repr(C)]
pub struct CLine {
    text: *const c_char,
    len: usize,
}

/// The end of the headers: the status and every header line (`Name: value`), borrowed.
#[no_mangle]
extern "C" fn corral_rs_send_head(
    ctx: *mut c_void,
    status: c_int,
    lines: *const CLine,
    count: usize,
) {
    // SAFETY: PHP passes its server context and `count` lines (none when `lines` is null),
    // each `len` bytes long, alive for this call.
    let (ex, lines) = unsafe {
        let lines: &[CLine] = if lines.is_null() || count == 0 {
            &[]
        } else {
            std::slice::from_raw_parts(lines, count)
        };
        (exchange(ctx), lines)
    };
    // SAFETY: as above, for each line.
    let texts = lines.iter().map(|l| unsafe { bytes(l.text, l.len) });
    ex.send_head_lines(u16::try_from(status).unwrap_or(500), texts);
}

/// read_post: up to `len` body bytes into `buf`; 0 at the end.
#[no_mangle]
extern "C" fn corral_rs_read_body(ctx: *mut c_void, buf: *mut c_char, len: usize) -> usize {
    if buf.is_null() || len == 0 {
        return 0;
    }
    // SAFETY: PHP passes its server context and a writable buffer of `len` bytes.
    let (ex, dst) = unsafe {
        (
            exchange(ctx),
            std::slice::from_raw_parts_mut(buf.cast::<u8>(), len),
        )
    };
    ex.read_body(dst)
}

/// register_server_variables: fills `$_SERVER`; `keep_keys` (worker mode, a request the
/// worker script serves) reuses the keys of the request before (`crate::keys`).
#[no_mangle]
extern "C" fn corral_rs_register_variables(
    ctx: *mut c_void,
    track_vars: *mut Zval,
    keep_keys: c_int,
) {
    // SAFETY: PHP passes its server context.
    unsafe { exchange(ctx) }.register_variables(track_vars, keep_keys != 0);
}

/// log_message: PHP's error log line (when error_log is unset), to stderr, which corral
/// logs with the worker's pool and pid.
#[no_mangle]
extern "C" fn corral_rs_log(message: *const c_char, len: usize) {
    // SAFETY: PHP passes a message of `len` bytes.
    let text = unsafe { bytes(message, len) };
    crate::log(&String::from_utf8_lossy(text));
}

#[cfg(test)]
mod tests {
    #[test]
    fn only_plain_keys_skip_phps_parsing() {
        for plain in [&b"HTTP_HOST"[..], b"_x", b"PHP_SELF", b"a1"] {
            assert!(super::plain_key(plain), "{plain:?}");
        }
        for odd in [
            &b""[..],
            b"1",
            b"123",
            b"a.b",
            b"a b",
            b"a[b]",
            b"x-y",
            b"\0",
            b"\xc3\xa9",
        ] {
            assert!(!super::plain_key(odd), "{odd:?}");
        }
        // Every byte against the plain definition, alone and after a letter.
        for b in 0..=255u8 {
            let class = b.is_ascii_alphanumeric() || b == b'_';
            assert_eq!(super::plain_key(&[b]), class && !b.is_ascii_digit(), "{b}");
            assert_eq!(super::plain_key(&[b'A', b]), class, "{b}");
        }
    }
}
