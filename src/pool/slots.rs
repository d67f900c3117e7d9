//! Slots: the right to send one request to one worker, bounded per pool, per context and per
//! worker, with a bounded FIFO queue for the requests that find no free slot.
//!
//! Each pool has its own small mutex (never a global one) held only for a few comparisons: the
//! request path takes it once to check a slot out and once to give it back. A returned slot is
//! handed straight to the oldest waiter that may use it, so a queued request never races a new
//! arrival for a slot it has waited for. On serving threads (`crate::shards`) the oldest waiter
//! on the thread that freed the slot goes first, passing each older one over at most
//! `MAX_PASSED` times: that hand-off wakes no other thread. Waiting is bounded in length (`queue_size`) and time
//! (`queue_timeout`); a request that finds the queue full is refused at once, which the front
//! listener answers with 503 and Retry-After.
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

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::sync::{oneshot, Notify};
use tokio::time::Instant;

use crate::config::BackendAddress;

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

/// When a server of a pool of servers is taken out of rotation (nginx's `max_fails` and
/// `fail_timeout`): after `max_fails` failures, each within `fail_timeout` of the previous
/// one, it takes no request for `fail_timeout`; then one request at a time is let through as
/// a probe until one succeeds. `max_fails = 0` never takes a server out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FailPolicy {
    /// Failures that take a server out.
    pub max_fails: u32,
    /// How long it stays out, and the window in which failures add up.
    pub fail_timeout: Duration,
}

/// What [`SlotTable::fail`] did with a worker.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Failed {
    /// The worker takes no new request until its supervisor replaces it (spawned pools).
    OutOfRotation,
    /// The server is out of rotation for this long, from now (it was up before).
    Down(Duration),
    /// The server was down already, or a probe failed: it stays out for this long.
    StillDown(Duration),
    /// The failure was counted; the server stays in rotation.
    Counted,
}

#[derive(Debug)]
struct WorkerEntry {
    generation: u64,
    address: Arc<BackendAddress>,
    /// Requests this worker has been given.
    started: u64,
    /// Requests it may be given in all (`max_requests` plus jitter); it stops taking new
    /// ones when `started` reaches it, so a recycled worker never gets one request too many.
    budget: Option<u64>,
    /// Requests the worker can serve at once (1 for php-cgi and lsphp).
    concurrency: usize,
    in_flight: usize,
    /// False while the worker starts, after it was told to retire, or once it is gone.
    accepting: bool,
    /// The entry no longer names a live worker; reused once `in_flight` is 0.
    removed: bool,
    /// Failures counted against a server of a pool of servers, and when the last one was.
    fails: u32,
    last_fail: Option<Instant>,
    /// Out of rotation until then (pools of servers).
    down_until: Option<Instant>,
    /// When the server went out of rotation; cleared by its next success.
    down_since: Option<Instant>,
    /// Held out of rotation while its supervisor measures its memory after a request.
    checking: bool,
    /// Requests finished on it; with `started`, what the supervisor has not heard of yet
    /// is `started - reported_started` and `finished - reported_finished`.
    finished: u64,
    reported_started: u64,
    reported_finished: u64,
    /// The supervisor waits for this worker's last request to finish (it is to stop).
    watch_drain: bool,
    /// The worker's process, when corral spawned it (for the access log).
    pid: Option<u32>,
    /// Requests to finish before the next memory check; `None` = no checks.
    check_in: Option<u64>,
    /// When each slot in use on it was taken, one lane per unit of concurrency, and the
    /// lanes free now (for status: [`SlotTable::ages`]).
    lanes: Vec<Option<Instant>>,
    free_lanes: Vec<u32>,
}

impl WorkerEntry {
    fn fresh(concurrency: usize, address: BackendAddress, budget: Option<u64>) -> WorkerEntry {
        let concurrency = concurrency.max(1);
        let lanes = u32::try_from(concurrency).unwrap_or(u32::MAX);
        WorkerEntry {
            lanes: vec![None; concurrency],
            free_lanes: (0..lanes).rev().collect(),
            generation: 0,
            address: Arc::new(address),
            started: 0,
            budget,
            concurrency,
            in_flight: 0,
            accepting: false,
            removed: false,
            fails: 0,
            last_fail: None,
            down_until: None,
            down_since: None,
            checking: false,
            check_in: None,
            finished: 0,
            reported_started: 0,
            reported_finished: 0,
            watch_drain: false,
            pid: None,
        }
    }

    /// Requests it may have in flight now: one while it is a probe after being down.
    fn capacity(&self) -> usize {
        if self.down_since.is_some() {
            1
        } else {
            self.concurrency
        }
    }
}

