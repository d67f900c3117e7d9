//! The pool supervisor as a sans-IO state machine: events about one pool's workers go in,
//! actions for the driver come out, and time is passed in, so every policy can be tested with
//! an explicit clock and replayed from a seed.
//!
//! [`PoolState::on_event`] is the only entry point. The driver executes what it returns in
//! order: it spawns processes, turns slots on and off, signals, kills and reaps, and reports
//! back with events. The state machine never guesses: a worker is gone when the driver says it
//! exited, and whether that exit was expected is decided here (it is expected once we asked
//! the worker to stop).
//!
//! Bounds, stated once: `max` is [`config::Sizing::max`](crate::config::Sizing::max). Workers
//! that may take requests (starting, ready, or due for recycling and not yet replaced) never
//! number more than `max`; every worker not yet reaped, leaving ones included, never numbers
//! more than `max + 1`. The one extra is the replacement started before the worker it
//! replaces is retired, or a replacement for a worker that is still finishing its last
//! request; during a rolling restart with `max_surge` N above 1, up to N extra
//! (`rolling.rs`). No spawn is ever issued after `Stop`.

mod kernel;
mod machine;
mod pool_memory;
mod retire;
mod rolling;
mod sizing;
mod spec;
mod status;

#[cfg(test)]
mod next_tick_tests;
#[cfg(test)]
mod recycle_tests;
#[cfg(test)]
mod rolling_tests;
#[cfg(test)]
mod sim;
#[cfg(test)]
mod tests;

use std::fmt;
use std::time::Duration;

pub use machine::PoolState;
pub use spec::PoolSpec;
pub use status::{PoolCounters, PoolStatus, RecycleCounts, WorkerState, WorkerStatus};

/// Names one worker for the life of its process; allocated by [`PoolState`], never reused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct WorkerKey(pub u64);

impl fmt::Display for WorkerKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "worker {}", self.0)
    }
}

/// How a worker process ended (the same type the process module decodes exit statuses into).
pub use crate::process::ExitKind;

/// What the driver tells the state machine.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PoolEvent {
    /// The pool starts: spawn its initial workers.
    Start,
    /// Periodic check: timeouts, lifetimes, idle workers, backoff. Due again at
    /// [`PoolState::next_tick`]; the driver sends it 100 ms to 1 s apart.
    Tick,
    /// The process for `key` was started.
    Spawned {
        /// The worker.
        key: WorkerKey,
        /// Its process id (and process group).
        pid: u32,
    },
    /// The process for `key` could not be started; it counts as a crash.
    SpawnFailed {
        /// The worker.
        key: WorkerKey,
        /// Why, for the log.
        reason: String,
    },
    /// The worker's socket accepts connections.
    Ready {
        /// The worker.
        key: WorkerKey,
    },
    /// The process was reaped.
    Exited {
        /// The worker.
        key: WorkerKey,
        /// How it ended.
        status: ExitKind,
    },
    /// The slot table handed the worker a request.
    RequestStarted {
        /// The worker.
        key: WorkerKey,
    },
    /// A request on the worker ended (successfully or not, while the worker lives).
    RequestFinished {
        /// The worker.
        key: WorkerKey,
    },
    /// What the kernel shows of a direct pool's worker, whose requests corral never sees
    /// (`pool::direct`): it stands for the request events a gateway pool's slot table
    /// sends. Sets the worker's in-flight count to 1 (`busy`) or 0, and `ran` (the process
    /// was scheduled since the last look) restarts its idle time even if it is idle now.
    Seen {
        /// The worker.
        key: WorkerKey,
        /// Not blocked in accept(2): holding a connection, or between two.
        busy: bool,
        /// It ran since it was last seen.
        ran: bool,
    },
    /// Requests queued without a slot right now; send it whenever the number changes.
    Demand {
        /// Queue length.
        waiting: usize,
    },
    /// A memory sample (PSS of the worker's process tree).
    Memory {
        /// The worker.
        key: WorkerKey,
        /// Bytes.
        bytes: u64,
    },
    /// A memory sample of every worker of the pool (`max_pool_memory`): when their PSS
    /// sums to more than the budget, the one with the most private memory is replaced.
    PoolMemory {
        /// One sample per worker measured.
        workers: Vec<WorkerMemory>,
    },
    /// A child of a direct pool's php-cgi parent (`php_children`) was stopped by the driver
    /// and its parent forks another: the worker (the group) goes on; only counted
    /// (`pool::state::kernel`).
    ChildStopped {
        /// The worker whose child it was.
        key: WorkerKey,
        /// Why.
        reason: ChildStop,
    },
    /// A request on the worker exceeded `request_timeout`: kill the worker and replace it.
    RequestTimedOut {
        /// The worker.
        key: WorkerKey,
    },
    /// Stop the pool: drain and signal (`graceful`) or kill everything. A fast stop after a
    /// graceful one escalates it.
    Stop {
        /// Let workers finish their requests first.
        graceful: bool,
    },
    /// Replace every current worker, one at a time, each replacement ready before its
    /// predecessor is retired.
    RollingRestart,
    /// Replace these workers, one at a time, new before old, as a rolling restart does (a
    /// refork: the workers of older templates, once a promoted worker is the template).
    RollingRestartOf {
        /// The workers to replace; those no longer active are skipped.
        keys: Vec<WorkerKey>,
    },
    /// The worker's socket refused a connection (or could not be reached): it is dead or
    /// broken. The slot table already keeps requests off it; kill it (if it still runs) and
    /// replace it. Counts as a crash.
    Refused {
        /// The worker.
        key: WorkerKey,
    },
    /// A request on the worker missed its first-byte deadline or got bytes that break the
    /// protocol: the worker takes no new request and is recycled, replacement first.
    Suspect {
        /// The worker.
        key: WorkerKey,
    },
}

