//! The command line: `corral check -c FILE`, `corral run [-c FILE]`, `corral stop [--fast]`,
//! `corral restart-workers`, `corral status [--full | --watch]` (these three find the running corral
//! through the configuration's runtime_dir, `src/control.rs`), `corral convert php-fpm FILE...`
//! (`src/convert/`), `corral --version`.
//!
//! Everything here takes its arguments and output streams as parameters so tests can drive
//! it without a process; `main.rs` only passes the real ones in and exits with the code.

use std::ffi::OsString;
use std::io::Write;
use std::path::{Path, PathBuf};

use clap::error::ErrorKind;
use clap::{Parser, Subcommand};

use crate::config::{self, Backend, Config, ConfigError, Program, Sizing};
use crate::error::{Error, EX_OK};

mod serve;
use serve::serve;

/// corral: an application-server gateway for FastCGI, SCGI and LSAPI backends.
#[derive(Debug, Parser)]
#[command(name = "corral", version)]
pub struct Cli {
    /// What to do; `run` with the embedded default configuration when omitted.
    #[command(subcommand)]
    pub command: Option<Command>,
}

/// The subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Check a configuration file: print every error with its line and column, or "ok".
    Check {
        /// The configuration file.
        #[arg(short, long, value_name = "FILE")]
        config: PathBuf,
    },
    /// Load the configuration and run the gateway.
    Run {
        /// The configuration file; without it, the embedded default (a demo on
        /// 127.0.0.1:8080, status on 127.0.0.1:9180).
        #[arg(short, long, value_name = "FILE")]
        config: Option<PathBuf>,
    },
    /// Stop the corral running with this configuration: gracefully (requests in flight
    /// finish within `grace`), or at once with `--fast`; waits until it has exited.
    Stop {
        /// The configuration it runs with (its runtime_dir holds the pid file); without it,
        /// the embedded default.
        #[arg(short, long, value_name = "FILE")]
        config: Option<PathBuf>,
        /// Do not wait for requests in flight (SIGINT rather than SIGTERM).
        #[arg(long)]
        fast: bool,
    },
    /// Reload the running corral's configuration (its SIGHUP): unchanged pools keep their
    /// workers, changed ones start new workers before the old ones drain.
    Reload {
        /// The configuration it runs with (checked here first); without it, the embedded
        /// default.
        #[arg(short, long, value_name = "FILE")]
        config: Option<PathBuf>,
    },
    /// Replace every worker of the running corral, new before old (its SIGUSR2).
    RestartWorkers {
        /// The configuration it runs with; without it, the embedded default.
        #[arg(short, long, value_name = "FILE")]
        config: Option<PathBuf>,
    },
    /// Print the running corral's status page (pools, workers, queue), from its `[status]`
    /// listener; with `--watch`, a view of it that refreshes in place until Ctrl-C.
    Status {
        /// The configuration it runs with; without it, the embedded default.
        #[arg(short, long, value_name = "FILE")]
        config: Option<PathBuf>,
        /// One row per worker too.
        #[arg(long, conflicts_with = "watch")]
        full: bool,
        /// Refresh a terminal view (pools, workers, queue, req/s, p50/p99) every interval;
        /// when standard output is not a terminal, print one plain frame per interval.
        #[arg(long)]
        watch: bool,
        /// Time between two refreshes of `--watch` (at least 100ms).
        #[arg(long, value_name = "DURATION", default_value = "1s", value_parser = watch_interval, requires = "watch")]
        interval: std::time::Duration,
        /// Stop `--watch` after this many frames.
        #[arg(long, value_name = "N", requires = "watch")]
        count: Option<u64>,
    },
    /// Load-test an address speaking HTTP, FastCGI, SCGI or LSAPI: req/s, latency
    /// percentiles, errors, and the CPU and memory of given processes.
    Bench(Box<crate::bench::BenchArgs>),
    /// Answer every request of one protocol with a fixed response (a backend that costs
    /// nothing, for measuring the interface).
    NullBackend(crate::bench::NullArgs),
    /// Print another server's configuration as a commented corral configuration.
    #[command(subcommand)]
    Convert(crate::convert::ConvertFrom),
}

