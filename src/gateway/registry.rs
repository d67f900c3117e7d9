//! The pool registry: every pool of one configuration at run time, each owning its slot table,
//! idle connections, request counters and (for spawned pools) its driver.
//!
//! Built without side effects (no process, socket or file is made here: the launchers are
//! written beforehand, the drivers are returned to be started by the caller), so the same code
//! builds the first generation at start and the next one on reload. On reload a pool whose
//! configuration did not change is carried over as it is, workers and counters included; the
//! others are new, and the old ones are handed back to be drained (ARCHITECTURE.md,
//! "Generations and reload").

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc;

use crate::backend::{BackendError, Connections, Protocol, Reuse, Timeouts};
use crate::config::{Backend, BackendProtocol, Config, PoolConfig};
use crate::error::StartupError;
use crate::pool::driver::{Command as DriverCommand, Driver};
use crate::pool::requests::RequestStats;
use crate::pool::slots::{FailPolicy, Failed, Slot, SlotLimits, SlotTable};
use crate::pool::state::{PoolSpec, PoolState};
use crate::process::{Handoff, WorkerSocket, WorkerSpawn};
use crate::router::{PoolId, Router};
use crate::status::collect::PoolInfo;

/// Everything that decides whether a running pool can serve a new configuration unchanged:
/// its own settings, its contexts' caps (the slot table is built with them) and the server
/// settings its workers are started with.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct PoolIdentity {
    config: PoolConfig,
    caps: Vec<Option<usize>>,
    kill_timeout: Duration,
    runtime_dir: PathBuf,
    worker_nofile: Option<u64>,
    /// The real roots of the contexts using the pool: a deploy that points `root`'s symlink
    /// at a new release replaces the pool's workers (`crate::deploy::links`).
    roots: Vec<PathBuf>,
}

/// One pool at run time.
#[derive(Debug)]
pub struct Pool {
    /// The pool's name, for logs.
    pub name: Arc<str>,
    /// What the workers speak.
    pub protocol: Protocol,
    /// Slots and the queue.
    pub slots: Arc<SlotTable>,
    /// Idle persistent connections (FastCGI and LSAPI).
    pub connections: Connections,
    /// Time bounds of one exchange.
    pub timeouts: Timeouts,
    /// The driver of a spawned pool, told about requests that ran past `request_timeout`
    /// and asked to stop; `None` for pools of running servers.
    pub supervisor: Option<mpsc::UnboundedSender<DriverCommand>>,
    /// Request counters for the status page.
    pub requests: Arc<RequestStats>,
    /// The supervisor's status as its driver last published it; `None` for pools of
    /// running servers.
    pub status: Option<tokio::sync::watch::Receiver<crate::pool::driver::Published>>,
    /// How many times a request that never reached a worker is sent to another one.
    pub retries: usize,
    /// As configured, with what else decides whether a reload may keep the pool.
    pub(crate) identity: PoolIdentity,
    /// What the status page says about its configuration.
    pub info: PoolInfo,
    /// The generation that built the pool.
    pub generation: u64,
    /// The driver's task, once started; awaited when the pool stops.
    pub(crate) task: std::sync::Mutex<Option<tokio::task::JoinHandle<()>>>,
    /// Requests routed here that have not yet ended (whether or not they hold a slot): a
    /// pool retired by a reload stops only once none is left.
    pub(crate) routed: super::routed::RoutedCount,
    /// Where the stacks of the pool's workers are asked for, when they run corral's
    /// launchers (the slow-request log carries them: `src/gateway/slow_stacks.rs`).
    pub(crate) stacks: Option<Arc<crate::process::output::Tail>>,
    /// The DNS names among a pool of servers' `servers`, followed once the pool serves
    /// ([`Pool::follow_names`]).
    names: Option<crate::backend::resolve::ServerNames>,
}

impl crate::backend::resolve::Followed for Pool {
    fn name(&self) -> &str {
        &self.name
    }
    fn slots(&self) -> &Arc<SlotTable> {
        &self.slots
    }
    fn connections(&self) -> &Connections {
        &self.connections
    }
    fn names(&self) -> Option<&crate::backend::resolve::ServerNames> {
        self.names.as_ref()
    }
}

