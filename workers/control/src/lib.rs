//! The worker side of corral's preload-and-fork control protocol (ARCHITECTURE.md, "Preload
//! and fork"), shared by the native PHP worker (workers/php) and the native WSGI worker
//! (workers/wsgi). The runtime is started once in a fork template; every worker is forked
//! from it.
//!
//! The control socket is a SOCK_SEQPACKET socket to corral. The template says `ready PID`
//! once its runtime is up; for each `fork KEY` (the worker's listening socket attached by
//! SCM_RIGHTS) it forks a worker, answers `forked KEY PID`, and reports
//! `exited PID code N` / `exited PID signal N` when it reaps one. It ends when corral closes
//! the control socket, or on a stop signal. What corral sends is checked (length, words, one
//! descriptor): anything else is logged and its descriptors closed.
//!
//! SIGCHLD, SIGTERM and SIGINT are blocked except inside ppoll(2): a worker's exit or a stop
//! is never missed between the check and the wait, and no stop signal is pending in a worker
//! at its fork (the worker unblocks them, with its stop flag cleared and a stop pipe of its
//! own: [`stop`]). Holding signals suits the template, which runs no script between its
//! waits; the workers wake on a pipe instead.
//!
//! The crate depends on libc alone; corral's own side of the protocol (src/process/preload.rs)
//! is async and does not use it. [`conn`] holds the waits on corral's connections that both
//! workers make alike (accept, the wait between requests, the bounded wait for a byte), and
//! [`stop`] the stop flag SIGTERM and SIGINT set in both, with the pipe that ends the waits.

pub mod conn;
pub mod stop;

use std::ffi::c_int;
use std::os::fd::RawFd;

/// Longest control message either way.
pub const MAX_CONTROL: usize = 256;
/// Most descriptors accepted with one message (all are closed unless exactly one came).
pub const MAX_FDS: usize = 4;
/// The signals held outside the wait.
const HELD: [c_int; 3] = [libc::SIGCHLD, libc::SIGTERM, libc::SIGINT];

/// What the template needs of the worker it runs in.
#[derive(Clone, Copy)]
pub struct Host {
    /// What must be up before `ready` is said, for log lines ("PHP", "the app").
    pub loaded: &'static str,
    /// What the template is called in log lines ("the fork template", "the preloader").
    pub name: &'static str,
    /// One line on the worker's stderr.
    pub log: fn(&str),
    /// Whether a stop signal came.
    pub stopping: fn() -> bool,
    /// Forgets a stop signal and makes the process its own stop pipe (in a freshly forked
    /// worker; see [`stop::reset_stop`]).
    pub reset_stop: fn() -> std::io::Result<()>,
    /// fork(2) as the runtime needs it done (an interpreter may run hooks around it): the
    /// child's pid in the template, 0 in the child, negative (errno set) when it failed.
    pub fork: fn() -> i64,
}

/// What the caller of [`run`] is once it returns.
pub enum Role {
    /// The template, ending with this exit code.
    Template(i32),
    /// A freshly forked worker: its own session, the control socket closed, its signals
    /// as a spawned worker's; it serves the listening socket given (which the caller may
    /// move where it serves from).
    Worker(RawFd),
}

/// Runs the template on `control` (the runtime started); returns in the template when it
/// ends, and in each forked worker right after its fork.
pub fn run(control: RawFd, host: &Host) -> Role {
    on_sigchld(on_child as extern "C" fn(c_int) as usize);
    let open = mask(libc::SIG_BLOCK, &HELD);
    // SAFETY: getpid cannot fail.
    let me = unsafe { libc::getpid() };
    if !send(control, &format!("ready {me}")) {
        (host.log)(&format!(
            "corral closed the control socket before {} was ready",
            host.loaded
        ));
        return Role::Template(1);
    }
    loop {
        if !reap(control) {
            return Role::Template(1);
        }
        if (host.stopping)() {
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
                (host.log)(&format!(
                    "corral closed the control socket; {} exits",
                    host.name
                ));
                return Role::Template(0);
            }
            Received::Malformed { bytes, truncated } => (host.log)(&format!(
                "ignoring a malformed control message ({bytes} bytes{})",
                if truncated { ", cut short" } else { "" }
            )),
            Received::Fork(key, listener) => match fork(host, control, listener, &open) {
                Forked::Child => return Role::Worker(listener),
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

/// One message read from the control socket.
#[derive(Debug, PartialEq, Eq)]
enum Received {
    /// corral closed the socket.
    Closed,
    /// Anything but `fork KEY` with one descriptor (its descriptors closed already).
    Malformed { bytes: usize, truncated: bool },
    /// `fork KEY` and the listening socket that came with it.
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

/// One control message: `fork KEY` with exactly one descriptor, or anything else (its
/// descriptors closed).
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
            Received::Malformed {
                bytes: usize::try_from(n).unwrap_or(0),
                truncated,
            }
        }
    }
}

enum Forked {
    Parent(i64),
    Child,
    Failed,
}

/// Forks a worker serving `listener`.
fn fork(host: &Host, control: RawFd, listener: RawFd, open: &libc::sigset_t) -> Forked {
    // SAFETY: getpid cannot fail.
    let parent = unsafe { libc::getpid() };
    let pid = (host.fork)();
    if pid < 0 {
        (host.log)(&format!("fork failed: {}", std::io::Error::last_os_error()));
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
    // killed with the template, never back in the template's loop.
    // SAFETY: plain system calls on this process's own state and descriptors.
    unsafe {
        libc::setsid();
        libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0, 0, 0);
        if libc::getppid() != parent {
            libc::_exit(1);
        }
        libc::close(control);
    }
    on_sigchld(libc::SIG_DFL);
    // Still with the stop signals held: one sent to this worker from here on reaches its
    // own stop pipe.
    if let Err(e) = (host.reset_stop)() {
        (host.log)(&format!("worker cannot make its stop pipe: {e}"));
        // SAFETY: ends this freshly forked process without running the template's exit code.
        unsafe { libc::_exit(1) };
    }
    // SAFETY: `open` is the mask the template had before it held its signals.
    unsafe { libc::sigprocmask(libc::SIG_SETMASK, open, std::ptr::null_mut()) };
    (host.log)(&format!(
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
mod fork_tests;
#[cfg(test)]
mod tests;
