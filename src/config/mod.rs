//! The validated configuration: the types the rest of corral reads, and `parse`, which turns
//! TOML text into them.
//!
//! Configuration goes through two stages (ARCHITECTURE.md decision 15). `file` mirrors the TOML
//! exactly with serde (every table denies unknown keys, fields that validation may reject keep
//! their byte span); `validate` resolves defaults and checks every rule, collecting *all* errors,
//! each located as `FILE:LINE:COL`. What comes out is a [`Config`] with no `Option` left to mean
//! "use the default": an `Option` here always means something (no status listener, never recycle by
//! age, ...). Parsing is a pure function of the text and its name, so reload, `corral check` and
//! tests all go through the same [`parse`].
//!
//! Defaults follow php-fpm where the concept is the same (its `www.conf` sample sizes a
//! dynamic pool 5 / 1..3 spare, `listen.mode` 0660, `listen.backlog` 511,
//! `pm.process_idle_timeout` 10s, `pm.max_requests` 0 = never) and are listed, with units, in
//! `conf/corral.toml`.

mod address;
mod app;
mod budget;
mod context;
mod diagnostic;
mod direct;
mod file;
mod health;
mod keys;
mod listen;
mod php_children;
mod php_native;
mod pool;
mod pool_types;
mod programs;
mod refork;
mod threads;
mod units;
mod validate;
mod wsgi_native;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use serde::Deserialize;

pub use address::{BackendAddress, Cidr, ListenAddress};
pub use diagnostic::ConfigError;
pub use direct::DirectListener;
pub use php_children::{PhpChildren, MAX_PHP_CHILDREN};
pub use pool_types::{
    Backend, BackendProtocol, HealthCheck, PoolConfig, Program, Recycle, Sizing, SpawnConfig,
    DEFAULT_PYTHON, DEFAULT_RUBY,
};
pub use programs::check_programs;
pub use refork::{ReforkSteps, MAX_REFORK_STEPS};
pub use units::{parse_duration, parse_size};
pub use wsgi_native::NativeWsgi;

/// The configuration `corral` runs when no file is given: an HTTP listener on
/// 127.0.0.1:8080 and status on 127.0.0.1:9180 in front of a demo WSGI app.
pub const EMBEDDED: &str = include_str!("default.toml");

/// The origin name [`EMBEDDED`] is reported under.
pub const EMBEDDED_ORIGIN: &str = "<embedded default>";

/// Parses and validates a configuration.
///
/// `origin` names the text in error messages (usually the file path). On failure every error
/// found is returned, in source order where the TOML itself was readable. A TOML syntax error
/// is reported alone; unknown keys and values of the wrong type are all reported together,
/// and stop the first stage (the rules are checked on a file whose every key was read).
pub fn parse(src: &str, origin: &str) -> Result<Config, Vec<ConfigError>> {
    let file = file::FileConfig::from_toml(src, origin)?;
    validate::validate(file, src, origin)
}

/// A validated configuration.
#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    /// The name the configuration was parsed under (a path, or [`EMBEDDED_ORIGIN`]).
    pub origin: String,
    /// Process-wide settings.
    pub server: ServerConfig,
    /// Front listeners, in file order; at least one.
    pub listeners: Vec<ListenerConfig>,
    /// The status listener, if `[status]` is present.
    pub status: Option<StatusConfig>,
    /// Pools, sorted by name; at least one.
    pub pools: Vec<PoolConfig>,
    /// Routing rules, in file order; at least one (an implicit catch-all when the file has a
    /// single pool and no `[[contexts]]`).
    pub contexts: Vec<ContextConfig>,
}

impl Config {
    /// The pool called `name`.
    pub fn pool(&self, name: &str) -> Option<&PoolConfig> {
        self.pools.iter().find(|p| p.name == name)
    }
}