/// One worker's memory, as [`PoolEvent::PoolMemory`] reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WorkerMemory {
    /// The worker.
    pub key: WorkerKey,
    /// PSS of its process tree, in bytes: what the pool's total sums.
    pub pss: u64,
    /// Private memory (USS: `Private_Clean` + `Private_Dirty`) of its process tree, in
    /// bytes: what replacing it would give back.
    pub uss: u64,
}

/// Why the driver stopped one child of a direct pool's php-cgi parent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChildStop {
    /// Killed in a request past `request_timeout` (counted in `request_timeouts`).
    RequestTimeout,
    /// Over `max_memory` between two requests, sent SIGTERM (counted in
    /// `recycled.max_memory`).
    MaxMemory,
}

/// The polite stop request sent to a worker.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StopSignal {
    /// SIGTERM.
    Term,
}

/// What the driver must do, in the order given.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PoolAction {
    /// Start a worker process for this new key (and add it to the slot table, not
    /// accepting). Answer with `Spawned` or `SpawnFailed`.
    Spawn {
        /// The new worker.
        key: WorkerKey,
    },
    /// Let the slot table give the worker requests (`on`) or stop doing so.
    Accept {
        /// The worker.
        key: WorkerKey,
        /// Whether it takes new requests.
        on: bool,
    },
    /// Ask the worker to stop; it has no request in flight.
    Signal {
        /// The worker.
        key: WorkerKey,
        /// Its process (group).
        pid: u32,
        /// Which signal.
        signal: StopSignal,
    },
    /// SIGKILL the worker's process group.
    Kill {
        /// The worker.
        key: WorkerKey,
        /// Its process (group).
        pid: u32,
    },
    /// The worker is gone (reaped, or never started): remove it from the slot table.
    Forget {
        /// The worker.
        key: WorkerKey,
    },
    /// Something worth a log line.
    Notice(Notice),
    /// Every worker has been reaped after `Stop`; emitted once.
    Stopped,
}

/// How loud a [`Notice`] is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Severity {
    /// Normal lifecycle.
    Info,
    /// Something went wrong with one worker.
    Warn,
    /// The pool as a whole is in trouble.
    Error,
}

/// Why a worker was retired and replaced.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RecycleReason {
    /// It started its `max_requests` (+ jitter) requests.
    MaxRequests,
    /// Its memory exceeded `max_memory`.
    MaxMemory,
    /// The pool's memory exceeded `max_pool_memory`, and it held the most private memory.
    MaxPoolMemory,
    /// It lived `max_lifetime`.
    MaxLifetime,
    /// A rolling restart was asked for.
    Rolling,
    /// A request on it was reset or closed before an answer, missed its first-byte
    /// deadline, or got bytes that break the protocol.
    Suspect,
}

