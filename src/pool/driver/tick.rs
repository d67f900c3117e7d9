//! The driver's tick, and when it comes.
//!
//! Ticks are never closer than [`TICK`] apart and never further than [`IDLE_TICK`]; in
//! between they come at the earliest deadline the pool has. While anything is under way
//! (requests counted since the last tick, in flight or waiting; a worker leaving or due for
//! recycling; spawns held back; a promotion or a fork pending; always for a direct pool, which
//! polls /proc) that is every [`TICK`], as it always was. Otherwise only real deadlines wake
//! the driver: a start or kill timeout, the end of a crash backoff or streak, `max_lifetime`,
//! `idle_timeout`, the next memory sample ([`PoolState::next_tick`] has the pool's own). An
//! idle pool so ticks about once a second instead of ten times, and the deadlines fire when
//! due rather than at the next point of a 100 ms grid.
//!
//! A pool at rest learns of its next request at once all the same: the slot table wakes the
//! driver for it ([`SlotTable::wake_at_next_request`]), and the ticks that follow see it.
//!
//! [`PoolState::next_tick`]: crate::pool::state::PoolState::next_tick
//! [`SlotTable::wake_at_next_request`]: crate::pool::slots::SlotTable::wake_at_next_request

use std::time::Duration;

use tokio::time::Instant;

use super::Driver;
use crate::pool::state::{PoolEvent, PoolSpec};

/// The shortest gap between two ticks, and their period while anything is under way.
const TICK: Duration = Duration::from_millis(100);
/// The longest gap between two ticks: a pool at rest still looks at itself once a second.
const IDLE_TICK: Duration = Duration::from_secs(1);
/// How often every worker's memory is sampled when `max_memory` or `max_pool_memory` is set
/// (reading /proc costs a few syscalls per process).
const MEMORY_EVERY: Duration = Duration::from_secs(1);

/// What decides the next tick besides the state machine's deadlines.
#[derive(Debug)]
pub(super) struct Rhythm {
    /// The last tick found requests: counted since the tick before, in flight or waiting.
    busy: bool,
    /// Requests were counted since the last tick (`Driver::sync_counts`).
    pub(super) seen_requests: bool,
    /// When the next full memory sample is due; `None` for a pool that samples none.
    memory_due: Option<Instant>,
}

impl Rhythm {
    /// The rhythm of a pool of `spec` starting at `start`: its first sample a second later.
    pub(super) fn new(spec: &PoolSpec, start: Instant) -> Rhythm {
        let samples = spec.recycle.max_memory.is_some() || spec.recycle.max_pool_memory.is_some();
        Rhythm {
            busy: false,
            seen_requests: false,
            memory_due: samples.then(|| start + MEMORY_EVERY),
        }
    }
}

impl Driver {
    /// One tick, at `at`: request counts, the queue, memory, forks, refork, a direct pool's
    /// look at its workers, then the state machine's own `Tick`. True once the pool stopped.
    pub(super) fn tick(&mut self, at: Instant) -> bool {
        self.sync_counts();
        let stats = self.slots.stats();
        let seen = std::mem::take(&mut self.rhythm.seen_requests);
        // At rest the slot table is asked to wake the driver at the next request; when one
        // came since the counts were taken, the pool is not at rest.
        self.rhythm.busy =
            seen || stats.in_flight > 0 || stats.queued > 0 || !self.slots.wake_at_next_request();
        let mut stopped = self.apply(PoolEvent::Demand {
            waiting: stats.queued,
        });
        if self.rhythm.memory_due.is_some_and(|due| at >= due) {
            self.rhythm.memory_due = Some(at + MEMORY_EVERY);
            stopped |= self.sample_memory();
        }
        self.check_fork_deadlines();
        stopped |= self.refork_tick();
        if self.is_direct() {
            stopped |= self.direct_tick();
        }
        stopped | self.handle(PoolEvent::Tick)
    }

    /// When the tick after the one at `last` is due (see the module documentation).
    pub(super) fn next_tick_at(&self, last: Instant) -> Instant {
        let hurry = self.rhythm.busy
            || self.rhythm.seen_requests
            || self.is_direct()
            || self.promotion.is_some()
            || self.forks_pending();
        let state = self.state.next_tick(self.now()).map(|t| self.epoch + t);
        schedule(last, hurry, [self.rhythm.memory_due, state])
    }

    /// A worker asked of a preloader is not forked yet: `check_fork_deadlines` looks at it
    /// every tick.
    fn forks_pending(&self) -> bool {
        self.workers
            .values()
            .any(|w| w.pid == 0 && w.preloader.is_some())
    }
}

/// The tick after one at `last`: [`TICK`] later while `hurry`, else at the earliest of `due`,
/// but no sooner than [`TICK`] and no later than [`IDLE_TICK`] after `last` (a deadline
/// already past, or the state machine's "at the next tick", gives [`TICK`]).
fn schedule(last: Instant, hurry: bool, due: impl IntoIterator<Item = Option<Instant>>) -> Instant {
    let soon = last + TICK;
    if hurry {
        return soon;
    }
    due.into_iter()
        .flatten()
        .fold(last + IDLE_TICK, Instant::min)
        .max(soon)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn ticks_come_at_the_earliest_deadline_within_tick_and_idle_tick() {
        let last = Instant::now();
        // Under way: every TICK, whatever the deadlines.
        assert_eq!(schedule(last, true, [Some(last + ms(700))]), last + TICK);
        assert_eq!(schedule(last, true, [None]), last + TICK);
        // At rest with nothing timed: IDLE_TICK.
        assert_eq!(schedule(last, false, [None, None]), last + IDLE_TICK);
        // The earliest deadline, when it lies between the two.
        let due = [Some(last + ms(700)), Some(last + ms(450))];
        assert_eq!(schedule(last, false, due), last + ms(450));
        // Never later than IDLE_TICK, never sooner than TICK (a deadline past or now).
        assert_eq!(
            schedule(last, false, [Some(last + ms(5_000))]),
            last + IDLE_TICK
        );
        assert_eq!(schedule(last, false, [Some(last + ms(30))]), last + TICK);
        assert_eq!(schedule(last, false, [Some(last)]), last + TICK);
        let past = last.checked_sub(ms(50)).unwrap_or(last);
        assert_eq!(schedule(last, false, [Some(past)]), last + TICK);
    }
}