impl Pool {
    /// Tells the pool's driver that a request on the worker of `slot` failed with `error`,
    /// when that means the worker must go (it ran past `request_timeout`). The worker leaves
    /// rotation here, before the slot is given back: the next request must not reach a worker
    /// the driver is about to kill (it would meet a reset and answer 502).
    pub(crate) fn report(&self, slot: &Slot, error: &BackendError) {
        if let (Some(tx), BackendError::RequestTimeout { .. }) = (&self.supervisor, error) {
            self.slots.fail(slot.worker());
            self.connections.forget(slot.address());
            let _ = tx.send(DriverCommand::RequestTimedOut(slot.worker()));
        }
    }

    /// Takes the worker of `slot` out of rotation after `error`, when the error says the
    /// worker is broken: it could not be reached (refused, reset, timed out), it dropped the
    /// request before answering, it missed its first-byte deadline, or it broke the protocol's
    /// framing. A response head the application wrote wrong ([`BackendError::InvalidHead`]: a
    /// control byte PHP's `header()` let through) is the script's error, not the worker's:
    /// a client could otherwise recycle a worker per request. A spawned worker leaves rotation at
    /// once and its driver replaces it (kills a refusing one, recycles a suspect one); a
    /// server of a pool of servers counts a failure toward `max_fails` (connect failures and
    /// timeouts only, as nginx counts them by default).
    ///
    /// A kept connection closed or reset before any response byte
    /// ([`BackendError::is_stale`]) says only that the worker dropped that connection; it is
    /// marked suspect when its process is dying or gone (a killed worker is flagged before
    /// its sockets close), which is asked of the kernel here. Returns whether the worker left
    /// rotation.
    pub(crate) fn fault(&self, slot: &Slot, error: &BackendError) -> bool {
        let refused = matches!(error, BackendError::Connect { .. });
        // A connection reset or closed before the response head (not a kept connection that
        // went stale while idle) means the worker died or dropped the request: another
        // request sent there now would most likely meet the same end.
        let suspect = matches!(
            error,
            BackendError::FirstByteTimeout { .. }
                | BackendError::Protocol { .. }
                | BackendError::Read { .. }
                | BackendError::Write { .. }
                | BackendError::ClosedEarly { stale: false, .. }
        ) || (error.is_stale()
            && self.supervisor.is_some()
            && slot.pid().is_some_and(crate::process::is_exiting));
        if !refused && !suspect {
            return false;
        }
        let worker = slot.worker();
        match &self.supervisor {
            Some(tx) => {
                self.slots.fail(worker);
                self.connections.forget(slot.address());
                let command = if refused {
                    DriverCommand::Refused(worker)
                } else {
                    DriverCommand::Suspect(worker)
                };
                tracing::warn!(
                    pool = %self.name,
                    worker = worker.index,
                    error = %error,
                    "worker out of rotation: {}",
                    if refused { "it refused a connection" } else { "marked suspect" }
                );
                let _ = tx.send(command);
                true
            }
            None if refused || matches!(error, BackendError::FirstByteTimeout { .. }) => {
                let server = slot.address();
                match self.slots.fail(worker) {
                    Failed::Down(out) => {
                        self.connections.forget(server);
                        tracing::warn!(pool = %self.name, %server, error = %error, "server down: out of rotation for {out:?}, then probed");
                        true
                    }
                    Failed::StillDown(out) => {
                        tracing::info!(pool = %self.name, %server, error = %error, "server still down: out of rotation for another {out:?}");
                        true
                    }
                    failed @ (Failed::Counted | Failed::OutOfRotation) => {
                        tracing::info!(pool = %self.name, %server, error = %error, "server failure counted toward max_fails");
                        failed == Failed::OutOfRotation
                    }
                }
            }
            None => false,
        }
    }

    /// A request on `slot` got its head: a server that was failing is back.
    pub(crate) fn healthy(&self, slot: &Slot) {
        if slot.is_probe() {
            if let Some(down) = self.slots.succeeded(slot.worker()) {
                tracing::info!(pool = %self.name, server = %slot.address(), "server up again after {down:?} out of rotation");
            }
        }
    }

    /// Starts re-resolving the DNS names of a pool of servers (`src/backend/resolve.rs`);
    /// nothing for other pools, or when already started (a pool a reload carried over).
    pub fn follow_names(self: &Arc<Self>) {
        crate::backend::resolve::follow(self);
    }

