//! The backend side of the gateway: one request/response exchange over one backend
//! connection, in FastCGI, SCGI or LSAPI, streaming both bodies with bounded buffers.
//!
//! A front hands over a [`BackendRequest`] (CGI parameters and a [`RequestBody`]) and gets a
//! [`BackendResponse`]: the parsed CGI head (status, headers, Location semantics through
//! [`CgiResponseHead::kind`]) and a [`ResponseBody`] to pull chunks from. The request body is
//! written while the response is read, so neither side can deadlock the other, and only one
//! chunk of each direction is held at a time. The backend's stderr is logged with the pool
//! name and request id. FastCGI and LSAPI connections go back to a [`Connections`] stack after
//! a clean exchange; any error drops the connection.
//!
//! Files: `body` (request body sources), `connection` (connections and the idle stack),
//! `exchange` (the I/O driver, shared by the three protocols; `exchange/body`: the
//! response body; `exchange/end`: the connection kept or closed at the end, and the end
//! record awaited after a body dropped at its Content-Length; `exchange/spare`: spent
//! exchanges renewed in place; `exchange/stderr`: the
//! backend's stderr logged within a rate bound),
//! `fastcgi`, `scgi`, `lsapi` (one codec each), `spool` (bodies of unknown length), `error`,
//! `resolve` (DNS names in `servers`, followed while corral runs).

pub mod body;
pub mod connection;
mod error;
mod exchange;
pub mod fastcgi;
pub mod lsapi;
pub mod resolve;
pub mod scgi;
mod spool;

use std::fmt;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;

use crate::config::{BackendProtocol, PoolConfig};
use crate::protocols::cgi::CgiParams;
use crate::protocols::cgi_response::CgiResponseHead;
use crate::protocols::Limits;

pub use body::{
    BodyClosed, BodyDeadline, BodyError, BodyOverLimit, BodySender, BodySource, BodyTimeout,
    RequestBody,
};
pub use connection::{BackendConnection, Connections, Reuse};
pub use error::{BackendError, Origin};
pub use exchange::ResponseBody;
pub use spool::{buffer_body, spool_body};

/// The protocol spoken to a backend.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Protocol {
    /// FastCGI 1.0.
    FastCgi,
    /// SCGI.
    Scgi,
    /// LSAPI.
    Lsapi,
}

impl fmt::Display for Protocol {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Protocol::FastCgi => "FastCGI",
            Protocol::Scgi => "SCGI",
            Protocol::Lsapi => "LSAPI",
        })
    }
}

impl From<BackendProtocol> for Protocol {
    fn from(p: BackendProtocol) -> Protocol {
        match p {
            BackendProtocol::Fastcgi => Protocol::FastCgi,
            BackendProtocol::Scgi => Protocol::Scgi,
            BackendProtocol::Lsapi => Protocol::Lsapi,
        }
    }
}

/// The three bounds on an exchange's time (ARCHITECTURE.md decision 6).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timeouts {
    /// Longest connect.
    pub connect: Duration,
    /// Longest wait for the first response byte, counted from the moment the whole request
    /// (body included) has been written, so a slow upload does not count against it.
    pub first_byte: Duration,
    /// Longest whole exchange, from the start of the request to the end of the response.
    pub request: Duration,
}

impl Timeouts {
    /// The timeouts a pool is configured with.
    pub fn from_pool(pool: &PoolConfig) -> Timeouts {
        Timeouts {
            connect: pool.connect_timeout,
            first_byte: pool.first_byte_timeout,
            request: pool.request_timeout,
        }
    }
}

impl Default for Timeouts {
    /// The configuration defaults: 5 s connect, 60 s first byte, 300 s request.
    fn default() -> Timeouts {
        Timeouts {
            connect: Duration::from_secs(5),
            first_byte: Duration::from_secs(60),
            request: Duration::from_secs(300),
        }
    }
}

/// Where and how much of a body of unknown length may be spooled to learn its length (SCGI
/// and LSAPI need it up front).
#[derive(Debug, Clone)]
pub struct SpoolConfig {
    /// Directory of the temporary files (the runtime or temp dir); each is unlinked at once.
    /// Shared, so that the copy each request takes costs no allocation.
    pub dir: Arc<Path>,
    /// Largest body spooled; a longer one fails with 413.
    pub max_bytes: u64,
    /// Bodies up to this size stay in memory instead of a file.
    pub memory_bytes: usize,
    /// What all spool files together may hold, shared by every request.
    pub budget: Arc<SpoolBudget>,
}

impl Default for SpoolConfig {
    /// The system temp dir, at most 1 GiB, 64 KiB in memory, a 4 GiB budget.
    fn default() -> SpoolConfig {
        SpoolConfig {
            dir: std::env::temp_dir().into(),
            max_bytes: 1 << 30,
            memory_bytes: 64 * 1024,
            budget: Arc::new(SpoolBudget::new(crate::config::DEFAULT_SPOOL_BUDGET)),
        }
    }
}

/// The bytes all spool files may hold together: a flood of large uploads gets 503s instead
/// of filling the disk. Bytes are reserved as they are written and given back when the
/// spooled body is dropped.
#[derive(Debug)]
pub struct SpoolBudget {
    limit: u64,
    used: std::sync::atomic::AtomicU64,
}

impl SpoolBudget {
    /// A budget of `limit` bytes.
    pub fn new(limit: u64) -> SpoolBudget {
        SpoolBudget {
            limit,
            used: std::sync::atomic::AtomicU64::new(0),
        }
    }

