//! Request counters of one pool that only the gateway knows: requests accepted, queued,
//! refused and failed, and how long they waited. The request path touches them with relaxed
//! atomics only (no lock); the status page reads them at any time.
//!
//! Queueing is seen from outside the slot table: [`RequestStats::acquire`] polls the table's
//! `acquire` once, and a request that is not served by that first poll has joined the queue.
//! That gives the live queue length, its maximum and the number of saturation episodes
//! (php-fpm's "max children reached" counts episodes, not queued requests) without any change
//! to the table's own locking. An episode is counted only when the pool is at its limit as
//! the request starts to wait (every slot its `max` workers or `max_conns` allow is taken):
//! a request waiting for an on-demand pool's first worker, or for a dynamic pool to grow,
//! met no limit, as php-fpm only counts when it would spawn but may not.

use std::future::Future;
use std::pin::pin;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::Poll;

use std::time::Duration;
use tokio::time::Instant;

use crate::backend::BackendError;
use crate::pool::slots::{Slot, SlotError, SlotTable};

use crate::pool::histogram::{add, raise, Writer};
pub use crate::pool::histogram::{Histogram, HistogramSnapshot, BUCKETS};
pub use crate::pool::request_timer::RequestTimer;

/// Kinds of backend failure, as the status page counts them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BackendErrorKind {
    /// Connecting failed or timed out.
    Connect,
    /// Reading or writing failed, or the backend closed the connection early.
    Io,
    /// The backend broke the protocol.
    Protocol,
    /// The backend refused the request (FastCGI OVERLOADED and friends).
    Refused,
    /// First-byte or whole-request timeout.
    Timeout,
}

impl BackendErrorKind {
    /// Every kind, in the order the status page lists them.
    pub const ALL: [BackendErrorKind; 5] = [
        BackendErrorKind::Connect,
        BackendErrorKind::Io,
        BackendErrorKind::Protocol,
        BackendErrorKind::Refused,
        BackendErrorKind::Timeout,
    ];

    /// The label used in text, JSON and metrics.
    pub fn name(self) -> &'static str {
        match self {
            BackendErrorKind::Connect => "connect",
            BackendErrorKind::Io => "io",
            BackendErrorKind::Protocol => "protocol",
            BackendErrorKind::Refused => "refused",
            BackendErrorKind::Timeout => "timeout",
        }
    }

    /// The kind of a failed exchange, or `None` when the client or corral itself was at
    /// fault (a broken upload is not a backend error).
    pub fn of(e: &BackendError) -> Option<BackendErrorKind> {
        Some(match e {
            BackendError::Connect { .. } => BackendErrorKind::Connect,
            BackendError::Write { .. }
            | BackendError::Read { .. }
            | BackendError::ClosedEarly { .. }
            | BackendError::StaleReset { .. }
            | BackendError::StaleRead { .. } => BackendErrorKind::Io,
            BackendError::Protocol { .. } => BackendErrorKind::Protocol,
            BackendError::Refused { .. } => BackendErrorKind::Refused,
            BackendError::FirstByteTimeout { .. } | BackendError::RequestTimeout { .. } => {
                BackendErrorKind::Timeout
            }
            _ => return None,
        })
    }
}

/// One pool's request counters: a share per serving thread, each on cache lines of its own
/// and written by that thread alone, added up when the status page reads them (issue 19's
/// "per-thread counters"). Requests off the serving threads (the work-stealing scheduler,
/// tests) count into a shared share with atomic read-modify-writes.
#[derive(Debug)]
pub struct RequestStats {
    /// Slots the pool can ever have at once: `max_conns`, or fewer when `max` workers of
    /// their concurrency give fewer. In-flight requests at this are "max children reached".
    capacity: usize,
    /// Requests waiting now: a gauge that goes up and down on any thread, touched only by
    /// requests that wait.
    queued_now: AtomicUsize,
    /// The share of requests off the serving threads.
    shared: Share,
    /// One share per serving thread, by its index.
    threads: Box<[Share]>,
}

/// One thread's counts. Aligned so that two threads' shares never share a cache line.
#[derive(Debug, Default)]
#[repr(align(128))]
struct Share {
    accepted: AtomicU64,
    queued_total: AtomicU64,
    max_queued: AtomicUsize,
    saturated: AtomicU64,
    max_in_flight: AtomicUsize,
    rejected_queue_full: AtomicU64,
    queue_timeouts: AtomicU64,
    rejected_closed: AtomicU64,
    backend_errors: [AtomicU64; BackendErrorKind::ALL.len()],
    resent: AtomicU64,
    front_gone: AtomicU64,
    /// Time from asking for a slot to having one.
    queue_wait: Histogram,
    /// Time from having a slot to having a backend connection (an idle kept connection
    /// makes it near zero).
    connect: Histogram,
    /// Time from starting to send the request to having the backend's response head.
    first_byte: Histogram,
    /// Time from asking for a slot to the end of the response body, for requests that
    /// ended cleanly.
    total: Histogram,
}

