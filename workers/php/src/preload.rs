//! The fork template (`--preload`, corral's "Preload and fork" protocol): PHP is started once
//! (libphp loaded, php.ini read, every extension's MINIT, OPcache's shared memory mapped),
//! then every worker is forked from this process, as php-fpm's master forks its children.
//! The workers share the template's pages until they write them, and share one OPcache
//! segment (a spawned worker maps a segment of its own and compiles every script into it).
//!
//! fd 0 is the control socket to corral; the protocol's loop is workers/control's. A forked
//! worker gets its listening socket on fd 0, where a spawned worker has it.

use std::os::fd::RawFd;

use corral_worker_control::Host;

/// What the caller of [`run`] is once it returns.
pub enum Role {
    /// The template, ending with this exit code.
    Template(i32),
    /// A freshly forked worker: its listening socket is fd 0, its signals are as a spawned
    /// worker's; it serves as one.
    Worker,
}

/// PHP's side of the template.
const PHP: Host = Host {
    loaded: "PHP",
    name: "the fork template",
    log: crate::log,
    stopping: crate::stopping,
    reset_stop: crate::reset_stop,
    fork,
};

fn fork() -> i64 {
    // SAFETY: this process has one thread (PHP is not thread-safe and runs here alone), so
    // the child is a whole copy; it only makes system calls before it serves.
    unsafe { libc::fork() }.into()
}

/// Runs the template on `control` (PHP started); returns in the template when it ends, and
/// in each forked worker right after its fork.
pub fn run(control: RawFd) -> Role {
    match corral_worker_control::run(control, &PHP) {
        corral_worker_control::Role::Template(code) => Role::Template(code),
        corral_worker_control::Role::Worker(listener) => {
            // The control socket is closed; the listener takes fd 0.
            // SAFETY: dup2 and close on descriptors this process owns.
            unsafe {
                if libc::dup2(listener, crate::LISTENER) < 0 {
                    libc::_exit(1);
                }
                libc::close(listener);
            }
            Role::Worker
        }
    }
}
