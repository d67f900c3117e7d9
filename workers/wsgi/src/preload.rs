//! Preload and fork (ARCHITECTURE.md, "Preload and fork"): the app is loaded once, the
//! collector's objects frozen, then every worker is forked from this process (the
//! preloader), which speaks corral's control protocol on its control socket; the protocol's
//! loop is workers/control's. A forked worker serves the listening socket it was sent, as a
//! spawned worker does, and never returns to the preloader's loop.

use std::os::fd::RawFd;

use corral_worker_control::{Host, Role};

extern "C" {
    fn cw_fork() -> libc::c_long;
    fn cw_freeze();
}

/// Python's side of the preloader.
const PYTHON: Host = Host {
    loaded: "the app",
    name: "the preloader",
    log: crate::log,
    stopping: crate::stopping,
    reset_stop: crate::reset_stop,
    fork,
};

fn fork() -> i64 {
    // SAFETY: python.c forks the way os.fork does (the interpreter's fork hooks run).
    unsafe { cw_fork() }
}

/// Runs the preloader on `control` once the app is loaded; the exit code (in a forked
/// worker, the worker's, which it exits with at once).
pub fn run(control: RawFd) -> i32 {
    // SAFETY: a plain call into python.c with the GIL held.
    unsafe { cw_freeze() };
    match corral_worker_control::run(control, &PYTHON) {
        Role::Template(code) => code,
        Role::Worker(listener) => {
            let code = crate::serve(listener);
            // SAFETY: _exit ends the worker without the preloader's exit handlers.
            unsafe { libc::_exit(code) }
        }
    }
}
