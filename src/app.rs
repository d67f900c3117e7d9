//! Wiring: builds the gateway from a validated configuration, serves every front listener,
//! and runs the shutdown phases.
//!
//! The caller binds the listeners (tests bind port 0) and owns the shutdown token (ARCHITECTURE.md
//! decision 18), so `run` does no signal handling of its own. Shutdown order: `/ready` answers
//! 503, serving goes on for `shutdown_delay`, then stop accepting, let the connections finish
//! what they are doing for up to `grace`, then drop what is left; the status listener answers
//! until the workers are stopped.

use std::sync::Arc;

use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use std::collections::HashMap;

use crate::config::{Backend, Config, FrontProtocol, ListenerConfig};
use crate::deploy::{Outcome, ReloadError};
use crate::error::StartupError;
use crate::front::http::{self, ConnInfo};
use crate::front::limits::{self, Admission, Client};
use crate::front::listener::{Listener, Parked, Peer};
use crate::front::{fastcgi, scgi};
use crate::gateway::{BuildSettings, Gateway, Generation, Pool, PoolRegistry};
use crate::router::Router;
use crate::shards::Shards;
use crate::{launchers, process, status};

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
            Listener::bind_with(&l.bind, l.backlog, reuse_port(config))
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

/// What the command line asks of a running corral besides stopping (that is the shutdown
/// tokens' job).
#[derive(Debug)]
pub enum AppControl {
    /// Serve this configuration from now on (already validated).
    Reload(Box<Config>),
    /// Replace every worker, new before old.
    RestartWorkers,
    /// Reopen the request log files (logrotate's `postrotate`).
    ReopenLogs,
    /// A reload was asked for but its configuration could not be read or has errors (the
    /// command line logged them): recorded as the reload's outcome.
    ReloadRefused(String),
}

