//! A rolling restart that stops at its first replacement that cannot come up, and one
//! bounded by `max_surge` (ARCHITECTURE.md, "Generations and reload").
//!
//! Without `max_surge` a rolling restart goes through the one-at-a-time recycling of
//! `recycle_step`: one replacement booting at a time, the next started once the previous is
//! ready, while old workers still finishing their last request are not counted (live workers
//! stay within `max + 1`). With `max_surge = S` the old workers of the restart count until
//! they are reaped: a replacement starts only while fewer than S of them are still alive
//! beside their replacements, so live workers never number more than the pool's size + S.
//! `S = 0` retires an old worker first and lets its slot be refilled only once it is reaped,
//! the next one only once that refill is ready: the pool is one worker short at a time and
//! never above its size.

use std::time::Duration;

use super::machine::{Phase, PoolState, Worker};
use super::{Notice, RecycleReason, WorkerKey};

impl PoolState {
    /// Worker `failed` never came up: when it was replacing a worker of a rolling restart,
    /// the restart stops (see [`PoolState::rolling_failed_replacing`]).
    pub(super) fn rolling_failed(&mut self, failed: WorkerKey) {
        let replaces = self.workers.get(&failed).and_then(|w| w.replaces);
        self.rolling_failed_replacing(failed, replaces);
    }

    /// Whether `w` is due for a rolling restart bounded by `max_surge`, which
    /// [`PoolState::bounded_rolling_step`] handles rather than `recycle_step`.
    pub(super) fn surge_bounded(&self, w: &Worker) -> bool {
        self.spec.recycle.max_surge.is_some() && w.doomed == Some(RecycleReason::Rolling)
    }

    /// Old workers of the rolling restart that are not yet reaped but no longer count
    /// toward the pool's size: replaced by a booting worker, or on their way out.
    fn rolling_leaving(&self) -> usize {
        self.workers
            .values()
            .filter(|w| w.doomed == Some(RecycleReason::Rolling) && !w.counted())
            .count()
    }

    /// Floor slots held for old workers of a `max_surge = 0` restart until they are reaped:
    /// their replacement starts only then.
    pub(super) fn rolling_held(&self) -> usize {
        match self.spec.recycle.max_surge {
            Some(0) => self.rolling_leaving(),
            _ => 0,
        }
    }

    /// One step of a rolling restart bounded by `max_surge` (see the module documentation);
    /// false when there is none to take (no bound, or no worker due for the restart).
    pub(super) fn bounded_rolling_step(&mut self, now: Duration) -> bool {
        let Some(surge) = self.spec.recycle.max_surge else {
            return false;
        };
        let surge = usize::try_from(surge).unwrap_or(usize::MAX);
        let due = |p: &PoolState| {
            p.workers
                .values()
                .find(|w| w.counted() && w.doomed == Some(RecycleReason::Rolling))
                .map(|w| w.key)
        };
        if due(self).is_none() {
            return false;
        }
        // Another recycle's replacement is booting: one kind of replacement at a time.
        let other = self.workers.values().any(|w| {
            w.replaces
                .and_then(|old| self.workers.get(&old))
                .is_some_and(|o| o.doomed != Some(RecycleReason::Rolling))
        });
        if other {
            return true;
        }
        while let Some(old) = due(self) {
            let leaving = self.rolling_leaving();
            if surge == 0 {
                // The previous one's slot refilled and ready first: one worker short at most.
                let booting = self.workers.values().any(|w| w.phase == Phase::Booting);
                let short = self.deficit(None).0 > 0;
                if leaving == 0 && !booting && !short {
                    self.begin_retire(old, now);
                }
                break;
            }
            if leaving >= surge {
                break;
            }
            let (floor, growth) = self.deficit(Some(old));
            if floor + growth == 0 {
                self.begin_retire(old, now);
                continue;
            }
            if !self.may_spawn_within(now, self.spec.max() + surge) {
                break;
            }
            let new = self.spawn(now);
            if let Some(w) = self.workers.get_mut(&new) {
                w.replaces = Some(old);
            }
            if let Some(w) = self.workers.get_mut(&old) {
                w.replaced_by = Some(new);
            }
        }
        true
    }

    /// Worker `failed`, the replacement of `replaces`, never came up. When that is a rolling
    /// restart's, the restart stops: every worker still due for it keeps serving as it was,
    /// rather than being replaced by workers that cannot start (ARCHITECTURE.md,
    /// "Generations and reload").
    pub(super) fn rolling_failed_replacing(
        &mut self,
        failed: WorkerKey,
        replaces: Option<WorkerKey>,
    ) {
        let rolling = replaces
            .and_then(|old| self.workers.get(&old))
            .is_some_and(|o| o.doomed == Some(RecycleReason::Rolling));
        // With max_surge = 0 a replacement is a plain refill of a slot the restart emptied:
        // any worker failing to come up while the restart is under way stops it.
        let refill = self.spec.recycle.max_surge == Some(0)
            && self
                .workers
                .values()
                .any(|w| w.key != failed && w.doomed == Some(RecycleReason::Rolling));
        if !rolling && !refill {
            return;
        }
        let mut kept = 0;
        for w in self.workers.values_mut() {
            if w.doomed == Some(RecycleReason::Rolling) && w.active() {
                w.doomed = None;
                kept += 1;
            }
        }
        self.notice(Notice::RollingRestartStopped { key: failed, kept });
    }
}
