//! The pool state machine proper: the worker table, event handling and crash accounting.
//! How many workers the pool wants lives in `sizing`; retiring, killing, the tick's
//! timeouts, when the next tick is due, and the stop sequence in `retire`.

use std::collections::BTreeMap;
use std::time::Duration;

use super::sizing::SpawnRate;
use super::spec::{PoolSpec, Rng};
use super::status::PoolCounters;
use super::{ExitKind, Notice, PoolAction, PoolEvent, RecycleReason, WorkerKey};

/// Where a worker is in its life. Workers leave the table when they exit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Phase {
    /// Spawn asked for, not ready yet (the pid may not be known yet).
    Booting,
    /// Ready and taking requests (a worker due for recycling too, until its replacement is
    /// ready).
    Ready,
    /// Takes no new request; signalled once its last request finishes.
    Retiring,
    /// The stop signal was sent at this time.
    Signalled(Duration),
    /// SIGKILL was sent (or is sent as soon as the pid is known) at this time.
    Killed(Duration),
}

/// One worker as the state machine knows it.
#[derive(Debug, Clone)]
pub(super) struct Worker {
    pub(super) key: WorkerKey,
    pub(super) pid: Option<u32>,
    pub(super) phase: Phase,
    pub(super) spawned_at: Duration,
    /// What the driver was last told; Accept actions are emitted on change only.
    pub(super) accepting: bool,
    pub(super) in_flight: usize,
    /// Requests started: what `max_requests` counts.
    pub(super) started: u64,
    /// Requests finished.
    pub(super) served: u64,
    /// Requests after which the worker is recycled (`max_requests` + its jitter).
    pub(super) budget: Option<u64>,
    /// When `in_flight` last became 0.
    pub(super) idle_since: Duration,
    pub(super) memory: Option<u64>,
    /// Due for recycling: keeps serving until its replacement is ready.
    pub(super) doomed: Option<RecycleReason>,
    /// The worker started to replace this one.
    pub(super) replaced_by: Option<WorkerKey>,
    /// The worker this one replaces (retired when this one is ready).
    pub(super) replaces: Option<WorkerKey>,
    /// Its failure was already counted as a crash (start timeout), so its exit is expected.
    pub(super) crash_counted: bool,
}

impl Worker {
    /// Booting or ready: not on its way out.
    pub(super) fn active(&self) -> bool {
        matches!(self.phase, Phase::Booting | Phase::Ready)
    }

    /// Counts toward the pool's size: active and not already replaced by a starting worker.
    pub(super) fn counted(&self) -> bool {
        self.active() && self.replaced_by.is_none()
    }
}

/// One pool's supervisor. See the module documentation for the contract.
#[derive(Debug, Clone)]
pub struct PoolState {
    pub(super) spec: PoolSpec,
    rng: Rng,
    next_key: u64,
    pub(super) workers: BTreeMap<WorkerKey, Worker>,
    /// Requests queued without a slot, as last reported.
    pub(super) demand: usize,
    /// Consecutive crashes, and when the streak began.
    pub(super) crashes: u32,
    pub(super) streak_start: Duration,
    /// No spawn before this while `crashes > 0`.
    pub(super) backoff_until: Duration,
    pub(super) throttled: bool,
    pub(super) started: bool,
    /// `Some(graceful)` once `Stop` arrived.
    pub(super) stopping: Option<bool>,
    stopped_sent: bool,
    pub(super) rate: SpawnRate,
    pub(super) counters: PoolCounters,
    /// PSS summed over the workers at the last pool-wide sample (`max_pool_memory`).
    pub(super) memory_total: Option<u64>,
    /// The workers serve requests corral never sees (a direct pool): an exit with status 0
    /// is php-cgi stopping after its `PHP_FCGI_MAX_REQUESTS`, not a crash.
    unseen: bool,
    pub(super) out: Vec<PoolAction>,
}

impl PoolState {
    /// A pool with no workers; `seed` drives the `max_requests` jitter.
    pub fn new(spec: PoolSpec, seed: u64) -> PoolState {
        PoolState {
            spec,
            rng: Rng::new(seed),
            next_key: 0,
            workers: BTreeMap::new(),
            demand: 0,
            crashes: 0,
            streak_start: Duration::ZERO,
            backoff_until: Duration::ZERO,
            throttled: false,
            started: false,
            stopping: None,
            stopped_sent: false,
            rate: SpawnRate::default(),
            counters: PoolCounters::default(),
            memory_total: None,
            unseen: false,
            out: Vec::new(),
        }
    }