/// What a waiter is handed.
#[derive(Debug)]
struct Grant {
    worker: WorkerId,
    /// Where the worker listens.
    address: Arc<BackendAddress>,
    /// Whether the slot is a probe (the worker had failures on record).
    probe: bool,
    /// The worker's lane that holds when the slot was taken.
    lane: u32,
    /// The pool's requests in flight with this one, for the status page's maximum (read
    /// here, under the lock the grant already holds, not with a lock of its own).
    in_flight: usize,
    /// The worker's process id as the table knew it then.
    pid: Option<u32>,
}

/// The lane of a slot taken with every lane in use, which cannot happen while `in_flight`
/// stays below the concurrency; such a slot is simply not timed.
const NO_LANE: u32 = u32::MAX;

#[derive(Debug)]
struct Waiter {
    id: u64,
    context: usize,
    tx: oneshot::Sender<Grant>,
    /// The serving thread it waits on (`crate::shards`).
    shard: Option<usize>,
    /// How many times a younger waiter was served before it ([`MAX_PASSED`]).
    passed: u32,
    /// When it asked for a slot.
    since: Instant,
}

/// How many times a waiter may be passed over for a younger one on the thread that freed the
/// slot. Handing a slot to a request on that thread spares a wake-up of another thread (and
/// keeps the worker's kept connection on the thread that holds it), which on 2 cores cost
/// more than the request itself; the bound keeps the queue nearly FIFO.
const MAX_PASSED: u32 = 2;

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

/// One worker as the supervisor sees it in the table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkerCounts {
    /// The worker.
    pub id: WorkerId,
    /// Requests it has been given.
    pub started: u64,
    /// Requests in progress on it.
    pub in_flight: usize,
    /// Whether it takes new requests.
    pub accepting: bool,
    /// How long ago it went out of rotation, while it is out (pools of servers).
    pub down_for: Option<Duration>,
    /// Where it listens.
    pub address: Arc<BackendAddress>,
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

