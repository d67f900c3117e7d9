//! Second stage of configuration: from the file as written to a [`Config`] with defaults
//! resolved, checking every rule and collecting every error instead of stopping at the first.
//!
//! Pools are checked in `pool`; this file does the server, the sockets, the contexts, and
//! the rules that tie sections together (a context's pool and listener must exist, every pool
//! and listener must be reachable, no two sockets may take the same address).

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::ops::Range;
use std::path::PathBuf;
use std::time::Duration;

use toml::Spanned;

use super::diagnostic::ConfigError;
use super::file::{
    DurationText, FileConfig, FileListen, FileServer, FileStatus, SpannedList, SpannedTable,
};
use super::units::{parse_duration, parse_mode};
use super::{
    context, pool, Bind, Cidr, Config, ContextConfig, ForwardedHeader, ForwardedTrust,
    FrontProtocol, FrontTimeouts, ListenAddress, ListenerConfig, LogLevel, LogTarget, PoolConfig,
    ServerConfig, StatusConfig, UnixPermissions,
};

/// Most runtime worker threads `threads` may ask for.
const MAX_THREADS: u32 = 1024;

/// Default `max_connections_per_client`: room for a browser's six parallel connections many
/// times over, and for a front server on another host keeping a modest keep-alive pool.
const DEFAULT_PER_CLIENT: u32 = 128;

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
fn front_timeouts(
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

/// The access keys shared by `[[listen]]` and `[status]`.
struct SocketKeys<'f> {
    address: &'f Spanned<String>,
    mode: Option<&'f Spanned<String>>,
    owner: Option<&'f Spanned<String>>,
    group: Option<&'f Spanned<String>>,
    allow: Option<&'f SpannedList>,
}

fn bind(e: &mut Errors, keys: SocketKeys) -> Option<Bind> {
    let address = e.check(
        keys.address.span(),
        ListenAddress::parse(keys.address.get_ref()),
    );
    match address? {
        ListenAddress::Tcp(addr) => {
            for (key, span) in [
                ("mode", keys.mode),
                ("owner", keys.owner),
                ("group", keys.group),
            ]
            .into_iter()
            .filter_map(|(k, v)| Some((k, v?.span())))
            {
                e.at(
                    span,
                    format!("{key} applies to unix: sockets only; {addr} is TCP"),
                );
            }
            let allow = cidrs(e, keys.allow);
            Some(Bind::Tcp { addr, allow })
        }
        ListenAddress::Unix(path) => {
            if let Some(allow) = keys.allow {
                e.at(
                    allow.span(),
                    "allow applies to TCP sockets only; on a unix: socket, mode, owner and \
                     group decide who may connect",
                );
            }
            let mode = match keys.mode {
                None => 0o660,
                Some(m) => e.check(m.span(), parse_mode(m.get_ref())).unwrap_or(0o660),
            };
            let perms = UnixPermissions {
                mode,
                owner: e.account(keys.owner, "owner"),
                group: e.account(keys.group, "group"),
            };
            Some(Bind::Unix { path, perms })
        }
    }
}

fn cidrs(e: &mut Errors, list: Option<&SpannedList>) -> Vec<Cidr> {
    list.map(|l| l.get_ref().as_slice())
        .unwrap_or_default()
        .iter()
        .filter_map(|c| e.check(c.span(), Cidr::parse(c.get_ref())))
        .collect()
}

