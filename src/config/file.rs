//! The configuration file exactly as written: serde structs that mirror the TOML, with no
//! defaults applied and no rule checked beyond key names and value types.
//!
//! Every struct denies unknown keys (a misspelt key is an error, never silently ignored) and
//! `#[serde(flatten)]` is not used, because it turns that check off. Values that validation
//! may still reject keep their byte span (`Spanned`) so the error can point at them.
//! Field names are the TOML keys; what each means, and its default, is documented on the
//! validated types in `config` and in `conf/corral.toml`.

use std::collections::BTreeMap;
use std::fmt;

use serde::de::{self, Deserializer, Visitor};
use serde::Deserialize;
use toml::Spanned;

use super::diagnostic::ConfigError;
use super::{AccessFormat, BackendProtocol, ForwardedHeader, FrontProtocol, LogLevel, Scheduler};

/// A list whose items each keep their span, and which keeps its own.
pub type SpannedList = Spanned<Vec<Spanned<String>>>;

/// A table of strings whose keys and values keep their spans.
pub type SpannedTable = Spanned<BTreeMap<Spanned<String>, Spanned<String>>>;

/// The root of the file.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileConfig {
    pub server: Option<FileServer>,
    #[serde(default)]
    pub listen: Vec<FileListen>,
    pub status: Option<FileStatus>,
    #[serde(default)]
    pub pools: BTreeMap<Spanned<String>, Spanned<FilePool>>,
    #[serde(default)]
    pub contexts: Vec<Spanned<FileContext>>,
}

impl FileConfig {
    /// Reads the TOML; a syntax error comes back alone, every key and type error together,
    /// each located (`super::keys`).
    pub fn from_toml(src: &str, origin: &str) -> Result<Self, Vec<ConfigError>> {
        super::keys::read(src, origin)
    }
}

/// `[server]`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileServer {
    pub runtime_dir: Option<Spanned<String>>,
    pub user: Option<Spanned<String>>,
    pub group: Option<Spanned<String>>,
    pub grace: Option<Spanned<DurationText>>,
    pub shutdown_delay: Option<Spanned<DurationText>>,
    pub kill_timeout: Option<Spanned<DurationText>>,
    pub log_level: Option<LogLevel>,
    pub spool_budget: Option<Spanned<SizeText>>,
    pub max_connections: Option<Spanned<u32>>,
    pub threads: Option<Spanned<u32>>,
    pub scheduler: Option<Scheduler>,
    pub pin_threads: Option<Spanned<bool>>,
    pub sched_batch: Option<Spanned<bool>>,
    pub header_timeout: Option<Spanned<DurationText>>,
    pub idle_timeout: Option<Spanned<DurationText>>,
    pub body_timeout: Option<Spanned<DurationText>>,
    pub body_deadline: Option<Spanned<DurationText>>,
    pub send_timeout: Option<Spanned<DurationText>>,
    pub access_log: Option<Spanned<String>>,
    pub access_log_format: Option<AccessFormat>,
    pub slow_log: Option<Spanned<String>>,
    pub slow_threshold: Option<Spanned<DurationText>>,
}

/// `[[listen]]`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileListen {
    pub address: Spanned<String>,
    pub protocol: FrontProtocol,
    pub backlog: Option<Spanned<u32>>,
    pub mode: Option<Spanned<String>>,
    pub owner: Option<Spanned<String>>,
    pub group: Option<Spanned<String>>,
    pub allow: Option<SpannedList>,
    pub forwarded: Option<Spanned<ForwardedHeader>>,
    pub trusted_proxies: Option<SpannedList>,
    pub max_connections_per_client: Option<u32>,
    pub status_path: Option<Spanned<String>>,
    pub ping_path: Option<Spanned<String>>,
    pub header_timeout: Option<Spanned<DurationText>>,
    pub idle_timeout: Option<Spanned<DurationText>>,
    pub body_timeout: Option<Spanned<DurationText>>,
    pub body_deadline: Option<Spanned<DurationText>>,
    pub send_timeout: Option<Spanned<DurationText>>,
}

/// `[status]`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileStatus {
    pub address: Spanned<String>,
    pub mode: Option<Spanned<String>>,
    pub owner: Option<Spanned<String>>,
    pub group: Option<Spanned<String>>,
    pub allow: Option<SpannedList>,
    pub allowed_hosts: Option<SpannedList>,
}