/// What the supervisor has not heard of yet about one worker's requests.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RequestDelta {
    /// The worker.
    pub id: WorkerId,
    /// Requests it was given since the last report.
    pub started: u64,
    /// Requests that finished on it since the last report.
    pub finished: u64,
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

    /// Resolves when a request has started waiting for a slot since the last call.
    pub async fn demand(&self) {
        self.demand.notified().await;
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // The state is plain counters changed in a few non-panicking lines; should a panic
        // ever poison the lock, carrying on beats failing every later request.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Adds a worker at `address`, not yet accepting, that may be given at most `budget`
    /// requests; reuses the entry of a removed worker whose last request has finished.
    pub fn add_worker(
        &self,
        concurrency: usize,
        address: BackendAddress,
        budget: Option<u64>,
    ) -> WorkerId {
        let mut st = self.lock();
        let fresh = WorkerEntry::fresh(concurrency, address, budget);
        let free = st
            .workers
            .iter()
            .position(|w| w.removed && w.in_flight == 0);
        match free.and_then(|i| st.workers.get_mut(i).map(|w| (i, w))) {
            Some((index, w)) => {
                let generation = w.generation + 1;
                *w = WorkerEntry {
                    generation,
                    ..fresh
                };
                WorkerId { index, generation }
            }
            None => {
                st.workers.push(fresh);
                WorkerId {
                    index: st.workers.len() - 1,
                    generation: 0,
                }
            }
        }
    }

    fn entry(st: &mut State, id: WorkerId) -> Option<&mut WorkerEntry> {
        st.workers
            .get_mut(id.index)
            .filter(|w| w.generation == id.generation)
    }

    /// Lets a worker take requests (it is ready) or stops it taking new ones (it retires).
    /// Turning a worker on hands its free capacity to waiters at once.
    pub fn set_accepting(&self, id: WorkerId, accepting: bool) {
        let mut st = self.lock();
        if let Some(w) = Self::entry(&mut st, id) {
            w.accepting = accepting && !w.removed;
        }
        if accepting {
            Self::grant_waiters(&mut st);
        }
    }

    /// Forgets a worker that has gone; its entry is reused once its slots are all back.
    pub fn remove_worker(&self, id: WorkerId) {
        let mut st = self.lock();
        if let Some(w) = Self::entry(&mut st, id) {
            w.accepting = false;
            w.removed = true;
        }
    }

    /// Requests in flight on one worker (a retiring worker is stopped when this reaches 0).
    pub fn worker_in_flight(&self, id: WorkerId) -> usize {
        let mut st = self.lock();
        Self::entry(&mut st, id).map_or(0, |w| w.in_flight)
    }

    /// Records the process id of a spawned worker.
    pub fn set_pid(&self, id: WorkerId, pid: u32) {
        let mut st = self.lock();
        if let Some(w) = Self::entry(&mut st, id) {
            w.pid = Some(pid);
        }
    }

    /// The process id of worker `id`, when corral spawned it.
    pub fn pid(&self, id: WorkerId) -> Option<u32> {
        let mut st = self.lock();
        Self::entry(&mut st, id).and_then(|w| w.pid)
    }

    /// Asks to hear (through [`SlotTable::drained`]) when the last request in flight on `id`
    /// finishes; true when none is in flight now (nothing will be reported then).
    pub fn watch_drain(&self, id: WorkerId) -> bool {
        let mut st = self.lock();
        match Self::entry(&mut st, id) {
            Some(w) if w.in_flight > 0 => {
                w.watch_drain = true;
                false
            }
            _ => true,
        }
    }

    /// Watched workers whose last request finished since the last call; waits for one if
    /// there is none. The table pushes this: the supervisor holds no copy of the counts.
    pub async fn drained(&self) -> Vec<WorkerId> {
        loop {
            let notified = self.drained.notified();
            let done = std::mem::take(&mut self.lock().drained);
            if !done.is_empty() {
                return done;
            }
            notified.await;
        }
    }

    /// Each worker's requests started and finished since the last call: the table is the one
    /// place requests are counted, and the supervisor's state machine learns of them here.
    pub fn take_request_deltas(&self) -> Vec<RequestDelta> {
        let mut st = self.lock();
        let mut out = Vec::new();
        for (index, w) in st.workers.iter_mut().enumerate() {
            let started = w.started.saturating_sub(w.reported_started);
            let finished = w.finished.saturating_sub(w.reported_finished);
            if started == 0 && finished == 0 {
                continue;
            }
            w.reported_started = w.started;
            w.reported_finished = w.finished;
            out.push(RequestDelta {
                id: WorkerId {
                    index,
                    generation: w.generation,
                },
                started,
                finished,
            });
        }
        out
    }

    /// Refuses every waiter and every later request with [`SlotError::Closed`].
    pub fn close(&self) {
        let mut st = self.lock();
        st.closed = true;
        // Dropping the senders wakes the waiters with an error.
        st.waiters.clear();
    }

    /// Every live worker's counts, for the supervisor's tick.
    pub fn workers(&self) -> Vec<WorkerCounts> {
        let now = Instant::now();
        let st = self.lock();
        st.workers
            .iter()
            .enumerate()
            .filter(|(_, w)| !w.removed)
            .map(|(index, w)| WorkerCounts {
                id: WorkerId {
                    index,
                    generation: w.generation,
                },
                started: w.started,
                in_flight: w.in_flight,
                accepting: w.accepting,
                down_for: w.down_since.map(|t| now.saturating_duration_since(t)),
                address: Arc::clone(&w.address),
            })
            .collect()
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
                shard: crate::shards::current(),
                passed: 0,
                since: asked,
            });
            self.demand.notify_one();
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
                return Ok(self.slot(grant, context));
            }
            // The slot given back may serve another context's waiter.
            Self::grant_waiters(&mut st);
        }
        self.acquire(context).await
    }

    /// Records that a request on `id` failed in a way that says the worker is broken (it
    /// refused the connection, missed its first-byte deadline, broke the protocol). In a
    /// spawned pool the worker takes no new request from now on (its supervisor replaces it);
    /// in a pool of servers the failure counts toward the [`FailPolicy`].
    pub fn fail(&self, id: WorkerId) -> Failed {
        let now = Instant::now();
        let mut st = self.lock();
        let policy = st.fail_policy;
        let Some(w) = Self::entry(&mut st, id) else {
            return Failed::Counted;
        };
        let Some(policy) = policy else {
            w.accepting = false;
            return Failed::OutOfRotation;
        };
        if policy.max_fails == 0 {
            return Failed::Counted;
        }
        let window_over = w
            .last_fail
            .is_some_and(|t| now.saturating_duration_since(t) > policy.fail_timeout);
        if window_over && w.down_since.is_none() {
            w.fails = 0;
        }
        w.fails = w.fails.saturating_add(1);
        w.last_fail = Some(now);
        if w.fails < policy.max_fails && w.down_since.is_none() {
            return Failed::Counted;
        }
        w.down_until = Some(now + policy.fail_timeout);
        match w.down_since {
            Some(_) => Failed::StillDown(policy.fail_timeout),
            None => {
                w.down_since = Some(now);
                Failed::Down(policy.fail_timeout)
            }
        }
    }

    /// A request on `id` got its response head: its failures are forgotten and, if it was
    /// out of rotation, it is back with its full concurrency. Returns how long it was out.
    pub fn succeeded(&self, id: WorkerId) -> Option<Duration> {
        let mut st = self.lock();
        let w = Self::entry(&mut st, id)?;
        w.fails = 0;
        w.last_fail = None;
        w.down_until = None;
        let since = w.down_since.take()?;
        Self::grant_waiters(&mut st);
        Some(since.elapsed())
    }

    /// Asks for a memory check of worker `id` after every `requests` requests it finishes
    /// (`None`: no more checks); the worker takes no new request while a check is pending.
    pub fn check_memory_in(&self, id: WorkerId, requests: Option<u64>) {
        let mut st = self.lock();
        if let Some(w) = Self::entry(&mut st, id) {
            w.check_in = requests.map(|r| r.max(1));
        }
    }

    /// Workers held for a memory check since the last call; waits for one if there is none.
    pub async fn memory_checks(&self) -> Vec<WorkerId> {
        loop {
            let notified = self.checks.notified();
            let due = std::mem::take(&mut self.lock().checks);
            if !due.is_empty() {
                return due;
            }
            notified.await;
        }
    }

    /// The memory check of `id` is done: it takes requests again (unless it was retired
    /// meanwhile), and the next check comes after `next` more requests (`None`: none).
    pub fn memory_checked(&self, id: WorkerId, next: Option<u64>) {
        let mut st = self.lock();
        if let Some(w) = Self::entry(&mut st, id) {
            w.checking = false;
            w.check_in = next.map(|r| r.max(1));
        }
        Self::grant_waiters(&mut st);
    }

    /// Takes waiter `id` out of the queue: it stopped waiting (timeout, client gone), and
    /// its place is free for the next request at once.
    fn leave_queue(&self, id: u64) {
        let mut st = self.lock();
        if let Some(i) = st.waiters.iter().position(|w| w.id == id) {
            st.waiters.remove(i);
        }
    }

    /// Takes a slot for `context` if the pool, the context and some worker have room; the
    /// least loaded accepting worker wins, the lowest index on a tie. A server out of
    /// rotation is skipped; when every server with room is out, the one due back first is
    /// used anyway (as a probe) when no server is up at all, so a request fails fast with
    /// the server's own error rather than waiting for a slot that nothing would free.
    /// The slot's lane records `since`, or the time now when that is `None` (read only
    /// when a slot is taken).
    fn try_take(st: &mut State, context: usize, since: Option<Instant>) -> Option<Grant> {
        if st.in_flight >= st.limits.max_conns {
            return None;
        }
        let cap = st.context_caps.get(context).copied().unwrap_or(usize::MAX);
        if st.context_in_flight.get(context).copied().unwrap_or(0) >= cap {
            return None;
        }
        let mut now: Option<Instant> = None;
        let mut best: Option<(usize, usize)> = None;
        let mut fallback: Option<(usize, Instant)> = None;
        let mut any_up = false;
        for (i, w) in st.workers.iter().enumerate() {
            if !w.accepting {
                continue;
            }
            if let Some(until) = w.down_until {
                let t = *now.get_or_insert_with(Instant::now);
                if until > t {
                    let room = !w.checking && w.in_flight < w.capacity();
                    if room && fallback.is_none_or(|(_, f)| until < f) {
                        fallback = Some((i, until));
                    }
                    continue;
                }
            }
            any_up = true;
            if w.checking || w.in_flight >= w.capacity() {
                continue;
            }
            if w.in_flight == 0 {
                best = Some((i, 0));
                break;
            }
            if best.is_none_or(|(_, load)| w.in_flight < load) {
                best = Some((i, w.in_flight));
            }
        }
        // A busy server that is up will free a slot; only when none is up is a down one
        // tried.
        let fallback = fallback.filter(|_| !any_up).map(|(i, _)| i);
        let index = best.map(|(i, _)| i).or(fallback)?;
        let w = st.workers.get_mut(index)?;
        w.in_flight += 1;
        w.started += 1;
        if w.budget.is_some_and(|b| w.started >= b) {
            // The last request of its budget: it takes no more.
            w.accepting = false;
        }
        let probe = w.fails > 0 || w.down_since.is_some();
        let id = WorkerId {
            index,
            generation: w.generation,
        };
        let address = Arc::clone(&w.address);
        let pid = w.pid;
        let lane = w.free_lanes.pop().unwrap_or(NO_LANE);
        if let Some(l) = w.lanes.get_mut(lane as usize) {
            *l = Some(since.or(now).unwrap_or_else(Instant::now));
        }
        if let Some(c) = st.context_in_flight.get_mut(context) {
            *c += 1;
        }
        st.in_flight += 1;
        Some(Grant {
            worker: id,
            address,
            probe,
            lane,
            in_flight: st.in_flight,
            pid,
        })
    }

    /// Gives a slot back; true when the supervisor must hear of it (a memory check is due,
    /// or a watched worker drained).
    fn give_back(st: &mut State, worker: WorkerId, context: usize, lane: u32) -> bool {
        let mut check = false;
        let mut drained = false;
        if let Some(w) = Self::entry(st, worker) {
            if let Some(l) = w.lanes.get_mut(lane as usize) {
                if l.take().is_some() {
                    w.free_lanes.push(lane);
                }
            }
            w.in_flight = w.in_flight.saturating_sub(1);
            w.finished += 1;
            if w.in_flight == 0 && w.watch_drain {
                w.watch_drain = false;
                drained = true;
            }
            if let Some(n) = w.check_in.as_mut() {
                *n = n.saturating_sub(1);
                if *n == 0 && w.accepting && !w.checking {
                    // Held until the supervisor has measured it, so a worker grown past
                    // max_memory never takes the next request.
                    w.check_in = None;
                    w.checking = true;
                    check = true;
                }
            }
        }
        if let Some(c) = st.context_in_flight.get_mut(context) {
            *c = c.saturating_sub(1);
        }
        st.in_flight = st.in_flight.saturating_sub(1);
        if check {
            st.checks.push(worker);
        }
        if drained {
            st.drained.push(worker);
        }
        check || drained
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
    }

    /// Hands free slots to waiters, oldest first. A waiter whose context is at its cap keeps
    /// its place and is skipped, so one busy context cannot block the others.
    fn grant_waiters(st: &mut State) {
        Self::grant_local_waiter(st);
        let mut i = 0;
        while i < st.waiters.len() && st.in_flight < st.limits.max_conns {
            let Some((context, gone)) = st.waiters.get(i).map(|w| (w.context, w.tx.is_closed()))
            else {
                return;
            };
            if gone {
                st.waiters.remove(i);
                continue;
            }
            let Some(grant) = Self::try_take(st, context, None) else {
                i += 1;
                continue;
            };
            let (worker, lane) = (grant.worker, grant.lane);
            if let Some(waiter) = st.waiters.remove(i) {
                if waiter.tx.send(grant).is_err() {
                    Self::ungrant(st, worker, context, lane);
                }
            }
        }
    }
}