fn listener(e: &mut Errors, l: &FileListen, server: &ServerConfig) -> Option<ListenerConfig> {
    let bind = bind(
        e,
        SocketKeys {
            address: &l.address,
            mode: l.mode.as_ref(),
            owner: l.owner.as_ref(),
            group: l.group.as_ref(),
            allow: l.allow.as_ref(),
        },
    );
    let backlog = match &l.backlog {
        None => 511,
        Some(b) if *b.get_ref() == 0 => {
            e.at(b.span(), "backlog must be at least 1");
            511
        }
        Some(b) => *b.get_ref(),
    };
    let forwarded = forwarded(e, l, bind.as_ref());
    if l.protocol != FrontProtocol::Http {
        let protocol = if l.protocol == FrontProtocol::Fastcgi {
            "FastCGI"
        } else {
            "SCGI"
        };
        let why = format!(
            "a {protocol} front server is trusted with every parameter it sends \
             (SCRIPT_FILENAME picks the script to run, PHP_VALUE changes PHP's settings)"
        );
        exposure(e, bind.as_ref(), &l.address, &why);
    }
    let timeouts = front_timeouts(
        e,
        server.front_timeouts,
        [
            l.header_timeout.as_ref(),
            l.idle_timeout.as_ref(),
            l.body_timeout.as_ref(),
            l.send_timeout.as_ref(),
            l.body_deadline.as_ref(),
        ],
    );
    let max_connections_per_client =
        match l.max_connections_per_client.unwrap_or(DEFAULT_PER_CLIENT) {
            0 => None,
            n => Some(n),
        };
    let mut fpm_path = |key: &str, value: Option<&Spanned<String>>| {
        let v = value?;
        let path = v.get_ref();
        if l.protocol != FrontProtocol::Fastcgi {
            e.at(
                v.span(),
                format!(
                    "{key} applies to fastcgi listeners only (php-fpm's status and ping paths)"
                ),
            );
            return None;
        }
        if !path.starts_with('/') || path.contains(['?', '#', ' ']) {
            e.at(
                v.span(),
                format!(
                    "{key} \"{path}\" must be a path starting with '/', without '?', '#' or spaces"
                ),
            );
            return None;
        }
        Some(path.clone())
    };
    let status_path = fpm_path("status_path", l.status_path.as_ref());
    let ping_path = fpm_path("ping_path", l.ping_path.as_ref());
    Some(ListenerConfig {
        bind: bind?,
        protocol: l.protocol,
        backlog,
        forwarded,
        max_connections_per_client,
        timeouts,
        status_path,
        ping_path,
    })
}

/// `forwarded` + `trusted_proxies`: which proxies may tell corral the client used HTTPS.
fn forwarded(e: &mut Errors, l: &FileListen, bind: Option<&Bind>) -> Option<ForwardedTrust> {
    let header = l.forwarded.as_ref();
    let trusted = l.trusted_proxies.as_ref();
    if l.protocol != FrontProtocol::Http {
        for span in [header.map(Spanned::span), trusted.map(Spanned::span)]
            .into_iter()
            .flatten()
        {
            e.at(
                span,
                "forwarded and trusted_proxies apply to http listeners only; a FastCGI or \
                 SCGI front server passes HTTPS itself",
            );
        }
        return None;
    }
    let proxies = cidrs(e, trusted);
    let unix = matches!(bind, Some(Bind::Unix { .. }));
    match (header.map(|h| (*h.get_ref(), h.span())), trusted) {
        (None | Some((ForwardedHeader::None, _)), Some(t)) => {
            e.at(
                t.span(),
                "trusted_proxies has no effect unless forwarded = \"x-forwarded\" or \
                 \"forwarded\" says which header to read",
            );
            None
        }
        (None | Some((ForwardedHeader::None, _)), None) => None,
        (Some((_, _)), Some(t)) if unix => {
            e.at(
                t.span(),
                "trusted_proxies does not apply to a unix: listener: its peers have no IP \
                 address, and the socket's mode, owner and group decide who is trusted",
            );
            None
        }
        (Some((h, span)), t) => {
            if !unix && t.is_none_or(|t| t.get_ref().is_empty()) {
                e.at(
                    span,
                    "forwarded on a TCP listener needs trusted_proxies, or any client could \
                     claim to be on HTTPS",
                );
            }
            Some(ForwardedTrust {
                header: h,
                trusted_proxies: proxies,
            })
        }
    }
}

