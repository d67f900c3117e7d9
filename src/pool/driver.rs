//! The pool driver: the only part of a spawned pool that touches processes, sockets and
//! timers. It feeds the sans-IO [`PoolState`] with what happens (spawns, readiness, exits,
//! request counts read from the slot table, memory samples, demand, time) and carries out the
//! actions it returns (spawn, let a worker take requests or not, signal, kill, forget).
//! It ticks every 100 ms while anything is under way, about once a second at rest (`tick.rs`).
//!
//! One task per pool runs [`Driver::run`]; each worker process has one task that owns its `Child`,
//! waits for readiness and then for the exit, and reports both (ARCHITECTURE.md invariant 8: every
//! child is reaped exactly once, by its owner).

use std::collections::{HashMap, HashSet};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc;
use tokio::time::Instant;

mod timeout_stacks;

use super::memory_checks::MemoryWatch;

mod demand;
mod direct;
mod links;
mod memory;
mod preload;
mod refork;
mod spawn;
mod tick;
use crate::backend::Connections;
use crate::config::BackendAddress;
use crate::pool::health::Probe;
use crate::pool::preloader::{PreloaderEvent, Preloaders};
use crate::pool::slots::{SlotTable, WorkerId};
use crate::pool::state::{
    ExitKind, Notice, PoolAction, PoolEvent, PoolState, PoolStatus, Severity, WorkerKey,
};
use crate::process::output::{Tail, TailHandle};
use crate::process::preload::{parent_of, Control, PidFd};
use crate::process::{
    self, bind_worker_socket, spawn_worker, wait_listening, wait_ready, StopSignal, WorkerSocket,
    WorkerSpawn,
};
use spawn::{libc_sigkill, report_ready_and_exit};

/// Most notices kept in [`Published::recent`] for the status page.
pub const RECENT_NOTICES: usize = 32;

/// What the rest of corral tells a pool's driver.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Command {
    /// Stop the pool (gracefully: let workers finish first).
    Stop {
        /// Let workers finish their requests.
        graceful: bool,
    },
    /// A request on this worker ran past `request_timeout`: kill it and replace it.
    RequestTimedOut(WorkerId),
    /// Replace every worker, one at a time.
    RollingRestart,
    /// This worker's socket refused a connection (the slot table already skips it): kill it
    /// if it still runs, and replace it.
    Refused(WorkerId),
    /// A request on this worker missed its first-byte deadline or the worker broke the
    /// protocol (the slot table already skips it): recycle it, replacement first.
    Suspect(WorkerId),
}

/// What a worker's own task reports.
#[derive(Debug)]
enum Report {
    Ready(WorkerKey),
    Exited(WorkerKey, ExitKind),
    /// From preloader number `.0`'s task.
    Preloader(u64, PreloaderEvent),
    /// A worker past `request_timeout` has been asked for its stacks: kill it now.
    StacksTaken(WorkerKey),
    /// A connection waits on an ondemand direct pool's socket (`direct.rs`).
    Pending,
}

/// How long a forked worker's exit status may lag its pidfd: the preloader reaps it and
/// reports, usually within a millisecond; a preloader that is gone reports nothing.
const FORKED_STATUS_WAIT: Duration = Duration::from_secs(1);

#[derive(Debug)]
struct Worker {
    id: WorkerId,
    pid: u32,
    address: BackendAddress,
    /// A Unix socket file corral created for the worker, removed when it is forgotten.
    socket_file: Option<PathBuf>,
    /// The worker and its descendants as the last full memory sample found them; a check
    /// after a request reads only these.
    tree: Vec<u32>,
    /// What the memory checks after its requests have learned (when the next is due).
    memory: MemoryWatch,
    /// The preloader that forks (or forked) it, by number; `None` for a spawned worker.
    preloader: Option<u64>,
    /// Where the status its preloader reports goes, until the worker's task has it.
    exit_status: Option<tokio::sync::oneshot::Sender<ExitKind>>,
    /// When the spawn, or the fork, was asked for: for the log.
    asked: Instant,
    /// corral's end of the worker's own control socket (a forked worker of a pool that
    /// reforks): how it is told to become the template (`refork.rs`).
    channel: Option<Control>,
    /// The task that waits for a forked worker's readiness and end; aborted when the
    /// worker is promoted (the process lives on as a template, watched as one).
    task: Option<tokio::task::AbortHandle>,
}

