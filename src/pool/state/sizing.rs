//! How many workers a pool wants: the floor (static `workers`, dynamic `min`), growth for
//! spare workers and queued requests, the spawn rate, and shrinking idle workers.
//!
//! Spawn rate, chosen after php-fpm: spawns that only keep the floor (and replacements of
//! recycled workers) are limited by the crash backoff alone; growth above the floor is
//! limited to a batch per second that starts at 1 and doubles (1, 2, 4, .. up to
//! `max_spawn_batch`, 32 by default) for each second in which the whole batch was used, and
//! falls back to 1 after a second in which it was not.
//!
//! Shrinking runs on `Tick` only. A dynamic pool retires every ready idle worker idle longer
//! than `idle_timeout` while it keeps more than `min` workers and more than `spare_min` idle
//! ones (so shrinking never triggers growth), and one more idle worker per tick while more
//! than `spare_max` are idle. An ondemand pool retires every worker idle longer than
//! `idle_timeout`. A static pool never shrinks, and no pool shrinks while requests wait.

use std::time::Duration;

use super::machine::{Phase, PoolState};
use super::WorkerKey;
use crate::config::Sizing;

const WINDOW: Duration = Duration::from_secs(1);

/// The doubling growth-spawn allowance.
#[derive(Debug, Clone, Default)]
pub(super) struct SpawnRate {
    window_start: Duration,
    used: u32,
    batch: u32,
}

impl SpawnRate {
    fn permit(&mut self, now: Duration, max_batch: u32) -> bool {
        if self.batch == 0 || now >= self.window_start + WINDOW {
            let busy_last_window = self.batch > 0
                && self.used >= self.batch
                && now < self.window_start + WINDOW + WINDOW;
            self.batch = if busy_last_window {
                self.batch.saturating_mul(2).min(max_batch.max(1))
            } else {
                1
            };
            self.window_start = now;
            self.used = 0;
        }
        self.used < self.batch
    }

    fn take(&mut self) {
        self.used += 1;
    }
}

/// What the counted workers (active and not already replaced) look like.
struct Census {
    count: usize,
    /// Booting, or ready with nothing in flight.
    idle: usize,
    /// Requests the booting and ready workers could still take.
    free: usize,
}

impl PoolState {
    fn census(&self, exclude: Option<WorkerKey>) -> Census {
        let conc = self.spec.concurrency.max(1);
        let mut c = Census {
            count: 0,
            idle: 0,
            free: 0,
        };
        for w in self.workers.values() {
            if !w.counted() || Some(w.key) == exclude {
                continue;
            }
            c.count += 1;
            if w.phase == Phase::Booting || w.in_flight == 0 {
                c.idle += 1;
            }
            c.free += conc.saturating_sub(w.in_flight);
        }
        c
    }

    /// Spawns wanted now, split into floor spawns and growth spawns, ignoring rate and
    /// backoff; `exclude` is left out of the count (a worker due for recycling).
    pub(super) fn deficit(&self, exclude: Option<WorkerKey>) -> (usize, usize) {
        let c = self.census(exclude);
        // Slots a `max_surge = 0` rolling restart holds for old workers not yet reaped.
        let held = c.count + self.rolling_held();
        let room = self.spec.max().saturating_sub(held);
        let floor = self.spec.floor().saturating_sub(held).min(room);
        let conc = self.spec.concurrency.max(1);
        let for_demand = self.demand.saturating_sub(c.free).div_ceil(conc);
        let wanted = match self.spec.sizing {
            Sizing::Static { .. } => 0,
            Sizing::Dynamic { spare_min, .. } => {
                let spare = usize::try_from(spare_min).unwrap_or(usize::MAX);
                spare.saturating_sub(c.idle).max(for_demand)
            }
            Sizing::OnDemand { .. } => for_demand,
        };
        let growth = wanted.saturating_sub(floor).min(room - floor);
        (floor, growth)
    }

    /// Issues the spawns the policy wants, as far as the bounds, backoff and rate allow.
    pub(super) fn grow(&mut self, now: Duration) {
        let (floor, growth) = self.deficit(None);
        for _ in 0..floor {
            if !self.may_spawn(now) {
                return;
            }
            self.spawn(now);
        }
        let max_batch = self.spec.max_spawn_batch;
        for _ in 0..growth {
            if !self.may_spawn(now) || !self.rate.permit(now, max_batch) {
                return;
            }
            self.rate.take();
            self.spawn(now);
        }
    }

    /// `(min, spare_min, spare_max, idle_timeout)` as `shrink` applies them; `None` for a
    /// static pool, which never shrinks.
    fn shrink_limits(&self) -> Option<(usize, usize, usize, Duration)> {
        let (min, spare_min, spare_max, timeout) = match self.spec.sizing {
            Sizing::Static { .. } => return None,
            Sizing::Dynamic {
                min,
                spare_min,
                spare_max,
                idle_timeout,
                ..
            } => (min, spare_min, spare_max, idle_timeout),
            Sizing::OnDemand { idle_timeout, .. } => (0, 0, u32::MAX, idle_timeout),
        };
        let as_usize = |n: u32| usize::try_from(n).unwrap_or(usize::MAX);
        Some((
            as_usize(min),
            as_usize(spare_min),
            as_usize(spare_max),
            timeout,
        ))
    }

    /// Ready idle counted workers, longest idle first: those `shrink` may retire.
    fn idle_ready(&self) -> Vec<(Duration, WorkerKey)> {
        let mut idle: Vec<(Duration, WorkerKey)> = self
            .workers
            .values()
            .filter(|w| w.counted() && w.phase == Phase::Ready && w.in_flight == 0)
            .map(|w| (w.idle_since, w.key))
            .collect();
        idle.sort();
        idle
    }

    /// Retires idle workers the pool no longer needs (see the module documentation).
    pub(super) fn shrink(&mut self, now: Duration) {
        if self.demand > 0 {
            // Requests are waiting: no worker is surplus, whatever the counts say.
            return;
        }
        let Some((min, spare_min, spare_max, timeout)) = self.shrink_limits() else {
            return;
        };
        let mut c = self.census(None);
        let mut over_spare = c.idle > spare_max;
        for (since, key) in self.idle_ready() {
            if c.count <= min || c.idle <= spare_min {
                return;
            }
            let timed_out = now.saturating_sub(since) >= timeout;
            if !timed_out && !over_spare {
                return;
            }
            over_spare = false;
            self.counters.retired_idle += 1;
            self.begin_retire(key, now);
            c.count -= 1;
            c.idle -= 1;
        }
    }

    /// When `shrink` will next retire a worker if nothing else changes: `ZERO` while more
    /// than `spare_max` are idle (one goes per tick), else once the longest idle reaches
    /// `idle_timeout`; `None` when it will not (static, requests waiting, or held at `min`
    /// or `spare_min`: a pool resting there needs no tick for it).
    pub(super) fn shrink_due(&self) -> Option<Duration> {
        if self.demand > 0 || self.stopping.is_some() {
            return None;
        }
        let (min, spare_min, spare_max, timeout) = self.shrink_limits()?;
        let c = self.census(None);
        if c.count <= min || c.idle <= spare_min {
            return None;
        }
        let (since, _) = self.idle_ready().first().copied()?;
        if c.idle > spare_max {
            return Some(Duration::ZERO);
        }
        Some(since + timeout)
    }
}