fn status(e: &mut Errors, s: &FileStatus) -> Option<StatusConfig> {
    let bind = bind(
        e,
        SocketKeys {
            address: &s.address,
            mode: s.mode.as_ref(),
            owner: s.owner.as_ref(),
            group: s.group.as_ref(),
            allow: s.allow.as_ref(),
        },
    )?;
    exposure(
        e,
        Some(&bind),
        &s.address,
        "the status pages show every pool, worker and request in progress",
    );
    let allowed_hosts = s
        .allowed_hosts
        .as_ref()
        .map(|l| l.get_ref().as_slice())
        .unwrap_or_default()
        .iter()
        .filter_map(|h| {
            let name = h.get_ref().trim().to_ascii_lowercase();
            let fine = name == "*"
                || (!name.is_empty()
                    && name
                        .bytes()
                        .all(|b| b.is_ascii_alphanumeric() || b"-._:[]".contains(&b)));
            if !fine {
                e.at(
                    h.span(),
                    format!(
                        "allowed_hosts: {:?} is not a host name or address (or \"*\" for every \
                         Host)",
                        h.get_ref()
                    ),
                );
            }
            fine.then_some(name)
        })
        .collect();
    Some(StatusConfig {
        bind,
        allowed_hosts,
    })
}

/// A TCP socket that other hosts can reach must say who may connect: `allow` naming the
/// clients, or `allow = ["0.0.0.0/0"]` (`["::/0"]`) as the explicit word that everyone may.
/// Loopback addresses and Unix sockets (guarded by their mode) need no list.
fn exposure(e: &mut Errors, bind: Option<&Bind>, address: &Spanned<String>, why: &str) {
    let Some(Bind::Tcp { addr, allow }) = bind else {
        return;
    };
    if addr.ip().is_loopback() || !allow.is_empty() {
        return;
    }
    let everyone = if addr.is_ipv4() { "0.0.0.0/0" } else { "::/0" };
    e.at(
        address.span(),
        format!(
            "{addr} is reachable from other hosts and has no allow list, and {why}: add \
             allow = [...] naming the clients that may connect, or allow = [\"{everyone}\"] \
             to say explicitly that every client may"
        ),
    );
}

/// No two sockets may bind the same address, and an unspecified address (0.0.0.0, [::])
/// takes its port on every interface of its family ([::] on both, as Linux binds it
/// dual-stack by default).
fn check_distinct_sockets(e: &mut Errors, file: &FileConfig) {
    // Addresses that failed to parse were reported already and take no part.
    let mut seen: Vec<(ListenAddress, Range<usize>)> = Vec::new();
    let addresses = file
        .listen
        .iter()
        .map(|l| &l.address)
        .chain(file.status.as_ref().map(|s| &s.address));
    for spanned in addresses {
        let Ok(addr) = ListenAddress::parse(spanned.get_ref()) else {
            continue;
        };
        if let Some((other, first)) = seen.iter().find(|(other, _)| clash(other, &addr)) {
            let line = e.line_of(first.start);
            let message = if *other == addr {
                format!("address {addr} is already used on line {line}")
            } else {
                format!(
                    "address {addr} takes the same port as {other} on line {line} \
                     (0.0.0.0 and [::] bind every interface)"
                )
            };
            e.at(spanned.span(), message);
        }
        seen.push((addr, spanned.span()));
    }
}

/// Whether two sockets cannot both be bound.
fn clash(a: &ListenAddress, b: &ListenAddress) -> bool {
    match (a, b) {
        (ListenAddress::Unix(p), ListenAddress::Unix(q)) => p == q,
        (ListenAddress::Tcp(x), ListenAddress::Tcp(y)) => tcp_clash(x, y),
        _ => false,
    }
}

fn tcp_clash(x: &SocketAddr, y: &SocketAddr) -> bool {
    // Port 0 asks the kernel for a free port, a different one for each socket.
    if x.port() == 0 || y.port() == 0 {
        return false;
    }
    if x.port() != y.port() {
        return false;
    }
    let wide = |a: &SocketAddr, b: &SocketAddr| {
        a.ip().is_unspecified() && (a.is_ipv6() || a.is_ipv4() == b.is_ipv4())
    };
    x.ip() == y.ip() || wide(x, y) || wide(y, x)
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
