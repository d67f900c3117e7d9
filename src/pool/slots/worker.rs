//! The workers in a slot table: adding, retiring and removing them, their request counts for
//! the supervisor, and the health a request reports on them (failures, probes, memory checks).

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use super::{SlotTable, State, WorkerId};
use crate::config::BackendAddress;

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
pub(super) struct WorkerEntry {
    pub(super) generation: u64,
    pub(super) address: Arc<BackendAddress>,
    /// Requests this worker has been given.
    pub(super) started: u64,
    /// Requests it may be given in all (`max_requests` plus jitter); it stops taking new
    /// ones when `started` reaches it, so a recycled worker never gets one request too many.
    pub(super) budget: Option<u64>,
    /// Requests the worker can serve at once (1 for php-cgi and lsphp).
    pub(super) concurrency: usize,
    pub(super) in_flight: usize,
    /// False while the worker starts, after it was told to retire, or once it is gone.
    pub(super) accepting: bool,
    /// The entry no longer names a live worker; reused once `in_flight` is 0.
    pub(super) removed: bool,
    /// Failures counted against a server of a pool of servers, and when the last one was.
    pub(super) fails: u32,
    pub(super) last_fail: Option<Instant>,
    /// Out of rotation until then (pools of servers).
    pub(super) down_until: Option<Instant>,
    /// When the server went out of rotation; cleared by its next success.
    pub(super) down_since: Option<Instant>,
    /// Held out of rotation while its supervisor measures its memory after a request.
    pub(super) checking: bool,
    /// Requests finished on it; with `started`, what the supervisor has not heard of yet
    /// is `started - reported_started` and `finished - reported_finished`.
    pub(super) finished: u64,
    pub(super) reported_started: u64,
    pub(super) reported_finished: u64,
    /// The supervisor waits for this worker's last request to finish (it is to stop).
    pub(super) watch_drain: bool,
    /// The worker's process, when corral spawned it (for the access log).
    pub(super) pid: Option<u32>,
    /// Requests to finish before the next memory check; `None` = no checks.
    pub(super) check_in: Option<u64>,
    /// When each slot in use on it was taken, one lane per unit of concurrency (for
    /// status: [`SlotTable::ages`]), and the lanes free now, the one free longest first: a
    /// slot's lane also names the kept connection it uses on a pool whose connections are
    /// taken in turn (`Connections`, src/backend/connection.rs).
    pub(super) lanes: Vec<Option<Instant>>,
    pub(super) free_lanes: VecDeque<u32>,
}

impl WorkerEntry {
    pub(super) fn fresh(
        concurrency: usize,
        address: BackendAddress,
        budget: Option<u64>,
    ) -> WorkerEntry {
        let concurrency = concurrency.max(1);
        let lanes = u32::try_from(concurrency).unwrap_or(u32::MAX);
        WorkerEntry {
            lanes: vec![None; concurrency],
            free_lanes: (0..lanes).collect(),
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
    pub(super) fn capacity(&self) -> usize {
        if self.down_since.is_some() {
            1
        } else {
            self.concurrency
        }
    }
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

    pub(super) fn entry(st: &mut State, id: WorkerId) -> Option<&mut WorkerEntry> {
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

    /// Asks for a wake-up of [`SlotTable::demand`] at the next request, if the pool is at
    /// rest now: nothing in flight or waiting, and every request counted already taken by
    /// the supervisor ([`SlotTable::take_request_deltas`]). True when asked; false when a
    /// request came since the supervisor last took the counts. A supervisor at rest ticks
    /// seldom (`src/pool/driver/tick.rs`): this lets it learn of the first request after
    /// a rest at once. Looking and asking under one lock leaves no gap for a request to
    /// slip through unheard.
    pub fn wake_at_next_request(&self) -> bool {
        let mut st = self.lock();
        let rest = st.in_flight == 0
            && st.waiters.is_empty()
            && st
                .workers
                .iter()
                .all(|w| w.started == w.reported_started && w.finished == w.reported_finished);
        st.wake_at_next_request = rest;
        rest
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
}
