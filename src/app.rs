//! Wiring: builds the gateway from a validated configuration, serves every front listener,
//! and runs the shutdown phases.
//!
//! The caller binds the listeners (tests bind port 0) and owns the shutdown token (ARCHITECTURE.md
//! decision 18), so `run` does no signal handling of its own. Shutdown order: stop accepting, let
//! the connections finish what they are doing for up to `grace`, then drop what is left.

use std::sync::Arc;

use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::config::{Backend, Config, FrontProtocol, ListenerConfig};
use crate::front::http::{self, ConnInfo};
use crate::front::limits::{self, Admission, Client};
use crate::front::listener::{Listener, Peer};
use crate::front::{fastcgi, scgi};
use crate::gateway::Gateway;
use crate::{process, status};

/// Kernel accept backlog of the status listener (its clients are a few operators and
/// scrapers).
const STATUS_BACKLOG: u32 = 64;

/// A bound front listener with its configuration.
#[derive(Debug)]
pub struct BoundListener {
    /// The socket.
    pub listener: Listener,
    /// As configured.
    pub config: ListenerConfig,
}

/// Binds every configured front listener. The runtime directory, where front sockets
/// often live (as php-fpm's live in /run/php), must be prepared first
/// ([`crate::runtime_dir::prepare`]).
pub fn bind_all(
    config: &Config,
    inherited: Vec<crate::systemd::Inherited>,
) -> std::io::Result<Vec<BoundListener>> {
    // Socket activation: an inherited socket serves the [[listen]] block with its address.
    let mut inherited: Vec<_> = inherited
        .into_iter()
        .filter_map(|s| match s.address() {
            Ok(addr) => Some((addr, s)),
            Err(e) => {
                tracing::warn!(error = %e, "an inherited socket has no address to match; left alone");
                None
            }
        })
        .collect();
    let listeners: std::io::Result<Vec<BoundListener>> = config
        .listeners
        .iter()
        .map(|l| {
            let address = l.bind.address();
            if let Some(i) = inherited.iter().position(|(a, _)| *a == address) {
                let (_, socket) = inherited.swap_remove(i);
                tracing::info!(listener = %address, "using the socket handed over by socket activation");
                return Listener::inherited(socket, &l.bind).map(|listener| BoundListener {
                    listener,
                    config: l.clone(),
                });
            }
            Listener::bind(&l.bind, l.backlog)
                .map(|listener| BoundListener {
                    listener,
                    config: l.clone(),
                })
                .map_err(|e| {
                    std::io::Error::new(
                        e.kind(),
                        format!("cannot listen on {}: {e}", l.bind.address()),
                    )
                })
        })
        .collect();
    for (addr, _) in &inherited {
        tracing::warn!(address = %addr, "an inherited socket matches no [[listen]] block; closing it");
    }
    listeners
}

