//! A rolling restart whose replacement cannot come up stops: the workers it had not yet
//! replaced serve on, no replacement is tried again, and a notice says so.

use super::tests::{exited, k, ms, signal, stat, T};
use super::*;

fn stopped_notice(t: &T) -> Option<usize> {
    t.last.iter().find_map(|a| match a {
        PoolAction::Notice(Notice::RollingRestartStopped { kept, .. }) => Some(*kept),
        _ => None,
    })
}

#[test]
fn a_replacement_that_crashes_while_booting_stops_the_rolling_restart() {
    let mut t = T::new(stat(3));
    t.start();
    t.at(1_000, PoolEvent::RollingRestart);
    assert_eq!(t.spawns(), vec![k(3)]);
    t.ev(PoolEvent::Spawned {
        key: k(3),
        pid: 103,
    });
    t.ev(exited(3, ExitKind::Code(1)));
    assert_eq!(stopped_notice(&t), Some(3), "{:?}", t.last);
    // Every old worker is idle and taking requests again, and no replacement follows,
    // not even after the crash backoff.
    for old in 0..3 {
        assert_eq!(t.state(k(old)), Some(WorkerState::Idle));
    }
    t.at(5_000, PoolEvent::Tick);
    assert!(t.spawns().is_empty(), "{:?}", t.last);
    assert_eq!(t.live(), 3);
}

#[test]
fn a_replacement_that_misses_start_timeout_or_fails_to_spawn_stops_it_too() {
    // Start timeout (health checks included: an unhealthy worker never reports ready).
    let mut t = T::new(stat(2));
    t.start();
    t.at(1_000, PoolEvent::RollingRestart);
    let new = t.spawns()[0];
    t.ev(PoolEvent::Spawned { key: new, pid: 200 });
    t.at(1_000 + ms(5_000).as_millis() as u64, PoolEvent::Tick);
    assert_eq!(stopped_notice(&t), Some(2), "{:?}", t.last);
    assert_eq!(t.state(k(0)), Some(WorkerState::Idle));
    // A second rolling restart after the fix is a new one, and runs.
    t.ev(exited(new.0, ExitKind::Signal(9)));
    t.at(20_000, PoolEvent::RollingRestart);
    assert_eq!(t.spawns().len(), 1);

    // A spawn that fails.
    let mut t = T::new(stat(2));
    t.start();
    t.at(1_000, PoolEvent::RollingRestart);
    let new = t.spawns()[0];
    t.ev(PoolEvent::SpawnFailed {
        key: new,
        reason: "no such program".to_owned(),
    });
    assert_eq!(stopped_notice(&t), Some(2), "{:?}", t.last);
    t.at(10_000, PoolEvent::Tick);
    assert!(t.spawns().is_empty());
}

#[test]
fn a_crash_outside_a_rolling_restart_stops_nothing() {
    let mut t = T::new(stat(2));
    t.start();
    t.ev(exited(1, ExitKind::Code(1)));
    assert_eq!(stopped_notice(&t), None);
}

/// Carries a rolling restart of `t` to its end in a world where every spawned worker comes
/// up and every signalled one exits at once; the most workers alive at any point, and the
/// keys still alive at the end.
fn restart(t: &mut T) -> (usize, Vec<WorkerKey>) {
    let mut peak = t.live();
    let mut pending: Vec<PoolAction> = t.ev(PoolEvent::RollingRestart).to_vec();
    while !pending.is_empty() {
        peak = peak.max(t.live());
        let next = match pending.remove(0) {
            PoolAction::Spawn { key } => {
                let mut out = t
                    .ev(PoolEvent::Spawned {
                        key,
                        pid: 100 + key.0 as u32,
                    })
                    .to_vec();
                peak = peak.max(t.live());
                out.extend(t.ev(PoolEvent::Ready { key }).iter().cloned());
                out
            }
            PoolAction::Signal { key, .. } => t.ev(exited(key.0, ExitKind::Code(0))).to_vec(),
            _ => Vec::new(),
        };
        pending.extend(next);
    }
    let alive = t.p.status(t.now).workers.iter().map(|w| w.key).collect();
    (peak, alive)
}

