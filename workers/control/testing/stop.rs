//! What the native workers' stop tests share (workers/php/tests/stop.rs,
//! workers/wsgi/tests/stop.rs include this file with `#[path]`; it is not a crate of its
//! own): how long a stop may take, whether a worker waits idle, and a SIGTERM timed.

use std::process::Child;
use std::time::{Duration, Instant};

/// Far under corral's kill_timeout; a stopped idle worker needs milliseconds.
pub const PROMPT: Duration = Duration::from_secs(2);

/// Whether `pid` is blocked in poll(2) (the waits poll: /proc/PID/syscall's first field).
pub fn in_poll(pid: u32) -> bool {
    let text = std::fs::read_to_string(format!("/proc/{pid}/syscall")).unwrap_or_default();
    let nr: i64 = text
        .split(' ')
        .next()
        .and_then(|n| n.parse().ok())
        .unwrap_or(-1);
    #[cfg(target_arch = "x86_64")]
    let poll = nr == libc::SYS_poll;
    #[cfg(not(target_arch = "x86_64"))]
    let poll = false;
    poll || nr == libc::SYS_ppoll
}

/// Sends SIGTERM; how long the worker took to exit, and its exit status.
pub fn stop(mut child: Child) -> (Duration, std::process::ExitStatus) {
    let at = Instant::now();
    // SAFETY: kill(2) on our own child, which has not been reaped.
    unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGTERM) };
    loop {
        if let Some(status) = child.try_wait().expect("wait") {
            return (at.elapsed(), status);
        }
        if at.elapsed() > PROMPT * 5 {
            let _ = child.kill();
            let _ = child.wait();
            return (at.elapsed(), std::process::ExitStatus::default());
        }
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// Waits (boundedly) until the worker is blocked in its wait.
pub fn until_idle(child: &Child) {
    let at = Instant::now();
    while !in_poll(child.id()) {
        assert!(
            at.elapsed() < Duration::from_secs(20),
            "the worker never waited idle"
        );
        std::thread::sleep(Duration::from_millis(2));
    }
}