/// `[server]`: settings for the whole process.
#[derive(Debug, Clone, PartialEq)]
pub struct ServerConfig {
    /// Directory for worker sockets (`runtime_dir`, default `/run/corral`).
    pub runtime_dir: PathBuf,
    /// User workers run as when corral starts as root (`user`; none = corral's own).
    pub user: Option<String>,
    /// Group workers run as when corral starts as root (`group`; none = the user's group).
    pub group: Option<String>,
    /// Bound on graceful stop and reload drains (`grace`, default 30s).
    pub grace: Duration,
    /// How long a graceful stop keeps accepting before it drains (`shutdown_delay`, default
    /// 0): `/ready` answers 503 from the stop on, so a load balancer takes corral out of
    /// rotation before its listeners close.
    pub shutdown_delay: Duration,
    /// How long a worker may take to exit after its stop signal before SIGKILL
    /// (`kill_timeout`, default 10s).
    pub kill_timeout: Duration,
    /// Least severe log level written (`log_level`, default `info`).
    pub log_level: LogLevel,
    /// Most request-body bytes held in spool files at once, over all requests
    /// (`spool_budget`, default [`DEFAULT_SPOOL_BUDGET`]); beyond it a request is answered
    /// 503 rather than filling the disk.
    pub spool_budget: u64,
    /// Cap on open front connections over all front listeners (`max_connections`); none =
    /// derived at start from the file-descriptor limit (see `front::limits`).
    pub max_connections: Option<u32>,
    /// Runtime worker threads (`threads`); none = [`Config::serving_threads`]'s default (half
    /// the CPUs when a pool spawns its workers here or names a server on this machine, else
    /// one per CPU). Read at start only.
    pub threads: Option<u32>,
    /// How the serving threads share the work (`scheduler`). Read at start only.
    pub scheduler: Scheduler,
    /// Whether each serving thread is pinned to a CPU of its own (`pin_threads`, default
    /// off; the per-thread scheduler only). Read at start only.
    pub pin_threads: bool,
    /// Whether the serving threads run under `SCHED_BATCH` (`sched_batch`); none =
    /// [`Config::serving_sched_batch`]'s default (on when the per-thread scheduler serves a
    /// pool whose workers run on this machine). Read at start only.
    pub sched_batch: Option<bool>,
    /// Front timeouts for listeners that do not set their own (`header_timeout`,
    /// `idle_timeout`, `body_timeout`, `send_timeout`, `body_deadline`).
    pub front_timeouts: FrontTimeouts,
    /// Where the access log goes (`access_log`: `"stderr"` or an absolute path; default
    /// none) and in which format (`access_log_format`, default `text`).
    pub access_log: Option<LogTarget>,
    /// The access log's format.
    pub access_log_format: AccessFormat,
    /// The slow-request log: requests whose total time reaches `slow_threshold` are written
    /// to `slow_log` (`"stderr"` or an absolute path; stderr when only the threshold is set).
    pub slow_log: Option<(LogTarget, Duration)>,
}

/// Where a request log is written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LogTarget {
    /// corral's standard error, beside its own log.
    Stderr,
    /// A file, appended to and reopened on SIGUSR1.
    File(PathBuf),
}

/// `server.access_log_format`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum AccessFormat {
    /// nginx's combined format with corral's fields after it (`key=value`).
    #[default]
    Text,
    /// One JSON object per line.
    Json,
}

/// How long a front connection may take over each phase before it is closed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FrontTimeouts {
    /// Longest time to receive a whole request head (HTTP head, FastCGI PARAMS, SCGI
    /// netstring), counted from its first byte, or from accept on a new connection
    /// (`header_timeout`, default 10s).
    pub header: Duration,
    /// Longest wait for the next request on a kept-alive connection (`idle_timeout`,
    /// default 60s).
    pub idle: Duration,
    /// Longest wait for more request-body bytes while a body is being read (`body_timeout`,
    /// default 30s).
    pub body: Duration,
    /// Longest a response write may wait for a client that reads nothing (`send_timeout`,
    /// default 60s, as nginx's): then the connection is dropped and the backend request
    /// aborted, without blaming the worker.
    pub send: Duration,
    /// Longest time, all waits together, a front waits for a client to send a request body
    /// (`body_deadline`, default 1h): `body_timeout` alone lets a client that sends a byte
    /// just within it hold a connection and a spool file for ever. Only waiting for the
    /// client counts, not time spent on a slow backend; HTTP answers 408 when it passes, SCGI
    /// closes the connection, FastCGI answers that request 408 (per request, the connection
    /// goes on).
    pub body_total: Duration,
}

