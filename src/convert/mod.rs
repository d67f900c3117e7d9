//! `corral convert php-fpm FILE...`: php-fpm's configuration (the global `php-fpm.conf`,
//! `pool.d/*.conf`) read as php-fpm reads it and printed as a commented corral configuration
//! that `corral check` accepts, in gateway mode: each pool a FastCGI listener on its `listen`
//! address in front of a php-cgi pool.
//!
//! The parts: `ini.rs` (one line of PHP's INI syntax), `load.rs` (files, `include` globs,
//! bounds), `fpm.rs` (sections, directives and their types as php-fpm has them), `pool.rs`
//! (one pool's mapping, with `listen.rs` and `sizing.rs` for its listener and its process
//! manager), `emit.rs` (the TOML). A line php-fpm would refuse is an error naming
//! `FILE:LINE:COL`; the output is validated as `corral check` would before it is printed.

mod emit;
mod fpm;
mod ini;
mod listen;
mod load;
mod pool;
mod sizing;

use std::path::{Path, PathBuf};

use crate::config::ConfigError;
use crate::error::Error;

/// `corral convert`'s formats.
#[derive(Debug, clap::Subcommand)]
pub enum ConvertFrom {
    /// php-fpm's INI configuration: FILE... are read in order, as if each included the
    /// next (usually php-fpm.conf alone, which includes pool.d/*.conf).
    PhpFpm(PhpFpmArgs),
}

/// `corral convert php-fpm`'s arguments.
#[derive(Debug, clap::Args)]
pub struct PhpFpmArgs {
    /// php-fpm's configuration files (php-fpm.conf, or pool files).
    #[arg(required = true, value_name = "FILE")]
    pub files: Vec<PathBuf>,
    /// php-fpm's prefix (its -p), which relative paths are taken from.
    #[arg(long, value_name = "DIR", default_value = "/usr")]
    pub prefix: PathBuf,
    /// The document root the front server sends scripts from: corral's script guard runs
    /// only real .php files under it (php-fpm has no such setting).
    #[arg(long, value_name = "DIR", default_value = "/var/www/html")]
    pub root: String,
    /// The php-cgi program the pools run.
    #[arg(long, value_name = "PROGRAM", default_value = "php-cgi")]
    pub php_cgi: String,
    /// The php.ini the pools' php-cgi reads (`-c`), or `none` for php-cgi's own; by default
    /// php-fpm's: the php.ini beside the first FILE (or beside its pool.d), with the conf.d
    /// there as PHP_INI_SCAN_DIR.
    #[arg(long, value_name = "FILE|none")]
    pub php_ini: Option<String>,
}

/// The php.ini (and its conf.d) the pools' php-cgi is pointed at.
#[derive(Debug, Default)]
pub struct PhpIni {
    file: Option<PathBuf>,
    scan_dir: Option<PathBuf>,
}

impl PhpIni {
    /// What `--php-ini` says, or php-fpm's own php.ini and conf.d next to `first`.
    fn choose(option: Option<&str>, first: Option<&Path>) -> PhpIni {
        match option {
            Some("none") => return PhpIni::default(),
            Some(file) => {
                return PhpIni {
                    file: Some(PathBuf::from(file)),
                    scan_dir: None,
                }
            }
            None => {}
        }
        let Some(dir) = first.and_then(Path::parent) else {
            return PhpIni::default();
        };
        let dir = if dir.file_name().is_some_and(|n| n == "pool.d") {
            dir.parent().unwrap_or(dir)
        } else {
            dir
        };
        let ini = dir.join("php.ini");
        if !ini.is_file() {
            return PhpIni::default();
        }
        let conf_d = dir.join("conf.d");
        PhpIni {
            file: Some(ini),
            scan_dir: conf_d.is_dir().then_some(conf_d),
        }
    }
}

/// What the mapping needs besides the configuration.
pub struct Ctx<'a> {
    sources: &'a [load::Source],
    prefix: PathBuf,
    root: String,
    php_cgi: String,
    php_ini: PhpIni,
    /// The kernel's largest accept backlog (php-fpm's `listen.backlog = -1`).
    somaxconn: u32,
    env: &'a dyn Fn(&str) -> Option<String>,
}

