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
//! its own events, which it re-checks after each).

use super::Driver;
use crate::config::Sizing;

impl Driver {
    /// Tells the slot table whether a waiting request should wake this driver now; called
    /// after every event the driver handles, it takes the table's lock only on a change.
    pub(super) fn sync_demand_wake(&mut self) {
        let spec = self.state.spec();
        let may_grow =
            !matches!(spec.sizing, Sizing::Static { .. }) && self.workers.len() < spec.max();
        if self.demand_wake != Some(may_grow) {
            self.demand_wake = Some(may_grow);
            self.slots.wake_on_demand(may_grow);
        }
    }
}