/// Parses `args` (program name first), runs the command and returns the exit code. Help
/// and version go to `out`; errors, rendered for a person, go to `err`.
pub fn main(
    args: impl IntoIterator<Item = OsString>,
    out: &mut dyn Write,
    err: &mut dyn Write,
) -> u8 {
    let result = match Cli::try_parse_from(args) {
        Ok(cli) => run(cli, out),
        Err(e) if matches!(e.kind(), ErrorKind::DisplayHelp | ErrorKind::DisplayVersion) => {
            return match write!(out, "{}", e.render()) {
                Ok(()) => EX_OK,
                Err(source) => report(err, &stdout_error(source)),
            };
        }
        Err(e) => Err(Error::Usage(e)),
    };
    match result {
        Ok(()) => EX_OK,
        Err(e) => report(err, &e),
    }
}

/// Writes `e` to `err` and gives its exit code. If even that write fails there is nobody
/// left to tell, and the exit code still says what happened.
fn report(err: &mut dyn Write, e: &Error) -> u8 {
    let text = e.to_string();
    let _ = writeln!(err, "{}", text.trim_end());
    e.exit_code()
}

/// What `corral check` says of each direct pool (ARCHITECTURE.md, "Direct pools"): corral
/// does not see its requests, so the front server must guard scripts.
fn direct_pool_notes(config: &crate::config::Config) -> Vec<String> {
    config
        .pools
        .iter()
        .filter_map(|p| match &p.backend {
            crate::config::Backend::Spawned(s) => Some((p, s.direct.as_ref()?)),
            crate::config::Backend::External { .. } => None,
        })
        .map(|(p, d)| {
            format!(
                "note: pool \"{}\" accepts directly on {}: corral cannot inspect its requests \
                 (no script guard, no caps, no queue, no per-request access log); \
                 the front server must choose and check the script: use \
                 conf/nginx/php-fpm-direct.conf (try_files $fastcgi_script_name =404), and \
                 its workers run with cgi.fix_pathinfo=0",
                p.name,
                d.bind.address()
            )
        })
        .collect()
}

/// Runs a parsed command line.
pub fn run(cli: Cli, out: &mut dyn Write) -> Result<(), Error> {
    match cli.command.unwrap_or(Command::Run { config: None }) {
        Command::Check { config } => {
            let (parsed, text) = load_with_text(Some(&config))?;
            // The file is valid; now what it would run: each pool's program must exist and
            // be executable, or `run` could only retry spawns while clients get 503.
            let origin = parsed.origin.clone();
            let errors = missing_programs(&parsed, &text);
            if !errors.is_empty() {
                return Err(Error::Config { origin, errors });
            }
            for note in direct_pool_notes(&parsed) {
                writeln!(out, "{note}").map_err(stdout_error)?;
            }
            writeln!(out, "{}: ok", config.display()).map_err(stdout_error)
        }
        Command::Run { config: path } => {
            let (config, text) = load_with_text(path.as_deref())?;
            writeln!(out, "{}", summary(&config)).map_err(stdout_error)?;
            out.flush().map_err(stdout_error)?;
            // Said once logging is up; corral starts anyway (the program may yet appear),
            // and the pool's status says it never started a worker.
            let missing = missing_programs(&config, &text);
            serve(&config, path, &missing)
        }
        Command::Reload { config: path } => {
            // Checked here first, so a broken file is reported to whoever typed the command;
            // the running corral checks it again, against what it finds on disk then.
            let config = load(path.as_deref())?;
            let dir = &config.server.runtime_dir;
            let before = crate::deploy::read_result(dir)
                .ok()
                .flatten()
                .map_or(0, |(n, _)| n);
            let pid = crate::control::signal(&config, nix::sys::signal::Signal::SIGHUP)
                .map_err(unavailable("corral"))?;
            // The new pools get their start_timeout to come up; a little more for the rest.
            let bound = reload_bound(&config);
            match crate::control::wait_reload(dir, before, pid, bound) {
                Ok(generation) => writeln!(
                    out,
                    "asked corral (pid {pid}) to reload its configuration: generation {generation} serves now"
                )
                .map_err(stdout_error),
                Err(reason) => Err(Error::Serve(format!(
                    "corral (pid {pid}) refused the reload; the running configuration keeps serving: {reason}"
                ))),
            }
        }
        Command::Stop { config, fast } => {
            let config = load(config.as_deref())?;
            let signal = if fast {
                nix::sys::signal::Signal::SIGINT
            } else {
                nix::sys::signal::Signal::SIGTERM
            };
            let pid = crate::control::signal(&config, signal).map_err(unavailable("corral"))?;
            let bound = config.server.grace
                + config.server.kill_timeout
                + std::time::Duration::from_secs(5);
            if !crate::control::wait_exit(pid, bound) {
                return Err(Error::Serve(format!(
                    "corral (pid {pid}) is still running {bound:?} after it was asked to stop"
                )));
            }
            writeln!(out, "corral (pid {pid}) stopped").map_err(stdout_error)
        }
        Command::RestartWorkers { config } => {
            let config = load(config.as_deref())?;
            let pid = crate::control::signal(&config, nix::sys::signal::Signal::SIGUSR2)
                .map_err(unavailable("corral"))?;
            writeln!(
                out,
                "asked corral (pid {pid}) to replace every worker, new before old"
            )
            .map_err(stdout_error)
        }
        Command::Status {
            config,
            watch: true,
            interval,
            count,
            ..
        } => {
            use std::io::IsTerminal;
            let config = load(config.as_deref())?;
            let options = crate::status::watch::Options {
                interval,
                count,
                tty: std::io::stdout().is_terminal(),
            };
            crate::status::watch::run(&config, options, out).map_err(|e| match e {
                crate::status::watch::WatchError::Unavailable(source) => Error::Unavailable {
                    what: "the status listener".to_owned(),
                    source,
                },
                crate::status::watch::WatchError::Output(source) => stdout_error(source),
                crate::status::watch::WatchError::Setup(source) => Error::Io {
                    what: "set up the terminal view".to_owned(),
                    source,
                },
            })
        }
        Command::Status { config, full, .. } => {
            let config = load(config.as_deref())?;
            let page = if full { "/status?full" } else { "/status" };
            let text = crate::control::fetch_status(&config, page)
                .map_err(unavailable("the status listener"))?;
            write!(out, "{text}").map_err(stdout_error)
        }
        Command::Bench(args) => crate::bench::run_bench(*args, out),
        Command::NullBackend(args) => crate::bench::run_null(args),
        Command::Convert(from) => crate::convert::run(from, out),
    }
}

