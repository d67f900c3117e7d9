//! Front connection limits: the caps on open connections (server-wide, and per client address
//! on each listener) and the phase of each connection (waiting for a head, handling a
//! request, idle between requests) that the caps and the timeouts read.
//!
//! Files: `limits/admission.rs` (the caps and the tables that count connections against
//! them), `limits/watched.rs` (the stream that notes a head's first byte and bounds blocked
//! writes); this file holds the phases and their deadlines.
//!
//! # Phases and timeouts
//!
//! A [`ConnState`] is shared by the connection's reader (through [`Watched`], which notes the
//! first byte of a head), its request handling ([`ConnState::begin`] / [`BusyGuard`]) and the
//! cap table. State changes are atomics plus a [`Notify`] on the few transitions (first head
//! byte, request start, last request end), so the per-read cost is two relaxed loads.

mod admission;
mod keyhash;
mod watched;

pub use admission::{
    client_key, derived_max_connections, Admission, AdmissionSnapshot, Client, Ticket,
    STATUS_MAX_CONNECTIONS,
};
pub use watched::Watched;

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;

use crate::config::FrontTimeouts;
use crate::front::eviction::Eviction;

/// Timeouts of the status listener: its requests have no body and are answered at once.
pub const STATUS_TIMEOUTS: FrontTimeouts = FrontTimeouts {
    header: Duration::from_secs(5),
    idle: Duration::from_secs(10),
    body: Duration::from_secs(5),
    send: Duration::from_secs(10),
    body_total: Duration::from_secs(10),
};

/// Sentinel for "no time" in the atomics below.
const NONE: u64 = u64::MAX;
/// Shortest sleep of the watch while a request is handled (with tiny configured timeouts it
/// would otherwise wake over and over for nothing).
const BUSY_RECHECK_MIN: Duration = Duration::from_millis(100);

/// Why a connection's watch ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Expired {
    /// No complete request head within `header_timeout`.
    Head,
    /// No new request within `idle_timeout` on a kept-alive connection.
    Idle,
    /// No request-body bytes within `body_timeout` while a body was being read.
    Body,
    /// Closed to make room for a new connection beyond a cap.
    Evicted,
}

impl std::fmt::Display for Expired {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Expired::Head => "no complete request head within header_timeout",
            Expired::Idle => "no new request within idle_timeout",
            Expired::Body => "no request body bytes within body_timeout",
            Expired::Evicted => "closed while idle to make room under the connection cap",
        })
    }
}

/// The phase of one connection, shared by its reader, its requests and the cap table.
#[derive(Debug)]
pub struct ConnState {
    /// Times below are milliseconds since this instant (the table's, so they compare).
    epoch: Instant,
    /// Requests being handled now.
    busy: AtomicU32,
    /// When the connection last became idle (accept, or the end of its last request).
    idle_since: AtomicU64,
    /// When the first byte of a head not yet handled arrived ([`NONE`] = none); a new
    /// connection counts from accept.
    head_since: AtomicU64,
    /// Woken when the deadline moves earlier than the one the watch sleeps until.
    changed: Notify,
    /// The deadline (ms) the watch sleeps until, [`NONE`] while it waits without one (or
    /// reads the state). A change that leaves the deadline later than this one needs no
    /// wake-up: the watch finds it when it wakes, so a kept-alive connection costs one
    /// timer per timeout period rather than two wake-ups per request.
    armed: AtomicU64,
    /// The watch's `header_timeout` and `idle_timeout` in ms (0 before it starts).
    header_ms: AtomicU64,
    idle_ms: AtomicU64,
    /// Set when the cap table closes this connection.
    evicted: Eviction,
}