impl SlotTable {
    /// Undoes a grant whose waiter gave up between the check and the send. Its request never
    /// ran, so the worker's request count and memory check stay as they were.
    fn ungrant(st: &mut State, worker: WorkerId, context: usize, lane: u32) {
        if let Some(w) = Self::entry(st, worker) {
            w.started = w.started.saturating_sub(1);
            w.check_in = w.check_in.map(|n| n + 1);
        }
        Self::give_back(st, worker, context, lane);
        if let Some(w) = Self::entry(st, worker) {
            w.finished = w.finished.saturating_sub(1);
        }
    }

    /// On a serving thread, grants capacity to the oldest waiter on the same thread, if no
    /// older waiter has been passed over [`MAX_PASSED`] times already; the rest is granted in
    /// queue order by `grant_waiters`.
    fn grant_local_waiter(st: &mut State) {
        let Some(here) = crate::shards::current() else {
            return;
        };
        if st.in_flight >= st.limits.max_conns {
            return;
        }
        let mut pick = None;
        for (i, w) in st.waiters.iter().enumerate() {
            if w.shard == Some(here) && !w.tx.is_closed() {
                pick = Some((i, w.context));
                break;
            }
            if w.passed >= MAX_PASSED {
                return;
            }
        }
        let Some((i, context)) = pick else {
            return;
        };
        if i == 0 {
            // The oldest one: the queue-order pass grants it anyway.
            return;
        }
        let Some(grant) = Self::try_take(st, context, None) else {
            return;
        };
        let (worker, lane) = (grant.worker, grant.lane);
        let Some(waiter) = st.waiters.remove(i) else {
            return;
        };
        match waiter.tx.send(grant) {
            Ok(()) => {
                for w in st.waiters.iter_mut().take(i) {
                    w.passed += 1;
                }
            }
            Err(_) => Self::ungrant(st, worker, context, lane),
        }
    }
}