impl Default for FrontTimeouts {
    fn default() -> Self {
        FrontTimeouts {
            header: Duration::from_secs(10),
            idle: Duration::from_secs(60),
            body: Duration::from_secs(30),
            send: Duration::from_secs(60),
            body_total: Duration::from_secs(3600),
        }
    }
}

/// `spool_budget` when `[server]` sets none: 4 GiB.
pub const DEFAULT_SPOOL_BUDGET: u64 = 4 << 30;

/// `server.scheduler`: how front connections are spread over the serving threads
/// (ARCHITECTURE.md, "Serving threads").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Scheduler {
    /// Each serving thread runs its own single-threaded runtime and accepts on its own copy
    /// of every listener; a connection stays on the thread that accepted it.
    #[default]
    PerThread,
    /// One multi-threaded runtime whose threads steal each other's tasks.
    WorkStealing,
}

/// `server.log_level`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LogLevel {
    /// Only errors.
    Error,
    /// Errors and warnings.
    Warn,
    /// The default: lifecycle events too.
    Info,
    /// Per-request detail.
    Debug,
    /// Everything.
    Trace,
}

/// Where a socket is bound and who may use it.
#[derive(Debug, Clone, PartialEq)]
pub enum Bind {
    /// A TCP socket.
    Tcp {
        /// Address to bind (port 0 picks a free port).
        addr: std::net::SocketAddr,
        /// Clients allowed to connect (`allow`); empty = everyone.
        allow: Vec<Cidr>,
    },
    /// A Unix stream socket.
    Unix {
        /// Socket path (absolute).
        path: PathBuf,
        /// Permissions given to the socket file.
        perms: UnixPermissions,
    },
}

impl Bind {
    /// The address alone, as contexts refer to it.
    pub fn address(&self) -> ListenAddress {
        match self {
            Bind::Tcp { addr, .. } => ListenAddress::Tcp(*addr),
            Bind::Unix { path, .. } => ListenAddress::Unix(path.clone()),
        }
    }
}

/// Owner, group and mode of a Unix socket file (php-fpm's `listen.owner/group/mode`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnixPermissions {
    /// Permission bits (`mode`, default `0660`).
    pub mode: u32,
    /// Owner (`owner`; none = corral's user).
    pub owner: Option<String>,
    /// Group (`group`; none = corral's group).
    pub group: Option<String>,
}

/// `[[listen]]`: one front listener.
#[derive(Debug, Clone, PartialEq)]
pub struct ListenerConfig {
    /// Address and access rules.
    pub bind: Bind,
    /// What clients speak to it.
    pub protocol: FrontProtocol,
    /// Kernel accept backlog (`backlog`, default 511 like php-fpm on Linux).
    pub backlog: u32,
    /// Whether forwarded-protocol headers are believed (http listeners only); none = they
    /// are ignored and HTTPS is never inferred.
    pub forwarded: Option<ForwardedTrust>,
    /// Cap on open connections from one client IP address (`max_connections_per_client`,
    /// default 128; 0 = none). Unix-socket peers have no address and are exempt: they are
    /// front servers on this host, and only the server-wide cap counts them.
    pub max_connections_per_client: Option<u32>,
    /// Phase timeouts (each key defaults to the `[server]` value).
    pub timeouts: FrontTimeouts,
    /// fastcgi only: the SCRIPT_NAME corral answers itself with the status page in php-fpm's
    /// formats, as php-fpm's `pm.status_path` (`status_path`; none = passed on like any path).
    pub status_path: Option<String>,
    /// fastcgi only: the SCRIPT_NAME answered `pong`, as php-fpm's `ping.path` (`ping_path`).
    pub ping_path: Option<String>,
}

/// What front listeners speak.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum FrontProtocol {
    /// HTTP/1.1 from a reverse proxy or a client.
    Http,
    /// FastCGI from a front server (`fastcgi_pass`).
    Fastcgi,
    /// SCGI from a front server (`scgi_pass`).
    Scgi,
}

/// Which header a trusted proxy uses to say the client came over HTTPS.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ForwardedHeader {
    /// Headers are ignored (the default).
    None,
    /// `X-Forwarded-Proto` and `X-Forwarded-For`.
    XForwarded,
    /// RFC 7239 `Forwarded: proto=https;for=...`.
    Forwarded,
}