/// One spawned pool's supervisor loop.
pub struct Driver {
    name: Arc<str>,
    /// Starts every worker socket's file name: the pool's name and the generation that made
    /// the pool, so the workers of a pool replaced on reload never meet the old pool's.
    socket_tag: String,
    state: PoolState,
    slots: Arc<SlotTable>,
    connections: Connections,
    template: WorkerSpawn,
    runtime_dir: PathBuf,
    concurrency: usize,
    /// Workers run corral's launchers: asked for their stacks before a timeout kill.
    stack_dumps: bool,
    workers: HashMap<WorkerKey, Worker>,
    by_id: HashMap<WorkerId, WorkerKey>,
    /// Stop signals held back until the worker's last request finishes (the slot table
    /// says when: [`SlotTable::drained`]).
    deferred: Vec<(WorkerKey, u32)>,
    epoch: Instant,
    reports_tx: mpsc::UnboundedSender<Report>,
    reports: mpsc::UnboundedReceiver<Report>,
    commands: mpsc::UnboundedReceiver<Command>,
    /// The state machine's status after every handled event, for the status page.
    published: tokio::sync::watch::Sender<Published>,
    /// The latest notices, published with the status.
    recent: Arc<std::collections::VecDeque<Recent>>,
    /// The pool's preloaders when it preloads (`preload = true`): workers are forked from
    /// one instead of spawned (ARCHITECTURE.md, "Preload and fork").
    preload: Option<Preloaders>,
    /// The pool's health check (`health_check`): a worker is reported ready only once it
    /// passes (`src/pool/health.rs`).
    health: Option<Arc<Probe>>,
    /// The last stderr lines of the pool's processes (and the stack dumps asked of them).
    tail: Arc<Tail>,
    /// The pool's `cwd` as configured when it is a symlink, resolved again at every rolling
    /// restart (`links.rs`).
    cwd_link: Option<PathBuf>,
    /// A direct pool's listener (`accept = "direct"`, `direct.rs`).
    direct: Option<direct::Direct>,
    /// The worker being promoted to be the template, while it is (`refork.rs`).
    promotion: Option<refork::Promotion>,
    /// Promoted templates that failed in a row; reforking stops at `refork::MAX_FAILURES`.
    refork_failures: u32,
    /// What the slot table was last told about waking this driver on demand (`demand.rs`).
    demand_wake: Option<bool>,
    /// When the next tick comes (`tick.rs`).
    rhythm: tick::Rhythm,
}

/// What a driver publishes for the status page after every event it handles.
#[derive(Debug, Clone)]
pub struct Published {
    /// The state machine's view.
    pub status: PoolStatus,
    /// Each worker's entry in the slot table, so live request counts can be read there.
    pub ids: Vec<(WorkerKey, WorkerId)>,
    /// The latest notices (crashes, recycles, kills, spawn failures), oldest first, at most
    /// [`RECENT_NOTICES`]: what the status page shows as recent events. Shared, so
    /// publishing does not copy them.
    pub recent: Arc<std::collections::VecDeque<Recent>>,
    /// The last stderr lines of the pool's processes (a worker that could not start is
    /// reported with them).
    pub tail: Arc<Tail>,
    /// The latest failed health check, when the pool has a health check and one failed.
    pub health_failure: Option<String>,
    /// When it was published: the workers' ages are as of then.
    pub at: Instant,
}

/// A notice the driver logged, kept for the status page.
#[derive(Debug, Clone)]
pub struct Recent {
    /// When it was logged (wall clock).
    pub at: std::time::SystemTime,
    /// The worker it is about, if one.
    pub worker: Option<WorkerKey>,
    /// That worker's process, if it had one.
    pub pid: Option<u32>,
    /// What happened.
    pub notice: Notice,
}

/// Why a pool has never had a worker ready although it tried: the latest failed start as it
/// was logged (a spawn that failed, a worker that died or timed out before it was ready).
/// `None` once a worker has been ready, or before any start has failed (a pool still
/// booting, an on-demand pool not yet asked).
pub fn never_started(
    status: &PoolStatus,
    recent: &std::collections::VecDeque<Recent>,
) -> Option<String> {
    let c = &status.counters;
    if c.ready > 0 || c.spawn_failed + c.crashed + c.start_timeouts == 0 {
        return None;
    }
    let latest = recent.iter().rev().find(|r| {
        matches!(
            r.notice,
            Notice::SpawnFailed { .. } | Notice::Crashed { .. } | Notice::StartTimedOut { .. }
        )
    });
    Some(latest.map_or_else(|| "every start failed".to_owned(), |r| r.notice.to_string()))
}