#[test]
fn max_surge_bounds_the_workers_a_rolling_restart_adds() {
    for (surge, peak) in [(0, 4), (1, 5), (2, 6), (4, 8)] {
        let mut s = stat(4);
        s.recycle.max_surge = Some(surge);
        let mut t = T::new(s);
        t.start();
        let (seen, alive) = restart(&mut t);
        assert_eq!(seen, peak, "max_surge {surge}");
        // Every old worker was replaced, and the pool is back at its size.
        assert_eq!(alive.len(), 4, "max_surge {surge}: {alive:?}");
        assert!(
            alive.iter().all(|k| k.0 >= 4),
            "max_surge {surge}: {alive:?}"
        );
        assert_eq!(t.p.counters().recycled.rolling, 4);
    }
}

#[test]
fn with_max_surge_an_old_worker_counts_until_it_is_reaped() {
    let mut s = stat(3);
    s.recycle.max_surge = Some(1);
    let mut t = T::new(s);
    t.start();
    t.ev(PoolEvent::RequestStarted { key: k(0) });
    t.at(1_000, PoolEvent::RollingRestart);
    assert_eq!(t.spawns(), vec![k(3)]);
    t.up(k(3));
    // Worker 0 retires but finishes its request first: no second replacement meanwhile.
    assert_eq!(t.state(k(0)), Some(WorkerState::Retiring));
    assert!(t.spawns().is_empty());
    t.at(2_000, PoolEvent::Tick);
    assert!(t.spawns().is_empty());
    t.ev(PoolEvent::RequestFinished { key: k(0) });
    assert!(t.has(&signal(0)));
    assert!(t.spawns().is_empty());
    t.ev(exited(0, ExitKind::Code(0)));
    assert_eq!(t.spawns(), vec![k(4)]);
    assert!(t.live() <= 4);
}

#[test]
fn with_max_surge_0_the_old_worker_goes_first_and_a_failed_refill_stops_the_restart() {
    let mut s = stat(3);
    s.recycle.max_surge = Some(0);
    let mut t = T::new(s);
    t.start();
    t.at(1_000, PoolEvent::RollingRestart);
    // No replacement before the old worker is gone.
    assert!(t.spawns().is_empty());
    assert!(t.has(&signal(0)));
    assert_eq!(t.live(), 3);
    t.ev(exited(0, ExitKind::Code(0)));
    assert_eq!(t.spawns(), vec![k(3)]);
    // The refill cannot start: the restart stops, the two old workers serve on.
    t.ev(PoolEvent::SpawnFailed {
        key: k(3),
        reason: "no such program".to_owned(),
    });
    assert_eq!(stopped_notice(&t), Some(2), "{:?}", t.last);
    for old in 1..3 {
        assert_eq!(t.state(k(old)), Some(WorkerState::Idle));
    }
}

#[test]
fn a_rolling_restart_of_some_workers_replaces_only_those_new_before_old() {
    // A refork replaces the workers of older templates, not those already forked from the
    // new one.
    let mut t = T::new(stat(3));
    t.start();
    t.at(
        1_000,
        PoolEvent::RollingRestartOf {
            keys: vec![k(0), k(2), k(9)],
        },
    );
    let first = t.spawns();
    assert_eq!(first.len(), 1, "one replacement at a time: {:?}", t.last);
    t.ev(PoolEvent::Spawned {
        key: first[0],
        pid: 300,
    });
    t.ev(PoolEvent::Ready { key: first[0] });
    // Its predecessor retires only now that it is ready.
    let old = [k(0), k(2)];
    assert!(
        t.last
            .iter()
            .any(|a| matches!(a, PoolAction::Signal { key, .. } if old.contains(key))),
        "{:?}",
        t.last
    );
    // The next one once the old one is reaped (live workers stay within max + 1).
    t.ev(exited(0, ExitKind::Code(0)));
    let second = t.spawns();
    assert_eq!(second.len(), 1, "{:?}", t.last);
    t.ev(PoolEvent::Spawned {
        key: second[0],
        pid: 301,
    });
    t.ev(PoolEvent::Ready { key: second[0] });
    t.ev(exited(2, ExitKind::Code(0)));
    t.at(3_000, PoolEvent::Tick);
    assert!(t.spawns().is_empty(), "only the two named: {:?}", t.last);
    assert_eq!(t.state(k(1)), Some(WorkerState::Idle));
}