/// `forwarded` + `trusted_proxies` of an http listener.
#[derive(Debug, Clone, PartialEq)]
pub struct ForwardedTrust {
    /// The header read (never [`ForwardedHeader::None`] here).
    pub header: ForwardedHeader,
    /// Peers whose header is believed. Empty on a Unix listener, where every peer passed
    /// the socket's file permissions and is trusted.
    pub trusted_proxies: Vec<Cidr>,
}

/// `[status]`: the supervisor-served status and metrics listener.
#[derive(Debug, Clone, PartialEq)]
pub struct StatusConfig {
    /// Address and access rules.
    pub bind: Bind,
    /// `allowed_hosts`: the Host names (lowercase, without a port) the status listener
    /// answers besides loopback names and addresses and the address it was reached on;
    /// `*` answers every Host (see `status::server::host_allowed`).
    pub allowed_hosts: Vec<String>,
}

/// `[[contexts]]`: a routing rule from requests to a pool.
#[derive(Debug, Clone, PartialEq)]
pub struct ContextConfig {
    /// Only requests from this listener (`listen`; none = any).
    pub listen: Option<ListenAddress>,
    /// Path prefix (`prefix`, default `/`); starts with `/`.
    pub prefix: String,
    /// Script extension without the dot (`extension`; none = any path).
    pub extension: Option<String>,
    /// Host name, lowercase, exact or `*.suffix` (`host`; none = any host).
    pub host: Option<String>,
    /// SERVER_NAME for every request of this context, on every front (`server_name`, a host
    /// name; none = the Host the client sent, or on the FastCGI and SCGI fronts the front
    /// server's SERVER_NAME), so a script that builds links from it cannot be handed the
    /// client's choice.
    pub server_name: Option<String>,
    /// Document root for SCRIPT_FILENAME (`root`; none = the app routes by path).
    pub root: Option<PathBuf>,
    /// Files tried for a directory (`index`, default `["index.php"]` when `root` is set).
    pub index: Vec<String>,
    /// The pool serving it.
    pub pool: String,
    /// Cap on this context's concurrent backend requests (`max_conns`, default the pool's).
    pub max_conns: u32,
    /// Serve existing non-script files under `root` directly (`static_files`, default false).
    pub static_files: bool,
    /// Pass `PHP_VALUE`/`PHP_ADMIN_VALUE` from the front side (`allow_php_value`, default
    /// false).
    pub allow_php_value: bool,
    /// Extra CGI parameters sent with every request (`params`).
    pub params: BTreeMap<String, String>,
    /// Largest request body accepted, with or without a Content-Length (`max_body`, default
    /// [`DEFAULT_MAX_BODY`]); a larger one is answered 413 before any worker is asked.
    pub max_body: u64,
    /// Read a client's whole request body (into memory up to 64 KiB, then a spool file)
    /// before a worker is asked, so a slow upload never holds a worker
    /// (`request_buffering`, default true, like nginx's `fastcgi_request_buffering`).
    pub request_buffering: bool,
    /// The script that serves, on the HTTP listener, every request whose path names no
    /// existing file or directory under `root` and no script (`front_controller`, such as
    /// `/index.php`; none by default), as nginx's `try_files $uri $uri/ /index.php?$args`
    /// does: absolute in the root, without `.`, `..` or hidden segments, ending in the
    /// context's script extension.
    pub front_controller: Option<String>,
    /// Directories whose files a backend may have corral send with `X-Sendfile: /abs/path`
    /// on the HTTP listener (`sendfile_dirs`; none by default, and then the header is
    /// refused).
    pub sendfile_dirs: Vec<PathBuf>,
    /// URI prefixes a backend may name with `X-Accel-Redirect: /uri`, each with the
    /// directory it maps to (`accel_redirect = { "/protected/" = "/srv/files/" }`; none by
    /// default). Both end with `/`; the longest matching prefix comes first.
    pub accel_redirect: Vec<(String, PathBuf)>,
}

/// `max_body` when a context sets none: 1 GiB, the most corral spools to learn a chunked
/// body's length. (nginx's client_max_body_size defaults to 1 MiB, which PHP sites raise
/// first thing; php's post_max_size is the other guard.)
pub const DEFAULT_MAX_BODY: u64 = 1 << 30;

#[cfg(test)]
mod tests;
