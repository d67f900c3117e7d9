//! The gateway core shared by every front listener: the generation being served (a router
//! and a pool registry built from one configuration, swapped whole on reload), and
//! `dispatch`, which takes a slot, sends one request to the chosen worker and hands back the
//! response with the slot still held until its body ends.
//!
//! Front listeners only translate their wire format into CGI variables and a body and back;
//! everything about limits, queueing, worker choice and backend errors happens here, the same
//! for HTTP, FastCGI and SCGI fronts.

pub mod registry;
pub mod script;
mod slow_stacks;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use bytes::Bytes;
use tokio::sync::mpsc;

use crate::access::{AccessLog, LogSettings, Record};
use crate::backend::{
    self, BackendError, ExchangeOptions, RequestBody, ResponseBody, SpoolBudget, SpoolConfig,
};
use crate::config::{Config, ListenAddress};
use crate::error::StartupError;
use crate::pool::driver::Command as DriverCommand;
use crate::pool::slots::{Slot, SlotError};
use crate::protocols::cgi::{CgiError, CgiParams};
use crate::protocols::cgi_response::CgiResponseHead;
use crate::protocols::Limits;
pub use crate::router::RouteKey;
use crate::router::{Context, Router};
use crate::status::counters::RequestTimer;

pub use registry::{BuildSettings, Built, NewPool, Pool, PoolRegistry};

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

    /// Logs a request that got no backend response, the same on every front: server-side
    /// failures at warn, refusals at info.
    pub fn log(&self, request_id: u64) {
        let status = self.status();
        if status >= 500 {
            tracing::warn!(request_id, status, error = %crate::logs::clean(self), "request failed");
        } else {
            tracing::info!(request_id, status, error = %crate::logs::clean(self), "request refused");
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
    /// The request's access-log line to finish, when a request log is on.
    log: Option<Box<Logged>>,
}

/// A request's log record with where it goes.
#[derive(Debug)]
struct Logged {
    record: Record,
    settings: Arc<LogSettings>,
    writer: AccessLog,
    /// Asks the worker for its stacks if the request passes `slow_threshold` (app pools
    /// with a slow log: `slow_stacks.rs`).
    slow: Option<slow_stacks::SlowWatch>,
}

impl Logged {
    /// Fills in the timings and writes the line (once the stacks asked for are in).
    fn finish(mut self: Box<Self>, timer: &RequestTimer) {
        let [queue, connect, head, total] = timer.split();
        self.record.queue = queue;
        self.record.connect = connect;
        self.record.head = head;
        self.record.total = total;
        match self.slow.take() {
            Some(watch) => watch.finish(self),
            None => self.write(),
        }
    }

    fn write(&self) {
        self.writer.write(&self.settings, &self.record);
    }
}

impl Drop for GatewayBody {
    fn drop(&mut self) {
        // Dropped before its clean end: the client went away, or the backend broke off.
        if let Some(mut logged) = self.log.take() {
            logged.record.aborted = !self.body.is_ended();
            logged.finish(&self.timer);
        }
    }
}

impl GatewayBody {
    /// Whether every chunk has been handed out and the response ended cleanly (its slot
    /// is then as good as free: dropping the body costs nothing).
    pub fn is_ended(&self) -> bool {
        self.body.is_ended()
    }

    /// The next chunk; `None` at the clean end.
    pub async fn next_chunk(&mut self) -> Option<Result<Bytes, BackendError>> {
        std::future::poll_fn(|cx| self.poll_chunk(cx)).await
    }

    /// [`next_chunk`](Self::next_chunk) as a poll function (cancel-safe), for a front that
    /// pulls the body from its own `poll` without a future per chunk.
    pub fn poll_chunk(
        &mut self,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<Bytes, BackendError>>> {
        let chunk = std::task::ready!(self.body.poll_chunk(cx));
        let ended = match &chunk {
            Some(Err(e)) => {
                self.timer.stats().backend_error(e);
                false
            }
            // A reader may stop at the last chunk once `is_ended` says so.
            None => true,
            Some(Ok(_)) => self.body.is_ended(),
        };
        if let (Some(logged), Some(Ok(data))) = (self.log.as_mut(), &chunk) {
            logged.record.bytes += data.len() as u64;
        }
        if ended {
            self.timer.end();
            if let Some(logged) = self.log.take() {
                logged.finish(&self.timer);
            }
        }
        if let (Some(Err(BackendError::RequestTimeout { .. })), Some(tx)) =
            (&chunk, &self.supervisor)
        {
            let _ = tx.send(DriverCommand::RequestTimedOut(self.slot.worker()));
        }
        std::task::Poll::Ready(chunk)
    }
}

/// One configuration at run time: its router and its pools, built together and replaced
/// together on reload, so a request is never routed by one configuration and served by
/// another (ARCHITECTURE.md, "Generations and reload").
#[derive(Debug)]
pub struct Generation {
    /// Counts from 0 (the configuration corral started with), one more per reload.
    pub number: u64,
    /// Request → context.
    pub router: Router,
    /// The pools, by the [`PoolId`]s the router hands out.
    pub pools: PoolRegistry,
    /// php-fpm's status and ping paths per FastCGI listener: (listener, status, ping).
    fpm_paths: Vec<(ListenAddress, Option<String>, Option<String>)>,
    /// The request logs' settings, when one is on.
    pub logs: Option<Arc<LogSettings>>,
}

impl Generation {
    /// The generation `number` of `config`, with the pools already built.
    pub fn new(number: u64, config: &Config, router: Router, pools: PoolRegistry) -> Generation {
        Generation {
            number,
            router,
            pools,
            logs: Some(LogSettings::of(&config.server))
                .filter(LogSettings::enabled)
                .map(Arc::new),
            fpm_paths: config
                .listeners
                .iter()
                .filter(|l| l.status_path.is_some() || l.ping_path.is_some())
                .map(|l| (l.bind.address(), l.status_path.clone(), l.ping_path.clone()))
                .collect(),
        }
    }
}

/// A request routed: its context and the pool that serves it, both of one generation. While
/// it lives the pool counts it as routed (a pool retired by a reload waits for it).
#[derive(Debug)]
pub struct Routed {
    /// The context.
    pub context: Arc<Context>,
    /// Its pool.
    pub pool: Arc<Pool>,
    /// The generation that routed it.
    pub generation: u64,
    /// The generation's request-log settings, when a request log is on.
    logs: Option<Arc<LogSettings>>,
}

impl Routed {
    fn new(context: Arc<Context>, pool: Arc<Pool>, generation: &Generation) -> Routed {
        pool.routed.fetch_add(1, Ordering::AcqRel);
        Routed {
            context,
            pool,
            generation: generation.number,
            logs: generation.logs.clone(),
        }
    }
}

impl Drop for Routed {
    fn drop(&mut self) {
        self.pool.routed.fetch_sub(1, Ordering::AcqRel);
    }
}

impl Routed {
    /// Checks, before a body is read, what [`Gateway::dispatch`] would refuse anyway: the
    /// script file and a declared length over the context's `max_body`. An upload to a
    /// missing script is then answered 404 without spooling a byte of it.
    pub fn precheck(&self, params: &CgiParams, body_len: Option<u64>) -> Result<(), GatewayError> {
        script::check(&self.context.cgi, params)?;
        match body_len {
            Some(length) if length > self.context.config.max_body => {
                Err(GatewayError::BodyTooLarge {
                    length: Some(length),
                    limit: self.context.config.max_body,
                })
            }
            _ => Ok(()),
        }
    }

    /// Whether the context reads whole request bodies before asking a worker.
    pub fn buffers_requests(&self) -> bool {
        self.context.config.request_buffering
    }

    /// A backend failure of this request's pool.
    pub fn backend_error(&self, source: BackendError) -> GatewayError {
        GatewayError::Backend {
            pool: Arc::clone(&self.pool.name),
            source,
        }
    }
}

/// The generation being served, readable on every request without a lock: each thread keeps
/// the one it last used with its epoch, and takes the lock only when the epoch has moved
/// (once per thread per reload).
#[derive(Debug)]
struct Live {
    /// Tells this cell's generations apart from another gateway's in the thread caches.
    id: u64,
    epoch: AtomicU64,
    current: std::sync::Mutex<Arc<Generation>>,
}

/// Gives every [`Live`] its own id.
static NEXT_LIVE: AtomicU64 = AtomicU64::new(0);

thread_local! {
    /// (live id, epoch, generation) last read by this thread.
    static CURRENT: std::cell::RefCell<Option<(u64, u64, Arc<Generation>)>> =
        const { std::cell::RefCell::new(None) };
}

impl Live {
    fn new(generation: Generation) -> Live {
        Live {
            id: NEXT_LIVE.fetch_add(1, Ordering::Relaxed),
            epoch: AtomicU64::new(0),
            current: std::sync::Mutex::new(Arc::new(generation)),
        }
    }

    fn locked(&self) -> Arc<Generation> {
        Arc::clone(&self.current.lock().unwrap_or_else(|p| p.into_inner()))
    }

    fn get(&self) -> Arc<Generation> {
        let epoch = self.epoch.load(Ordering::Acquire);
        CURRENT.with(|cell| {
            let Ok(mut cached) = cell.try_borrow_mut() else {
                return self.locked();
            };
            if let Some((id, e, g)) = cached.as_ref() {
                if *id == self.id && *e == epoch {
                    return Arc::clone(g);
                }
            }
            let g = self.locked();
            *cached = Some((self.id, epoch, Arc::clone(&g)));
            g
        })
    }

    fn set(&self, generation: Arc<Generation>) -> Arc<Generation> {
        let mut current = self.current.lock().unwrap_or_else(|p| p.into_inner());
        let old = std::mem::replace(&mut *current, generation);
        self.epoch.fetch_add(1, Ordering::AcqRel);
        old
    }
}

/// Everything the front listeners share: the generation being served, and what outlives a
/// reload (request ids, limits, the spool budget, the status page's memory cache).
#[derive(Debug)]
pub struct Gateway {
    live: Live,
    /// Bounds on what peers may make corral buffer.
    pub limits: Limits,
    /// Where bodies are spooled, and the budget all of them share.
    pub spool: SpoolConfig,
    next_request_id: AtomicU64,
    /// What php-fpm-style status answers are made from.
    fpm_status: crate::status::collect::StatusSource,
    /// The request logs' writer.
    pub access: AccessLog,
    /// What the latest reload came to (`src/deploy/mod.rs`), for the status page.
    pub reloads: crate::deploy::LastReload,
}

impl Gateway {
    /// A gateway serving `generation`, with the server-wide settings of `config`.
    pub fn new(config: &Config, generation: Generation) -> Gateway {
        Gateway {
            live: Live::new(generation),
            limits: Limits::DEFAULT,
            // Spool files live in the private runtime directory, not a shared /tmp.
            spool: SpoolConfig {
                dir: config.server.runtime_dir.as_path().into(),
                budget: Arc::new(SpoolBudget::new(config.server.spool_budget)),
                ..SpoolConfig::default()
            },
            next_request_id: AtomicU64::new(1),
            fpm_status: crate::status::collect::StatusSource::new(),
            access: AccessLog::start(LogSettings::of(&config.server)),
            reloads: crate::deploy::LastReload::default(),
        }
    }

    /// Builds the first generation of `config` and a gateway serving it, with the drivers of
    /// its spawned pools to run ([`Pool::start`]; until then those pools have no worker).
    /// Writes nothing: `settings.launchers` must name the launcher of every `app` pool.
    pub fn build(
        config: &Config,
        settings: &BuildSettings,
    ) -> Result<(Gateway, Vec<NewPool>), StartupError> {
        let router = Router::new(config);
        let built = PoolRegistry::build(config, &router, None, settings)?;
        let generation = Generation::new(settings.generation, config, router, built.registry);
        Ok((Gateway::new(config, generation), built.drivers))
    }

    /// The generation serving now.
    pub fn current(&self) -> Arc<Generation> {
        self.live.get()
    }

    /// Serves `generation` from now on; returns the one it replaces. Requests already routed
    /// finish on the pools they were routed to.
    pub fn replace(&self, generation: Generation) -> Arc<Generation> {
        self.live.set(Arc::new(generation))
    }

    /// A new request id for logs.
    pub fn request_id(&self) -> u64 {
        self.next_request_id.fetch_add(1, Ordering::Relaxed)
    }

    /// The spool settings for a body of `routed`'s context: at most its `max_body`.
    pub fn spool_for(&self, routed: &Routed) -> SpoolConfig {
        let mut spool = self.spool.clone();
        spool.max_bytes = spool.max_bytes.min(routed.context.config.max_body);
        spool
    }

    /// Routes a request of the current generation; no matching context is
    /// [`GatewayError::NoContext`].
    pub fn route(&self, key: RouteKey<'_>) -> Result<Routed, GatewayError> {
        let generation = self.current();
        generation
            .router
            .route(key)
            .and_then(|context| {
                let pool = generation.pools.get(context.pool)?;
                Some(Routed::new(
                    Arc::clone(context),
                    Arc::clone(pool),
                    &generation,
                ))
            })
            .ok_or_else(|| GatewayError::NoContext {
                host: key.host.to_owned(),
                path: key.path.to_owned(),
            })
    }

    /// The whole CGI answer for a FastCGI request to a listener's php-fpm status or ping path
    /// (matched on SCRIPT_NAME, else DOCUMENT_URI, as php-fpm matches `pm.status_path`):
    /// corral answers those itself, so dashboards and monitoring set up for php-fpm keep
    /// working when corral takes its socket. `None` for every other request.
    pub fn fpm_answer(
        &self,
        listener: &ListenAddress,
        params: &crate::protocols::cgi::FrontParams,
    ) -> Option<bytes::BytesMut> {
        use crate::protocols::cgi::Known;
        let generation = self.current();
        let (_, status_path, ping_path) =
            generation.fpm_paths.iter().find(|(l, ..)| l == listener)?;
        let get = |k: Known| params.first(k).filter(|v| !v.is_empty());
        let script = get(Known::ScriptName).or_else(|| get(Known::DocumentUri))?;
        let is = |p: &Option<String>| p.as_ref().is_some_and(|p| p.as_bytes() == script);
        let path = if is(ping_path) {
            "/ping"
        } else if is(status_path) {
            "/status"
        } else {
            return None;
        };
        let method = get(Known::RequestMethod)
            .and_then(|m| http::Method::from_bytes(m).ok())
            .unwrap_or(http::Method::GET);
        let query = get(Known::QueryString)
            .map(|q| String::from_utf8_lossy(q).into_owned())
            .unwrap_or_default();
        let response = crate::status::server::answer(self, &self.fpm_status, &method, path, &query);
        Some(crate::status::server::cgi_answer(response, &method))
    }

    /// Sends a request routed to `routed` to a worker of its pool: takes a slot (waiting in
    /// the queue if needed), takes an idle connection or makes one, and returns once the
    /// response head has arrived.
    pub async fn dispatch(
        &self,
        routed: &Routed,
        params: CgiParams,
        body: RequestBody,
        request_id: u64,
    ) -> Result<GatewayResponse, GatewayError> {
        let (context, pool) = (&*routed.context, &routed.pool);
        let mut timer = RequestTimer::start(&pool.requests);
        let log = routed.logs.as_ref().map(|settings| {
            let slow =
                settings
                    .slow_threshold()
                    .zip(pool.stacks.as_ref())
                    .map(|(threshold, tail)| {
                        slow_stacks::SlowWatch::arm(
                            Arc::clone(tail),
                            tokio::time::Instant::now(),
                            threshold,
                        )
                    });
            Box::new(Logged {
                record: Record::from_params(
                    &params,
                    Arc::clone(&pool.name),
                    routed.generation,
                    request_id,
                ),
                settings: Arc::clone(settings),
                writer: self.access.clone(),
                slow,
            })
        });
        let mut pid = None;
        // Before a slot is taken: a refused script or body never queues or touches a worker.
        let checked = script::check(&context.cgi, &params)
            .map_err(GatewayError::from)
            .and_then(|()| match body.len() {
                Some(length) if length > context.config.max_body => {
                    Err(GatewayError::BodyTooLarge {
                        length: Some(length),
                        limit: context.config.max_body,
                    })
                }
                // A body of unknown length (a FastCGI or SCGI front that sent no
                // CONTENT_LENGTH) is held to max_body as it streams.
                _ => Ok(body.limited(context.config.max_body)),
            });
        let sent = match checked {
            Ok(body) => {
                let watch = log.as_ref().and_then(|l| l.slow.as_ref());
                let pid = (&mut pid, watch);
                self.exchange(routed, params, body, request_id, &mut timer, pid)
                    .await
            }
            Err(e) => Err(e),
        };
        match sent {
            Ok((head, body, slot)) => {
                let log = log.map(|mut l| {
                    l.record.status = head.status_code();
                    l.record.worker_pid = pid;
                    l
                });
                let mut body = GatewayBody {
                    body,
                    slot,
                    supervisor: pool.supervisor.clone(),
                    timer,
                    log,
                };
                if body.body.is_ended() {
                    // An empty body: no chunk will be asked for.
                    body.timer.end();
                    if let Some(logged) = body.log.take() {
                        logged.finish(&body.timer);
                    }
                }
                Ok(GatewayResponse { head, body })
            }
            Err(e) => {
                if let Some(mut logged) = log {
                    logged.record.status = e.status();
                    logged.record.worker_pid = pid;
                    logged.finish(&timer);
                }
                Err(e)
            }
        }
    }

    /// The part of [`Gateway::dispatch`] between asking for a slot and the response head:
    /// `pid` learns the worker's process id when a request log wants it (and so does the
    /// request's slow-threshold watch, if it has one).
    async fn exchange(
        &self,
        routed: &Routed,
        params: CgiParams,
        body: RequestBody,
        request_id: u64,
        timer: &mut RequestTimer,
        (pid, watch): (&mut Option<u32>, Option<&slow_stacks::SlowWatch>),
    ) -> Result<(CgiResponseHead, ResponseBody, Slot), GatewayError> {
        let pool = &routed.pool;
        // The wait is timed from the timer's start: one clock reading fewer per request.
        let (slot, had) = pool
            .requests
            .acquire_since(&pool.slots, routed.context.slot_context, timer.asked())
            .await
            .map_err(|source| GatewayError::Slot {
                pool: Arc::clone(&pool.name),
                source,
            })?;
        timer.slot_at(had);
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
        // byte may have been sent, it is sent again only in the one case below.
        let options = ExchangeOptions {
            pool: Arc::clone(&pool.name),
            request_id,
            timeouts: pool.timeouts,
            limits: self.limits.clone(),
            spool: self.spool_for(routed),
            stderr: None,
        };
        let mut slot = slot;
        let mut tries = 0;
        let mut body = body;
        // Whether the request was sent again after a kept connection failed; the next
        // connection is then a new one (`fresh`), unless the worker changed.
        let mut replayed = false;
        let mut fresh = false;
        loop {
            let conn = loop {
                let address = slot.address();
                let connected = match pool.protocol {
                    // SCGI is one connection per request by definition.
                    backend::Protocol::Scgi => {
                        backend::BackendConnection::connect(address, pool.timeouts.connect).await
                    }
                    _ if fresh => pool.connections.fresh(address, pool.timeouts.connect).await,
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
                        fresh = false;
                        tracing::debug!(pool = %pool.name, request_id, error = %e, "request not sent; trying another worker");
                        slot = pool.slots.reroute(slot).await.map_err(|source| {
                            GatewayError::Slot {
                                pool: Arc::clone(&pool.name),
                                source,
                            }
                        })?;
                    }
                }
            };
            if !replayed {
                timer.connected();
            }
            if routed.logs.is_some() {
                *pid = slot.pid();
                if let Some(watch) = watch {
                    watch.serving(*pid);
                }
            }
            // A kept connection may have been closed by the worker while idle, just as the
            // request went out (a worker exiting after its last request): keep what it takes
            // to send the request once more. An in-memory body is shared, not copied.
            let replay = if replayed || conn.requests_served() == 0 {
                None
            } else {
                body.replayable()
            };
            let error =
                match backend::send_params(pool.protocol, conn, &params, body, &options).await {
                    Ok(response) => {
                        pool.healthy(&slot);
                        timer.head();
                        return Ok((response.head, response.body, slot));
                    }
                    Err(e) => e,
                };
            // The kept connection failed before one response byte (ARCHITECTURE.md invariant
            // 6): the request goes out once more on a new connection when its body can be
            // replayed and it cannot have run: the first write met a closed socket. A close
            // or reset after bytes went out may follow a worker that began to run it
            // (decision 8: a 502). Either way `fault` asks whether the worker died and takes
            // a dying one out of rotation: a resent request then goes to another worker.
            let again = replay.filter(|_| error.request_left_unread());
            let out = pool.fault(&slot, &error);
            let Some(again) = again else {
                pool.report(slot.worker(), &error);
                return Err(backend_err(error));
            };
            tracing::debug!(pool = %pool.name, request_id, error = %error, worker_gone = out, "kept connection lost before the answer; sending the request again");
            body = again;
            replayed = true;
            if out {
                fresh = false;
                slot = pool
                    .slots
                    .reroute(slot)
                    .await
                    .map_err(|source| GatewayError::Slot {
                        pool: Arc::clone(&pool.name),
                        source,
                    })?;
            } else {
                fresh = true;
            }
        }
    }
}
