//! Preload and fork, corral's control protocol as the pure-Python launcher speaks it
//! (ARCHITECTURE.md, "Preload and fork"): fd 0 is a SOCK_SEQPACKET control socket to corral;
//! the app is loaded once, the collector's objects frozen, and the preloader says
//! `ready PID`. For each `fork KEY` (the worker's listening socket attached by SCM_RIGHTS) it
//! forks a worker that serves that socket as a spawned worker does, answering
//! `forked KEY PID`; it reaps its workers and reports `exited PID code N` or
//! `exited PID signal N`. It exits when corral closes the control socket, or on SIGTERM.
//!
//! SIGCHLD, SIGTERM and SIGINT are blocked in the preloader except inside ppoll(2), so a
//! child's exit or a stop is never missed between a check and the wait, and a stop signal
//! is never pending in a worker at its fork.

use std::ffi::c_int;
use std::os::fd::RawFd;

/// Longest control message either way.
const MAX_CONTROL: usize = 256;
/// Most descriptors accepted with one message (all but one are closed).
const MAX_FDS: usize = 4;

extern "C" {
    fn cw_fork() -> libc::c_long;
    fn cw_freeze();
}

/// Sends one control message; false when corral is gone.
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
    n == text.len() as isize
}

fn mask(how: c_int, signals: &[c_int]) -> libc::sigset_t {
    // SAFETY: the sets are zeroed, then filled by sigemptyset/sigaddset; sigprocmask gets
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

const HELD: [c_int; 3] = [libc::SIGCHLD, libc::SIGTERM, libc::SIGINT];

extern "C" fn on_child(_: c_int) {}

/// Runs the preloader on `control` once the app is loaded; the exit code.
pub fn run(control: RawFd) -> i32 {
    // SAFETY: `on_child` does nothing (it only makes ppoll return); the struct is zeroed,
    // then filled.
    unsafe {
        let mut action: libc::sigaction = std::mem::zeroed();
        action.sa_sigaction = on_child as extern "C" fn(c_int) as usize;
        libc::sigemptyset(&mut action.sa_mask);
        libc::sigaction(libc::SIGCHLD, &action, std::ptr::null_mut());
    }
    let open = mask(libc::SIG_BLOCK, &HELD);
    // SAFETY: plain calls into python.c with the GIL held.
    unsafe { cw_freeze() };
    // SAFETY: getpid cannot fail.
    let me = unsafe { libc::getpid() };
    if !send(control, &format!("ready {me}")) {
        crate::log("corral closed the control socket before the app was ready");
        return 1;
    }
    loop {
        if !reap(control) {
            return 1;
        }
        if crate::stopping() {
            return 0;
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
                crate::log("corral closed the control socket; the preloader exits");
                return 0;
            }
            Received::Ignored => {}
            Received::Fork(key, listener) => {
                let Some(pid) = fork(control, listener, &open) else {
                    return 1;
                };
                if !send(control, &format!("forked {key} {pid}")) {
                    return 1;
                }
            }
        }
    }
}

enum Received {
    Closed,
    Ignored,
    Fork(u64, RawFd),
}

/// One control message: `fork KEY` with one descriptor, or anything else (logged, its
/// descriptors closed).
fn receive(control: RawFd) -> Received {
    let mut buf = [0u8; MAX_CONTROL];
    // SAFETY: CMSG_SPACE is a pure computation on a small constant.
    let space = unsafe { libc::CMSG_SPACE((MAX_FDS * std::mem::size_of::<c_int>()) as u32) };
    let mut cmsg = vec![0u8; space as usize];
    let mut iov = libc::iovec {
        iov_base: buf.as_mut_ptr().cast(),
        iov_len: buf.len(),
    };
    // SAFETY: msghdr is zeroed, then pointed at `iov` and `cmsg`, which outlive the call.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = cmsg.as_mut_ptr().cast();
    msg.msg_controllen = cmsg.len();
    // SAFETY: `msg` describes valid buffers for the call.
    let n = unsafe { libc::recvmsg(control, &mut msg, libc::MSG_CMSG_CLOEXEC) };
    if n == 0 {
        return Received::Closed;
    }
    let mut fds = Vec::new();
    // SAFETY: the CMSG_* walk stays within `msg_controllen` bytes the kernel filled.
    unsafe {
        let mut c = libc::CMSG_FIRSTHDR(&msg);
        while !c.is_null() {
            if (*c).cmsg_level == libc::SOL_SOCKET && (*c).cmsg_type == libc::SCM_RIGHTS {
                let data = libc::CMSG_DATA(c).cast::<c_int>();
                let len = (*c).cmsg_len as usize - libc::CMSG_LEN(0) as usize;
                for i in 0..len / std::mem::size_of::<c_int>() {
                    fds.push(std::ptr::read_unaligned(data.add(i)));
                }
            }
            c = libc::CMSG_NXTHDR(&msg, c);
        }
    }
    let text = usize::try_from(n)
        .ok()
        .and_then(|n| buf.get(..n))
        .and_then(|b| std::str::from_utf8(b).ok())
        .unwrap_or("");
    let key = match text.split(' ').collect::<Vec<_>>().as_slice() {
        ["fork", key] => key.parse::<u64>().ok(),
        _ => None,
    };
    match (key, fds.as_slice()) {
        (Some(key), [fd]) => Received::Fork(key, *fd),
        _ => {
            for fd in fds {
                // SAFETY: each fd was just received and is owned by nothing else.
                unsafe { libc::close(fd) };
            }
            crate::log(&format!(
                "ignoring a malformed control message ({} bytes{})",
                n.max(0),
                if msg.msg_flags & libc::MSG_CTRUNC != 0 {
                    ", descriptors cut"
                } else {
                    ""
                }
            ));
            Received::Ignored
        }
    }
}

/// Forks a worker serving `listener`; its pid (in the preloader), or `None` if fork failed.
/// The child never returns.
fn fork(control: RawFd, listener: RawFd, open: &libc::sigset_t) -> Option<i64> {
    // SAFETY: getpid cannot fail.
    let parent = unsafe { libc::getpid() };
    // SAFETY: python.c forks the way os.fork does (the interpreter's fork hooks run).
    let pid = unsafe { cw_fork() };
    if pid < 0 {
        crate::log(&format!("fork failed: {}", std::io::Error::last_os_error()));
        // SAFETY: the fd was received for this fork and is owned by nothing else.
        unsafe { libc::close(listener) };
        return None;
    }
    if pid > 0 {
        // SAFETY: as above; the child has its own copy.
        unsafe { libc::close(listener) };
        return Some(pid);
    }
    // The worker: its own session (corral signals the group and sums memory over it), killed
    // with the preloader, never back in the preloader's loop.
    // SAFETY: plain system calls on this process's own state and descriptors.
    unsafe {
        libc::setsid();
        libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0, 0, 0);
        if libc::getppid() != parent {
            libc::_exit(1);
        }
        libc::close(control);
        let mut default: libc::sigaction = std::mem::zeroed();
        default.sa_sigaction = libc::SIG_DFL;
        libc::sigaction(libc::SIGCHLD, &default, std::ptr::null_mut());
        libc::sigprocmask(libc::SIG_SETMASK, open, std::ptr::null_mut());
    }
    crate::reset_stop();
    crate::log(&format!(
        "worker {} forked from preloader {parent}",
        std::process::id()
    ));
    let code = crate::serve(listener);
    // SAFETY: _exit ends the worker without the preloader's exit handlers.
    unsafe { libc::_exit(code) }
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