    /// Marks the pool's requests as unseen by corral (a direct pool; see `unseen`).
    pub fn serves_unseen(&mut self) {
        self.unseen = true;
    }

    /// The spec the pool runs.
    pub fn spec(&self) -> &PoolSpec {
        &self.spec
    }

    /// How many requests worker `key` may be given before it is recycled (`max_requests`
    /// plus its jitter), so the slot table can stop at exactly that many.
    pub fn budget(&self, key: WorkerKey) -> Option<u64> {
        self.workers.get(&key).and_then(|w| w.budget)
    }

    /// The budget the slot table stops worker `key` at: none where the worker serves on
    /// past it until replaced ([`PoolSpec::group_of_children`]).
    pub fn slot_budget(&self, key: WorkerKey) -> Option<u64> {
        self.budget(key).filter(|_| !self.spec.group_of_children)
    }

    /// Handles one event at time `now` (monotonic, since any fixed epoch) and returns what
    /// the driver must do, in order.
    pub fn on_event(&mut self, ev: PoolEvent, now: Duration) -> Vec<PoolAction> {
        match ev {
            PoolEvent::Start => self.started = true,
            PoolEvent::Tick => self.tick(now),
            PoolEvent::Spawned { key, pid } => self.spawned(key, pid, now),
            PoolEvent::SpawnFailed { key, reason } => {
                self.rolling_failed(key);
                if self.workers.remove(&key).is_some() {
                    self.unlink(key);
                    self.counters.spawn_failed += 1;
                    self.notice(Notice::SpawnFailed { key, reason });
                    self.crash(now);
                    self.out.push(PoolAction::Forget { key });
                }
            }
            PoolEvent::Ready { key } => self.ready(key, now),
            PoolEvent::Exited { key, status } => self.exited(key, status, now),
            PoolEvent::RequestStarted { key } => self.request_started(key, now),
            PoolEvent::RequestFinished { key } => self.request_finished(key, now),
            PoolEvent::Seen { key, busy, ran } => self.seen(key, busy, ran, now),
            PoolEvent::Demand { waiting } => self.demand = waiting,
            PoolEvent::PoolMemory { workers } => self.pool_memory(&workers),
            PoolEvent::Memory { key, bytes } => {
                let over = self.spec.recycle.max_memory.is_some_and(|m| bytes > m);
                if let Some(w) = self.workers.get_mut(&key) {
                    w.memory = Some(bytes);
                    if over && w.active() {
                        self.recycle_now(key, RecycleReason::MaxMemory, now);
                    }
                }
            }
            PoolEvent::ChildStopped { key, reason } => self.child_stopped(key, reason),
            PoolEvent::RequestTimedOut { key } => {
                if self
                    .workers
                    .get(&key)
                    .is_some_and(|w| !matches!(w.phase, Phase::Killed(_)))
                {
                    self.counters.request_timeouts += 1;
                    let killed = !self.spec.group_of_children;
                    self.notice(Notice::RequestTimedOut { key, killed });
                    if killed {
                        self.kill(key, now);
                    } else {
                        // Out of rotation now; stopped (its stuck child killed after
                        // kill_timeout) once its other children are done.
                        self.doom(key, RecycleReason::Suspect);
                        self.set_accepting(key, false);
                    }
                }
            }
            PoolEvent::Stop { graceful } => self.stop(graceful, now),
            PoolEvent::RollingRestart => {
                let keys: Vec<WorkerKey> = self.active_keys();
                for key in keys {
                    self.doom(key, RecycleReason::Rolling);
                }
            }
            PoolEvent::RollingRestartOf { keys } => {
                for key in keys {
                    self.doom(key, RecycleReason::Rolling);
                }
            }
            PoolEvent::Refused { key } => {
                if self.workers.get(&key).is_some_and(|w| w.active()) {
                    if let Some(w) = self.workers.get_mut(&key) {
                        // Killing it makes its exit expected; the failure is counted here.
                        w.crash_counted = true;
                    }
                    self.counters.refused += 1;
                    self.notice(Notice::Refused { key });
                    self.crash(now);
                    self.kill(key, now);
                }
            }
            PoolEvent::Suspect { key } => {
                if self.workers.get(&key).is_some_and(|w| w.active()) {
                    self.counters.suspect += 1;
                    self.doom(key, RecycleReason::Suspect);
                    // The slot table stopped giving it requests already; say so here too.
                    self.set_accepting(key, false);
                }
            }
        }
        self.reconcile(now);
        if self.stopping.is_some() && self.workers.is_empty() && !self.stopped_sent {
            self.stopped_sent = true;
            self.out.push(PoolAction::Stopped);
        }
        std::mem::take(&mut self.out)
    }