/// The phases a request is timed in, one histogram each.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// Asking for a slot to having one.
    QueueWait,
    /// Having a slot to having a backend connection.
    Connect,
    /// Starting to send the request to having the response head.
    FirstByte,
    /// Asking for a slot to the end of the response body (clean ends only).
    Total,
}

impl Share {
    fn histogram(&self, phase: Phase) -> &Histogram {
        match phase {
            Phase::QueueWait => &self.queue_wait,
            Phase::Connect => &self.connect,
            Phase::FirstByte => &self.first_byte,
            Phase::Total => &self.total,
        }
    }
}

/// [`RequestStats`] read at one moment.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RequestSnapshot {
    /// Requests that got a slot (php-fpm's "accepted conn").
    pub accepted: u64,
    /// Requests that had to wait in the queue.
    pub queued_total: u64,
    /// Requests waiting now, as counted here.
    pub queued_now: usize,
    /// Most requests ever waiting at once (php-fpm's "max listen queue").
    pub max_queued: usize,
    /// Times the queue went from empty to non-empty while every slot the pool may ever
    /// have was busy (php-fpm's "max children reached", which also counts episodes).
    pub saturated: u64,
    /// Most requests ever holding a slot at once (php-fpm's "max active processes" when
    /// each worker serves one request at a time).
    pub max_in_flight: usize,
    /// Requests refused at once because the queue was full.
    pub rejected_queue_full: u64,
    /// Requests that waited `queue_timeout` in vain.
    pub queue_timeouts: u64,
    /// Requests refused because the pool was stopping.
    pub rejected_closed: u64,
    /// Backend failures, one entry per [`BackendErrorKind::ALL`].
    pub backend_errors: [u64; BackendErrorKind::ALL.len()],
    /// Requests sent once more on a new connection after their kept connection was lost
    /// before the answer (ARCHITECTURE.md invariant 6); the failure that caused it is not
    /// among `backend_errors`.
    pub resent: u64,
    /// Requests that waited for a slot and were dropped, unsent, because their front
    /// connection had closed meanwhile (they count among `accepted` too: they got a slot).
    pub front_gone: u64,
}

impl RequestSnapshot {
    /// Backend failures of every kind.
    pub fn backend_errors_total(&self) -> u64 {
        self.backend_errors.iter().sum()
    }
}

/// Takes one off the queued-now count when the waiting request leaves the queue, however
/// it leaves (a slot, a timeout, or the client going away and the future being dropped).
struct Queued<'a>(&'a AtomicUsize);

impl Drop for Queued<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

impl RequestStats {
    /// New counters for a pool that can have `capacity` requests in flight at most, with a
    /// share for each of `threads` serving threads, shared between the gateway and the
    /// status page.
    pub fn new(capacity: usize, threads: usize) -> Arc<RequestStats> {
        Arc::new(RequestStats {
            capacity,
            queued_now: AtomicUsize::new(0),
            shared: Share::default(),
            threads: (0..threads).map(|_| Share::default()).collect(),
        })
    }

    /// The calling thread's share, and how it may be written.
    fn local(&self) -> (&Share, Writer) {
        match crate::shards::current().and_then(|i| self.threads.get(i)) {
            Some(share) => (share, Writer::Owner),
            None => (&self.shared, Writer::Shared),
        }
    }

    /// Every share, for reading.
    fn shares(&self) -> impl Iterator<Item = &Share> + Clone {
        std::iter::once(&self.shared).chain(self.threads.iter())
    }

    /// Records how long a request spent in `phase`.
    pub fn observe(&self, phase: Phase, d: Duration) {
        let (share, writer) = self.local();
        share.histogram(phase).observe_as(d, writer);
    }

    /// The histogram of `phase`, every thread's added up.
    pub fn histogram(&self, phase: Phase) -> HistogramSnapshot {
        Histogram::sum_of(self.shares().map(|s| s.histogram(phase)))
    }

    /// Checks a slot out of `slots` for `context` as [`SlotTable::acquire`] does, counting
    /// the outcome and the wait.
    pub async fn acquire(&self, slots: &Arc<SlotTable>, context: usize) -> Result<Slot, SlotError> {
        let asked = Instant::now();
        self.acquire_since(slots, context, asked)
            .await
            .map(|(slot, _)| slot)
    }

