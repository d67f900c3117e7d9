//! Validation of one `[pools.NAME]` table: what it runs (exactly one of `command`, `servers`,
//! `app`, `worker`; the program itself is checked in `app.rs`), how many workers and when (`mode` and its sizes), slots, queue, timeouts and
//! recycling. Defaults that depend on other keys are resolved here (`max_conns` from the
//! worker count, spare bounds clamped to `max`), so a default alone never causes an error.

use std::ops::Range;
use std::time::Duration;

use toml::Spanned;

use super::app::{launcher_rules, misplaced_interpreter, program};
use super::file::{FileMode, FilePool, SpannedList};
use super::units::{parse_duration, parse_size};
use super::validate::Errors;
use super::{
    Backend, BackendAddress, BackendProtocol, PoolConfig, Program, Recycle, ServerConfig, Sizing,
    SpawnConfig,
};

/// Longest pool name; names end up in worker socket paths and metric labels.
const MAX_NAME: usize = 32;

/// Default `max` for every mode: php-fpm's `www.conf` sample `pm.max_children`.
const DEFAULT_MAX: u32 = 5;

/// Smallest `max_memory` that is not a typo: no interpreter fits in less.
const MIN_MEMORY: u64 = 1 << 20;

/// Checks one pool. `None` when it cannot be built (the errors are recorded).
pub(super) fn pool(
    e: &mut Errors,
    name: &Spanned<String>,
    p: &Spanned<FilePool>,
    server: &ServerConfig,
) -> Option<PoolConfig> {
    let n = name.get_ref();
    let name_ok = check_name(e, name);
    let p = p.get_ref();

    let mut chosen: Vec<(&str, Range<usize>)> = [
        ("command", p.command.as_ref().map(Spanned::span)),
        ("servers", p.servers.as_ref().map(Spanned::span)),
        ("app", p.app.as_ref().map(Spanned::span)),
        ("worker", p.worker.as_ref().map(Spanned::span)),
    ]
    .into_iter()
    .filter_map(|(k, s)| Some((k, s?)))
    .collect();
    // `app = "wsgi:..."` with `worker = "native"` is one choice: the app on the native worker.
    if super::wsgi_native::paired(e, n, p) {
        chosen.retain(|(k, _)| *k != "worker");
    }
    // Report in the order written: the later key is the one to remove or move.
    chosen.sort_by_key(|(_, span)| span.start);
    match chosen.as_slice() {
        [] => e.at(
            name.span(),
            format!(
                "pool \"{n}\" runs nothing: set one of command = [...], servers = [...], \
                 app = \"wsgi:module:callable\" or worker = \"native\" (PHP)"
            ),
        ),
        [_] => {}
        [(first, _), rest @ ..] => {
            for (key, span) in rest {
                e.at(
                    span.clone(),
                    format!("pool \"{n}\" sets both {first} and {key}; set exactly one of command, servers, app, worker"),
                );
            }
        }
    }

    misplaced_interpreter(e, n, p);

    let backend = match (&p.servers, chosen.len()) {
        (Some(servers), 1) => external(e, n, p, servers),
        (None, 1) => spawned(e, n, p, server),
        _ => None,
    };
    let workers = match &backend {
        Some(Backend::Spawned(s)) => s.sizing.max(),
        Some(Backend::External { servers }) => u32::try_from(servers.len()).unwrap_or(u32::MAX),
        None => 1,
    };

    let concurrency = match &p.concurrency {
        Some(c) if *c.get_ref() == 0 => {
            e.at(c.span(), "concurrency must be at least 1");
            1
        }
        Some(c) => *c.get_ref(),
        None => 1,
    };
    let concurrency = super::php_children::concurrency(p, concurrency);
    let capacity = u64::from(workers) * u64::from(concurrency);
    let max_conns = match &p.max_conns {
        None => match u32::try_from(capacity) {
            Ok(c) => c,
            Err(_) => {
                e.at(
                    name.span(),
                    format!("pool \"{n}\": workers × concurrency is {capacity}, too many slots"),
                );
                1
            }
        },
        Some(m) if *m.get_ref() == 0 => {
            e.at(m.span(), "max_conns must be at least 1");
            1
        }
        Some(m) if u64::from(*m.get_ref()) > capacity && backend.is_some() => {
            e.at(
                m.span(),
                format!(
                    "max_conns {} is more than {workers} workers × concurrency {concurrency} \
                     can serve ({capacity})",
                    m.get_ref()
                ),
            );
            *m.get_ref()
        }
        Some(m) => *m.get_ref(),
    };

    let request_timeout = e.timeout(
        p.request_timeout.as_ref(),
        "request_timeout",
        Duration::from_secs(300),
    );
    let first_byte_timeout = e.timeout(
        p.first_byte_timeout.as_ref(),
        "first_byte_timeout",
        Duration::from_secs(60).min(request_timeout),
    );
    if first_byte_timeout > request_timeout {
        let span = p
            .first_byte_timeout
            .as_ref()
            .map_or_else(|| name.span(), Spanned::span);
        e.at(
            span,
            "first_byte_timeout is longer than request_timeout, so it would never fire",
        );
    }
    let config = PoolConfig {
        name: n.clone(),
        protocol: p.protocol.unwrap_or_else(|| default_protocol(p)),
        backend: backend?,
        concurrency,
        max_conns,
        queue_size: p.queue_size.unwrap_or(128),
        queue_timeout: e.timeout(
            p.queue_timeout.as_ref(),
            "queue_timeout",
            Duration::from_secs(5),
        ),
        connect_timeout: e.timeout(
            p.connect_timeout.as_ref(),
            "connect_timeout",
            Duration::from_secs(5),
        ),
        first_byte_timeout,
        request_timeout,
        max_fails: p.max_fails.as_ref().map_or(1, |m| *m.get_ref()),
        fail_timeout: e.timeout(
            p.fail_timeout.as_ref(),
            "fail_timeout",
            Duration::from_secs(10),
        ),
        resolve_every: e.timeout(
            p.resolve_every.as_ref(),
            "resolve_every",
            Duration::from_secs(5),
        ),
    };
    name_ok.then_some(config)
}

