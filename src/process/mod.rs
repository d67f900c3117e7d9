//! Process plumbing for spawned workers, and the only place in corral that forks, signals or reads
//! `/proc` (ARCHITECTURE.md decision 21): [`spawn`] starts a worker with its socket, environment,
//! user, limits and log pipes; [`ready`] waits for it to listen; [`exit`] says how one ended;
//! [`memory`] measures a worker's process tree; [`signal_group`] stops one; [`own`] sets up
//! corral's own process (umask, inherited descriptors) before any of that, and [`rlimit`] raises
//! its file limit. [`preload`] talks to a pool's preloader, which forks workers for
//! `preload = true` app pools (ARCHITECTURE.md, "Preload and fork").
//!
//! # No orphaned interpreters
//!
//! Every worker is a session and process-group leader (`setsid`), so [`signal_group`]
//! reaches whatever it forked, and it carries `PR_SET_PDEATHSIG(SIGKILL)`, so it dies with
//! corral even when corral is killed with SIGKILL and cannot clean up.
//!
//! **Spawn from a long-lived thread.** Linux sends the parent-death signal when the
//! *thread* that forked the child exits, not when the process does. Call
//! [`spawn_worker`] from an async task on a tokio runtime worker thread (those live as long
//! as the runtime), or from a thread that lives as long as the worker; never from
//! `spawn_blocking`, whose pool threads exit after ten idle seconds and would take their
//! workers with them.

pub mod exit;
pub mod memory;
mod output;
pub mod own;
pub mod php_children;
pub mod preload;
pub mod ready;
pub mod rlimit;
pub mod spawn;

use std::io;

use nix::sys::signal::{killpg, Signal};
use nix::unistd::Pid;

pub use exit::ExitKind;
pub use memory::{memory_of, process_tree, process_tree_pss, MemoryUsage};
pub use ready::{wait_listening, wait_ready, ReadyError};
pub use spawn::{
    bind_worker_socket, spawn_preloader, spawn_worker, Handoff, Identity, SpawnedWorker,
    WorkerSocket, WorkerSpawn,
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
