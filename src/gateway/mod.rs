//! The gateway core shared by every front listener: the router (request → context), the pools
//! of backend servers with their slot tables and idle connections, and `dispatch`, which takes
//! a slot, sends one request to the chosen worker and hands back the response with the slot
//! still held until its body ends.
//!
//! Front listeners only translate their wire format into CGI variables and a body and back;
//! everything about limits, queueing, worker choice and backend errors happens here, the same
//! for HTTP, FastCGI and SCGI fronts.

pub mod script;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use bytes::Bytes;
use tokio::sync::mpsc;

use crate::backend::{
    self, BackendError, BackendRequest, Connections, ExchangeOptions, Protocol, RequestBody,
    ResponseBody, SpoolBudget, SpoolConfig, Timeouts,
};
use crate::config::{Backend, Config, ContextConfig, ListenAddress};
use crate::launchers;
use crate::pool::driver::{Command as DriverCommand, Driver};
use crate::pool::slots::{FailPolicy, Failed, Slot, SlotError, SlotLimits, SlotTable, WorkerId};
use crate::pool::state::{PoolSpec, PoolState};
use crate::process::{Handoff, WorkerSocket, WorkerSpawn};
use crate::protocols::cgi::{CgiContext, CgiError, ScriptMode};
use crate::protocols::cgi_response::CgiResponseHead;
use crate::protocols::Limits;
use crate::status::counters::{RequestStats, RequestTimer};

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
}

impl Pool {
    /// Tells the pool's driver that a request on `worker` failed with `error`, when that
    /// means the worker must go (it ran past `request_timeout`).
    fn report(&self, worker: WorkerId, error: &BackendError) {
        if let (Some(tx), BackendError::RequestTimeout { .. }) = (&self.supervisor, error) {
            let _ = tx.send(DriverCommand::RequestTimedOut(worker));
        }
    }

