//! The fork template (`--preload`, corral's "Preload and fork" protocol): PHP is started once
//! (libphp loaded, php.ini read, every extension's MINIT, OPcache's shared memory mapped),
//! then every worker is forked from this process, as php-fpm's master forks its children.
//! The workers share the template's pages until they write them, and share one OPcache
//! segment (a spawned worker maps a segment of its own and compiles every script into it).
//!
//! fd 0 is a SOCK_SEQPACKET control socket to corral. The template says `ready PID` once PHP
//! is up; for each `fork KEY` (the worker's listening socket attached by SCM_RIGHTS) it forks
//! a worker, answers `forked KEY PID`, and reports `exited PID code N` / `exited PID signal N`
//! when it reaps one. It ends when corral closes the control socket, or on SIGTERM/SIGINT.
//! What corral sends is checked (length, words, one descriptor): anything else is logged and
//! its descriptors closed.
//!
//! SIGCHLD, SIGTERM and SIGINT are blocked except inside ppoll(2): a worker's exit or a stop
//! is never missed between the check and the wait, and no stop signal is pending in a worker
//! at its fork (the worker unblocks them, with its stop flag cleared).

use std::ffi::c_int;
use std::os::fd::RawFd;

/// Longest control message either way.
const MAX_CONTROL: usize = 256;
/// Most descriptors accepted with one message (all are closed unless exactly one came).
const MAX_FDS: usize = 4;
/// The signals held outside the wait.
const HELD: [c_int; 3] = [libc::SIGCHLD, libc::SIGTERM, libc::SIGINT];

/// What the caller of [`run`] is once it returns.
pub enum Role {
    /// The template, ending with this exit code.
    Template(i32),
    /// A freshly forked worker: its listening socket is fd 0, its signals are as a spawned
    /// worker's; it serves as one.
    Worker,
}

/// One message to corral; false when corral is gone.
fn send(control: RawFd, text: &str) -> bool {
    // SAFETY: `text` is valid for its length during the call.
    let n = unsafe {
        libc::send(
            control,
            text.as_ptr().cast(),
            text.len(),
            libc::MSG_NOSIGNAL,
        )
    };
    usize::try_from(n).is_ok_and(|n| n == text.len())
}

/// Changes the signal mask by `how` for `signals`; the mask before.
fn mask(how: c_int, signals: &[c_int]) -> libc::sigset_t {
    // SAFETY: both sets are zeroed, then filled by sigemptyset/sigaddset; sigprocmask gets
    // valid pointers.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        let mut old: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        for &s in signals {
            libc::sigaddset(&mut set, s);
        }
        libc::sigprocmask(how, &set, &mut old);
        old
    }
}

extern "C" fn on_child(_: c_int) {}

/// Sets SIGCHLD's disposition to `handler` (a function address, or SIG_DFL).
fn on_sigchld(handler: usize) {
    // SAFETY: the struct is zeroed, then filled; `on_child` does nothing (it only makes
    // ppoll return) and SIG_DFL is a valid disposition.
    unsafe {
        let mut action: libc::sigaction = std::mem::zeroed();
        action.sa_sigaction = handler;
        libc::sigemptyset(&mut action.sa_mask);
        libc::sigaction(libc::SIGCHLD, &action, std::ptr::null_mut());
    }
}

