//! The slot table's unit tests.

use super::*;

fn table(max_conns: usize, queue_size: usize, caps: &[Option<usize>]) -> Arc<SlotTable> {
    SlotTable::new(
        SlotLimits {
            max_conns,
            queue_size,
            queue_timeout: Duration::from_secs(5),
        },
        caps,
    )
}

fn addr() -> BackendAddress {
    BackendAddress::Unix("/tmp/w.sock".into())
}

fn ready_worker(t: &SlotTable, concurrency: usize) -> WorkerId {
    let id = t.add_worker(concurrency, addr(), None);
    t.set_accepting(id, true);
    id
}

#[tokio::test(start_paused = true)]
async fn pool_cap_holds_and_queue_overflows_at_once() {
    let t = table(2, 1, &[None]);
    ready_worker(&t, 4);
    let a = t.acquire(0).await.unwrap();
    let _b = t.acquire(0).await.unwrap();
    let waiting = tokio::spawn({
        let t = Arc::clone(&t);
        async move { t.acquire(0).await.map(|s| s.worker()) }
    });
    tokio::task::yield_now().await;
    assert_eq!(t.stats().queued, 1);
    assert_eq!(
        t.acquire(0).await.unwrap_err(),
        SlotError::QueueFull { queue_size: 1 }
    );
    drop(a);
    assert!(waiting.await.unwrap().is_ok());
    // The waiter has finished and given its slot back; `_b` still holds one.
    assert_eq!(t.stats().in_flight, 1);
}

/// A slot's lane is one no other slot in flight on the worker holds, and the lane free
/// longest is granted first: one request at a time goes round every lane (a `php_children`
/// group's connections, one per lane, so its children take turns as behind php-fpm).
#[tokio::test(start_paused = true)]
async fn lanes_are_distinct_in_flight_and_taken_free_longest_first() {
    let t = table(8, 0, &[None]);
    ready_worker(&t, 3);
    let mut one_at_a_time = Vec::new();
    for _ in 0..6 {
        one_at_a_time.push(t.acquire(0).await.unwrap().lane());
    }
    let turn = [Some(0), Some(1), Some(2)];
    assert_eq!(one_at_a_time, [turn, turn].concat());
    let a = t.acquire(0).await.unwrap();
    let b = t.acquire(0).await.unwrap();
    assert_ne!(a.lane(), b.lane());
    let (freed_first, freed_last) = (b.lane(), a.lane());
    drop(b);
    drop(a);
    let c = t.acquire(0).await.unwrap();
    assert_eq!(
        c.lane(),
        Some(2),
        "free longest: never taken since the round"
    );
    assert_eq!(t.acquire(0).await.unwrap().lane(), freed_first);
    drop(c);
    assert_eq!(t.acquire(0).await.unwrap().lane(), freed_last);
}

#[tokio::test(start_paused = true)]
async fn queue_timeout_fires_and_leaks_nothing() {
    let t = table(1, 4, &[None]);
    ready_worker(&t, 1);
    let held = t.acquire(0).await.unwrap();
    let err = t.acquire(0).await.unwrap_err();
    assert_eq!(err, SlotError::QueueTimeout(Duration::from_secs(5)));
    drop(held);
    assert_eq!(
        t.stats(),
        SlotStats {
            in_flight: 0,
            queued: 0,
            accepting_workers: 1
        }
    );
    let again = t.acquire(0).await.unwrap();
    assert_eq!(t.stats().in_flight, 1);
    drop(again);
}

#[tokio::test(start_paused = true)]
async fn a_dropped_waiter_gives_its_grant_back() {
    let t = table(1, 4, &[None]);
    ready_worker(&t, 1);
    let held = t.acquire(0).await.unwrap();
    let waiter = tokio::spawn({
        let t = Arc::clone(&t);
        async move { t.acquire(0).await.map(|_| ()) }
    });
    tokio::task::yield_now().await;
    waiter.abort();
    let _ = waiter.await;
    drop(held);
    assert_eq!(t.stats().in_flight, 0);
    assert!(t.acquire(0).await.is_ok());
}