    /// Bytes held now.
    pub fn used(&self) -> u64 {
        self.used.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Takes `n` more bytes, or none when that would pass the limit.
    fn reserve(&self, n: u64) -> bool {
        use std::sync::atomic::Ordering;
        let before = self.used.fetch_add(n, Ordering::AcqRel);
        if before.saturating_add(n) > self.limit {
            self.used.fetch_sub(n, Ordering::AcqRel);
            return false;
        }
        true
    }

    fn release(&self, n: u64) {
        self.used.fetch_sub(n, std::sync::atomic::Ordering::AcqRel);
    }
}

/// Receives each piece of the backend's stderr, besides the log line (tests, status pages).
pub type StderrSink = Arc<dyn Fn(&[u8]) + Send + Sync>;

/// What one exchange needs besides the request: names for the log, bounds and timeouts.
#[derive(Clone)]
pub struct ExchangeOptions {
    /// The pool's name, logged with the backend's stderr.
    pub pool: Arc<str>,
    /// The request id, logged with the backend's stderr.
    pub request_id: u64,
    /// Time bounds.
    pub timeouts: Timeouts,
    /// Bounds on what the backend may make corral buffer.
    pub limits: Limits,
    /// Spooling of bodies of unknown length (SCGI and LSAPI announce the length first).
    /// `None` when the caller knows none will be spooled (a FastCGI pool, a body of known
    /// length), so that a request does not clone the spool settings' shared parts (two
    /// reference counts every serving thread writes); should one be needed after all, the
    /// defaults of [`SpoolConfig::default`] apply.
    pub spool: Option<SpoolConfig>,
    /// Optional extra receiver of the backend's stderr.
    pub stderr: Option<StderrSink>,
}

impl ExchangeOptions {
    /// Options with default timeouts, limits and spool for request `request_id` of `pool`.
    pub fn new(pool: &str, request_id: u64) -> ExchangeOptions {
        ExchangeOptions {
            pool: Arc::from(pool),
            request_id,
            timeouts: Timeouts::default(),
            limits: Limits::DEFAULT,
            spool: Some(SpoolConfig::default()),
            stderr: None,
        }
    }
}

impl fmt::Debug for ExchangeOptions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ExchangeOptions")
            .field("pool", &self.pool)
            .field("request_id", &self.request_id)
            .field("timeouts", &self.timeouts)
            .field("limits", &self.limits)
            .field("spool", &self.spool)
            .field("stderr", &self.stderr.as_ref().map(|_| "sink"))
            .finish()
    }
}

/// One request for a backend: the CGI variables and the body.
#[derive(Debug)]
pub struct BackendRequest {
    /// CGI/1.1 meta-variables in order (`REQUEST_METHOD`, `SCRIPT_FILENAME`, `HTTP_*`...).
    pub params: Vec<(Bytes, Bytes)>,
    /// The request body.
    pub body: RequestBody,
}

impl BackendRequest {
    /// The value of the first parameter named `name`.
    pub fn param(&self, name: &[u8]) -> Option<&Bytes> {
        self.params.iter().find(|(n, _)| n == name).map(|(_, v)| v)
    }
}

/// A backend's answer: the head, parsed before this is returned, and the body to stream.
#[derive(Debug)]
pub struct BackendResponse {
    /// Status (`head.status_code()`), headers, and what to do with a Location
    /// (`head.kind()`). For LSAPI, the status from RESP_HEADER is put in `head.status`.
    pub head: CgiResponseHead,
    /// The body, pulled chunk by chunk.
    pub body: ResponseBody,
}

/// Sends `request` over `conn` in `protocol` and returns once the response head has arrived.
pub async fn send(
    protocol: Protocol,
    conn: BackendConnection,
    request: BackendRequest,
    options: &ExchangeOptions,
) -> Result<BackendResponse, BackendError> {
    let params = CgiParams::from_pairs(&request.params).map_err(|e| BackendError::RequestHead {
        protocol,
        reason: e.to_string(),
    })?;
    send_params(
        protocol,
        conn,
        &params,
        request.body,
        options,
        tokio::time::Instant::now(),
    )
    .await
}

/// [`send`] with the parameters borrowed, so that the caller still has them to send the
/// request again when a kept connection turns out closed ([`BackendError::is_stale`]).
/// `started` is when the request is sent, read by the caller (the request deadline counts
/// from it; the gateway has just read the clock for its own timer).
///
/// The request is encoded before anything is awaited, and the future awaits only the
/// exchange's box: the gateway's request future holds this one, and every level of such
/// nesting used to carry kilobytes of state that were copied each time a future was made.
pub async fn send_params(
    protocol: Protocol,
    conn: BackendConnection,
    params: &CgiParams,
    body: RequestBody,
    options: &ExchangeOptions,
    started: tokio::time::Instant,
) -> Result<BackendResponse, BackendError> {
    let body = match protocol {
        Protocol::FastCgi => body,
        // SCGI and LSAPI announce the body's length first: one of unknown length is
        // spooled to learn it. Rare, and its future large: on the heap.
        Protocol::Scgi | Protocol::Lsapi if body.len().is_none() => {
            Box::pin(exchange::known_length(body, options, started)).await?
        }
        Protocol::Scgi | Protocol::Lsapi => body,
    };
    let exchange = match protocol {
        Protocol::FastCgi => fastcgi::prepare(conn, params, body, options, started),
        Protocol::Scgi => scgi::prepare(conn, params, body, options, started)?,
        Protocol::Lsapi => lsapi::prepare(conn, params, body, options, started)?,
    };
    exchange::read_response(exchange).await
}