/// Serves until `shutdown` is cancelled, then drains for up to the configured grace; `fast`
/// (cancelled with or after `shutdown`) cuts the drain short and kills the workers. The
/// runtime directory must have been prepared ([`crate::runtime_dir::prepare`]): the pools'
/// launchers are written into it here.
/// Spawned workers get `worker_nofile` as their soft file limit (`None` = corral's own).
/// `controls` brings reloads and rolling restarts.
pub async fn run(
    config: &Config,
    listeners: Vec<BoundListener>,
    shutdown: CancellationToken,
    fast: CancellationToken,
    worker_nofile: Option<u64>,
    mut controls: tokio::sync::mpsc::Receiver<AppControl>,
) -> Result<(), StartupError> {
    // `shutdown` begins a graceful stop (and `/ready` answers 503 from then on); serving
    // ends with `stop_serving`, `shutdown_delay` later, and the status listener with
    // `stop_status`, once the workers are stopped.
    let stopping = shutdown;
    let shutdown = CancellationToken::new();
    let stop_status = CancellationToken::new();
    let status_tasks = TaskTracker::new();
    // Context roots and pool cwds serve the release their symlinks name now.
    // At start a path that does not resolve is only logged (and used as written).
    let written = config.clone();
    let resolved = crate::deploy::links::resolve(config);
    let config = &resolved.config;
    let settings = BuildSettings {
        worker_nofile,
        launchers: launchers::install(config)?,
        generation: 0,
        cwd_links: resolved.cwd_links.clone(),
    };
    let (gateway, drivers) = Gateway::build(config, &settings)?;
    let gateway = Arc::new(gateway);
    crate::deploy::clear_result(&config.server.runtime_dir);
    // The status listener is bound here rather than by the caller: it carries no requests
    // for the pools, so nothing else needs it before serving starts.
    let status_listener = match &config.status {
        Some(s) => Some(Listener::bind(&s.bind, STATUS_BACKLOG).map_err(|source| {
            StartupError::StatusListen {
                address: s.bind.address().to_string(),
                source,
            }
        })?),
        None => None,
    };
    process::users::warn(config);
    // Drivers spawn workers from runtime worker threads, which live as long as corral:
    // the workers' parent-death signal is tied to the forking thread.
    for (pool, driver) in drivers {
        pool.start(driver);
    }
    for pool in gateway.current().pools.iter() {
        pool.follow_names();
    }
    let notifier = Arc::new(crate::systemd::Notifier::from_env());
    let shards = match config.server.scheduler {
        crate::config::Scheduler::PerThread => {
            let n = serving_threads(config);
            Some(Shards::start(n).map_err(StartupError::ServingThreads)?)
        }
        crate::config::Scheduler::WorkStealing => None,
    };
    let mut serving = Serving {
        gateway: Arc::clone(&gateway),
        config: config.clone(),
        written,
        listeners: Vec::new(),
        next_listener: 0,
        connections: TaskTracker::new(),
        accepting: TaskTracker::new(),
        retiring: TaskTracker::new(),
        admission: front_admission(config),
        shutdown: shutdown.clone(),
        worker_nofile,
        notifier: Arc::clone(&notifier),
        shards,
        next_queue: 0,
        backlogs: Arc::default(),
        next_generation: 1,
    };
    for bound in listeners {
        let sockets = serving.sockets(bound.listener, &bound.config)?;
        serving.start_listener(sockets, bound.config);
    }
    if let Some(listener) = status_listener {
        // A table of its own: front connections never use up the status listener's room.
        let admission = Admission::new("status", limits::STATUS_MAX_CONNECTIONS);
        let mut source = status::collect::StatusSource::new();
        source.connections = vec![Arc::clone(&serving.admission), Arc::clone(&admission)];
        source.stopping = stopping.clone();
        source.backlogs = Arc::clone(&serving.backlogs);
        let source = Arc::new(source);
        // The sparklines' history, sampled beside the listener that serves it.
        status_tasks.spawn(status::history::sample(
            Arc::clone(&gateway),
            Arc::clone(&source),
            stop_status.clone(),
        ));
        status_tasks.spawn(status::server::serve(
            listener,
            admission,
            Arc::clone(&gateway),
            source,
            config
                .status
                .as_ref()
                .map(|s| Arc::from(s.allowed_hosts.as_slice()))
                .unwrap_or_else(|| Arc::from(Vec::new())),
            stop_status.clone(),
        ));
    }
    // systemd Type=notify: READY=1 once every pool has its `min` workers, then live counts.
    let _notifying = notifier.is_active().then(|| {
        tokio_util::task::AbortOnDropHandle::new(tokio::spawn(notify_loop(
            Arc::clone(&notifier),
            Arc::clone(&gateway),
            ready_wait(config),
        )))
    });
    loop {
        tokio::select! {
            () = stopping.cancelled() => break,
            control = controls.recv() => match control {
                Some(AppControl::Reload(new)) => serving.reload(*new).await,
                Some(AppControl::RestartWorkers) => serving.restart_workers().await,
                Some(AppControl::ReopenLogs) => gateway.access.reopen(),
                Some(AppControl::ReloadRefused(reason)) => serving.refused(reason, None),
                // Nobody can send any more: serve until stopped.
                None => {
                    stopping.cancelled().await;
                    break;
                }
            },
        }
    }
    notifier.notify("STOPPING=1");
    // Serving goes on while load balancers see `/ready` fail and take corral out; a fast
    // stop cuts the delay short.
    let delay = serving.config.server.shutdown_delay;
    if !delay.is_zero() && !fast.is_cancelled() {
        tracing::info!(
            ?delay,
            "stopping: /ready answers 503; still accepting for shutdown_delay"
        );
        tokio::select! {
            () = tokio::time::sleep(delay) => {}
            () = fast.cancelled() => {}
        }
    }
    shutdown.cancel();
    tracing::info!("stopping: no longer accepting; finishing requests in progress");
    serving.accepting.close();
    serving.accepting.wait().await;
    // Close the sockets too (parked ones are held here): the kernel would otherwise go on
    // completing connections that nobody accepts.
    serving.listeners.clear();
    serving.connections.close();
    let grace = serving.config.server.grace;
    let drained = tokio::select! {
        waited = tokio::time::timeout(grace, serving.connections.wait()) => waited.is_ok(),
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
    // workers are reaped. Pools still draining after a reload are stopped alike.
    let graceful = !fast.is_cancelled();
    let pools: Vec<Arc<Pool>> = gateway.current().pools.iter().cloned().collect();
    for pool in &pools {
        pool.stop(graceful);
    }
    let bound = serving.config.server.kill_timeout + std::time::Duration::from_secs(1);
    for pool in &pools {
        if !pool.stopped(bound).await {
            tracing::error!(pool = %pool.name, "a pool did not stop within kill_timeout; exiting anyway");
        }
    }
    serving.retiring.close();
    if tokio::time::timeout(bound, serving.retiring.wait())
        .await
        .is_err()
    {
        tracing::error!(
            "a pool retired by a reload did not stop within kill_timeout; exiting anyway"
        );
    }
    stop_status.cancel();
    status_tasks.close();
    status_tasks.wait().await;
    tracing::info!("stopped");
    Ok(())
}

/// Whether TCP listeners are bound with SO_REUSEPORT: each serving thread of
/// `scheduler = "per-thread"` then gets a socket of its own on the port.
fn reuse_port(config: &Config) -> bool {
    config.server.scheduler == crate::config::Scheduler::PerThread && serving_threads(config) > 1
}

/// How many threads serve the front listeners: `[server] threads`, else one per CPU corral
/// may run on.
pub fn serving_threads(config: &Config) -> usize {
    config.server.threads.map_or_else(
        || std::thread::available_parallelism().map_or(1, |n| n.get()),
        |n| n as usize,
    )
}

/// A front listener's socket as it is served.
#[derive(Debug)]
enum Sockets {
    /// Registered with the one multi-threaded runtime (`scheduler = "work-stealing"`).
    Shared(Arc<Listener>),
    /// Out of every runtime (`parked`, which keeps the sockets); each accept queue is served
    /// by one serving thread, through a duplicate registered with that thread's runtime.
    Parked {
        /// Held for its sockets (and a Unix socket file's removal); never read.
        _parked: Arc<Parked>,
        /// (serving thread, its listener), one per accept queue.
        queues: Vec<(usize, Arc<Listener>)>,
    },
}

/// One front listener being served.
#[derive(Debug)]
struct RunningListener {
    config: ListenerConfig,
    listener: Sockets,
    /// Stops its accept loop and drains its connections (a child of the shutdown token).
    stop: CancellationToken,
}

/// What `run` changes on reload.
struct Serving {
    gateway: Arc<Gateway>,
    /// The configuration serving now, its symlinked roots and cwds resolved.
    config: Config,
    /// The same configuration as written (`current` links unresolved).
    written: Config,
    listeners: Vec<RunningListener>,
    /// Numbers listeners for the per-client caps (never reused).
    next_listener: usize,
    connections: TaskTracker,
    accepting: TaskTracker,
    /// Pools retired by reloads, draining.
    retiring: TaskTracker,
    admission: Arc<Admission>,
    shutdown: CancellationToken,
    worker_nofile: Option<u64>,
    notifier: Arc<crate::systemd::Notifier>,
    /// The serving threads (`scheduler = "per-thread"`); dropped last, after the pools.
    shards: Option<Shards>,
    /// Where the next listener's first accept queue goes (`sockets`).
    next_queue: usize,
    /// The listeners' kernel accept queues, for status.
    backlogs: Arc<crate::front::backlog::Backlogs>,
    /// The generation number the next reload tries.
    next_generation: u64,
}

impl Serving {
    /// `listener` as this scheduler serves it. With serving threads each accept queue is
    /// given to one of them: a queue two threads waited on would wake both for every
    /// connection (one of them for nothing), which on a Unix socket that a front server opens
    /// per request costs more than the second thread gains. Listeners with one queue are
    /// spread over the threads in turn.
    fn sockets(
        &mut self,
        listener: Listener,
        config: &ListenerConfig,
    ) -> Result<Sockets, StartupError> {
        let Some(shards) = &self.shards else {
            return Ok(Sockets::Shared(Arc::new(listener)));
        };
        let failed = |source| StartupError::Listen {
            address: config.bind.address().to_string(),
            source,
        };
        let parked = listener
            .park(shards.len(), config.backlog)
            .map_err(failed)?;
        let handles = shards.handles();
        let mut queues = Vec::with_capacity(parked.queues());
        for queue in 0..parked.queues() {
            let thread = (self.next_queue + queue) % handles.len();
            let Some(handle) = handles.get(thread) else {
                continue;
            };
            let _entered = handle.enter();
            queues.push((thread, Arc::new(parked.register(queue).map_err(failed)?)));
        }
        self.next_queue += 1;
        Ok(Sockets::Parked {
            _parked: Arc::new(parked),
            queues,
        })
    }

    fn start_listener(&mut self, listener: Sockets, config: ListenerConfig) {
        let stop = self.shutdown.child_token();
        let index = self.next_listener;
        self.next_listener += 1;
        let accept = |listener: Arc<Listener>, announce: bool| {
            accept_loop(
                listener,
                config.clone(),
                index,
                Arc::clone(&self.admission),
                Arc::clone(&self.gateway),
                self.connections.clone(),
                stop.clone(),
                announce,
            )
        };
        match &listener {
            Sockets::Shared(l) => self.backlogs.add(config.protocol, std::slice::from_ref(l)),
            Sockets::Parked { queues, .. } => {
                let queues: Vec<_> = queues.iter().map(|(_, l)| Arc::clone(l)).collect();
                self.backlogs.add(config.protocol, &queues);
            }
        }
        match (&listener, &self.shards) {
            (Sockets::Shared(l), _) => {
                self.accepting.spawn(accept(Arc::clone(l), true));
            }
            (Sockets::Parked { queues, .. }, Some(shards)) => {
                for (n, (thread, l)) in queues.iter().enumerate() {
                    if let Some(handle) = shards.handles().get(*thread) {
                        handle.spawn(self.accepting.track_future(accept(Arc::clone(l), n == 0)));
                    }
                }
            }
            // `sockets` parks a listener only when there are serving threads.
            (Sockets::Parked { .. }, None) => {}
        }
        self.listeners.push(RunningListener {
            config,
            listener,
            stop,
        });
    }

    /// Serves `new` from now on, or keeps serving what runs now when `new` cannot be set up
    /// (every reason logged). See ARCHITECTURE.md, "Generations and reload".
    async fn reload(&mut self, new: Config) {
        let started = tokio::time::Instant::now();
        self.notifier.notify(&format!(
            "RELOADING=1\nMONOTONIC_USEC={}",
            crate::systemd::monotonic_usec()
        ));
        match self.try_reload(new).await {
            Ok(number) => {
                tracing::info!(
                    generation = number,
                    took = ?started.elapsed(),
                    "reloaded: the new configuration serves"
                );
                self.finished(Outcome::Applied { generation: number });
                self.notifier
                    .notify(&format!("READY=1\nSTATUS={}", status_line(&self.gateway)));
            }
            Err(ReloadError::Refused(refusal)) => {
                let pool = refusal.pool.clone();
                self.refused(refusal.to_string(), Some(pool));
            }
            Err(ReloadError::Startup(e)) => {
                tracing::error!(error = %e, "reload failed; the running configuration keeps serving");
                self.refused(e.to_string(), None);
            }
        }
    }

    /// Records a reload that did not apply (the running configuration keeps serving), and
    /// tells systemd it is ready again, with the reason in `STATUS=`.
    fn refused(&mut self, reason: String, pool: Option<String>) {
        tracing::error!(
            pool = pool.as_deref().unwrap_or("-"),
            reason = %reason,
            "reload refused; the running configuration keeps serving"
        );
        let status = format!("reload refused: {reason}; {}", status_line(&self.gateway));
        self.finished(Outcome::Failed { reason, pool });
        self.notifier
            .notify(&format!("READY=1\nSTATUS={}", status.replace('\n', " ")));
    }

    /// Keeps a reload's outcome for the status page and `corral reload`.
    fn finished(&self, outcome: Outcome) {
        let record = self.gateway.reloads.record(outcome);
        if let Err(e) = crate::deploy::write_result(&self.config.server.runtime_dir, &record) {
            tracing::warn!(error = %e, "cannot write the reload's result for `corral reload`");
        }
    }

    /// `corral restart-workers`: every spawned pool replaces each worker, the replacement
    /// ready before the old one stops taking requests, so nothing in flight is lost. A
    /// context root whose symlink names another release since this generation was built is
    /// a deploy: the running configuration is reloaded first (which replaces that root's
    /// pools, new before old, or is refused as a reload is), and the pools it kept are
    /// restarted in place.
    async fn restart_workers(&mut self) {
        let before: Vec<Arc<Pool>> = self.gateway.current().pools.iter().cloned().collect();
        if crate::deploy::links::roots_moved(&self.written, &self.config) {
            tracing::info!(
                "rolling restart: a context root's symlink names another release; the running configuration is reloaded first"
            );
            self.reload(self.written.clone()).await;
        }
        tracing::info!("rolling restart of every pool's workers");
        for pool in self.gateway.current().pools.iter() {
            if before.iter().any(|p| Arc::ptr_eq(p, pool)) {
                pool.restart_workers();
            }
        }
    }

    async fn try_reload(&mut self, new: Config) -> Result<u64, ReloadError> {
        warn_restart_only(&self.config, &new);
        let current = self.gateway.current();
        // Numbers are not reused, even by a refused reload, whose pools' sockets (tagged with
        // it) may still be going away.
        let number = self.next_generation.max(current.number + 1);
        self.next_generation = number + 1;
        // The release each symlinked root and cwd names now (a `current` symlink swapped
        // since the last generation makes its pools new ones). One that names nothing (a
        // link to a release that is not there) refuses the reload.
        let resolved = crate::deploy::links::resolve(&new);
        if let Some(refusal) = resolved.refusal() {
            return Err(ReloadError::Refused(refusal));
        }
        let written = new;
        let new = resolved.config;
        let settings = BuildSettings {
            worker_nofile: self.worker_nofile,
            launchers: launchers::install(&new)?,
            generation: number,
            cwd_links: resolved.cwd_links,
        };
        let router = Router::new(&new);
        let built = PoolRegistry::build(&new, &router, Some(&current.pools), &settings)?;
        drop(current);
        // Listeners to add are bound before anything changes: a failure leaves the running
        // configuration as it was (the new pools, never started, are dropped).
        let mut added = Vec::new();
        for l in &new.listeners {
            let address = l.bind.address();
            if self
                .listeners
                .iter()
                .any(|r| r.config.bind.address() == address)
            {
                continue;
            }
            let listener = Listener::bind_with(&l.bind, l.backlog, self.shards.is_some()).map_err(
                |source| StartupError::Listen {
                    address: address.to_string(),
                    source,
                },
            )?;
            added.push((self.sockets(listener, l)?, l.clone()));
        }
        // New before old: the new pools' workers start, and the switch waits for each
        // pool's `min` to be ready (and healthy), bounded by its start_timeout. A pool that
        // cannot get there refuses the reload: its workers stop, the old ones serve on.
        let new_pools: Vec<Arc<Pool>> = built.drivers.iter().map(|(p, _)| Arc::clone(p)).collect();
        for (pool, driver) in built.drivers {
            pool.start(driver);
        }
        for pool in built.registry.iter() {
            pool.follow_names();
        }
        let (floors, wait) = ready_wait(&new);
        if let Err(refusal) = crate::deploy::gate(&new_pools, &floors, wait).await {
            let kill = new.server.kill_timeout;
            for pool in new_pools {
                self.retiring.spawn(async move {
                    pool.stop(false);
                    if !pool.stopped(kill + std::time::Duration::from_secs(1)).await {
                        tracing::error!(pool = %pool.name, generation = pool.generation, "a refused reload's pool did not stop within kill_timeout");
                    }
                });
            }
            return Err(ReloadError::Refused(refusal));
        }
        let logs = crate::access::LogSettings::of(&new.server);
        if logs != crate::access::LogSettings::of(&self.config.server) {
            self.gateway.access.reconfigure(logs);
        }
        let kept = new.pools.len().saturating_sub(new_pools.len());
        self.gateway
            .replace(Generation::new(number, &new, router, built.registry));
        // Listeners: removed ones stop accepting and their connections finish what they
        // are doing; changed ones are served with their new settings on the same socket.
        let mut restart = Vec::new();
        for running in std::mem::take(&mut self.listeners) {
            let address = running.config.bind.address();
            match new.listeners.iter().find(|l| l.bind.address() == address) {
                None => {
                    tracing::info!(listener = %address, "listener removed by the reload; closing it");
                    running.stop.cancel();
                }
                Some(l) if *l == running.config => self.listeners.push(running),
                Some(l) => {
                    if l.bind != running.config.bind || l.backlog != running.config.backlog {
                        tracing::warn!(listener = %address, "socket settings (mode, owner, allow, backlog) change only at restart; kept as they were");
                    }
                    running.stop.cancel();
                    restart.push((running.listener, l.clone()));
                }
            }
        }
        for (listener, config) in restart.into_iter().chain(added) {
            self.start_listener(listener, config);
        }
        // Pools the new configuration does not keep finish what was routed to them, then
        // stop.
        let retired = built.retired.len();
        for pool in built.retired {
            let grace = new.server.grace;
            let kill = new.server.kill_timeout;
            self.retiring.spawn(retire(pool, grace, kill));
        }
        tracing::info!(
            generation = number,
            pools_new = new_pools.len(),
            pools_kept = kept,
            pools_retired = retired,
            "reload applied"
        );
        self.config = new;
        self.written = written;
        Ok(number)
    }
}

/// Says which settings of `new` wait for a restart (they are process-wide, or bound once).
fn warn_restart_only(old: &Config, new: &Config) {
    let (o, n) = (&old.server, &new.server);
    let mut differ = Vec::new();
    if o.runtime_dir != n.runtime_dir {
        differ.push("server.runtime_dir");
    }
    if o.max_connections != n.max_connections {
        differ.push("server.max_connections");
    }
    if o.threads != n.threads {
        differ.push("server.threads");
    }
    if o.scheduler != n.scheduler {
        differ.push("server.scheduler");
    }
    if o.spool_budget != n.spool_budget {
        differ.push("server.spool_budget");
    }
    if o.log_level != n.log_level {
        differ.push("server.log_level");
    }
    if old.status != new.status {
        differ.push("[status]");
    }
    for what in differ {
        tracing::warn!(
            setting = what,
            "changed by the reload, but it takes effect only at restart"
        );
    }
}

/// A pool the running configuration no longer has: once nothing routed to it is left (or
/// `grace` has passed), its workers stop as at shutdown.
async fn retire(pool: Arc<Pool>, grace: std::time::Duration, kill: std::time::Duration) {
    let deadline = tokio::time::Instant::now() + grace;
    while !pool.is_drained() {
        if tokio::time::Instant::now() >= deadline {
            tracing::warn!(pool = %pool.name, generation = pool.generation, ?grace, "requests still in flight on a retired pool after grace; stopping it anyway");
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    pool.stop(true);
    if pool.stopped(kill + std::time::Duration::from_secs(1)).await {
        tracing::info!(pool = %pool.name, generation = pool.generation, "retired pool stopped");
    } else {
        tracing::error!(pool = %pool.name, generation = pool.generation, "a retired pool did not stop within kill_timeout");
    }
}

/// For each pool (by name), the workers it must have ready before corral is ready: its
/// `min` (0 for pools of running servers and on-demand pools); and how long to wait at most.
fn ready_wait(config: &Config) -> (HashMap<String, usize>, std::time::Duration) {
    let mut wait = std::time::Duration::from_secs(1);
    let floors = config
        .pools
        .iter()
        .map(|p| {
            if let Backend::Spawned(spawn) = &p.backend {
                wait = wait.max(spawn.start_timeout + std::time::Duration::from_secs(1));
            }
            let floor = crate::pool::state::PoolSpec::from_config(p, config.server.kill_timeout)
                .map_or(0, |s| s.floor());
            (p.name.clone(), floor)
        })
        .collect();
    (floors, wait)
}

/// One line for systemd's `STATUS=`: what `systemctl status` shows. A pool that has never
/// had a worker ready although it tried is named with its latest failure, since its clients
/// get 503s while spawns are retried.
fn status_line(gateway: &Gateway) -> String {
    let (mut workers, mut busy, mut queued, mut served) = (0, 0, 0, 0);
    let mut failing = String::new();
    for pool in gateway.current().pools.iter() {
        let slots = pool.slots.stats();
        workers += slots.accepting_workers;
        busy += slots.in_flight;
        queued += slots.queued;
        served += pool.requests.snapshot().accepted;
        if let Some(rx) = &pool.status {
            let published = rx.borrow();
            if let Some(why) =
                crate::pool::driver::never_started(&published.status, &published.recent)
            {
                failing.push_str(&format!(
                    "; pool {} never started a worker: {}",
                    pool.name,
                    why.replace('\n', " ")
                ));
            }
        }
    }
    format!(
        "{workers} workers accepting, {busy} requests in flight, {queued} queued, {served} served{failing}"
    )
}

/// Sends READY=1 once every pool has its floor of ready workers (or the wait is over, with
/// a warning: a pool that cannot start must not keep systemd waiting forever), then STATUS=
/// every few seconds and WATCHDOG=1 as asked, until aborted.
async fn notify_loop(
    notifier: Arc<crate::systemd::Notifier>,
    gateway: Arc<Gateway>,
    (floors, wait): (HashMap<String, usize>, std::time::Duration),
) {
    let deadline = tokio::time::Instant::now() + wait;
    loop {
        let generation = gateway.current();
        let short = generation
            .pools
            .iter()
            .find(|p| p.ready_workers() < floors.get(&*p.name).copied().unwrap_or(0))
            .map(|p| Arc::clone(&p.name));
        match short {
            None => break,
            Some(name) if tokio::time::Instant::now() >= deadline => {
                tracing::warn!(pool = %name, "not every pool has its min workers ready; telling systemd we are ready anyway");
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

/// Accepts on `listener` until `shutdown`, serving each client in a task of the runtime it
/// runs in. `announce`: log the "listening" line (once per listener, whatever the number of
/// serving threads accepting on it).
#[allow(clippy::too_many_arguments)]
async fn accept_loop(
    listener: Arc<Listener>,
    config: ListenerConfig,
    index: usize,
    admission: Arc<Admission>,
    gateway: Arc<Gateway>,
    connections: TaskTracker,
    shutdown: CancellationToken,
    announce: bool,
) {
    let address = config.bind.address();
    let local = match &*listener {
        Listener::Tcp { listener, .. } => listener.local_addr().ok(),
        Listener::Unix { .. } => None,
    };
    // The bound address (with the real port when the configuration said 0) is what a test
    // or an operator needs to connect.
    let bound_address = listener
        .local_address()
        .map_or_else(|_| address.to_string(), |a| a.to_string());
    if announce {
        tracing::info!(listener = %bound_address, protocol = ?config.protocol, "listening");
    }
    loop {
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
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
            cap: config.max_connections_per_client,
        };
        // Beyond a cap with every connection busy: dropping the stream closes it at once
        // (the table logs that, rate-limited).
        let Some(ticket) = admission.admit(client) else {
            continue;
        };
        let gateway = Arc::clone(&gateway);
        let shutdown = shutdown.clone();
        let timeouts = config.timeouts;
        // Each connection's future is boxed before it is spawned: a task moves its future
        // whole into its cell and its output over it, kilobytes each time for these state
        // machines (a tenth of a plain fastcgi_pass request under callgrind), a box once.
        match config.protocol {
            FrontProtocol::Http => {
                let info = ConnInfo {
                    listener: address.clone(),
                    local,
                    peer,
                    forwarded: config.forwarded.clone(),
                    timeouts,
                };
                connections.spawn(Box::pin(http::serve_connection(
                    stream, info, ticket, gateway, shutdown,
                )));
            }
            FrontProtocol::Fastcgi => {
                let listener = address.clone();
                connections.spawn(Box::pin(fastcgi::serve_connection(
                    stream, listener, ticket, timeouts, gateway, shutdown,
                )));
            }
            FrontProtocol::Scgi => {
                let listener = address.clone();
                connections.spawn(Box::pin(scgi::serve_connection(
                    stream, listener, ticket, timeouts, gateway, shutdown,
                )));
            }
        }
    }
}
