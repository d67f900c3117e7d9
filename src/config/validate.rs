//! Second stage of configuration: from the file as written to a [`Config`] with defaults
//! resolved, checking every rule and collecting every error instead of stopping at the first.
//!
//! Pools are checked in `pool`, the sockets in `listen`; this file does the server, the
//! contexts, and the rules that tie sections together (a context's pool and listener must
//! exist, every pool and listener must be reachable).

use std::collections::BTreeMap;
use std::ops::Range;
use std::path::PathBuf;
use std::time::Duration;

use toml::Spanned;

use super::diagnostic::ConfigError;
use super::file::{DurationText, FileConfig, FileServer, SpannedTable};
use super::listen::{check_distinct_sockets, listener, status};
use super::units::parse_duration;
use super::{
    context, pool, Config, ContextConfig, FrontTimeouts, ListenAddress, ListenerConfig, LogLevel,
    LogTarget, PoolConfig, Scheduler, ServerConfig,
};

/// Most runtime worker threads `threads` may ask for.
const MAX_THREADS: u32 = 1024;

/// Longest `runtime_dir`: worker socket paths are built under it and must stay within the
/// 107 bytes a Unix socket path may have.
const MAX_RUNTIME_DIR: usize = 64;

/// Runs the second stage over a parsed file.
pub fn validate(file: FileConfig, src: &str, origin: &str) -> Result<Config, Vec<ConfigError>> {
    let mut e = Errors {
        src,
        origin,
        list: Vec::new(),
    };
    let server = server(&mut e, file.server.as_ref());
    let mut listeners: Vec<_> = file
        .listen
        .iter()
        .filter_map(|l| listener(&mut e, l, &server))
        .collect();
    let status = file.status.as_ref().and_then(|s| status(&mut e, s));
    check_distinct_sockets(&mut e, &file);
    let mut pools: Vec<_> = file
        .pools
        .iter()
        .filter_map(|(name, p)| pool::pool(&mut e, name, p, &server))
        .collect();
    let direct = super::direct::resolve(&mut e, &file, &mut listeners, &mut pools);
    let contexts = contexts(&mut e, &file, &listeners, &pools, &direct);

    if file.listen.is_empty() {
        e.whole("no front listener is configured: add a [[listen]] block");
    }
    if file.pools.is_empty() {
        e.whole("no pool is configured: add a [pools.NAME] table");
    }
    if e.list.is_empty() {
        Ok(Config {
            origin: origin.to_owned(),
            server,
            listeners,
            status,
            pools,
            contexts,
        })
    } else {
        // Source order reads best; errors about the whole file come last.
        e.list
            .sort_by_key(|err| (err.line().unwrap_or(usize::MAX), err.column()));
        Err(e.list)
    }
}

/// Collects errors for one configuration text.
pub(super) struct Errors<'a> {
    src: &'a str,
    origin: &'a str,
    list: Vec<ConfigError>,
}

