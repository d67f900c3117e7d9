//! A seeded simulation of the world around a pool: a fake driver that executes every action
//! (pids, readiness after random delays, random crashes, workers that ignore SIGTERM or never
//! become ready, random request load and demand), checking the state machine's invariants
//! after every event it delivers, over thousands of steps and many seeds.
//!
//! Invariants checked after every event:
//! - live (not yet reaped) workers ≤ `max + 1` (`max + max_surge` when that is larger);
//!   workers that may take requests (starting, booting, ready, draining) within the same
//!   bound, and ≤ `max` leaving out those whose replacement is starting; workers accepting
//!   requests ≤ `max`;
//! - the state machine's workers are exactly the ones the world spawned and has not been told
//!   to forget, so every exit is handled once and no worker is lost;
//! - accepting flags and in-flight counts agree between the world and the state machine, and
//!   a worker accepts only while ready and not retiring, stopping or killed;
//! - a request only starts on an accepting worker, and never beyond its concurrency;
//! - recycling replaces one worker at a time (up to `max_surge` at once in a rolling
//!   restart).
//!
//! Checked when actions are executed: no `Spawn` after `Stop`; `Accept(on)` only after
//! `Ready`; `Signal` only for a worker with nothing in flight; `Kill`/`Signal` carry the
//! worker's pid; `Forget` only after the exit was reported, once; `Stopped` once, only after
//! `Stop` and once every worker is forgotten.
//!
//! The checks themselves are in `sim/checks.rs`.
//!
//! Checked at rest (no load, no faults, after every timeout has had time to fire): a static
//! pool runs exactly its N workers, a dynamic one `max(min, spare_min)` (so within
//! `[min, max]`), an ondemand one none. After `Stop` the pool always reaches `Stopped`, with
//! every spawned process reaped.
//!
//! The world ticks the pool every 100 ms, 250 ms or 1 s, or, as the driver does at rest,
//! only when [`PoolState::next_tick`] says a tick is due (`sim/deadlines.rs`): the checks at
//! rest and after `Stop` then show that it leaves out no tick the pool needs.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use super::spec::Rng;
use super::*;
use crate::config::{Recycle, Sizing};

mod checks;
mod deadlines;

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

const REQUEST_TIMEOUT: Duration = Duration::from_secs(3);
const MAX_MEMORY: u64 = 1_000;
const QUEUE: usize = 20;
/// Seeds the invariant test runs (each about 60 s of simulated chaos, then rest and stop).
const SEEDS: u64 = 200;

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum SimEv {
    Tick,
    /// Faults and memory samples, on the tick's rhythm when the pool ticks at deadlines.
    Chaos,
    Arrival,
    Spawned(WorkerKey),
    SpawnFail(WorkerKey),
    Ready(WorkerKey),
    Crash(WorkerKey),
    Exit(WorkerKey, bool),
    Finish(WorkerKey, u64),
    Hung(WorkerKey, u64),
    Escalate,
}

#[derive(Debug, Default)]
struct Proc {
    pid: Option<u32>,
    alive: bool,
    /// Exited (or SpawnFailed) was delivered.
    reported: bool,
    forgotten: bool,
    ready: bool,
    accepting: bool,
    dying: bool,
    requests: BTreeSet<u64>,
    ignores_term: bool,
}

struct World {
    rng: Rng,
    now: Duration,
    seq: u64,
    timers: BTreeMap<(Duration, u64), SimEv>,
    pool: PoolState,
    spec: PoolSpec,
    procs: BTreeMap<WorkerKey, Proc>,
    waiting: usize,
    reported_waiting: usize,
    next_pid: u32,
    next_req: u64,
    tick_every: Duration,
    /// Ticks come only when due (`deadlines.rs`): the last one, and the one planned.
    at_deadlines: bool,
    last_tick: Option<Duration>,
    tick_planned: Option<(Duration, u64)>,
    /// Ticks delivered.
    ticks: u64,
    /// Per-mille odds that a new process crashes, and that a spawn fails.
    crash_odds: u64,
    fail_odds: u64,
    /// Faults and load are on.
    chaos: bool,
    load: bool,
    stop_sent: bool,
    stopped: bool,
    /// Events delivered to the state machine (each followed by the invariant checks).
    steps: u64,
    /// A worker started accepting: hand it queued requests once the current batch of actions
    /// is applied (never in the middle of one).
    pending_dispatch: bool,
    dispatching: bool,
}