/// Serves until `shutdown` is cancelled, then drains for up to the configured grace; `fast`
/// (cancelled with or after `shutdown`) cuts the drain short and kills the workers. The
/// runtime directory must have been prepared ([`crate::runtime_dir::prepare`]): the pools'
/// launchers are written into it here.
/// Spawned workers get `worker_nofile` as their soft file limit (`None` = corral's own).
pub async fn run(
    config: &Config,
    listeners: Vec<BoundListener>,
    shutdown: CancellationToken,
    fast: CancellationToken,
    worker_nofile: Option<u64>,
    mut restart_workers: tokio::sync::mpsc::Receiver<()>,
) -> Result<(), String> {
    let (gateway, drivers) = Gateway::with_worker_nofile(config, worker_nofile)?;
    let gateway = Arc::new(gateway);
    // A rolling restart (SIGUSR2): every spawned pool replaces each worker, the replacement
    // ready before the old one stops taking requests, so nothing in flight is lost.
    let restarter = {
        let gateway = Arc::clone(&gateway);
        tokio::spawn(async move {
            while restart_workers.recv().await.is_some() {
                tracing::info!("rolling restart of every pool's workers");
                for pool in &gateway.pools {
                    pool.restart_workers();
                }
            }
        })
    };
    let _restarter = tokio_util::task::AbortOnDropHandle::new(restarter);
    // The status listener is bound here rather than by the caller: it carries no requests
    // for the pools, so nothing else needs it before serving starts.
    let status_listener = match &config.status {
        Some(s) => Some(
            Listener::bind(&s.bind, STATUS_BACKLOG)
                .map_err(|e| format!("cannot listen for status on {}: {e}", s.bind.address()))?,
        ),
        None => None,
    };
    warn_default_users(config);
    // Drivers spawn workers from runtime worker threads, which live as long as corral:
    // the workers' parent-death signal is tied to the forking thread.
    let supervisors: Vec<_> = drivers.into_iter().map(|d| tokio::spawn(d.run())).collect();
    let connections = TaskTracker::new();
    let accepting = TaskTracker::new();
    let front = front_admission(config);
    for (index, bound) in listeners.into_iter().enumerate() {
        let gateway = Arc::clone(&gateway);
        let connections = connections.clone();
        let shutdown = shutdown.clone();
        let admission = Arc::clone(&front);
        accepting.spawn(accept_loop(
            bound,
            index,
            admission,
            gateway,
            connections,
            shutdown,
        ));
    }
    if let Some(listener) = status_listener {
        // A table of its own: front connections never use up the status listener's room.
        let admission = Admission::new("status", limits::STATUS_MAX_CONNECTIONS);
        let mut source = status::collect::StatusSource::new(config);
        source.connections = vec![Arc::clone(&front), Arc::clone(&admission)];
        let source = Arc::new(source);
        // The sparklines' history, sampled beside the listener that serves it.
        accepting.spawn(status::history::sample(
            Arc::clone(&gateway),
            Arc::clone(&source),
            shutdown.clone(),
        ));
        accepting.spawn(status::server::serve(
            listener,
            admission,
            Arc::clone(&gateway),
            source,
            shutdown.clone(),
        ));
    }
    accepting.close();
    // systemd Type=notify: READY=1 once every pool has its `min` workers, then live counts.
    let notifier = Arc::new(crate::systemd::Notifier::from_env());
    let _notifying = notifier.is_active().then(|| {
        tokio_util::task::AbortOnDropHandle::new(tokio::spawn(notify_loop(
            Arc::clone(&notifier),
            Arc::clone(&gateway),
            ready_floors(config),
        )))
    });
    shutdown.cancelled().await;
    notifier.notify("STOPPING=1");
    tracing::info!("stopping: no longer accepting; finishing requests in progress");
    accepting.wait().await;
    connections.close();
    let grace = config.server.grace;
    let drained = tokio::select! {
        waited = tokio::time::timeout(grace, connections.wait()) => waited.is_ok(),
        () = fast.cancelled() => false,
    };
    if !drained {
        tracing::warn!(
            ?grace,
            fast = fast.is_cancelled(),
            "connections still open; closing them"
        );
    }
    // Then the workers: idle ones get SIGTERM, busy ones once their request ends, and
    // SIGKILL after kill_timeout (at once on a fast stop); each driver returns when its
    // workers are reaped.
    let graceful = !fast.is_cancelled();
    for pool in &gateway.pools {
        pool.stop(graceful);
    }
    let bound = config.server.kill_timeout + std::time::Duration::from_secs(1);
    for supervisor in supervisors {
        if tokio::time::timeout(bound, supervisor).await.is_err() {
            tracing::error!("a pool did not stop within kill_timeout; exiting anyway");
        }
    }
    tracing::info!("stopped");
    Ok(())
}

/// Says, once per pool, when a root corral runs a pool's workers as
/// [`process::spawn::DEFAULT_USER`] because no user is configured.
fn warn_default_users(config: &Config) {
    for pool in &config.pools {
        let Backend::Spawned(spawn) = &pool.backend else {
            continue;
        };
        if process::spawn::default_identity_applies(spawn.user.as_deref()) {
            tracing::warn!(
                pool = %pool.name,
                user = process::spawn::DEFAULT_USER,
                "corral runs as root and neither the pool nor [server] sets `user`: the \
                 workers run as {}, never as root; set `user` to choose",
                process::spawn::DEFAULT_USER
            );
        }
    }
}

/// The table every front listener counts its connections in, with `max_connections` or the
/// cap derived from the file limit.
fn front_admission(config: &Config) -> Arc<Admission> {
    let nofile = crate::process::rlimit::nofile_soft();
    let derived = limits::derived_max_connections(config, nofile);
    let max = match config.server.max_connections {
        Some(n) => {
            let n = n as usize;
            if n > derived {
                tracing::warn!(
                    max_connections = n,
                    room = derived,
                    ?nofile,
                    "max_connections is more than the file-descriptor limit leaves room for; \
                     accepts may fail with EMFILE before the cap is reached"
                );
            }
            n
        }
        None => derived,
    };
    tracing::info!(max_connections = max, ?nofile, "front connection cap");
    Admission::new("front", max)
}

/// How often `STATUS=` is sent to systemd while serving.
const NOTIFY_STATUS_EVERY: std::time::Duration = std::time::Duration::from_secs(5);

/// For each pool (by index), the workers it must have ready before corral is ready: its
/// `min` (0 for pools of running servers and on-demand pools); and how long to wait at most.
fn ready_floors(config: &Config) -> (Vec<usize>, std::time::Duration) {
    let mut wait = std::time::Duration::from_secs(1);
    let floors = config
        .pools
        .iter()
        .map(|p| {
            if let Backend::Spawned(spawn) = &p.backend {
                wait = wait.max(spawn.start_timeout + std::time::Duration::from_secs(1));
            }
            crate::pool::state::PoolSpec::from_config(p, config.server.kill_timeout)
                .map_or(0, |s| s.floor())
        })
        .collect();
    (floors, wait)
}

