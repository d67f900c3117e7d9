//! A rolling restart whose replacement cannot come up stops: the workers it had not yet
//! replaced serve on, no replacement is tried again, and a notice says so.

use super::tests::{exited, k, ms, stat, T};
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
