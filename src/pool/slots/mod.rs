//! Slots: the right to send one request to one worker, bounded per pool, per context and per
//! worker, with a bounded FIFO queue for the requests that find no free slot.
//!
//! Each pool has its own small mutex (never a global one) held only for a few comparisons: the
//! request path takes it once to check a slot out and once to give it back. A returned slot is
//! handed straight to the oldest waiter that may use it, so a queued request never races a new
//! arrival for a slot it has waited for, and waiters are served in arrival order whatever
//! serving thread they are on (the one exception, a waiter whose context is at its cap, is in
//! `queue`). Waiting is bounded in length (`queue_size`) and time (`queue_timeout`); a
//! request that finds the queue full is refused at once, which the front listener answers
//! with 503 and Retry-After.
//!
//! Workers are chosen by least outstanding requests (ties go to the lowest index, so a lightly
//! loaded pool keeps its hot workers hot). A worker that is retiring or not yet ready takes no
//! new slot.
//!
//! For status, each slot in use keeps the instant it was taken in one of its worker's lanes
//! (one per unit of concurrency, allocated with the worker) and each waiter the instant it
//! asked, so the ages of the oldest request in flight and of the oldest waiting are computed
//! when status is read ([`SlotTable::ages`]); the request path only stores an instant it
//! already had under the lock it already holds.
//!
//! The files: this one holds the public types and the request path (`acquire`, `reroute`,
//! the give-back on drop); `worker` the worker entries and their health; `choice` the taking
//! and giving back of one slot (which worker, the counts); `queue` the waiters and the order
//! in which freed slots reach them.

mod choice;
mod queue;
#[cfg(test)]
mod tests;
mod worker;

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::sync::{oneshot, Notify};
use tokio::time::Instant;

use crate::config::BackendAddress;

use choice::Grant;
use queue::{Wait, Waiter};
use worker::WorkerEntry;
pub use worker::{FailPolicy, Failed, RequestDelta, WorkerCounts};

/// Why a slot could not be had.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum SlotError {
    /// Every slot was busy and the queue already held `queue_size` requests.
    #[error("the queue is full ({queue_size} requests already wait)")]
    QueueFull {
        /// The configured bound that was reached.
        queue_size: usize,
    },
    /// The request waited `queue_timeout` without a slot coming free.
    #[error("no slot came free within the queue timeout of {0:?}")]
    QueueTimeout(Duration),
    /// The pool is stopping and takes no new requests.
    #[error("the pool is stopping and takes no new requests")]
    Closed,
}

/// Limits of one pool's slot table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SlotLimits {
    /// Concurrent backend requests for the whole pool.
    pub max_conns: usize,
    /// Requests that may wait for a slot.
    pub queue_size: usize,
    /// How long one request may wait.
    pub queue_timeout: Duration,
}

/// Names one worker entry; the generation tells a replaced worker from its successor in the
/// same entry, so a late release can never be counted against the wrong process.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct WorkerId {
    /// Index in the table.
    pub index: usize,
    /// Bumped each time the entry is reused.
    pub generation: u64,
}

/// A checked-out slot. Dropping it gives the slot back (and may hand it to a waiter).
#[derive(Debug)]
pub struct Slot {
    table: Arc<SlotTable>,
    worker: WorkerId,
    address: Arc<BackendAddress>,
    context: usize,
    /// The worker had failures on record when this slot was taken: a success on it clears
    /// them (see [`SlotTable::succeeded`]).
    probe: bool,
    /// False once the slot was given back by hand ([`SlotTable::reroute`]).
    armed: bool,
    /// The worker's lane holding the instant the slot was taken.
    lane: u32,
    /// The pool's requests in flight, this one included, when it was granted.
    in_flight: usize,
    /// The worker's process id when the slot was granted (if known then).
    pid: Option<u32>,
}

impl Slot {
    /// The worker this slot belongs to.
    pub fn worker(&self) -> WorkerId {
        self.worker
    }

    /// Where that worker listens.
    pub fn address(&self) -> &Arc<BackendAddress> {
        &self.address
    }

    /// The process id of its worker, when corral spawned it.
    pub fn pid(&self) -> Option<u32> {
        self.pid.or_else(|| self.table.pid(self.worker))
    }

    /// The worker's lane this slot holds: one of `0..concurrency`, no other slot in flight
    /// on the worker holds it, and the lane free longest is the one granted. `None` in the
    /// case that cannot arise while the worker's requests stay within its concurrency.
    pub fn lane(&self) -> Option<u32> {
        (self.lane != choice::NO_LANE).then_some(self.lane)
    }

    /// The pool's requests in flight, this one included, when the slot was granted.
    pub fn in_flight_at_grant(&self) -> usize {
        self.in_flight
    }

    /// Whether the worker had failures on record when the slot was taken.
    pub fn is_probe(&self) -> bool {
        self.probe
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        if self.armed {
            self.table.release(self.worker, self.context, self.lane);
        }
    }
}