impl std::fmt::Debug for Driver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Driver")
            .field("pool", &self.name)
            .field("workers", &self.workers.len())
            .finish()
    }
}

impl Driver {
    /// A driver for the pool `name` whose workers are started from `template` (its socket
    /// is replaced per worker) with their sockets in `runtime_dir`.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        name: Arc<str>,
        state: PoolState,
        slots: Arc<SlotTable>,
        connections: Connections,
        template: WorkerSpawn,
        runtime_dir: PathBuf,
        concurrency: usize,
        commands: mpsc::UnboundedReceiver<Command>,
    ) -> Driver {
        let (reports_tx, reports) = mpsc::unbounded_channel();
        let recent = Arc::new(std::collections::VecDeque::new());
        let tail = Arc::new(Tail::default());
        let mut template = template;
        template.stderr_tail = TailHandle(Some(Arc::clone(&tail)));
        let preload = template.preload.then(|| Preloaders::new(&template.argv));
        let epoch = Instant::now();
        let rhythm = tick::Rhythm::new(state.spec(), epoch);
        let (published, _) = tokio::sync::watch::channel(Published {
            status: state.status(Duration::ZERO),
            ids: Vec::new(),
            recent: Arc::clone(&recent),
            tail: Arc::clone(&tail),
            health_failure: None,
            at: epoch,
        });
        Driver {
            socket_tag: name.to_string(),
            name,
            state,
            slots,
            connections,
            template,
            runtime_dir,
            concurrency,
            stack_dumps: false,
            workers: HashMap::new(),
            by_id: HashMap::new(),
            deferred: Vec::new(),
            epoch,
            reports_tx,
            reports,
            commands,
            published,
            recent,
            preload,
            health: None,
            tail,
            cwd_link: None,
            direct: None,
            promotion: None,
            refork_failures: 0,
            demand_wake: None,
            rhythm,
        }
    }

    /// Gates this pool's new workers on `probe` (`health_check`).
    pub fn set_health(&mut self, probe: Probe) {
        self.health = Some(Arc::new(probe));
    }

    /// Tags the worker sockets of this pool with `generation` (see `socket_tag`).
    pub fn set_generation(&mut self, generation: u64) {
        self.socket_tag = format!("{}-g{generation}", self.name);
    }

    /// The pool's status as of the last event the driver handled (the status page reads it
    /// without waiting on the driver).
    pub fn status(&self) -> tokio::sync::watch::Receiver<Published> {
        self.published.subscribe()
    }

    fn publish(&self) {
        self.published.send_replace(Published {
            status: self.state.status(self.now()),
            ids: self.workers.iter().map(|(k, w)| (*k, w.id)).collect(),
            recent: Arc::clone(&self.recent),
            tail: Arc::clone(&self.tail),
            health_failure: self
                .health
                .as_ref()
                .and_then(|h| h.last_failure.lock().ok().and_then(|f| f.clone())),
            at: Instant::now(),
        });
    }

    /// Keeps `notice` among the recent ones, with the pid of the worker it names (still
    /// known here: the state machine forgets a worker after its last notice).
    fn remember(&mut self, notice: Notice) {
        let worker = match &notice {
            Notice::Crashed { key, .. }
            | Notice::SpawnFailed { key, .. }
            | Notice::StartTimedOut { key, .. }
            | Notice::RequestTimedOut { key, .. }
            | Notice::Refused { key }
            | Notice::KillTimedOut { key, .. }
            | Notice::Recycling { key, .. }
            | Notice::RollingRestartStopped { key, .. } => Some(*key),
            Notice::CrashLoop { .. } | Notice::CrashLoopOver => None,
        };
        let pid = worker
            .and_then(|k| self.workers.get(&k))
            .map(|w| w.pid)
            .filter(|&p| p != 0);
        // A copy only when the last published list is still read somewhere.
        let recent = Arc::make_mut(&mut self.recent);
        if recent.len() >= RECENT_NOTICES {
            recent.pop_front();
        }
        recent.push_back(Recent {
            at: std::time::SystemTime::now(),
            worker,
            pid,
            notice,
        });
    }

    fn now(&self) -> Duration {
        self.epoch.elapsed()
    }

    /// Runs the pool until it has stopped and every worker is reaped.
    pub async fn run(mut self) {
        // One timer for every tick, moved only when the next one's time changes: under load
        // (a tick every 100 ms) the events between ticks leave it alone. The first is now.
        let sleep = tokio::time::sleep_until(Instant::now());
        tokio::pin!(sleep);
        let mut last_tick = Instant::now();
        self.start_direct();
        let started = self.handle(PoolEvent::Start);
        self.sync_demand_wake();
        self.publish();
        if started {
            self.stop_preloaders().await;
            return;
        }
        loop {
            let stopped = tokio::select! {
                report = self.reports.recv() => match report {
                    Some(Report::Ready(key)) => {
                        self.log_ready(key);
                        self.handle(PoolEvent::Ready { key })
                    }
                    Some(Report::Exited(key, status)) => {
                        self.deferred.retain(|(k, _)| *k != key);
                        self.direct_exited(key, status);
                        self.handle(PoolEvent::Exited { key, status })
                    }
                    Some(Report::Preloader(n, event)) => self.on_preloader(n, event),
                    Some(Report::StacksTaken(key)) => self.handle(PoolEvent::RequestTimedOut { key }),
                    Some(Report::Pending) => self.on_pending(),
                    None => false,
                },
                command = self.commands.recv() => match command {
                    Some(Command::Stop { graceful }) => {
                        self.slots.close();
                        self.handle(PoolEvent::Stop { graceful })
                    }
                    Some(Command::RequestTimedOut(id)) => match self.by_id.get(&id).copied() {
                        Some(key) => self.request_timed_out(key),
                        None => false,
                    },
                    Some(Command::RollingRestart) => self.rolling_restart(),
                    Some(Command::Refused(id)) => match self.by_id.get(&id).copied() {
                        Some(key) => self.handle(PoolEvent::Refused { key }),
                        None => false,
                    },
                    Some(Command::Suspect(id)) => match self.by_id.get(&id).copied() {
                        Some(key) => self.handle(PoolEvent::Suspect { key }),
                        None => false,
                    },
                    // Every sender is gone: corral is going away; stop.
                    None => self.handle(PoolEvent::Stop { graceful: false }),
                },
                due = self.slots.memory_checks() => self.check_memory(&due),
                drained = self.slots.drained() => {
                    self.send_deferred_signals(&drained);
                    self.promotion_drained(&drained)
                }
                () = self.slots.demand() => {
                    let waiting = self.slots.stats().queued;
                    self.handle(PoolEvent::Demand { waiting })
                }
                () = &mut sleep => {
                    last_tick = Instant::now();
                    self.tick(last_tick)
                }
            };
            self.sync_demand_wake();
            self.publish();
            if stopped {
                self.stop_preloaders().await;
                tracing::info!(pool = %self.name, "pool stopped: every worker reaped");
                return;
            }
            let next = self.next_tick_at(last_tick);
            if sleep.deadline() != next {
                sleep.as_mut().reset(next);
            }
        }
    }

    /// A new worker answered its readiness check (for an app pool, the launcher's own probe:
    /// its first answer): how long after corral spawned it, or asked its preloader or
    /// template to fork it. `benches/refork.sh peers` reads these lines.
    fn log_ready(&self, key: WorkerKey) {
        if let Some(w) = self.workers.get(&key) {
            let ready_ms = w.asked.elapsed().as_secs_f64() * 1000.0;
            let forked = w.preloader.is_some();
            tracing::info!(pool = %self.name, %key, pid = w.pid, forked, ready_ms, "worker ready");
        }
    }

    /// Turns what the slot table counted since the last call into request events.
    fn sync_counts(&mut self) {
        let deltas = self.slots.take_request_deltas();
        self.rhythm.seen_requests |= !deltas.is_empty();
        for delta in deltas {
            let Some(key) = self.by_id.get(&delta.id).copied() else {
                continue;
            };
            for _ in 0..delta.started {
                self.feed(PoolEvent::RequestStarted { key });
            }
            for _ in 0..delta.finished {
                self.feed(PoolEvent::RequestFinished { key });
            }
        }
    }

    /// Brings the state machine up to date with the slot table, then feeds one event and
    /// carries out its actions; true once the pool has stopped.
    fn handle(&mut self, ev: PoolEvent) -> bool {
        self.sync_counts();
        self.apply(ev)
    }

    /// Feeds one event as it is and carries out its actions.
    fn apply(&mut self, ev: PoolEvent) -> bool {
        let now = self.now();
        let actions = self.state.on_event(ev, now);
        let mut stopped = false;
        for action in actions {
            stopped |= self.act(action);
        }
        stopped
    }

    /// Like `apply`, where the pool cannot stop as a result (request and spawn events).
    fn feed(&mut self, ev: PoolEvent) {
        let _ = self.apply(ev);
    }

    /// Sends the stop signals that waited for the last request of the `drained` workers.
    fn send_deferred_signals(&mut self, drained: &[WorkerId]) {
        for id in drained {
            let Some(key) = self.by_id.get(id).copied() else {
                continue;
            };
            if let Some(i) = self.deferred.iter().position(|(k, _)| *k == key) {
                let (_, pid) = self.deferred.swap_remove(i);
                tracing::debug!(pool = %self.name, %key, pid, "the worker's last request ended: sending its stop signal");
                self.terminate(pid);
            }
        }
    }

    fn terminate(&self, pid: u32) {
        match process::signal_group(pid, StopSignal::Term) {
            Ok(true) => {
                tracing::debug!(pool = %self.name, pid, "stop signal sent to the worker's process group")
            }
            Ok(false) => {
                tracing::debug!(pool = %self.name, pid, "no stop signal sent: the worker's process group is gone")
            }
            Err(e) => {
                tracing::warn!(pool = %self.name, pid, error = %e, "cannot signal the worker")
            }
        }
    }

    fn act(&mut self, action: PoolAction) -> bool {
        match action {
            PoolAction::Spawn { key } => self.spawn(key),
            PoolAction::Accept { key, on } => {
                if let Some(w) = self.workers.get(&key) {
                    self.slots.set_accepting(w.id, on);
                }
            }
            PoolAction::Signal { key, pid, .. } => {
                tracing::debug!(pool = %self.name, %key, pid, "asking the worker to stop");
                self.abort_promotion(key, "it is being stopped");
                let Some(w) = self.workers.get(&key) else {
                    return false;
                };
                self.connections.forget(&w.address);
                // The state machine sees request counts as of the last sync; a request may
                // have started since. The worker takes no new one now, so wait for the
                // last to finish rather than cut it off: the slot table reports it.
                if self.is_direct() {
                    // Sent once the worker is back in accept (`direct.rs`).
                    self.deferred.push((key, pid));
                    self.send_direct_signals();
                } else if self.slots.watch_drain(w.id) {
                    self.terminate(pid);
                } else {
                    tracing::debug!(pool = %self.name, %key, pid, "a request is still in flight on the worker: its stop signal waits for the request's end");
                    self.deferred.push((key, pid));
                }
            }
            PoolAction::Kill { key, pid } => {
                tracing::debug!(pool = %self.name, %key, pid, "killing the worker");
                self.abort_promotion(key, "it is being killed");
                if let Some(w) = self.workers.get(&key) {
                    self.slots.set_accepting(w.id, false);
                    self.connections.forget(&w.address);
                }
                if let Err(e) = process::signal_group(pid, StopSignal::Kill) {
                    tracing::warn!(pool = %self.name, pid, error = %e, "cannot kill the worker");
                }
            }
            PoolAction::Forget { key } => {
                if let Some(w) = self.workers.remove(&key) {
                    if let Some(n) = w.preloader {
                        self.forget_forked(n, key);
                    }
                    self.by_id.remove(&w.id);
                    self.slots.remove_worker(w.id);
                    self.connections.forget(&w.address);
                    if let Some(path) = w.socket_file {
                        let _ = std::fs::remove_file(path);
                    }
                }
            }
            PoolAction::Notice(notice) => {
                log_notice(&self.name, &notice);
                self.remember(notice);
            }
            PoolAction::Stopped => return true,
        }
        false
    }
}

fn log_notice(pool: &str, notice: &Notice) {
    match notice.severity() {
        Severity::Info => tracing::info!(pool, "{notice}"),
        Severity::Warn => tracing::warn!(pool, "{notice}"),
        Severity::Error => tracing::error!(pool, "{notice}"),
    }
}