    /// Takes the worker of `slot` out of rotation after `error`, when the error says the
    /// worker is broken: it could not be reached (refused, reset, timed out), it dropped the
    /// request before answering, it missed its first-byte deadline, or it broke the protocol. A spawned worker leaves rotation at
    /// once and its driver replaces it (kills a refusing one, recycles a suspect one); a
    /// server of a pool of servers counts a failure toward `max_fails` (connect failures and
    /// timeouts only, as nginx counts them by default).
    fn fault(&self, slot: &Slot, error: &BackendError) {
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
        );
        if !refused && !suspect {
            return;
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
            }
            None if refused || matches!(error, BackendError::FirstByteTimeout { .. }) => {
                let server = slot.address();
                match self.slots.fail(worker) {
                    Failed::Down(out) => {
                        self.connections.forget(server);
                        tracing::warn!(pool = %self.name, %server, error = %error, "server down: out of rotation for {out:?}, then probed");
                    }
                    Failed::StillDown(out) => {
                        tracing::info!(pool = %self.name, %server, error = %error, "server still down: out of rotation for another {out:?}");
                    }
                    Failed::Counted | Failed::OutOfRotation => {
                        tracing::info!(pool = %self.name, %server, error = %error, "server failure counted toward max_fails");
                    }
                }
            }
            None => {}
        }
    }

    /// A request on `slot` got its head: a server that was failing is back.
    fn healthy(&self, slot: &Slot) {
        if slot.is_probe() {
            if let Some(down) = self.slots.succeeded(slot.worker()) {
                tracing::info!(pool = %self.name, server = %slot.address(), "server up again after {down:?} out of rotation");
            }
        }
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

/// One context at run time.
#[derive(Debug)]
pub struct Context {
    /// As configured.
    pub config: ContextConfig,
    /// Index of its pool in [`Gateway::pools`].
    pub pool: usize,
    /// Its index in the pool's slot table (for the per-context cap).
    pub slot_context: usize,
    /// How CGI variables are built for it.
    pub cgi: CgiContext,
}

/// Why a request got no backend response.
#[derive(Debug, thiserror::Error)]
pub enum GatewayError {
    /// No context matches the request.
    #[error("no context matches host {host:?} and path {path:?}")]
    NoContext {
        /// The host asked for.
        host: String,
        /// The path asked for.
        path: String,
    },
    /// The CGI variables could not be built from the request.
    #[error("{0}")]
    Cgi(#[from] CgiError),
    /// The script file the request names is not one corral lets a backend run.
    #[error("{0}")]
    Script(#[from] script::ScriptFileError),
    /// No slot could be had (queue full, queue timeout, pool stopping).
    #[error("pool {pool}: {source}")]
    Slot {
        /// The pool.
        pool: Arc<str>,
        /// What happened.
        source: SlotError,
    },
    /// The request body is larger than the context's `max_body`.
    #[error("the request body of {} bytes exceeds max_body of {limit} bytes", .length.map_or_else(|| "more than that".to_owned(), |l| l.to_string()))]
    BodyTooLarge {
        /// Its length, when it was declared.
        length: Option<u64>,
        /// The context's limit.
        limit: u64,
    },
    /// The request body could not be read (or spooled) before the exchange.
    #[error("reading the request body: {0}")]
    Body(BackendError),
    /// The backend exchange failed.
    #[error("pool {pool}: {source}")]
    Backend {
        /// The pool.
        pool: Arc<str>,
        /// What happened.
        source: BackendError,
    },
}

impl GatewayError {
    /// The HTTP status for the client.
    pub fn status(&self) -> u16 {
        match self {
            GatewayError::NoContext { .. } => 404,
            GatewayError::Cgi(e) => cgi_status(e),
            GatewayError::Script(e) => e.status(),
            GatewayError::BodyTooLarge { .. } => 413,
            GatewayError::Slot { .. } => 503,
            GatewayError::Body(source) | GatewayError::Backend { source, .. } => source.status(),
        }
    }

    /// Seconds the client should wait before retrying, for a 503.
    pub fn retry_after(&self) -> Option<u32> {
        match self {
            GatewayError::Slot { .. } => Some(1),
            GatewayError::Backend { source, .. } | GatewayError::Body(source)
                if source.status() == 503 =>
            {
                Some(1)
            }
            _ => None,
        }
    }
}

/// The status for a request whose CGI variables cannot be built: a path that names no
/// allowed script is 404 (php-fpm answers "File not found." the same way); a path that
/// tries to leave the root is 403; anything else the client sent is 400.
fn cgi_status(e: &CgiError) -> u16 {
    match e {
        CgiError::EscapesRoot { .. } | CgiError::OutsideRoot { .. } => 403,
        CgiError::NotAScript { .. }
        | CgiError::NoIndex { .. }
        | CgiError::OutsideMount { .. }
        | CgiError::Hidden { .. } => 404,
        CgiError::InvalidContext(_) => 500,
        CgiError::TooManyVars { .. }
        | CgiError::NameTooLong { .. }
        | CgiError::ValueTooLong { .. } => 431,
        _ => 400,
    }
}

/// A backend's response with the slot it holds until the body ends.
#[derive(Debug)]
pub struct GatewayResponse {
    /// Status, headers and Location semantics.
    pub head: CgiResponseHead,
    /// The body and the slot.
    pub body: GatewayBody,
}

/// A response body holding its slot: the slot is given back when the body ends or is
/// dropped (the client went away, which also aborts the backend request).
#[derive(Debug)]
pub struct GatewayBody {
    body: ResponseBody,
    slot: Slot,
    supervisor: Option<mpsc::UnboundedSender<DriverCommand>>,
    timer: RequestTimer,
}

impl GatewayBody {
    /// Whether every chunk has been handed out and the response ended cleanly (its slot
    /// is then as good as free: dropping the body costs nothing).
    pub fn is_ended(&self) -> bool {
        self.body.is_ended()
    }

    /// The next chunk; `None` at the clean end.
    pub async fn next_chunk(&mut self) -> Option<Result<Bytes, BackendError>> {
        let chunk = self.body.next_chunk().await;
        match &chunk {
            Some(Err(e)) => self.timer.stats().backend_error(e),
            // A reader may stop at the last chunk once `is_ended` says so.
            None => self.timer.end(),
            Some(Ok(_)) if self.body.is_ended() => self.timer.end(),
            Some(Ok(_)) => {}
        }
        if let (Some(Err(BackendError::RequestTimeout { .. })), Some(tx)) =
            (&chunk, &self.supervisor)
        {
            let _ = tx.send(DriverCommand::RequestTimedOut(self.slot.worker()));
        }
        chunk
    }
}

/// Everything the front listeners share.
#[derive(Debug)]
pub struct Gateway {
    /// Pools by index.
    pub pools: Vec<Pool>,
    /// Contexts in configuration order.
    pub contexts: Vec<Context>,
    /// Bounds on what peers may make corral buffer.
    pub limits: Limits,
    /// Where bodies of unknown length are spooled.
    pub spool: SpoolConfig,
    next_request_id: AtomicU64,
    /// php-fpm's status and ping paths per FastCGI listener: (listener, status, ping).
    fpm_paths: Vec<(ListenAddress, Option<String>, Option<String>)>,
    /// What those status answers are made from.
    fpm_status: crate::status::collect::StatusSource,
}

/// What the router looks at.
#[derive(Debug, Clone, Copy)]
pub struct RouteKey<'a> {
    /// The listener the request came in on.
    pub listener: &'a ListenAddress,
    /// The host name, lowercase, without port.
    pub host: &'a str,
    /// The decoded path (no query).
    pub path: &'a str,
}

impl Gateway {
    /// Builds the run-time pools and contexts of `config`, and a driver for each pool whose
    /// workers corral spawns (run each with [`Driver::run`]; until then those pools have no
    /// worker). An `app = ...` pool's launcher is written into the runtime directory here.
    pub fn new(config: &Config) -> Result<(Gateway, Vec<Driver>), String> {
        Gateway::with_worker_nofile(config, None)
    }

    /// Like [`Gateway::new`], with spawned workers given `worker_nofile` as their soft
    /// `RLIMIT_NOFILE`: corral raises its own soft limit at start, and its workers get back
    /// the one corral was started with (programs that still use `select()` break on
    /// descriptors past 1,024); `None` = inherited.
    pub fn with_worker_nofile(
        config: &Config,
        worker_nofile: Option<u64>,
    ) -> Result<(Gateway, Vec<Driver>), String> {
        let mut pools = Vec::new();
        let mut drivers = Vec::new();
        for p in &config.pools {
            let contexts: Vec<Option<usize>> = config
                .contexts
                .iter()
                .filter(|c| c.pool == p.name)
                .map(|c| Some(c.max_conns as usize))
                .collect();
            let slots = SlotTable::new(
                SlotLimits {
                    max_conns: p.max_conns as usize,
                    queue_size: p.queue_size as usize,
                    queue_timeout: p.queue_timeout,
                },
                &contexts,
            );
            let name: Arc<str> = Arc::from(p.name.as_str());
            // A worker never has more requests in flight than its concurrency, so keeping that
            // many idle connections means no request ever has to connect again in a steady
            // state; a fixed smaller bound made every request beyond it open and close a
            // connection (a concurrency-100 run lost half its throughput that way).
            let connections = Connections::new((p.concurrency as usize).max(1));
            let mut status = None;
            let supervisor = match &p.backend {
                Backend::External { servers } => {
                    slots.set_fail_policy(FailPolicy {
                        max_fails: p.max_fails,
                        fail_timeout: p.fail_timeout,
                    });
                    for server in servers {
                        let id = slots.add_worker(p.concurrency as usize, server.clone(), None);
                        slots.set_accepting(id, true);
                    }
                    None
                }
                Backend::Spawned(spawn) => {
                    let socket = WorkerSocket::Unix(config.server.runtime_dir.join("unset.sock"));
                    let mut template = match WorkerSpawn::from_config(p, spawn, socket.clone()) {
                        Some(t) => t,
                        None => {
                            // An app pool: its command is an embedded launcher.
                            let argv =
                                launchers::command(&spawn.program, &config.server.runtime_dir)
                                    .map_err(|e| {
                                        format!(
                                            "pool {}: cannot write the launcher into {}: {e}",
                                            p.name,
                                            config.server.runtime_dir.display()
                                        )
                                    })?
                                    .unwrap_or_default();
                            let mut t =
                                WorkerSpawn::new(&p.name, argv, p.protocol, socket, Handoff::Fd0);
                            t.env = spawn.env.clone();
                            t.cwd = spawn.cwd.clone();
                            t.user = spawn.user.clone();
                            t.group = spawn.group.clone();
                            t
                        }
                    };
                    template.nofile = worker_nofile;
                    let spec = PoolSpec::from_config(p, config.server.kill_timeout)
                        .ok_or_else(|| format!("pool {}: not a spawned pool", p.name))?;
                    let (tx, rx) = mpsc::unbounded_channel();
                    let driver = Driver::new(
                        Arc::clone(&name),
                        PoolState::new(spec, seed(&p.name)),
                        Arc::clone(&slots),
                        connections.clone(),
                        template,
                        config.server.runtime_dir.clone(),
                        p.concurrency as usize,
                        rx,
                    );
                    status = Some(driver.status());
                    drivers.push(driver);
                    Some(tx)
                }
            };
            pools.push(Pool {
                name,
                protocol: p.protocol.into(),
                slots,
                connections,
                timeouts: Timeouts::from_pool(p),
                supervisor,
                requests: RequestStats::new(),
                status,
                retries: retries(&p.backend),
            });
        }
        let mut per_pool = vec![0usize; pools.len()];
        let mut contexts = Vec::new();
        for c in &config.contexts {
            let pool = config
                .pools
                .iter()
                .position(|p| p.name == c.pool)
                .ok_or_else(|| format!("context names unknown pool {}", c.pool))?;
            let slot_context = per_pool.get(pool).copied().unwrap_or(0);
            if let Some(n) = per_pool.get_mut(pool) {
                *n += 1;
            }
            contexts.push(Context {
                cgi: cgi_context(c),
                config: c.clone(),
                pool,
                slot_context,
            });
        }
        let gateway = Gateway {
            pools,
            contexts,
            limits: Limits::DEFAULT,
            // Spool files live in the private runtime directory, not a shared /tmp.
            spool: SpoolConfig {
                dir: config.server.runtime_dir.clone(),
                budget: Arc::new(SpoolBudget::new(config.server.spool_budget)),
                ..SpoolConfig::default()
            },
            next_request_id: AtomicU64::new(1),
            fpm_paths: config
                .listeners
                .iter()
                .filter(|l| l.status_path.is_some() || l.ping_path.is_some())
                .map(|l| (l.bind.address(), l.status_path.clone(), l.ping_path.clone()))
                .collect(),
            fpm_status: crate::status::collect::StatusSource::new(config),
        };
        Ok((gateway, drivers))
    }

    /// The whole CGI answer for a FastCGI request to a listener's php-fpm status or ping path
    /// (matched on SCRIPT_NAME, else DOCUMENT_URI, as php-fpm matches `pm.status_path`):
    /// corral answers those itself, so dashboards and monitoring set up for php-fpm keep
    /// working when corral takes its socket. `None` for every other request.
    pub fn fpm_answer(
        &self,
        listener: &ListenAddress,
        params: &[(Bytes, Bytes)],
    ) -> Option<bytes::BytesMut> {
        if self.fpm_paths.is_empty() {
            return None;
        }
        let (_, status_path, ping_path) = self.fpm_paths.iter().find(|(l, ..)| l == listener)?;
        let get = |name: &[u8]| {
            params
                .iter()
                .find(|(n, _)| n == name)
                .map(|(_, v)| &v[..])
                .filter(|v| !v.is_empty())
        };
        let script = get(b"SCRIPT_NAME").or_else(|| get(b"DOCUMENT_URI"))?;
        let is = |p: &Option<String>| p.as_ref().is_some_and(|p| p.as_bytes() == script);
        let path = if is(ping_path) {
            "/ping"
        } else if is(status_path) {
            "/status"
        } else {
            return None;
        };
        let method = get(b"REQUEST_METHOD")
            .and_then(|m| http::Method::from_bytes(m).ok())
            .unwrap_or(http::Method::GET);
        let query = get(b"QUERY_STRING")
            .map(|q| String::from_utf8_lossy(q).into_owned())
            .unwrap_or_default();
        let response = crate::status::server::answer(self, &self.fpm_status, &method, path, &query);
        let code = response.status();
        let content_type = response
            .headers()
            .get(http::header::CONTENT_TYPE)
            .map(|v| v.as_bytes().to_vec())
            .unwrap_or_else(|| b"text/plain".to_vec());
        let body = response.into_body().into_bytes();
        let mut out = bytes::BytesMut::with_capacity(body.len() + 96);
        out.extend_from_slice(
            format!(
                "Status: {} {}\r\nContent-Type: ",
                code.as_u16(),
                code.canonical_reason().unwrap_or("")
            )
            .as_bytes(),
        );
        out.extend_from_slice(&content_type);
        out.extend_from_slice(b"\r\nCache-Control: no-cache\r\n\r\n");
        if method != http::Method::HEAD {
            out.extend_from_slice(&body);
        }
        Some(out)
    }

    /// The name of context `ctx`'s pool, for errors.
    pub fn pool_name(&self, ctx: usize) -> Arc<str> {
        self.contexts
            .get(ctx)
            .and_then(|c| self.pools.get(c.pool))
            .map_or_else(|| Arc::from("?"), |p| Arc::clone(&p.name))
    }

    /// The backend protocol of context `ctx`'s pool, for errors.
    pub fn pool_protocol(&self, ctx: usize) -> Protocol {
        self.contexts
            .get(ctx)
            .and_then(|c| self.pools.get(c.pool))
            .map_or(Protocol::FastCgi, |p| p.protocol)
    }

    /// Checks, before a body is read, what [`Gateway::dispatch`] would refuse anyway: the
    /// script file of context `ctx` and a declared length over its `max_body`. An upload to a
    /// missing script is then answered 404 without spooling a byte of it.
    pub fn precheck(
        &self,
        ctx: usize,
        params: &[(Bytes, Bytes)],
        body_len: Option<u64>,
    ) -> Result<(), GatewayError> {
        let Some(c) = self.contexts.get(ctx) else {
            return Ok(());
        };
        script::check(&c.cgi, params)?;
        if let Some(length) = body_len.filter(|&l| l > c.config.max_body) {
            return Err(GatewayError::BodyTooLarge {
                length: Some(length),
                limit: c.config.max_body,
            });
        }
        Ok(())
    }

    /// Whether context `ctx` reads whole request bodies before asking a worker.
    pub fn buffers_requests(&self, ctx: usize) -> bool {
        self.contexts
            .get(ctx)
            .is_some_and(|c| c.config.request_buffering)
    }

    /// The spool settings for a chunked body of context `ctx`: at most its `max_body`.
    pub fn spool_for(&self, ctx: usize) -> SpoolConfig {
        let mut spool = self.spool.clone();
        if let Some(c) = self.contexts.get(ctx) {
            spool.max_bytes = spool.max_bytes.min(c.config.max_body);
        }
        spool
    }

    /// A new request id for logs.
    pub fn request_id(&self) -> u64 {
        self.next_request_id.fetch_add(1, Ordering::Relaxed)
    }

    /// The context for a request: among those whose listener, host, prefix and extension
    /// match, the most specific (a listener named, then an exact host over a wildcard, then
    /// the longest prefix, then an extension); the first in the file on a tie.
    pub fn route(&self, key: RouteKey<'_>) -> Option<usize> {
        let mut best: Option<(usize, (bool, u8, usize, bool))> = None;
        for (i, ctx) in self.contexts.iter().enumerate() {
            let c = &ctx.config;
            if c.listen.as_ref().is_some_and(|l| l != key.listener) {
                continue;
            }
            let host_rank = match &c.host {
                None => 0,
                Some(h) if h == key.host => 2,
                Some(h) => match h.strip_prefix("*.") {
                    Some(suffix)
                        if key.host.len() > suffix.len()
                            && key.host.ends_with(suffix)
                            && key.host.as_bytes()[key.host.len() - suffix.len() - 1] == b'.' =>
                    {
                        1
                    }
                    _ => continue,
                },
            };
            if !prefix_matches(&c.prefix, key.path) {
                continue;
            }
            if let Some(ext) = &c.extension {
                if !has_extension(key.path, ext, &c.index) {
                    continue;
                }
            }
            let rank = (
                c.listen.is_some(),
                host_rank,
                c.prefix.len(),
                c.extension.is_some(),
            );
            if best.as_ref().is_none_or(|(_, r)| rank > *r) {
                best = Some((i, rank));
            }
        }
        best.map(|(i, _)| i)
    }

    /// Sends a request of context `ctx` to a worker of its pool: takes a slot (waiting in the
    /// queue if needed), takes an idle connection or makes one, and returns once the response
    /// head has arrived.
    pub async fn dispatch(
        &self,
        ctx: usize,
        params: Vec<(Bytes, Bytes)>,
        body: RequestBody,
        request_id: u64,
    ) -> Result<GatewayResponse, GatewayError> {
        let Some(context) = self.contexts.get(ctx) else {
            return Err(GatewayError::NoContext {
                host: String::new(),
                path: String::new(),
            });
        };
        let Some(pool) = self.pools.get(context.pool) else {
            return Err(GatewayError::NoContext {
                host: String::new(),
                path: String::new(),
            });
        };
        // Before a slot is taken: a refused script or body never queues or touches a worker.
        script::check(&context.cgi, &params)?;
        if let Some(length) = body.len().filter(|&l| l > context.config.max_body) {
            return Err(GatewayError::BodyTooLarge {
                length: Some(length),
                limit: context.config.max_body,
            });
        }
        // A body of unknown length (a FastCGI or SCGI front that sent no CONTENT_LENGTH) is
        // held to max_body as it streams.
        let body = body.limited(context.config.max_body);
        let mut timer = RequestTimer::start(&pool.requests);
        let slot = pool
            .requests
            .acquire(&pool.slots, context.slot_context)
            .await
            .map_err(|source| GatewayError::Slot {
                pool: Arc::clone(&pool.name),
                source,
            })?;
        timer.slot();
        let backend_err = |source| {
            pool.requests.backend_error(&source);
            GatewayError::Backend {
                pool: Arc::clone(&pool.name),
                source,
            }
        };
        // A connection that cannot be made means nothing of the request reached the worker:
        // the request moves to another worker at once (a worker killed under load would
        // otherwise fail every request routed to it until its exit is noticed). Once a
        // byte may have been sent, it is never sent again.
        let mut slot = slot;
        let mut tries = 0;
        let conn = loop {
            let address = slot.address();
            let connected = match pool.protocol {
                // SCGI is one connection per request by definition.
                Protocol::Scgi => {
                    backend::BackendConnection::connect(address, pool.timeouts.connect).await
                }
                _ => pool.connections.get(address, pool.timeouts.connect).await,
            };
            match connected {
                Ok(conn) => break conn,
                Err(e) => {
                    pool.fault(&slot, &e);
                    if tries >= pool.retries {
                        return Err(backend_err(e));
                    }
                    tries += 1;
                    tracing::debug!(pool = %pool.name, request_id, error = %e, "request not sent; trying another worker");
                    slot = pool
                        .slots
                        .reroute(slot)
                        .await
                        .map_err(|source| GatewayError::Slot {
                            pool: Arc::clone(&pool.name),
                            source,
                        })?;
                }
            }
        };
        timer.connected();
        let options = ExchangeOptions {
            pool: Arc::clone(&pool.name),
            request_id,
            timeouts: pool.timeouts,
            limits: self.limits.clone(),
            spool: self.spool_for(ctx),
            stderr: None,
        };
        let request = BackendRequest { params, body };
        let response = match backend::send(pool.protocol, conn, request, &options).await {
            Ok(r) => r,
            Err(e) => {
                pool.report(slot.worker(), &e);
                pool.fault(&slot, &e);
                return Err(backend_err(e));
            }
        };
        pool.healthy(&slot);
        timer.head();
        if response.body.is_ended() {
            // An empty body: no chunk will be asked for.
            timer.end();
        }
        Ok(GatewayResponse {
            head: response.head,
            body: GatewayBody {
                body: response.body,
                slot,
                supervisor: pool.supervisor.clone(),
                timer,
            },
        })
    }
}

/// Whether `path` lies under `prefix` on a segment boundary (`/app` matches `/app` and
/// `/app/x`, not `/apple`).
fn prefix_matches(prefix: &str, path: &str) -> bool {
    if prefix == "/" || prefix.is_empty() {
        return true;
    }
    let prefix = prefix.trim_end_matches('/');
    path.strip_prefix(prefix)
        .is_some_and(|rest| rest.is_empty() || rest.starts_with('/'))
}

/// Whether some segment of `path` ends with `.ext`, or `path` names a directory whose index
/// file has that extension (so `/` reaches the PHP context through `index.php`).
fn has_extension(path: &str, ext: &str, index: &[String]) -> bool {
    let dotted = |s: &str| {
        s.len() > ext.len()
            && s.ends_with(ext)
            && s.as_bytes().get(s.len() - ext.len() - 1) == Some(&b'.')
    };
    if path.split('/').any(dotted) {
        return true;
    }
    path.ends_with('/') && index.iter().any(|i| dotted(i))
}

/// The CGI settings of a context: a document root means script files (PHP style, the
/// context's extension or `php`), no root means an application mounted at the prefix.
fn cgi_context(c: &ContextConfig) -> CgiContext {
    let mode = match &c.root {
        Some(_) => ScriptMode::Files {
            extensions: vec![c
                .extension
                .clone()
                .unwrap_or_else(|| "php".to_owned())
                .into_bytes()],
            index: c.index.iter().map(|i| i.clone().into_bytes()).collect(),
        },
        None => ScriptMode::App {
            mount: c.prefix.trim_end_matches('/').as_bytes().to_vec(),
        },
    };
    CgiContext {
        // An application context has no document root of its own; DOCUMENT_ROOT is `/` so
        // that frameworks reading it get an absolute path.
        document_root: c.root.as_ref().map_or_else(
            || b"/".to_vec(),
            |r| r.as_os_str().as_encoded_bytes().to_vec(),
        ),
        mode,
        server_software: Bytes::from(concat!("corral/", env!("CARGO_PKG_VERSION"))),
        extra_env: c
            .params
            .iter()
            .map(|(k, v)| (Bytes::from(k.clone()), Bytes::from(v.clone())))
            .collect(),
        allow_php_ini_params: c.allow_php_value,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefixes_match_on_segment_boundaries() {
        assert!(prefix_matches("/", "/anything"));
        assert!(prefix_matches("/app", "/app"));
        assert!(prefix_matches("/app/", "/app/x"));
        assert!(!prefix_matches("/app", "/apple"));
    }

    #[test]
    fn extensions_match_a_segment_or_the_index() {
        let index = vec!["index.php".to_owned()];
        assert!(has_extension("/a/b.php", "php", &index));
        assert!(has_extension("/b.php/extra/info", "php", &index));
        assert!(has_extension("/dir/", "php", &index));
        assert!(!has_extension("/b.phps", "php", &index));
        assert!(!has_extension("/php", "php", &index));
        assert!(!has_extension("/dir/", "php", &[]));
    }

    fn gateway(toml: &str) -> Gateway {
        let config = crate::config::parse(toml, "test.toml").unwrap();
        Gateway::new(&config).unwrap().0
    }

    #[test]
    fn the_most_specific_context_wins() {
        let g = gateway(
            r#"
            [[listen]]
            address = "127.0.0.1:8080"
            protocol = "http"
            [pools.php]
            servers = ["unix:/tmp/php.sock"]
            [pools.app]
            protocol = "scgi"
            servers = ["unix:/tmp/app.sock"]
            [[contexts]]
            prefix = "/"
            pool = "app"
            [[contexts]]
            prefix = "/"
            extension = "php"
            root = "/var/www"
            pool = "php"
            [[contexts]]
            prefix = "/api"
            pool = "app"
            host = "*.example.com"
            "#,
        );
        let l: ListenAddress = ListenAddress::parse("127.0.0.1:8080").unwrap();
        let route = |host, path| {
            g.route(RouteKey {
                listener: &l,
                host,
                path,
            })
        };
        assert_eq!(route("x", "/index.php"), Some(1));
        assert_eq!(route("x", "/"), Some(1), "the index file is PHP");
        assert_eq!(route("x", "/static/a.css"), Some(0));
        assert_eq!(route("api.example.com", "/api/v1"), Some(2));
        assert_eq!(route("example.com", "/api/v1"), Some(0), "no subdomain");
    }
}
