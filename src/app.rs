//! Wiring: builds the gateway from a validated configuration, serves every front listener,
//! and runs the shutdown phases.
//!
//! The caller binds the listeners (tests bind port 0) and owns the shutdown token (ARCHITECTURE.md
//! decision 18), so `run` does no signal handling of its own. Shutdown order: `/ready` answers
//! 503, serving goes on for `shutdown_delay`, then stop accepting, let the connections finish
//! what they are doing for up to `grace`, then drop what is left; the status listener answers
//! until the workers are stopped.

mod accept;
/// The CGI fronts' connection tasks, for benches/pipeline.rs to serve connections as the
/// accept loop does.
pub use accept::crew::{Crew, Front as CrewFront};
mod bind;
mod notify;
mod serving;

use std::sync::Arc;

use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::config::Config;
use crate::error::StartupError;
use crate::front::limits::{self, Admission};
use crate::front::listener::Listener;
use crate::gateway::{BuildSettings, Gateway, Pool};
use crate::shards::Shards;
use crate::{launchers, process, status};

use bind::front_admission;
pub use bind::{bind_all, BoundListener};
use notify::{notify_loop, ready_wait};
use serving::Serving;

/// Kernel accept backlog of the status listener (its clients are a few operators and
/// scrapers).
const STATUS_BACKLOG: u32 = 64;

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
            Some(
                Shards::start(n, config.server.pin_threads, config.serving_sched_batch())
                    .map_err(StartupError::ServingThreads)?,
            )
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

/// How many threads serve the front listeners ([`Config::serving_threads`] on the CPUs
/// corral may run on).
pub fn serving_threads(config: &Config) -> usize {
    config.serving_threads(std::thread::available_parallelism().map_or(1, |n| n.get()))
}
