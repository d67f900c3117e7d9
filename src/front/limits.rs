//! Front connection limits: the caps on open connections (server-wide, and per client address
//! on each listener) and the phase of each connection (waiting for a head, handling a
//! request, idle between requests) that the caps and the timeouts read.
//!
//! # Caps
//!
//! [`Admission::admit`] runs once per accepted connection and [`Ticket`]'s drop once per
//! closed one; those two take the table's mutex, nothing on the per-request path does. A
//! connection beyond a cap makes room by closing the connection that has been idle longest
//! (idle = no request being handled on it: a kept-alive connection between requests, or one
//! whose head is not complete yet); when every counted connection is busy, the new one is
//! refused (accepted and closed at once). Refusals and evictions are logged at most once a
//! second, with counts, so a flood does not become a flood of log lines.
//!
//! Per-client caps count TCP peers by IP address, per listener: an IPv4 address (also when
//! it arrives IPv4-mapped on a dual-stack socket), or an IPv6 address's /64 prefix, since one
//! host is usually given a whole /64 and could otherwise open the cap's worth of connections
//! from each of its 2^64 addresses ([`client_key`]). Unix-socket peers have no
//! address and are exempt: they are front servers on this host (nginx, Apache), whose socket
//! permissions already decide who may connect, and only the server-wide cap counts them.
//!
//! # Phases and timeouts
//!
//! A [`ConnState`] is shared by the connection's reader (through [`Watched`], which notes the
//! first byte of a head), its request handling ([`ConnState::begin`] / [`BusyGuard`]) and the
//! cap table. State changes are atomics plus a [`Notify`] on the few transitions (first head
//! byte, request start, last request end), so the per-read cost is two relaxed loads.

use std::collections::{BTreeMap, HashMap};
use std::io;
use std::net::IpAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::Notify;
use tokio::time::Instant;

use crate::config::{Backend, Config, FrontTimeouts};
use crate::front::eviction::Eviction;

/// Connections the status listener keeps open at once. Its clients are a few operators,
/// scrapers and health checks; it has its own table, so a front flood never reaches it.
pub const STATUS_MAX_CONNECTIONS: usize = 32;

/// Timeouts of the status listener: its requests have no body and are answered at once.
pub const STATUS_TIMEOUTS: FrontTimeouts = FrontTimeouts {
    header: Duration::from_secs(5),
    idle: Duration::from_secs(10),
    body: Duration::from_secs(5),
    send: Duration::from_secs(10),
    body_total: Duration::from_secs(10),
};

/// Descriptors kept out of the front cap whatever the configuration: standard streams, the
/// runtime's epoll and wakers, signal pipes, log files, listeners, the accept that is in
/// progress, and the short-lived files corral opens itself (`/proc` reads, static files).
const BASE_RESERVE: u64 = 64;
/// Descriptors per spawned worker at once: its listening socket, its stdout and stderr
/// pipes, and one spare for a replacement starting beside it.
const FDS_PER_WORKER: u64 = 4;
/// Descriptors per backend slot: the backend connection and a spool file.
const FDS_PER_SLOT: u64 = 2;
/// Fewest front connections a derived cap allows (a tiny file limit still serves).
const MIN_DERIVED: u64 = 16;
/// Soft file limit assumed when it cannot be read (the usual default).
const FALLBACK_NOFILE: u64 = 1024;

/// Sentinel for "no time" in the atomics below.
const NONE: u64 = u64::MAX;
/// Shortest sleep of the watch while a request is handled (with tiny configured timeouts it
/// would otherwise wake over and over for nothing).
const BUSY_RECHECK_MIN: Duration = Duration::from_millis(100);
/// At most one refused/evicted log line per this interval.
const LOG_EVERY: Duration = Duration::from_secs(1);