impl Ctx<'_> {
    /// `FILE:LINE` of `at`.
    fn loc(&self, at: &load::At) -> String {
        match self.sources.get(at.source) {
            Some(s) => {
                let end = at.span.start.min(s.text.len());
                let line = s.text.as_bytes()[..end]
                    .iter()
                    .filter(|&&b| b == b'\n')
                    .count()
                    + 1;
                format!("{}:{line}", s.path.display())
            }
            None => "?".to_owned(),
        }
    }

    /// A comment for a directive corral does not take: where, what, why.
    fn not_mapped(&self, d: &fpm::Directive, why: &str) -> String {
        format!("{} {}: not mapped: {why}", self.loc(&d.at), d.written())
    }

    /// A relative path taken from the pool's prefix, else php-fpm's, as php-fpm does.
    fn full_path(&self, path: &str, pool_prefix: Option<&str>) -> String {
        if path.starts_with('/') {
            return path.to_owned();
        }
        let global = self.prefix.display().to_string();
        let prefix = match pool_prefix.filter(|p| !p.is_empty()) {
            Some(p) if p.starts_with('/') => p.to_owned(),
            Some(p) => format!("{global}/{p}"),
            None => global,
        };
        format!("{}/{path}", prefix.trim_end_matches('/'))
    }
}

/// Runs `corral convert FORMAT ...`, writing the configuration to `out`.
pub fn run(from: ConvertFrom, out: &mut dyn std::io::Write) -> Result<(), Error> {
    let ConvertFrom::PhpFpm(args) = from;
    let env = |name: &str| std::env::var(name).ok();
    let text = php_fpm(&args, &env)?;
    out.write_all(text.as_bytes()).map_err(|source| Error::Io {
        what: "write to standard output".to_owned(),
        source,
    })
}

/// The corral configuration for php-fpm's `args.files`; `env` resolves `${VAR}` and
/// `env[X] = $VAR`.
pub fn php_fpm(args: &PhpFpmArgs, env: &dyn Fn(&str) -> Option<String>) -> Result<String, Error> {
    let reader = load::Reader {
        prefix: args.prefix.clone(),
        env,
    };
    let loaded = reader.read_all(&args.files).map_err(|e| match e.at {
        Some(at) => located(&e.text, &e.path, Some(at.span), e.message),
        None => located("", &e.path, None, e.message),
    })?;
    let config = fpm::build(&loaded).map_err(|e| at_error(&loaded.sources, &e.at, e.message))?;
    let ctx = Ctx {
        sources: &loaded.sources,
        prefix: args.prefix.clone(),
        root: args.root.clone(),
        php_cgi: args.php_cgi.clone(),
        php_ini: PhpIni::choose(
            args.php_ini.as_deref(),
            args.files.first().map(PathBuf::as_path),
        ),
        somaxconn: somaxconn(),
        env,
    };
    if config.pools.is_empty() {
        let path = args.files.first().map_or_else(PathBuf::new, Clone::clone);
        return Err(located(
            "",
            &path,
            None,
            "no pool defined: at least one pool section ([www]) must be given, as php-fpm requires"
                .to_owned(),
        ));
    }
    let mut pools: Vec<pool::PoolOut> = Vec::new();
    for p in &config.pools {
        let name = corral_name(&p.name, &pools);
        let out = pool::convert(p, name, &ctx)
            .map_err(|e| at_error(&loaded.sources, &e.at, e.message))?;
        if let Some(other) = pools.iter().find(|o| o.address == out.address) {
            return Err(at_error(
                &loaded.sources,
                &p.at,
                format!(
                    "[pool {}] listens on {}, which pool \"{}\" uses already; php-fpm refuses that too",
                    p.name, out.address, other.name
                ),
            ));
        }
        pools.push(out);
    }
    let text = emit::document(&config, &pools, &ctx);
    // What `corral check` would say, before anyone relies on it.
    crate::config::parse(&text, "the converted configuration").map_err(|errors| Error::Config {
        origin: "the converted configuration".to_owned(),
        errors,
    })?;
    Ok(text)
}