/// `[pools.NAME]`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FilePool {
    pub protocol: Option<BackendProtocol>,
    pub command: Option<SpannedList>,
    pub servers: Option<SpannedList>,
    pub app: Option<Spanned<String>>,
    pub worker: Option<Spanned<String>>,
    pub worker_path: Option<Spanned<String>>,
    pub worker_script: Option<Spanned<String>>,
    pub python: Option<Spanned<String>>,
    pub virtualenv: Option<Spanned<String>>,
    pub ruby: Option<Spanned<String>>,
    pub preload: Option<Spanned<bool>>,
    pub refork_after: Option<Spanned<Vec<Spanned<u64>>>>,
    pub mode: Option<Spanned<FileMode>>,
    pub min: Option<Spanned<u32>>,
    pub max: Option<Spanned<u32>>,
    pub spare_min: Option<Spanned<u32>>,
    pub spare_max: Option<Spanned<u32>>,
    pub concurrency: Option<Spanned<u32>>,
    pub php_children: Option<Spanned<u32>>,
    pub accept: Option<Spanned<String>>,
    pub listener: Option<Spanned<String>>,
    pub max_conns: Option<Spanned<u32>>,
    pub queue_size: Option<u32>,
    pub queue_timeout: Option<Spanned<DurationText>>,
    pub connect_timeout: Option<Spanned<DurationText>>,
    pub first_byte_timeout: Option<Spanned<DurationText>>,
    pub request_timeout: Option<Spanned<DurationText>>,
    pub max_fails: Option<Spanned<u32>>,
    pub fail_timeout: Option<Spanned<DurationText>>,
    pub resolve_every: Option<Spanned<DurationText>>,
    pub start_timeout: Option<Spanned<DurationText>>,
    pub health_check: Option<Spanned<String>>,
    pub health_timeout: Option<Spanned<DurationText>>,
    pub max_requests: Option<Spanned<u64>>,
    pub max_requests_jitter: Option<Spanned<u64>>,
    pub max_memory: Option<Spanned<SizeText>>,
    pub max_pool_memory: Option<Spanned<SizeText>>,
    pub max_surge: Option<Spanned<u32>>,
    pub max_lifetime: Option<Spanned<DurationText>>,
    pub idle_timeout: Option<Spanned<DurationText>>,
    pub env: Option<SpannedTable>,
    pub cwd: Option<Spanned<String>>,
    pub user: Option<Spanned<String>>,
    pub group: Option<Spanned<String>>,
}

/// `pools.NAME.mode` as written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum FileMode {
    Static,
    Dynamic,
    Ondemand,
}

/// `[[contexts]]`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileContext {
    pub listen: Option<Spanned<String>>,
    pub prefix: Option<Spanned<String>>,
    pub extension: Option<Spanned<String>>,
    pub host: Option<Spanned<String>>,
    pub server_name: Option<Spanned<String>>,
    pub root: Option<Spanned<String>>,
    pub index: Option<SpannedList>,
    pub pool: Spanned<String>,
    pub max_conns: Option<Spanned<u32>>,
    pub static_files: Option<Spanned<bool>>,
    pub allow_php_value: Option<bool>,
    pub params: Option<SpannedTable>,
    pub max_body: Option<Spanned<SizeText>>,
    pub request_buffering: Option<bool>,
    pub front_controller: Option<Spanned<String>>,
    pub sendfile_dirs: Option<SpannedList>,
    pub accel_redirect: Option<SpannedTable>,
}

/// A duration as written ("30s"); parsed during validation so that every bad one is
/// reported, not just the first.
#[derive(Debug)]
pub struct DurationText(pub String);

/// A byte size as written ("256MiB", or a plain integer number of bytes).
#[derive(Debug)]
pub struct SizeText(pub String);

impl<'de> Deserialize<'de> for DurationText {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(TextVisitor {
            expecting: "a duration such as \"30s\" or \"1h30m\"",
            integers: false,
        })
        .map(DurationText)
    }
}

impl<'de> Deserialize<'de> for SizeText {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(TextVisitor {
            expecting: "a size such as \"256MiB\" or a number of bytes",
            integers: true,
        })
        .map(SizeText)
    }
}

/// Accepts a string (and, if `integers`, a non-negative integer as its decimal text), so a
/// wrong type is reported with what the key expects rather than "expected a string".
struct TextVisitor {
    expecting: &'static str,
    integers: bool,
}

impl Visitor<'_> for TextVisitor {
    type Value = String;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.expecting)
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<String, E> {
        Ok(v.to_owned())
    }

    fn visit_u64<E: de::Error>(self, v: u64) -> Result<String, E> {
        if self.integers {
            Ok(v.to_string())
        } else {
            Err(E::invalid_type(de::Unexpected::Unsigned(v), &self))
        }
    }

    fn visit_i64<E: de::Error>(self, v: i64) -> Result<String, E> {
        match u64::try_from(v) {
            Ok(v) => self.visit_u64(v),
            Err(_) => Err(E::invalid_type(de::Unexpected::Signed(v), &self)),
        }
    }
}
