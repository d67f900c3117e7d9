//! A direct pool's workers as the kernel shows them ([`PoolEvent::Seen`]): corral sees none
//! of their requests, so the driver reads each worker's state from /proc and the state
//! machine takes "not blocked in accept" for one request in flight. Dynamic and ondemand
//! sizing then work on these counts exactly as on a gateway pool's: spare idle workers,
//! growth for the accept queue (sent as `Demand`), and `idle_timeout`.
//!
//! [`PoolEvent::Seen`]: super::PoolEvent::Seen

use std::time::Duration;

use super::machine::{Phase, PoolState};
use super::{ChildStop, WorkerKey};

impl PoolState {
    /// The driver stopped one child of worker `key`, a php-cgi parent of a direct pool
    /// with `php_children`; its parent forks another, so the worker goes on and only the
    /// counter a php-fpm user reads for it moves.
    pub(super) fn child_stopped(&mut self, key: WorkerKey, reason: ChildStop) {
        if !self.workers.contains_key(&key) {
            return;
        }
        match reason {
            ChildStop::RequestTimeout => self.counters.request_timeouts += 1,
            ChildStop::MaxMemory => self.counters.recycled.max_memory += 1,
        }
    }

    /// The kernel's view of worker `key`: busy (not in accept) or idle, and whether it ran
    /// since the last look. A worker seen idle that ran in between has served something
    /// since, so its idle time starts now: one serving request after request is never
    /// taken for one idle since the previous look. A booting worker is left to `Ready`.
    pub(super) fn seen(&mut self, key: WorkerKey, busy: bool, ran: bool, now: Duration) {
        let Some(w) = self.workers.get_mut(&key) else {
            return;
        };
        if w.phase == Phase::Booting {
            return;
        }
        let was_busy = w.in_flight > 0;
        w.in_flight = usize::from(busy);
        if ran || (was_busy && !busy) {
            w.idle_since = now;
        }
        if !busy {
            self.maybe_signal(key, now);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use crate::config::Sizing;
    use crate::pool::state::tests::spec;
    use crate::pool::state::{PoolAction, PoolEvent, PoolState, WorkerKey};

    fn pool(sizing: Sizing) -> PoolState {
        let mut s = PoolState::new(spec(sizing), 1);
        s.serves_unseen();
        s
    }

    fn spawns(actions: &[PoolAction]) -> Vec<WorkerKey> {
        actions
            .iter()
            .filter_map(|a| match a {
                PoolAction::Spawn { key } => Some(*key),
                _ => None,
            })
            .collect()
    }

    fn signalled(actions: &[PoolAction]) -> Vec<u32> {
        actions
            .iter()
            .filter_map(|a| match a {
                PoolAction::Signal { pid, .. } => Some(*pid),
                _ => None,
            })
            .collect()
    }

    fn up(s: &mut PoolState, key: WorkerKey, pid: u32, at: Duration) {
        s.on_event(PoolEvent::Spawned { key, pid }, at);
        s.on_event(PoolEvent::Ready { key }, at);
    }

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn a_stopped_child_is_counted_and_its_group_goes_on() {
        use crate::pool::state::ChildStop;
        let mut s = pool(Sizing::Static { workers: 1 });
        let k = spawns(&s.on_event(PoolEvent::Start, Duration::ZERO))[0];
        up(&mut s, k, 500, MS);
        for reason in [ChildStop::RequestTimeout, ChildStop::MaxMemory] {
            let a = s.on_event(PoolEvent::ChildStopped { key: k, reason }, 2 * MS);
            assert!(
                a.is_empty(),
                "the group is neither killed nor replaced: {a:?}"
            );
        }
        let c = s.counters();
        assert_eq!((c.request_timeouts, c.recycled.max_memory), (1, 1));
        assert!(signalled(&s.on_event(PoolEvent::Tick, 3 * MS)).is_empty());
    }

    #[test]
    fn dynamic_keeps_spare_idle_workers_by_the_kernels_view() {
        let mut s = pool(Sizing::Dynamic {
            min: 1,
            max: 4,
            spare_min: 1,
            spare_max: 2,
            idle_timeout: Duration::from_secs(10),
        });
        let first = spawns(&s.on_event(PoolEvent::Start, Duration::ZERO));
        assert_eq!(first.len(), 1);
        up(&mut s, first[0], 100, MS);
        // Seen busy: no idle worker is left, so one more is started.
        let more = spawns(&s.on_event(
            PoolEvent::Seen {
                key: first[0],
                busy: true,
                ran: true,
            },
            2 * MS,
        ));
        assert_eq!(more.len(), 1, "a spare worker is started");
        up(&mut s, more[0], 101, 3 * MS);
        // Both seen idle, but the first ran just now: only the timeout retires, and not yet.
        for key in [first[0], more[0]] {
            let a = s.on_event(
                PoolEvent::Seen {
                    key,
                    busy: false,
                    ran: key == first[0],
                },
                Duration::from_secs(9),
            );
            assert!(spawns(&a).is_empty());
        }
        let a = s.on_event(PoolEvent::Tick, Duration::from_secs(9));
        assert!(
            !a.iter().any(|a| matches!(a, PoolAction::Signal { .. })),
            "{a:?}"
        );
        // Past idle_timeout for the one that did not run: retired down to min.
        let a = s.on_event(PoolEvent::Tick, Duration::from_secs(14));
        assert_eq!(signalled(&a), vec![101], "{a:?}");
    }

    #[test]
    fn ondemand_grows_for_the_accept_queue_and_a_busy_retiring_worker_waits() {
        let mut s = pool(Sizing::OnDemand {
            max: 3,
            idle_timeout: Duration::from_secs(1),
        });
        assert!(spawns(&s.on_event(PoolEvent::Start, Duration::ZERO)).is_empty());
        let k = spawns(&s.on_event(PoolEvent::Demand { waiting: 1 }, MS));
        assert_eq!(k.len(), 1, "a pending connection starts a worker");
        up(&mut s, k[0], 200, 2 * MS);
        s.on_event(PoolEvent::Demand { waiting: 0 }, 2 * MS);
        s.on_event(
            PoolEvent::Seen {
                key: k[0],
                busy: true,
                ran: true,
            },
            3 * MS,
        );
        // Busy: never retired for idleness, however long.
        let a = s.on_event(PoolEvent::Tick, Duration::from_secs(5));
        assert!(
            !a.iter().any(|a| matches!(a, PoolAction::Signal { .. })),
            "{a:?}"
        );
        s.on_event(
            PoolEvent::Seen {
                key: k[0],
                busy: false,
                ran: true,
            },
            Duration::from_secs(5),
        );
        let a = s.on_event(PoolEvent::Tick, Duration::from_millis(5500));
        assert!(
            !a.iter().any(|a| matches!(a, PoolAction::Signal { .. })),
            "{a:?}"
        );
        let a = s.on_event(PoolEvent::Tick, Duration::from_millis(6100));
        assert!(
            a.iter()
                .any(|a| matches!(a, PoolAction::Signal { pid: 200, .. })),
            "idle past idle_timeout: retired {a:?}"
        );
    }

    #[test]
    fn a_worker_that_ran_between_two_idle_looks_is_not_idle_since_the_first() {
        let mut s = pool(Sizing::OnDemand {
            max: 2,
            idle_timeout: Duration::from_secs(10),
        });
        s.on_event(PoolEvent::Start, Duration::ZERO);
        // Growth starts at one spawn a second.
        let mut k = spawns(&s.on_event(PoolEvent::Demand { waiting: 2 }, MS));
        k.extend(spawns(&s.on_event(PoolEvent::Tick, 1001 * MS)));
        assert_eq!(k.len(), 2);
        up(&mut s, k[0], 400, 1001 * MS);
        up(&mut s, k[1], 401, 1001 * MS);
        s.on_event(PoolEvent::Demand { waiting: 0 }, 1001 * MS);
        let look = |s: &mut PoolState, key, ran, at| {
            let busy = false;
            s.on_event(PoolEvent::Seen { key, busy, ran }, at)
        };
        // In accept at every look; the first served in between (it ran), the second did not.
        look(&mut s, k[0], true, Duration::from_secs(9));
        look(&mut s, k[1], false, Duration::from_secs(9));
        let a = s.on_event(PoolEvent::Tick, Duration::from_millis(16_500));
        assert_eq!(signalled(&a), vec![401], "{a:?}");
    }

    #[test]
    fn a_graceful_stop_signals_a_busy_worker_once_seen_idle() {
        let mut s = pool(Sizing::OnDemand {
            max: 1,
            idle_timeout: Duration::from_secs(10),
        });
        s.on_event(PoolEvent::Start, Duration::ZERO);
        let k = spawns(&s.on_event(PoolEvent::Demand { waiting: 1 }, MS))[0];
        up(&mut s, k, 300, MS);
        let busy = PoolEvent::Seen {
            key: k,
            busy: true,
            ran: true,
        };
        s.on_event(busy, 2 * MS);
        let a = s.on_event(PoolEvent::Stop { graceful: true }, 3 * MS);
        assert!(
            !a.iter().any(|a| matches!(a, PoolAction::Signal { .. })),
            "{a:?}"
        );
        let idle = PoolEvent::Seen {
            key: k,
            busy: false,
            ran: true,
        };
        let a = s.on_event(idle, 4 * MS);
        assert!(
            a.iter()
                .any(|a| matches!(a, PoolAction::Signal { pid: 300, .. })),
            "{a:?}"
        );
    }
}