/// Runs the template on `control` (PHP started); returns in the template when it ends, and
/// in each forked worker right after its fork.
pub fn run(control: RawFd) -> Role {
    on_sigchld(on_child as extern "C" fn(c_int) as usize);
    let open = mask(libc::SIG_BLOCK, &HELD);
    // SAFETY: getpid cannot fail.
    let me = unsafe { libc::getpid() };
    if !send(control, &format!("ready {me}")) {
        crate::log("corral closed the control socket before PHP was ready");
        return Role::Template(1);
    }
    loop {
        if !reap(control) {
            return Role::Template(1);
        }
        if crate::stopping() {
            return Role::Template(0);
        }
        let mut pfd = libc::pollfd {
            fd: control,
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: `pfd` is valid for the call; `open` is the mask from before the block,
        // under which the held signals are delivered (and interrupt the wait).
        let rc = unsafe { libc::ppoll(&mut pfd, 1, std::ptr::null(), &open) };
        if rc <= 0 {
            continue;
        }
        match receive(control) {
            Received::Closed => {
                crate::log("corral closed the control socket; the fork template exits");
                return Role::Template(0);
            }
            Received::Ignored => {}
            Received::Fork(key, listener) => match fork(control, listener, &open) {
                Forked::Child => return Role::Worker,
                Forked::Failed => return Role::Template(1),
                Forked::Parent(pid) => {
                    if !send(control, &format!("forked {key} {pid}")) {
                        return Role::Template(1);
                    }
                }
            },
        }
    }
}

enum Received {
    Closed,
    Ignored,
    Fork(u64, RawFd),
}

/// Parses a control message's text: `fork KEY` gives KEY.
fn fork_key(text: &[u8]) -> Option<u64> {
    let rest = text.strip_prefix(b"fork ")?;
    if rest.is_empty() || rest.len() > 20 || !rest.iter().all(u8::is_ascii_digit) {
        return None;
    }
    std::str::from_utf8(rest).ok()?.parse().ok()
}

/// One control message: `fork KEY` with exactly one descriptor, or anything else (logged,
/// its descriptors closed).
fn receive(control: RawFd) -> Received {
    let mut buf = [0u8; MAX_CONTROL];
    // Room for MAX_FDS descriptors, aligned for cmsghdr (u64 words).
    let mut space = [0u64; 8];
    // SAFETY: CMSG_SPACE is a pure computation on a small constant.
    let want = unsafe { libc::CMSG_SPACE((MAX_FDS * std::mem::size_of::<c_int>()) as u32) };
    let room = (want as usize).min(std::mem::size_of_val(&space));
    let mut iov = libc::iovec {
        iov_base: buf.as_mut_ptr().cast(),
        iov_len: buf.len(),
    };
    // SAFETY: msghdr is zeroed, then pointed at `iov` and `space`, which outlive the call.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = space.as_mut_ptr().cast();
    msg.msg_controllen = room;
    // SAFETY: `msg` describes valid buffers for the call.
    let n = unsafe { libc::recvmsg(control, &mut msg, libc::MSG_CMSG_CLOEXEC) };
    if n == 0 {
        return Received::Closed;
    }
    let mut fds = Vec::new();
    if n > 0 {
        // SAFETY: the CMSG_* walk stays within the `msg_controllen` bytes the kernel filled;
        // each header's length is checked against the data it claims before reading.
        unsafe {
            let mut c = libc::CMSG_FIRSTHDR(&msg);
            while !c.is_null() {
                if (*c).cmsg_level == libc::SOL_SOCKET && (*c).cmsg_type == libc::SCM_RIGHTS {
                    let data = libc::CMSG_DATA(c).cast::<c_int>();
                    let len = ((*c).cmsg_len as usize).saturating_sub(libc::CMSG_LEN(0) as usize);
                    for i in 0..(len / std::mem::size_of::<c_int>()).min(MAX_FDS) {
                        fds.push(std::ptr::read_unaligned(data.add(i)));
                    }
                }
                c = libc::CMSG_NXTHDR(&msg, c);
            }
        }
    }
    let text = usize::try_from(n)
        .ok()
        .and_then(|n| buf.get(..n))
        .unwrap_or_default();
    let truncated = msg.msg_flags & (libc::MSG_TRUNC | libc::MSG_CTRUNC) != 0;
    match (fork_key(text).filter(|_| !truncated), fds.as_slice()) {
        (Some(key), [fd]) => Received::Fork(key, *fd),
        _ => {
            for fd in fds {
                // SAFETY: each fd was just received and is owned by nothing else.
                unsafe { libc::close(fd) };
            }
            crate::log(&format!(
                "ignoring a malformed control message ({} bytes{})",
                n.max(0),
                if truncated { ", cut short" } else { "" }
            ));
            Received::Ignored
        }
    }
}

enum Forked {
    Parent(libc::pid_t),
    Child,
    Failed,
}

/// Forks a worker serving `listener`.
fn fork(control: RawFd, listener: RawFd, open: &libc::sigset_t) -> Forked {
    // SAFETY: getpid cannot fail.
    let parent = unsafe { libc::getpid() };
    // SAFETY: this process has one thread (PHP is not thread-safe and runs here alone), so
    // the child is a whole copy; it only makes system calls before it serves.
    let pid = unsafe { libc::fork() };
    if pid < 0 {
        crate::log(&format!("fork failed: {}", std::io::Error::last_os_error()));
        // SAFETY: the fd was received for this fork and is owned by nothing else.
        unsafe { libc::close(listener) };
        return Forked::Failed;
    }
    if pid > 0 {
        // SAFETY: as above; the child has its own copy.
        unsafe { libc::close(listener) };
        return Forked::Parent(pid);
    }
    // The worker: its own session (corral signals the group and sums memory over it),
    // killed with the template, with the listening socket on fd 0 (in place of the control
    // socket) as a spawned worker has it.
    // SAFETY: plain system calls on this process's own state and descriptors.
    unsafe {
        libc::setsid();
        libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0, 0, 0);
        if libc::getppid() != parent {
            libc::_exit(1);
        }
        if libc::dup2(listener, crate::LISTENER) < 0 {
            libc::_exit(1);
        }
        libc::close(listener);
        if control != crate::LISTENER {
            libc::close(control);
        }
    }
    on_sigchld(libc::SIG_DFL);
    crate::reset_stop();
    // SAFETY: `open` is the mask the template had before it held its signals.
    unsafe { libc::sigprocmask(libc::SIG_SETMASK, open, std::ptr::null_mut()) };
    crate::log(&format!(
        "worker {} forked from preloader {parent}",
        std::process::id()
    ));
    Forked::Child
}

/// Reports every worker that ended; false when corral is gone.
fn reap(control: RawFd) -> bool {
    loop {
        let mut status: c_int = 0;
        // SAFETY: `status` is valid for the call.
        let pid = unsafe { libc::waitpid(-1, &mut status, libc::WNOHANG) };
        if pid <= 0 {
            return true;
        }
        let how = if libc::WIFSIGNALED(status) {
            format!("signal {}", libc::WTERMSIG(status))
        } else {
            format!("code {}", libc::WEXITSTATUS(status))
        };
        if !send(control, &format!("exited {pid} {how}")) {
            return false;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_fork_with_a_number_is_a_fork() {
        assert_eq!(fork_key(b"fork 7"), Some(7));
        assert_eq!(fork_key(b"fork 18446744073709551615"), Some(u64::MAX));
        for bad in [
            &b"fork"[..],
            b"fork ",
            b"fork -1",
            b"fork 7 ",
            b"fork +7",
            b"fork 18446744073709551616",
            b"fork 0000000000000000000007",
            b"ready 7",
            b"\xfffork 7",
        ] {
            assert_eq!(fork_key(bad), None, "{bad:?}");
        }
    }
}
