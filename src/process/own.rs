//! corral's own process, set up once before it creates anything: a private umask, and
//! close-on-exec on every descriptor it inherited, so that no worker is handed a file its
//! command line did not ask for.

use std::io;
use std::os::fd::{BorrowedFd, RawFd};

use nix::fcntl::{fcntl, FcntlArg, FdFlag};
use nix::sys::stat::{umask, Mode};

/// The umask corral runs with: nothing it creates is readable or writable by others unless
/// given a mode explicitly (front sockets their `mode`, launchers 0644, the runtime
/// directory 0700 or 0711), whatever umask it was started with.
pub const UMASK: u32 = 0o077;

/// Sets [`UMASK`] for the whole process.
pub fn restrict_umask() {
    umask(Mode::from_bits_truncate(UMASK));
}

/// Runs `f` (one system call that creates a file, such as a Unix socket's `bind`) with the
/// umask `mask`, and puts the previous umask back: a socket gets its mode as it is made
/// instead of from a `chmod` by path afterwards, which a symbolic link swapped in at that
/// path would redirect. The umask is the process's, so callers are serialised by a lock;
/// another thread creating a file meanwhile gets `mask` too, which is why everything
/// corral creates elsewhere is given its mode explicitly (module documentation).
pub fn with_umask<T>(mask: u32, f: impl FnOnce() -> T) -> T {
    static LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _held = LOCK
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let before = umask(Mode::from_bits_truncate(mask & 0o777));
    let out = f();
    umask(before);
    out
}

/// Marks close-on-exec every descriptor above 2 that is open now; returns how many lacked
/// the flag. Call it while the process has one thread, before the runtime starts.
///
/// Everything corral opens itself carries the flag (the standard library and tokio open
/// with `O_CLOEXEC`), but descriptors inherited from whoever started corral (a shell's
/// `exec 5<file`, a supervisor's leaked pipe, a socket-activation fd nobody claimed) do
/// not, and would otherwise pass through into every worker, which only fd 0, 1 and 2 (and
/// fd 3 for the systemd handoff, set up in the child) are meant to reach.
pub fn cloexec_inherited() -> io::Result<usize> {
    let fds: Vec<RawFd> = std::fs::read_dir("/proc/self/fd")?
        .filter_map(|entry| entry.ok()?.file_name().to_str()?.parse().ok())
        .filter(|fd| *fd > 2)
        .collect();
    let mut marked = 0;
    for fd in fds {
        // SAFETY: `fd` was listed as open in /proc/self/fd a moment ago and corral has a
        // single thread at this point, so nothing closes or reuses it while it is borrowed
        // for these two fcntl calls. The one descriptor that is gone by now (the directory
        // read above, closed when the iterator ended) only makes fcntl fail with EBADF,
        // which is skipped; no Rust object owns any of these descriptors' state.
        let borrowed = unsafe { BorrowedFd::borrow_raw(fd) };
        let Ok(bits) = fcntl(borrowed, FcntlArg::F_GETFD) else {
            continue;
        };
        let flags = FdFlag::from_bits_truncate(bits);
        if !flags.contains(FdFlag::FD_CLOEXEC) {
            fcntl(borrowed, FcntlArg::F_SETFD(flags | FdFlag::FD_CLOEXEC))?;
            marked += 1;
        }
    }
    Ok(marked)
}