#[tokio::test(start_paused = true)]
async fn context_cap_holds_without_blocking_other_contexts() {
    let t = table(10, 10, &[Some(1), None]);
    ready_worker(&t, 10);
    let a = t.acquire(0).await.unwrap();
    let capped = tokio::spawn({
        let t = Arc::clone(&t);
        async move { t.acquire(0).await.map(|_| ()) }
    });
    tokio::task::yield_now().await;
    assert_eq!(t.stats().queued, 1);
    // Context 1 is not held back by the waiter of the capped context 0 ...
    let other = tokio::spawn({
        let t = Arc::clone(&t);
        async move { t.acquire(1).await.map(|_| ()) }
    });
    tokio::task::yield_now().await;
    assert!(other.is_finished());
    // ... and the capped one gets its slot when the first returns.
    drop(a);
    assert!(capped.await.unwrap().is_ok());
}

#[tokio::test(start_paused = true)]
async fn least_outstanding_worker_wins_and_retiring_workers_get_nothing() {
    let t = table(10, 0, &[None]);
    let w0 = ready_worker(&t, 4);
    let w1 = ready_worker(&t, 4);
    let s1 = t.acquire(0).await.unwrap();
    let s2 = t.acquire(0).await.unwrap();
    assert_eq!((s1.worker(), s2.worker()), (w0, w1));
    t.set_accepting(w0, false);
    let s3 = t.acquire(0).await.unwrap();
    assert_eq!(s3.worker(), w1);
    assert_eq!(t.worker_in_flight(w1), 2);
}

#[tokio::test(start_paused = true)]
async fn a_reused_entry_ignores_the_old_workers_late_release() {
    let t = table(10, 0, &[None]);
    let old = ready_worker(&t, 1);
    let late = t.acquire(0).await.unwrap();
    t.remove_worker(old);
    // The entry is still busy, so the new worker gets a fresh one.
    let new = ready_worker(&t, 1);
    assert_ne!(new.index, old.index);
    drop(late);
    let newer = {
        t.remove_worker(new);
        ready_worker(&t, 1)
    };
    assert_eq!(newer.index, old.index);
    assert_eq!(newer.generation, old.generation + 1);
    assert_eq!(t.worker_in_flight(old), 0);
}

#[tokio::test(start_paused = true)]
async fn a_worker_takes_no_request_past_its_budget() {
    let t = table(10, 0, &[None]);
    let w = t.add_worker(4, addr(), Some(3));
    t.set_accepting(w, true);
    let mut slots = Vec::new();
    for _ in 0..3 {
        slots.push(t.acquire(0).await.expect("within budget"));
    }
    assert!(t.acquire(0).await.is_err(), "a fourth request was given");
    let counts = t.workers();
    assert_eq!(counts[0].started, 3);
    assert!(!counts[0].accepting);
    drop(slots);
    assert_eq!(t.worker_in_flight(w), 0);
}

#[tokio::test(start_paused = true)]
async fn close_refuses_waiters_and_newcomers() {
    let t = table(1, 4, &[None]);
    ready_worker(&t, 1);
    let _held = t.acquire(0).await.unwrap();
    let waiter = tokio::spawn({
        let t = Arc::clone(&t);
        async move { t.acquire(0).await.map(|_| ()) }
    });
    tokio::task::yield_now().await;
    t.close();
    assert_eq!(waiter.await.unwrap().unwrap_err(), SlotError::Closed);
    assert_eq!(t.acquire(0).await.unwrap_err(), SlotError::Closed);
}

