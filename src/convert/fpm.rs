//! php-fpm's configuration as php-fpm understands it, built from what `load` read: a
//! `[global]` section and pools (a section named again reopens its pool, names compared
//! without case, as php-fpm does), each directive checked against php-fpm's own list (an
//! unknown one is the error php-fpm gives, "unknown entry"), `$pool` expanded in a pool's
//! values (and refused in `[global]`), and each value typed as php-fpm types it: integers,
//! times (`s`, `m`, `h`, `d`), booleans (`1` or empty after the INI parser), `pm`, `log_level`.
//! The rules php-fpm checks only once every pool is read (listen, pm and its counts) are the
//! mapping's, in `pool.rs`.

use std::path::PathBuf;

use super::ini::{Line, Value};
use super::load::{At, Item, Loaded};

/// How php-fpm types a directive's value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Str,
    Int,
    Time,
    Bool,
    Pm,
    LogLevel,
    RlimitCore,
}

/// `[global]`'s directives and their kinds (php-fpm's `ini_fpm_global_options`).
const GLOBAL: &[(&str, Kind)] = &[
    ("pid", Kind::Str),
    ("error_log", Kind::Str),
    ("syslog.ident", Kind::Str),
    ("syslog.facility", Kind::Str),
    ("log_buffering", Kind::Bool),
    ("log_level", Kind::LogLevel),
    ("log_limit", Kind::Int),
    ("emergency_restart_threshold", Kind::Int),
    ("emergency_restart_interval", Kind::Time),
    ("process_control_timeout", Kind::Time),
    ("process.max", Kind::Int),
    ("process.priority", Kind::Int),
    ("daemonize", Kind::Bool),
    ("rlimit_files", Kind::Int),
    ("rlimit_core", Kind::RlimitCore),
    ("events.mechanism", Kind::Str),
    ("systemd_interval", Kind::Time),
];

/// A pool's directives and their kinds (php-fpm's `ini_fpm_pool_options`).
const POOL: &[(&str, Kind)] = &[
    ("prefix", Kind::Str),
    ("user", Kind::Str),
    ("group", Kind::Str),
    ("listen", Kind::Str),
    ("listen.backlog", Kind::Int),
    ("listen.acl_users", Kind::Str),
    ("listen.acl_groups", Kind::Str),
    ("listen.owner", Kind::Str),
    ("listen.group", Kind::Str),
    ("listen.mode", Kind::Str),
    ("listen.allowed_clients", Kind::Str),
    ("listen.setfib", Kind::Int),
    ("process.priority", Kind::Int),
    ("process.dumpable", Kind::Bool),
    ("pm", Kind::Pm),
    ("pm.max_children", Kind::Int),
    ("pm.start_servers", Kind::Int),
    ("pm.min_spare_servers", Kind::Int),
    ("pm.max_spare_servers", Kind::Int),
    ("pm.max_spawn_rate", Kind::Int),
    ("pm.process_idle_timeout", Kind::Time),
    ("pm.max_requests", Kind::Int),
    ("pm.status_path", Kind::Str),
    ("pm.status_listen", Kind::Str),
    ("ping.path", Kind::Str),
    ("ping.response", Kind::Str),
    ("access.log", Kind::Str),
    ("access.format", Kind::Str),
    ("slowlog", Kind::Str),
    ("request_slowlog_timeout", Kind::Time),
    ("request_slowlog_trace_depth", Kind::Int),
    ("request_terminate_timeout", Kind::Time),
    ("request_terminate_timeout_track_finished", Kind::Bool),
    ("rlimit_files", Kind::Int),
    ("rlimit_core", Kind::RlimitCore),
    ("chroot", Kind::Str),
    ("chdir", Kind::Str),
    ("catch_workers_output", Kind::Bool),
    ("decorate_workers_output", Kind::Bool),
    ("clear_env", Kind::Bool),
    ("security.limit_extensions", Kind::Str),
    ("apparmor_hat", Kind::Str),
];

/// The array directives (`name[key] = value`), names compared with case as php-fpm does.
const ARRAYS: &[&str] = &[
    "env",
    "php_value",
    "php_admin_value",
    "php_flag",
    "php_admin_flag",
    "access.suppress_path",
];

/// A directive's value as php-fpm would hold it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Typed {
    /// A string (`$pool` expanded in a pool).
    Str(String),
    /// An integer.
    Int(i64),
    /// A time in seconds.
    Secs(i64),
    /// A boolean.
    Bool(bool),
}