    /// [`RequestStats::acquire`] for a request that asked at `asked` (its timer's start, so
    /// that the clock is not read again for it); returns the slot and when it was had, the
    /// one clock reading the wait and the next phase share. A slot granted at the first poll
    /// was had without waiting: `asked` stands for that moment (the slot table's lock takes
    /// well under the microsecond the histograms count in), so the clock is read only for a
    /// request that queued.
    pub async fn acquire_since(
        &self,
        slots: &Arc<SlotTable>,
        context: usize,
        asked: Instant,
    ) -> Result<(Slot, Instant), SlotError> {
        let mut acquiring = pin!(slots.acquire_at(context, asked));
        // The first poll either serves the request, refuses it, or leaves it in the queue.
        let first = std::future::poll_fn(|cx| Poll::Ready(acquiring.as_mut().poll(cx))).await;
        let mut queued = false;
        let result = match first {
            Poll::Ready(r) => r,
            Poll::Pending => {
                queued = true;
                let (share, writer) = self.local();
                add(&share.queued_total, 1, writer);
                let before = self.queued_now.fetch_add(1, Ordering::Relaxed);
                let _queued = Queued(&self.queued_now);
                // The requests ahead of this one (in flight and waiting) already take every
                // slot the pool may ever have: its limit is reached. One episode per queue
                // that forms at the limit or per crossing of it, however many then wait.
                let ahead = slots.stats().in_flight + before;
                if ahead >= self.capacity && (before == 0 || ahead == self.capacity) {
                    add(&share.saturated, 1, writer);
                }
                raise(&share.max_queued, before + 1, writer);
                acquiring.await
            }
        };
        // Looked up again: a request that waited may be woken on another thread (the
        // work-stealing scheduler), whose share it then counts in.
        let (share, writer) = self.local();
        let had = match &result {
            Ok(slot) => {
                let (had, waited) = if queued {
                    let had = Instant::now();
                    (had, had - asked)
                } else {
                    (asked, Duration::ZERO)
                };
                add(&share.accepted, 1, writer);
                share.queue_wait.observe_as(waited, writer);
                raise(&share.max_in_flight, slot.in_flight_at_grant(), writer);
                had
            }
            Err(SlotError::QueueFull { .. }) => {
                add(&share.rejected_queue_full, 1, writer);
                asked
            }
            Err(SlotError::QueueTimeout(_)) => {
                add(&share.queue_timeouts, 1, writer);
                asked
            }
            Err(SlotError::Closed) => {
                add(&share.rejected_closed, 1, writer);
                asked
            }
        };
        result.map(|slot| (slot, had))
    }

    /// Counts a request sent once more after its kept connection was lost before the answer.
    pub fn resent(&self) {
        let (share, writer) = self.local();
        add(&share.resent, 1, writer);
    }

    /// Counts a request that got its slot after waiting, and was dropped unsent because its
    /// front connection had closed meanwhile.
    pub fn front_gone(&self) {
        let (share, writer) = self.local();
        add(&share.front_gone, 1, writer);
    }

    /// Counts a failed exchange if the backend was at fault.
    pub fn backend_error(&self, e: &BackendError) {
        let Some(kind) = BackendErrorKind::of(e) else {
            return;
        };
        let i = BackendErrorKind::ALL
            .iter()
            .position(|k| *k == kind)
            .unwrap_or(0);
        let (share, writer) = self.local();
        if let Some(c) = share.backend_errors.get(i) {
            add(c, 1, writer);
        }
    }