#[tokio::test(start_paused = true)]
async fn a_waiter_that_gives_up_leaves_the_queue_at_once() {
    let t = table(1, 2, &[None]);
    ready_worker(&t, 1);
    let _held = t.acquire(0).await.unwrap();
    // Two waiters time out, a third is dropped (its client went away).
    for _ in 0..2 {
        assert!(matches!(
            t.acquire(0).await,
            Err(SlotError::QueueTimeout(_))
        ));
    }
    let gone = tokio::spawn({
        let t = Arc::clone(&t);
        async move { t.acquire(0).await.map(|_| ()) }
    });
    tokio::task::yield_now().await;
    gone.abort();
    let _ = gone.await;
    assert_eq!(t.stats().queued, 0, "a waiter that gave up kept its place");
    // The queue has room for two again.
    let a = tokio::spawn({
        let t = Arc::clone(&t);
        async move { t.acquire(0).await.map(|_| ()) }
    });
    let b = tokio::spawn({
        let t = Arc::clone(&t);
        async move { t.acquire(0).await.map(|_| ()) }
    });
    tokio::task::yield_now().await;
    assert_eq!(t.stats().queued, 2);
    drop(_held);
    assert!(a.await.unwrap().is_ok());
    assert!(b.await.unwrap().is_ok());
}

#[tokio::test(start_paused = true)]
async fn a_refusing_worker_is_skipped_and_the_request_moves_on() {
    let t = table(4, 4, &[None]);
    let w0 = ready_worker(&t, 1);
    let w1 = ready_worker(&t, 1);
    let s = t.acquire(0).await.unwrap();
    assert_eq!(s.worker(), w0);
    assert_eq!(t.fail(w0), Failed::OutOfRotation);
    let s = t.reroute(s).await.unwrap();
    assert_eq!(s.worker(), w1);
    assert_eq!(t.worker_in_flight(w0), 0);
    assert_eq!(t.stats().in_flight, 1);
    drop(s);
    // w0 stays out until its supervisor replaces it.
    assert_eq!(t.acquire(0).await.unwrap().worker(), w1);
}

#[tokio::test(start_paused = true)]
async fn a_failing_server_is_out_for_fail_timeout_then_probed_back_in() {
    let t = table(8, 4, &[None]);
    t.set_fail_policy(FailPolicy {
        max_fails: 1,
        fail_timeout: Duration::from_secs(10),
    });
    let s0 = ready_worker(&t, 4);
    let s1 = ready_worker(&t, 4);
    let first = t.acquire(0).await.unwrap();
    assert_eq!(first.worker(), s0);
    assert_eq!(t.fail(s0), Failed::Down(Duration::from_secs(10)));
    drop(first);
    assert!(t.workers()[0].down_for.is_some());
    for _ in 0..3 {
        assert_eq!(t.acquire(0).await.unwrap().worker(), s1);
    }
    tokio::time::advance(Duration::from_secs(11)).await;
    // Back as a probe: one request at a time until one succeeds.
    let probe = t.acquire(0).await.unwrap();
    assert_eq!(probe.worker(), s0);
    assert!(probe.is_probe());
    let other = t.acquire(0).await.unwrap();
    assert_eq!(
        other.worker(),
        s1,
        "a second request went to a probed server"
    );
    assert!(t.succeeded(s0).is_some());
    assert!(t.workers()[0].down_for.is_none());
    let again = t.acquire(0).await.unwrap();
    assert_eq!(again.worker(), s0);
    drop((probe, other, again));
}

#[tokio::test(start_paused = true)]
async fn when_every_server_is_down_the_first_due_back_is_tried() {
    let t = table(8, 4, &[None]);
    t.set_fail_policy(FailPolicy {
        max_fails: 1,
        fail_timeout: Duration::from_secs(10),
    });
    let s0 = ready_worker(&t, 1);
    let s1 = ready_worker(&t, 1);
    t.fail(s1);
    tokio::time::advance(Duration::from_secs(1)).await;
    t.fail(s0);
    let tried = t.acquire(0).await.unwrap();
    assert_eq!(tried.worker(), s1);
    // Once one server is up again, a request waits for it rather than trying a down one.
    assert!(t.succeeded(s1).is_some());
    let busy = tried;
    let waiting = tokio::spawn({
        let t = Arc::clone(&t);
        async move { t.acquire(0).await.map(|s| s.worker()) }
    });
    tokio::task::yield_now().await;
    assert_eq!(t.stats().queued, 1);
    drop(busy);
    assert_eq!(waiting.await.unwrap().unwrap(), s1);
}

