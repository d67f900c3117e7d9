//! Backend connections and the small per-worker stack of idle ones that FastCGI
//! (FCGI_KEEP_CONN) and LSAPI reuse (ARCHITECTURE.md decision 4).
//!
//! A connection goes back to the stack only after a clean end of its exchange; a connection
//! that saw any error is dropped. The stack is bounded per address, newest first, and an idle
//! connection that the backend closed meanwhile (or that holds unread bytes) is discarded at
//! checkout without a round trip, and without a system call unless the reactor saw it
//! become readable (`BackendConnection::is_quiet`).
//!
//! A `php_children` group takes its connections in turn instead (`Reuse::in_turn`, decision
//! 46): its children accept on one socket and each serves the one connection it accepted
//! until corral closes it, so the connection taken names the child that runs the request.
//! Newest first, one child would run every request of a quiet site, where php-fpm's and
//! `php-cgi -b`'s children take turns from `accept`, the one waiting longest first. So each
//! slot's lane (`Slot::lane`: one of the group's N, the one free longest first) has a
//! connection of its own, made by the first request on that lane: N connections, one per
//! child, used in turn. A lane's connection is used by one request at a time, so no more
//! than N are ever open and a new one always finds a child in `accept`.

use std::io;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::config::BackendAddress;
use crate::net::Stream;

use super::BackendError;

/// One connection to a backend, with what the idle stack needs to know about it. Its state
/// lives in one heap allocation made when it connects: a request moves the connection from
/// the idle stack through the gateway into its exchange and back, and each of those moves
/// then copies a pointer, not the two hundred bytes of the state.
#[derive(Debug)]
pub struct BackendConnection {
    link: Box<Link>,
}

/// What a [`BackendConnection`] holds.
#[derive(Debug)]
pub struct Link {
    pub(super) stream: Stream,
    address: BackendAddress,
    served: u64,
    home: Option<Connections>,
    /// The serving thread whose runtime the stream is registered with (`crate::shards`).
    shard: Option<usize>,
    /// The slot lane it was made for, on stacks that take connections in turn.
    lane: Option<u32>,
    /// The read buffer, kept between the exchanges of a kept connection so that each one
    /// does not allocate (and free) its own.
    pub(super) inbuf: bytes::BytesMut,
    /// The write buffer, kept the same way: a request's head is encoded into it.
    pub(super) outbuf: bytes::BytesMut,
    /// The timer an exchange waits on for its deadlines, made by the first exchange that
    /// waits and reset by the next ones, so a kept connection allocates it once. Bound to
    /// the runtime (serving thread) it was made on: dropped when the stream moves.
    pub(super) timer: Option<std::pin::Pin<Box<tokio::time::Sleep>>>,
}

impl std::ops::Deref for BackendConnection {
    type Target = Link;

    #[inline]
    fn deref(&self) -> &Link {
        &self.link
    }
}

impl std::ops::DerefMut for BackendConnection {
    #[inline]
    fn deref_mut(&mut self) -> &mut Link {
        &mut self.link
    }
}

impl BackendConnection {
    /// A connection over `stream`, not yet on any idle stack.
    fn new(stream: Stream, address: BackendAddress) -> BackendConnection {
        BackendConnection {
            link: Box::new(Link {
                stream,
                address,
                served: 0,
                home: None,
                shard: crate::shards::current(),
                lane: None,
                inbuf: bytes::BytesMut::new(),
                outbuf: bytes::BytesMut::new(),
                timer: None,
            }),
        }
    }
}

impl BackendConnection {
    /// Connects to `address` within `timeout`. The connection has no idle stack: after a
    /// clean exchange the response body hands it back (`ResponseBody::take_connection`).
    pub async fn connect(
        address: &BackendAddress,
        timeout: Duration,
    ) -> Result<BackendConnection, BackendError> {
        let stream =
            Stream::connect(address, timeout)
                .await
                .map_err(|source| BackendError::Connect {
                    address: address.to_string(),
                    source,
                })?;
        Ok(BackendConnection::new(stream, address.clone()))
    }