    fn active_keys(&self) -> Vec<WorkerKey> {
        self.workers
            .values()
            .filter(|w| w.active())
            .map(|w| w.key)
            .collect()
    }

    pub(super) fn notice(&mut self, n: Notice) {
        self.out.push(PoolAction::Notice(n));
    }

    /// Workers not yet reaped.
    pub(super) fn live(&self) -> usize {
        self.workers.len()
    }

    fn spawned(&mut self, key: WorkerKey, pid: u32, now: Duration) {
        let Some(w) = self.workers.get_mut(&key) else {
            return;
        };
        if w.pid.is_some() {
            return;
        }
        w.pid = Some(pid);
        match w.phase {
            // Killed or retired before its pid was known: finish the job now.
            Phase::Killed(_) => self.out.push(PoolAction::Kill { key, pid }),
            Phase::Retiring => self.maybe_signal(key, now),
            _ => {}
        }
    }

    fn ready(&mut self, key: WorkerKey, now: Duration) {
        let Some(w) = self.workers.get_mut(&key) else {
            return;
        };
        if w.phase != Phase::Booting {
            return;
        }
        w.phase = Phase::Ready;
        w.idle_since = now;
        self.counters.ready += 1;
        let replaces = w.replaces.take();
        self.set_accepting(key, true);
        if let Some(old) = replaces {
            if let Some(o) = self.workers.get_mut(&old) {
                o.replaced_by = None;
            }
            self.begin_retire(old, now);
        }
    }

    fn exited(&mut self, key: WorkerKey, status: ExitKind, now: Duration) {
        let Some(w) = self.workers.remove(&key) else {
            return;
        };
        // Its partner links are read below (a failed replacement stops a rolling restart).
        self.unlink(key);
        self.counters.exited += 1;
        // A suspect worker asked to stop may have died on its own first (that is often why
        // it was suspect): a SIGKILL corral did not send is still a crash.
        let killed_by_other = w.doomed == Some(RecycleReason::Suspect)
            && matches!(w.phase, Phase::Signalled(_))
            && status == ExitKind::Signal(nix::sys::signal::Signal::SIGKILL as i32);
        let asked = matches!(w.phase, Phase::Signalled(_) | Phase::Killed(_)) && !killed_by_other;
        if !asked && !w.crash_counted {
            // A direct pool's php-cgi exits 0 only after PHP_FCGI_MAX_REQUESTS (or when asked),
            // possibly before corral saw it serve: its requests are unseen, and a worker busy
            // from its first accept to its last may never have been seen ready. Commands that
            // exit 0 without serving (php-cgi -v, -i, ...) are refused by the configuration.
            let served = w.served > 0 || self.unseen;
            if status == ExitKind::Code(0) && served {
                // An interpreter that stops on its own after serving (php-cgi's
                // PHP_FCGI_MAX_REQUESTS) is replaced like a recycled one, without backoff.
                self.counters.exited_on_own += 1;
            } else {
                self.counters.crashed += 1;
                self.notice(Notice::Crashed {
                    key,
                    status,
                    in_flight: w.in_flight,
                });
                self.crash(now);
                if w.phase == Phase::Booting {
                    self.rolling_failed_replacing(key, w.replaces);
                }
            }
        }
        self.out.push(PoolAction::Forget { key });
    }

    /// Drops the replacement link between `key` (just removed) and its partner.
    fn unlink(&mut self, key: WorkerKey) {
        for w in self.workers.values_mut() {
            if w.replaced_by == Some(key) {
                w.replaced_by = None;
            }
            if w.replaces == Some(key) {
                w.replaces = None;
            }
        }
    }

    fn request_started(&mut self, key: WorkerKey, now: Duration) {
        let Some(w) = self.workers.get_mut(&key) else {
            return;
        };
        w.in_flight += 1;
        w.started += 1;
        let at_budget = w.budget.is_some_and(|b| w.started >= b) && w.active();
        if at_budget && self.spec.group_of_children {
            self.doom(key, RecycleReason::MaxRequests);
        } else if at_budget {
            self.recycle_now(key, RecycleReason::MaxRequests, now);
        }
    }