    /// Runs `driver` (this pool's) and keeps its task, to be awaited by [`Pool::stopped`].
    pub fn start(&self, driver: Driver) {
        let task = tokio::spawn(driver.run());
        if let Ok(mut slot) = self.task.lock() {
            *slot = Some(task);
        }
    }

    /// Waits up to `bound` for the pool's driver to finish (every worker reaped) after
    /// [`Pool::stop`]; false when it did not.
    pub async fn stopped(&self, bound: Duration) -> bool {
        let task = self.task.lock().ok().and_then(|mut t| t.take());
        match task {
            Some(task) => tokio::time::timeout(bound, task).await.is_ok(),
            None => true,
        }
    }

    /// Whether nothing routed here is still running: no request routed, holding a slot or
    /// waiting for one.
    pub fn is_drained(&self) -> bool {
        let slots = self.slots.stats();
        slots.in_flight == 0 && slots.queued == 0 && self.routed.now() == 0
    }

    /// Workers that accept requests now (ready, idle or busy); pools of servers count
    /// their servers in rotation.
    pub fn ready_workers(&self) -> usize {
        self.slots.stats().accepting_workers
    }

    /// Asks the pool's driver to replace every worker, new before old, if it has one.
    pub fn restart_workers(&self) {
        if let Some(tx) = &self.supervisor {
            let _ = tx.send(DriverCommand::RollingRestart);
        }
    }

    /// Asks the pool's driver to stop its workers, if it has one.
    pub fn stop(&self, graceful: bool) {
        if let Some(tx) = &self.supervisor {
            let _ = tx.send(DriverCommand::Stop { graceful });
        }
    }
}

/// Retries for a request that never reached a worker: one per other worker (so every one
/// is tried once), at least 3 (a replacement may be ready by then), at most 16.
fn retries(backend: &Backend) -> usize {
    let workers = match backend {
        Backend::External { servers } => servers.len(),
        Backend::Spawned(s) => usize::try_from(s.sizing.max()).unwrap_or(usize::MAX),
    };
    workers.saturating_sub(1).clamp(3, 16)
}

/// A fixed seed per pool name: jitter differs between pools and runs alike.
fn seed(name: &str) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    name.hash(&mut h);
    h.finish() ^ u64::from(std::process::id())
}

/// What building a registry needs besides the configuration.
#[derive(Debug, Clone, Default)]
pub struct BuildSettings {
    /// The soft `RLIMIT_NOFILE` spawned workers get (`None` = inherited).
    pub worker_nofile: Option<u64>,
    /// The command of each `app = ...` pool, by pool name: its launcher, already written.
    pub launchers: HashMap<String, Vec<String>>,
    /// The number of the generation being built.
    pub generation: u64,
    /// The configured `cwd` of each pool whose real one differs (a symlink), by pool name,
    /// resolved again by the pool's driver at every rolling restart
    /// (`crate::deploy::links::resolve`).
    pub cwd_links: HashMap<String, PathBuf>,
}

/// A pool new in a registry, with the driver to run for it.
pub type NewPool = (Arc<Pool>, Driver);

/// A registry just built, with what the caller has to do about it.
#[derive(Debug)]
pub struct Built {
    /// The new registry.
    pub registry: PoolRegistry,
    /// The pools that are new in it with their drivers, to run ([`Pool::start`]; until then
    /// those pools have no worker).
    pub drivers: Vec<NewPool>,
    /// Pools of the previous registry that the new one does not carry over: to drain and
    /// stop once the new generation serves.
    pub retired: Vec<Arc<Pool>>,
}

/// Every pool of one configuration, by [`PoolId`] (configuration order).
#[derive(Debug, Default)]
pub struct PoolRegistry {
    pools: Vec<Arc<Pool>>,
}