    /// Wraps an already connected stream (a socketpair, an accepted test connection),
    /// registered with the current runtime as a backend connection is.
    pub fn from_stream(stream: Stream, address: BackendAddress) -> io::Result<BackendConnection> {
        Ok(BackendConnection::new(stream, address))
    }

    /// The connection's write buffer, empty, with room for `len` bytes; the exchange gives
    /// it back when the connection is kept.
    pub(super) fn take_outbuf(&mut self, len: usize) -> bytes::BytesMut {
        let mut buf = std::mem::take(&mut self.outbuf);
        buf.clear();
        buf.reserve(len);
        buf
    }

    /// The backend address.
    pub fn address(&self) -> &BackendAddress {
        &self.address
    }

    /// Exchanges completed cleanly on this connection so far.
    pub fn requests_served(&self) -> u64 {
        self.served
    }

    /// Counts a clean exchange and gives the connection back to its idle stack, if it has
    /// one; otherwise returns it to the caller.
    pub(super) fn finish(mut self) -> Option<BackendConnection> {
        self.served += 1;
        self.stream.settle();
        match self.home.take() {
            Some(home) => {
                home.put(self);
                None
            }
            None => Some(self),
        }
    }

    /// Best-effort write of a few bytes without waiting (for an abort in `Drop`).
    pub(super) fn try_write(&self, bytes: &[u8]) -> io::Result<usize> {
        match &self.stream {
            Stream::Tcp(s) => s.try_write(bytes),
            Stream::Unix(s) => s.try_write(bytes),
        }
    }

    /// Whether an idle connection is still usable: the backend has neither closed it nor
    /// sent anything (which no protocol allows between requests).
    ///
    /// No system call in the usual case: the readiness tokio keeps for the stream is read
    /// first. The reactor marks an idle connection readable when the backend closes it or
    /// writes to it, so an unmarked one is kept as it is. A marked one is asked once more,
    /// with a non-blocking peek (past the bytes its last answer left on the socket, when it
    /// leaves them: `Stream::peek_idle`), because the mark may be left over from its last
    /// exchange (a read that filled the buffer does not clear it); a peek that finds nothing
    /// clears the mark (`try_io` does on `WouldBlock`), so the next checkout is free again.
    ///
    /// What this cannot see is a close that reached the socket after the reactor last
    /// turned: the request then meets it, and `Gateway::dispatch` sends the request again
    /// when none of it reached the backend, or when its method is GET, HEAD or OPTIONS
    /// (ARCHITECTURE.md invariant 6, decision 8). Nor does it hold for a connection made on
    /// another serving thread: that thread's reactor, not the caller's, keeps its readiness,
    /// and it may not have turned since the backend wrote (an LSAPI CONN_CLOSE on an idle
    /// connection, seen by nothing before the next request went out on it): such a
    /// connection is asked with [`is_quiet_now`](Self::is_quiet_now).
    fn is_quiet(&self) -> bool {
        let peeked = match &self.stream {
            Stream::Tcp(s) => s.try_io(tokio::io::Interest::READABLE, || self.stream.peek_idle()),
            Stream::Unix(s) => s.try_read_io(|_| self.stream.peek_idle()),
        };
        matches!(peeked, Err(e) if e.kind() == io::ErrorKind::WouldBlock)
    }

    /// Whether an idle connection is still usable, asked of the socket itself (one peek),
    /// whatever the reactor last saw: for a connection another serving thread's reactor
    /// watched (see [`is_quiet`](Self::is_quiet)).
    fn is_quiet_now(&self) -> bool {
        matches!(self.stream.peek_idle(), Err(e) if e.kind() == io::ErrorKind::WouldBlock)
    }
}

/// Idle connections keyed by backend address, at most `max_idle` per address on each
/// serving thread. Cheap to clone; clones share the stacks.
///
/// Each serving thread keeps the connections it gave back in a stack of its own, behind a
/// lock on a cache line of its own: a request takes and gives back its connection under a
/// lock no other thread takes in the usual case, where one stack for the pool was locked
/// twice per request by every thread. A thread finding none of its own takes another
/// thread's (a php-cgi worker has one connection, whichever thread last used it).
#[derive(Debug, Clone)]
pub struct Connections {
    inner: Arc<Stacks>,
}

