//! A direct pool's workers (`accept = "direct"`, ARCHITECTURE.md "Direct pools"): spawned
//! with the pool's shared listening socket as fd 0, ready once the kernel shows them blocked
//! in accept(2) or holding a connection they accepted, and sent their stop signal only while they are (a php-cgi worker blocked
//! there holds no request; one that is not may be running a script, whose own blocking
//! calls SIGTERM would cut short). With `php_children` each worker is a php-cgi parent whose
//! children accept; what differs for such a pool is in `direct/children.rs`.

mod children;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::unix::AsyncFd;
use tokio::io::Interest;
use tokio::sync::mpsc;
use tokio::time::Instant;

use super::{report_ready_and_exit, Driver, Report, Worker};
use crate::config::{DirectListener, Sizing};
use crate::pool::direct::{held_sockets, in_accept, sched, serving, DirectSocket, WorkerRecord};
use crate::pool::memory_checks::MemoryWatch;
use crate::pool::state::{ExitKind, PoolEvent, WorkerKey};
use crate::process::{self, spawn_direct_worker};

/// How often a booting direct worker's /proc/PID/syscall is read until it is in accept.
const READY_POLL: Duration = Duration::from_millis(1);

/// After reporting a pending connection, an ondemand pool's watch waits this long before it
/// reports the next: under load a connection arrives every few microseconds, and each
/// report costs a look at every worker and a sock_diag dump. The first connection to an
/// idle pool is reported at once; the tick (100 ms) catches what the pause leaves queued.
const WATCH_PAUSE: Duration = Duration::from_millis(20);

/// A direct pool's listener, and its socket once bound.
#[derive(Debug)]
pub(super) struct Direct {
    listener: DirectListener,
    /// The pool's `request_timeout`: a worker whose sockets have not changed for this long
    /// without being seen in accept is stuck in one request, and is killed and replaced.
    request_timeout: Duration,
    /// Per worker: the sockets it held when last looked at, and since when unchanged.
    held: HashMap<WorkerKey, (Vec<u64>, Instant)>,
    /// Held from the first spawn until the driver ends, so a pool built by a reload for the
    /// same address finds it open (`DirectSocket::get`).
    socket: Option<Arc<DirectSocket>>,
    /// Dynamic or ondemand: the state machine is fed the kernel's view of each worker
    /// (`PoolEvent::Seen`) and the accept queue (`Demand`). A static pool needs neither.
    sized: bool,
    /// Per worker: what the looks saw of it, logged when it leaves.
    records: HashMap<WorkerKey, WorkerRecord>,
    /// An ondemand pool's watch on its socket for a pending connection.
    watch: Option<Watch>,
    /// The last bind failed (logged once, tried again every tick).
    bind_failed: bool,
    /// Since when each held stop signal has waited for its worker to be seen in accept.
    holding: HashMap<WorkerKey, Instant>,
    /// With `php_children`: each worker is a php-cgi parent whose children accept
    /// (`children.rs`); `None` when each worker is one php-cgi process.
    children: Option<children::Groups>,
}

/// The task that watches a direct socket for a pending connection, stopped when dropped.
#[derive(Debug)]
struct Watch(tokio::task::JoinHandle<()>);