impl Errors<'_> {
    /// Records an error at `span`.
    pub(super) fn at(&mut self, span: Range<usize>, message: impl Into<String>) {
        self.list
            .push(ConfigError::new(self.src, self.origin, Some(span), message));
    }

    /// Records an error about the file as a whole.
    pub(super) fn whole(&mut self, message: impl Into<String>) {
        self.list
            .push(ConfigError::new(self.src, self.origin, None, message));
    }

    /// Keeps `Ok` values; records an `Err` at `span` and gives `None`.
    pub(super) fn check<T>(&mut self, span: Range<usize>, r: Result<T, String>) -> Option<T> {
        r.map_err(|m| self.at(span, m)).ok()
    }

    /// The 1-based line of a byte offset, for messages that point back at another place.
    pub(super) fn line_of(&self, offset: usize) -> usize {
        let before = self.src.get(..offset).unwrap_or(self.src);
        before.matches('\n').count() + 1
    }

    /// A duration that must be greater than zero, or `default` when absent (or invalid, so
    /// checking can go on; the error is recorded).
    pub(super) fn timeout(
        &mut self,
        value: Option<&Spanned<DurationText>>,
        key: &str,
        default: Duration,
    ) -> Duration {
        let Some(v) = value else { return default };
        match parse_duration(&v.get_ref().0) {
            Ok(d) if d.is_zero() => {
                self.at(v.span(), format!("{key} must be greater than zero"));
                default
            }
            Ok(d) => d,
            Err(m) => {
                self.at(v.span(), m);
                default
            }
        }
    }

    /// A user or group name (or numeric id) as `getpwnam`/`getgrnam` would take it.
    pub(super) fn account(&mut self, value: Option<&Spanned<String>>, key: &str) -> Option<String> {
        let v = value?;
        let name = v.get_ref();
        let valid = !name.is_empty()
            && name
                .chars()
                .all(|c| !c.is_whitespace() && !c.is_control() && c != ':' && c != '/');
        if !valid {
            self.at(
                v.span(),
                format!("{key} \"{name}\" is not a user or group name"),
            );
        }
        Some(name.clone())
    }

    /// An absolute path without NUL bytes.
    pub(super) fn absolute_path(&mut self, v: &Spanned<String>, key: &str) -> Option<PathBuf> {
        let path = v.get_ref();
        if !path.starts_with('/') {
            self.at(
                v.span(),
                format!("{key} \"{path}\" must be an absolute path"),
            );
            None
        } else if path.contains('\0') {
            self.at(v.span(), format!("{key} contains a NUL byte"));
            None
        } else {
            Some(PathBuf::from(path))
        }
    }

    /// A table of names to strings (`env`, `params`); names must satisfy `valid_name`.
    pub(super) fn string_table(
        &mut self,
        table: Option<&SpannedTable>,
        key: &str,
        valid_name: fn(&str) -> bool,
        rule: &str,
    ) -> BTreeMap<String, String> {
        let mut out = BTreeMap::new();
        for (name, value) in table.map(|t| t.get_ref().iter()).into_iter().flatten() {
            if !valid_name(name.get_ref()) {
                self.at(
                    name.span(),
                    format!("{key} name \"{}\" is not valid: {rule}", name.get_ref()),
                );
            }
            if value.get_ref().contains('\0') {
                self.at(
                    value.span(),
                    format!("{key} value of {} contains a NUL byte", name.get_ref()),
                );
            }
            out.insert(name.get_ref().clone(), value.get_ref().clone());
        }
        out
    }
}

