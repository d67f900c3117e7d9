//! Unit tests of the recycling triggers (max_requests with jitter, max_memory, max_lifetime,
//! rolling restart) and of request timeouts: replacement first, retirement once idle.

use std::time::Duration;

use super::tests::{exited, k, kill, ms, signal, stat, T};
use super::*;

#[test]
fn max_requests_with_jitter_retires_after_the_last_request() {
    let mut s = stat(1);
    s.recycle.max_requests = Some(3);
    s.recycle.max_requests_jitter = 2;
    let mut t = T::new(s);
    t.start();
    let mut n = 0;
    while t.state(k(0)) != Some(WorkerState::Retiring) {
        t.ev(PoolEvent::RequestStarted { key: k(0) });
        n += 1;
        if t.state(k(0)) != Some(WorkerState::Retiring) {
            t.ev(PoolEvent::RequestFinished { key: k(0) });
        }
        assert!(n <= 5);
    }
    assert!((3..=5).contains(&n));
    // Off at once, replacement started at once, signal only when idle.
    assert!(t.has(&PoolAction::Accept {
        key: k(0),
        on: false
    }));
    assert_eq!(t.spawns(), vec![k(1)]);
    assert!(!t.has(&signal(0)));
    t.ev(PoolEvent::RequestFinished { key: k(0) });
    assert!(t.has(&signal(0)));
    assert_eq!(t.p.counters().recycled.max_requests, 1);
}

#[test]
fn a_group_at_its_budget_serves_on_until_its_replacement_is_ready() {
    // A php_children group behind the gateway: replaced new first, never left with no
    // worker accepting (each of its children holds a kept connection and never exits on
    // its own).
    let mut s = stat(1);
    s.recycle.max_requests = Some(4);
    s.group_of_children = true;
    let mut t = T::new(s);
    t.start();
    assert_eq!(
        t.p.slot_budget(k(0)),
        None,
        "the slot table does not stop it"
    );
    assert_eq!(t.p.budget(k(0)), Some(4));
    for _ in 0..3 {
        t.ev(PoolEvent::RequestStarted { key: k(0) });
        t.ev(PoolEvent::RequestFinished { key: k(0) });
    }
    t.ev(PoolEvent::RequestStarted { key: k(0) });
    assert_eq!(t.p.counters().recycled.max_requests, 1);
    assert_eq!(t.spawns(), vec![k(1)], "the replacement starts");
    t.ev(PoolEvent::RequestFinished { key: k(0) });
    assert_eq!(
        t.state(k(0)),
        Some(WorkerState::Draining),
        "the group still serves"
    );
    // Past its budget while the replacement boots: served, not refused.
    t.ev(PoolEvent::RequestStarted { key: k(0) });
    assert!(!t.has(&PoolAction::Accept {
        key: k(0),
        on: false
    }));
    t.up(k(1));
    assert!(t.has(&PoolAction::Accept {
        key: k(0),
        on: false
    }));
    assert!(!t.has(&signal(0)), "its request is still running");
    t.ev(PoolEvent::RequestFinished { key: k(0) });
    assert!(t.has(&signal(0)));
    assert_eq!(t.p.counters().recycled.max_requests, 1, "counted once");
}

#[test]
fn jitter_differs_between_workers_but_is_reproducible() {
    let mut s = stat(8);
    s.recycle.max_requests = Some(1000);
    s.recycle.max_requests_jitter = 100;
    let budgets = |seed| {
        let mut p = PoolState::new(s, seed);
        p.on_event(PoolEvent::Start, Duration::ZERO);
        p.workers.values().map(|w| w.budget).collect::<Vec<_>>()
    };
    assert_eq!(budgets(1), budgets(1));
    let b = budgets(1);
    assert!(b.iter().all(|x| (1000..=1100).contains(&x.unwrap())));
    assert!(b.windows(2).any(|w| w[0] != w[1]));
}

