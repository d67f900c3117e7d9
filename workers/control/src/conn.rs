//! The waits both native workers make on corral's connections, the same in each: accepting
//! a connection on the listening socket, waiting between requests on both the connection and
//! the listener (corral opening a new connection means it dropped the kept one, which is
//! then closed rather than waited on), and waiting a bounded time for a byte. The protocol
//! loops themselves differ (the PHP worker reads a request's whole body before running the
//! script, the WSGI worker streams it to wsgi.input) and stay in each worker.

use std::fs::File;
use std::io;
use std::os::fd::{FromRawFd, RawFd};

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

/// One connection accepted on `listener` (close-on-exec); `Ok(None)` when the call was
/// interrupted (a signal: the caller looks at its stop flag) or the connection went away
/// before it was taken, and the caller tries again.
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
    if fd < 0 {
        let e = io::Error::last_os_error();
        return match e.raw_os_error() {
            Some(libc::EINTR | libc::ECONNABORTED | libc::EAGAIN) => Ok(None),
            _ => Err(e),
        };
    }
    // SAFETY: `fd` was just returned by accept4 and is owned by nothing else.
    Ok(Some(unsafe { File::from_raw_fd(fd) }))
}

/// Waits between requests until `conn` has bytes (or its end), corral connects anew on
/// `listener` (`End::Closed`: this connection is then closed), or `stopping` says a stop
/// signal came (`End::Stopping`; the signal interrupts the wait).
pub fn wait_idle(conn: RawFd, listener: RawFd, stopping: fn() -> bool) -> Result<(), End> {
    loop {
        if stopping() {
            return Err(End::Stopping);
        }
        let mut fds = [
            libc::pollfd {
                fd: conn,
                events: libc::POLLIN,
                revents: 0,
            },
            libc::pollfd {
                fd: listener,
                events: libc::POLLIN,
                revents: 0,
            },
        ];
        // SAFETY: `fds` is a valid array of two pollfd for the call's duration.
        let rc = unsafe { libc::poll(fds.as_mut_ptr(), 2, -1) };
        if rc < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(End::Failed(format!("poll failed: {e}")));
        }
        let [conn, listen] = fds;
        if conn.revents != 0 {
            return Ok(());
        }
        if listen.revents != 0 {
            return Err(End::Closed);
        }
    }
}

/// Whether `fd` became readable within `timeout_ms` (a signal that interrupts the wait
/// waits again: the request in progress still finishes).
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