/// One directive as read.
#[derive(Debug, Clone)]
pub struct Directive {
    /// Where it is.
    pub at: At,
    /// Its name, lower-cased for scalars (php-fpm compares them without case).
    pub name: String,
    /// The key of an array directive.
    pub index: Option<String>,
    /// The value as PHP's INI parser read it (before `$pool`).
    pub value: Value,
    /// The value as php-fpm types it.
    pub typed: Typed,
}

impl Directive {
    /// The value as text (`$pool` expanded for strings).
    pub fn text(&self) -> String {
        match &self.typed {
            Typed::Str(s) => s.clone(),
            Typed::Int(n) | Typed::Secs(n) => n.to_string(),
            Typed::Bool(b) => if *b { "yes" } else { "no" }.to_owned(),
        }
    }

    /// How it was written, for comments: `name = value` or `name[key] = value`.
    pub fn written(&self) -> String {
        match &self.index {
            Some(k) => format!("{}[{k}] = {}", self.name, self.value.text),
            None => format!("{} = {}", self.name, self.value.text),
        }
    }

    /// The number of an integer or time directive (0 for any other).
    pub fn number(&self) -> i64 {
        match self.typed {
            Typed::Int(n) | Typed::Secs(n) => n,
            _ => 0,
        }
    }

    /// The truth of a boolean directive (false for any other).
    pub fn flag(&self) -> bool {
        matches!(self.typed, Typed::Bool(true))
    }
}

/// One pool: its name as first written and its directives in order.
#[derive(Debug)]
pub struct Pool {
    /// The section name.
    pub name: String,
    /// Where its section header first is.
    pub at: At,
    /// Every directive in it, in order (a later one of a name overrides an earlier one).
    pub directives: Vec<Directive>,
}

impl Pool {
    /// The directive php-fpm uses for `name`: the last one given.
    pub fn get(&self, name: &str) -> Option<&Directive> {
        self.directives
            .iter()
            .rev()
            .find(|d| d.index.is_none() && d.name == name)
    }
}

/// The whole configuration.
#[derive(Debug, Default)]
pub struct Fpm {
    /// `[global]`'s directives in order.
    pub global: Vec<Directive>,
    /// The pools in the order they first appear.
    pub pools: Vec<Pool>,
    /// Every include: where, the pattern, the files it matched.
    pub includes: Vec<(At, String, Vec<PathBuf>)>,
}

/// A directive php-fpm would refuse, and where.
#[derive(Debug)]
pub struct FpmError {
    /// The line.
    pub at: At,
    /// What is wrong.
    pub message: String,
}

/// Builds the configuration from what was read, refusing what php-fpm would refuse while
/// reading.
pub fn build(loaded: &Loaded) -> Result<Fpm, FpmError> {
    let mut fpm = Fpm::default();
    // `None`: [global] (also before any section, as in php-fpm).
    let mut current: Option<usize> = None;
    for (at, item) in &loaded.items {
        let err = |message: String| FpmError {
            at: at.clone(),
            message,
        };
        match item {
            Item::Include { pattern, files } => {
                fpm.includes
                    .push((at.clone(), pattern.clone(), files.clone()));
            }
            Item::Line(Line::Blank) => {}
            Item::Line(Line::Section(name)) => {
                current = if name.eq_ignore_ascii_case("global") {
                    None
                } else if let Some(i) = fpm
                    .pools
                    .iter()
                    .position(|p| p.name.eq_ignore_ascii_case(name))
                {
                    Some(i)
                } else {
                    fpm.pools.push(Pool {
                        name: name.clone(),
                        at: at.clone(),
                        directives: Vec::new(),
                    });
                    Some(fpm.pools.len() - 1)
                };
            }
            Item::Line(Line::Entry { name, index, value }) => {
                let pool = current
                    .and_then(|i| fpm.pools.get(i))
                    .map(|p| p.name.clone());
                let directive = match index {
                    None => scalar(name, value, pool.as_deref()),
                    Some(key) => array(name, key, value, pool.as_deref()),
                }
                .map_err(err)?;
                let directive = Directive {
                    at: at.clone(),
                    ..directive
                };
                match current.and_then(|i| fpm.pools.get_mut(i)) {
                    Some(p) => p.directives.push(directive),
                    None => fpm.global.push(directive),
                }
            }
        }
    }
    Ok(fpm)
}

/// A placeholder location, replaced by the caller.
fn nowhere() -> At {
    At {
        source: 0,
        span: 0..0,
    }
}