#[test]
fn max_memory_stops_accepting_then_signals_when_idle() {
    let mut s = stat(2);
    s.recycle.max_memory = Some(1_000);
    let mut t = T::new(s);
    t.start();
    t.ev(PoolEvent::RequestStarted { key: k(0) });
    t.ev(PoolEvent::Memory {
        key: k(0),
        bytes: 1_000,
    });
    assert!(t.last.is_empty(), "at the limit is not over it");
    t.ev(PoolEvent::Memory {
        key: k(0),
        bytes: 1_001,
    });
    assert!(t.has(&PoolAction::Accept {
        key: k(0),
        on: false
    }));
    assert_eq!(t.spawns(), vec![k(2)]);
    assert!(!t.has(&signal(0)));
    t.ev(PoolEvent::RequestFinished { key: k(0) });
    assert!(t.has(&signal(0)));
    assert_eq!(t.p.counters().recycled.max_memory, 1);
}

#[test]
fn max_lifetime_replaces_first_and_retires_when_the_replacement_is_ready() {
    let mut s = stat(2);
    s.recycle.max_lifetime = Some(ms(60_000));
    let mut t = T::new(s);
    t.start();
    t.at(60_000, PoolEvent::Tick);
    // Both are due; one replacement at a time, and the old worker keeps accepting.
    assert_eq!(t.spawns(), vec![k(2)]);
    assert!(t
        .last
        .iter()
        .all(|a| !matches!(a, PoolAction::Accept { .. })));
    assert_eq!(t.state(k(0)), Some(WorkerState::Draining));
    t.ev(PoolEvent::RequestStarted { key: k(0) });
    t.up(k(2));
    assert!(t.has(&PoolAction::Accept {
        key: k(0),
        on: false
    }));
    assert!(!t.has(&signal(0)), "it still has a request");
    t.ev(PoolEvent::RequestFinished { key: k(0) });
    assert!(t.has(&signal(0)));
    // The second due worker waits until the first is reaped (max + 1 live).
    t.at(60_100, PoolEvent::Tick);
    assert!(t.spawns().is_empty());
    t.ev(exited(0, ExitKind::Code(0)));
    assert_eq!(t.spawns(), vec![k(3)]);
    assert_eq!(t.p.counters().crashed, 0);
    assert_eq!(t.p.counters().recycled.max_lifetime, 2);
}

#[test]
fn a_replacement_that_crashes_leaves_the_old_worker_serving() {
    let mut s = stat(1);
    s.recycle.max_lifetime = Some(ms(1_000));
    let mut t = T::new(s);
    t.start();
    t.at(1_000, PoolEvent::Tick);
    assert_eq!(t.spawns(), vec![k(1)]);
    t.ev(PoolEvent::Spawned {
        key: k(1),
        pid: 101,
    });
    t.ev(exited(1, ExitKind::Code(255)));
    assert_eq!(t.state(k(0)), Some(WorkerState::Draining));
    assert!(t.p.status(t.now).workers[0].accepting);
    t.at(1_100, PoolEvent::Tick);
    assert_eq!(t.spawns(), vec![k(2)]);
}

#[test]
fn rolling_restart_replaces_one_at_a_time() {
    let mut t = T::new(stat(3));
    t.start();
    t.at(1_000, PoolEvent::RollingRestart);
    assert_eq!(t.spawns(), vec![k(3)]);
    for (old, new) in [(0, 3), (1, 4), (2, 5)] {
        assert!(t.live() <= 4);
        t.up(k(new));
        assert!(t.has(&PoolAction::Accept {
            key: k(old),
            on: false
        }));
        assert!(t.has(&signal(old)));
        t.ev(exited(old, ExitKind::Code(0)));
        if new < 5 {
            assert_eq!(t.spawns(), vec![k(new + 1)]);
        } else {
            assert!(t.spawns().is_empty());
        }
    }
    assert_eq!(t.p.counters().recycled.rolling, 3);
    assert_eq!(t.live(), 3);
}