impl World {
    fn new(seed: u64, at_deadlines: bool) -> World {
        let mut rng = Rng::new(seed.wrapping_mul(0x2545_F491_4F6C_DD1D) ^ seed);
        let mut pick = |lo: u64, hi: u64| lo + rng.up_to(hi - lo);
        let sizing = match seed % 3 {
            0 => Sizing::Static {
                workers: pick(1, 4) as u32,
            },
            1 => {
                let max = pick(2, 6) as u32;
                let spare_max = pick(1, u64::from(max)) as u32;
                Sizing::Dynamic {
                    min: pick(0, 2).min(u64::from(max)) as u32,
                    max,
                    spare_min: pick(1, u64::from(spare_max)) as u32,
                    spare_max,
                    idle_timeout: ms(pick(2_000, 5_000)),
                }
            }
            _ => Sizing::OnDemand {
                max: pick(1, 5) as u32,
                idle_timeout: ms(pick(2_000, 5_000)),
            },
        };
        let some = |v: u64, rng: &mut Rng| (rng.up_to(1) == 1).then_some(v);
        let max_requests = pick(5, 30);
        let mut rng2 = Rng::new(seed ^ 0xABCD);
        let surge = rng2.up_to(2) as u32;
        let max_surge = (rng2.up_to(1) == 1).then_some(surge);
        let spec = PoolSpec {
            sizing,
            recycle: Recycle {
                max_requests: some(max_requests, &mut rng2),
                max_requests_jitter: rng2.up_to(5),
                max_memory: some(MAX_MEMORY, &mut rng2),
                max_lifetime: some(pick(20_000, 60_000), &mut rng2).map(ms),
                max_pool_memory: None,
                max_surge,
                refork_after: crate::config::ReforkSteps::NONE,
            },
            concurrency: pick(1, 2) as usize,
            start_timeout: ms(2_000),
            kill_timeout: ms(1_000),
            backoff_base: ms(50),
            backoff_cap: ms(2_000),
            stable_after: ms(3_000),
            crash_loop_after: 3,
            max_spawn_batch: 8,
            // One pool in three recycles at its budget as a php_children group does.
            group_of_children: rng2.up_to(2) == 0,
        };
        let tick_every = ms([100, 250, 1_000][(seed % 7 % 3) as usize]);
        let mut w = World {
            rng: Rng::new(seed),
            now: Duration::ZERO,
            seq: 0,
            timers: BTreeMap::new(),
            pool: PoolState::new(spec, seed),
            spec,
            procs: BTreeMap::new(),
            waiting: 0,
            reported_waiting: 0,
            next_pid: 1000,
            next_req: 0,
            tick_every,
            at_deadlines,
            last_tick: None,
            tick_planned: None,
            ticks: 0,
            // One seed in eight runs an app that mostly crashes: a crash loop.
            crash_odds: if seed % 8 == 5 { 800 } else { 100 },
            fail_odds: if seed % 8 == 5 { 200 } else { 30 },
            chaos: true,
            load: true,
            stop_sent: false,
            stopped: false,
            steps: 0,
            pending_dispatch: false,
            dispatching: false,
        };
        w.at(
            tick_every,
            if at_deadlines {
                SimEv::Chaos
            } else {
                SimEv::Tick
            },
        );
        w.at(ms(1), SimEv::Arrival);
        w.deliver(PoolEvent::Start);
        w
    }

    fn chance(&mut self, per_mille: u64) -> bool {
        self.rng.up_to(999) < per_mille
    }