fn server(e: &mut Errors, s: Option<&FileServer>) -> ServerConfig {
    let runtime_dir = match s.and_then(|s| s.runtime_dir.as_ref()) {
        None => PathBuf::from("/run/corral"),
        Some(v) => {
            if v.get_ref().len() > MAX_RUNTIME_DIR {
                e.at(
                    v.span(),
                    format!(
                        "runtime_dir is {} bytes; at most {MAX_RUNTIME_DIR} leaves room for \
                         worker socket names (Unix socket paths are limited to 107 bytes)",
                        v.get_ref().len()
                    ),
                );
            }
            e.absolute_path(v, "runtime_dir").unwrap_or_default()
        }
    };
    ServerConfig {
        runtime_dir,
        user: e.account(s.and_then(|s| s.user.as_ref()), "user"),
        group: e.account(s.and_then(|s| s.group.as_ref()), "group"),
        grace: e.timeout(
            s.and_then(|s| s.grace.as_ref()),
            "grace",
            Duration::from_secs(30),
        ),
        shutdown_delay: s
            .and_then(|s| s.shutdown_delay.as_ref())
            .and_then(|d| e.check(d.span(), parse_duration(&d.get_ref().0)))
            .unwrap_or(Duration::ZERO),
        kill_timeout: e.timeout(
            s.and_then(|s| s.kill_timeout.as_ref()),
            "kill_timeout",
            Duration::from_secs(10),
        ),
        log_level: s.and_then(|s| s.log_level).unwrap_or(LogLevel::Info),
        spool_budget: s
            .and_then(|s| s.spool_budget.as_ref())
            .and_then(|b| e.check(b.span(), super::parse_size(&b.get_ref().0)))
            .unwrap_or(super::DEFAULT_SPOOL_BUDGET),
        max_connections: match s.and_then(|s| s.max_connections.as_ref()) {
            Some(m) if *m.get_ref() == 0 => {
                e.at(
                    m.span(),
                    "max_connections must be at least 1; leave it out to derive it from \
                     the file-descriptor limit",
                );
                None
            }
            m => m.map(|m| *m.get_ref()),
        },
        threads: match s.and_then(|s| s.threads.as_ref()) {
            Some(t) if !(1..=MAX_THREADS).contains(t.get_ref()) => {
                e.at(
                    t.span(),
                    format!(
                        "threads must be from 1 to {MAX_THREADS}; leave it out for the default"
                    ),
                );
                None
            }
            t => t.map(|t| *t.get_ref()),
        },
        scheduler: s.and_then(|s| s.scheduler).unwrap_or_default(),
        pin_threads: match s.and_then(|s| s.pin_threads.as_ref()) {
            Some(p)
                if *p.get_ref() && s.and_then(|s| s.scheduler) == Some(Scheduler::WorkStealing) =>
            {
                e.at(
                    p.span(),
                    "pin_threads pins the serving threads of scheduler = \"per-thread\"; \
                     the work-stealing runtime's threads move their tasks between them, so \
                     leave it out with scheduler = \"work-stealing\"",
                );
                false
            }
            p => p.is_some_and(|p| *p.get_ref()),
        },
        sched_batch: match s.and_then(|s| s.sched_batch.as_ref()) {
            Some(b)
                if *b.get_ref() && s.and_then(|s| s.scheduler) == Some(Scheduler::WorkStealing) =>
            {
                e.at(
                    b.span(),
                    "sched_batch applies to the serving threads of scheduler = \"per-thread\"; \
                     the work-stealing runtime's threads also fork the workers, which would \
                     inherit it, so leave it out with scheduler = \"work-stealing\"",
                );
                None
            }
            b => b.map(|b| *b.get_ref()),
        },
        front_timeouts: front_timeouts(
            e,
            FrontTimeouts::default(),
            [
                s.and_then(|s| s.header_timeout.as_ref()),
                s.and_then(|s| s.idle_timeout.as_ref()),
                s.and_then(|s| s.body_timeout.as_ref()),
                s.and_then(|s| s.send_timeout.as_ref()),
                s.and_then(|s| s.body_deadline.as_ref()),
            ],
        ),
        access_log: s
            .and_then(|s| s.access_log.as_ref())
            .and_then(|v| log_target(e, v, "access_log")),
        access_log_format: s.and_then(|s| s.access_log_format).unwrap_or_default(),
        slow_log: {
            let target = s
                .and_then(|s| s.slow_log.as_ref())
                .and_then(|v| log_target(e, v, "slow_log"));
            match s.and_then(|s| s.slow_threshold.as_ref()) {
                Some(t) => {
                    let threshold = e.timeout(Some(t), "slow_threshold", Duration::ZERO);
                    Some((target.unwrap_or(LogTarget::Stderr), threshold))
                }
                None => {
                    if let Some(v) = s.and_then(|s| s.slow_log.as_ref()) {
                        e.at(v.span(), "slow_log needs slow_threshold: the time a request must take to be written there");
                    }
                    None
                }
            }
        },
    }
}

/// A request log's destination: `stderr` or an absolute path.
fn log_target(e: &mut Errors, v: &Spanned<String>, key: &str) -> Option<LogTarget> {
    if v.get_ref() == "stderr" {
        return Some(LogTarget::Stderr);
    }
    e.absolute_path(v, key).map(LogTarget::File)
}

/// `header_timeout`, `idle_timeout`, `body_timeout`, `send_timeout` and `body_deadline` (in
/// that order) over `defaults`.
pub(super) fn front_timeouts(
    e: &mut Errors,
    defaults: FrontTimeouts,
    [header, idle, body, send, body_total]: [Option<&Spanned<DurationText>>; 5],
) -> FrontTimeouts {
    FrontTimeouts {
        header: e.timeout(header, "header_timeout", defaults.header),
        idle: e.timeout(idle, "idle_timeout", defaults.idle),
        body: e.timeout(body, "body_timeout", defaults.body),
        send: e.timeout(send, "send_timeout", defaults.send),
        body_total: e.timeout(body_total, "body_deadline", defaults.body_total),
    }
}