#[derive(Debug)]
struct Stacks {
    max_idle: usize,
    reuse: Reuse,
    /// Index 0: off the serving threads (the control plane, tests, the work-stealing
    /// scheduler); 1 + (i mod CPUs): serving thread i.
    shards: Box<[Shard]>,
}

#[derive(Debug, Default)]
#[repr(align(128))]
struct Shard(Mutex<Idle>);

#[derive(Debug, Default)]
struct Idle {
    /// Per address, its idle connections. A pool has an address per worker (a handful), so
    /// a scan compares a few short paths where a map would hash one twice per request.
    by_address: Vec<(BackendAddress, Vec<BackendConnection>)>,
}

impl Idle {
    fn stack(&mut self, address: &BackendAddress) -> Option<&mut Vec<BackendConnection>> {
        self.by_address
            .iter_mut()
            .find(|(a, _)| a == address)
            .map(|(_, stack)| stack)
    }
}

impl Stacks {
    /// The calling thread's stack.
    fn own(&self) -> &Mutex<Idle> {
        // `new` makes at least two stacks: one off the serving threads, one or more on them.
        let on_threads = self.shards.len().saturating_sub(1).max(1);
        let i = crate::shards::current().map_or(0, |i| 1 + i % on_threads);
        &self.shards[i % self.shards.len()].0
    }
}

/// Stacks per pool: one off the serving threads and one per CPU (serving threads beyond the
/// CPUs share them, which only costs them contention).
fn shard_count() -> usize {
    static COUNT: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *COUNT.get_or_init(|| 1 + std::thread::available_parallelism().map_or(1, usize::from))
}

/// How a pool's workers want their connections used.
#[derive(Debug, Clone, Copy, Default)]
pub struct Reuse {
    /// The connections made leave each answer's last bytes on the socket until the next
    /// request is written (`QuietUnix::leave_reads`, src/net/owed.rs): for workers that wait
    /// for their next request blocked in `read`, whom taking the answer off would wake for
    /// nothing.
    pub leave_reads: bool,
    /// Each slot lane has a connection of its own (the module documentation): for a
    /// `php_children` group, whose `max_idle` is its number of children.
    pub in_turn: bool,
}

impl Connections {
    /// Empty stacks keeping at most `max_idle` idle connections per address and thread.
    pub fn new(max_idle: usize) -> Connections {
        Connections::with_reuse(max_idle, Reuse::default())
    }

    /// As [`new`](Self::new), for workers that want their connections used as `reuse` says.
    pub fn with_reuse(max_idle: usize, reuse: Reuse) -> Connections {
        Connections {
            inner: Arc::new(Stacks {
                max_idle,
                reuse,
                shards: (0..shard_count()).map(|_| Shard::default()).collect(),
            }),
        }
    }

    /// An idle connection to `address` if one is still usable, else a new one. Either way a
    /// clean exchange puts it back here.
    pub async fn get(
        &self,
        address: &BackendAddress,
        connect_timeout: Duration,
    ) -> Result<BackendConnection, BackendError> {
        match self.take_idle(address, None) {
            Some(conn) => Ok(conn),
            None => self.fresh(address, connect_timeout, None).await,
        }
    }

    /// An idle connection to `address` that is still usable, if there is one, without
    /// awaiting anything: the usual case of [`get`](Self::get), for a caller that keeps the
    /// connect's future out of its own (it is much larger than the rest of a request's).
    /// `lane` is the caller's slot lane: on stacks that take connections in turn, only that
    /// lane's connection is taken.
    pub fn take_idle(
        &self,
        address: &BackendAddress,
        lane: Option<u32>,
    ) -> Option<BackendConnection> {
        let here = crate::shards::current();
        let lane = lane.filter(|_| self.inner.reuse.in_turn);
        while let Some(mut conn) = self.pop(address, lane) {
            let quiet = if conn.shard == here {
                conn.is_quiet()
            } else {
                conn.is_quiet_now()
            };
            if !quiet {
                tracing::debug!(backend = %address, "dropping an idle backend connection the backend closed or wrote on");
                continue;
            }
            if conn.shard == here {
                conn.home = Some(self.clone());
                return Some(conn);
            }
            // Made on another serving thread: moved to this one's runtime.
            let link = *conn.link;
            match link.stream.reregister() {
                Ok(stream) => {
                    return Some(BackendConnection {
                        link: Box::new(Link {
                            stream,
                            home: Some(self.clone()),
                            shard: here,
                            lane: link.lane,
                            address: link.address,
                            served: link.served,
                            inbuf: link.inbuf,
                            outbuf: link.outbuf,
                            timer: None,
                        }),
                    })
                }
                Err(e) => {
                    tracing::debug!(backend = %address, error = %e, "dropping an idle backend connection that cannot move to this thread");
                }
            }
        }
        None
    }

