//! The converted configuration as commented TOML: the header, `[server]` from php-fpm's
//! `[global]` (and the per-pool settings corral keeps server-wide: the access and slow
//! logs), then each pool's tables. Values are written with the toml crate's own escaping.

use super::fpm::{Directive, Fpm};
use super::pool::PoolOut;
use super::Ctx;

/// Column where a mapped line's comment starts.
const COMMENT_COLUMN: usize = 32;

/// One TOML table and its lines, comments included.
pub struct Table {
    header: String,
    lines: Vec<String>,
}

impl Table {
    /// An empty table under `header` (`[server]`, `[[listen]]`, ...).
    pub fn new(header: &str) -> Table {
        Table {
            header: header.to_owned(),
            lines: Vec::new(),
        }
    }

    /// `key = value`, with `why` as its comment when not empty.
    pub fn set(&mut self, key: &str, value: &str, why: &str) {
        let line = format!("{key} = {value}");
        if why.is_empty() {
            self.lines.push(line);
        } else {
            let pad = COMMENT_COLUMN.saturating_sub(line.len()).max(1);
            self.lines
                .push(format!("{line}{}# {}", " ".repeat(pad), one_line(why)));
        }
    }

    /// A comment line.
    pub fn note(&mut self, text: &str) {
        self.lines.push(format!("# {}", one_line(text)));
    }

    fn write(&self, out: &mut String) {
        out.push_str(&self.header);
        out.push('\n');
        for l in &self.lines {
            out.push_str(l);
            out.push('\n');
        }
        out.push('\n');
    }
}

/// Text made safe for a comment: no line breaks or other control characters.
fn one_line(text: &str) -> String {
    text.chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect()
}

/// A TOML string.
pub fn string(s: &str) -> String {
    toml::Value::String(s.to_owned()).to_string()
}

/// A TOML array of strings.
pub fn array(items: &[String]) -> String {
    let items: Vec<String> = items.iter().map(|s| string(s)).collect();
    format!("[{}]", items.join(", "))
}

/// A TOML key: bare when it can be, quoted otherwise.
pub fn key(k: &str) -> String {
    let bare = !k.is_empty()
        && k.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
    if bare {
        k.to_owned()
    } else {
        string(k)
    }
}

/// The whole document.
pub fn document(fpm: &Fpm, pools: &[PoolOut], ctx: &Ctx) -> String {
    let mut out = String::new();
    out.push_str("# corral configuration converted from php-fpm's by `corral convert php-fpm`.\n");
    let files: Vec<String> = ctx
        .sources
        .iter()
        .map(|s| s.path.display().to_string())
        .collect();
    out.push_str(&format!("# Read: {}\n", one_line(&files.join(", "))));
    out.push_str(&format!(
        "# Relative paths were taken from php-fpm's prefix {} (--prefix).\n",
        one_line(&ctx.prefix.display().to_string())
    ));
    out.push_str(
        "# Each php-fpm pool is a FastCGI [[listen]] on its listen address (nginx's fastcgi_pass\n\
         # stays as it is), a php-cgi [pools.NAME] that corral spawns, sizes and recycles, and\n\
         # a [[contexts]] tying them, whose root corral's script guard checks every\n\
         # SCRIPT_FILENAME against. Lines php-fpm had that corral has no key for are comments\n\
         # saying why, and what is nearest.\n\
         # Check it with `corral check -c FILE`, run it with `corral run -c FILE`.\n\n",
    );
    match &ctx.php_ini.file {
        Some(ini) => out.push_str(&format!(
            "# php-cgi reads php-fpm's php.ini, {} (-c in each command; --php-ini none for its own).\n",
            one_line(&ini.display().to_string())
        )),
        None => out.push_str(
            "# php-cgi reads its own php.ini (Debian: /etc/php/VERSION/cgi/php.ini), not php-fpm's:\n\
             # compare them, or convert with --php-ini FILE.\n",
        ),
    }
    for (at, pattern, files) in &fpm.includes {
        let line = if files.is_empty() {
            format!(
                "{}: include = {pattern} matched nothing (php-fpm warns and goes on)",
                ctx.loc(at)
            )
        } else {
            format!(
                "{}: include = {pattern} read {} file(s)",
                ctx.loc(at),
                files.len()
            )
        };
        out.push_str(&format!("# {}\n", one_line(&line)));
    }
    let expanded: Vec<String> = fpm
        .global
        .iter()
        .chain(fpm.pools.iter().flat_map(|p| &p.directives))
        .flat_map(|d| d.value.expanded.iter().cloned())
        .collect();
    if !expanded.is_empty() {
        out.push_str(&format!(
            "# ${{...}} expanded from the environment when converting, as php-fpm does at start: {}\n",
            one_line(&expanded.join(", "))
        ));
    }
    out.push('\n');
    server(fpm, pools, ctx).write(&mut out);
    for p in pools {
        out.push_str(&format!("# ---- pool {} ----\n", p.name));
        for t in &p.tables {
            t.write(&mut out);
        }
    }
    out
}