/// The server-wide front cap when `max_connections` is not configured: the soft file limit
/// minus a reserve for everything else corral opens, and of what is left, one eighth kept
/// free for the spool files of chunked uploads being measured (one per such front request)
/// and for the status listener's own cap.
///
/// The reserve counts, per pool, every worker it may spawn ([`FDS_PER_WORKER`]) and every
/// backend slot ([`FDS_PER_SLOT`]: a kept backend connection and a spool file), plus
/// [`STATUS_MAX_CONNECTIONS`] for `/ping` and `/status`, plus [`BASE_RESERVE`].
pub fn derived_max_connections(config: &Config, nofile: Option<u64>) -> usize {
    let nofile = nofile.unwrap_or(FALLBACK_NOFILE);
    let mut reserve = BASE_RESERVE + STATUS_MAX_CONNECTIONS as u64 + config.listeners.len() as u64;
    for pool in &config.pools {
        if let Backend::Spawned(s) = &pool.backend {
            reserve += (u64::from(s.sizing.max()) + 1) * FDS_PER_WORKER;
        }
        reserve += u64::from(pool.max_conns) * FDS_PER_SLOT;
    }
    let left = nofile.saturating_sub(reserve);
    let front = (left - left / 8).max(MIN_DERIVED);
    usize::try_from(front).unwrap_or(usize::MAX)
}

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
        BusyGuard(Arc::clone(self))
    }

    /// Whether no request is being handled.
    pub fn is_idle(&self) -> bool {
        self.busy.load(Ordering::Relaxed) == 0
    }

    /// Set when the cap table closes this connection.
    pub fn evicted(&self) -> &Eviction {
        &self.evicted
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
            tokio::select! {
                () = changed => {}
                () = self.evicted.cancelled(), if !evicted => {}
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
pub struct BusyGuard(Arc<ConnState>);

impl Drop for BusyGuard {
    fn drop(&mut self) {
        let state = &self.0;
        if state.busy.fetch_sub(1, Ordering::Relaxed) == 1 {
            let now = state.now_ms();
            state.idle_since.store(now, Ordering::Relaxed);
            state.wake_if_before(now.saturating_add(state.idle_ms.load(Ordering::Relaxed)));
        }
    }
}

/// A stream that tells its [`ConnState`] when bytes arrive.
#[derive(Debug)]
pub struct Watched<S> {
    inner: S,
    state: Arc<ConnState>,
    /// Longest a write may stay blocked on a client that reads nothing.
    send_timeout: Option<Duration>,
    /// Armed when a write blocks; cleared by the next byte written. Allocated only when a
    /// write has to wait, which a client that keeps up never makes it do.
    send_deadline: Option<Pin<Box<tokio::time::Sleep>>>,
}

impl<S> Watched<S> {
    /// Wraps `inner`.
    pub fn new(inner: S, state: Arc<ConnState>) -> Watched<S> {
        Watched {
            inner,
            state,
            send_timeout: None,
            send_deadline: None,
        }
    }

    /// Fails a write that stays blocked for `timeout` (a client that stopped reading): the
    /// connection then ends, which drops the response body and aborts the backend request,
    /// so the worker is freed without being blamed.
    pub fn with_send_timeout(mut self, timeout: Duration) -> Watched<S> {
        self.send_timeout = Some(timeout);
        self
    }

    /// Tracks a write's outcome against the send deadline.
    fn on_write<T>(
        &mut self,
        cx: &mut Context<'_>,
        polled: Poll<io::Result<T>>,
    ) -> Poll<io::Result<T>> {
        match &polled {
            Poll::Pending => {
                let Some(timeout) = self.send_timeout else {
                    return polled;
                };
                let deadline = self
                    .send_deadline
                    .get_or_insert_with(|| Box::pin(tokio::time::sleep(timeout)));
                if std::future::Future::poll(deadline.as_mut(), cx).is_ready() {
                    self.send_deadline = None;
                    return Poll::Ready(Err(io::Error::new(
                        io::ErrorKind::TimedOut,
                        format!("the client read nothing for {timeout:?} (send_timeout)"),
                    )));
                }
                polled
            }
            Poll::Ready(_) => {
                self.send_deadline = None;
                polled
            }
        }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Watched<S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        let polled = Pin::new(&mut this.inner).poll_read(cx, buf);
        if matches!(polled, Poll::Ready(Ok(()))) && buf.filled().len() > before {
            this.state.on_read();
        }
        polled
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Watched<S> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let polled = Pin::new(&mut this.inner).poll_write(cx, buf);
        this.on_write(cx, polled)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let polled = Pin::new(&mut this.inner).poll_write_vectored(cx, bufs);
        this.on_write(cx, polled)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let polled = Pin::new(&mut this.inner).poll_flush(cx);
        this.on_write(cx, polled)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }
}

/// What the per-client cap counts a peer address as: an IPv4 address as it is (also one
/// that arrived IPv4-mapped, `::ffff:a.b.c.d`), an IPv6 address as its /64 prefix (the rest
/// zeroed), the block one host or one customer is normally given.
pub fn client_key(addr: IpAddr) -> IpAddr {
    match addr {
        IpAddr::V4(_) => addr,
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => {
                let prefix = u128::from(v6) & !(u128::from(u64::MAX));
                IpAddr::V6(std::net::Ipv6Addr::from(prefix))
            }
        },
    }
}

/// Who a new connection comes from, for the per-client cap.
#[derive(Debug, Clone, Copy)]
pub struct Client {
    /// Index of the listener (per-client counts are per listener).
    pub listener: usize,
    /// The peer's address; `None` for Unix-socket peers, which are exempt.
    pub addr: Option<IpAddr>,
    /// The listener's per-client cap; `None` = no cap.
    pub cap: Option<u32>,
}

/// The table of open connections of one set of listeners (the front listeners, or the
/// status listener), with its cap.
#[derive(Debug)]
pub struct Admission {
    /// Names the table in log lines ("front", "status").
    name: &'static str,
    max: usize,
    epoch: Instant,
    table: Mutex<Table>,
    /// Kept beside the table (updated under its lock) so `/metrics` reads them lock-free.
    open: AtomicUsize,
    refused: AtomicU64,
    evicted: AtomicU64,
}

/// A table's numbers for `/metrics`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AdmissionSnapshot {
    /// Which listeners: `front` or `status`.
    pub name: &'static str,
    /// Connections open now.
    pub open: usize,
    /// The cap.
    pub max: usize,
    /// Connections refused since start (beyond a cap with every counted one busy).
    pub refused: u64,
    /// Idle connections closed since start to make room.
    pub evicted: u64,
}