/// `--interval`: a duration such as `500ms` or `2s`, at least 100 ms.
fn watch_interval(text: &str) -> Result<std::time::Duration, String> {
    let d = humantime::parse_duration(text).map_err(|e| e.to_string())?;
    if d < std::time::Duration::from_millis(100) {
        return Err("at least 100ms".to_owned());
    }
    Ok(d)
}

/// An [`Error::Unavailable`] naming `what`.
fn unavailable(what: &'static str) -> impl Fn(std::io::Error) -> Error {
    move |source| Error::Unavailable {
        what: what.to_owned(),
        source,
    }
}

/// How long `corral reload` waits for the outcome: the longest `start_timeout` of the new
/// pools (the reload's gate waits that long, plus a second), and some margin.
fn reload_bound(config: &Config) -> std::time::Duration {
    let longest = config
        .pools
        .iter()
        .filter_map(|p| match &p.backend {
            config::Backend::Spawned(s) => Some(s.start_timeout),
            config::Backend::External { .. } => None,
        })
        .max()
        .unwrap_or_default();
    longest + std::time::Duration::from_secs(10)
}

/// The configuration's pool programs that do not exist or cannot be executed, looked up
/// as the workers' spawn will (`config::check_programs`).
fn missing_programs(config: &Config, text: &str) -> Vec<ConfigError> {
    let path = std::env::var("PATH").ok();
    config::check_programs(config, text, &config.origin, path.as_deref())
}

/// Reads and validates the configuration at `path`, or the embedded default.
pub fn load(path: Option<&Path>) -> Result<Config, Error> {
    load_with_text(path).map(|(config, _)| config)
}

/// [`load`], with the text the configuration was read from.
fn load_with_text(path: Option<&Path>) -> Result<(Config, String), Error> {
    let (text, origin) = match path {
        None => (
            config::EMBEDDED.to_owned(),
            config::EMBEDDED_ORIGIN.to_owned(),
        ),
        Some(path) => {
            let origin = path.display().to_string();
            let text = std::fs::read_to_string(path).map_err(|source| Error::Io {
                what: format!("read {origin}"),
                source,
            })?;
            (text, origin)
        }
    };
    let config =
        config::parse(&text, &origin).map_err(|errors| Error::Config { origin, errors })?;
    Ok((config, text))
}

fn stdout_error(source: std::io::Error) -> Error {
    Error::Io {
        what: "write to standard output".to_owned(),
        source,
    }
}