impl ConnState {
    fn new(epoch: Instant) -> ConnState {
        let state = ConnState {
            epoch,
            busy: AtomicU32::new(0),
            idle_since: AtomicU64::new(0),
            head_since: AtomicU64::new(0),
            changed: Notify::new(),
            armed: AtomicU64::new(NONE),
            header_ms: AtomicU64::new(0),
            idle_ms: AtomicU64::new(0),
            evicted: Eviction::default(),
        };
        let now = state.now_ms();
        state.idle_since.store(now, Ordering::Relaxed);
        state.head_since.store(now, Ordering::Relaxed);
        state
    }

    /// A state outside any table, for a connection nobody caps (tests, tools).
    pub fn detached() -> Arc<ConnState> {
        Arc::new(ConnState::new(Instant::now()))
    }

    fn now_ms(&self) -> u64 {
        u64::try_from(self.epoch.elapsed().as_millis()).unwrap_or(NONE - 1)
    }

    /// [`now_ms`](Self::now_ms) for a clock reading made already.
    fn ms_at(&self, at: Instant) -> u64 {
        u64::try_from(at.saturating_duration_since(self.epoch).as_millis()).unwrap_or(NONE - 1)
    }

    fn at(&self, ms: u64) -> Instant {
        self.epoch + Duration::from_millis(ms)
    }

    /// Bytes arrived from the peer: on an idle connection, the head of a request has begun.
    /// Bytes read while a request is handled are its body (or pipelined requests).
    pub fn on_read(&self) {
        if self.busy.load(Ordering::Relaxed) == 0 && self.head_since.load(Ordering::Relaxed) == NONE
        {
            let now = self.now_ms();
            self.head_since.store(now, Ordering::Relaxed);
            self.wake_if_before(now.saturating_add(self.header_ms.load(Ordering::Relaxed)));
        }
    }

    /// Wakes the watch when `deadline` (ms) comes before the one it sleeps until.
    fn wake_if_before(&self, deadline: u64) {
        if deadline < self.armed.load(Ordering::SeqCst) {
            self.changed.notify_one();
        }
    }

    /// A request head is complete and its handling starts; the connection is busy until the
    /// guard is dropped.
    pub fn begin(self: &Arc<Self>) -> BusyGuard {
        self.busy.fetch_add(1, Ordering::Relaxed);
        self.head_since.store(NONE, Ordering::Relaxed);
        // No deadline while busy, which is later than any: the watch, when its timer fires,
        // finds the connection busy and waits for its end.
        BusyGuard {
            state: Arc::clone(self),
            ended_at: None,
        }
    }

    /// Whether no request is being handled.
    pub fn is_idle(&self) -> bool {
        self.busy.load(Ordering::Relaxed) == 0
    }

    /// Set when the cap table closes this connection.
    pub fn evicted(&self) -> &Eviction {
        &self.evicted
    }

    /// The cap table closes this connection: its eviction is set, and the HTTP watch, which
    /// waits on `changed` rather than on the eviction too (one wait registered per
    /// connection, not two), is woken to see it.
    fn evict(&self) {
        self.evicted.cancel();
        self.changed.notify_one();
    }

    /// When the connection must be closed, and why, if nothing changes before then; `None`
    /// while a request is handled (its own timeouts bound it).
    pub fn deadline(&self, t: &FrontTimeouts) -> Option<(Instant, Expired)> {
        if !self.is_idle() {
            return None;
        }
        match self.head_since.load(Ordering::Relaxed) {
            NONE => Some((
                self.at(self.idle_since.load(Ordering::Relaxed)) + t.idle,
                Expired::Idle,
            )),
            head => Some((self.at(head) + t.header, Expired::Head)),
        }
    }