/// The protocol of a pool that names none: the embedded Rack and WSGI launchers and the
/// native PHP worker speak LSAPI, and a `command` or `servers` pool FastCGI (php-cgi,
/// php-fpm).
fn default_protocol(p: &FilePool) -> BackendProtocol {
    if p.app.is_some() || p.worker.is_some() {
        BackendProtocol::Lsapi
    } else {
        BackendProtocol::Fastcgi
    }
}

/// Pool names become parts of socket paths and metric labels.
fn check_name(e: &mut Errors, name: &Spanned<String>) -> bool {
    let n = name.get_ref();
    let ok = !n.is_empty()
        && n.len() <= MAX_NAME
        && n.chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
    if !ok {
        e.at(
            name.span(),
            format!("pool name \"{n}\" must be 1-{MAX_NAME} ASCII letters, digits, '_' or '-'"),
        );
    }
    ok
}

/// A pool of servers someone else runs: the keys about spawning make no sense there.
fn external(e: &mut Errors, n: &str, p: &FilePool, servers: &SpannedList) -> Option<Backend> {
    let spawn_only = [
        ("mode", p.mode.as_ref().map(Spanned::span)),
        ("min", p.min.as_ref().map(Spanned::span)),
        ("max", p.max.as_ref().map(Spanned::span)),
        ("spare_min", p.spare_min.as_ref().map(Spanned::span)),
        ("spare_max", p.spare_max.as_ref().map(Spanned::span)),
        ("max_requests", p.max_requests.as_ref().map(Spanned::span)),
        (
            "max_requests_jitter",
            p.max_requests_jitter.as_ref().map(Spanned::span),
        ),
        ("max_memory", p.max_memory.as_ref().map(Spanned::span)),
        (
            "max_pool_memory",
            p.max_pool_memory.as_ref().map(Spanned::span),
        ),
        ("max_surge", p.max_surge.as_ref().map(Spanned::span)),
        ("max_lifetime", p.max_lifetime.as_ref().map(Spanned::span)),
        ("idle_timeout", p.idle_timeout.as_ref().map(Spanned::span)),
        ("start_timeout", p.start_timeout.as_ref().map(Spanned::span)),
        ("health_check", p.health_check.as_ref().map(Spanned::span)),
        (
            "health_timeout",
            p.health_timeout.as_ref().map(Spanned::span),
        ),
        ("env", p.env.as_ref().map(Spanned::span)),
        ("cwd", p.cwd.as_ref().map(Spanned::span)),
        ("user", p.user.as_ref().map(Spanned::span)),
        ("group", p.group.as_ref().map(Spanned::span)),
        ("preload", p.preload.as_ref().map(Spanned::span)),
        ("refork_after", p.refork_after.as_ref().map(Spanned::span)),
    ];
    for (key, span) in spawn_only.into_iter().filter_map(|(k, s)| Some((k, s?))) {
        e.at(
            span,
            format!("{key} applies to pools corral spawns; pool \"{n}\" uses external servers"),
        );
    }
    if servers.get_ref().is_empty() {
        e.at(servers.span(), "servers must list at least one address");
        return None;
    }
    let mut list: Vec<BackendAddress> = Vec::new();
    for s in servers.get_ref() {
        let Some(addr) = e.check(s.span(), BackendAddress::parse(s.get_ref())) else {
            continue;
        };
        if list.contains(&addr) {
            e.at(s.span(), format!("server {addr} is listed twice"));
        }
        list.push(addr);
    }
    Some(Backend::External { servers: list })
}