fn contexts(
    e: &mut Errors,
    file: &FileConfig,
    listeners: &[ListenerConfig],
    pools: &[PoolConfig],
    direct: &super::direct::Direct,
) -> Vec<ContextConfig> {
    if file.contexts.is_empty() {
        // Direct pools are reached by no context (`src/config/direct.rs`).
        let routed: Vec<&PoolConfig> = pools
            .iter()
            .filter(|p| !direct.pools.contains(&p.name))
            .collect();
        let written = file.pools.len() - direct.pools.len();
        return match routed.as_slice() {
            [] if written == 0 => Vec::new(),
            [only] if written == 1 && context::runs_php(only) => {
                e.whole(format!(
                    "pool \"{}\" runs PHP: add a [[contexts]] with a root, so that corral can \
                     check which file each request makes the interpreter run",
                    only.name
                ));
                Vec::new()
            }
            [only] if written == 1 => vec![ContextConfig {
                listen: None,
                prefix: "/".to_owned(),
                extension: None,
                host: None,
                server_name: None,
                root: None,
                index: Vec::new(),
                pool: only.name.clone(),
                max_conns: only.max_conns,
                static_files: false,
                allow_php_value: false,
                params: BTreeMap::new(),
                max_body: super::DEFAULT_MAX_BODY,
                request_buffering: true,
                front_controller: None,
                sendfile_dirs: Vec::new(),
                accel_redirect: Vec::new(),
            }],
            _ => {
                if written > 1 {
                    e.whole(format!(
                        "{written} pools are configured but no [[contexts]] says which requests go \
                         to which pool"
                    ));
                }
                Vec::new()
            }
        };
    }
    let mut out = Vec::new();
    let mut matchers: Vec<(MatchKey, usize)> = Vec::new();
    for c in &file.contexts {
        let Some(ctx) = context::context(e, c.get_ref(), listeners, pools, file) else {
            continue;
        };
        let key = MatchKey::of(&ctx);
        if let Some((_, first)) = matchers.iter().find(|(k, _)| *k == key) {
            let line = e.line_of(*first);
            e.at(
                c.span(),
                format!(
                    "this context matches exactly the requests the context on line {line} \
                     matches, so it would never be chosen"
                ),
            );
        }
        matchers.push((key, c.span().start));
        out.push(ctx);
    }
    reachability(e, file, &out, direct);
    out
}

/// What a context matches on; two contexts with the same key shadow each other.
#[derive(PartialEq, Eq)]
struct MatchKey {
    listen: Option<ListenAddress>,
    prefix: String,
    extension: Option<String>,
    host: Option<String>,
}

impl MatchKey {
    fn of(c: &ContextConfig) -> Self {
        MatchKey {
            listen: c.listen.clone(),
            prefix: c.prefix.clone(),
            extension: c.extension.clone(),
            host: c.host.clone(),
        }
    }
}

/// Every pool must be used by a context and every listener served by one: anything else is
/// workers or a socket nobody can reach, almost always a typo.
fn reachability(
    e: &mut Errors,
    file: &FileConfig,
    contexts: &[ContextConfig],
    direct: &super::direct::Direct,
) {
    for name in file.pools.keys() {
        if !direct.pools.contains(name.get_ref())
            && !file
                .contexts
                .iter()
                .any(|c| c.get_ref().pool.get_ref() == name.get_ref())
        {
            e.at(
                name.span(),
                format!(
                    "pool \"{}\" is not used by any [[contexts]]",
                    name.get_ref()
                ),
            );
        }
    }
    if contexts.len() != file.contexts.len() {
        return; // a context failed to validate; which listeners it serves is unknown.
    }
    for l in &file.listen {
        let Ok(addr) = ListenAddress::parse(l.address.get_ref()) else {
            continue;
        };
        if !direct.addresses.contains(&addr)
            && !contexts
                .iter()
                .any(|c| c.listen.as_ref().is_none_or(|a| *a == addr))
        {
            e.at(
                l.address.span(),
                format!(
                    "no context serves listener {addr}: add a [[contexts]] without listen, \
                     or with listen = \"{addr}\""
                ),
            );
        }
    }
}