#[test]
fn request_timeout_kills_and_replaces_without_backoff() {
    let mut t = T::new(stat(2));
    t.start();
    t.ev(PoolEvent::RequestStarted { key: k(1) });
    t.ev(PoolEvent::RequestTimedOut { key: k(1) });
    assert!(t.has(&PoolAction::Accept {
        key: k(1),
        on: false
    }));
    assert!(t.has(&kill(1)));
    assert_eq!(t.spawns(), vec![k(2)]);
    t.ev(exited(1, ExitKind::Signal(9)));
    assert_eq!(t.p.counters().crashed, 0);
    assert_eq!(t.p.counters().request_timeouts, 1);
}

#[test]
fn request_timeout_on_a_group_of_children_retires_it_once_its_other_requests_end() {
    // Killing a php_children group would take its other children's requests with it.
    let mut s = stat(1);
    s.group_of_children = true;
    let mut t = T::new(s);
    t.start();
    t.ev(PoolEvent::RequestStarted { key: k(0) });
    t.ev(PoolEvent::RequestStarted { key: k(0) });
    // The gateway answered the stuck one (504) and gave its slot back.
    t.ev(PoolEvent::RequestFinished { key: k(0) });
    t.ev(PoolEvent::RequestTimedOut { key: k(0) });
    assert!(t.has(&PoolAction::Accept {
        key: k(0),
        on: false
    }));
    assert!(!t.has(&kill(0)));
    assert_eq!(t.spawns(), vec![k(1)]);
    t.up(k(1));
    assert!(
        !t.has(&signal(0)),
        "another child's request is still running"
    );
    t.ev(PoolEvent::RequestFinished { key: k(0) });
    assert!(t.has(&signal(0)));
    assert_eq!(t.p.counters().request_timeouts, 1);
}

fn pool_sample(uss: &[(u64, u64)]) -> PoolEvent {
    PoolEvent::PoolMemory {
        workers: uss
            .iter()
            .map(|&(n, uss)| WorkerMemory {
                key: k(n),
                pss: uss + 10,
                uss,
            })
            .collect(),
    }
}

#[test]
fn max_pool_memory_replaces_the_worker_with_the_most_private_memory_new_before_old() {
    let mut s = stat(4);
    s.recycle.max_pool_memory = Some(1_000);
    let mut t = T::new(s);
    t.start();
    // Within the budget (4 × 10 + 600): nothing happens.
    t.ev(pool_sample(&[(0, 100), (1, 100), (2, 300), (3, 100)]));
    assert!(t.spawns().is_empty());
    assert_eq!(t.p.status(t.now).memory_total, Some(640));
    // Over it: worker 2 holds the most private memory; its replacement starts first and it
    // serves until that one is ready.
    t.ev(pool_sample(&[(0, 100), (1, 100), (2, 800), (3, 100)]));
    assert_eq!(t.spawns(), vec![k(4)]);
    assert_eq!(t.state(k(2)), Some(WorkerState::Draining));
    // One at a time: still over, nothing more is judged while worker 2 lives.
    t.ev(pool_sample(&[(0, 100), (1, 900), (2, 800), (3, 100)]));
    assert!(t.spawns().is_empty());
    t.up(k(4));
    assert!(t.has(&signal(2)));
    t.ev(pool_sample(&[
        (0, 100),
        (1, 900),
        (2, 800),
        (3, 100),
        (4, 50),
    ]));
    assert!(t.spawns().is_empty(), "{:?}", t.last);
    t.ev(exited(2, ExitKind::Code(0)));
    for old in [0, 1, 3] {
        assert_eq!(t.state(k(old)), Some(WorkerState::Idle));
    }
    // Reaped: the next sample over the budget picks the next largest.
    t.ev(pool_sample(&[(0, 100), (1, 900), (3, 100), (4, 50)]));
    assert_eq!(t.spawns(), vec![k(5)]);
    assert_eq!(t.state(k(1)), Some(WorkerState::Draining));
    assert_eq!(t.p.counters().recycled.max_pool_memory, 2);
}
