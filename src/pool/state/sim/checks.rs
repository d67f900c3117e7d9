//! The simulation's checks: the invariants after every event the world delivers, and the
//! end states: at rest (the pool's resting size) and after `Stop` (every process reaped).

use super::super::*;
use super::{ms, SimEv, World};
use crate::config::Sizing;

impl World {
    pub(super) fn check(&self, ev: &PoolEvent) {
        let st = self.pool.status(self.now);
        let max = self.spec.max();
        let ctx = format!("after {ev:?} at {:?}: {st:#?}", self.now);
        // A rolling restart with max_surge may keep that many workers above the size.
        let surge = self.spec.recycle.max_surge.map_or(1, |s| s.max(1) as usize);
        assert!(st.workers.len() <= max + surge, "live > max + surge {ctx}");
        let taking = st
            .workers
            .iter()
            .filter(|w| {
                use WorkerState::*;
                matches!(w.state, Starting | Booting | Idle | Busy | Draining)
            })
            .count();
        assert!(taking <= max + surge, "active > max + surge {ctx}");
        let replaced = st
            .workers
            .iter()
            .filter(|w| w.replacement.is_some())
            .count();
        assert!(taking - replaced <= max, "counted > max {ctx}");
        let accepting = st.workers.iter().filter(|w| w.accepting).count();
        assert!(accepting <= max, "accepting > max {ctx}");
        let replacing = st
            .workers
            .iter()
            .filter(|w| w.replacement.is_some())
            .count();
        assert!(
            replacing <= surge,
            "more replacements at once than max_surge {ctx}"
        );
        let known: Vec<WorkerKey> = self
            .procs
            .iter()
            .filter(|(_, p)| !p.forgotten)
            .map(|(k, _)| *k)
            .collect();
        let pool: Vec<WorkerKey> = st.workers.iter().map(|w| w.key).collect();
        assert_eq!(known, pool, "worker sets differ {ctx}");
        for w in &st.workers {
            let p = &self.procs[&w.key];
            assert_eq!(p.accepting, w.accepting, "accepting differs {ctx}");
            if w.accepting {
                use WorkerState::*;
                assert!(matches!(w.state, Idle | Busy | Draining), "{ctx}");
            }
            assert_eq!(p.requests.len(), w.in_flight, "in flight differs {ctx}");
            assert!(w.in_flight <= self.spec.concurrency, "{ctx}");
        }
    }

    pub(super) fn stop(&mut self, graceful: bool) {
        self.stop_sent = true;
        self.waiting = 0;
        self.deliver(PoolEvent::Stop { graceful });
        if graceful && self.chance(500) {
            self.after(100, 5_000, SimEv::Escalate);
        }
        let deadline = self.now + ms(120_000);
        while !self.stopped && self.now < deadline {
            let next = self.now + ms(100);
            self.run_until(next);
        }
        assert!(
            self.stopped,
            "no Stopped: {:#?}",
            self.pool.status(self.now)
        );
        assert!(self.procs.values().all(|p| p.forgotten && !p.alive));
    }

    /// Workers that serve (not starting, not leaving).
    fn serving(&self) -> usize {
        let st = self.pool.status(self.now);
        use WorkerState::*;
        st.workers
            .iter()
            .filter(|w| matches!(w.state, Idle | Busy | Draining))
            .count()
    }

    fn quiescent(&self) -> bool {
        let st = self.pool.status(self.now);
        use WorkerState::*;
        self.waiting == 0
            && st
                .workers
                .iter()
                .all(|w| matches!(w.state, Idle | Draining) && w.in_flight == 0)
    }

    /// Faults and load off; waits for every timeout, then for a quiet moment.
    pub(super) fn rest(&mut self) {
        self.chaos = false;
        self.load = false;
        let until = self.now + ms(60_000);
        self.run_until(until);
        let deadline = self.now + ms(60_000);
        while !self.quiescent() && self.now < deadline {
            let next = self.timers.keys().next().map_or(deadline, |k| k.0);
            self.run_until(next);
        }
        assert!(
            self.quiescent(),
            "never quiet: {:#?}",
            self.pool.status(self.now)
        );
        let n = self.serving();
        let want = match self.spec.sizing {
            Sizing::Static { workers } => workers,
            Sizing::Dynamic { min, spare_min, .. } => min.max(spare_min),
            Sizing::OnDemand { .. } => 0,
        };
        assert_eq!(
            n,
            want as usize,
            "at rest: {:#?}",
            self.pool.status(self.now)
        );
    }
}