    /// The counters now, every thread's added up (maxima: the largest of them).
    pub fn snapshot(&self) -> RequestSnapshot {
        let sum = |f: fn(&Share) -> &AtomicU64| {
            self.shares()
                .fold(0u64, |n, s| n.saturating_add(f(s).load(Ordering::Relaxed)))
        };
        let max = |f: fn(&Share) -> &AtomicUsize| {
            self.shares()
                .map(|s| f(s).load(Ordering::Relaxed))
                .max()
                .unwrap_or(0)
        };
        let mut backend_errors = [0; BackendErrorKind::ALL.len()];
        for (i, out) in backend_errors.iter_mut().enumerate() {
            *out = self
                .shares()
                .filter_map(|s| s.backend_errors.get(i))
                .fold(0u64, |n, c| n.saturating_add(c.load(Ordering::Relaxed)));
        }
        RequestSnapshot {
            accepted: sum(|s| &s.accepted),
            queued_total: sum(|s| &s.queued_total),
            queued_now: self.queued_now.load(Ordering::Relaxed),
            max_queued: max(|s| &s.max_queued),
            saturated: sum(|s| &s.saturated),
            max_in_flight: max(|s| &s.max_in_flight),
            rejected_queue_full: sum(|s| &s.rejected_queue_full),
            queue_timeouts: sum(|s| &s.queue_timeouts),
            rejected_closed: sum(|s| &s.rejected_closed),
            backend_errors,
            resent: sum(|s| &s.resent),
            front_gone: sum(|s| &s.front_gone),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::BackendAddress;
    use crate::pool::slots::SlotLimits;
    use std::time::Duration;

    #[test]
    fn histogram_buckets_are_cumulative() {
        let h = Histogram::default();
        h.observe(Duration::from_micros(500));
        h.observe(Duration::from_millis(30));
        h.observe(Duration::from_secs(60));
        let s = h.snapshot();
        assert_eq!(s.cumulative.len(), BUCKETS.len() + 1);
        assert_eq!(s.cumulative[0], 1);
        assert_eq!(s.cumulative[4], 2, "0.05 s bucket holds 0.5 ms and 30 ms");
        assert_eq!(s.cumulative[BUCKETS.len() - 1], 2);
        assert_eq!(s.count(), 3);
        assert!((s.sum - 60.0305).abs() < 1e-9);
    }

    #[tokio::test(start_paused = true)]
    async fn queueing_is_counted_from_outside_the_table() {
        let slots = SlotTable::new(
            SlotLimits {
                max_conns: 1,
                queue_size: 1,
                queue_timeout: Duration::from_secs(1),
            },
            &[None],
        );
        let w = slots.add_worker(1, BackendAddress::Unix("/tmp/x.sock".into()), None);
        slots.set_accepting(w, true);
        let stats = RequestStats::new(1, 0);
        let held = stats.acquire(&slots, 0).await.unwrap();
        let waiting = {
            let (stats, slots) = (Arc::clone(&stats), Arc::clone(&slots));
            tokio::spawn(async move { stats.acquire(&slots, 0).await.map(drop) })
        };
        tokio::task::yield_now().await;
        assert_eq!(stats.snapshot().queued_now, 1);
        assert!(matches!(
            stats.acquire(&slots, 0).await,
            Err(SlotError::QueueFull { .. })
        ));
        // The waiter times out after a second.
        assert!(matches!(
            waiting.await.unwrap(),
            Err(SlotError::QueueTimeout(_))
        ));
        drop(held);
        let s = stats.snapshot();
        assert_eq!(s.accepted, 1);
        assert_eq!(s.queued_total, 1);
        assert_eq!(s.queued_now, 0);
        assert_eq!(s.max_queued, 1);
        assert_eq!(s.saturated, 1);
        assert_eq!(s.max_in_flight, 1);
        assert_eq!(s.rejected_queue_full, 1);
        assert_eq!(s.queue_timeouts, 1);
    }

    /// The ages status shows come from the instants the table keeps per slot and per
    /// waiter: the oldest slot in use, whichever finishes first, and the oldest waiter.
    #[tokio::test(start_paused = true)]
    async fn the_oldest_request_in_flight_and_in_the_queue_are_aged() {
        let slots = SlotTable::new(
            SlotLimits {
                max_conns: 2,
                queue_size: 4,
                queue_timeout: Duration::from_secs(60),
            },
            &[None],
        );
        let w = slots.add_worker(2, BackendAddress::Unix("/tmp/x.sock".into()), None);
        slots.set_accepting(w, true);
        let stats = RequestStats::new(2, 0);
        assert_eq!(slots.ages(), crate::pool::slots::SlotAges::default());
        let old = stats.acquire(&slots, 0).await.unwrap();
        tokio::time::advance(Duration::from_secs(3)).await;
        let young = stats.acquire(&slots, 0).await.unwrap();
        tokio::time::advance(Duration::from_secs(1)).await;
        let waiting = {
            let (stats, slots) = (Arc::clone(&stats), Arc::clone(&slots));
            tokio::spawn(async move { stats.acquire(&slots, 0).await.map(drop) })
        };
        tokio::task::yield_now().await;
        tokio::time::advance(Duration::from_secs(2)).await;
        let ages = slots.ages();
        assert_eq!(ages.oldest_in_flight, Some(Duration::from_secs(6)));
        assert_eq!(ages.oldest_queued, Some(Duration::from_secs(2)));
        // The oldest finishes: the waiter gets its slot, timed from its grant, and the
        // younger one is now the oldest.
        drop(old);
        waiting.await.unwrap().unwrap();
        let ages = slots.ages();
        assert_eq!(ages.oldest_in_flight, Some(Duration::from_secs(3)));
        assert_eq!(ages.oldest_queued, None);
        drop(young);
        assert_eq!(slots.ages().oldest_in_flight, None);
        assert!(stats.histogram(Phase::QueueWait).sum >= 2.0);
    }

    #[tokio::test(start_paused = true)]
    async fn waiting_below_the_limit_is_not_max_children_reached() {
        // An on-demand pool of up to 2 workers: the first request waits for a worker to be
        // started, which is no limit reached.
        let slots = SlotTable::new(
            SlotLimits {
                max_conns: 2,
                queue_size: 4,
                queue_timeout: Duration::from_secs(5),
            },
            &[None],
        );
        let stats = RequestStats::new(2, 0);
        let first = {
            let (stats, slots) = (Arc::clone(&stats), Arc::clone(&slots));
            tokio::spawn(async move { stats.acquire(&slots, 0).await })
        };
        tokio::task::yield_now().await;
        assert_eq!(stats.snapshot().queued_now, 1);
        let a = slots.add_worker(1, BackendAddress::Unix("/tmp/a.sock".into()), None);
        slots.set_accepting(a, true);
        let first = first.await.unwrap().unwrap();
        assert_eq!(
            stats.snapshot().saturated,
            0,
            "waited for a spawn, not a limit"
        );
        // Both workers busy at max: the third request meets the limit.
        let b = slots.add_worker(1, BackendAddress::Unix("/tmp/b.sock".into()), None);
        slots.set_accepting(b, true);
        let second = stats.acquire(&slots, 0).await.unwrap();
        let third = {
            let (stats, slots) = (Arc::clone(&stats), Arc::clone(&slots));
            tokio::spawn(async move { stats.acquire(&slots, 0).await.map(drop) })
        };
        tokio::task::yield_now().await;
        assert_eq!(stats.snapshot().saturated, 1);
        drop(first);
        third.await.unwrap().unwrap();
        drop(second);
        assert_eq!(stats.snapshot().queued_total, 2);
    }
}

/// The shares are read back added up: requests counted on two serving threads (each in its
/// own share, with no locked instruction) and off them (the shared share) all show.
#[cfg(test)]
mod per_thread {
    use super::*;
    use crate::config::BackendAddress;
    use crate::pool::slots::SlotLimits;

    #[test]
    fn every_threads_share_is_summed_when_read() {
        let slots = SlotTable::new(
            SlotLimits {
                max_conns: 8,
                queue_size: 8,
                queue_timeout: std::time::Duration::from_secs(5),
            },
            &[None],
        );
        let w = slots.add_worker(8, BackendAddress::Unix("/tmp/x.sock".into()), None);
        slots.set_accepting(w, true);
        let stats = RequestStats::new(8, 2);
        let shards = crate::shards::Shards::start(2, false, false).unwrap();
        for (i, handle) in shards.handles().iter().enumerate() {
            let (stats, slots) = (Arc::clone(&stats), Arc::clone(&slots));
            let (tx, rx) = std::sync::mpsc::channel();
            handle.spawn(async move {
                for _ in 0..=i {
                    let slot = stats.acquire(&slots, 0).await.unwrap();
                    stats.observe(Phase::Total, std::time::Duration::from_millis(2));
                    drop(slot);
                }
                stats.backend_error(&BackendError::Protocol {
                    protocol: crate::backend::Protocol::FastCgi,
                    rule: "test".into(),
                });
                let _ = tx.send(());
            });
            rx.recv().unwrap();
        }
        // Off the serving threads: the shared share.
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let held = runtime.block_on(async {
            let a = stats.acquire(&slots, 0).await.unwrap();
            let b = stats.acquire(&slots, 0).await.unwrap();
            (a, b)
        });
        let own = |s: &Share| s.accepted.load(Ordering::Relaxed);
        assert_eq!(stats.threads.iter().map(own).collect::<Vec<_>>(), [1, 2]);
        assert_eq!(own(&stats.shared), 2);
        let s = stats.snapshot();
        assert_eq!(s.accepted, 5);
        assert_eq!(s.max_in_flight, 2, "the largest of the threads' maxima");
        assert_eq!(s.backend_errors_total(), 2);
        assert_eq!(stats.histogram(Phase::Total).count(), 3);
        assert_eq!(stats.histogram(Phase::QueueWait).count(), 5);
        drop(held);
    }
}