#[derive(Debug)]
struct State {
    limits: SlotLimits,
    /// Per-context caps (`usize::MAX` where the context sets none) and counts.
    context_caps: Vec<usize>,
    context_in_flight: Vec<usize>,
    workers: Vec<WorkerEntry>,
    in_flight: usize,
    waiters: VecDeque<Waiter>,
    next_waiter: u64,
    closed: bool,
    /// How servers are taken out of rotation; `None` for spawned pools, whose failing
    /// workers are replaced instead.
    fail_policy: Option<FailPolicy>,
    /// Workers held for a memory check, for the supervisor to measure.
    checks: Vec<WorkerId>,
    /// Workers whose last request finished while the supervisor watched for it.
    drained: Vec<WorkerId>,
    /// Whether a request that starts waiting wakes the supervisor (`demand`): only a pool
    /// that may spawn for its queue needs that; a static pool, or one at its `max`, learns
    /// the queue's length at its next tick.
    wake_on_demand: bool,
    /// A worker took the last request of its budget, or the first request after a rest
    /// came (`wake_at_next_request`), since the supervisor was last woken for one: it is
    /// woken whatever `wake_on_demand` says, to replace that worker or pick up its rhythm
    /// at once.
    spent: bool,
    /// The supervisor rests (it ticks seldom) and wants to hear of the next request at once
    /// ([`SlotTable::wake_at_next_request`]).
    wake_at_next_request: bool,
}

/// Live numbers for status.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SlotStats {
    /// Requests holding a slot now.
    pub in_flight: usize,
    /// Requests waiting for a slot now.
    pub queued: usize,
    /// Workers that accept requests now.
    pub accepting_workers: usize,
}

/// How long the oldest requests have been at their stage, as status reads them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SlotAges {
    /// Since the oldest slot in use was taken (`None`: nothing in flight).
    pub oldest_in_flight: Option<Duration>,
    /// Since the oldest waiting request asked for a slot (`None`: nobody waits).
    pub oldest_queued: Option<Duration>,
}

/// One pool's slot table.
#[derive(Debug)]
pub struct SlotTable {
    state: Mutex<State>,
    /// Woken when a request starts waiting: an on-demand pool spawns at once rather than at
    /// its next tick.
    demand: Notify,
    /// Woken when a worker is held for a memory check.
    checks: Notify,
    /// Woken when a watched worker's last request finishes.
    drained: Notify,
}

impl SlotTable {
    /// A table with one entry per context in `context_caps` (`None` = only the pool's cap
    /// applies to that context) and no workers yet.
    pub fn new(limits: SlotLimits, context_caps: &[Option<usize>]) -> Arc<SlotTable> {
        Arc::new(SlotTable {
            state: Mutex::new(State {
                limits,
                context_caps: context_caps
                    .iter()
                    .map(|c| c.unwrap_or(usize::MAX))
                    .collect(),
                context_in_flight: vec![0; context_caps.len()],
                workers: Vec::new(),
                in_flight: 0,
                waiters: VecDeque::new(),
                next_waiter: 0,
                closed: false,
                fail_policy: None,
                checks: Vec::new(),
                drained: Vec::new(),
                wake_on_demand: true,
                spent: false,
                wake_at_next_request: false,
            }),
            demand: Notify::new(),
            checks: Notify::new(),
            drained: Notify::new(),
        })
    }

    /// Changes the pool's cap on requests in flight (a pool of servers whose names resolve
    /// to more or fewer addresses: `src/backend/resolve.rs`); a higher cap serves waiters.
    pub fn set_max_conns(&self, max_conns: usize) {
        let mut st = self.lock();
        st.limits.max_conns = max_conns.max(1);
        Self::grant_waiters(&mut st);
    }

    /// Takes servers that fail out of rotation by `policy` (pools of servers).
    pub fn set_fail_policy(&self, policy: FailPolicy) {
        self.lock().fail_policy = Some(policy);
    }

    /// Whether a request that starts waiting wakes [`SlotTable::demand`] (the default). The
    /// driver turns it off while its pool cannot spawn for the queue (static, or at `max`):
    /// under load nearly every request waits, and each wake-up would cost a hand-off to the
    /// driver's thread, its turn on this table's lock and a status snapshot, per request
    /// (`src/pool/driver/demand.rs`).
    pub fn wake_on_demand(&self, on: bool) {
        self.lock().wake_on_demand = on;
    }