#[tokio::test(start_paused = true)]
async fn a_worker_due_for_a_memory_check_takes_nothing_until_checked() {
    let t = table(4, 4, &[None]);
    let w = ready_worker(&t, 1);
    t.check_memory_in(w, Some(1));
    drop(t.acquire(0).await.unwrap());
    assert_eq!(t.memory_checks().await, vec![w]);
    let waiting = tokio::spawn({
        let t = Arc::clone(&t);
        async move { t.acquire(0).await.map(|s| s.worker()) }
    });
    tokio::task::yield_now().await;
    assert_eq!(t.stats().queued, 1, "a worker being checked took a request");
    t.memory_checked(w, Some(2));
    assert_eq!(waiting.await.unwrap().unwrap(), w);
}

/// On serving threads, a freed slot goes to the oldest waiter, whichever thread it waits on
/// and whichever thread freed the slot: the queue is served in arrival order.
#[test]
fn a_freed_slot_goes_to_the_oldest_waiter_on_any_thread() {
    let shards = crate::shards::Shards::start(2, false, false).unwrap();
    let t = table(1, 100, &[None]);
    ready_worker(&t, 1);
    let on = |shard: usize| shards.handles()[shard].clone();
    // The one slot, held on thread 0.
    let (slot_tx, slot_rx) = std::sync::mpsc::channel();
    let t0 = Arc::clone(&t);
    on(0).spawn(async move { slot_tx.send(t0.acquire(0).await.unwrap()).unwrap() });
    let mut held = slot_rx.recv().unwrap();
    // Waiters in this order: A on thread 1, then B, C, D on thread 0.
    let (done_tx, done_rx) = std::sync::mpsc::channel::<(&str, Slot)>();
    let queue = |name: &'static str, shard: usize| {
        let table = Arc::clone(&t);
        let done = done_tx.clone();
        let before = t.stats().queued;
        on(shard).spawn(async move {
            let slot = table.acquire(0).await.unwrap();
            done.send((name, slot)).unwrap();
        });
        while t.stats().queued == before {
            std::thread::yield_now();
        }
    };
    queue("A", 1);
    queue("B", 0);
    queue("C", 0);
    queue("D", 0);
    let mut order = Vec::new();
    for _ in 0..4 {
        // Freed on thread 0, as a request ending there frees it.
        let (freed_tx, freed_rx) = std::sync::mpsc::channel();
        on(0).spawn(async move {
            drop(held);
            freed_tx.send(()).unwrap();
        });
        freed_rx.recv().unwrap();
        let (name, slot) = done_rx.recv().unwrap();
        order.push(name);
        held = slot;
    }
    // Arrival order, although every slot was freed on thread 0 and only A waits elsewhere
    // (a hand-off preferring the freeing thread's waiters gave B, C, A, D).
    assert_eq!(order, ["A", "B", "C", "D"]);
    drop(held);
    assert_eq!(t.stats().in_flight, 0);
}

/// Many tasks hammer a small table; the caps hold at every instant and every slot comes
/// back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn caps_hold_under_contention() {
    let t = SlotTable::new(
        SlotLimits {
            max_conns: 3,
            queue_size: 1000,
            queue_timeout: Duration::from_secs(30),
        },
        &[Some(2), None],
    );
    for _ in 0..2 {
        ready_worker(&t, 2);
    }
    let peak = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for i in 0..200 {
        let t = Arc::clone(&t);
        let peak = Arc::clone(&peak);
        tasks.push(tokio::spawn(async move {
            let slot = t.acquire(i % 2).await.unwrap();
            let now = t.stats().in_flight;
            peak.fetch_max(now, std::sync::atomic::Ordering::Relaxed);
            assert!(t.worker_in_flight(slot.worker()) <= 2);
            tokio::task::yield_now().await;
        }));
    }
    for task in tasks {
        task.await.unwrap();
    }
    assert!(peak.load(std::sync::atomic::Ordering::Relaxed) <= 3);
    assert_eq!(t.stats().in_flight, 0);
    assert_eq!(t.stats().queued, 0);
}