/// `[server]`: php-fpm's globals, then what corral keeps server-wide from the pools.
fn server(fpm: &Fpm, pools: &[PoolOut], ctx: &Ctx) -> Table {
    let mut t = Table::new("[server]");
    t.note("runtime_dir = \"/run/corral\" (the default) holds the workers' sockets");
    let last = |name: &str| fpm.global.iter().rev().find(|d| d.name == name);
    for d in &fpm.global {
        if last(&d.name).is_some_and(|l| l.at != d.at) {
            t.note(&ctx.not_mapped(d, "overridden by a later line, as in php-fpm"));
            continue;
        }
        global(d, &mut t, ctx);
    }
    let mut seen: Vec<&str> = Vec::new();
    for p in pools {
        for (key, value, why) in &p.server {
            if seen.contains(key) {
                t.note(&format!(
                    "{why} = {value}: not mapped: corral has one {key} for every pool; the first pool's is used"
                ));
            } else {
                seen.push(key);
                t.set(key, value, why);
            }
        }
    }
    t
}

/// One `[global]` directive: mapped, or a comment.
fn global(d: &Directive, t: &mut Table, ctx: &Ctx) {
    let why = match d.name.as_str() {
        "log_level" => {
            let level = match d.text().as_str() {
                "alert" | "error" => "error",
                "warning" | "warn" => "warn",
                "debug" => "debug",
                _ => "info",
            };
            t.set("log_level", &string(level), &d.written());
            return;
        }
        "process_control_timeout" if d.number() > 0 => {
            let why = format!(
                "{}: how long a stop or reload waits for requests in flight",
                d.written()
            );
            t.set("grace", &string(&format!("{}s", d.number())), &why);
            return;
        }
        "process_control_timeout" => {
            "0 (php-fpm's default) is no bound; corral's grace (default 30s) bounds a stop or reload"
        }
        "pid" => "corral keeps its pid file, locked, in runtime_dir (corral.pid)",
        "error_log" => "corral logs to stderr (the journal under systemd)",
        "syslog.ident" | "syslog.facility" => {
            "corral logs to stderr; journald or rsyslog take it from there"
        }
        "log_buffering" => "corral writes each log event at once",
        "log_limit" => "corral splits a worker's output lines at 8192 bytes",
        "emergency_restart_threshold" | "emergency_restart_interval" => {
            "corral never restarts itself because workers crash: it restarts each crashed worker with a backoff"
        }
        "process.max" => "corral bounds each pool (max); there is no bound over all pools",
        "process.priority" => "corral sets no nice value; nearest: Nice= in its systemd unit",
        "daemonize" => "corral stays in the foreground (systemd Type=notify)",
        "rlimit_files" => {
            "corral raises its own soft file limit to the hard limit at start; nearest: LimitNOFILE= in its systemd unit"
        }
        "rlimit_core" => "nearest: LimitCORE= in corral's systemd unit",
        "events.mechanism" => "corral uses epoll",
        "systemd_interval" => {
            "corral sends systemd STATUS= as it changes and pings the watchdog (WatchdogSec= in its unit)"
        }
        _ => "corral has no such setting",
    };
    t.note(&ctx.not_mapped(d, why));
}
