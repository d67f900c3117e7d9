//! Worker mode (`--worker SCRIPT`): the script boots the application once and then loops on
//! `corral_handle_request($handler)`. PHP runs the script as one long request (`sapi.c`,
//! `corral_php_worker`); each `corral_handle_request` call comes here for the next request
//! ([`corral_rs_worker_next`]: accept a connection when there is none, read the request and
//! its body, answer corral's readiness probe without PHP) and back when the handler's answer
//! is complete ([`corral_rs_worker_finish`]).
//!
//! The state lives in a thread-local: PHP runs on this one thread, and the callbacks reach
//! it only while the script runs. The exchange of the request in progress is boxed and
//! handed to PHP as the request context; it is taken back when that request ends, or after
//! the script ends in the middle of one (a fatal error, an uncaught exception or exit() in
//! the handler), which PHP's own shutdown has answered; the process then exits, and corral
//! replaces it with a fresh one ([`retire`]).

use std::cell::RefCell;
use std::ffi::{c_void, CString};
use std::rc::Rc;

use corral_protocols::lsapi::{FlagRule, ResponseEncoder};

use crate::body::Body;
use crate::conn::{Conn, End};
use crate::exchange::{Exchange, Sink};
use crate::php::{self, CRequest, RequestInfo};
use crate::request;

/// The request in progress: its exchange (PHP's context) and the strings PHP points at.
struct Current {
    exchange: *mut Exchange,
    _info: RequestInfo,
}

#[derive(Default)]
struct State {
    conn: Option<Conn>,
    current: Option<Current>,
    served: u64,
}

thread_local! {
    static STATE: RefCell<State> = RefCell::default();
}

/// Runs `script` as the worker script; the process's exit code.
pub fn serve(script: &str) -> i32 {
    let path = match std::fs::canonicalize(script) {
        Ok(p) => p,
        Err(e) => {
            crate::log(&format!("worker script {script}: {e}"));
            return 1;
        }
    };
    let text = path.display().to_string();
    let Ok(filename) = CString::new(text.as_bytes()) else {
        crate::log("the worker script's path holds a NUL byte");
        return 1;
    };
    let boot_vars = request::Server::Fixed(vec![
        ("SCRIPT_FILENAME", text.clone().into()),
        ("SCRIPT_NAME", bytes::Bytes::from_static(b"/")),
        ("PHP_SELF", bytes::Bytes::from_static(b"/")),
    ]);
    let mut boot = Exchange::new(
        Sink::Log,
        ResponseEncoder::default(),
        boot_vars,
        Body::empty(),
        crate::What::Named(format!("worker script {text}")),
    );
    let info = RequestInfo::new(
        [
            Some(b"GET"),
            Some(b""),
            Some(b"/"),
            None,
            Some(filename.as_bytes()),
            None,
            None,
        ],
        0,
    );
    let ran = php::run_worker(&mut boot, &info);
    // The script ended. A request still in progress was cut short by a fatal error, an
    // uncaught exception or exit(): PHP's shutdown has sent what it had (a fatal error's
    // 500). The process ends after that answer, so the next request meets a fresh worker
    // (nothing the script, PHP or an extension held survives); see `retire`.
    let current = STATE.with(|s| s.borrow_mut().current.take());
    if let Some(current) = current {
        // SAFETY: the pointer came from Box::into_raw in `corral_rs_worker_next` and PHP,
        // whose script has ended, no longer holds it.
        let exchange = unsafe { Box::from_raw(current.exchange) };
        let served = STATE.with(|s| s.borrow().served);
        crate::log(&format!(
            "the worker script ended during request {served} (a fatal error, an uncaught \
             exception or exit()): answered, exiting so that corral starts a fresh worker"
        ));
        retire(*exchange);
        return 0;
    }
    let served = STATE.with(|s| s.borrow().served);
    match ran {
        Ok(()) if crate::stopping() => 0,
        Ok(()) => {
            crate::log(&format!(
                "the worker script {text} ended after {served} requests without a stop \
                 signal (corral_handle_request must be called in a loop)"
            ));
            1
        }
        Err(()) => {
            crate::log("PHP could not start the worker script's request");
            1
        }
    }
}