/// Whether `t.demand()` has resolved once `waiter` has queued.
async fn demand_woken_by_a_waiter(t: &Arc<SlotTable>) -> bool {
    let waiter = tokio::spawn({
        let t = Arc::clone(t);
        async move { t.acquire(0).await.map(|s| s.worker()) }
    });
    tokio::task::yield_now().await;
    assert_eq!(t.stats().queued, 1);
    let woken = tokio::time::timeout(Duration::from_millis(1), t.demand())
        .await
        .is_ok();
    waiter.abort();
    woken
}

#[tokio::test(start_paused = true)]
async fn a_waiter_wakes_the_supervisor_only_where_it_may_grow() {
    let t = table(1, 4, &[None]);
    ready_worker(&t, 1);
    let _held = t.acquire(0).await.unwrap();
    // By default (dynamic and ondemand pools) a queued request wakes the supervisor.
    assert!(demand_woken_by_a_waiter(&t).await);
    // A static pool's supervisor is left asleep: it reads the queue at its tick.
    t.wake_on_demand(false);
    assert!(!demand_woken_by_a_waiter(&t).await);
    t.wake_on_demand(true);
    assert!(demand_woken_by_a_waiter(&t).await);
}

/// Whether the supervisor's demand wait is woken (within 1 ms of paused time).
async fn woken(t: &Arc<SlotTable>) -> bool {
    tokio::time::timeout(Duration::from_millis(1), t.demand())
        .await
        .is_ok()
}

#[tokio::test(start_paused = true)]
async fn a_worker_spending_its_budget_wakes_the_supervisor_even_when_asleep() {
    let t = table(4, 4, &[None]);
    t.wake_on_demand(false);
    let id = t.add_worker(1, addr(), Some(2));
    t.set_accepting(id, true);
    drop(t.acquire(0).await.unwrap());
    assert!(!woken(&t).await, "the first of two requests wakes nobody");
    // The second is the last of its budget: the supervisor must replace the worker now.
    drop(t.acquire(0).await.unwrap());
    assert!(woken(&t).await);
    assert!(!woken(&t).await, "one wake-up per spent budget");
}

#[tokio::test(start_paused = true)]
async fn a_supervisor_at_rest_is_woken_by_the_next_request_once() {
    let t = table(2, 4, &[None]);
    t.wake_on_demand(false);
    let id = ready_worker(&t, 1);
    // Nothing in flight or waiting, nothing counted that the supervisor has not taken.
    assert!(t.wake_at_next_request());
    let held = t.acquire(0).await.unwrap();
    assert!(woken(&t).await, "the first request after a rest wakes it");
    drop(held);
    assert!(!woken(&t).await, "once");
    // A request it has not heard of yet: not at rest, nothing asked.
    assert!(!t.wake_at_next_request());
    drop(t.acquire(0).await.unwrap());
    assert!(!woken(&t).await);
    // A request in flight: not at rest either, even with every count taken.
    let held = t.acquire(0).await.unwrap();
    t.take_request_deltas();
    assert!(!t.wake_at_next_request());
    drop(held);
    t.take_request_deltas();
    // A request that finds no worker free and waits wakes it too, even in a pool where a
    // waiting request wakes nobody; once.
    t.set_accepting(id, false);
    assert!(t.wake_at_next_request());
    assert!(demand_woken_by_a_waiter(&t).await);
    assert!(!demand_woken_by_a_waiter(&t).await);
}
