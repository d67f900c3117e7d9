//! The world ticking the pool only when [`PoolState::next_tick`] says a tick is due, no
//! sooner than 100 ms after the last one (as the driver) and with no upper bound (the
//! driver's is 1 s). Had `next_tick` left out a tick the pool needs, a start or kill
//! timeout would never fire, a backoff never end, an idle worker never be retired: the
//! checks at rest and after `Stop` would fail.
//!
//! [`PoolState::next_tick`]: crate::pool::state::PoolState::next_tick

use std::time::Duration;

use super::{ms, tally, SimEv, World, SEEDS};
use crate::pool::state::PoolCounters;

/// The shortest gap between two ticks, as in the driver.
const TICK: Duration = Duration::from_millis(100);

impl World {
    /// Plans the next tick after an event, moving the one planned when its time changed.
    pub(super) fn plan_tick(&mut self) {
        let earliest = self
            .last_tick
            .map_or(Duration::ZERO, |t| t + TICK)
            .max(self.now);
        let when = self.pool.next_tick(self.now).map(|t| t.max(earliest));
        if self.tick_planned.map(|(t, _)| t) == when {
            return;
        }
        if let Some(planned) = self.tick_planned.take() {
            self.timers.remove(&planned);
        }
        if let Some(when) = when {
            self.at(when, SimEv::Tick);
            self.tick_planned = Some((when, self.seq));
        }
    }
}

/// A pool at rest ticked at deadlines for a minute: how many ticks it had.
fn ticks_at_rest(w: &mut World) -> u64 {
    let before = w.ticks;
    let until = w.now + ms(60_000);
    w.run_until(until);
    w.ticks - before
}

#[test]
fn simulation_ticking_only_when_due_keeps_every_invariant() {
    let mut steps = 0;
    let mut total = tally(&PoolCounters::default());
    // Half the seeds of the simulation ticking on a fixed rhythm: each is as long.
    for seed in 1..=SEEDS / 2 {
        let mut w = World::new(seed, true);
        w.run_until(ms(60_000));
        if seed % 10 < 7 {
            w.rest();
            // Nothing is due at rest but a worker's max_lifetime (its replacement and
            // retirement tick at 100 ms while under way); the fixed rhythm had 600.
            let ticks = ticks_at_rest(&mut w);
            match w.spec.recycle.max_lifetime {
                None => assert_eq!(ticks, 0, "seed {seed}"),
                Some(_) => assert!(ticks <= 60, "seed {seed}: {ticks} ticks"),
            }
        }
        w.stop(seed % 2 == 0);
        steps += w.steps;
        for (t, (_, n)) in total.iter_mut().zip(tally(w.pool.counters())) {
            t.1 += n;
        }
    }
    println!("{steps} steps, {total:?}");
    assert!(steps > SEEDS / 2 * 3_000, "{steps} steps");
    for (what, n) in total {
        assert!(n >= 20, "only {n} {what}");
    }
}
