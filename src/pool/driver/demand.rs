//! Whether a request that starts waiting for a slot wakes the driver.
//!
//! Under load nearly every request waits for a slot (more clients than workers), and each
//! wake-up costs the serving thread a hand-off to the driver's runtime (an eventfd write),
//! the driver a turn on the slot table's lock (which the serving thread then finds taken) and
//! a status snapshot: measured on a static pool of 2 native WSGI workers at c=25, 0.73
//! writes, 0.2 futex calls and about one context switch per request in corral's process. The
//! wake-up only serves a pool that may spawn for its queue: a dynamic or ondemand pool below
//! `max` workers. Otherwise the table leaves the driver asleep, and the driver reads the
//! queue's length at its next tick (for status, and for growth should room appear between
//! its own events, which it re-checks after each). A worker that takes the last request of
//! its `max_requests` budget wakes the driver in any case, so it is replaced at once rather
//! than at the tick. A reforking pool needs no more: its promotions start at the tick, and
//! the drain of the worker being promoted, the new template's `ready` and the replacement of
//! the older workers are events of their own. (It kept the wake-up per waiting request while
//! tests/refork.rs failed under load without it; the cause was a retiring template killing
//! the one promoted from it, fixed in src/pool/driver/preload.rs.)

use super::Driver;
use crate::config::Sizing;
use crate::pool::state::PoolSpec;

impl Driver {
    /// Tells the slot table whether a waiting request should wake this driver now; called
    /// after every event the driver handles, it takes the table's lock only on a change.
    pub(super) fn sync_demand_wake(&mut self) {
        let wake = wakes_per_waiting_request(self.state.spec(), self.workers.len());
        if self.demand_wake != Some(wake) {
            self.demand_wake = Some(wake);
            self.slots.wake_on_demand(wake);
        }
    }
}

/// Whether a pool of `spec` with `workers` workers may spawn for its queue, and so wants a
/// wake-up per waiting request: a dynamic or ondemand pool below `max`, reforking or not.
fn wakes_per_waiting_request(spec: &PoolSpec, workers: usize) -> bool {
    !matches!(spec.sizing, Sizing::Static { .. }) && workers < spec.max()
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::wakes_per_waiting_request;
    use crate::config::{Recycle, ReforkSteps, Sizing};
    use crate::pool::state::PoolSpec;

    fn spec(sizing: Sizing, refork_after: &[u64]) -> PoolSpec {
        let ms = Duration::from_millis;
        PoolSpec {
            sizing,
            recycle: Recycle {
                max_requests: None,
                max_requests_jitter: 0,
                max_memory: None,
                max_lifetime: None,
                max_pool_memory: None,
                max_surge: None,
                refork_after: ReforkSteps::new(refork_after),
            },
            concurrency: 1,
            start_timeout: ms(5_000),
            kill_timeout: ms(2_000),
            backoff_base: ms(100),
            backoff_cap: ms(3_200),
            stable_after: ms(10_000),
            crash_loop_after: 3,
            max_spawn_batch: 32,
            group_of_children: false,
        }
    }

    #[test]
    fn only_a_pool_that_may_grow_is_woken_per_waiting_request() {
        let ondemand = Sizing::OnDemand {
            max: 4,
            idle_timeout: Duration::from_secs(10),
        };
        for refork in [&[][..], &[50, 200][..]] {
            // A static pool never spawns for its queue, reforking or not.
            let fixed = spec(Sizing::Static { workers: 2 }, refork);
            assert!(!wakes_per_waiting_request(&fixed, 2), "{refork:?}");
            assert!(!wakes_per_waiting_request(&fixed, 1), "{refork:?}");
            // An ondemand pool does while below its max.
            let grows = spec(ondemand, refork);
            assert!(wakes_per_waiting_request(&grows, 3), "{refork:?}");
            assert!(!wakes_per_waiting_request(&grows, 4), "{refork:?}");
        }
    }
}