#[derive(Debug, Default)]
struct Table {
    next_id: u64,
    /// Open connections by id; ids grow with accept order.
    conns: BTreeMap<u64, Entry>,
    /// Ids of each (listener, client address).
    clients: HashMap<(usize, IpAddr), Vec<u64>>,
    shed: Shed,
}

#[derive(Debug)]
struct Entry {
    client: Option<(usize, IpAddr)>,
    state: Arc<ConnState>,
}

/// Refusals and evictions since the last log line.
#[derive(Debug, Default)]
struct Shed {
    refused_server: u64,
    refused_client: u64,
    evicted_server: u64,
    evicted_client: u64,
    last_log: Option<Instant>,
}

/// Which cap a connection ran into.
#[derive(Debug, Clone, Copy)]
enum Cap {
    Server,
    Client,
}

impl Admission {
    /// A table for at most `max` connections.
    pub fn new(name: &'static str, max: usize) -> Arc<Admission> {
        Arc::new(Admission {
            name,
            max: max.max(1),
            epoch: Instant::now(),
            table: Mutex::new(Table::default()),
            open: AtomicUsize::new(0),
            refused: AtomicU64::new(0),
            evicted: AtomicU64::new(0),
        })
    }

    /// The numbers `/metrics` shows.
    pub fn snapshot(&self) -> AdmissionSnapshot {
        AdmissionSnapshot {
            name: self.name,
            open: self.open.load(Ordering::Relaxed),
            max: self.max,
            refused: self.refused.load(Ordering::Relaxed),
            evicted: self.evicted.load(Ordering::Relaxed),
        }
    }

    /// The cap.
    pub fn max(&self) -> usize {
        self.max
    }

    /// Connections open now.
    pub fn open(&self) -> usize {
        self.open.load(Ordering::Relaxed)
    }

    fn lock(&self) -> MutexGuard<'_, Table> {
        // The table holds no invariant a panic elsewhere could have half-updated beyond
        // what the next admit tolerates (a stale id is skipped), so poisoning is ignored.
        self.table
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Counts a new connection in, making room by closing the connection idle longest when
    /// a cap is reached; `None` when every counted connection is busy (refuse it).
    pub fn admit(self: &Arc<Self>, client: Client) -> Option<Ticket> {
        let mut t = self.lock();
        let key = client.addr.map(|a| (client.listener, client_key(a)));
        if let (Some(key), Some(cap)) = (key, client.cap) {
            let ids = t.clients.get(&key).map_or(&[][..], Vec::as_slice);
            if ids.len() >= cap as usize {
                let victim = oldest_idle(ids.iter().filter_map(|id| Some((*id, t.conns.get(id)?))));
                match victim {
                    Some(id) => {
                        t.evict(id, Cap::Client, self.name, self.max);
                        self.evicted.fetch_add(1, Ordering::Relaxed);
                    }
                    None => {
                        t.refuse(Cap::Client, self.name, self.max);
                        self.refused.fetch_add(1, Ordering::Relaxed);
                        return None;
                    }
                }
            }
        }
        if t.conns.len() >= self.max {
            // A scan of every connection, but only for an accept beyond the cap.
            match oldest_idle(t.conns.iter().map(|(id, e)| (*id, e))) {
                Some(id) => {
                    t.evict(id, Cap::Server, self.name, self.max);
                    self.evicted.fetch_add(1, Ordering::Relaxed);
                }
                None => {
                    t.refuse(Cap::Server, self.name, self.max);
                    self.refused.fetch_add(1, Ordering::Relaxed);
                    return None;
                }
            }
        }
        let id = t.next_id;
        t.next_id += 1;
        let state = Arc::new(ConnState::new(self.epoch));
        t.conns.insert(
            id,
            Entry {
                client: key,
                state: Arc::clone(&state),
            },
        );
        if let Some(key) = key {
            t.clients.entry(key).or_default().push(id);
        }
        self.open.store(t.conns.len(), Ordering::Relaxed);
        Some(Ticket {
            admission: Arc::clone(self),
            id,
            state,
        })
    }
}

