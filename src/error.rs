//! The top-level error of the `corral` command, and the exit code each kind maps to.
//!
//! Exit codes follow sysexits.h so that scripts and service managers can tell a bad
//! configuration (which a restart will not fix) from an unavailable resource (which it may).

use std::fmt::Write as _;
use std::io;

use crate::config::ConfigError;

/// Exit code for success.
pub const EX_OK: u8 = 0;
/// Exit code for a wrong command line or configuration (sysexits `EX_USAGE`).
pub const EX_USAGE: u8 = 64;
/// Exit code for a service or resource that is unavailable (sysexits `EX_UNAVAILABLE`).
pub const EX_UNAVAILABLE: u8 = 69;
/// Exit code for an internal error: a bug (sysexits `EX_SOFTWARE`).
pub const EX_SOFTWARE: u8 = 70;
/// Exit code for a failed read or write (sysexits `EX_IOERR`).
pub const EX_IOERR: u8 = 74;
/// Exit code for something on the machine set up in a way corral refuses to use, such as
/// a runtime directory others may write in (sysexits `EX_CONFIG`).
pub const EX_CONFIG: u8 = 78;

/// Why the `corral` command stopped.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The command line could not be parsed.
    #[error("{0}")]
    Usage(#[from] clap::Error),
    /// The configuration broke one or more rules; every error found is here.
    #[error("{}", render_config_errors(origin, errors))]
    Config {
        /// Name of the configuration (its path).
        origin: String,
        /// Every error found, in source order.
        errors: Vec<ConfigError>,
    },
    /// Reading or writing something failed.
    #[error("cannot {what}: {source}")]
    Io {
        /// What was being done, e.g. "read /etc/corral.toml".
        what: String,
        /// The operating system's reason.
        source: io::Error,
    },
    /// Something corral needs is not available (an address in use, a missing program).
    #[error("{what} is unavailable: {source}")]
    Unavailable {
        /// The thing that is missing, e.g. "listener 127.0.0.1:8080".
        what: String,
        /// The operating system's reason.
        source: io::Error,
    },
    /// The runtime directory is unsafe to use, or could not be set up.
    #[error("refusing to start: {0}")]
    RuntimeDir(#[from] crate::runtime_dir::RuntimeDirError),
    /// Serving could not start: a listener, a launcher or a pool could not be set up.
    #[error("cannot serve: {0}")]
    Startup(#[from] StartupError),
    /// The configuration is valid but asks for what this build cannot serve, or serving
    /// failed after start.
    #[error("cannot serve: {0}")]
    Serve(String),
    /// An invariant of corral itself broke: a bug to report.
    #[error("internal error: {0}")]
    Internal(String),
}

impl Error {
    /// The process exit code for this error.
    pub fn exit_code(&self) -> u8 {
        match self {
            Error::Usage(_) | Error::Config { .. } => EX_USAGE,
            Error::Io { .. } => EX_IOERR,
            Error::Unavailable { .. } | Error::Serve(_) => EX_UNAVAILABLE,
            Error::Startup(StartupError::Launcher { .. }) => EX_IOERR,
            Error::Startup(_) => EX_UNAVAILABLE,
            Error::Internal(_) => EX_SOFTWARE,
            Error::RuntimeDir(crate::runtime_dir::RuntimeDirError::Io { .. }) => EX_IOERR,
            Error::RuntimeDir(_) => EX_CONFIG,
        }
    }
}

/// Why serving a configuration could not start (at `corral run`, or for a reload, which
/// then leaves the running configuration serving).
#[derive(Debug, thiserror::Error)]
pub enum StartupError {
    /// A front listener could not be bound.
    #[error("cannot listen on {address}: {source}")]
    Listen {
        /// The configured address.
        address: String,
        /// The operating system's reason.
        source: io::Error,
    },
    /// The serving threads (`scheduler = "per-thread"`) could not be started.
    #[error("cannot start the serving threads: {0}")]
    ServingThreads(io::Error),
    /// The status listener could not be bound.
    #[error("cannot listen for status on {address}: {source}")]
    StatusListen {
        /// The configured address.
        address: String,
        /// The operating system's reason.
        source: io::Error,
    },
    /// An `app = ...` pool's launcher could not be written into the runtime directory.
    #[error("pool {pool}: cannot write the launcher into {dir}: {source}")]
    Launcher {
        /// The pool.
        pool: String,
        /// The runtime directory.
        dir: std::path::PathBuf,
        /// The operating system's reason.
        source: io::Error,
    },
    /// A pool with workers to spawn has no command to spawn them with.
    #[error("pool {pool}: no command to start its workers")]
    NoCommand {
        /// The pool.
        pool: String,
    },
}

/// Each error with its source line, a blank line between them, then a count.
fn render_config_errors(origin: &str, errors: &[ConfigError]) -> String {
    let mut out = String::new();
    for e in errors {
        let _ = writeln!(out, "{e}\n");
    }
    let n = errors.len();
    let _ = write!(out, "{origin}: {n} error{}", if n == 1 { "" } else { "s" });
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_errors_map_to_ex_usage_and_list_every_error() {
        let errors = crate::config::parse("[server]\ngrace = \"x\"\n", "c.toml").unwrap_err();
        let e = Error::Config {
            origin: "c.toml".into(),
            errors,
        };
        assert_eq!(e.exit_code(), EX_USAGE);
        let text = e.to_string();
        assert!(
            text.starts_with("c.toml:2:9: duration \"x\" is not valid"),
            "{text}"
        );
        assert!(text.ends_with("c.toml: 3 errors"), "{text}");
    }

    #[test]
    fn io_and_internal_codes() {
        let io = Error::Io {
            what: "read x".into(),
            source: io::Error::from(io::ErrorKind::NotFound),
        };
        assert_eq!(io.exit_code(), EX_IOERR);
        assert!(io.to_string().starts_with("cannot read x: "));
        assert_eq!(Error::Internal("x".into()).exit_code(), EX_SOFTWARE);
        let un = Error::Unavailable {
            what: "listener 127.0.0.1:1".into(),
            source: io::Error::from(io::ErrorKind::AddrInUse),
        };
        assert_eq!(un.exit_code(), EX_UNAVAILABLE);
    }
}
