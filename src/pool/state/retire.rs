//! Retiring and stopping workers: marking one due for recycling, retiring it (no new
//! request, then the stop signal once idle), killing it, the tick's start and kill
//! timeouts and lifetime check, and the pool's stop sequence (graceful or not).

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