impl fmt::Display for RecycleReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            RecycleReason::MaxRequests => "it reached max_requests",
            RecycleReason::MaxMemory => "its memory exceeded max_memory",
            RecycleReason::MaxPoolMemory => {
                "the pool's memory (PSS summed over its workers) exceeded max_pool_memory and it \
                 held the most private memory"
            }
            RecycleReason::MaxLifetime => "it reached max_lifetime",
            RecycleReason::Rolling => "of a rolling restart",
            RecycleReason::Suspect => {
                "a request on it failed in a way that says it is broken (reset or closed \
                 before an answer, no first byte in time, or bytes that break the protocol)"
            }
        })
    }
}

/// Things the driver should log; `Display` gives the sentence.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Notice {
    /// A worker exited without being asked to.
    Crashed {
        /// The worker.
        key: WorkerKey,
        /// How it ended.
        status: ExitKind,
        /// Requests that were in flight on it (they fail).
        in_flight: usize,
    },
    /// A worker's process could not be started.
    SpawnFailed {
        /// The worker.
        key: WorkerKey,
        /// The driver's reason.
        reason: String,
    },
    /// A worker was not ready within `start_timeout` and was killed.
    StartTimedOut {
        /// The worker.
        key: WorkerKey,
        /// The timeout.
        after: Duration,
    },
    /// A worker ran a request past `request_timeout` and was killed, or, a group of
    /// children, retired (`PoolSpec::group_of_children`).
    RequestTimedOut {
        /// The worker.
        key: WorkerKey,
        /// Killed at once; else retired once its other requests are done.
        killed: bool,
    },
    /// A worker's socket refused a connection; it was killed (if it still ran) to be
    /// replaced.
    Refused {
        /// The worker.
        key: WorkerKey,
    },
    /// A worker did not exit within `kill_timeout` of its stop signal.
    KillTimedOut {
        /// The worker.
        key: WorkerKey,
        /// The timeout.
        after: Duration,
    },
    /// A worker is being recycled.
    Recycling {
        /// The worker.
        key: WorkerKey,
        /// Why.
        reason: RecycleReason,
    },
    /// Workers keep crashing: spawns are throttled to one per backoff delay.
    CrashLoop {
        /// Consecutive crashes so far.
        crashes: u32,
        /// The current delay between attempts.
        retry_in: Duration,
    },
    /// A worker served again after a crash loop: spawns are no longer throttled.
    CrashLoopOver,
    /// A rolling restart's replacement could not come up (it failed to spawn, exited or
    /// missed `start_timeout`): the restart stopped, and the workers it had not yet
    /// replaced serve on.
    RollingRestartStopped {
        /// The replacement that failed.
        key: WorkerKey,
        /// Workers left serving that the restart would have replaced.
        kept: usize,
    },
}

impl Notice {
    /// How loud the notice is.
    pub fn severity(&self) -> Severity {
        match self {
            Notice::Recycling { .. } | Notice::CrashLoopOver => Severity::Info,
            Notice::CrashLoop { .. } | Notice::RollingRestartStopped { .. } => Severity::Error,
            _ => Severity::Warn,
        }
    }
}

impl fmt::Display for Notice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Notice::Crashed {
                key,
                status,
                in_flight,
            } => write!(
                f,
                "{key} {status} unexpectedly with {in_flight} requests in flight"
            ),
            Notice::SpawnFailed { key, reason } => write!(f, "{key} could not start: {reason}"),
            Notice::StartTimedOut { key, after } => {
                write!(f, "{key} was not ready within {after:?} and was killed")
            }
            Notice::RequestTimedOut { key, killed: true } => {
                write!(f, "{key} exceeded request_timeout and was killed")
            }
            Notice::RequestTimedOut { key, killed: false } => write!(
                f,
                "{key} exceeded request_timeout: a group of php-cgi children, out of rotation \
                 and replaced; stopped once its other children's requests are done"
            ),
            Notice::Refused { key } => write!(
                f,
                "{key} refused a connection: out of rotation, killed and replaced"
            ),
            Notice::KillTimedOut { key, after } => {
                write!(f, "{key} did not stop within {after:?} and was killed")
            }
            Notice::Recycling { key, reason } => write!(f, "{key} is recycled because {reason}"),
            Notice::CrashLoop { crashes, retry_in } => write!(
                f,
                "workers crashed {crashes} times in a row: spawns are throttled to one every \
                 {retry_in:?}"
            ),
            Notice::CrashLoopOver => {
                f.write_str("a worker served again: spawns are no longer throttled")
            }
            Notice::RollingRestartStopped { key, kept } => write!(
                f,
                "rolling restart stopped: its replacement {key} could not come up; {kept} \
                 workers it had not replaced serve on"
            ),
        }
    }
}
