//! Unit tests of [`PoolState::next_tick`]: each deadline a tick acts on, "at the next tick"
//! for what moves on only at ticks, and nothing at all for a pool at rest.

use super::tests::{dynamic, exited, k, kill, ms, ondemand, signal, stat, T};
use super::*;

/// The next tick's time in ms; `Some(0)` for "the next regular one".
fn due(t: &T) -> Option<u64> {
    t.p.next_tick(t.now)
        .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

#[test]
fn a_pool_at_rest_has_nothing_due() {
    let t = T::new(stat(2));
    assert_eq!(due(&t), None, "not started");
    let mut t = T::new(stat(2));
    t.start();
    t.now = ms(60_000);
    assert_eq!(due(&t), None, "static, every worker idle");
    // A dynamic pool held at min, or at spare_min above min, has no shrink to wait for.
    let mut t = T::new(dynamic(2, 10, 1, 3));
    assert_eq!(t.start().len(), 2);
    assert_eq!(due(&t), None, "dynamic at min");
    let mut t = T::new(dynamic(0, 10, 1, 3));
    assert_eq!(t.start().len(), 1);
    assert_eq!(due(&t), None, "dynamic at spare_min");
    let mut t = T::new(ondemand(3));
    t.start();
    assert_eq!(due(&t), None, "ondemand at zero");
}

#[test]
fn a_booting_worker_is_due_at_its_start_timeout_then_the_backoff() {
    let mut t = T::new(stat(1));
    t.at(200, PoolEvent::Start);
    t.ev(PoolEvent::Spawned {
        key: k(0),
        pid: 100,
    });
    assert_eq!(due(&t), Some(5_200));
    t.at(5_200, PoolEvent::Tick);
    assert!(t.has(&kill(0)));
    // Killed, its exit is an event; the replacement waits for the crash backoff.
    assert_eq!(due(&t), Some(5_300));
    t.at(5_300, PoolEvent::Tick);
    assert_eq!(t.spawns(), vec![k(1)]);
}

#[test]
fn a_signalled_worker_is_due_at_its_kill_timeout() {
    let mut t = T::new(stat(1));
    t.start();
    t.at(1_000, PoolEvent::Stop { graceful: true });
    assert!(t.has(&signal(0)));
    assert_eq!(due(&t), Some(3_000));
    t.at(3_000, PoolEvent::Tick);
    assert!(t.has(&kill(0)));
    assert_eq!(due(&t), None);
}

#[test]
fn busy_retiring_and_queued_work_wants_the_next_tick() {
    let mut t = T::new(stat(1));
    t.start();
    t.ev(PoolEvent::RequestStarted { key: k(0) });
    assert_eq!(due(&t), Some(0), "a request in flight");
    t.ev(PoolEvent::RequestFinished { key: k(0) });
    assert_eq!(due(&t), None);
    t.ev(PoolEvent::Demand { waiting: 2 });
    assert_eq!(due(&t), Some(0), "requests waiting");
    t.ev(PoolEvent::Demand { waiting: 0 });
    assert_eq!(due(&t), None);
    // Retiring: its stop signal waits for the last request, learnt at a tick.
    t.ev(PoolEvent::RequestStarted { key: k(0) });
    t.at(500, PoolEvent::Stop { graceful: true });
    assert_eq!(t.state(k(0)), Some(WorkerState::Retiring));
    assert_eq!(due(&t), Some(0));
    t.ev(PoolEvent::RequestFinished { key: k(0) });
    assert!(t.has(&signal(0)));
    assert_eq!(due(&t), Some(2_500), "then its kill timeout");
}

#[test]
fn spawns_held_back_by_the_spawn_rate_want_the_next_tick() {
    // Two spare workers wanted above a floor of none: one spawn in the first second.
    let mut t = T::new(dynamic(0, 10, 2, 3));
    t.ev(PoolEvent::Start);
    assert_eq!(t.spawns(), vec![k(0)]);
    t.up(k(0));
    assert_eq!(due(&t), Some(0));
    t.at(1_000, PoolEvent::Tick);
    assert_eq!(t.spawns(), vec![k(1)]);
    t.up(k(1));
    assert_eq!(due(&t), None);
}

#[test]
fn a_crash_streak_ends_at_stable_after_of_its_new_worker() {
    let mut t = T::new(stat(1));
    t.start();
    t.at(1_000, exited(0, ExitKind::Code(1)));
    assert_eq!(due(&t), Some(1_100), "the backoff");
    t.at(1_100, PoolEvent::Tick);
    assert_eq!(t.spawns(), vec![k(1)]);
    assert_eq!(due(&t), Some(6_100), "its start timeout");
    t.ev(PoolEvent::Spawned {
        key: k(1),
        pid: 101,
    });
    t.at(1_300, PoolEvent::Ready { key: k(1) });
    assert_eq!(due(&t), Some(11_100), "stable_after from its spawn");
    t.at(11_100, PoolEvent::Tick);
    assert_eq!(t.p.status(t.now).crashes, 0);
    assert_eq!(due(&t), None);
}

#[test]
fn max_lifetime_is_due_once_then_its_recycling_wants_ticks() {
    let mut s = stat(1);
    s.recycle.max_lifetime = Some(ms(60_000));
    let mut t = T::new(s);
    t.start();
    assert_eq!(due(&t), Some(60_000));
    t.at(60_000, PoolEvent::Tick);
    assert_eq!(t.spawns(), vec![k(1)], "replacement first");
    assert_eq!(due(&t), Some(0), "a worker due for recycling");
    t.up(k(1));
    assert!(t.has(&signal(0)));
    t.ev(exited(0, ExitKind::Code(0)));
    assert_eq!(due(&t), Some(120_000), "the replacement's own lifetime");
}

#[test]
fn idle_workers_over_spare_max_go_at_each_tick_the_others_at_idle_timeout() {
    for spare_max in [1, 3] {
        let mut t = T::new(dynamic(0, 4, 1, spare_max));
        t.ev(PoolEvent::Start);
        t.up(k(0));
        t.ev(PoolEvent::RequestStarted { key: k(0) });
        t.at(1_000, PoolEvent::Tick);
        assert_eq!(t.spawns(), vec![k(1)]);
        t.up(k(1));
        t.ev(PoolEvent::RequestStarted { key: k(1) });
        assert_eq!(t.spawns(), vec![k(2)]);
        t.up(k(2));
        t.at(1_500, PoolEvent::RequestFinished { key: k(0) });
        t.ev(PoolEvent::RequestFinished { key: k(1) });
        // Three idle; worker 2 idle longest (since 1 s).
        // Ticked when due, as the driver does (a bounded number of times: a deadline that a
        // tick does not clear would come back for ever).
        let mut retired = vec![];
        for _ in 0..20 {
            let Some(at) = due(&t) else { break };
            let at = if at == 0 { t.now + ms(100) } else { ms(at) };
            t.now = at;
            t.ev(PoolEvent::Tick);
            for a in t.last.clone() {
                if let PoolAction::Signal { key, .. } = a {
                    retired.push((key.0, t.now.as_millis()));
                    t.ev(exited(key.0, ExitKind::Code(0)));
                }
            }
        }
        // Down to spare_min either way: at once over spare_max, else at idle_timeout.
        let expected = match spare_max {
            1 => vec![(2, 1_600), (0, 1_700)],
            _ => vec![(2, 11_000), (0, 11_500)],
        };
        assert_eq!(retired, expected, "spare_max {spare_max}");
        assert_eq!(t.live(), 1);
        assert_eq!(due(&t), None);
    }
}