/// A pool whose workers corral spawns and supervises.
fn spawned(e: &mut Errors, n: &str, p: &FilePool, server: &ServerConfig) -> Option<Backend> {
    // A spawned worker that fails is replaced, not waited for.
    let servers_only = [
        ("max_fails", p.max_fails.as_ref().map(Spanned::span)),
        ("fail_timeout", p.fail_timeout.as_ref().map(Spanned::span)),
        ("resolve_every", p.resolve_every.as_ref().map(Spanned::span)),
    ];
    for (key, span) in servers_only.into_iter().filter_map(|(k, s)| Some((k, s?))) {
        e.at(
            span,
            format!(
                "{key} applies to pools of servers (servers = [...]); pool \"{n}\" is spawned \
                 by corral, which replaces a worker that fails"
            ),
        );
    }
    let program = program(e, p);
    let sizing = sizing(e, n, p);
    let mut recycle = recycle(e, p);
    recycle.max_pool_memory = super::budget::max_pool_memory(e, p);
    recycle.max_surge = super::budget::max_surge(e, p, &sizing);
    let protocol = p.protocol.unwrap_or_else(|| default_protocol(p));
    let php_children =
        super::php_children::php_children(e, p, protocol, program.as_ref(), &mut recycle);
    let env = e.string_table(
        p.env.as_ref(),
        "env",
        |k| !k.is_empty() && !k.contains(['=', '\0']),
        "names are non-empty and hold no '=' or NUL",
    );
    for (key, rule) in [
        (
            "PHP_FCGI_CHILDREN",
            "use php_children, which corral accounts for",
        ),
        (
            "PHP_FCGI_MAX_REQUESTS",
            "use max_requests so corral recycles workers between requests",
        ),
    ] {
        let set = p
            .env
            .as_ref()
            .and_then(|t| t.get_ref().iter().find(|(k, _)| k.get_ref() == key));
        if let Some((_, v)) = set.filter(|(_, v)| v.get_ref().trim() != "0") {
            e.at(
                v.span(),
                format!("env {key} must be unset or 0: {rule}; php-cgi would otherwise exit or fork on its own"),
            );
        }
    }
    let cwd = p.cwd.as_ref().and_then(|c| e.absolute_path(c, "cwd"));
    let is_app = p.app.is_some();
    if let Some(app) = p.app.as_ref() {
        launcher_rules(
            e,
            p,
            app.span(),
            "an app = ... pool",
            "the embedded launchers speak",
        );
    }
    if let Some(worker) = p.worker.as_ref().filter(|_| !is_app) {
        launcher_rules(
            e,
            p,
            worker.span(),
            "a worker = \"native\" pool",
            "the native PHP worker speaks",
        );
    }
    // The native PHP worker forks its workers from one started PHP (one OPcache segment,
    // MINIT once), as the launchers fork theirs from one loaded app.
    let forks = is_app || matches!(program, Some(Program::PhpNative { .. }));
    let preload = match &p.preload {
        Some(v) if !forks => {
            e.at(
                v.span(),
                "preload needs app = \"wsgi:...\" or \"rack:...\", or worker = \"native\": only the embedded launchers and the native PHP worker can load once and fork workers",
            );
            false
        }
        Some(v) => *v.get_ref(),
        None => forks,
    };
    recycle.refork_after = super::refork::refork_after(e, p, preload, program.as_ref());
    let user = e.account(p.user.as_ref(), "user");
    let group = e.account(p.group.as_ref(), "group");
    Some(Backend::Spawned(Box::new(SpawnConfig {
        program: program?,
        sizing,
        recycle,
        start_timeout: e.timeout(
            p.start_timeout.as_ref(),
            "start_timeout",
            Duration::from_secs(30),
        ),
        health_check: super::health::health_check(e, p),
        env,
        cwd,
        user: user.or_else(|| server.user.clone()),
        group: group.or_else(|| server.group.clone()),
        preload,
        php_children,
        direct: None,
    })))
}

