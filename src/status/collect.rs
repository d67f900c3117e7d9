//! Collects what the status page shows, per pool: the configured limits, the slot table's
//! live numbers, the gateway's request counters and the supervisor's last published status.
//! Nothing here waits on a worker or on the pool's driver, so status answers while every
//! worker is busy.

use std::time::{Duration, SystemTime};

use crate::config::{Backend, PoolConfig, Sizing};
use crate::gateway::Gateway;
use crate::pool::requests::{HistogramSnapshot, Phase, RequestSnapshot};
use crate::pool::slots::{SlotAges, SlotStats, WorkerCounts, WorkerId};
use crate::pool::state::{PoolStatus, WorkerKey, WorkerState};
use crate::process;

/// What the configuration says about a pool, kept beside its live values.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PoolInfo {
    /// The pool's name.
    pub name: String,
    /// `fastcgi`, `scgi` or `lsapi`.
    pub protocol: &'static str,
    /// php-fpm's "process manager": `static`, `dynamic`, `ondemand`, or `external` for a
    /// pool of servers corral does not run.
    pub mode: &'static str,
    /// Fewest workers kept (none for external pools).
    pub min_workers: Option<u32>,
    /// Most workers at once (for external pools: the number of servers).
    pub max_workers: u32,
    /// Requests one worker serves at once.
    pub concurrency: u32,
    /// Cap on concurrent backend requests.
    pub max_conns: u32,
    /// Requests allowed to wait.
    pub queue_size: u32,
    /// Longest wait for a slot.
    pub queue_timeout: Duration,
    /// Budget of the PSS summed over the workers (`max_pool_memory`; none = no budget).
    pub max_pool_memory: Option<u64>,
    /// Most workers a rolling restart keeps above the pool's size (`max_surge`; none = one
    /// replacement at a time).
    pub max_surge: Option<u32>,
    /// A direct pool's listener (`accept = "direct"`), whose workers accept on it
    /// themselves: their busy and idle states and the listen queue come from the kernel.
    pub direct: Option<String>,
    /// The workers are php-cgi parents (`php_children`): the page counts their children.
    pub php_children: bool,
}

impl PoolInfo {
    /// The status-page view of a pool's configuration.
    pub fn of(p: &PoolConfig) -> PoolInfo {
        let (mode, min_workers, max_workers) = match &p.backend {
            Backend::External { servers } => (
                "external",
                None,
                u32::try_from(servers.len()).unwrap_or(u32::MAX),
            ),
            Backend::Spawned(s) => match s.sizing {
                Sizing::Static { workers } => ("static", Some(workers), workers),
                Sizing::Dynamic { min, max, .. } => ("dynamic", Some(min), max),
                Sizing::OnDemand { max, .. } => ("ondemand", Some(0), max),
            },
        };
        let recycle = match &p.backend {
            Backend::Spawned(s) => Some(s.recycle),
            Backend::External { .. } => None,
        };
        PoolInfo {
            name: p.name.clone(),
            protocol: match p.protocol {
                crate::config::BackendProtocol::Fastcgi => "fastcgi",
                crate::config::BackendProtocol::Scgi => "scgi",
                crate::config::BackendProtocol::Lsapi => "lsapi",
            },
            mode,
            min_workers,
            max_workers,
            concurrency: p.concurrency,
            max_conns: p.max_conns,
            queue_size: p.queue_size,
            queue_timeout: p.queue_timeout,
            max_pool_memory: recycle.and_then(|r| r.max_pool_memory),
            max_surge: recycle.and_then(|r| r.max_surge),
            direct: match &p.backend {
                Backend::Spawned(s) => s.direct.as_ref().map(|d| d.bind.address().to_string()),
                Backend::External { .. } => None,
            },
            php_children: matches!(&p.backend, Backend::Spawned(s) if s.php_children.is_some()),
        }
    }
}