impl PoolRegistry {
    /// Builds the pools of `config` (whose contexts `router` holds), carrying over from
    /// `previous` every pool that could serve the new configuration unchanged: the same
    /// settings of its own, the same caps of its contexts, the same server settings its
    /// workers are started with and the same real roots (`PoolIdentity`).
    pub fn build(
        config: &Config,
        router: &Router,
        previous: Option<&PoolRegistry>,
        settings: &BuildSettings,
    ) -> Result<Built, StartupError> {
        let mut pools = Vec::with_capacity(config.pools.len());
        let mut drivers = Vec::new();
        for (i, p) in config.pools.iter().enumerate() {
            let identity = PoolIdentity {
                config: p.clone(),
                caps: router.caps_of(PoolId(i)),
                kill_timeout: config.server.kill_timeout,
                runtime_dir: config.server.runtime_dir.clone(),
                worker_nofile: settings.worker_nofile,
                roots: config
                    .contexts
                    .iter()
                    .filter(|c| c.pool == p.name)
                    .filter_map(|c| c.root.clone())
                    .collect(),
            };
            let kept = previous
                .and_then(|r| r.by_name(&p.name))
                .filter(|old| old.identity == identity);
            if let Some(old) = kept {
                pools.push(Arc::clone(old));
                continue;
            }
            let (pool, driver) = build_pool(config, p, identity, settings)?;
            let pool = Arc::new(pool);
            if let Some(driver) = driver {
                drivers.push((Arc::clone(&pool), driver));
            }
            pools.push(pool);
        }
        let retired = previous
            .map(|r| {
                r.pools
                    .iter()
                    .filter(|old| !pools.iter().any(|p| Arc::ptr_eq(p, old)))
                    .cloned()
                    .collect()
            })
            .unwrap_or_default();
        Ok(Built {
            registry: PoolRegistry { pools },
            drivers,
            retired,
        })
    }

    /// The pool `id`.
    pub fn get(&self, id: PoolId) -> Option<&Arc<Pool>> {
        self.pools.get(id.0)
    }

    /// The pool named `name`.
    pub fn by_name(&self, name: &str) -> Option<&Arc<Pool>> {
        self.pools.iter().find(|p| &*p.name == name)
    }

    /// Every pool, in configuration order.
    pub fn iter(&self) -> impl Iterator<Item = &Arc<Pool>> {
        self.pools.iter()
    }

    /// How many pools there are.
    pub fn len(&self) -> usize {
        self.pools.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.pools.is_empty()
    }
}