fn sizing(e: &mut Errors, n: &str, p: &FilePool) -> Sizing {
    let max = match &p.max {
        Some(m) if *m.get_ref() == 0 => {
            e.at(
                m.span(),
                "max must be at least 1: a pool with no worker serves nothing",
            );
            1
        }
        Some(m) => *m.get_ref(),
        None => DEFAULT_MAX,
    };
    let mode = p.mode.as_ref().map_or(FileMode::Dynamic, |m| *m.get_ref());
    let idle_timeout = e.timeout(
        p.idle_timeout.as_ref(),
        "idle_timeout",
        Duration::from_secs(10),
    );
    if mode != FileMode::Dynamic {
        for (key, v) in [("spare_min", &p.spare_min), ("spare_max", &p.spare_max)] {
            if let Some(v) = v {
                e.at(
                    v.span(),
                    format!("{key} applies to mode = \"dynamic\" pools only"),
                );
            }
        }
    }
    match mode {
        FileMode::Static => {
            if let Some(min) = p.min.as_ref().filter(|m| *m.get_ref() != max) {
                e.at(
                    min.span(),
                    format!(
                        "a static pool runs exactly max ({max}) workers; remove min or set it to {max}"
                    ),
                );
            }
            if let Some(t) = &p.idle_timeout {
                e.at(
                    t.span(),
                    "idle_timeout does not apply to a static pool: it never shrinks",
                );
            }
            Sizing::Static { workers: max }
        }
        FileMode::Ondemand => {
            if let Some(min) = p.min.as_ref().filter(|m| *m.get_ref() != 0) {
                e.at(
                    min.span(),
                    "an ondemand pool starts from zero workers: min must be 0 (or use mode = \"dynamic\")",
                );
            }
            Sizing::OnDemand { max, idle_timeout }
        }
        FileMode::Dynamic => {
            let value = |v: &Option<Spanned<u32>>, default: u32| {
                v.as_ref().map_or(default, |v| *v.get_ref())
            };
            let min = value(&p.min, 1.min(max));
            let spare_max = value(&p.spare_max, 3.min(max));
            let spare_min = value(&p.spare_min, 1.min(spare_max));
            // Each rule points at a key the user wrote; a default never breaks one alone.
            let at = |a: &Option<Spanned<u32>>, b: &Option<Spanned<u32>>| {
                a.as_ref().or(b.as_ref()).map(Spanned::span)
            };
            let rules = [
                (min > max, at(&p.min, &p.max), format!("pool \"{n}\": min {min} is greater than max {max}")),
                (spare_max > max, at(&p.spare_max, &p.max), format!("pool \"{n}\": spare_max {spare_max} is greater than max {max}")),
                (spare_min > spare_max, at(&p.spare_min, &p.spare_max), format!("pool \"{n}\": spare_min {spare_min} is greater than spare_max {spare_max}")),
                (spare_min == 0, at(&p.spare_min, &p.spare_max), "spare_min must be at least 1 in a dynamic pool (to start from zero, use mode = \"ondemand\")".to_owned()),
            ];
            for (broken, span, message) in rules {
                if let (true, Some(span)) = (broken, span) {
                    e.at(span, message);
                }
            }
            Sizing::Dynamic {
                min,
                max,
                spare_min,
                spare_max,
                idle_timeout,
            }
        }
    }
}

fn recycle(e: &mut Errors, p: &FilePool) -> Recycle {
    let max_requests = p
        .max_requests
        .as_ref()
        .map(|m| *m.get_ref())
        .filter(|&m| m > 0);
    let max_requests_jitter = match (&p.max_requests_jitter, max_requests) {
        (None, m) => m.map_or(0, |m| m / 10),
        (Some(j), None) if *j.get_ref() > 0 => {
            e.at(j.span(), "max_requests_jitter needs max_requests");
            0
        }
        (Some(j), Some(m)) if *j.get_ref() >= m => {
            e.at(
                j.span(),
                format!("max_requests_jitter must be smaller than max_requests ({m})"),
            );
            0
        }
        (Some(j), _) => *j.get_ref(),
    };
    let max_memory = p.max_memory.as_ref().and_then(|m| {
        let bytes = e.check(m.span(), parse_size(&m.get_ref().0))?;
        if bytes > 0 && bytes < MIN_MEMORY {
            e.at(m.span(), format!("max_memory of {bytes} bytes is smaller than any interpreter; did you mean MiB?"));
        }
        Some(bytes).filter(|&b| b > 0)
    });
    let max_lifetime = p.max_lifetime.as_ref().and_then(|m| {
        e.check(m.span(), parse_duration(&m.get_ref().0))
            .filter(|d| !d.is_zero())
    });
    Recycle {
        max_requests,
        max_requests_jitter,
        max_memory,
        max_lifetime,
        max_pool_memory: None,
        max_surge: None,
        refork_after: super::ReforkSteps::NONE,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_launcher_defaults_to_the_protocol_it_speaks() {
        let parse = |text: &str| -> FilePool { toml::from_str(text).unwrap() };
        assert_eq!(
            default_protocol(&parse("app = \"rack:config.ru\"")),
            BackendProtocol::Lsapi
        );
        assert_eq!(
            default_protocol(&parse("app = \"wsgi:app:application\"")),
            BackendProtocol::Lsapi
        );
        assert_eq!(
            default_protocol(&parse("worker = \"native\"")),
            BackendProtocol::Lsapi
        );
        assert_eq!(
            default_protocol(&parse("command = [\"php-cgi\"]")),
            BackendProtocol::Fastcgi
        );
    }
}