/// What the status server knows before any request: when corral started, and the connection
/// tables. (Each pool's configuration is the pool's own, [`crate::gateway::Pool::info`]: a
/// reload changes it.)
#[derive(Debug, Clone)]
pub struct StatusSource {
    /// Wall-clock start of serving (php-fpm's "start time").
    pub started: SystemTime,
    /// The connection tables (front listeners, status listener) `/metrics` reports.
    pub connections: Vec<std::sync::Arc<crate::front::limits::Admission>>,
    /// The last minutes of each pool, for the HTML page's sparklines: filled by
    /// [`crate::status::history::sample`] where that runs (beside the status listener),
    /// empty otherwise.
    pub history: std::sync::Arc<crate::status::history::History>,
    /// Cancelled when a graceful stop begins: `/ready` answers 503 from then on, while
    /// `/ping` keeps answering (readiness, not liveness). Never cancelled where nothing
    /// stops the listener (a FastCGI listener's `status_path`).
    pub stopping: tokio_util::sync::CancellationToken,
    /// The front listeners, whose kernel accept queues status reports.
    pub backlogs: std::sync::Arc<crate::front::backlog::Backlogs>,
    /// Recent PSS readings by pid, for workers the supervisor does not sample itself: a
    /// reading walks /proc for the worker's process tree, and a scraper asking every second
    /// for sixteen workers would otherwise pay that walk each time.
    pss_cache: std::sync::Arc<
        std::sync::Mutex<std::collections::HashMap<u32, (tokio::time::Instant, u64)>>,
    >,
}

/// How long a PSS reading of the status page is reused.
const PSS_CACHE_FOR: std::time::Duration = std::time::Duration::from_secs(5);

impl StatusSource {
    /// A source started now.
    #[allow(clippy::new_without_default)] // "now" is not a default
    pub fn new() -> StatusSource {
        StatusSource {
            started: SystemTime::now(),
            connections: Vec::new(),
            history: std::sync::Arc::default(),
            stopping: tokio_util::sync::CancellationToken::new(),
            backlogs: std::sync::Arc::default(),
            pss_cache: std::sync::Arc::default(),
        }
    }

    /// The PSS of `pid`'s process tree, read at most once per [`PSS_CACHE_FOR`].
    fn pss(&self, pid: u32) -> Option<u64> {
        let now = tokio::time::Instant::now();
        if let Ok(cache) = self.pss_cache.lock() {
            if let Some(&(at, bytes)) = cache.get(&pid) {
                if now.duration_since(at) < PSS_CACHE_FOR {
                    return Some(bytes);
                }
            }
        }
        let bytes = process::process_tree_pss(pid).ok()?.bytes();
        if let Ok(mut cache) = self.pss_cache.lock() {
            // Readings of workers that are gone age out here.
            cache.retain(|_, (at, _)| now.duration_since(*at) < PSS_CACHE_FOR);
            cache.insert(pid, (now, bytes));
        }
        Some(bytes)
    }
}

/// Worker counts as php-fpm names them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ProcessCounts {
    /// Ready with nothing in flight.
    pub idle: usize,
    /// With at least one request in flight.
    pub active: usize,
    /// Every worker not yet reaped (or every external server).
    pub total: usize,
}

/// One pool at one moment.
#[derive(Debug, Clone)]
pub struct PoolReport {
    /// Configuration.
    pub info: PoolInfo,
    /// The slot table now.
    pub slots: SlotStats,
    /// How long the oldest request in flight and the oldest waiting one have been so.
    pub ages: SlotAges,
    /// The gateway's request counters now.
    pub requests: RequestSnapshot,
    /// Time waited for a slot.
    pub queue_wait: HistogramSnapshot,
    /// Time from slot to backend connection.
    pub connect: HistogramSnapshot,
    /// Time from sending to the response head.
    pub first_byte: HistogramSnapshot,
    /// Time from asking for a slot to the end of the body.
    pub total: HistogramSnapshot,
    /// The supervisor's last published status (spawned pools only).
    pub supervisor: Option<PoolStatus>,
    /// The slot table's servers (external pools only).
    pub servers: Vec<WorkerCounts>,
    /// The supervisor's latest notices, oldest first (spawned pools only).
    pub recent: std::sync::Arc<std::collections::VecDeque<crate::pool::driver::Recent>>,
    /// A direct pool's listener's accept queue, from the kernel (none for other pools).
    pub listen: Option<crate::front::backlog::Backlog>,
}