    fn between(&mut self, lo: u64, hi: u64) -> Duration {
        ms(lo + self.rng.up_to(hi - lo))
    }

    fn at(&mut self, when: Duration, ev: SimEv) {
        self.seq += 1;
        self.timers.insert((when, self.seq), ev);
    }

    fn after(&mut self, lo: u64, hi: u64, ev: SimEv) {
        let when = self.now + self.between(lo, hi);
        self.at(when, ev);
    }

    /// Runs timers until `until`.
    fn run_until(&mut self, until: Duration) {
        while let Some(entry) = self.timers.first_entry() {
            if entry.key().0 > until {
                break;
            }
            let ((when, _), ev) = entry.remove_entry();
            self.now = when;
            self.fire(ev);
        }
        self.now = until;
    }

    fn fire(&mut self, ev: SimEv) {
        match ev {
            SimEv::Tick if self.at_deadlines => {
                self.last_tick = Some(self.now);
                self.tick_planned = None;
                self.deliver(PoolEvent::Tick);
            }
            SimEv::Tick => {
                let every = self.tick_every;
                self.at(self.now + every, SimEv::Tick);
                self.chaos_step();
                self.deliver(PoolEvent::Tick);
            }
            SimEv::Chaos => {
                let every = self.tick_every;
                self.at(self.now + every, SimEv::Chaos);
                self.chaos_step();
            }
            SimEv::Arrival => {
                if !self.load {
                    return;
                }
                self.after(2, 100, SimEv::Arrival);
                if !self.stop_sent && self.waiting < QUEUE {
                    self.waiting += 1;
                    self.dispatch();
                }
            }
            SimEv::Spawned(key) => {
                let pid = self.next_pid;
                self.next_pid += 1;
                let (never_ready, crashes, ignores) = (
                    self.chance(30),
                    self.chance(self.crash_odds),
                    self.chance(100),
                );
                let p = self.procs.get_mut(&key).expect("spawned proc");
                p.pid = Some(pid);
                p.alive = true;
                p.ignores_term = ignores && self.chaos;
                if !never_ready || !self.chaos {
                    self.after(1, 300, SimEv::Ready(key));
                }
                if crashes && self.chaos {
                    self.after(1, 5_000, SimEv::Crash(key));
                }
                self.deliver(PoolEvent::Spawned { key, pid });
            }
            SimEv::SpawnFail(key) => {
                let p = self.procs.get_mut(&key).expect("failed proc");
                p.reported = true;
                self.deliver(PoolEvent::SpawnFailed {
                    key,
                    reason: "simulated".into(),
                });
            }
            SimEv::Ready(key) => {
                let p = self.procs.get_mut(&key).expect("ready proc");
                if p.alive && !p.dying {
                    p.ready = true;
                    self.deliver(PoolEvent::Ready { key });
                }
            }
            SimEv::Crash(key) if self.chaos => self.exit(key, None),
            SimEv::Crash(_) => {}
            SimEv::Exit(key, killed) => self.exit(key, Some(killed)),
            SimEv::Finish(key, id) => {
                let p = self.procs.get_mut(&key).expect("finish proc");
                if p.alive && p.requests.remove(&id) {
                    self.deliver(PoolEvent::RequestFinished { key });
                    self.dispatch();
                }
            }
            SimEv::Hung(key, id) => {
                let p = self.procs.get_mut(&key).expect("hung proc");
                if p.alive && p.requests.contains(&id) {
                    // The gateway answers 504, tells the driver, then gives the slot back;
                    // the process may run the request on (a group's stuck child does).
                    self.deliver(PoolEvent::RequestTimedOut { key });
                    if let Some(p) = self.procs.get_mut(&key) {
                        p.requests.remove(&id);
                    }
                    self.deliver(PoolEvent::RequestFinished { key });
                    self.dispatch();
                }
            }
            SimEv::Escalate => self.deliver(PoolEvent::Stop { graceful: false }),
        }
    }

