//! A stop signal sent in the window between a wait's look at the stop flag and its system
//! call: on the waiting thread itself (the handler runs before the call, which then gets no
//! EINTR) and on another thread (the waiting one is never interrupted). Either way the
//! wait must end promptly with "stopping"; without the stop pipe it blocks for good.

use std::os::fd::AsRawFd;
use std::os::unix::net::{UnixListener, UnixStream};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{mpsc, Mutex};
use std::time::Duration;

use super::*;
use crate::stop;

/// The stop flag is the process's: one case at a time.
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());
/// The thread the "other thread" cases signal (the test's own, waiting for the result).
static OTHER: AtomicU64 = AtomicU64::new(0);

/// How long a stopped wait may take to return: far more than it needs, far less than the
/// forever it takes without the fix.
const PROMPT: Duration = Duration::from_secs(2);

/// The signal lands on the waiting thread, right before its wait's system call.
fn signal_this_thread() {
    // SAFETY: raise(3) with a signal whose handler is installed.
    unsafe { libc::raise(libc::SIGTERM) };
}

/// The signal lands on another thread of the process, right before the wait.
fn signal_other_thread() {
    // SAFETY: OTHER holds a live thread's id: the test thread, which waits for this one.
    unsafe {
        libc::pthread_kill(
            OTHER.load(Ordering::SeqCst) as libc::pthread_t,
            libc::SIGINT,
        )
    };
}

/// Runs `wait` on a thread where `hook` runs right before the wait blocks; what `wait`
/// returned, or None when it did not return within PROMPT.
fn within_prompt<T: Send + 'static>(
    hook: fn(),
    wait: impl FnOnce() -> T + Send + 'static,
) -> Option<T> {
    stop::catch_stop_signals().expect("stop signals caught");
    stop::reset_stop().expect("a fresh stop pipe");
    // SAFETY: pthread_self cannot fail.
    OTHER.store(unsafe { libc::pthread_self() } as u64, Ordering::SeqCst);
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        hook::BEFORE_WAIT.with(|h| h.set(Some(hook)));
        let _ = tx.send(wait());
    });
    // A signal on this thread interrupts nothing here: the receive waits again.
    rx.recv_timeout(PROMPT).ok()
}

fn listener(name: &str) -> (UnixListener, std::path::PathBuf) {
    let dir = std::env::temp_dir().join(format!("corral-stop-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("temp dir");
    let path = dir.join("s");
    let l = UnixListener::bind(&path).expect("bind");
    listen_nonblocking(l.as_raw_fd()).expect("non-blocking");
    (l, dir)
}

#[test]
fn a_stop_just_before_accept_waits_ends_it() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    for (name, hook) in [
        ("this", signal_this_thread as fn()),
        ("other", signal_other_thread),
    ] {
        let (l, dir) = listener(&format!("accept-{name}"));
        let fd = l.as_raw_fd();
        let got = within_prompt(hook, move || accept(fd).map(|c| c.is_some()).ok());
        assert_eq!(
            got,
            Some(Some(false)),
            "signal on {name} thread: accept did not end with no connection"
        );
        assert!(stop::stopping());
        std::fs::remove_dir_all(dir).ok();
    }
}

#[test]
fn a_stop_just_before_the_wait_between_requests_ends_it() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    for (name, hook) in [
        ("this", signal_this_thread as fn()),
        ("other", signal_other_thread),
    ] {
        let (l, dir) = listener(&format!("idle-{name}"));
        let (ours, theirs) = UnixStream::pair().expect("pair");
        let (conn, fd) = (ours.as_raw_fd(), l.as_raw_fd());
        let got = within_prompt(hook, move || {
            matches!(wait_idle(conn, fd, stop::stopping), Err(End::Stopping))
        });
        assert_eq!(
            got,
            Some(true),
            "signal on {name} thread: the wait did not end with a stop"
        );
        drop((ours, theirs, l));
        std::fs::remove_dir_all(dir).ok();
    }
}

#[test]
fn a_reset_forgets_the_stop_and_its_byte() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    stop::catch_stop_signals().expect("stop signals caught");
    stop::reset_stop().expect("a fresh stop pipe");
    signal_this_thread();
    assert!(stop::stopping());
    let old = stop::wake_fd();
    assert_eq!(readable(old), 1, "the stop wrote its byte");
    stop::reset_stop().expect("a fresh stop pipe");
    assert!(!stop::stopping());
    assert_eq!(readable(stop::wake_fd()), 0, "the new pipe is empty");
    // A request waiting on its connection is still served: the pipe holds no stale byte.
    let (ours, mut theirs) = UnixStream::pair().expect("pair");
    std::io::Write::write_all(&mut theirs, b"x").expect("write");
    assert!(wait_idle(ours.as_raw_fd(), -1, stop::stopping).is_ok());
}

/// How many of `fd`'s bytes poll(2) says are there: 1 when readable, 0 when not.
fn readable(fd: RawFd) -> i32 {
    let mut p = pollin(fd);
    // SAFETY: `p` is a valid pollfd for the call.
    unsafe { libc::poll(&mut p, 1, 0) }
}
