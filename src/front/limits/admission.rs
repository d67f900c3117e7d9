//! The caps on open front connections and the tables that count connections against them.
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

use std::collections::hash_map::Entry as MapEntry;
use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::time::Instant;

use super::keyhash::KeyHash;
use super::ConnState;
use crate::config::{Backend, Config};

/// Connections the status listener keeps open at once. Its clients are a few operators,
/// scrapers and health checks; it has its own table, so a front flood never reaches it.
pub const STATUS_MAX_CONNECTIONS: usize = 32;

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

/// At most one refused/evicted log line per this interval.
const LOG_EVERY: Duration = Duration::from_secs(1);

/// The server-wide front cap when `max_connections` is not configured: the soft file limit
/// minus a reserve for everything else corral opens, and of what is left, one eighth kept
/// free for the spool files of chunked uploads being measured (one per such front request)
/// and for the status listener's own cap.
///
/// The reserve counts, per pool, 4 descriptors for each of a spawned pool's `max` + 1
/// workers (`FDS_PER_WORKER`: its listening socket, its stdout and stderr pipes, a spare for
/// a replacement) and 2 for every backend slot (`FDS_PER_SLOT`: a kept backend connection
/// and a spool file), plus [`STATUS_MAX_CONNECTIONS`] for `/ping` and `/status`, one per
/// listener, and 64 for what corral opens whatever the configuration (`BASE_RESERVE`:
/// standard streams, the runtime's, signal pipes, log files, short-lived files).
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

/// The open connections, each in a slot of `slots` that its [`Ticket`] names, so that a
/// connection is counted in and out by an index, without a search (once per connection: with
/// a front server that opens one per request, once per request). A slot left by a closed
/// connection is used again by the next one; a connection is also known by its id, which
/// grows with accept order and is never used again, so a ticket whose connection was evicted
/// (and whose slot may hold another connection since) finds its own entry gone.
#[derive(Debug, Default)]
struct Table {
    next_id: u64,
    slots: Vec<Option<Entry>>,
    /// Empty slots, the one freed last on top.
    free: Vec<usize>,
    /// Slots in use.
    open: usize,
    /// The slots of each (listener, client address)'s connections.
    clients: HashMap<(usize, IpAddr), Vec<usize>, KeyHash>,
    shed: Shed,
}

#[derive(Debug)]
struct Entry {
    id: u64,
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
            let slots = t.clients.get(&key).map_or(&[][..], Vec::as_slice);
            if slots.len() >= cap as usize {
                let victim = oldest_idle(slots.iter().filter_map(|&at| t.entry(at)));
                match victim {
                    Some(at) => {
                        t.evict(at, Cap::Client, self.name, self.max);
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
        if t.open >= self.max {
            // A scan of every connection, but only for an accept beyond the cap.
            let entries = (0..t.slots.len()).filter_map(|at| t.entry(at));
            match oldest_idle(entries) {
                Some(at) => {
                    t.evict(at, Cap::Server, self.name, self.max);
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
        let at = t.insert(Entry {
            id,
            client: key,
            state: Arc::clone(&state),
        });
        if let Some(key) = key {
            t.clients.entry(key).or_default().push(at);
        }
        self.open.store(t.open, Ordering::Relaxed);
        Some(Ticket {
            admission: Arc::clone(self),
            at,
            id,
            state,
        })
    }
}

/// Among `entries` (slot, entry), the slot of the idle connection idle longest (the oldest
/// on a tie).
fn oldest_idle<'a>(entries: impl Iterator<Item = (usize, &'a Entry)>) -> Option<usize> {
    entries
        .filter(|(_, e)| e.state.is_idle())
        .map(|(at, e)| (e.state.idle_since.load(Ordering::Relaxed), e.id, at))
        .min()
        .map(|(_, _, at)| at)
}

impl Table {
    /// The connection in slot `at`, if the slot is in use.
    fn entry(&self, at: usize) -> Option<(usize, &Entry)> {
        Some((at, self.slots.get(at)?.as_ref()?))
    }

    /// Puts `entry` in a free slot (the one freed last), or a new one; its index.
    fn insert(&mut self, entry: Entry) -> usize {
        self.open += 1;
        if let Some(at) = self.free.pop() {
            if let Some(slot @ None) = self.slots.get_mut(at) {
                *slot = Some(entry);
                return at;
            }
        }
        self.slots.push(Some(entry));
        self.slots.len() - 1
    }

    /// Takes connection `id`, in slot `at`, out of the table (a no-op when it is gone
    /// already, its slot empty or holding a later connection).
    fn remove(&mut self, at: usize, id: u64) -> Option<Entry> {
        let slot = self.slots.get_mut(at)?;
        if slot.as_ref().is_none_or(|e| e.id != id) {
            return None;
        }
        let entry = slot.take()?;
        self.open -= 1;
        self.free.push(at);
        if let Some(key) = entry.client {
            // One lookup of the key, not one to find it and another to remove it.
            if let MapEntry::Occupied(mut slots) = self.clients.entry(key) {
                slots.get_mut().retain(|&other| other != at);
                if slots.get().is_empty() {
                    slots.remove();
                }
            }
        }
        Some(entry)
    }

    /// Closes the connection in slot `at` to make room. It leaves the count at once; its
    /// task sees the cancellation and closes the socket.
    fn evict(&mut self, at: usize, cap: Cap, name: &str, max: usize) {
        let id = self.slots.get(at).and_then(Option::as_ref).map(|e| e.id);
        if let Some(entry) = id.and_then(|id| self.remove(at, id)) {
            entry.state.evict();
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
    /// The connection's slot in the table, and its id (the slot's entry is this
    /// connection's only while the ids agree).
    at: usize,
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
        t.remove(self.at, self.id);
        self.admission.open.store(t.open, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::super::Expired;
    use super::*;
    use crate::config::FrontTimeouts;

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

    #[tokio::test(start_paused = true)]
    async fn an_evicted_connection_leaving_does_not_count_out_the_one_in_its_slot() {
        let a = Admission::new("front", 1);
        let first = a.admit(tcp(0, 1, Some(1))).unwrap();
        // The first is evicted; the second takes the slot it left.
        let second = a.admit(tcp(0, 1, Some(1))).unwrap();
        assert!(first.state().evicted().is_cancelled());
        drop(first);
        assert_eq!(a.open(), 1, "the second is still counted");
        let _busy = second.state().begin();
        assert!(
            a.admit(tcp(0, 1, Some(1))).is_none(),
            "the second, busy, still holds the server cap and its client's"
        );
        assert!(a.admit(tcp(0, 2, None)).is_none());
        drop(second);
        assert_eq!(a.open(), 0);
        assert!(a.admit(tcp(0, 1, Some(1))).is_some());
    }
}