fn scalar(name: &str, value: &Value, pool: Option<&str>) -> Result<Directive, String> {
    let lower = name.to_ascii_lowercase();
    let table = if pool.is_some() { POOL } else { GLOBAL };
    let Some(&(_, kind)) = table.iter().find(|(n, _)| *n == lower) else {
        let section = pool.map_or_else(|| "[global]".to_owned(), |p| format!("pool [{p}]"));
        let other = if pool.is_some() { GLOBAL } else { POOL };
        let hint = if other.iter().any(|(n, _)| *n == lower) {
            if pool.is_some() {
                " (it belongs in [global])".to_owned()
            } else {
                " (it belongs in a pool's section)".to_owned()
            }
        } else {
            table
                .iter()
                .map(|(n, _)| (edits(&lower, n), *n))
                .filter(|(d, _)| *d <= 2)
                .min()
                .map_or_else(String::new, |(_, n)| format!("; did you mean '{n}'?"))
        };
        return Err(format!(
            "unknown entry '{name}' in {section} (php-fpm refuses it too){hint}"
        ));
    };
    let text = value.fpm();
    let bad = |what: &str| format!("unable to parse value for entry '{lower}': {what}");
    let typed = match kind {
        Kind::Str => Typed::Str(expand_pool(text, pool).map_err(|m| bad(&m))?),
        Kind::Int => Typed::Int(integer(text).ok_or_else(|| bad("is not a valid number"))?),
        Kind::Time => Typed::Secs(time(text).ok_or_else(|| {
            bad("is not a time (a number of seconds, or with the suffix s, m, h or d)")
        })?),
        Kind::Bool => Typed::Bool(boolean(text).ok_or_else(|| bad("invalid boolean value"))?),
        Kind::Pm => {
            let pm = text.to_ascii_lowercase();
            if !matches!(pm.as_str(), "static" | "dynamic" | "ondemand") {
                return Err(bad("invalid process manager (static, dynamic or ondemand)"));
            }
            Typed::Str(pm)
        }
        Kind::LogLevel => {
            let level = text.to_ascii_lowercase();
            if !matches!(
                level.as_str(),
                "debug" | "notice" | "warning" | "warn" | "error" | "alert"
            ) {
                return Err(bad("invalid value for 'log_level'"));
            }
            Typed::Str(level)
        }
        Kind::RlimitCore => {
            if text.eq_ignore_ascii_case("unlimited") {
                Typed::Int(-1)
            } else {
                match integer(text) {
                    Some(n) if n >= 0 => Typed::Int(n),
                    _ => return Err(bad("must be greater than zero or 'unlimited'")),
                }
            }
        }
    };
    Ok(Directive {
        at: nowhere(),
        name: lower,
        index: None,
        value: value.clone(),
        typed,
    })
}

fn array(name: &str, key: &str, value: &Value, pool: Option<&str>) -> Result<Directive, String> {
    if !ARRAYS.contains(&name) {
        return Err(format!("unknown directive '{name}'"));
    }
    let Some(pool) = pool else {
        return Err("arrays are not allowed in the [global] section".to_owned());
    };
    if name == "access.suppress_path" {
        if !key.is_empty() {
            return Err("keys given to 'access.suppress_path' are ignored by php-fpm".to_owned());
        }
        if !value.fpm().starts_with('/') {
            return Err("values of 'access.suppress_path' must begin with '/'".to_owned());
        }
    } else if key.is_empty() {
        return Err(format!("you must give a key for '{name}'"));
    }
    let text = value.fpm();
    let typed = if name.ends_with("_flag") {
        match boolean(text) {
            Some(b) => Typed::Bool(b),
            None => {
                return Err(format!(
                    "error while parsing '{name}[{key}]': invalid boolean value"
                ))
            }
        }
    } else {
        if name == "env" && text.is_empty() {
            return Err(format!(
                "env[{key}] has an empty value, which php-fpm refuses"
            ));
        }
        Typed::Str(expand_pool(text, Some(pool))?)
    };
    Ok(Directive {
        at: nowhere(),
        name: name.to_owned(),
        index: Some(key.to_owned()),
        value: value.clone(),
        typed,
    })
}

/// The edit distance between two short names (insertions, deletions, substitutions).
fn edits(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut diagonal = row[0];
        row[0] = i + 1;
        for (j, cb) in b.iter().enumerate() {
            let above = row[j + 1];
            row[j + 1] = (above + 1)
                .min(row[j] + 1)
                .min(diagonal + usize::from(ca != *cb));
            diagonal = above;
        }
    }
    row[b.len()]
}

/// `$pool` replaced by the pool's name; an error outside a pool, as in php-fpm.
fn expand_pool(text: &str, pool: Option<&str>) -> Result<String, String> {
    if !text.contains("$pool") {
        return Ok(text.to_owned());
    }
    match pool {
        Some(name) => Ok(text.replace("$pool", name)),
        None => Err("'$pool' cannot be used outside a pool's section".to_owned()),
    }
}