    /// Resolves when a request has started waiting for a slot since the last call (while
    /// [`SlotTable::wake_on_demand`] is on).
    pub async fn demand(&self) {
        self.demand.notified().await;
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // The state is plain counters changed in a few non-panicking lines; should a panic
        // ever poison the lock, carrying on beats failing every later request.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Live numbers for status.
    pub fn stats(&self) -> SlotStats {
        let st = self.lock();
        SlotStats {
            in_flight: st.in_flight,
            queued: st.waiters.len(),
            accepting_workers: st.workers.iter().filter(|w| w.accepting).count(),
        }
    }

    /// How long the oldest request in flight has held its slot and the oldest waiting one
    /// has waited, now. For status only: it walks every worker's lanes and the queue.
    pub fn ages(&self) -> SlotAges {
        let now = Instant::now();
        let st = self.lock();
        let age = |t: Instant| now.saturating_duration_since(t);
        SlotAges {
            oldest_in_flight: st
                .workers
                .iter()
                .flat_map(|w| w.lanes.iter().flatten())
                .min()
                .map(|t| age(*t)),
            oldest_queued: st
                .waiters
                .iter()
                .filter(|w| !w.tx.is_closed())
                .map(|w| w.since)
                .min()
                .map(age),
        }
    }

    /// Checks a slot out for a request of `context`, waiting in the queue if none is free.
    pub async fn acquire(self: &Arc<Self>, context: usize) -> Result<Slot, SlotError> {
        self.acquire_at(context, Instant::now()).await
    }

    /// As [`SlotTable::acquire`], for a request that asked at `asked` (the caller's clock
    /// reading, kept as the start of its wait or of its slot).
    pub async fn acquire_at(
        self: &Arc<Self>,
        context: usize,
        asked: Instant,
    ) -> Result<Slot, SlotError> {
        let (rx, timeout) = {
            let mut st = self.lock();
            if st.closed {
                return Err(SlotError::Closed);
            }
            // Every change that frees capacity grants it to waiters at once, so the waiters
            // left are ones the current state cannot serve; a newcomer that can be served
            // therefore jumps nobody who could have used its slot, and the queue stays FIFO.
            if let Some(grant) = Self::try_take(&mut st, context, Some(asked)) {
                self.wake_if_spent(&mut st);
                return Ok(self.slot(grant, context));
            }
            if st.waiters.len() >= st.limits.queue_size {
                return Err(SlotError::QueueFull {
                    queue_size: st.limits.queue_size,
                });
            }
            let (tx, rx) = oneshot::channel();
            let id = st.next_waiter;
            st.next_waiter = st.next_waiter.wrapping_add(1);
            st.waiters.push_back(Waiter {
                id,
                context,
                tx,
                since: asked,
            });
            let after_rest = std::mem::take(&mut st.wake_at_next_request);
            if st.wake_on_demand || after_rest {
                st.spent = false;
                self.demand.notify_one();
            }
            (Wait::new(self, id, context, rx), st.limits.queue_timeout)
        };
        let mut wait = rx;
        match tokio::time::timeout(timeout, &mut wait.rx).await {
            Ok(Ok(grant)) => {
                wait.granted = true;
                Ok(self.slot(grant, context))
            }
            Ok(Err(_)) => Err(SlotError::Closed),
            // Dropping `wait` gives back a grant that raced the timer.
            Err(_) => Err(SlotError::QueueTimeout(timeout)),
        }
    }

    fn slot(self: &Arc<Self>, grant: Grant, context: usize) -> Slot {
        Slot {
            table: Arc::clone(self),
            worker: grant.worker,
            address: grant.address,
            context,
            probe: grant.probe,
            armed: true,
            lane: grant.lane,
            in_flight: grant.in_flight,
            pid: grant.pid,
        }
    }

    /// Trades `slot`, whose worker could not be reached (nothing of the request was sent),
    /// for a slot on another worker: at once when one is free, without going behind the
    /// queue (the request had its turn already), else by waiting like any other request.
    /// Mark the worker first ([`SlotTable::fail`]) so it is not chosen again.
    pub async fn reroute(self: &Arc<Self>, mut slot: Slot) -> Result<Slot, SlotError> {
        let context = slot.context;
        {
            let mut st = self.lock();
            slot.armed = false;
            // The request keeps its age on the next worker.
            let since = Self::entry(&mut st, slot.worker)
                .and_then(|w| w.lanes.get(slot.lane as usize).copied().flatten());
            Self::give_back(&mut st, slot.worker, context, slot.lane);
            drop(slot);
            if st.closed {
                return Err(SlotError::Closed);
            }
            if let Some(grant) = Self::try_take(&mut st, context, since) {
                self.wake_if_spent(&mut st);
                return Ok(self.slot(grant, context));
            }
            // The slot given back may serve another context's waiter.
            Self::grant_waiters(&mut st);
            self.wake_if_spent(&mut st);
        }
        self.acquire(context).await
    }

    fn release(&self, worker: WorkerId, context: usize, lane: u32) {
        let mut st = self.lock();
        if Self::give_back(&mut st, worker, context, lane) {
            if !st.checks.is_empty() {
                self.checks.notify_one();
            }
            if !st.drained.is_empty() {
                self.drained.notify_one();
            }
        }
        Self::grant_waiters(&mut st);
        self.wake_if_spent(&mut st);
    }

    /// Wakes [`SlotTable::demand`] when a worker has taken the last request of its budget
    /// since the last wake-up (see `State::spent`).
    fn wake_if_spent(&self, st: &mut State) {
        if std::mem::take(&mut st.spent) {
            self.demand.notify_one();
        }
    }
}