    /// A new connection to `address`, kept here after a clean exchange; made for the slot
    /// lane `lane` (see [`take_idle`](Self::take_idle)).
    pub async fn fresh(
        &self,
        address: &BackendAddress,
        connect_timeout: Duration,
        lane: Option<u32>,
    ) -> Result<BackendConnection, BackendError> {
        let mut conn = BackendConnection::connect(address, connect_timeout).await?;
        conn.home = Some(self.clone());
        conn.lane = lane.filter(|_| self.inner.reuse.in_turn);
        if self.inner.reuse.leave_reads {
            conn.link.stream.leave_reads();
        }
        Ok(conn)
    }

    /// Keeps `conn` for reuse on the calling thread's stack, unless its stack for the
    /// connection's address is full.
    pub fn put(&self, mut conn: BackendConnection) {
        conn.home = None;
        let Ok(mut idle) = self.inner.own().lock() else {
            return;
        };
        let max = self.inner.max_idle;
        match idle.stack(&conn.address) {
            Some(stack) if stack.len() < max => stack.push(conn),
            Some(_) => {}
            None if max > 0 => {
                let address = conn.address.clone();
                idle.by_address.push((address, vec![conn]));
            }
            None => {}
        }
    }

    /// How many idle connections to `address` are kept, on every thread's stack.
    pub fn idle(&self, address: &BackendAddress) -> usize {
        self.inner
            .shards
            .iter()
            .filter_map(|shard| {
                let idle = shard.0.lock().ok()?;
                idle.by_address
                    .iter()
                    .find(|(a, _)| a == address)
                    .map(|(_, stack)| stack.len())
            })
            .sum()
    }

    /// Drops every idle connection to `address` (its worker is being retired).
    pub fn forget(&self, address: &BackendAddress) {
        for shard in self.inner.shards.iter() {
            if let Ok(mut idle) = shard.0.lock() {
                idle.by_address.retain(|(a, _)| a != address);
            }
        }
    }

    /// The newest idle connection to `address` on the caller's stack (one made on its
    /// serving thread, in the usual case), else the newest of another thread's (which `get`
    /// moves to this thread's runtime): a worker that takes one connection at a time
    /// (php-cgi) could not accept a new one while it waits on the idle one. With `lane`,
    /// that lane's connection, wherever it is kept: a second one made beside it would wait
    /// for a child in `accept`, and none might come back there.
    fn pop(&self, address: &BackendAddress, lane: Option<u32>) -> Option<BackendConnection> {
        let own = self.inner.own();
        let here = crate::shards::current();
        let take = |stack: &mut Vec<BackendConnection>| match lane {
            Some(_) => {
                let i = stack.iter().position(|c| c.lane == lane)?;
                Some(stack.swap_remove(i))
            }
            None => stack.pop(),
        };
        if let Ok(mut idle) = own.lock() {
            if let Some(stack) = idle.stack(address) {
                // Threads beyond the CPUs share a stack: prefer this thread's own (a lane
                // has one connection, wherever it was made).
                let found = match stack.iter().rposition(|c| c.shard == here) {
                    Some(i) if lane.is_none() => Some(stack.remove(i)),
                    _ => take(stack),
                };
                if found.is_some() {
                    return found;
                }
            }
        }
        self.inner
            .shards
            .iter()
            .filter(|shard| !std::ptr::eq(&shard.0, own))
            .find_map(|shard| take(shard.0.lock().ok()?.stack(address)?))
    }
}

#[cfg(test)]
mod tests;
