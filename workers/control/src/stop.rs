//! The stop flag both native workers keep: SIGTERM and SIGINT only set it, and the worker
//! looks at it between requests and when a wait returns. The handlers are installed without
//! SA_RESTART, so a wait between requests or in accept(2) returns EINTR and sees the flag;
//! the request in progress still finishes.

use std::sync::atomic::{AtomicBool, Ordering};

static STOPPING: AtomicBool = AtomicBool::new(false);

/// Whether a stop signal came.
pub fn stopping() -> bool {
    STOPPING.load(Ordering::Relaxed)
}

/// Forgets a stop signal (a worker just forked from the template starts afresh).
pub fn reset_stop() {
    STOPPING.store(false, Ordering::Relaxed);
}

extern "C" fn on_stop(_: libc::c_int) {
    STOPPING.store(true, Ordering::Relaxed);
}

/// Makes SIGTERM and SIGINT set the flag (no SA_RESTART).
pub fn catch_stop_signals() {
    // SAFETY: `on_stop` only stores to an atomic, which is async-signal-safe; the sigaction
    // struct is zeroed and then filled.
    unsafe {
        let mut action: libc::sigaction = std::mem::zeroed();
        action.sa_sigaction = on_stop as extern "C" fn(libc::c_int) as usize;
        libc::sigemptyset(&mut action.sa_mask);
        for signal in [libc::SIGTERM, libc::SIGINT] {
            libc::sigaction(signal, &action, std::ptr::null_mut());
        }
    }
}
