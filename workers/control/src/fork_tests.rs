//! A worker forked from the template, its descriptors where the PHP worker has them: the
//! template's control socket on fd 0 (`corral-php-worker --preload`), and the worker's
//! listener moved onto fd 0 once forked (workers/php/src/preload.rs). A stop signal must
//! still make the worker's stop pipe readable. When the worker's new pipe took fd 0 (freed
//! by the control socket's close), that move closed its read end: the waits then polled the
//! listener twice, and a SIGTERM landing between the flag's check and the wait was lost
//! (tests/native_stop.rs, a preloaded worker left running after its restart).

use super::*;

/// What the forked worker's exit code says.
const STOP_SEEN: i32 = 0;
const STOP_LOST: i32 = 3;

fn quiet(_: &str) {}

fn real_fork() -> i64 {
    // SAFETY: the template case runs in a child of the test with one thread.
    unsafe { libc::fork() }.into()
}

const HOST: Host = Host {
    loaded: "nothing",
    name: "the test's template",
    log: quiet,
    stopping: stop::stopping,
    reset_stop: stop::reset_stop,
    fork: real_fork,
};

/// How `pid` ended: its exit code, or -signal.
fn ended(pid: libc::pid_t) -> i32 {
    let mut status: c_int = 0;
    // SAFETY: `status` is valid for the call; `pid` is this process's child.
    if unsafe { libc::waitpid(pid, &mut status, 0) } != pid {
        return -1000;
    }
    if libc::WIFEXITED(status) {
        libc::WEXITSTATUS(status)
    } else {
        -libc::WTERMSIG(status)
    }
}

/// A connected pair of `kind` sockets.
fn socket_pair(kind: c_int) -> Option<(RawFd, RawFd)> {
    let mut fds = [-1 as c_int; 2];
    // SAFETY: `fds` has room for the two descriptors.
    let rc = unsafe { libc::socketpair(libc::AF_UNIX, kind, 0, fds.as_mut_ptr()) };
    (rc == 0).then_some((fds[0], fds[1]))
}

/// In the forked worker: the listener moved onto fd 0, then a SIGTERM to itself, which
/// must leave the pipe its waits poll readable.
fn worker_case(listener: RawFd) -> i32 {
    // SAFETY: dup2, close and raise on this process's own descriptors and signals.
    unsafe {
        if libc::dup2(listener, 0) < 0 {
            return 20;
        }
        libc::close(listener);
        libc::raise(libc::SIGTERM);
    }
    if !stop::stopping() {
        return 21;
    }
    let mut pfd = libc::pollfd {
        fd: stop::wake_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: `pfd` is valid for the call; no wait (timeout 0).
    let rc = unsafe { libc::poll(&mut pfd, 1, 0) };
    if rc == 1 && pfd.revents & libc::POLLIN != 0 {
        STOP_SEEN
    } else {
        STOP_LOST
    }
}

/// In the template (a child of the test, so that fd 0 and the signals are its own): the
/// control socket on fd 0, a listener nothing connects to (never readable); forks one
/// worker through [`fork`] and returns how it ended.
fn template_case() -> i32 {
    let (Some((_corral, control)), Some((listener, _peer))) = (
        socket_pair(libc::SOCK_SEQPACKET),
        socket_pair(libc::SOCK_STREAM),
    ) else {
        return 10;
    };
    // SAFETY: dup2 and close on descriptors this process owns.
    unsafe {
        if libc::dup2(control, 0) < 0 {
            return 11;
        }
        libc::close(control);
    }
    if stop::catch_stop_signals().is_err() {
        return 12;
    }
    let open = mask(libc::SIG_BLOCK, &HELD);
    match fork(&HOST, 0, listener, &open) {
        // SAFETY: ends the forked worker without the test harness's exit code.
        Forked::Child => unsafe { libc::_exit(worker_case(listener)) },
        Forked::Parent(pid) => ended(pid as libc::pid_t),
        Forked::Failed => 13,
    }
}

#[test]
fn a_worker_that_moves_its_listener_to_fd_0_still_wakes_on_a_stop() {
    // SAFETY: the child only runs `template_case` and exits.
    let template = unsafe { libc::fork() };
    assert!(template >= 0, "{}", std::io::Error::last_os_error());
    if template == 0 {
        // SAFETY: ends the child without the test harness's exit code.
        unsafe { libc::_exit(template_case()) };
    }
    let code = ended(template);
    assert_ne!(
        code, STOP_LOST,
        "the forked worker's stop pipe stayed unreadable after its SIGTERM"
    );
    assert_eq!(code, STOP_SEEN, "the case failed to run (code {code})");
}