/// php-fpm's integers: digits with an optional leading '-' (the empty text is 0).
fn integer(text: &str) -> Option<i64> {
    let digits = text.strip_prefix('-').unwrap_or(text);
    if !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    if digits.is_empty() {
        return Some(0);
    }
    let n: i64 = digits.parse().ok().filter(|&n| n <= i64::from(i32::MAX))?;
    Some(if text.starts_with('-') { -n } else { n })
}

/// php-fpm's times: a number of seconds, or with the suffix s, m, h or d.
fn time(text: &str) -> Option<i64> {
    let (number, unit) = match text.as_bytes().last()? {
        b's' => (&text[..text.len() - 1], 1),
        b'm' => (&text[..text.len() - 1], 60),
        b'h' => (&text[..text.len() - 1], 3600),
        b'd' => (&text[..text.len() - 1], 86_400),
        _ => (text, 1),
    };
    if number.is_empty() || number.starts_with('-') {
        return None;
    }
    integer(number)?.checked_mul(unit)
}

/// php-fpm's booleans: the INI parser's `1` or empty text.
fn boolean(text: &str) -> Option<bool> {
    match text {
        "1" => Some(true),
        "" => Some(false),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::convert::load::Reader;

    fn build_text(text: &str) -> Result<Fpm, String> {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("php-fpm.conf");
        std::fs::write(&path, text).unwrap();
        let none = |_: &str| None;
        let reader = Reader {
            prefix: dir.path().to_owned(),
            env: &none,
        };
        let loaded = reader.read_all(&[path]).map_err(|e| e.message)?;
        build(&loaded).map_err(|e| e.message)
    }

    #[test]
    fn sections_reopen_pools_and_pool_expands() {
        let fpm = build_text(
            "[global]\npid = /run/x.pid\n[www]\nlisten = /run/$pool.sock\n\
             [WWW]\nuser = www-data\nphp_admin_value[error_log] = /var/log/$pool.log\n",
        )
        .unwrap();
        assert_eq!(fpm.global.len(), 1);
        assert_eq!(fpm.pools.len(), 1);
        let www = &fpm.pools[0];
        assert_eq!(www.get("listen").unwrap().text(), "/run/www.sock");
        assert_eq!(www.get("user").unwrap().text(), "www-data");
        assert_eq!(www.directives[2].text(), "/var/log/www.log");
    }

    #[test]
    fn values_are_typed_as_php_fpm_types_them() {
        let fpm = build_text(
            "[a]\nrequest_terminate_timeout = 2m\npm.max_children = 7\n\
             catch_workers_output = yes\nclear_env = no\nPM = OnDemand\nphp_flag[x] = on\n",
        )
        .unwrap();
        let a = &fpm.pools[0];
        assert_eq!(a.get("request_terminate_timeout").unwrap().number(), 120);
        assert_eq!(a.get("pm.max_children").unwrap().number(), 7);
        assert!(a.get("catch_workers_output").unwrap().flag());
        assert!(!a.get("clear_env").unwrap().flag());
        assert_eq!(a.get("pm").unwrap().text(), "ondemand");
        assert_eq!(a.directives[5].typed, Typed::Bool(true));
    }

    #[test]
    fn what_php_fpm_refuses_is_refused() {
        for (text, needle) in [
            (
                "[www]\nlisten.ownr = x\n",
                "unknown entry 'listen.ownr' in pool [www] (php-fpm refuses it too); did you mean 'listen.owner'?",
            ),
            ("[www]\npid = /run/x.pid\n", "belongs in [global]"),
            ("pm = static\n", "belongs in a pool's section"),
            ("[www]\npm = lazy\n", "invalid process manager"),
            ("[www]\npm.max_children = five\n", "not a valid number"),
            ("[www]\nrequest_terminate_timeout = 10w\n", "is not a time"),
            ("[www]\nclear_env = maybe\n", "invalid boolean"),
            (
                "[global]\nerror_log = /var/log/$pool.log\n",
                "'$pool' cannot be used",
            ),
            (
                "[global]\nlog_level = loud\n",
                "invalid value for 'log_level'",
            ),
            ("env[X] = 1\n", "not allowed in the [global]"),
            ("[www]\nphp_valu[x] = 1\n", "unknown directive 'php_valu'"),
            ("[www]\nenv[] = 1\n", "you must give a key"),
            ("[www]\nenv[X] =\n", "empty value"),
            ("[www]\nphp_flag[x] = maybe\n", "invalid boolean"),
            (
                "[www]\npm.max_children = 99999999999\n",
                "not a valid number",
            ),
        ] {
            let e = build_text(text).expect_err(text);
            assert!(e.contains(needle), "{text:?}: {e}");
        }
    }
}