fn at_error(sources: &[load::Source], at: &load::At, message: String) -> Error {
    match sources.get(at.source) {
        Some(s) => located(&s.text, &s.path, Some(at.span.clone()), message),
        None => Error::Internal(message),
    }
}

/// An [`Error::Config`] about `path`, at `span` of `text` when given.
fn located(
    text: &str,
    path: &Path,
    span: Option<std::ops::Range<usize>>,
    message: String,
) -> Error {
    let origin = path.display().to_string();
    let span = span.filter(|s| {
        s.start <= s.end
            && s.end <= text.len()
            && text.is_char_boundary(s.start)
            && text.is_char_boundary(s.end)
    });
    Error::Config {
        origin: origin.clone(),
        errors: vec![ConfigError::new(text, &origin, span, message)],
    }
}

/// php-fpm's pool name as a corral pool name (1-32 of A-Z a-z 0-9 _ -), unique.
fn corral_name(name: &str, taken: &[pool::PoolOut]) -> String {
    let mut base: String = name
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '_' || c == '-' {
                c
            } else {
                '_'
            }
        })
        .take(28)
        .collect();
    if base.is_empty() {
        base.push_str("pool");
    }
    let mut candidate = base.clone();
    let mut n = 2;
    while taken.iter().any(|p| p.name == candidate) {
        candidate = format!("{base}-{n}");
        n += 1;
    }
    candidate
}

/// The kernel's largest accept backlog (4096 when it cannot be read).
fn somaxconn() -> u32 {
    std::fs::read_to_string("/proc/sys/net/core/somaxconn")
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .filter(|&n| n > 0)
        .unwrap_or(4096)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Seeded pseudo-random configurations built from php-fpm's own words and INI syntax
    /// fragments: every one converts or is refused, none panics.
    #[test]
    fn random_configurations_never_panic() {
        const PIECES: &[&str] = &[
            "[www]",
            "[global]",
            "[$pool]",
            "[",
            "]",
            "listen",
            "listen.mode",
            "pm",
            "pm.max_children",
            "pm.min_spare_servers",
            "pm.max_spare_servers",
            "pm.start_servers",
            "user",
            "env[X]",
            "php_value[memory_limit]",
            "php_admin_flag[log_errors]",
            "include",
            "slowlog",
            "request_slowlog_timeout",
            "request_terminate_timeout",
            "security.limit_extensions",
            "listen.allowed_clients",
            "=",
            " = ",
            ";",
            "\"",
            "'",
            "${HOME}",
            "${",
            "$pool",
            "\\",
            "static",
            "dynamic",
            "ondemand",
            "0",
            "1",
            "5",
            "-1",
            "10s",
            "2m",
            "yes",
            "off",
            "/run/x.sock",
            "127.0.0.1:9000",
            "9000",
            "[::1]:9000",
            ".php",
            "é",
            "\t",
            "0660",
            "*.conf",
            "[]",
        ];
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("random.conf");
        let mut seed: u64 = 0x2545_f491_4f6c_dd1d;
        let mut next = move || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        let env = |_: &str| Some("/x".to_owned());
        for _ in 0..2000 {
            let mut text = String::new();
            for _ in 0..(next() % 20) {
                for _ in 0..(next() % 6) {
                    let piece = PIECES[usize::try_from(next() % PIECES.len() as u64).unwrap()];
                    text.push_str(piece);
                }
                text.push('\n');
            }
            std::fs::write(&path, &text).unwrap();
            let args = PhpFpmArgs {
                files: vec![path.clone()],
                prefix: dir.path().to_owned(),
                root: "/var/www/html".to_owned(),
                php_cgi: "php-cgi".to_owned(),
                php_ini: Some("none".to_owned()),
            };
            let _ = php_fpm(&args, &env);
        }
    }
}