    /// Now and then a rolling restart, and memory samples (over `max_memory` only in chaos).
    fn chaos_step(&mut self) {
        if self.chaos && self.chance(5) {
            self.deliver(PoolEvent::RollingRestart);
        }
        let samples: Vec<WorkerKey> = self
            .procs
            .iter()
            .filter(|(_, p)| p.alive && p.pid.is_some())
            .map(|(k, _)| *k)
            .collect();
        for key in samples {
            if self.chance(200) {
                let bytes = if self.chaos {
                    self.rng.up_to(MAX_MEMORY + 100)
                } else {
                    MAX_MEMORY / 2
                };
                self.deliver(PoolEvent::Memory { key, bytes });
            }
        }
    }

    /// The process ends: asked to (`Some(killed)`) or on its own (`None`).
    fn exit(&mut self, key: WorkerKey, asked: Option<bool>) {
        let status = match asked {
            Some(true) => ExitKind::Signal(9),
            Some(false) => ExitKind::Code(0),
            None => match self.rng.up_to(2) {
                0 => ExitKind::Code(0),
                1 => ExitKind::Code(255),
                _ => ExitKind::Signal(11),
            },
        };
        let p = self.procs.get_mut(&key).expect("exiting proc");
        if !p.alive {
            return;
        }
        p.alive = false;
        p.requests.clear();
        p.reported = true;
        self.deliver(PoolEvent::Exited { key, status });
        self.dispatch();
    }

    /// Hands queued requests to accepting workers, least loaded first, as the slot table
    /// does, and reports the queue length when it changed.
    fn dispatch(&mut self) {
        if self.dispatching {
            return;
        }
        self.dispatching = true;
        let conc = self.spec.concurrency;
        while self.waiting > 0 && !self.stop_sent {
            let best = self
                .procs
                .iter()
                .filter(|(_, p)| p.accepting && p.requests.len() < conc)
                .min_by_key(|(k, p)| (p.requests.len(), **k))
                .map(|(k, _)| *k);
            let Some(key) = best else { break };
            self.waiting -= 1;
            let id = self.next_req;
            self.next_req += 1;
            let hung = self.chaos && self.chance(10);
            let p = self.procs.get_mut(&key).expect("dispatch proc");
            p.requests.insert(id);
            if hung {
                self.at(self.now + REQUEST_TIMEOUT, SimEv::Hung(key, id));
            } else {
                self.after(10, 500, SimEv::Finish(key, id));
            }
            self.deliver(PoolEvent::RequestStarted { key });
        }
        // The loop looked at every worker that started accepting during it.
        self.dispatching = false;
        self.pending_dispatch = false;
        if self.waiting != self.reported_waiting {
            self.reported_waiting = self.waiting;
            let waiting = self.waiting;
            self.deliver(PoolEvent::Demand { waiting });
        }
    }

    fn deliver(&mut self, ev: PoolEvent) {
        self.steps += 1;
        self.ticks += u64::from(ev == PoolEvent::Tick);
        if let PoolEvent::RequestStarted { key } = &ev {
            assert!(
                self.procs[key].accepting,
                "request on a non-accepting {key}"
            );
        }
        let actions = self.pool.on_event(ev.clone(), self.now);
        for a in actions {
            self.apply(a);
        }
        self.check(&ev);
        if self.at_deadlines {
            self.plan_tick();
        }
        if self.pending_dispatch && !self.dispatching {
            self.pending_dispatch = false;
            self.dispatch();
        }
    }

