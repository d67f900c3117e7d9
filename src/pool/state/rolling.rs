//! A rolling restart that stops at its first replacement that cannot come up
//! (ARCHITECTURE.md, "Generations and reload").

use super::machine::PoolState;
use super::{Notice, RecycleReason, WorkerKey};

impl PoolState {
    /// Worker `failed` never came up: when it was replacing a worker of a rolling restart,
    /// the restart stops (see [`PoolState::rolling_failed_replacing`]).
    pub(super) fn rolling_failed(&mut self, failed: WorkerKey) {
        let replaces = self.workers.get(&failed).and_then(|w| w.replaces);
        self.rolling_failed_replacing(failed, replaces);
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
        if !rolling {
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
