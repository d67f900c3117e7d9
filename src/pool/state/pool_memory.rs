//! `max_pool_memory`: a memory budget for the whole pool (ARCHITECTURE.md, "The state
//! machine"). The driver samples every worker's PSS and private memory (USS) together; when
//! the PSS sums to more than the budget, the worker holding the most private memory (what
//! replacing it gives back: shared pages stay with the others) is recycled, replacement
//! first, and retired at its next request boundary once the replacement is ready. One at a
//! time: nothing more is judged until that worker has been reaped, so the next sample no
//! longer counts it.

use super::machine::{Phase, PoolState};
use super::{RecycleReason, WorkerMemory};

impl PoolState {
    /// Handles a pool-wide memory sample.
    pub(super) fn pool_memory(&mut self, samples: &[WorkerMemory]) {
        let known = |s: &&WorkerMemory| self.workers.contains_key(&s.key);
        let total: u64 = samples.iter().filter(known).map(|s| s.pss).sum();
        self.memory_total = Some(total);
        let Some(budget) = self.spec.recycle.max_pool_memory else {
            return;
        };
        if total <= budget || self.stopping.is_some() {
            return;
        }
        let pending = self
            .workers
            .values()
            .any(|w| w.doomed == Some(RecycleReason::MaxPoolMemory));
        if pending {
            return;
        }
        let largest = samples
            .iter()
            .filter(|s| {
                self.workers
                    .get(&s.key)
                    .is_some_and(|w| w.phase == Phase::Ready && w.counted() && w.doomed.is_none())
            })
            .max_by_key(|s| (s.uss, std::cmp::Reverse(s.key)))
            .map(|s| s.key);
        if let Some(key) = largest {
            self.doom(key, RecycleReason::MaxPoolMemory);
        }
    }
}