/// One line naming what the configuration would run.
pub fn summary(c: &Config) -> String {
    let listeners: Vec<String> = c
        .listeners
        .iter()
        // Only the protocol's name is lowercased: a Unix socket path is printed as it is.
        .map(|l| {
            let protocol = format!("{:?}", l.protocol).to_lowercase();
            format!("{protocol} on {}", l.bind.address())
        })
        .collect();
    let pools: Vec<String> = c.pools.iter().map(pool_summary).collect();
    let status = c.status.as_ref().map_or_else(
        || "no status".to_owned(),
        |s| format!("status on {}", s.bind.address()),
    );
    format!(
        "{}: listeners [{}], {status}, pools [{}], {} context{}",
        c.origin,
        listeners.join(", "),
        pools.join(", "),
        c.contexts.len(),
        if c.contexts.len() == 1 { "" } else { "s" }
    )
}

fn pool_summary(p: &config::PoolConfig) -> String {
    let protocol = format!("{:?}", p.protocol).to_lowercase();
    match &p.backend {
        Backend::External { servers } => {
            format!(
                "{} ({protocol}, {} external servers)",
                p.name,
                servers.len()
            )
        }
        Backend::Spawned(s) => {
            let program = match &s.program {
                Program::Command(argv) => argv.first().cloned().unwrap_or_default(),
                Program::Wsgi {
                    module,
                    callable,
                    python,
                    native,
                } => format!(
                    "wsgi {module}:{callable} on {python}{}",
                    native
                        .as_ref()
                        .map(|n| format!(
                            " in the native worker {}",
                            crate::launchers::wsgi_worker(n.worker_path.as_deref())
                        ))
                        .unwrap_or_default()
                ),
                Program::Rack { rackup, ruby } => format!("rack {} on {ruby}", rackup.display()),
                Program::PhpNative {
                    worker_path,
                    worker_script,
                } => format!(
                    "native PHP worker {}{}",
                    crate::launchers::php_worker(worker_path.as_deref()),
                    worker_script
                        .as_ref()
                        .map(|s| format!(" running {}", s.display()))
                        .unwrap_or_default()
                ),
            };
            let size = match s.sizing {
                Sizing::Static { workers } => format!("static {workers}"),
                Sizing::Dynamic { min, max, .. } => format!("dynamic {min}-{max}"),
                Sizing::OnDemand { max, .. } => format!("ondemand 0-{max}"),
            };
            format!("{} ({protocol}, {program}, {size} workers)", p.name)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::EX_USAGE;

    fn call(args: &[&str]) -> (u8, String, String) {
        let (mut out, mut err) = (Vec::new(), Vec::new());
        let code = main(args.iter().map(OsString::from), &mut out, &mut err);
        let s = |v: Vec<u8>| String::from_utf8(v).unwrap();
        (code, s(out), s(err))
    }

    #[test]
    fn the_embedded_default_is_what_no_arguments_runs() {
        // Running it serves on 127.0.0.1:8080 until stopped; the end-to-end test of the
        // README's first command does that. Here: it loads, and says what it serves.
        let out = summary(&load(None).unwrap());
        assert!(
            out.starts_with("<embedded default>: listeners [http on 127.0.0.1:8080]"),
            "{out}"
        );
        assert!(out.contains("status on 127.0.0.1:9180"), "{out}");
    }

    #[test]
    fn the_summary_prints_socket_paths_as_they_are() {
        let text = "[server]\nruntime_dir = \"/run/Corral\"\n[[listen]]\n\
                    address = \"unix:/run/Corral/Front.sock\"\nprotocol = \"fastcgi\"\n\
                    [pools.p]\ncommand = [\"php-cgi\"]\n[[contexts]]\npool = \"p\"\n\
                    root = \"/srv\"\n";
        let out = summary(&config::parse(text, "t.toml").unwrap());
        assert!(
            out.contains("listeners [fastcgi on unix:/run/Corral/Front.sock]"),
            "{out}"
        );
    }

    #[test]
    fn version_goes_to_stdout() {
        let (code, out, _) = call(&["corral", "--version"]);
        assert_eq!(code, 0);
        assert_eq!(out.trim(), format!("corral {}", env!("CARGO_PKG_VERSION")));
    }

    #[test]
    fn bad_usage_is_ex_usage() {
        let (code, _, err) = call(&["corral", "check"]);
        assert_eq!(code, EX_USAGE);
        assert!(err.contains("--config"), "{err}");
        assert_eq!(call(&["corral", "frobnicate"]).0, EX_USAGE);
    }

    #[test]
    fn missing_file_is_an_io_error() {
        let (code, _, err) = call(&["corral", "check", "-c", "/nonexistent/corral.toml"]);
        assert_eq!(code, crate::error::EX_IOERR);
        assert!(
            err.starts_with("cannot read /nonexistent/corral.toml: "),
            "{err}"
        );
    }
}