/// Ends the worker after the script ended inside a request: the listening socket is closed
/// first (corral's next connection to this worker is refused, which it reroutes to another
/// worker with nothing sent), then the answer is completed with CONN_CLOSE, and the worker
/// waits (boundedly) until corral has closed the connection, so that corral has seen the
/// request finish before it sees the process exit (0, a worker stopping on its own after
/// serving, replaced without crash backoff).
fn retire(exchange: Exchange) {
    crate::close_listener();
    let conn = STATE.with(|s| s.borrow_mut().conn.take());
    exchange.finish_closing();
    if let Some(conn) = conn {
        conn.wait_closed(RETIRE_WAITS, 1_000);
    }
}

/// How many seconds (at most) a retiring worker waits for corral to close the connection.
const RETIRE_WAITS: u32 = 5;

/// The next request's exchange and fields, for `corral_handle_request`; null when the
/// worker should end (a stop signal, or the listener failed).
#[no_mangle]
extern "C" fn corral_rs_worker_next(out: *mut CRequest) -> *mut c_void {
    if out.is_null() {
        return std::ptr::null_mut();
    }
    STATE.with(|s| {
        let mut state = s.borrow_mut();
        loop {
            if crate::stopping() {
                return std::ptr::null_mut();
            }
            if state.conn.is_none() {
                match accept() {
                    Some(conn) => state.conn = Some(conn),
                    None => return std::ptr::null_mut(),
                }
            }
            let Some(conn) = state.conn.as_mut() else {
                continue;
            };
            let (begin, body) = match conn.next_request(crate::LISTENER) {
                Ok(r) => r,
                Err(End::Closed) => {
                    state.conn = None;
                    continue;
                }
                Err(End::Stopping) => return std::ptr::null_mut(),
                Err(End::Failed(why)) => {
                    crate::log(&format!("{why}; connection closed"));
                    state.conn = None;
                    continue;
                }
            };
            let encoder = ResponseEncoder::new(begin.order(), FlagRule::HOST);
            let sink = Sink::Conn(Rc::clone(&conn.stream));
            let known = request::Known::of(&begin);
            let probe = known.is_probe();
            let info = request::info(&begin, &known, known.script(&begin));
            let vars = request::Server::request(begin);
            let exchange = Exchange::new(sink, encoder, vars, body, crate::What::Request);
            if probe {
                // Answered by the worker itself: PHP is up and the script has booted.
                if !exchange.answer(204, b"", false) {
                    state.conn = None;
                }
                continue;
            }
            let exchange = Box::into_raw(Box::new(exchange));
            // SAFETY: `out` points at the caller's struct, valid for writes; its strings
            // point into `info`, kept in `current` until the request ends.
            unsafe { out.write(php::c_request(&info)) };
            state.current = Some(Current {
                exchange,
                _info: info,
            });
            state.served += 1;
            return exchange.cast();
        }
    })
}

/// The handler returned and PHP ended the request: the answer is completed and written.
#[no_mangle]
extern "C" fn corral_rs_worker_finish(ctx: *mut c_void) {
    STATE.with(|s| {
        let mut state = s.borrow_mut();
        let Some(current) = state.current.take() else {
            return;
        };
        if current.exchange.cast() != ctx {
            crate::log("corral_rs_worker_finish: not the request in progress");
        }
        // SAFETY: the pointer came from Box::into_raw in `corral_rs_worker_next`, and PHP
        // ended the request that used it.
        let exchange = unsafe { Box::from_raw(current.exchange) };
        // A stop signal came during the request: the next call returns false and the
        // script ends, so corral is told not to send another request here.
        if crate::stopping() {
            exchange.finish_closing();
            state.conn = None;
        } else if !exchange.finish() {
            state.conn = None;
        }
    });
}

/// The next connection on the listener; `None` on a stop signal or a broken listener.
fn accept() -> Option<Conn> {
    loop {
        if crate::stopping() {
            return None;
        }
        match corral_worker_control::conn::accept(crate::LISTENER) {
            Ok(Some(stream)) => return Some(Conn::new(stream)),
            // None yet, a stop, or gone before it was taken: the loop looks at the flag.
            Ok(None) => {}
            Err(e) => {
                crate::log(&format!("accept on fd 0 failed: {e}"));
                return None;
            }
        }
    }
}