/// One new pool, and its driver when corral spawns its workers.
fn build_pool(
    config: &Config,
    p: &PoolConfig,
    identity: PoolIdentity,
    settings: &BuildSettings,
) -> Result<(Pool, Option<Driver>), StartupError> {
    let slots = SlotTable::new(
        SlotLimits {
            max_conns: p.max_conns as usize,
            queue_size: p.queue_size as usize,
            queue_timeout: p.queue_timeout,
        },
        &identity.caps,
    );
    let name: Arc<str> = Arc::from(p.name.as_str());
    // A worker never has more requests in flight than its concurrency, so keeping that many
    // idle connections means no request ever has to connect again in a steady state; a
    // fixed smaller bound made every request beyond it open and close a connection (a
    // concurrency-100 run lost half its throughput that way).
    // A php_children group's concurrency is its children: one kept connection each (its
    // children never exit on their own, src/process/php_children.rs).
    let keep = (p.concurrency as usize).max(1);
    // Workers corral spawns (php-cgi, flup) wait for their next request blocked in
    // `read` on a kept connection, and taking an answer off the socket woke them for
    // nothing (src/net/owed.rs); a server someone else runs may wait in an event loop
    // registered for reads only (corral's own null backend), which that read does not
    // wake, and would pay the second `recv` per answer for nothing.
    let blocking_readers =
        matches!(p.backend, Backend::Spawned(_)) && p.protocol == BackendProtocol::Fastcgi;
    // A php_children group's children take one request each in turn, as behind php-fpm
    // (src/backend/connection.rs, decision 46).
    let reuse = Reuse {
        leave_reads: blocking_readers,
        in_turn: matches!(&p.backend, Backend::Spawned(s) if s.php_children.is_some()),
    };
    let connections = Connections::with_reuse(keep, reuse);
    let mut status = None;
    let mut driver = None;
    let mut stacks = None;
    let mut names = None;
    let supervisor = match &p.backend {
        Backend::External { servers } => {
            slots.set_fail_policy(FailPolicy {
                max_fails: p.max_fails,
                fail_timeout: p.fail_timeout,
            });
            let ids: Vec<_> = servers
                .iter()
                .map(|server| {
                    let id = slots.add_worker(p.concurrency as usize, server.clone(), None);
                    slots.set_accepting(id, true);
                    id
                })
                .collect();
            names = crate::backend::resolve::ServerNames::of(
                servers,
                &ids,
                p.resolve_every,
                p.concurrency as usize,
                p.max_conns as usize,
            );
            None
        }
        Backend::Spawned(spawn) => {
            let socket = WorkerSocket::Unix(config.server.runtime_dir.join("unset.sock"));
            let mut template = match WorkerSpawn::from_config(p, spawn, socket.clone()) {
                Some(t) => t,
                None => {
                    // An app pool: its command is an embedded launcher, written already.
                    let argv = settings.launchers.get(&p.name).cloned().ok_or_else(|| {
                        StartupError::NoCommand {
                            pool: p.name.clone(),
                        }
                    })?;
                    let mut t = WorkerSpawn::new(&p.name, argv, p.protocol, socket, Handoff::Fd0);
                    t.env = spawn.env.clone();
                    t.cwd = spawn.cwd.clone();
                    t.user = spawn.user.clone();
                    t.group = spawn.group.clone();
                    t.preload = spawn.preload;
                    t
                }
            };
            template.nofile = settings.worker_nofile;
            let spec = PoolSpec::from_config(p, config.server.kill_timeout).ok_or_else(|| {
                StartupError::NoCommand {
                    pool: p.name.clone(),
                }
            })?;
            let (tx, rx) = mpsc::unbounded_channel();
            let mut d = Driver::new(
                Arc::clone(&name),
                PoolState::new(spec, seed(&p.name)),
                Arc::clone(&slots),
                connections.clone(),
                template,
                config.server.runtime_dir.clone(),
                p.concurrency as usize,
                rx,
            );
            d.set_generation(settings.generation);
            if let Some(direct) = &spawn.direct {
                d.set_direct(direct.clone(), p.request_timeout);
            }
            if let Some(link) = settings.cwd_links.get(&p.name) {
                d.follow_cwd(link.clone());
            }
            if let Some(check) = &spawn.health_check {
                d.set_health(crate::pool::health::Probe {
                    pool: Arc::clone(&name),
                    protocol: p.protocol.into(),
                    check: check.clone(),
                    root: config
                        .contexts
                        .iter()
                        .filter(|c| c.pool == p.name)
                        .find_map(|c| c.root.clone()),
                    last_failure: Arc::default(),
                    launcher: false,
                });
            } else if !matches!(spawn.program, crate::config::Program::Command(_)) {
                d.set_health(crate::pool::health::Probe::launcher(
                    Arc::clone(&name),
                    p.protocol.into(),
                    spawn.start_timeout,
                ));
            }
            // The native PHP worker has no stack dump (it is killed at the timeout as
            // php-cgi is); the Python and Ruby launchers do.
            if matches!(
                spawn.program,
                crate::config::Program::Wsgi { .. } | crate::config::Program::Rack { .. }
            ) {
                d.set_stack_dumps();
                stacks = Some(Arc::clone(&d.status().borrow().tail));
            }
            status = Some(d.status());
            driver = Some(d);
            Some(tx)
        }
    };
    let info = PoolInfo::of(p);
    let capacity = info
        .max_conns
        .min(info.max_workers.saturating_mul(info.concurrency));
    let pool = Pool {
        name,
        protocol: p.protocol.into(),
        slots,
        connections,
        timeouts: Timeouts::from_pool(p),
        supervisor,
        requests: RequestStats::new(capacity as usize, counted_threads(config)),
        routed: super::routed::RoutedCount::new(counted_threads(config)),
        status,
        retries: retries(&p.backend),
        info,
        identity,
        generation: settings.generation,
        task: std::sync::Mutex::new(None),
        stacks,
        names,
    };
    Ok((pool, driver))
}

/// How many serving threads count into shares of their own: `[server] threads` of them with
/// the per-thread scheduler (a reload cannot change either), none with the work-stealing one
/// (whose tasks move between threads).
fn counted_threads(config: &Config) -> usize {
    match config.server.scheduler {
        crate::config::Scheduler::PerThread => crate::app::serving_threads(config),
        crate::config::Scheduler::WorkStealing => 0,
    }
}
