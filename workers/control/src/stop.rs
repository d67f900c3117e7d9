//! The stop flag both native workers keep, and the pipe that makes every wait see it.
//!
//! SIGTERM and SIGINT only set the flag and write one byte into a non-blocking pipe (the
//! "self-pipe"; write(2) is async-signal-safe); the request in progress still finishes. A
//! flag alone is not enough: a signal that lands after the worker looked at the flag and
//! before it blocks in poll(2) or accept(2) sets the flag, the handler returns, and the wait
//! then blocks with nothing to end it (no EINTR: the signal came before the call). So every
//! wait that may block without a bound polls [`wake_fd`], the pipe's read end, beside its
//! own descriptors ([`crate::conn`]): the byte is there whether the signal came before the
//! call or during it, and on whichever thread of the process it was delivered.
//!
//! Why a pipe and not signals held outside the waits and let in by ppoll(2) (as the fork
//! template's own loop does, in lib.rs, where no script runs): the workers run PHP scripts
//! and Python apps between their waits, and a held SIGTERM would be held there too. A
//! script's exec() or proc_open() child would inherit it held (the mask survives execve),
//! PHP's pcntl handlers and Python threads would never see it, and PHP keeps its own
//! bookkeeping of the mask around its signal handling. The pipe changes nothing of the
//! signals' delivery; it costs one more pollfd in waits that only happen when idle, and no
//! system call per request.
//!
//! The byte is never read back: once the flag is set this process stops, so the pipe stays
//! readable, and every wait that sees it returns "stopping". At most one byte is written
//! (only by the signal that sets the flag). A worker forked from the fork template must not
//! share the template's pipe (a SIGTERM to the template would wake it, and a stop of the
//! worker would leave the template's pipe readable), so [`reset_stop`] makes it a pipe of
//! its own.

use std::io;
use std::os::fd::RawFd;
use std::sync::atomic::{AtomicBool, AtomicI32, Ordering};

static STOPPING: AtomicBool = AtomicBool::new(false);
/// The pipe's ends (-1 until [`catch_stop_signals`] made it).
static WAKE_READ: AtomicI32 = AtomicI32::new(-1);
static WAKE_WRITE: AtomicI32 = AtomicI32::new(-1);

/// Whether a stop signal came.
pub fn stopping() -> bool {
    STOPPING.load(Ordering::Relaxed)
}

/// The read end of the stop pipe: readable once a stop signal came (-1 before
/// [`catch_stop_signals`]; poll(2) ignores a negative fd).
pub fn wake_fd() -> RawFd {
    WAKE_READ.load(Ordering::Relaxed)
}

/// Forgets a stop signal and makes this process its own stop pipe (a worker just forked
/// from the template starts afresh). Call it with SIGTERM and SIGINT blocked, as the
/// template's fork does: a signal between the two steps would otherwise set the flag of
/// the old state.
pub fn reset_stop() -> io::Result<()> {
    STOPPING.store(false, Ordering::SeqCst);
    for end in [&WAKE_WRITE, &WAKE_READ] {
        let fd = end.swap(-1, Ordering::SeqCst);
        if fd >= 0 {
            // SAFETY: the fd is this module's pipe end (inherited across fork), owned by
            // nothing else and no longer published.
            unsafe { libc::close(fd) };
        }
    }
    make_pipe()
}

/// The lowest descriptor the pipe may take (see [`make_pipe`]).
const ABOVE_STDIO: RawFd = 3;

/// A fresh non-blocking, close-on-exec pipe, published for the handler and the waits.
///
/// Its ends are kept off fds 0-2: those are the ones a worker places things on with
/// dup2(2), which silently closes what was there. A forked worker makes its pipe right
/// after closing the template's control socket, fd 0 in the PHP worker, so pipe(2) gave it
/// fd 0 for the read end, and the worker then moved its listener onto fd 0: the waits
/// polled the listener in the pipe's place, and a stop signal landing between the flag's
/// check and the wait was lost (tests/native_stop.rs, a preloaded worker left running after
/// its restart; `fork_tests.rs`).
fn make_pipe() -> io::Result<()> {
    let mut fds = [-1 as libc::c_int; 2];
    // SAFETY: `fds` has room for the two descriptors.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC | libc::O_NONBLOCK) } != 0 {
        return Err(io::Error::last_os_error());
    }
    let [read, write] = fds.map(above_stdio);
    let (read, write) = match (read, write) {
        (Ok(read), Ok(write)) => (read, write),
        (read, write) => {
            for fd in [&read, &write].into_iter().flatten() {
                // SAFETY: an end made here and never published.
                unsafe { libc::close(*fd) };
            }
            return Err(read
                .and(write)
                .err()
                .unwrap_or_else(io::Error::last_os_error));
        }
    };
    WAKE_READ.store(read, Ordering::SeqCst);
    // Published last: a signal from here on reaches a pipe whose read end the waits poll.
    WAKE_WRITE.store(write, Ordering::SeqCst);
    Ok(())
}

/// `fd`, or when it is one of fds 0-2, a close-on-exec copy of it above them (the low one
/// closed either way: on failure too, so that the caller closes only what it got back).
fn above_stdio(fd: RawFd) -> io::Result<RawFd> {
    if fd >= ABOVE_STDIO {
        return Ok(fd);
    }
    // SAFETY: fcntl(2) copies a descriptor `make_pipe` just made (O_NONBLOCK belongs to the
    // open file, which the copy shares); close(2) then drops the low one, owned by nothing
    // else.
    unsafe {
        let moved = libc::fcntl(fd, libc::F_DUPFD_CLOEXEC, ABOVE_STDIO);
        let result = if moved < 0 {
            Err(io::Error::last_os_error())
        } else {
            Ok(moved)
        };
        libc::close(fd);
        result
    }
}

extern "C" fn on_stop(_: libc::c_int) {
    // The flag first, then the byte: a wait that sees the byte also sees the flag.
    if STOPPING.swap(true, Ordering::SeqCst) {
        return;
    }
    let fd = WAKE_WRITE.load(Ordering::SeqCst);
    if fd >= 0 {
        // SAFETY: write(2) is async-signal-safe; errno is saved around it (the handler may
        // interrupt code that is about to read errno). A full pipe (EAGAIN) cannot happen
        // with one byte, and a failure leaves the flag, which the waits still check first.
        unsafe {
            let errno = *libc::__errno_location();
            let byte = 1u8;
            libc::write(fd, (&byte as *const u8).cast(), 1);
            *libc::__errno_location() = errno;
        }
    }
}

/// Makes the stop pipe, then makes SIGTERM and SIGINT set the flag and write to it (no
/// SA_RESTART: a read interrupted inside a request sees the flag too).
pub fn catch_stop_signals() -> io::Result<()> {
    if WAKE_WRITE.load(Ordering::SeqCst) < 0 {
        make_pipe()?;
    }
    // SAFETY: `on_stop` only touches atomics and calls write(2), all async-signal-safe; the
    // sigaction struct is zeroed and then filled.
    unsafe {
        let mut action: libc::sigaction = std::mem::zeroed();
        action.sa_sigaction = on_stop as extern "C" fn(libc::c_int) as usize;
        libc::sigemptyset(&mut action.sa_mask);
        for signal in [libc::SIGTERM, libc::SIGINT] {
            if libc::sigaction(signal, &action, std::ptr::null_mut()) != 0 {
                return Err(io::Error::last_os_error());
            }
        }
    }
    Ok(())
}