    fn request_finished(&mut self, key: WorkerKey, now: Duration) {
        let Some(w) = self.workers.get_mut(&key) else {
            return;
        };
        w.in_flight = w.in_flight.saturating_sub(1);
        w.served += 1;
        if w.in_flight == 0 {
            w.idle_since = now;
        }
        if w.spawned_at >= self.streak_start {
            self.end_crash_streak();
        }
        self.maybe_signal(key, now);
    }

    /// Counts a crash: the next spawn waits for the backoff delay.
    pub(super) fn crash(&mut self, now: Duration) {
        if self.crashes == 0 {
            self.streak_start = now;
        }
        self.crashes = self.crashes.saturating_add(1);
        let delay = self.spec.backoff(self.crashes);
        self.backoff_until = self.backoff_until.max(now + delay);
        if self.crashes >= self.spec.crash_loop_after && !self.throttled {
            self.throttled = true;
            self.counters.throttled += 1;
            self.notice(Notice::CrashLoop {
                crashes: self.crashes,
                retry_in: delay,
            });
        }
    }

    /// A worker started since the crashes began proved healthy.
    pub(super) fn end_crash_streak(&mut self) {
        if self.crashes == 0 {
            return;
        }
        self.crashes = 0;
        self.backoff_until = Duration::ZERO;
        if self.throttled {
            self.throttled = false;
            self.notice(Notice::CrashLoopOver);
        }
    }

    /// Whether a spawn may be issued now: not stopping, below the hard bound of `max + 1`
    /// live workers, and outside any crash backoff.
    pub(super) fn may_spawn(&self, now: Duration) -> bool {
        self.may_spawn_within(now, self.spec.max() + 1)
    }

    /// Like [`PoolState::may_spawn`], with `bound` live workers at most once it is issued.
    pub(super) fn may_spawn_within(&self, now: Duration, bound: usize) -> bool {
        self.started
            && self.stopping.is_none()
            && self.live() < bound
            && (self.crashes == 0 || now >= self.backoff_until)
    }

    /// Issues a spawn (the caller checked `may_spawn`).
    pub(super) fn spawn(&mut self, now: Duration) -> WorkerKey {
        let key = WorkerKey(self.next_key);
        self.next_key += 1;
        let r = self.spec.recycle;
        let budget = match r.max_requests {
            Some(m) if m > 0 => Some(m.saturating_add(self.rng.up_to(r.max_requests_jitter))),
            _ => None,
        };
        self.workers.insert(
            key,
            Worker {
                key,
                pid: None,
                phase: Phase::Booting,
                spawned_at: now,
                accepting: false,
                in_flight: 0,
                started: 0,
                served: 0,
                budget,
                idle_since: now,
                memory: None,
                doomed: None,
                replaced_by: None,
                replaces: None,
                crash_counted: false,
            },
        );
        self.counters.spawned += 1;
        if self.crashes > 0 {
            // While crashing, one attempt per backoff delay.
            self.backoff_until = now + self.spec.backoff(self.crashes);
        }
        self.out.push(PoolAction::Spawn { key });
        key
    }

    pub(super) fn set_accepting(&mut self, key: WorkerKey, on: bool) {
        if let Some(w) = self.workers.get_mut(&key) {
            if w.accepting != on {
                w.accepting = on;
                self.out.push(PoolAction::Accept { key, on });
            }
        }
    }

    /// Starts replacements and new workers as the policy and the bounds allow.
    fn reconcile(&mut self, now: Duration) {
        if !self.started || self.stopping.is_some() {
            return;
        }
        self.recycle_step(now);
        self.grow(now);
    }

    /// Handles the oldest worker due for recycling, one at a time: start its replacement if
    /// the pool needs one (it is retired when the replacement is ready), else retire it now.
    fn recycle_step(&mut self, now: Duration) {
        if self.bounded_rolling_step(now) {
            return;
        }
        if self.workers.values().any(|w| w.replaces.is_some()) {
            return;
        }
        let Some(old) = self
            .workers
            .values()
            .find(|w| w.counted() && w.doomed.is_some() && !self.surge_bounded(w))
            .map(|w| w.key)
        else {
            return;
        };
        let (floor, growth) = self.deficit(Some(old));
        if floor + growth == 0 {
            self.begin_retire(old, now);
        } else if self.may_spawn(now) {
            let new = self.spawn(now);
            if let Some(w) = self.workers.get_mut(&new) {
                w.replaces = Some(old);
            }
            if let Some(w) = self.workers.get_mut(&old) {
                w.replaced_by = Some(new);
            }
        }
    }
}
