//! What `run` changes while it serves: the listeners and their accept queues on the serving
//! threads, reloads (a new generation, pools retired and drained), and rolling restarts.

use std::sync::Arc;

use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::config::{Config, ListenerConfig};
use crate::deploy::{Outcome, ReloadError};
use crate::error::StartupError;
use crate::front::limits::Admission;
use crate::front::listener::{Listener, Parked};
use crate::gateway::{BuildSettings, Gateway, Generation, Pool, PoolRegistry};
use crate::launchers;
use crate::router::Router;
use crate::shards::Shards;

use super::accept::accept_loop;
use super::notify::{ready_wait, status_line};

/// A front listener's socket as it is served.
#[derive(Debug)]
pub(super) enum Sockets {
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
pub(super) struct RunningListener {
    config: ListenerConfig,
    listener: Sockets,
    /// Stops its accept loop and drains its connections (a child of the shutdown token).
    stop: CancellationToken,
}

/// What `run` changes on reload.
pub(super) struct Serving {
    pub(super) gateway: Arc<Gateway>,
    /// The configuration serving now, its symlinked roots and cwds resolved.
    pub(super) config: Config,
    /// The same configuration as written (`current` links unresolved).
    pub(super) written: Config,
    pub(super) listeners: Vec<RunningListener>,
    /// Numbers listeners for the per-client caps (never reused).
    pub(super) next_listener: usize,
    pub(super) connections: TaskTracker,
    pub(super) accepting: TaskTracker,
    /// Pools retired by reloads, draining.
    pub(super) retiring: TaskTracker,
    pub(super) admission: Arc<Admission>,
    pub(super) shutdown: CancellationToken,
    pub(super) worker_nofile: Option<u64>,
    pub(super) notifier: Arc<crate::systemd::Notifier>,
    /// The serving threads (`scheduler = "per-thread"`); dropped last, after the pools.
    pub(super) shards: Option<Shards>,
    /// Where the next listener's first accept queue goes (`sockets`).
    pub(super) next_queue: usize,
    /// The listeners' kernel accept queues, for status.
    pub(super) backlogs: Arc<crate::front::backlog::Backlogs>,
    /// The generation number the next reload tries.
    pub(super) next_generation: u64,
}

impl Serving {
    /// `listener` as this scheduler serves it. With serving threads each accept queue is
    /// given to one of them: a queue two threads waited on would wake both for every
    /// connection (one of them for nothing), which on a Unix socket that a front server opens
    /// per request costs more than the second thread gains. Listeners with one queue are
    /// spread over the threads in turn.
    pub(super) fn sockets(
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

    pub(super) fn start_listener(&mut self, listener: Sockets, config: ListenerConfig) {
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
    pub(super) async fn reload(&mut self, new: Config) {
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
    pub(super) fn refused(&mut self, reason: String, pool: Option<String>) {
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
    pub(super) async fn restart_workers(&mut self) {
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
    if o.pin_threads != n.pin_threads {
        differ.push("server.pin_threads");
    }
    if o.sched_batch != n.sched_batch {
        differ.push("server.sched_batch");
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