impl Drop for Watch {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Watches `socket` for a connection waiting in its accept queue without accepting it (the
/// workers do), as php-fpm's master does for `pm = ondemand`: a duplicate of the socket is
/// registered with the reactor (the socket itself stays parked) and each readiness edge is
/// reported as [`Report::Pending`], at most one per [`WATCH_PAUSE`].
fn watch(socket: &DirectSocket, reports: mpsc::UnboundedSender<Report>) -> std::io::Result<Watch> {
    // SAFETY: the OwnedFd is the AsyncFd's own: the descriptor stays open, on the same
    // socket, until the AsyncFd drops it, and `as_raw_fd` returns that descriptor.
    let fd = unsafe { AsyncFd::register_with_interest(socket.duplicate()?, Interest::READABLE) }
        .map_err(|e| std::io::Error::other(e.to_string()))?;
    Ok(Watch(tokio::spawn(async move {
        loop {
            let Ok(mut guard) = fd.readable().await else {
                return;
            };
            if reports.send(Report::Pending).is_err() {
                return;
            }
            tokio::time::sleep(WATCH_PAUSE).await;
            // Clears only the edge seen above: one that came during the pause stays set.
            guard.clear_ready();
        }
    })))
}

impl Driver {
    /// Makes this a direct pool's driver: its workers accept on `listener` themselves.
    pub fn set_direct(&mut self, listener: DirectListener, request_timeout: Duration) {
        self.state.serves_unseen();
        let sized = !matches!(self.state.spec().sizing, Sizing::Static { .. });
        let children = self
            .template
            .php_children
            .map(|_| children::Groups::new(listener.child_max_memory));
        self.direct = Some(Direct {
            listener,
            request_timeout,
            held: HashMap::new(),
            socket: None,
            sized,
            records: HashMap::new(),
            watch: None,
            bind_failed: false,
            holding: HashMap::new(),
            children,
        });
    }

    /// Binds a direct pool's socket before any worker starts (an ondemand pool starts
    /// none until a connection waits) and starts an ondemand pool's watch on it.
    pub(super) fn start_direct(&mut self) {
        let Some(direct) = self.direct.as_ref() else {
            return;
        };
        if direct.socket.is_some() && (direct.watch.is_some() || !self.ondemand()) {
            return;
        }
        let socket = match self.direct_socket() {
            Ok(s) => s,
            Err(e) => {
                if let Some(d) = self.direct.as_mut().filter(|d| !d.bind_failed) {
                    d.bind_failed = true;
                    tracing::error!(pool = %self.name, error = %e, "the direct pool's socket cannot be bound: no worker can start; trying again every tick");
                }
                return;
            }
        };
        if self.direct.as_ref().is_some_and(|d| d.bind_failed) {
            tracing::info!(pool = %self.name, "the direct pool's socket is bound");
        }
        let watched = if self.ondemand() {
            match watch(&socket, self.reports_tx.clone()) {
                Ok(w) => Some(w),
                Err(e) => {
                    tracing::error!(pool = %self.name, error = %e, "cannot watch the direct pool's socket: workers start on the tick instead");
                    None
                }
            }
        } else {
            None
        };
        if let Some(d) = self.direct.as_mut() {
            d.bind_failed = false;
            d.watch = watched;
        }
    }

    fn ondemand(&self) -> bool {
        matches!(self.state.spec().sizing, Sizing::OnDemand { .. })
    }

    /// Every tick of a direct pool: the held stop signals, the hard request timeout, and
    /// for a dynamic or ondemand pool the kernel's view. Returns whether the pool stopped.
    pub(super) fn direct_tick(&mut self) -> bool {
        self.start_direct();
        self.send_direct_signals();
        let stopped = if self.has_children() {
            let limit = self
                .direct
                .as_ref()
                .map_or(Duration::MAX, |d| d.request_timeout);
            self.check_children(limit)
        } else {
            self.check_direct_timeouts()
        };
        stopped | self.look_direct()
    }

    /// A connection waits on an ondemand pool's socket: look now rather than at the next
    /// tick, unless the pool has all the workers it may have.
    pub(super) fn on_pending(&mut self) -> bool {
        if self.workers.len() >= self.state.spec().max() {
            return false;
        }
        self.look_direct()
    }

    /// Looks at every worker of a direct pool (busy: not blocked in accept; whether it ran
    /// since the last look; its CPU time) for the per-worker record, and feeds a dynamic or
    /// ondemand pool's state machine what it saw, then the socket's accept queue as the
    /// demand the sizing grows for.
    fn look_direct(&mut self) -> bool {
        let Some(direct) = self.direct.as_mut() else {
            return false;
        };
        let mut seen = Vec::with_capacity(self.workers.len());
        for (key, w) in &self.workers {
            let Some(record) = direct.records.get_mut(key).filter(|_| w.pid != 0) else {
                continue;
            };
            let idle = if direct.children.is_some() {
                let (busy, live) = children::busy_children(w.pid);
                if live == 0 && in_accept(w.pid).is_none() {
                    continue;
                }
                busy == 0
            } else {
                match in_accept(w.pid) {
                    Some(idle) => idle,
                    None => continue, // gone: its exit is on the way
                }
            };
            let ran = record.look(!idle, sched(w.pid));
            seen.push((*key, !idle, ran));
        }
        if !direct.sized {
            return false;
        }
        let waiting = direct
            .socket
            .as_ref()
            .and_then(|s| s.queued())
            .map_or(0, |q| usize::try_from(q).unwrap_or(usize::MAX));
        for (key, busy, ran) in seen {
            self.feed(PoolEvent::Seen { key, busy, ran });
        }
        self.apply(PoolEvent::Demand { waiting })
    }

    /// Worker `key` of a direct pool was reaped: logs its record, the one line corral can
    /// write about what a direct worker served (ARCHITECTURE.md, "Direct pools").
    pub(super) fn direct_exited(&mut self, key: WorkerKey, exit: ExitKind) {
        let pid = self.workers.get(&key).map_or(0, |w| w.pid);
        if self.has_children() {
            self.group_exited(key, pid);
        }
        let Some(record) = self.direct.as_mut().and_then(|d| d.records.remove(&key)) else {
            return;
        };
        let r = record.summary(exit);
        let text = |v: Option<u64>| v.map_or_else(|| "unknown".to_owned(), |v| v.to_string());
        tracing::info!(
            pool = %self.name,
            %key,
            pid,
            lifetime_ms = r.lifetime_ms,
            cpu_ms = %text(r.cpu_ms),
            busy_percent = %text(r.busy_percent),
            looks = r.looks,
            requests = %text(r.requests),
            exit = %exit,
            "direct worker record (per worker: corral sees no request of a direct pool)"
        );
    }

    /// The hard request timeout of a direct pool, whose requests corral never sees: a
    /// worker holds one connection per request (nginx opens a new one for each), so the
    /// same set of sockets held without a pass through accept for `request_timeout` is one
    /// request running that long. A worker seen in accept, or whose sockets changed, starts
    /// again. Returns whether the pool stopped (as [`Driver::handle`]).
    fn check_direct_timeouts(&mut self) -> bool {
        let Some(direct) = self.direct.as_mut() else {
            return false;
        };
        let now = Instant::now();
        let limit = direct.request_timeout;
        direct.held.retain(|k, _| self.workers.contains_key(k));
        let mut stuck = Vec::new();
        for (key, w) in &self.workers {
            if w.pid == 0 {
                continue;
            }
            let idle = in_accept(w.pid) != Some(false);
            let sockets = if idle { None } else { held_sockets(w.pid) };
            let Some(sockets) = sockets.filter(|s| !s.is_empty()) else {
                direct.held.remove(key);
                continue;
            };
            match direct.held.get(key) {
                Some((same, since)) if *same == sockets => {
                    if now.duration_since(*since) >= limit {
                        stuck.push(*key);
                    }
                }
                _ => {
                    direct.held.insert(*key, (sockets, now));
                }
            }
        }
        let mut stopped = false;
        for key in stuck {
            if let Some(d) = self.direct.as_mut() {
                d.held.remove(&key);
            }
            tracing::warn!(pool = %self.name, %key, "a direct worker has held the same connection past request_timeout: killing it");
            stopped |= self.handle(PoolEvent::RequestTimedOut { key });
        }
        stopped
    }

    /// Whether this is a direct pool's driver.
    pub(super) fn is_direct(&self) -> bool {
        self.direct.is_some()
    }

    /// Whether this direct pool's workers are php-cgi parents of children.
    fn has_children(&self) -> bool {
        self.direct.as_ref().is_some_and(|d| d.children.is_some())
    }

    fn direct_socket(&mut self) -> Result<Arc<DirectSocket>, String> {
        let direct = self.direct.as_mut().ok_or("not a direct pool")?;
        if let Some(s) = &direct.socket {
            return Ok(Arc::clone(s));
        }
        let s = DirectSocket::get(&direct.listener).map_err(|e| e.to_string())?;
        direct.socket = Some(Arc::clone(&s));
        Ok(s)
    }

    /// Spawns worker `key` on the shared socket, with `PHP_FCGI_MAX_REQUESTS` set to its
    /// request budget (`max_requests` plus its jitter; php-cgi counts and exits, and the
    /// state machine replaces it as a worker that stopped on its own).
    pub(super) fn spawn_direct(&mut self, key: WorkerKey) {
        let socket = match self.direct_socket() {
            Ok(s) => s,
            Err(reason) => {
                self.feed(PoolEvent::SpawnFailed { key, reason });
                return;
            }
        };
        let mut spec = self.template.clone();
        let budget = self.state.budget(key).unwrap_or(0);
        // A parent of children: php-cgi's own PHP_FCGI_MAX_REQUESTS per child, with this
        // group's jitter (as in a gateway pool); else the worker's budget.
        let group = spec
            .php_children
            .map(|g| process::php_children::for_worker(&g, key.0));
        let children = group.map_or(0, |g| g.children as usize);
        spec.php_children = group;
        spec.direct_max_requests = group.is_none().then_some(budget);
        let address = socket.backend_address();
        let spawned = socket
            .duplicate()
            .and_then(|fd| spawn_direct_worker(&spec, fd, address.clone()));
        let mut spawned = match spawned {
            Ok(s) => s,
            Err(e) => {
                let reason = e.to_string();
                self.feed(PoolEvent::SpawnFailed { key, reason });
                return;
            }
        };
        let pid = spawned.pid;
        // In the slot table only to be counted and shown: no request is ever routed here.
        let id = self.slots.add_worker(1, address.clone(), None);
        self.slots.set_pid(id, pid);
        tracing::info!(pool = %self.name, %key, pid, "direct worker started");
        if let Some(d) = self.direct.as_mut() {
            let budget = if children > 0 { 0 } else { budget };
            d.records.insert(key, WorkerRecord::new(budget));
        }
        self.by_id.insert(id, key);
        self.workers.insert(
            key,
            Worker {
                id,
                pid,
                address,
                socket_file: None,
                tree: vec![pid],
                memory: MemoryWatch::default(),
                preloader: None,
                exit_status: None,
                asked: Instant::now(),
                channel: None,
                task: None,
            },
        );
        let reports = self.reports_tx.clone();
        let start_timeout = self.state.spec().start_timeout;
        tokio::spawn(async move {
            let deadline = Instant::now() + start_timeout;
            let child = &mut spawned.child;
            let ready = loop {
                let up = if children > 0 {
                    children::group_serving(pid, children)
                } else {
                    serving(pid)
                };
                if up {
                    break true;
                }
                if !matches!(child.try_wait(), Ok(None)) || Instant::now() >= deadline {
                    break false;
                }
                tokio::time::sleep(READY_POLL).await;
            };
            report_ready_and_exit(&reports, key, ready, &mut spawned.child).await;
        });
        self.feed(PoolEvent::Spawned { key, pid });
    }

    /// Sends each held stop signal whose worker is blocked in accept now (or gone), or has
    /// been held for half of `kill_timeout`. Under a load that keeps the accept queue
    /// full a worker is never seen blocked in accept (each accept returns at once), and
    /// the state machine would SIGKILL it at `kill_timeout` in the middle of a request;
    /// SIGTERM then is the lesser harm: php-cgi finishes the request it holds (its FastCGI
    /// reads and writes retry on EINTR) and exits before the next accept, though the
    /// script's own blocking calls are cut short. `kill_timeout` still bounds a worker
    /// whose request outlasts the other half.
    pub(super) fn send_direct_signals(&mut self) {
        let mut held = std::mem::take(&mut self.deferred);
        let now = Instant::now();
        let patience = self.state.spec().kill_timeout / 2;
        let Some(direct) = self.direct.as_mut() else {
            self.deferred = held;
            return;
        };
        direct
            .holding
            .retain(|k, _| held.iter().any(|(h, _)| h == k));
        if direct.children.is_some() {
            for (key, _) in &held {
                if let Some(r) = direct.records.get_mut(key) {
                    r.asked_to_stop();
                }
            }
            held.retain(|&(key, pid)| !self.retire_group(key, pid, patience));
            self.deferred = held;
            return;
        }
        held.retain(|&(key, pid)| {
            let since = *direct.holding.entry(key).or_insert(now);
            let waited = now.duration_since(since) >= patience;
            if in_accept(pid) == Some(false) && !waited {
                return true;
            }
            direct.holding.remove(&key);
            if let Some(r) = direct.records.get_mut(&key) {
                r.asked_to_stop();
            }
            if waited {
                tracing::debug!(pool = %self.name, %key, pid, "a direct worker held for its stop signal was never seen in accept: signalling it mid-request");
            }
            if let Err(e) = process::signal_group(pid, process::StopSignal::Term) {
                tracing::warn!(pool = %self.name, pid, error = %e, "cannot signal the worker");
            }
            false
        });
        self.deferred = held;
    }
}