/// Among `entries`, the idle connection idle longest (the oldest on a tie).
fn oldest_idle<'a>(entries: impl Iterator<Item = (u64, &'a Entry)>) -> Option<u64> {
    entries
        .filter(|(_, e)| e.state.is_idle())
        .map(|(id, e)| (e.state.idle_since.load(Ordering::Relaxed), id))
        .min()
        .map(|(_, id)| id)
}

impl Table {
    /// Takes `id` out of the table (a no-op when it is gone already).
    fn remove(&mut self, id: u64) -> Option<Entry> {
        let entry = self.conns.remove(&id)?;
        if let Some(key) = entry.client {
            if let Some(ids) = self.clients.get_mut(&key) {
                ids.retain(|&other| other != id);
                if ids.is_empty() {
                    self.clients.remove(&key);
                }
            }
        }
        Some(entry)
    }

    /// Closes connection `id` to make room. It leaves the count at once; its task sees the
    /// cancellation and closes the socket.
    fn evict(&mut self, id: u64, cap: Cap, name: &str, max: usize) {
        if let Some(entry) = self.remove(id) {
            entry.state.evicted.cancel();
        }
        match cap {
            Cap::Server => self.shed.evicted_server += 1,
            Cap::Client => self.shed.evicted_client += 1,
        }
        self.shed.log(name, max);
    }

    fn refuse(&mut self, cap: Cap, name: &str, max: usize) {
        match cap {
            Cap::Server => self.shed.refused_server += 1,
            Cap::Client => self.shed.refused_client += 1,
        }
        self.shed.log(name, max);
    }
}

impl Shed {
    /// One line for everything since the last one, if that was at least [`LOG_EVERY`] ago.
    fn log(&mut self, name: &str, max: usize) {
        let now = Instant::now();
        if self
            .last_log
            .is_some_and(|last| now.duration_since(last) < LOG_EVERY)
        {
            return;
        }
        let since = self.last_log.map(|last| now.duration_since(last));
        tracing::warn!(
            listeners = name,
            max_connections = max,
            evicted_at_server_cap = self.evicted_server,
            evicted_at_client_cap = self.evicted_client,
            refused_at_server_cap = self.refused_server,
            refused_at_client_cap = self.refused_client,
            since_last_report = ?since,
            "connection cap reached: closed idle connections to make room, refused new ones when all were busy"
        );
        *self = Shed {
            last_log: Some(now),
            ..Shed::default()
        };
    }
}

/// A connection counted in a table; dropping it (when the connection ends) counts it out.
#[derive(Debug)]
pub struct Ticket {
    admission: Arc<Admission>,
    id: u64,
    state: Arc<ConnState>,
}