/// A queued request's end of the hand-off. If the request stops waiting (timeout, or the
/// client went away and the future was dropped), the drop takes it out of the queue at once,
/// so its place is free for the next request; a slot already sent to it is given back.
struct Wait<'a> {
    table: &'a Arc<SlotTable>,
    id: u64,
    context: usize,
    rx: oneshot::Receiver<Grant>,
    granted: bool,
}

impl<'a> Wait<'a> {
    fn new(
        table: &'a Arc<SlotTable>,
        id: u64,
        context: usize,
        rx: oneshot::Receiver<Grant>,
    ) -> Self {
        Wait {
            table,
            id,
            context,
            rx,
            granted: false,
        }
    }
}

impl Drop for Wait<'_> {
    fn drop(&mut self) {
        if self.granted {
            return;
        }
        self.rx.close();
        match self.rx.try_recv() {
            Ok(grant) => self.table.release(grant.worker, self.context, grant.lane),
            Err(_) => self.table.leave_queue(self.id),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table(max_conns: usize, queue_size: usize, caps: &[Option<usize>]) -> Arc<SlotTable> {
        SlotTable::new(
            SlotLimits {
                max_conns,
                queue_size,
                queue_timeout: Duration::from_secs(5),
            },
            caps,
        )
    }

    fn addr() -> BackendAddress {
        BackendAddress::Unix("/tmp/w.sock".into())
    }

    fn ready_worker(t: &SlotTable, concurrency: usize) -> WorkerId {
        let id = t.add_worker(concurrency, addr(), None);
        t.set_accepting(id, true);
        id
    }

    #[tokio::test(start_paused = true)]
    async fn pool_cap_holds_and_queue_overflows_at_once() {
        let t = table(2, 1, &[None]);
        ready_worker(&t, 4);
        let a = t.acquire(0).await.unwrap();
        let _b = t.acquire(0).await.unwrap();
        let waiting = tokio::spawn({
            let t = Arc::clone(&t);
            async move { t.acquire(0).await.map(|s| s.worker()) }
        });
        tokio::task::yield_now().await;
        assert_eq!(t.stats().queued, 1);
        assert_eq!(
            t.acquire(0).await.unwrap_err(),
            SlotError::QueueFull { queue_size: 1 }
        );
        drop(a);
        assert!(waiting.await.unwrap().is_ok());
        // The waiter has finished and given its slot back; `_b` still holds one.
        assert_eq!(t.stats().in_flight, 1);
    }

    #[tokio::test(start_paused = true)]
    async fn queue_timeout_fires_and_leaks_nothing() {
        let t = table(1, 4, &[None]);
        ready_worker(&t, 1);
        let held = t.acquire(0).await.unwrap();
        let err = t.acquire(0).await.unwrap_err();
        assert_eq!(err, SlotError::QueueTimeout(Duration::from_secs(5)));
        drop(held);
        assert_eq!(
            t.stats(),
            SlotStats {
                in_flight: 0,
                queued: 0,
                accepting_workers: 1
            }
        );
        let again = t.acquire(0).await.unwrap();
        assert_eq!(t.stats().in_flight, 1);
        drop(again);
    }

    #[tokio::test(start_paused = true)]
    async fn a_dropped_waiter_gives_its_grant_back() {
        let t = table(1, 4, &[None]);
        ready_worker(&t, 1);
        let held = t.acquire(0).await.unwrap();
        let waiter = tokio::spawn({
            let t = Arc::clone(&t);
            async move { t.acquire(0).await.map(|_| ()) }
        });
        tokio::task::yield_now().await;
        waiter.abort();
        let _ = waiter.await;
        drop(held);
        assert_eq!(t.stats().in_flight, 0);
        assert!(t.acquire(0).await.is_ok());
    }

    #[tokio::test(start_paused = true)]
    async fn context_cap_holds_without_blocking_other_contexts() {
        let t = table(10, 10, &[Some(1), None]);
        ready_worker(&t, 10);
        let a = t.acquire(0).await.unwrap();
        let capped = tokio::spawn({
            let t = Arc::clone(&t);
            async move { t.acquire(0).await.map(|_| ()) }
        });
        tokio::task::yield_now().await;
        assert_eq!(t.stats().queued, 1);
        // Context 1 is not held back by the waiter of the capped context 0 ...
        let other = tokio::spawn({
            let t = Arc::clone(&t);
            async move { t.acquire(1).await.map(|_| ()) }
        });
        tokio::task::yield_now().await;
        assert!(other.is_finished());
        // ... and the capped one gets its slot when the first returns.
        drop(a);
        assert!(capped.await.unwrap().is_ok());
    }

    #[tokio::test(start_paused = true)]
    async fn least_outstanding_worker_wins_and_retiring_workers_get_nothing() {
        let t = table(10, 0, &[None]);
        let w0 = ready_worker(&t, 4);
        let w1 = ready_worker(&t, 4);
        let s1 = t.acquire(0).await.unwrap();
        let s2 = t.acquire(0).await.unwrap();
        assert_eq!((s1.worker(), s2.worker()), (w0, w1));
        t.set_accepting(w0, false);
        let s3 = t.acquire(0).await.unwrap();
        assert_eq!(s3.worker(), w1);
        assert_eq!(t.worker_in_flight(w1), 2);
    }

    #[tokio::test(start_paused = true)]
    async fn a_reused_entry_ignores_the_old_workers_late_release() {
        let t = table(10, 0, &[None]);
        let old = ready_worker(&t, 1);
        let late = t.acquire(0).await.unwrap();
        t.remove_worker(old);
        // The entry is still busy, so the new worker gets a fresh one.
        let new = ready_worker(&t, 1);
        assert_ne!(new.index, old.index);
        drop(late);
        let newer = {
            t.remove_worker(new);
            ready_worker(&t, 1)
        };
        assert_eq!(newer.index, old.index);
        assert_eq!(newer.generation, old.generation + 1);
        assert_eq!(t.worker_in_flight(old), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn a_worker_takes_no_request_past_its_budget() {
        let t = table(10, 0, &[None]);
        let w = t.add_worker(4, addr(), Some(3));
        t.set_accepting(w, true);
        let mut slots = Vec::new();
        for _ in 0..3 {
            slots.push(t.acquire(0).await.expect("within budget"));
        }
        assert!(t.acquire(0).await.is_err(), "a fourth request was given");
        let counts = t.workers();
        assert_eq!(counts[0].started, 3);
        assert!(!counts[0].accepting);
        drop(slots);
        assert_eq!(t.worker_in_flight(w), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn close_refuses_waiters_and_newcomers() {
        let t = table(1, 4, &[None]);
        ready_worker(&t, 1);
        let _held = t.acquire(0).await.unwrap();
        let waiter = tokio::spawn({
            let t = Arc::clone(&t);
            async move { t.acquire(0).await.map(|_| ()) }
        });
        tokio::task::yield_now().await;
        t.close();
        assert_eq!(waiter.await.unwrap().unwrap_err(), SlotError::Closed);
        assert_eq!(t.acquire(0).await.unwrap_err(), SlotError::Closed);
    }

    #[tokio::test(start_paused = true)]
    async fn a_waiter_that_gives_up_leaves_the_queue_at_once() {
        let t = table(1, 2, &[None]);
        ready_worker(&t, 1);
        let _held = t.acquire(0).await.unwrap();
        // Two waiters time out, a third is dropped (its client went away).
        for _ in 0..2 {
            assert!(matches!(
                t.acquire(0).await,
                Err(SlotError::QueueTimeout(_))
            ));
        }
        let gone = tokio::spawn({
            let t = Arc::clone(&t);
            async move { t.acquire(0).await.map(|_| ()) }
        });
        tokio::task::yield_now().await;
        gone.abort();
        let _ = gone.await;
        assert_eq!(t.stats().queued, 0, "a waiter that gave up kept its place");
        // The queue has room for two again.
        let a = tokio::spawn({
            let t = Arc::clone(&t);
            async move { t.acquire(0).await.map(|_| ()) }
        });
        let b = tokio::spawn({
            let t = Arc::clone(&t);
            async move { t.acquire(0).await.map(|_| ()) }
        });
        tokio::task::yield_now().await;
        assert_eq!(t.stats().queued, 2);
        drop(_held);
        assert!(a.await.unwrap().is_ok());
        assert!(b.await.unwrap().is_ok());
    }

    #[tokio::test(start_paused = true)]
    async fn a_refusing_worker_is_skipped_and_the_request_moves_on() {
        let t = table(4, 4, &[None]);
        let w0 = ready_worker(&t, 1);
        let w1 = ready_worker(&t, 1);
        let s = t.acquire(0).await.unwrap();
        assert_eq!(s.worker(), w0);
        assert_eq!(t.fail(w0), Failed::OutOfRotation);
        let s = t.reroute(s).await.unwrap();
        assert_eq!(s.worker(), w1);
        assert_eq!(t.worker_in_flight(w0), 0);
        assert_eq!(t.stats().in_flight, 1);
        drop(s);
        // w0 stays out until its supervisor replaces it.
        assert_eq!(t.acquire(0).await.unwrap().worker(), w1);
    }

    #[tokio::test(start_paused = true)]
    async fn a_failing_server_is_out_for_fail_timeout_then_probed_back_in() {
        let t = table(8, 4, &[None]);
        t.set_fail_policy(FailPolicy {
            max_fails: 1,
            fail_timeout: Duration::from_secs(10),
        });
        let s0 = ready_worker(&t, 4);
        let s1 = ready_worker(&t, 4);
        let first = t.acquire(0).await.unwrap();
        assert_eq!(first.worker(), s0);
        assert_eq!(t.fail(s0), Failed::Down(Duration::from_secs(10)));
        drop(first);
        assert!(t.workers()[0].down_for.is_some());
        for _ in 0..3 {
            assert_eq!(t.acquire(0).await.unwrap().worker(), s1);
        }
        tokio::time::advance(Duration::from_secs(11)).await;
        // Back as a probe: one request at a time until one succeeds.
        let probe = t.acquire(0).await.unwrap();
        assert_eq!(probe.worker(), s0);
        assert!(probe.is_probe());
        let other = t.acquire(0).await.unwrap();
        assert_eq!(
            other.worker(),
            s1,
            "a second request went to a probed server"
        );
        assert!(t.succeeded(s0).is_some());
        assert!(t.workers()[0].down_for.is_none());
        let again = t.acquire(0).await.unwrap();
        assert_eq!(again.worker(), s0);
        drop((probe, other, again));
    }

    #[tokio::test(start_paused = true)]
    async fn when_every_server_is_down_the_first_due_back_is_tried() {
        let t = table(8, 4, &[None]);
        t.set_fail_policy(FailPolicy {
            max_fails: 1,
            fail_timeout: Duration::from_secs(10),
        });
        let s0 = ready_worker(&t, 1);
        let s1 = ready_worker(&t, 1);
        t.fail(s1);
        tokio::time::advance(Duration::from_secs(1)).await;
        t.fail(s0);
        let tried = t.acquire(0).await.unwrap();
        assert_eq!(tried.worker(), s1);
        // Once one server is up again, a request waits for it rather than trying a down one.
        assert!(t.succeeded(s1).is_some());
        let busy = tried;
        let waiting = tokio::spawn({
            let t = Arc::clone(&t);
            async move { t.acquire(0).await.map(|s| s.worker()) }
        });
        tokio::task::yield_now().await;
        assert_eq!(t.stats().queued, 1);
        drop(busy);
        assert_eq!(waiting.await.unwrap().unwrap(), s1);
    }

    #[tokio::test(start_paused = true)]
    async fn a_worker_due_for_a_memory_check_takes_nothing_until_checked() {
        let t = table(4, 4, &[None]);
        let w = ready_worker(&t, 1);
        t.check_memory_in(w, Some(1));
        drop(t.acquire(0).await.unwrap());
        assert_eq!(t.memory_checks().await, vec![w]);
        let waiting = tokio::spawn({
            let t = Arc::clone(&t);
            async move { t.acquire(0).await.map(|s| s.worker()) }
        });
        tokio::task::yield_now().await;
        assert_eq!(t.stats().queued, 1, "a worker being checked took a request");
        t.memory_checked(w, Some(2));
        assert_eq!(waiting.await.unwrap().unwrap(), w);
    }

    /// On serving threads, a freed slot goes to the oldest waiter on the thread that freed it,
    /// passing older waiters on other threads over at most MAX_PASSED times each.
    #[test]
    fn a_freed_slot_prefers_a_waiter_on_its_own_thread_within_a_bound() {
        let shards = crate::shards::Shards::start(2).unwrap();
        let t = table(1, 100, &[None]);
        ready_worker(&t, 1);
        let on = |shard: usize| shards.handles()[shard].clone();
        // The one slot, held on thread 0.
        let (slot_tx, slot_rx) = std::sync::mpsc::channel();
        let t0 = Arc::clone(&t);
        on(0).spawn(async move { slot_tx.send(t0.acquire(0).await.unwrap()).unwrap() });
        let mut held = slot_rx.recv().unwrap();
        // Waiters in this order: A on thread 1, then B, C, D on thread 0.
        let (done_tx, done_rx) = std::sync::mpsc::channel::<(&str, Slot)>();
        let queue = |name: &'static str, shard: usize| {
            let table = Arc::clone(&t);
            let done = done_tx.clone();
            let before = t.stats().queued;
            on(shard).spawn(async move {
                let slot = table.acquire(0).await.unwrap();
                done.send((name, slot)).unwrap();
            });
            while t.stats().queued == before {
                std::thread::yield_now();
            }
        };
        queue("A", 1);
        queue("B", 0);
        queue("C", 0);
        queue("D", 0);
        let mut order = Vec::new();
        for _ in 0..4 {
            // Freed on thread 0, as a request ending there frees it.
            let (freed_tx, freed_rx) = std::sync::mpsc::channel();
            on(0).spawn(async move {
                drop(held);
                freed_tx.send(()).unwrap();
            });
            freed_rx.recv().unwrap();
            let (name, slot) = done_rx.recv().unwrap();
            order.push(name);
            held = slot;
        }
        // B and C go first (thread 0's own), then A has been passed over twice and goes
        // before D.
        assert_eq!(order, ["B", "C", "A", "D"]);
        drop(held);
        assert_eq!(t.stats().in_flight, 0);
    }

    /// Many tasks hammer a small table; the caps hold at every instant and every slot comes
    /// back.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn caps_hold_under_contention() {
        let t = SlotTable::new(
            SlotLimits {
                max_conns: 3,
                queue_size: 1000,
                queue_timeout: Duration::from_secs(30),
            },
            &[Some(2), None],
        );
        for _ in 0..2 {
            ready_worker(&t, 2);
        }
        let peak = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let mut tasks = Vec::new();
        for i in 0..200 {
            let t = Arc::clone(&t);
            let peak = Arc::clone(&peak);
            tasks.push(tokio::spawn(async move {
                let slot = t.acquire(i % 2).await.unwrap();
                let now = t.stats().in_flight;
                peak.fetch_max(now, std::sync::atomic::Ordering::Relaxed);
                assert!(t.worker_in_flight(slot.worker()) <= 2);
                tokio::task::yield_now().await;
            }));
        }
        for task in tasks {
            task.await.unwrap();
        }
        assert!(peak.load(std::sync::atomic::Ordering::Relaxed) <= 3);
        assert_eq!(t.stats().in_flight, 0);
        assert_eq!(t.stats().queued, 0);
    }
}