/// The workers of `pool` that accept requests now (ready, idle or busy).
fn ready_workers(pool: &crate::gateway::Pool) -> usize {
    use crate::pool::state::WorkerState;
    pool.status.as_ref().map_or(0, |rx| {
        rx.borrow()
            .status
            .workers
            .iter()
            .filter(|w| matches!(w.state, WorkerState::Idle | WorkerState::Busy))
            .count()
    })
}

/// One line for systemd's `STATUS=`: what `systemctl status` shows.
fn status_line(gateway: &Gateway) -> String {
    let (mut workers, mut busy, mut queued, mut served) = (0, 0, 0, 0);
    for pool in &gateway.pools {
        let slots = pool.slots.stats();
        workers += slots.accepting_workers;
        busy += slots.in_flight;
        queued += slots.queued;
        served += pool.requests.snapshot().accepted;
    }
    format!(
        "{workers} workers accepting, {busy} requests in flight, {queued} queued, {served} served"
    )
}

/// Sends READY=1 once every pool has its floor of ready workers (or the wait is over, with
/// a warning: a pool that cannot start must not keep systemd waiting forever), then STATUS=
/// every few seconds and WATCHDOG=1 as asked, until aborted.
async fn notify_loop(
    notifier: Arc<crate::systemd::Notifier>,
    gateway: Arc<Gateway>,
    (floors, wait): (Vec<usize>, std::time::Duration),
) {
    let deadline = tokio::time::Instant::now() + wait;
    loop {
        let short = gateway
            .pools
            .iter()
            .zip(&floors)
            .find(|(p, &floor)| ready_workers(p) < floor);
        match short {
            None => break,
            Some((p, _)) if tokio::time::Instant::now() >= deadline => {
                tracing::warn!(pool = %p.name, "not every pool has its min workers ready; telling systemd we are ready anyway");
                break;
            }
            Some(_) => tokio::time::sleep(std::time::Duration::from_millis(20)).await,
        }
    }
    notifier.notify(&format!("READY=1\nSTATUS={}", status_line(&gateway)));
    tracing::info!("ready (told systemd)");
    let mut status = tokio::time::interval(NOTIFY_STATUS_EVERY);
    let watchdog_every = notifier.watchdog_interval();
    let mut watchdog = tokio::time::interval(watchdog_every.unwrap_or(NOTIFY_STATUS_EVERY));
    loop {
        tokio::select! {
            _ = status.tick() => notifier.notify(&format!("STATUS={}", status_line(&gateway))),
            _ = watchdog.tick(), if watchdog_every.is_some() => notifier.notify("WATCHDOG=1"),
        }
    }
}

async fn accept_loop(
    bound: BoundListener,
    index: usize,
    admission: Arc<Admission>,
    gateway: Arc<Gateway>,
    connections: TaskTracker,
    shutdown: CancellationToken,
) {
    let address = bound.config.bind.address();
    let local = match &bound.listener {
        Listener::Tcp { listener, .. } => listener.local_addr().ok(),
        Listener::Unix { .. } => None,
    };
    // The bound address (with the real port when the configuration said 0) is what a test
    // or an operator needs to connect.
    let bound_address = bound
        .listener
        .local_address()
        .map_or_else(|_| address.to_string(), |a| a.to_string());
    tracing::info!(listener = %bound_address, protocol = ?bound.config.protocol, "listening");
    loop {
        let accepted = tokio::select! {
            accepted = bound.listener.accept() => accepted,
            () = shutdown.cancelled() => return,
        };
        let (stream, peer) = match accepted {
            Ok(Some(client)) => client,
            Ok(None) => continue,
            Err(e) => {
                // EMFILE and friends: say so, pause briefly rather than spin, go on.
                tracing::warn!(listener = %address, error = %e, "accept failed");
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                continue;
            }
        };
        let client = Client {
            listener: index,
            addr: match peer {
                Peer::Tcp(a) => Some(a.ip()),
                Peer::Unix => None,
            },
            cap: bound.config.max_connections_per_client,
        };
        // Beyond a cap with every connection busy: dropping the stream closes it at once
        // (the table logs that, rate-limited).
        let Some(ticket) = admission.admit(client) else {
            continue;
        };
        let gateway = Arc::clone(&gateway);
        let shutdown = shutdown.clone();
        let timeouts = bound.config.timeouts;
        match bound.config.protocol {
            FrontProtocol::Http => {
                let info = ConnInfo {
                    listener: address.clone(),
                    local,
                    peer,
                    forwarded: bound.config.forwarded.clone(),
                    timeouts,
                };
                connections.spawn(http::serve_connection(
                    stream, info, ticket, gateway, shutdown,
                ));
            }
            FrontProtocol::Fastcgi => {
                let listener = address.clone();
                connections.spawn(fastcgi::serve_connection(
                    stream, listener, ticket, timeouts, gateway, shutdown,
                ));
            }
            FrontProtocol::Scgi => {
                let listener = address.clone();
                connections.spawn(scgi::serve_connection(
                    stream, listener, ticket, timeouts, gateway, shutdown,
                ));
            }
        }
    }
}
