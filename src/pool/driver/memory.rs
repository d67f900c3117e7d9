//! The driver's memory samples: every worker's process tree once a second when `max_memory`
//! or `max_pool_memory` is set, and single workers after their requests for `max_memory`
//! (ARCHITECTURE.md decision 7, and "The state machine" for `max_pool_memory`).

use super::Driver;
use crate::pool::slots::WorkerId;
use crate::pool::state::{PoolEvent, WorkerKey, WorkerMemory};
use crate::process;

impl Driver {
    /// Samples every worker (a full walk of its process tree), then tells the state machine
    /// each worker's figure for `max_memory` and the whole pool's for `max_pool_memory`.
    pub(super) fn sample_memory(&mut self) -> bool {
        let recycle = self.state.spec().recycle;
        if recycle.max_memory.is_none() && recycle.max_pool_memory.is_none() {
            return false;
        }
        let php_children = self.template.php_children.is_some();
        let samples: Vec<(u64, WorkerMemory)> = self
            .workers
            .iter_mut()
            .filter(|(_, w)| w.pid != 0)
            .filter_map(|(key, w)| {
                let tree = process::process_tree(w.pid).ok()?;
                let usage = process::memory_of(w.pid, &tree).ok()?;
                w.tree = tree;
                let bytes = php_children
                    .then(|| process::php_children::largest_child(w.pid))
                    .flatten()
                    .unwrap_or(usage.bytes());
                let pool = WorkerMemory {
                    key: *key,
                    pss: usage.bytes(),
                    uss: usage.uss_bytes.unwrap_or(usage.rss_bytes),
                };
                Some((bytes, pool))
            })
            .collect();
        let mut stopped = false;
        if let Some(limit) = recycle.max_memory {
            for (bytes, sample) in &samples {
                let (key, bytes) = (sample.key, *bytes);
                stopped |= self.handle(PoolEvent::Memory { key, bytes });
                if bytes > limit {
                    // Counted once it stopped accepting: every request it was given.
                    self.sync_counts();
                    self.log_reading(key, bytes, "memory sample over max_memory");
                }
            }
        }
        if recycle.max_pool_memory.is_some() {
            let workers = samples.into_iter().map(|(_, s)| s).collect();
            stopped |= self.handle(PoolEvent::PoolMemory { workers });
        }
        stopped
    }

    /// Measures the workers the slot table holds after a request (see
    /// [`crate::pool::slots::SlotTable::check_memory_in`]), lets the state machine recycle
    /// those over `max_memory` (they then take no new request), and releases the others with
    /// the number of requests until their next check.
    pub(super) fn check_memory(&mut self, due: &[WorkerId]) -> bool {
        let limit = self.state.spec().recycle.max_memory;
        let mut stopped = false;
        for &id in due {
            let reading: Option<(WorkerKey, u64)> = self.by_id.get(&id).copied().and_then(|key| {
                let w = self.workers.get(&key).filter(|w| w.pid != 0)?;
                let bytes = match self.template.php_children {
                    Some(_) => process::php_children::largest_child(w.pid)?,
                    None => process::memory_of(w.pid, &w.tree).ok()?.bytes(),
                };
                Some((key, bytes))
            });
            let Some((key, bytes)) = reading else {
                // Gone meanwhile: nothing to hold it for.
                self.slots.memory_checked(id, None);
                continue;
            };
            stopped |= self.handle(PoolEvent::Memory { key, bytes });
            let next = limit
                .zip(self.workers.get_mut(&key))
                .map(|(limit, w)| w.memory.next_gap(limit, bytes));
            // Held since its request finished, so the count is exact.
            self.log_reading(key, bytes, "memory read after a request");
            self.slots.memory_checked(id, next);
        }
        stopped
    }

    /// One reading `max_memory` acted on, with the requests the worker had been given by
    /// then: whether a worker took a request once a reading showed it over the limit (or
    /// went unread for many) can be told after the fact from these lines alone, as
    /// tests/faults.rs does. The once-a-second samples are logged only over the limit, so
    /// that a pool at rest writes nothing.
    fn log_reading(&self, key: WorkerKey, bytes: u64, what: &str) {
        // After every request of a pool with max_memory: no lookups when nobody reads them.
        if !tracing::enabled!(tracing::Level::DEBUG) {
            return;
        }
        let pid = self.workers.get(&key).map_or(0, |w| w.pid);
        let requests = self.state.requests_given(key).unwrap_or(0);
        tracing::debug!(pool = %self.name, %key, pid, bytes, requests, "{what}");
    }
}