impl PoolReport {
    /// Idle, active and total workers; for a pool whose workers are php-cgi parents
    /// (`php_children`), their children, which are what serves, as php-fpm counts its
    /// children: a child runs one request at a time, so a group's requests in flight are
    /// its active children, whether the children accept the front's connections (a direct
    /// pool) or corral's.
    pub fn processes(&self) -> ProcessCounts {
        if let Some(s) = self.supervisor.as_ref().filter(|_| self.info.php_children) {
            if s.workers.iter().any(|w| !w.children.is_empty()) {
                let total: usize = s.workers.iter().map(|w| w.children.len()).sum();
                let active: usize = s.workers.iter().map(|w| w.in_flight).sum();
                return ProcessCounts {
                    idle: total.saturating_sub(active),
                    active,
                    total,
                };
            }
        }
        match &self.supervisor {
            Some(s) => ProcessCounts {
                idle: s
                    .workers
                    .iter()
                    .filter(|w| {
                        w.in_flight == 0
                            && matches!(w.state, WorkerState::Idle | WorkerState::Draining)
                    })
                    .count(),
                active: s.workers.iter().filter(|w| w.in_flight > 0).count(),
                total: s.workers.len(),
            },
            None => ProcessCounts {
                idle: self
                    .servers
                    .iter()
                    .filter(|w| w.accepting && w.in_flight == 0)
                    .count(),
                active: self.servers.iter().filter(|w| w.in_flight > 0).count(),
                total: self.servers.len(),
            },
        }
    }

    /// Workers in `state` (spawned pools; 0 for external ones).
    pub fn workers_in(&self, state: WorkerState) -> usize {
        self.supervisor
            .as_ref()
            .map_or(0, |s| s.workers.iter().filter(|w| w.state == state).count())
    }
}

/// The supervisor's rows brought up to date with the slot table's live counts: the
/// supervisor syncs them only at its events and ticks (100 ms to 1 s apart), the table at
/// every request.
fn live(
    mut status: PoolStatus,
    ids: &[(WorkerKey, WorkerId)],
    table: &[WorkerCounts],
) -> PoolStatus {
    for w in &mut status.workers {
        let Some(counts) = ids
            .iter()
            .find(|(k, _)| *k == w.key)
            .and_then(|(_, id)| table.iter().find(|c| c.id == *id))
        else {
            continue;
        };
        w.in_flight = counts.in_flight;
        w.served = w
            .served
            .max(counts.started.saturating_sub(counts.in_flight as u64));
        w.state = match w.state {
            WorkerState::Idle | WorkerState::Busy if counts.in_flight > 0 => WorkerState::Busy,
            WorkerState::Idle | WorkerState::Busy => WorkerState::Idle,
            other => other,
        };
    }
    status
}

/// The supervisor's status published at `at`, as of now: the live counts (`live`), and
/// the workers' ages grown by the time since (a supervisor at rest publishes about once a
/// second).
fn as_of_now(
    status: PoolStatus,
    at: tokio::time::Instant,
    ids: &[(WorkerKey, WorkerId)],
    table: &[WorkerCounts],
) -> PoolStatus {
    let mut status = live(status, ids, table);
    let since = at.elapsed();
    for w in &mut status.workers {
        w.age += since;
    }
    status
}

