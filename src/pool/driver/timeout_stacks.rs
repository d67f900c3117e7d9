//! The driver's side of a hard timeout that tells why: before a worker of corral's launchers
//! is killed for a request past `request_timeout`, it is asked for its stacks
//! ([`crate::process::stacks`]), which its stderr reader logs, and killed once the dump has
//! ended or [`STACKS_BOUND`] (one second) has passed. The worker leaves rotation at once; the client has
//! had its 504 already (the gateway answers before it tells the driver). ARCHITECTURE.md,
//! "Stacks of a stuck worker".

use std::sync::Arc;

use super::{Driver, Report};
use crate::pool::state::{PoolEvent, WorkerKey};
use crate::process::stacks::{NoStacks, ASK_BOUND as STACKS_BOUND};

impl Driver {
    /// The pool's workers run corral's launchers, which dump their stacks when asked.
    pub fn set_stack_dumps(&mut self) {
        self.stack_dumps = true;
    }

    /// A request on worker `key` ran past `request_timeout`: kill it, asking for its stacks
    /// first when it can tell them (the kill then follows as [`Report::StacksTaken`]).
    pub(super) fn request_timed_out(&mut self, key: WorkerKey) -> bool {
        let Some((id, pid)) = self.workers.get(&key).map(|w| (w.id, w.pid)) else {
            return false;
        };
        if !self.stack_dumps || pid == 0 {
            return self.handle(PoolEvent::RequestTimedOut { key });
        }
        // No new request meets the stuck worker while it dumps.
        self.slots.set_accepting(id, false);
        if let Some(w) = self.workers.get(&key) {
            self.connections.forget(&w.address);
        }
        let tail = Arc::clone(&self.tail);
        let reports = self.reports_tx.clone();
        let pool = Arc::clone(&self.name);
        tokio::spawn(async move {
            tracing::warn!(
                pool = %pool,
                pid,
                "a request ran past request_timeout: asking the worker for its stacks before it is killed"
            );
            match tail.stacks.ask(pid, STACKS_BOUND).await {
                Ok(stacks) if stacks.complete => tracing::warn!(
                    pool = %pool,
                    pid,
                    lines = stacks.lines.len(),
                    "the worker's stacks at request_timeout are logged above"
                ),
                Ok(stacks) => tracing::warn!(
                    pool = %pool,
                    pid,
                    lines = stacks.lines.len(),
                    "the worker did not finish its stack dump within {STACKS_BOUND:?} (what it wrote is above)"
                ),
                // A dump asked for by the slow-request log ends within the same bound.
                Err(NoStacks::Busy) => tokio::time::sleep(STACKS_BOUND).await,
                Err(NoStacks::Gone) => {}
            }
            let _ = reports.send(Report::StacksTaken(key));
        });
        false
    }
}
