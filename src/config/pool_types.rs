//! The validated `[pools.NAME]` types the rest of corral reads: a pool, how it gets its
//! workers (spawned or servers run elsewhere), what a spawned worker runs, its sizing,
//! recycling and health check, and the protocol it is spoken to in. `pool.rs` and `app.rs`
//! build them from the file; [`super`] re-exports them.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use serde::Deserialize;

use super::{BackendAddress, DirectListener, NativeWsgi, PhpChildren, ReforkSteps};

/// Wire protocol between corral and a pool's workers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum BackendProtocol {
    /// FastCGI 1.0 (php-cgi, flup, ruby-fcgi).
    Fastcgi,
    /// SCGI (Python `scgi`).
    Scgi,
    /// LiteSpeed SAPI (lsphp, the embedded WSGI and Rack launchers).
    Lsapi,
}

/// `[pools.NAME]`: a named set of workers running one app.
#[derive(Debug, Clone, PartialEq)]
pub struct PoolConfig {
    /// The table name: ASCII letters, digits, `_` and `-`.
    pub name: String,
    /// Backend protocol (`protocol`, default `fastcgi`; `lsapi` for wsgi and rack apps).
    pub protocol: BackendProtocol,
    /// Where the workers come from.
    pub backend: Backend,
    /// Requests one worker (or external server) serves at once (`concurrency`, default 1).
    pub concurrency: u32,
    /// Cap on concurrent backend requests (`max_conns`, default workers × concurrency).
    pub max_conns: u32,
    /// Requests allowed to wait for a slot (`queue_size`, default 128; 0 = none wait).
    pub queue_size: u32,
    /// Longest wait for a slot before 503 + Retry-After (`queue_timeout`, default 5s).
    pub queue_timeout: Duration,
    /// Longest backend connect (`connect_timeout`, default 5s).
    pub connect_timeout: Duration,
    /// Longest wait for the first response byte (`first_byte_timeout`, default 60s).
    pub first_byte_timeout: Duration,
    /// Longest whole request; then 504 and the worker is replaced (`request_timeout`,
    /// default 300s).
    pub request_timeout: Duration,
    /// Pools of servers: failures (connect failures, first-byte timeouts) that take a server
    /// out of rotation (`max_fails`, default 1; 0 = never).
    pub max_fails: u32,
    /// Pools of servers: how long a failed server stays out before it is probed, and the
    /// window in which its failures add up (`fail_timeout`, default 10s).
    pub fail_timeout: Duration,
    /// Pools of servers: how often the DNS names in `servers` are resolved again, every
    /// address of a name being a server (`resolve_every`, default 5s; `src/backend/resolve.rs`).
    pub resolve_every: Duration,
}

/// How a pool gets its workers.
#[derive(Debug, Clone, PartialEq)]
pub enum Backend {
    /// corral spawns and supervises the workers.
    Spawned(Box<SpawnConfig>),
    /// The workers are servers someone else runs (`servers = [...]`).
    External {
        /// Addresses, at least one.
        servers: Vec<BackendAddress>,
    },
}

/// Settings of a pool whose workers corral spawns.
#[derive(Debug, Clone, PartialEq)]
pub struct SpawnConfig {
    /// What each worker runs.
    pub program: Program,
    /// How many workers, and when.
    pub sizing: Sizing,
    /// When a worker is retired and replaced.
    pub recycle: Recycle,
    /// Longest time a new worker may take to accept connections (`start_timeout`,
    /// default 30s).
    pub start_timeout: Duration,
    /// `health_check` (with `health_timeout`): a new worker takes requests, and a reload
    /// switches to it, only once it answers 2xx to a GET of this path (none = once its
    /// socket accepts). ARCHITECTURE.md, "Generations and reload".
    pub health_check: Option<HealthCheck>,
    /// Extra environment variables (`env`).
    pub env: BTreeMap<String, String>,
    /// Working directory (`cwd`; none = corral's).
    pub cwd: Option<PathBuf>,
    /// User the workers run as (`user`, else `server.user`).
    pub user: Option<String>,
    /// Group the workers run as (`group`, else `server.group`).
    pub group: Option<String>,
    /// `preload`: one preloader process loads the app (or, for `worker = "native"`, starts
    /// PHP) and forks the workers (`app = ...` and native PHP pools only; default on for
    /// them, always off for a `command`). ARCHITECTURE.md, "Preload and fork".
    pub preload: bool,
    /// `php_children`: each worker is a php-cgi parent forking this many children that
    /// share its OPcache (none = one php-cgi process per worker).
    pub php_children: Option<PhpChildren>,
    /// `accept = "direct"`: the workers accept on this FastCGI listener themselves
    /// (ARCHITECTURE.md, "Direct pools"); none = corral's gateway serves the pool.
    pub direct: Option<DirectListener>,
}

/// A pool's health check: the GET corral sends a new worker before it gets traffic.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HealthCheck {
    /// The path (and query) asked for, starting with `/`.
    pub path: String,
    /// Longest wait for one answer (`health_timeout`, default 2 s); a check that takes
    /// longer failed, and the next is tried until `start_timeout`.
    pub timeout: Duration,
}

