//! Whether a request that starts waiting for a slot wakes the driver.
//!
//! Under load nearly every request waits for a slot (more clients than workers), and each
//! wake-up costs the serving thread a hand-off to the driver's runtime (an eventfd write),
//! the driver a turn on the slot table's lock (which the serving thread then finds taken) and
//! a status snapshot: measured on a static pool of 2 native WSGI workers at c=25, 0.73
//! writes, 0.2 futex calls and about one context switch per request in corral's process. The
//! wake-up only serves a pool that may spawn for its queue: a dynamic or ondemand pool below
//! `max` workers (and a reforking pool, below). Otherwise the table leaves the driver asleep,
//! and the driver reads the queue's length at its next tick (for status, and for growth
//! should room appear between its own events, which it re-checks after each). A worker that
//! takes the last request of its `max_requests` budget wakes the driver in any case, so it
//! is replaced at once rather than at the tick.

use super::Driver;
use crate::config::Sizing;

impl Driver {
    /// Tells the slot table whether a waiting request should wake this driver now; called
    /// after every event the driver handles, it takes the table's lock only on a change.
    pub(super) fn sync_demand_wake(&mut self) {
        let spec = self.state.spec();
        let may_grow =
            !matches!(spec.sizing, Sizing::Static { .. }) && self.workers.len() < spec.max();
        // Reforking pools keep a wake-up per waiting request: their promotions and the
        // replacement of the older workers were measured to need the prompt turns
        // (tests/refork.rs failed 2 runs in 3 without them).
        let may_grow = may_grow || !spec.recycle.refork_after.is_empty();
        if self.demand_wake != Some(may_grow) {
            self.demand_wake = Some(may_grow);
            self.slots.wake_on_demand(may_grow);
        }
    }
}
