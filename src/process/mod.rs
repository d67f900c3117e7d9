//! Process plumbing for spawned workers, and the only place in corral that forks, signals or reads
//! `/proc` (ARCHITECTURE.md decision 21): [`spawn`] starts a worker with its socket (`worker_socket.rs`),
//! environment, user, limits and log pipes (`child.rs`: what runs between fork and exec); [`ready`] waits for it to listen; [`exit`] says how one ended;
//! [`memory`] measures a worker's process tree; [`signal_group`] stops one; [`own`] sets up
//! corral's own process (umask, inherited descriptors) before any of that, and [`rlimit`] raises
//! its file limit; [`users`] warns about the users pools run as. [`preload`] talks to a pool's preloader, which forks workers for
//! `preload = true` app pools (ARCHITECTURE.md, "Preload and fork").
//!
//! # No orphaned interpreters
//!
//! Every worker is a session and process-group leader (`setsid`), so [`signal_group`]
//! reaches whatever it forked, and it carries a parent-death signal, so it dies with corral even
//! when corral is killed with SIGKILL and cannot clean up: SIGKILL for every worker but a
//! `php_children` parent, which gets SIGTERM because php-cgi passes that to its process group and
//! so takes its children down with it (a SIGKILLed parent would leave them running).
//!
//! **Spawn from a long-lived thread.** Linux sends the parent-death signal when the
//! *thread* that forked the child exits, not when the process does. Call
//! [`spawn_worker`] from an async task on a tokio runtime worker thread (those live as long
//! as the runtime), or from a thread that lives as long as the worker; never from
//! `spawn_blocking`, whose pool threads exit after ten idle seconds and would take their
//! workers with them.

mod child;
pub mod exit;
pub mod memory;
pub mod output;
pub mod own;
pub mod php_children;
pub mod preload;
pub mod ready;
pub mod rlimit;
pub mod spawn;
pub mod stacks;
pub mod users;
mod worker_socket;

use std::io;

use nix::sys::signal::{killpg, Signal};
use nix::unistd::Pid;

pub use exit::ExitKind;
pub use memory::{memory_of, process_tree, process_tree_pss, MemoryUsage};
pub use ready::{wait_listening, wait_ready, ReadyError};
pub use spawn::{
    bind_worker_socket, spawn_direct_worker, spawn_preloader, spawn_worker, Handoff, Identity,
    SpawnedWorker, WorkerSocket, WorkerSpawn,
};

/// The signals corral stops workers with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StopSignal {
    /// SIGTERM: finish or abandon the current request and exit.
    Term,
    /// SIGKILL: after `kill_timeout`, or for a worker past `request_timeout`.
    Kill,
}

impl StopSignal {
    fn signal(self) -> Signal {
        match self {
            StopSignal::Term => Signal::SIGTERM,
            StopSignal::Kill => Signal::SIGKILL,
        }
    }
}

/// Sends `signal` to the process group of the worker whose pid is `pid` (its group id, see
/// [`spawn_worker`]). Returns `false` when the group no longer exists.
///
/// Pids 0 and 1 are refused: `killpg(0)` would signal corral's own group.
pub fn signal_group(pid: u32, signal: StopSignal) -> io::Result<bool> {
    let group = i32::try_from(pid).ok().filter(|&p| p > 1).ok_or_else(|| {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{pid} is not a worker's process group"),
        )
    })?;
    match killpg(Pid::from_raw(group), signal.signal()) {
        Ok(()) => Ok(true),
        Err(errno) if exit::is_gone(errno) => Ok(false),
        Err(errno) => Err(io::Error::from(errno)),
    }
}

/// The kernel's `PF_EXITING` task flag (`include/linux/sched.h`): set as a process starts to
/// exit, before its descriptors are closed.
const PF_EXITING: u64 = 0x4;

/// Whether the process `pid` is gone or on its way out: no `/proc/PID/stat`, a zombie, or
/// past the start of its exit (`PF_EXITING`). A worker killed with SIGKILL is flagged before
/// the kernel closes its sockets, so a peer that sees one of them closed or reset can tell
/// whether the process behind it died or only dropped that connection.
///
/// A pid that was reaped and reused reads as the new process, alive: callers ask only about
/// workers their pool has not yet seen end.
pub fn is_exiting(pid: u32) -> bool {
    read_says_exiting(std::fs::read_to_string(format!("/proc/{pid}/stat")))
}

/// [`is_exiting`] on the outcome of reading `/proc/PID/stat`. A process reaped before the
/// open leaves no file (`ENOENT`); one reaped between the open and the read fails the read
/// with `ESRCH` (the kernel's `proc_single_show` finds no task behind the pid), and both
/// mean gone. Anything else (a permission refused) says "not exiting": the caller keeps the
/// worker. A killed worker is reaped within microseconds of its sockets closing, so that
/// second window is met: reading it as alive sent a killed worker's request again.
fn read_says_exiting(read: io::Result<String>) -> bool {
    match read {
        Ok(stat) => stat_says_exiting(&stat),
        Err(e) => e.kind() == io::ErrorKind::NotFound || e.raw_os_error() == Some(libc::ESRCH),
    }
}

/// [`is_exiting`] on the text of `/proc/PID/stat`: after the command name (in parentheses,
/// and able to hold anything, so found from the last `)`), the state, then six fields on,
/// the flags. Text that does not parse says "not exiting": the caller then keeps the worker.
fn stat_says_exiting(stat: &str) -> bool {
    let Some((_, rest)) = stat.rsplit_once(')') else {
        return false;
    };
    let mut fields = rest.split_ascii_whitespace();
    let state = fields.next().unwrap_or("");
    if matches!(state, "Z" | "X" | "x") {
        return true;
    }
    // ppid, pgrp, session, tty_nr, tpgid, then flags.
    fields
        .nth(5)
        .and_then(|f| f.parse::<u64>().ok())
        .is_some_and(|flags| flags & PF_EXITING != 0)
}

#[cfg(test)]
mod exiting_tests {
    use super::*;

    #[test]
    fn the_stat_line_tells_a_running_process_from_a_dying_one() {
        let running = "42 (php-cgi) S 1 42 42 0 -1 4194560 1 0 0 0 0 0 0 0 20 0 1 0";
        assert!(!stat_says_exiting(running));
        // PF_EXITING (0x4) set in 4194564.
        let dying = "42 (a) b) R 1 42 42 0 -1 4194564 1 0 0 0 0 0 0 0 20 0 1 0";
        assert!(stat_says_exiting(dying));
        assert!(stat_says_exiting("42 (php-cgi) Z 1 42 42 0 -1 4194560"));
        assert!(!stat_says_exiting("garbage"));
        assert!(!stat_says_exiting("42 (x) S 1"));
    }

    #[test]
    fn a_process_reaped_before_or_during_the_read_is_gone() {
        let enoent = io::Error::from_raw_os_error(libc::ENOENT);
        assert!(read_says_exiting(Err(enoent)));
        let esrch = io::Error::from_raw_os_error(libc::ESRCH);
        assert!(read_says_exiting(Err(esrch)));
        let eacces = io::Error::from_raw_os_error(libc::EACCES);
        assert!(!read_says_exiting(Err(eacces)));
        assert!(!read_says_exiting(Ok(
            "42 (php-cgi) S 1 42 42 0 -1 4194560".into()
        )));
    }

    #[test]
    fn corral_itself_is_not_exiting_and_a_missing_pid_is() {
        assert!(!is_exiting(std::process::id()));
        // Above the kernel's pid_max ceiling (2^22): never a process.
        assert!(is_exiting(5_000_000));
    }
}