/// What a spawned worker runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Program {
    /// `command = [...]`: argv; may contain `{socket}` and `{port}` placeholders.
    Command(Vec<String>),
    /// `app = "wsgi:MODULE[:CALLABLE]"`: the embedded Python launcher.
    Wsgi {
        /// Dotted module name.
        module: String,
        /// Attribute of the module (default `application`).
        callable: String,
        /// The interpreter that runs the launcher: `python` as written (an absolute path, or
        /// a name looked up in the worker's `PATH`), `VIRTUALENV/bin/python` for
        /// `virtualenv`, else [`DEFAULT_PYTHON`].
        python: String,
        /// `worker = "native"`: corral's native WSGI worker (`workers/wsgi`, CPython
        /// embedded) runs the app instead of the pure-Python launcher.
        native: Option<NativeWsgi>,
    },
    /// `app = "rack:PATH"`: the embedded Ruby launcher with a rackup file.
    Rack {
        /// Path of the rackup file (relative to `cwd`).
        rackup: PathBuf,
        /// The interpreter that runs the launcher: `ruby` as written, else
        /// [`DEFAULT_RUBY`].
        ruby: String,
    },
    /// `worker = "native"`: corral's native PHP worker (`workers/php`, PHP's embed SAPI
    /// behind LSAPI), which runs each request's SCRIPT_FILENAME as php-cgi would.
    PhpNative {
        /// `worker_path` as written (an absolute path or a name looked up in `PATH`);
        /// `None`: `corral-php-worker` beside corral's own executable, else in `PATH`
        /// (`crate::launchers::php_worker`).
        worker_path: Option<String>,
        /// `worker_script`: worker mode, the script that boots once and serves every
        /// request through `corral_handle_request` (relative to `cwd`); `None`: classic
        /// mode, each request runs its SCRIPT_FILENAME.
        worker_script: Option<PathBuf>,
    },
}

/// The interpreter of a WSGI pool that names none: the system's Python 3.
pub const DEFAULT_PYTHON: &str = "python3";

/// The interpreter of a Rack pool that names none.
pub const DEFAULT_RUBY: &str = "ruby";

/// Pool size policy (`mode`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sizing {
    /// `mode = "static"`: always `max` workers.
    Static {
        /// Worker count.
        workers: u32,
    },
    /// `mode = "dynamic"` (the default): between `min` and `max`, keeping idle workers
    /// between `spare_min` and `spare_max`.
    Dynamic {
        /// Never fewer workers (default 1).
        min: u32,
        /// Never more workers (default 5).
        max: u32,
        /// Spawn when fewer are idle (default 1).
        spare_min: u32,
        /// Retire when more are idle (default 3, at most `max`).
        spare_max: u32,
        /// An idle worker above `min` is retired after this long (default 10s).
        idle_timeout: Duration,
    },
    /// `mode = "ondemand"`: no worker until a request comes.
    OnDemand {
        /// Never more workers (default 5).
        max: u32,
        /// An idle worker is retired after this long (default 10s).
        idle_timeout: Duration,
    },
}

impl Sizing {
    /// The most workers the pool may have alive at once (not counting a replacement that
    /// is started before the worker it replaces is retired).
    pub fn max(&self) -> u32 {
        match *self {
            Sizing::Static { workers } => workers,
            Sizing::Dynamic { max, .. } | Sizing::OnDemand { max, .. } => max,
        }
    }
}

/// Recycling policy; `None` = that trigger is off.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Recycle {
    /// Retire after this many requests (`max_requests`; 0 or absent = never).
    pub max_requests: Option<u64>,
    /// Up to this many requests are randomly added per worker so workers don't all recycle
    /// together (`max_requests_jitter`, default max_requests / 10).
    pub max_requests_jitter: u64,
    /// Retire, after the current request, when the worker's memory (PSS) exceeds this many
    /// bytes (`max_memory`; absent = never).
    pub max_memory: Option<u64>,
    /// Retire after this age (`max_lifetime`; absent = never).
    pub max_lifetime: Option<Duration>,
    /// When the PSS summed over the pool's workers exceeds this many bytes, the worker with
    /// the most private memory (USS) is replaced, new before old, one at a time
    /// (`max_pool_memory`; absent = never).
    pub max_pool_memory: Option<u64>,
    /// Most workers a rolling restart keeps above the pool's size, counting old workers
    /// until they are reaped (`max_surge`; 0 = retire each old worker before its
    /// replacement starts). Absent: one replacement booting at a time, the next started once
    /// the previous is ready, old workers still finishing a request not counted (within
    /// `max + 1` live workers).
    pub max_surge: Option<u32>,
    /// `refork_after`: after how many requests a worker of each template generation is
    /// promoted to be the next template (preloading launcher pools only; docs/pools.md,
    /// "Reforking").
    pub refork_after: ReforkSteps,
}
