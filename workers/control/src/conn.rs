//! The waits both native workers make on corral's connections, the same in each: accepting
//! a connection on the listening socket, waiting between requests on both the connection and
//! the listener (corral opening a new connection means it dropped the kept one, which is
//! then closed rather than waited on), and waiting a bounded time for a byte. The protocol
//! loops themselves differ (the PHP worker reads a request's whole body before running the
//! script, the WSGI worker streams it to wsgi.input) and stay in each worker.

use std::fs::File;
use std::io;
use std::os::fd::{FromRawFd, RawFd};

use crate::stop;

/// Why a connection ends.
#[derive(Debug)]
pub enum End {
    /// corral closed it between requests, opened another, or an answer could not end.
    Closed,
    /// A stop signal came.
    Stopping,
    /// Bad or incomplete input, or a failed read or write: logged and closed.
    Failed(String),
}

/// Makes `listener` non-blocking, as [`accept`] needs it (once, before serving).
pub fn listen_nonblocking(listener: RawFd) -> io::Result<()> {
    // SAFETY: fcntl(2) on a descriptor the caller owns, with integer arguments.
    unsafe {
        let flags = libc::fcntl(listener, libc::F_GETFL);
        if flags < 0 || libc::fcntl(listener, libc::F_SETFL, flags | libc::O_NONBLOCK) < 0 {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(())
}

/// One connection accepted on `listener` (non-blocking, see [`listen_nonblocking`]; the
/// connection itself is blocking and close-on-exec). `Ok(None)` when there was none yet and
/// the wait for one ended (a connection is coming, a stop signal came, or a signal
/// interrupted it), or the connection went away before it was taken: the caller looks at
/// its stop flag and tries again. The wait polls the stop pipe beside the listener, so a
/// stop signal that came after the caller looked at its flag still ends it.
pub fn accept(listener: RawFd) -> io::Result<Option<File>> {
    // SAFETY: accept4 on a listening socket with no address out-parameters.
    let fd = unsafe {
        libc::accept4(
            listener,
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            libc::SOCK_CLOEXEC,
        )
    };
    if fd >= 0 {
        // SAFETY: `fd` was just returned by accept4 and is owned by nothing else.
        return Ok(Some(unsafe { File::from_raw_fd(fd) }));
    }
    let e = io::Error::last_os_error();
    match e.raw_os_error() {
        Some(libc::EINTR | libc::ECONNABORTED) => Ok(None),
        Some(libc::EAGAIN) => {
            let mut fds = [pollin(listener), pollin(stop::wake_fd())];
            before_wait();
            // SAFETY: `fds` is a valid array of two pollfd for the call's duration.
            let rc = unsafe { libc::poll(fds.as_mut_ptr(), 2, -1) };
            if rc < 0 {
                let e = io::Error::last_os_error();
                if e.kind() != io::ErrorKind::Interrupted {
                    return Err(e);
                }
            }
            Ok(None)
        }
        _ => Err(e),
    }
}

fn pollin(fd: RawFd) -> libc::pollfd {
    libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    }
}

/// Waits between requests until `conn` has bytes (or its end), corral connects anew on
/// `listener` (`End::Closed`: this connection is then closed), or `stopping` says a stop
/// signal came (`End::Stopping`; the stop pipe, polled beside them, ends the wait even when
/// the signal came just before it).
pub fn wait_idle(conn: RawFd, listener: RawFd, stopping: fn() -> bool) -> Result<(), End> {
    loop {
        if stopping() {
            return Err(End::Stopping);
        }
        let mut fds = [pollin(conn), pollin(listener), pollin(stop::wake_fd())];
        before_wait();
        // SAFETY: `fds` is a valid array of three pollfd for the call's duration.
        let rc = unsafe { libc::poll(fds.as_mut_ptr(), 3, -1) };
        if rc < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(End::Failed(format!("poll failed: {e}")));
        }
        // A request already sent is served before a stop (the stop then ends the worker
        // after its answer); the stop pipe's byte makes the next turn see the flag.
        let [conn, listen, _] = fds;
        if conn.revents != 0 {
            return Ok(());
        }
        if listen.revents != 0 {
            return Err(End::Closed);
        }
    }
}

/// Test builds only: what runs right before a wait blocks, on the waiting thread (the
/// tests send a stop signal there, in the window between the flag's check and the wait).
#[cfg(test)]
pub(crate) mod hook {
    use std::cell::Cell;

    thread_local! {
        pub(crate) static BEFORE_WAIT: Cell<Option<fn()>> = const { Cell::new(None) };
    }
}

#[cfg(test)]
fn before_wait() {
    if let Some(f) = hook::BEFORE_WAIT.with(std::cell::Cell::get) {
        f();
    }
}

#[cfg(not(test))]
#[inline(always)]
fn before_wait() {}

/// Whether `fd` became readable within `timeout_ms` (a signal that interrupts the wait
/// waits again: the request in progress still finishes). The wait is bounded, so it does
/// not poll the stop pipe: a stop is seen when the request ends.
pub fn wait_readable(fd: RawFd, timeout_ms: libc::c_int) -> Result<bool, End> {
    loop {
        let mut pfd = libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: `pfd` is a valid pollfd for the call's duration.
        let rc = unsafe { libc::poll(&mut pfd, 1, timeout_ms) };
        if rc < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(End::Failed(format!("poll failed: {e}")));
        }
        return Ok(rc > 0);
    }
}

#[cfg(test)]
mod tests;