/// Every pool (or the one named `only`), as it is now. With `measure_memory`, a worker
/// whose memory the supervisor has not sampled is measured now (its PSS).
pub fn collect(
    gateway: &Gateway,
    source: &StatusSource,
    only: Option<&str>,
    measure_memory: bool,
) -> Vec<PoolReport> {
    gateway
        .current()
        .pools
        .iter()
        .filter(|p| only.is_none_or(|name| &*p.name == name))
        .map(|p| {
            let info = p.info.clone();
            let servers = p.slots.workers();
            let mut recent = std::sync::Arc::default();
            let mut supervisor = p.status.as_ref().map(|rx| {
                let published = rx.borrow().clone();
                recent = published.recent;
                let mut status =
                    as_of_now(published.status, published.at, &published.ids, &servers);
                for w in &mut status.workers {
                    w.children = w
                        .pid
                        .map(process::php_children::children_of)
                        .unwrap_or_default();
                }
                if info.direct.is_some() {
                    kernel_states(&mut status);
                }
                status
            });
            if measure_memory {
                if let Some(s) = supervisor.as_mut() {
                    for w in &mut s.workers {
                        if let (None, Some(pid)) = (w.memory, w.pid) {
                            w.memory = source.pss(pid);
                        }
                    }
                }
            }
            let servers = if supervisor.is_none() {
                servers
            } else {
                Vec::new()
            };
            let listen = info.direct.as_ref().and_then(|a| {
                crate::pool::direct::backlogs()
                    .read()
                    .into_iter()
                    .find(|b| b.address == *a)
            });
            PoolReport {
                info,
                slots: p.slots.stats(),
                ages: p.slots.ages(),
                requests: p.requests.snapshot(),
                queue_wait: p.requests.histogram(Phase::QueueWait),
                connect: p.requests.histogram(Phase::Connect),
                first_byte: p.requests.histogram(Phase::FirstByte),
                total: p.requests.histogram(Phase::Total),
                listen,
                supervisor,
                servers,
                recent,
            }
        })
        .collect()
}

/// A direct pool's workers as the kernel sees them: one blocked in accept(2) is idle, one
/// that is not holds a connection (`crate::pool::direct::in_accept`). corral counts no
/// request of theirs, so this is the only view of what they do.
fn kernel_states(status: &mut PoolStatus) {
    for w in &mut status.workers {
        if !matches!(w.state, WorkerState::Idle | WorkerState::Busy) {
            continue;
        }
        if !w.children.is_empty() {
            // A php-cgi parent (`php_children`): its children accept, so count them.
            let busy = w
                .children
                .iter()
                .filter(|&&c| crate::pool::direct::in_accept(c) == Some(false))
                .count();
            w.in_flight = busy;
            w.state = if busy > 0 {
                WorkerState::Busy
            } else {
                WorkerState::Idle
            };
            continue;
        }
        match w.pid.and_then(crate::pool::direct::in_accept) {
            Some(true) => {
                w.state = WorkerState::Idle;
                w.in_flight = 0;
            }
            Some(false) => {
                w.state = WorkerState::Busy;
                w.in_flight = 1;
            }
            None => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn worker_ages_are_as_of_now_not_as_of_the_last_publish() {
        let at = tokio::time::Instant::now();
        let worker = crate::pool::state::WorkerStatus {
            key: WorkerKey(0),
            pid: Some(1),
            state: WorkerState::Idle,
            accepting: true,
            served: 0,
            in_flight: 0,
            age: Duration::from_secs(5),
            memory: None,
            recycle: None,
            replacement: None,
            children: Vec::new(),
        };
        let status = PoolStatus {
            workers: vec![worker],
            counters: Default::default(),
            crashes: 0,
            throttled: false,
            stopping: false,
            demand: 0,
            memory_total: None,
        };
        tokio::time::advance(Duration::from_millis(900)).await;
        let now = as_of_now(status, at, &[], &[]);
        assert_eq!(now.workers[0].age, Duration::from_millis(5_900));
    }

    #[tokio::test(start_paused = true)]
    async fn pss_readings_are_reused_for_a_while() {
        let source = StatusSource::new();
        let me = std::process::id();
        // A reading planted now stands in for /proc until it is PSS_CACHE_FOR old.
        source
            .pss_cache
            .lock()
            .unwrap()
            .insert(me, (tokio::time::Instant::now(), 42));
        assert_eq!(source.pss(me), Some(42));
        tokio::time::advance(PSS_CACHE_FOR).await;
        let real = source.pss(me).unwrap();
        assert_ne!(real, 42, "read again once stale");
        assert_eq!(source.pss(me), Some(real), "and reused again");
    }
}
