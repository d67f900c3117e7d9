//! Read-only views of a pool's supervisor for the status page: one row per worker and the
//! pool's counters.

use std::time::Duration;

use super::machine::{Phase, PoolState};
use super::{RecycleReason, WorkerKey};

/// Where a worker is, as the status page shows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WorkerState {
    /// Spawn asked for, no pid yet.
    Starting,
    /// Running, not yet accepting connections.
    Booting,
    /// Ready with nothing in flight.
    Idle,
    /// Ready with requests in flight.
    Busy,
    /// Due for recycling: serves until its replacement is ready.
    Draining,
    /// Takes no new request; stopped once its last one finishes.
    Retiring,
    /// Sent its stop signal.
    Stopping,
    /// Sent SIGKILL.
    Killed,
}

/// One worker's row.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkerStatus {
    /// The worker.
    pub key: WorkerKey,
    /// Its process, once known.
    pub pid: Option<u32>,
    /// Where it is.
    pub state: WorkerState,
    /// Whether the slot table may give it requests.
    pub accepting: bool,
    /// Requests finished.
    pub served: u64,
    /// Requests in flight.
    pub in_flight: usize,
    /// Time since its spawn.
    pub age: Duration,
    /// Last memory sample, in bytes.
    pub memory: Option<u64>,
    /// Why it is being recycled, if it is.
    pub recycle: Option<RecycleReason>,
    /// The worker started to replace it, while that one is not yet ready.
    pub replacement: Option<WorkerKey>,
    /// Its child processes (a php-cgi parent's children under `php_children`), filled in
    /// from /proc when the status is collected; the machine does not track them.
    pub children: Vec<u32>,
}

/// Recycles by reason.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RecycleCounts {
    /// `max_requests` reached.
    pub max_requests: u64,
    /// `max_memory` exceeded.
    pub max_memory: u64,
    /// Replaced as the largest worker of a pool over `max_pool_memory`.
    pub max_pool_memory: u64,
    /// `max_lifetime` reached.
    pub max_lifetime: u64,
    /// Rolling restarts.
    pub rolling: u64,
    /// Workers that missed a first-byte deadline or broke the protocol.
    pub suspect: u64,
}

impl RecycleCounts {
    pub(super) fn add(&mut self, reason: RecycleReason) {
        let c = match reason {
            RecycleReason::MaxRequests => &mut self.max_requests,
            RecycleReason::MaxMemory => &mut self.max_memory,
            RecycleReason::MaxPoolMemory => &mut self.max_pool_memory,
            RecycleReason::MaxLifetime => &mut self.max_lifetime,
            RecycleReason::Rolling => &mut self.rolling,
            RecycleReason::Suspect => &mut self.suspect,
        };
        *c += 1;
    }

    /// All recycles.
    pub fn total(&self) -> u64 {
        self.max_requests
            + self.max_memory
            + self.max_pool_memory
            + self.max_lifetime
            + self.rolling
            + self.suspect
    }
}

/// Lifetime counters of a pool.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PoolCounters {
    /// Spawns issued.
    pub spawned: u64,
    /// Workers that became ready (accepted a connection on their socket).
    pub ready: u64,
    /// Spawns that failed to start a process.
    pub spawn_failed: u64,
    /// Workers reaped.
    pub exited: u64,
    /// Workers that exited without being asked to (crash backoff applies).
    pub crashed: u64,
    /// Workers that exited on their own with code 0 after serving (no backoff).
    pub exited_on_own: u64,
    /// Workers killed for not being ready within `start_timeout`.
    pub start_timeouts: u64,
    /// Workers killed for a request past `request_timeout`.
    pub request_timeouts: u64,
    /// Workers killed for not exiting within `kill_timeout` of their stop signal.
    pub kill_timeouts: u64,
    /// Workers whose socket refused a connection (killed and replaced).
    pub refused: u64,
    /// Workers marked suspect (first-byte deadline missed, protocol broken); each is also
    /// counted in `recycled.suspect` when its recycling starts.
    pub suspect: u64,
    /// Idle workers retired by the sizing policy.
    pub retired_idle: u64,
    /// Recycles by reason.
    pub recycled: RecycleCounts,
    /// Times the pool entered a crash loop.
    pub throttled: u64,
    /// Reforks (`refork_after`): promoted templates that became ready, after which the
    /// workers of older templates were replaced.
    pub reforks: u64,
}

/// A pool's supervisor at one moment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PoolStatus {
    /// One row per worker not yet reaped, oldest first.
    pub workers: Vec<WorkerStatus>,
    /// Lifetime counters.
    pub counters: PoolCounters,
    /// Consecutive crashes now.
    pub crashes: u32,
    /// Spawns are throttled by a crash loop.
    pub throttled: bool,
    /// `Stop` was received.
    pub stopping: bool,
    /// Requests queued without a slot, as last reported.
    pub demand: usize,
    /// PSS summed over the pool's workers at the last pool-wide sample (`max_pool_memory`).
    pub memory_total: Option<u64>,
}

impl PoolState {
    /// The requests worker `key` has been given (what `max_requests` counts), as of the
    /// driver's last report of the slot table's counts; `None` for a worker it no longer
    /// holds.
    pub fn requests_given(&self, key: WorkerKey) -> Option<u64> {
        self.workers.get(&key).map(|w| w.started)
    }

    /// The pool's counters.
    pub fn counters(&self) -> &PoolCounters {
        &self.counters
    }

    /// Counts a refork: the driver saw a promoted template ready (the replacement of the
    /// older workers it then asks for is `RollingRestartOf`).
    pub fn count_refork(&mut self) {
        self.counters.reforks += 1;
    }

    /// Everything the status page shows, with ages measured at `now`.
    pub fn status(&self, now: Duration) -> PoolStatus {
        let workers = self
            .workers
            .values()
            .map(|w| WorkerStatus {
                key: w.key,
                pid: w.pid,
                state: match w.phase {
                    Phase::Booting if w.pid.is_none() => WorkerState::Starting,
                    Phase::Booting => WorkerState::Booting,
                    Phase::Ready if w.doomed.is_some() => WorkerState::Draining,
                    Phase::Ready if w.in_flight == 0 => WorkerState::Idle,
                    Phase::Ready => WorkerState::Busy,
                    Phase::Retiring => WorkerState::Retiring,
                    Phase::Signalled(_) => WorkerState::Stopping,
                    Phase::Killed(_) => WorkerState::Killed,
                },
                accepting: w.accepting,
                served: w.served,
                in_flight: w.in_flight,
                age: now.saturating_sub(w.spawned_at),
                memory: w.memory,
                recycle: w.doomed,
                replacement: w.replaced_by,
                children: Vec::new(),
            })
            .collect();
        PoolStatus {
            workers,
            counters: self.counters,
            crashes: self.crashes,
            throttled: self.throttled,
            stopping: self.stopping.is_some(),
            demand: self.demand,
            memory_total: self.memory_total,
        }
    }
}