impl Ticket {
    /// The connection's phase, shared with the table.
    pub fn state(&self) -> &Arc<ConnState> {
        &self.state
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        let mut t = self.admission.lock();
        t.remove(self.id);
        self.admission.open.store(t.conns.len(), Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tcp(listener: usize, last: u8, cap: Option<u32>) -> Client {
        Client {
            listener,
            addr: Some(IpAddr::from([127, 0, 0, last])),
            cap,
        }
    }

    #[tokio::test(start_paused = true)]
    async fn the_idle_connection_idle_longest_makes_room() {
        let a = Admission::new("front", 3);
        let first = a.admit(tcp(0, 1, None)).unwrap();
        tokio::time::advance(Duration::from_millis(10)).await;
        let second = a.admit(tcp(0, 1, None)).unwrap();
        let _busy = first.state().begin();
        tokio::time::advance(Duration::from_millis(10)).await;
        let third = a.admit(tcp(0, 1, None)).unwrap();
        // Full: the first is busy, so the second (idle longest) goes.
        let fourth = a.admit(tcp(0, 1, None)).unwrap();
        assert!(second.state().evicted().is_cancelled());
        assert!(!first.state().evicted().is_cancelled());
        assert!(!third.state().evicted().is_cancelled());
        assert_eq!(a.open(), 3);
        drop(second);
        assert_eq!(a.open(), 3);
        drop((third, fourth));
        assert_eq!(a.open(), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn all_busy_means_refused() {
        let a = Admission::new("front", 2);
        let one = a.admit(tcp(0, 1, None)).unwrap();
        let two = a.admit(tcp(0, 2, None)).unwrap();
        let _g1 = one.state().begin();
        let _g2 = two.state().begin();
        assert!(a.admit(tcp(0, 3, None)).is_none());
        assert_eq!(a.open(), 2);
        let s = a.snapshot();
        assert_eq!((s.open, s.max, s.refused, s.evicted), (2, 2, 1, 0));
    }

    #[tokio::test(start_paused = true)]
    async fn per_client_caps_count_one_address_on_one_listener() {
        let a = Admission::new("front", 100);
        let one = a.admit(tcp(0, 1, Some(2))).unwrap();
        let two = a.admit(tcp(0, 1, Some(2))).unwrap();
        // Another address, another listener, and a Unix peer are not counted with them.
        let other = a.admit(tcp(0, 2, Some(2))).unwrap();
        let elsewhere = a.admit(tcp(1, 1, Some(2))).unwrap();
        let unix = a
            .admit(Client {
                listener: 0,
                addr: None,
                cap: Some(2),
            })
            .unwrap();
        let _busy = two.state().begin();
        let three = a.admit(tcp(0, 1, Some(2))).unwrap();
        assert!(one.state().evicted().is_cancelled());
        for t in [&two, &other, &elsewhere, &unix, &three] {
            assert!(!t.state().evicted().is_cancelled());
        }
        let _busy3 = three.state().begin();
        assert!(a.admit(tcp(0, 1, Some(2))).is_none());
    }

    #[test]
    fn ipv6_clients_are_counted_by_their_64_prefix() {
        let key = |s: &str| client_key(s.parse().unwrap());
        assert_eq!(
            key("2001:db8:1:2:aaaa::1"),
            key("2001:db8:1:2:ffff:ee:dd:cc")
        );
        assert_eq!(key("2001:db8:1:2:aaaa::1"), key("2001:db8:1:2::"));
        assert_ne!(key("2001:db8:1:2::1"), key("2001:db8:1:3::1"));
        assert_eq!(key("::ffff:192.0.2.7"), key("192.0.2.7"));
        assert_ne!(key("192.0.2.7"), key("192.0.2.8"));
        assert_eq!(key("::1"), key("::2"));
    }

    #[tokio::test(start_paused = true)]
    async fn one_64_shares_one_cap() {
        let a = Admission::new("front", 100);
        let from = |s: &str| Client {
            listener: 0,
            addr: Some(s.parse().unwrap()),
            cap: Some(2),
        };
        let one = a.admit(from("2001:db8::1")).unwrap();
        let two = a.admit(from("2001:db8::2")).unwrap();
        let _busy = (one.state().begin(), two.state().begin());
        assert!(
            a.admit(from("2001:db8::3")).is_none(),
            "a third address of the same /64 is over the cap"
        );
        assert!(
            a.admit(from("2001:db8:0:1::1")).is_some(),
            "another /64 is not"
        );
    }

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
    async fn an_evicted_connection_that_just_turned_busy_closes_after_its_request() {
        let a = Admission::new("front", 1);
        let first = a.admit(tcp(0, 1, None)).unwrap();
        let _second = a.admit(tcp(0, 2, None)).unwrap();
        assert!(first.state().evicted().is_cancelled());
        // Its head completed as it was picked.
        let busy = first.state().begin();
        let state = Arc::clone(first.state());
        let watch = tokio::spawn(async move { state.watch(FrontTimeouts::default()).await });
        tokio::time::advance(Duration::from_secs(600)).await;
        assert!(!watch.is_finished());
        drop(busy);
        assert_eq!(watch.await.unwrap(), Expired::Evicted);
    }
}