    fn apply(&mut self, a: PoolAction) {
        match a {
            PoolAction::Spawn { key } => {
                assert!(!self.stop_sent, "Spawn after Stop");
                assert!(!self.procs.contains_key(&key), "{key} spawned twice");
                self.procs.insert(key, Proc::default());
                if self.chaos && self.chance(self.fail_odds) {
                    self.after(0, 5, SimEv::SpawnFail(key));
                } else {
                    self.after(0, 5, SimEv::Spawned(key));
                }
            }
            PoolAction::Accept { key, on } => {
                let p = self
                    .procs
                    .get_mut(&key)
                    .expect("Accept for an unknown worker");
                assert!(!p.forgotten && p.alive, "Accept for a dead {key}");
                if on {
                    assert!(p.ready, "Accept(on) before Ready for {key}");
                    assert!(!self.stop_sent, "Accept(on) after Stop");
                }
                p.accepting = on;
                self.pending_dispatch |= on;
            }
            PoolAction::Signal { key, pid, .. } => {
                let p = self
                    .procs
                    .get_mut(&key)
                    .expect("Signal for an unknown worker");
                assert_eq!(p.pid, Some(pid));
                assert!(p.requests.is_empty(), "Signal for busy {key}");
                if p.alive && !p.ignores_term && !p.dying {
                    p.dying = true;
                    self.after(1, 200, SimEv::Exit(key, false));
                }
            }
            PoolAction::Kill { key, pid } => {
                let p = self
                    .procs
                    .get_mut(&key)
                    .expect("Kill for an unknown worker");
                assert_eq!(p.pid, Some(pid));
                if p.alive {
                    p.dying = true;
                    self.after(0, 2, SimEv::Exit(key, true));
                }
            }
            PoolAction::Forget { key } => {
                let p = self
                    .procs
                    .get_mut(&key)
                    .expect("Forget for an unknown worker");
                assert!(p.reported && !p.alive, "Forget before exit of {key}");
                assert!(!p.forgotten, "{key} forgotten twice");
                p.forgotten = true;
                p.accepting = false;
            }
            PoolAction::Notice(_) => {}
            PoolAction::Stopped => {
                assert!(self.stop_sent, "Stopped without Stop");
                assert!(!self.stopped, "Stopped twice");
                assert!(self.procs.values().all(|p| p.forgotten && !p.alive));
                self.stopped = true;
            }
        }
    }
}

fn run(seed: u64, chaos_ms: u64) -> World {
    let mut w = World::new(seed, false);
    w.run_until(ms(chaos_ms));
    let at_rest = seed % 10 < 7;
    if at_rest {
        w.rest();
    }
    let graceful = seed % 2 == 0;
    w.stop(graceful);
    w
}

/// The counters that show each fault and trigger was exercised.
fn tally(c: &PoolCounters) -> [(&'static str, u64); 12] {
    let r = &c.recycled;
    [
        ("spawned", c.spawned),
        ("crashed", c.crashed),
        ("spawn_failed", c.spawn_failed),
        ("start_timeouts", c.start_timeouts),
        ("request_timeouts", c.request_timeouts),
        ("kill_timeouts", c.kill_timeouts),
        ("retired_idle", c.retired_idle),
        ("throttled", c.throttled),
        ("max_requests", r.max_requests),
        ("max_memory", r.max_memory),
        ("max_lifetime", r.max_lifetime),
        ("rolling", r.rolling),
    ]
}

#[test]
fn simulation_keeps_every_invariant_over_many_seeds() {
    let mut steps = 0;
    let mut total = tally(&PoolCounters::default());
    for seed in 1..=SEEDS {
        let w = run(seed, 60_000);
        steps += w.steps;
        for (t, (_, n)) in total.iter_mut().zip(tally(w.pool.counters())) {
            t.1 += n;
        }
    }
    println!("{steps} steps, {total:?}");
    // The world really was busy and faulty: every trigger fired many times.
    assert!(steps > SEEDS * 3_000, "{steps} steps");
    for (what, n) in total {
        assert!(n >= 20, "only {n} {what}");
    }
}

#[test]
fn simulation_is_reproducible_from_its_seed() {
    let a = run(42, 10_000);
    let b = run(42, 10_000);
    assert_eq!(a.steps, b.steps);
    assert_eq!(a.pool.counters(), b.pool.counters());
}
