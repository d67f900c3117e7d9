//! Retiring and stopping workers: marking one due for recycling, retiring it (no new
//! request, then the stop signal once idle), killing it, the tick's start and kill
//! timeouts and lifetime check, when the next tick can do something, and the pool's stop
//! sequence (graceful or not).

use std::time::Duration;

use super::machine::{Phase, PoolState};
use super::{Notice, PoolAction, RecycleReason, StopSignal, WorkerKey};

impl PoolState {
    /// Marks a worker due for recycling; it keeps serving until replaced.
    pub(super) fn doom(&mut self, key: WorkerKey, reason: RecycleReason) {
        if let Some(w) = self.workers.get_mut(&key) {
            if w.active() && w.doomed.is_none() {
                w.doomed = Some(reason);
                self.counters.recycled.add(reason);
                self.notice(Notice::Recycling { key, reason });
            }
        }
    }

    /// Recycles a worker that must take no further request: retire it at once; the sizing
    /// policy starts its replacement.
    pub(super) fn recycle_now(&mut self, key: WorkerKey, reason: RecycleReason, now: Duration) {
        self.doom(key, reason);
        self.begin_retire(key, now);
    }

    /// No new requests; the stop signal follows once the worker is idle.
    pub(super) fn begin_retire(&mut self, key: WorkerKey, now: Duration) {
        let Some(w) = self.workers.get_mut(&key) else {
            return;
        };
        if !w.active() {
            return;
        }
        w.phase = Phase::Retiring;
        let partner = w.replaced_by.take().or(w.replaces.take());
        if let Some(p) = partner.and_then(|p| self.workers.get_mut(&p)) {
            p.replaced_by = None;
            p.replaces = None;
        }
        self.set_accepting(key, false);
        self.maybe_signal(key, now);
    }

    pub(super) fn maybe_signal(&mut self, key: WorkerKey, now: Duration) {
        let Some(w) = self.workers.get_mut(&key) else {
            return;
        };
        if let (Phase::Retiring, 0, Some(pid)) = (w.phase, w.in_flight, w.pid) {
            w.phase = Phase::Signalled(now);
            self.out.push(PoolAction::Signal {
                key,
                pid,
                signal: StopSignal::Term,
            });
        }
    }

    pub(super) fn kill(&mut self, key: WorkerKey, now: Duration) {
        self.set_accepting(key, false);
        let Some(w) = self.workers.get_mut(&key) else {
            return;
        };
        if matches!(w.phase, Phase::Killed(_)) {
            return;
        }
        w.phase = Phase::Killed(now);
        let partner = w.replaced_by.take().or(w.replaces.take());
        let pid = w.pid;
        if let Some(p) = partner.and_then(|p| self.workers.get_mut(&p)) {
            p.replaced_by = None;
            p.replaces = None;
        }
        if let Some(pid) = pid {
            self.out.push(PoolAction::Kill { key, pid });
        }
    }

    pub(super) fn tick(&mut self, now: Duration) {
        let keys: Vec<WorkerKey> = self.workers.keys().copied().collect();
        for key in keys {
            let Some(w) = self.workers.get_mut(&key) else {
                continue;
            };
            match w.phase {
                Phase::Booting if now.saturating_sub(w.spawned_at) >= self.spec.start_timeout => {
                    w.crash_counted = true;
                    self.counters.start_timeouts += 1;
                    let after = self.spec.start_timeout;
                    self.notice(Notice::StartTimedOut { key, after });
                    self.crash(now);
                    self.rolling_failed(key);
                    self.kill(key, now);
                }
                Phase::Signalled(at) if now.saturating_sub(at) >= self.spec.kill_timeout => {
                    self.counters.kill_timeouts += 1;
                    let after = self.spec.kill_timeout;
                    self.notice(Notice::KillTimedOut { key, after });
                    self.kill(key, now);
                }
                Phase::Ready => {
                    let age = now.saturating_sub(w.spawned_at);
                    if age >= self.spec.stable_after && w.spawned_at >= self.streak_start {
                        self.end_crash_streak();
                    }
                    if self.spec.recycle.max_lifetime.is_some_and(|l| age >= l) {
                        self.doom(key, RecycleReason::MaxLifetime);
                    }
                }
                _ => {}
            }
        }
        if self.stopping.is_none() {
            self.shrink(now);
        }
    }

    /// When the next `Tick` can change something if no other event comes first, so that a
    /// driver at rest need not tick at all: `None` when nothing is timed, `Some(ZERO)` when
    /// something moves on only at ticks (the next regular one is due), else the earliest
    /// deadline. A tick at that time always clears the deadline it was woken for, so a
    /// driver that ticks at it never spins.
    ///
    /// "Only at ticks": a retiring or busy worker (its last request is learnt from the slot
    /// table's counts, which the driver reads at its ticks), one due for recycling, queued
    /// demand, and spawns held back by the spawn rate or the `max + 1` bound, which `tick`
    /// and `reconcile` look at again each time.
    pub fn next_tick(&self, now: Duration) -> Option<Duration> {
        if !self.started {
            return None;
        }
        let mut next: Option<Duration> = None;
        let mut at = |t: Duration| next = Some(next.map_or(t, |n| n.min(t)));
        for w in self.workers.values() {
            if w.active() && w.doomed.is_some() {
                at(Duration::ZERO);
            }
            match w.phase {
                Phase::Booting => at(w.spawned_at + self.spec.start_timeout),
                Phase::Signalled(since) => at(since + self.spec.kill_timeout),
                Phase::Retiring => at(Duration::ZERO),
                Phase::Ready if w.in_flight > 0 => at(Duration::ZERO),
                Phase::Ready => {
                    if self.crashes > 0 && w.spawned_at >= self.streak_start {
                        at(w.spawned_at + self.spec.stable_after);
                    }
                    if let Some(l) = self
                        .spec
                        .recycle
                        .max_lifetime
                        .filter(|_| w.doomed.is_none())
                    {
                        at(w.spawned_at + l);
                    }
                }
                // Its exit is an event of its own.
                Phase::Killed(_) => {}
            }
        }
        if self.stopping.is_some() {
            return next;
        }
        if self.demand > 0 {
            at(Duration::ZERO);
        }
        let (floor, growth) = self.deficit(None);
        if floor + growth > 0 {
            let backoff = self.crashes > 0 && now < self.backoff_until;
            at(if backoff {
                self.backoff_until
            } else {
                Duration::ZERO
            });
        }
        if let Some(t) = self.shrink_due() {
            at(t);
        }
        next
    }

    pub(super) fn stop(&mut self, graceful: bool, now: Duration) {
        match self.stopping {
            None => {}
            Some(true) if !graceful => {}
            Some(_) => return,
        }
        self.stopping = Some(graceful);
        self.demand = 0;
        let keys: Vec<WorkerKey> = self.workers.keys().copied().collect();
        for key in keys {
            if graceful {
                self.begin_retire(key, now);
            } else {
                self.kill(key, now);
            }
        }
    }
}
