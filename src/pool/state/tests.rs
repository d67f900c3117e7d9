//! Unit tests of the sizing policies, crash handling and stop, driven by hand with an
//! explicit clock; also the small harness the recycling tests share.

use std::time::Duration;

use super::*;
use crate::config::{Recycle, Sizing};

pub(super) const NO_RECYCLE: Recycle = Recycle {
    max_requests: None,
    max_requests_jitter: 0,
    max_memory: None,
    max_lifetime: None,
    max_pool_memory: None,
    max_surge: None,
    refork_after: crate::config::ReforkSteps::NONE,
};

pub(super) fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

pub(super) fn spec(sizing: Sizing) -> PoolSpec {
    PoolSpec {
        sizing,
        recycle: NO_RECYCLE,
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

pub(super) fn stat(n: u32) -> PoolSpec {
    spec(Sizing::Static { workers: n })
}

pub(super) fn dynamic(min: u32, max: u32, spare_min: u32, spare_max: u32) -> PoolSpec {
    spec(Sizing::Dynamic {
        min,
        max,
        spare_min,
        spare_max,
        idle_timeout: ms(10_000),
    })
}

pub(super) fn ondemand(max: u32) -> PoolSpec {
    spec(Sizing::OnDemand {
        max,
        idle_timeout: ms(10_000),
    })
}

/// A pool under test with a clock and the actions of the last event.
pub(super) struct T {
    pub(super) p: PoolState,
    pub(super) now: Duration,
    pub(super) last: Vec<PoolAction>,
}

impl T {
    pub(super) fn new(s: PoolSpec) -> T {
        T {
            p: PoolState::new(s, 7),
            now: Duration::ZERO,
            last: Vec::new(),
        }
    }

    pub(super) fn ev(&mut self, e: PoolEvent) -> &[PoolAction] {
        self.last = self.p.on_event(e, self.now);
        &self.last
    }

    pub(super) fn at(&mut self, t: u64, e: PoolEvent) -> &[PoolAction] {
        self.now = ms(t);
        self.ev(e)
    }

    pub(super) fn spawns(&self) -> Vec<WorkerKey> {
        self.last
            .iter()
            .filter_map(|a| match a {
                PoolAction::Spawn { key } => Some(*key),
                _ => None,
            })
            .collect()
    }

    pub(super) fn has(&self, a: &PoolAction) -> bool {
        self.last.contains(a)
    }

    /// Spawned (pid = 100 + key) and ready.
    pub(super) fn up(&mut self, key: WorkerKey) {
        self.ev(PoolEvent::Spawned {
            key,
            pid: 100 + key.0 as u32,
        });
        self.ev(PoolEvent::Ready { key });
        assert!(self.has(&PoolAction::Accept { key, on: true }));
    }

    /// Handles an event and brings up every worker it spawns.
    pub(super) fn ev_up(&mut self, e: PoolEvent) {
        self.ev(e);
        for key in self.spawns() {
            self.up(key);
        }
    }

    /// Starts the pool and brings every initial worker up.
    pub(super) fn start(&mut self) -> Vec<WorkerKey> {
        self.ev(PoolEvent::Start);
        let keys = self.spawns();
        for k in &keys {
            self.up(*k);
        }
        keys
    }

    pub(super) fn state(&self, key: WorkerKey) -> Option<WorkerState> {
        self.p
            .status(self.now)
            .workers
            .iter()
            .find(|w| w.key == key)
            .map(|w| w.state)
    }

    pub(super) fn live(&self) -> usize {
        self.p.status(self.now).workers.len()
    }
}

pub(super) fn k(n: u64) -> WorkerKey {
    WorkerKey(n)
}

pub(super) fn signal(n: u64) -> PoolAction {
    PoolAction::Signal {
        key: k(n),
        pid: 100 + n as u32,
        signal: StopSignal::Term,
    }
}

pub(super) fn kill(n: u64) -> PoolAction {
    PoolAction::Kill {
        key: k(n),
        pid: 100 + n as u32,
    }
}

pub(super) fn exited(n: u64, status: ExitKind) -> PoolEvent {
    PoolEvent::Exited { key: k(n), status }
}

#[test]
fn static_pool_starts_n_and_replaces_a_crash_after_backoff() {
    let mut t = T::new(stat(3));
    assert_eq!(t.start(), vec![k(0), k(1), k(2)]);
    t.at(1_000, exited(1, ExitKind::Signal(11)));
    assert!(t.has(&PoolAction::Forget { key: k(1) }));
    assert!(
        t.spawns().is_empty(),
        "the replacement waits for the backoff"
    );
    t.at(1_050, PoolEvent::Tick);
    assert!(t.spawns().is_empty());
    t.at(1_100, PoolEvent::Tick);
    assert_eq!(t.spawns(), vec![k(3)]);
    assert_eq!(t.p.counters().crashed, 1);
}

#[test]
fn backoff_doubles_throttles_and_resets_after_a_served_request() {
    let mut t = T::new(stat(1));
    t.start();
    let mut key = 0;
    let mut now = 0;
    for crash in 1..=4u32 {
        t.at(now, exited(key, ExitKind::Code(1)));
        let delay = 100 * (1 << (crash - 1));
        if crash == 3 {
            assert!(t
                .last
                .iter()
                .any(|a| matches!(a, PoolAction::Notice(Notice::CrashLoop { crashes: 3, .. }))));
            assert!(t.p.status(t.now).throttled);
        }
        t.at(now + delay - 1, PoolEvent::Tick);
        assert!(t.spawns().is_empty(), "crash {crash}: too early");
        t.at(now + delay, PoolEvent::Tick);
        assert_eq!(t.spawns(), vec![k(key + 1)], "crash {crash}");
        key += 1;
        now += delay;
        t.ev(PoolEvent::Spawned {
            key: k(key),
            pid: 100 + key as u32,
        });
    }
    t.ev(PoolEvent::Ready { key: k(key) });
    t.ev(PoolEvent::RequestStarted { key: k(key) });
    t.ev(PoolEvent::RequestFinished { key: k(key) });
    assert!(t.has(&PoolAction::Notice(Notice::CrashLoopOver)));
    assert_eq!(t.p.status(t.now).crashes, 0);
    t.ev(exited(key, ExitKind::Code(1)));
    t.at(now + 100, PoolEvent::Tick);
    assert_eq!(t.spawns().len(), 1, "back to the base delay");
    assert_eq!(t.p.counters().throttled, 1);
}

#[test]
fn backoff_is_capped() {
    let s = stat(1);
    assert_eq!(s.backoff(1), ms(100));
    assert_eq!(s.backoff(3), ms(400));
    assert_eq!(s.backoff(10), ms(3_200));
    assert_eq!(s.backoff(u32::MAX), ms(3_200));
}

#[test]
fn start_timeout_kills_and_counts_as_a_crash() {
    let mut t = T::new(stat(1));
    t.ev(PoolEvent::Start);
    t.ev(PoolEvent::Spawned {
        key: k(0),
        pid: 100,
    });
    t.at(4_999, PoolEvent::Tick);
    assert!(t.last.is_empty());
    t.at(5_000, PoolEvent::Tick);
    assert!(t.has(&kill(0)));
    assert_eq!(t.p.counters().start_timeouts, 1);
    assert_eq!(t.p.status(t.now).crashes, 1);
    // Its exit was asked for: not a second crash. The replacement still waits for the
    // backoff, and the live bound (max + 1) allows it before the killed one is reaped.
    t.at(5_100, PoolEvent::Tick);
    assert_eq!(t.spawns(), vec![k(1)]);
    t.ev(exited(0, ExitKind::Signal(9)));
    assert_eq!(t.p.counters().crashed, 0);
    assert_eq!(t.p.status(t.now).crashes, 1);
}

#[test]
fn a_worker_killed_before_its_pid_is_known_is_killed_on_spawned() {
    let mut t = T::new(stat(1));
    t.ev(PoolEvent::Start);
    t.at(5_000, PoolEvent::Tick);
    assert!(t.last.iter().all(|a| !matches!(a, PoolAction::Kill { .. })));
    t.ev(PoolEvent::Spawned {
        key: k(0),
        pid: 100,
    });
    assert!(t.has(&kill(0)));
}

#[test]
fn spawn_failed_is_forgotten_and_backed_off() {
    let mut t = T::new(stat(1));
    t.ev(PoolEvent::Start);
    t.ev(PoolEvent::SpawnFailed {
        key: k(0),
        reason: "no such file".into(),
    });
    assert!(t.has(&PoolAction::Forget { key: k(0) }));
    assert!(t.spawns().is_empty());
    t.at(100, PoolEvent::Tick);
    assert_eq!(t.spawns(), vec![k(1)]);
}

#[test]
fn kill_timeout_escalates_to_sigkill() {
    let mut t = T::new(stat(1));
    t.start();
    t.at(0, PoolEvent::Stop { graceful: true });
    assert!(t.has(&signal(0)));
    t.at(1_999, PoolEvent::Tick);
    assert!(!t.has(&kill(0)));
    t.at(2_000, PoolEvent::Tick);
    assert!(t.has(&kill(0)));
    t.ev(exited(0, ExitKind::Signal(9)));
    assert_eq!(
        t.last,
        vec![PoolAction::Forget { key: k(0) }, PoolAction::Stopped]
    );
}

#[test]
fn graceful_stop_drains_busy_workers_and_spawns_nothing() {
    let mut t = T::new(stat(2));
    t.start();
    t.ev(PoolEvent::RequestStarted { key: k(0) });
    t.ev(PoolEvent::Stop { graceful: true });
    assert!(t.has(&PoolAction::Accept {
        key: k(0),
        on: false
    }));
    assert!(t.has(&PoolAction::Accept {
        key: k(1),
        on: false
    }));
    assert!(t.has(&signal(1)));
    assert!(!t.has(&signal(0)));
    t.ev(exited(1, ExitKind::Code(0)));
    assert!(t.spawns().is_empty());
    t.ev(PoolEvent::RequestFinished { key: k(0) });
    assert!(t.has(&signal(0)));
    t.ev(exited(0, ExitKind::Code(0)));
    assert!(t.has(&PoolAction::Stopped));
    t.ev(PoolEvent::Stop { graceful: true });
    assert!(t.last.is_empty());
}

#[test]
fn fast_stop_kills_everyone_and_escalates_a_graceful_one() {
    let mut t = T::new(stat(2));
    t.start();
    t.ev(PoolEvent::RequestStarted { key: k(0) });
    t.ev(PoolEvent::Stop { graceful: true });
    t.ev(PoolEvent::Stop { graceful: false });
    assert!(t.has(&kill(0)) && t.has(&kill(1)));
    t.ev(exited(0, ExitKind::Signal(9)));
    t.ev(exited(1, ExitKind::Signal(9)));
    assert!(t.has(&PoolAction::Stopped));
    let mut empty = T::new(stat(2));
    empty.ev(PoolEvent::Stop { graceful: false });
    assert_eq!(empty.last, vec![PoolAction::Stopped]);
}

#[test]
fn dynamic_starts_min_and_grows_for_spares_at_a_doubling_rate() {
    let mut s = dynamic(1, 100, 100, 100);
    s.start_timeout = ms(60_000);
    let mut t = T::new(s);
    let mut got = vec![];
    t.ev(PoolEvent::Start);
    got.push(t.spawns().len());
    for s in 1..8 {
        t.at(s * 1_000, PoolEvent::Tick);
        got.push(t.spawns().len());
    }
    // The floor (min 1) at once, then 1, 2, 4, .. 32 growth spawns a second, up to max.
    assert_eq!(got, vec![2, 2, 4, 8, 16, 32, 32, 4]);
    t.at(20_000, PoolEvent::Tick);
    assert!(t.spawns().is_empty());
}

#[test]
fn dynamic_grows_for_demand_up_to_max() {
    let mut t = T::new(dynamic(1, 4, 1, 2));
    let first = t.start();
    assert_eq!(first.len(), 1);
    t.ev(PoolEvent::RequestStarted { key: k(0) });
    assert_eq!(t.spawns().len(), 1, "spare_min 1");
    t.at(1_000, PoolEvent::Demand { waiting: 10 });
    t.at(2_000, PoolEvent::Tick);
    t.at(3_000, PoolEvent::Tick);
    t.at(4_000, PoolEvent::Tick);
    assert_eq!(t.live(), 4);
    assert!(t.p.counters().spawned <= 4);
}

#[test]
fn dynamic_shrinks_idle_workers_to_spare_max_and_by_idle_timeout_not_below_min() {
    let mut t = T::new(dynamic(2, 10, 1, 3));
    t.start();
    t.ev_up(PoolEvent::Demand { waiting: 6 });
    for s in 1..4 {
        t.now = ms(s * 1_000);
        t.ev_up(PoolEvent::Tick);
    }
    assert_eq!(t.live(), 6);
    t.ev(PoolEvent::Demand { waiting: 0 });
    // More than spare_max idle: one retired per tick, longest idle first.
    let mut retired = vec![];
    for now in [4_000, 4_500, 5_000, 5_500] {
        t.at(now, PoolEvent::Tick);
        retired.extend(t.last.iter().filter_map(|a| match a {
            PoolAction::Signal { key, .. } => Some(key.0),
            _ => None,
        }));
    }
    assert_eq!(retired, vec![0, 1, 2]);
    // After idle_timeout, down to max(min, spare_min) = 2, and no regrowth.
    t.at(14_000, PoolEvent::Tick);
    let idle = |t: &T| {
        t.p.status(t.now)
            .workers
            .iter()
            .filter(|w| w.state == WorkerState::Idle)
            .count()
    };
    assert_eq!(idle(&t), 2);
    assert!(t.spawns().is_empty());
    t.at(60_000, PoolEvent::Tick);
    assert_eq!(idle(&t), 2);
    assert!(t.spawns().is_empty());
}

#[test]
fn ondemand_spawns_on_demand_and_returns_to_zero() {
    let mut t = T::new(ondemand(3));
    t.ev(PoolEvent::Start);
    assert!(t.last.is_empty());
    t.at(10, PoolEvent::Demand { waiting: 1 });
    assert_eq!(t.spawns(), vec![k(0)]);
    t.at(20, PoolEvent::Demand { waiting: 1 });
    assert!(t.spawns().is_empty(), "one is already starting for it");
    t.up(k(0));
    t.ev(PoolEvent::RequestStarted { key: k(0) });
    t.ev(PoolEvent::Demand { waiting: 0 });
    t.at(1_000, PoolEvent::RequestFinished { key: k(0) });
    t.at(10_999, PoolEvent::Tick);
    assert!(!t.has(&signal(0)));
    t.at(11_000, PoolEvent::Tick);
    assert!(t.has(&signal(0)));
    t.ev(exited(0, ExitKind::Code(0)));
    assert!(t.spawns().is_empty());
    assert_eq!(t.live(), 0);
    assert_eq!(t.p.counters().retired_idle, 1);
}

#[test]
fn a_due_worker_the_pool_does_not_need_is_retired_without_replacement() {
    let mut s = ondemand(3);
    s.recycle.max_lifetime = Some(ms(1_000));
    let mut t = T::new(s);
    t.ev(PoolEvent::Start);
    t.ev(PoolEvent::Demand { waiting: 1 });
    t.up(k(0));
    t.ev(PoolEvent::Demand { waiting: 0 });
    t.at(1_000, PoolEvent::Tick);
    assert!(t.spawns().is_empty());
    assert!(t.has(&signal(0)));
}

#[test]
fn code_zero_after_serving_is_not_a_crash() {
    let mut t = T::new(stat(1));
    t.start();
    t.ev(PoolEvent::RequestStarted { key: k(0) });
    t.ev(PoolEvent::RequestFinished { key: k(0) });
    t.ev(exited(0, ExitKind::Code(0)));
    assert_eq!(t.spawns(), vec![k(1)], "replaced at once");
    assert_eq!(t.p.counters().exited_on_own, 1);
    assert_eq!(t.p.counters().crashed, 0);
}

#[test]
fn events_for_unknown_workers_are_ignored() {
    let mut t = T::new(stat(1));
    t.start();
    for e in [
        exited(9, ExitKind::Code(0)),
        PoolEvent::Ready { key: k(9) },
        PoolEvent::RequestFinished { key: k(9) },
        PoolEvent::RequestTimedOut { key: k(9) },
    ] {
        assert!(t.ev(e).is_empty());
    }
    t.ev(exited(0, ExitKind::Code(3)));
    assert!(t.ev(exited(0, ExitKind::Code(3))).is_empty(), "reaped once");
}

#[test]
fn status_rows_and_notice_sentences() {
    let mut t = T::new(stat(1));
    t.start();
    t.ev(PoolEvent::Memory {
        key: k(0),
        bytes: 42,
    });
    t.at(1_500, PoolEvent::RequestStarted { key: k(0) });
    let s = t.p.status(t.now);
    let w = &s.workers[0];
    assert_eq!(
        (w.pid, w.state, w.in_flight, w.age, w.memory, w.accepting),
        (Some(100), WorkerState::Busy, 1, ms(1_500), Some(42), true)
    );
    let n = Notice::Crashed {
        key: k(3),
        status: ExitKind::Signal(11),
        in_flight: 2,
    };
    assert_eq!(
        n.to_string(),
        "worker 3 killed by signal SIGSEGV unexpectedly with 2 requests in flight"
    );
    assert_eq!(n.severity(), Severity::Warn);
}

#[test]
fn spec_from_config_takes_spawned_pools_only() {
    let src = r#"
[server]
kill_timeout = "7s"

[[listen]]
address = "127.0.0.1:8080"
protocol = "http"

[pools.php]
command = ["php-cgi"]
mode = "static"
max = 3
concurrency = 2
max_requests = 500
start_timeout = "4s"

[pools.ext]
servers = ["127.0.0.1:9000"]

[[contexts]]
pool = "php"
root = "/var/www/html"

[[contexts]]
prefix = "/ext"
pool = "ext"
"#;
    let c = crate::config::parse(src, "t.toml").unwrap();
    let kill = c.server.kill_timeout;
    let s = PoolSpec::from_config(c.pool("php").unwrap(), kill).unwrap();
    assert_eq!(s.sizing, Sizing::Static { workers: 3 });
    assert_eq!((s.concurrency, s.max(), s.floor()), (2, 3, 3));
    assert_eq!(s.recycle.max_requests, Some(500));
    assert_eq!((s.start_timeout, s.kill_timeout), (ms(4_000), ms(7_000)));
    assert_eq!((s.backoff_base, s.backoff_cap), (ms(100), ms(30_000)));
    assert_eq!(PoolSpec::from_config(c.pool("ext").unwrap(), kill), None);
    assert!(!s.group_of_children);
}

#[test]
fn a_php_children_group_is_recycled_by_corral_after_max_requests_per_child() {
    let src = r#"
[[listen]]
address = "127.0.0.1:8080"
protocol = "http"

[pools.php]
command = ["php-cgi"]
mode = "static"
max = 2
php_children = 4
max_requests = 500
max_requests_jitter = 20

[[contexts]]
pool = "php"
root = "/var/www/html"
"#;
    let c = crate::config::parse(src, "t.toml").unwrap();
    let s = PoolSpec::from_config(c.pool("php").unwrap(), ms(1_000)).unwrap();
    assert_eq!(s.concurrency, 4);
    assert_eq!(s.recycle.max_requests, Some(2_000));
    assert_eq!(s.recycle.max_requests_jitter, 80);
    assert!(s.group_of_children);
}
