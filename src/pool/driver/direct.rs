//! A direct pool's workers (`accept = "direct"`, ARCHITECTURE.md "Direct pools"): spawned
//! with the pool's shared listening socket as fd 0, ready once the kernel shows them blocked
//! in accept(2) or holding a connection they accepted, and sent their stop signal only while they are (a php-cgi worker blocked
//! there holds no request; one that is not may be running a script, whose own blocking
//! calls SIGTERM would cut short).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use super::{libc_sigkill, Driver, Report, Worker};
use crate::config::DirectListener;
use crate::pool::direct::{held_sockets, in_accept, serving, DirectSocket};
use crate::pool::memory_checks::MemoryWatch;
use crate::pool::state::{ExitKind, PoolEvent, WorkerKey};
use crate::process::{self, spawn_direct_worker};

/// How often a booting direct worker's /proc/PID/syscall is read until it is in accept.
const READY_POLL: Duration = Duration::from_millis(1);

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
}

impl Driver {
    /// Makes this a direct pool's driver: its workers accept on `listener` themselves.
    pub fn set_direct(&mut self, listener: DirectListener, request_timeout: Duration) {
        self.state.serves_unseen();
        self.direct = Some(Direct {
            listener,
            request_timeout,
            held: HashMap::new(),
            socket: None,
        });
    }

    /// The hard request timeout of a direct pool, whose requests corral never sees: a
    /// worker holds one connection per request (nginx opens a new one for each), so the
    /// same set of sockets held without a pass through accept for `request_timeout` is one
    /// request running that long. A worker seen in accept, or whose sockets changed, starts
    /// again. Returns whether the pool stopped (as [`Driver::handle`]).
    pub(super) fn check_direct_timeouts(&mut self) -> bool {
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
        spec.direct_max_requests = Some(self.state.budget(key).unwrap_or(0));
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
            },
        );
        let reports = self.reports_tx.clone();
        let start_timeout = self.state.spec().start_timeout;
        tokio::spawn(async move {
            let deadline = Instant::now() + start_timeout;
            let child = &mut spawned.child;
            let ready = loop {
                if serving(pid) {
                    break true;
                }
                if !matches!(child.try_wait(), Ok(None)) || Instant::now() >= deadline {
                    break false;
                }
                tokio::time::sleep(READY_POLL).await;
            };
            if ready {
                let _ = reports.send(Report::Ready(key));
            }
            let status = match spawned.child.wait().await {
                Ok(status) => ExitKind::of(status),
                Err(_) => ExitKind::Signal(libc_sigkill()),
            };
            let _ = reports.send(Report::Exited(key, status));
        });
        self.feed(PoolEvent::Spawned { key, pid });
    }

    /// Sends each held stop signal whose worker is blocked in accept now (or gone). The
    /// state machine's `kill_timeout` still bounds a worker that never gets back there.
    pub(super) fn send_direct_signals(&mut self) {
        let mut held = std::mem::take(&mut self.deferred);
        held.retain(|&(_, pid)| {
            if in_accept(pid) == Some(false) {
                return true;
            }
            if let Err(e) = process::signal_group(pid, process::StopSignal::Term) {
                tracing::warn!(pool = %self.name, pid, error = %e, "cannot signal the worker");
            }
            false
        });
        self.deferred = held;
    }
}