    /// Returns when the connection has to be closed: its head or idle deadline passed, or
    /// the cap table evicted it. Never returns while a request is handled: the table only
    /// evicts idle connections, and one whose next request began just as it was picked is
    /// closed when that request ends.
    pub async fn watch(&self, t: FrontTimeouts) -> Expired {
        let ms = |d: Duration| u64::try_from(d.as_millis()).unwrap_or(NONE - 1);
        self.header_ms.store(ms(t.header), Ordering::Relaxed);
        self.idle_ms.store(ms(t.idle), Ordering::Relaxed);
        loop {
            // `notify_one` keeps a permit when nobody waits, so a change between reading
            // the state and waiting is not lost; while the state is read, `armed` is NONE,
            // so every change wakes.
            let changed = self.changed.notified();
            self.armed.store(NONE, Ordering::SeqCst);
            let evicted = self.evicted.is_cancelled();
            if evicted && self.is_idle() {
                return Expired::Evicted;
            }
            // While a request is handled there is no deadline, but the watch still sleeps
            // until a time no later than any deadline the connection can get next (a head's
            // or an idle wait's, both counted from a moment after now): sleeping "until woken"
            // instead made every request wake it twice, at its first byte and at its end.
            let at = match self.deadline(&t) {
                Some((at, _)) => at,
                None => Instant::now() + t.header.min(t.idle).max(BUSY_RECHECK_MIN),
            };
            self.armed.store(
                ms(at.saturating_duration_since(self.epoch)),
                Ordering::SeqCst,
            );
            let expiry = tokio::time::sleep_until(at);
            // An eviction wakes `changed` too ([`ConnState::evict`]).
            tokio::select! {
                () = changed => {}
                () = expiry => {
                    if let Some((at, why)) = self.deadline(&t) {
                        if at <= Instant::now() {
                            return why;
                        }
                    }
                }
            }
        }
    }
}

/// Marks one request in progress on a connection; dropping it ends the request.
#[derive(Debug)]
pub struct BusyGuard {
    state: Arc<ConnState>,
    /// When the request ended, if the holder knows it without reading the clock.
    ended_at: Option<Instant>,
}

impl BusyGuard {
    /// The request ended at `at`, a clock reading its holder made anyway (the end of the
    /// response body, which the request's timer read): the idle wait that follows counts
    /// from it, and the drop reads no clock of its own.
    pub fn ended_at(&mut self, at: Instant) {
        self.ended_at = Some(at);
    }
}

impl Drop for BusyGuard {
    fn drop(&mut self) {
        let state = &self.state;
        if state.busy.fetch_sub(1, Ordering::Relaxed) == 1 {
            let now = match self.ended_at {
                Some(at) => state.ms_at(at),
                None => state.now_ms(),
            };
            state.idle_since.store(now, Ordering::Relaxed);
            state.wake_if_before(now.saturating_add(state.idle_ms.load(Ordering::Relaxed)));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn deadlines_follow_the_phase() {
        let t = FrontTimeouts {
            header: Duration::from_secs(3),
            idle: Duration::from_secs(20),
            body: Duration::from_secs(5),
            send: Duration::from_secs(5),
            body_total: Duration::from_secs(60),
        };
        let s = ConnState::detached();
        let start = Instant::now();
        // A new connection has header_timeout from accept.
        assert_eq!(s.deadline(&t), Some((start + t.header, Expired::Head)));
        let g = s.begin();
        assert_eq!(s.deadline(&t), None);
        tokio::time::advance(Duration::from_secs(7)).await;
        drop(g);
        let idle = Instant::now();
        assert_eq!(s.deadline(&t), Some((idle + t.idle, Expired::Idle)));
        tokio::time::advance(Duration::from_secs(4)).await;
        s.on_read();
        assert_eq!(
            s.deadline(&t),
            Some((Instant::now() + t.header, Expired::Head))
        );
        assert_eq!(s.watch(t).await, Expired::Head);
    }

    #[tokio::test(start_paused = true)]
    async fn a_request_ended_at_a_known_instant_is_idle_from_it() {
        let t = FrontTimeouts::default();
        let s = ConnState::detached();
        let mut g = s.begin();
        let ended = Instant::now() + Duration::from_secs(1);
        tokio::time::advance(Duration::from_secs(3)).await;
        g.ended_at(ended);
        drop(g);
        // Counted from the instant given, not from the drop two seconds later.
        assert_eq!(s.deadline(&t), Some((ended + t.idle, Expired::Idle)));
    }
}
