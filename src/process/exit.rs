//! How a worker process ended, decoded once from its `ExitStatus` into words the log, the
//! status page and the pool state machine share (ARCHITECTURE.md invariant 8).
//!
//! An interpreter that exits on its own (php-cgi told to stop after N requests, an app that
//! returns) is an ordinary [`ExitKind::Code`]; only the pool decides whether that was
//! expected. Errnos met while signalling or reaping are compared as values, never as text.

use std::fmt;
use std::os::unix::process::ExitStatusExt;
use std::process::ExitStatus;

use nix::errno::Errno;
use nix::sys::signal::Signal;

/// How a process ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ExitKind {
    /// It called `exit` (or returned from `main`) with this code.
    Code(i32),
    /// A signal with this number killed it.
    Signal(i32),
}

impl ExitKind {
    /// Decodes a reaped child's status.
    ///
    /// A terminated process has either an exit code or a terminating signal; std reports
    /// neither only for a stopped or continued child, which `wait` never returns here. Such a
    /// status is reported as its raw wait value under `Code` rather than invented.
    pub fn of(status: ExitStatus) -> ExitKind {
        match (status.code(), status.signal()) {
            (Some(code), _) => ExitKind::Code(code),
            (None, Some(signal)) => ExitKind::Signal(signal),
            (None, None) => ExitKind::Code(status.into_raw()),
        }
    }

    /// Whether the process exited with code 0.
    pub fn is_success(self) -> bool {
        self == ExitKind::Code(0)
    }
}

impl From<ExitStatus> for ExitKind {
    fn from(status: ExitStatus) -> ExitKind {
        ExitKind::of(status)
    }
}

impl fmt::Display for ExitKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            ExitKind::Code(code) => write!(f, "exited with code {code}"),
            ExitKind::Signal(number) => match Signal::try_from(number) {
                Ok(signal) => write!(f, "killed by signal {}", signal.as_str()),
                Err(_) => write!(f, "killed by signal {number}"),
            },
        }
    }
}

/// Whether `errno` says the process (or process group) no longer exists: `ESRCH` from
/// `kill`/`killpg`, `ECHILD` from `waitpid` on a child someone already reaped.
pub fn is_gone(errno: Errno) -> bool {
    errno == Errno::ESRCH || errno == Errno::ECHILD
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_and_signals_read_as_sentences() {
        // Raw wait statuses: exit code in bits 8..16, terminating signal in bits 0..7.
        assert_eq!(
            ExitKind::of(ExitStatus::from_raw(3 << 8)),
            ExitKind::Code(3)
        );
        assert_eq!(ExitKind::of(ExitStatus::from_raw(9)), ExitKind::Signal(9));
        assert_eq!(ExitKind::Code(0).to_string(), "exited with code 0");
        assert_eq!(ExitKind::Code(255).to_string(), "exited with code 255");
        assert_eq!(ExitKind::Signal(9).to_string(), "killed by signal SIGKILL");
        assert_eq!(ExitKind::Signal(15).to_string(), "killed by signal SIGTERM");
        assert_eq!(ExitKind::Signal(99).to_string(), "killed by signal 99");
        assert!(ExitKind::Code(0).is_success());
        assert!(!ExitKind::Signal(0).is_success());
    }

    #[test]
    fn gone_errnos_are_values() {
        assert!(is_gone(Errno::ESRCH));
        assert!(is_gone(Errno::ECHILD));
        assert!(!is_gone(Errno::EPERM));
    }
}
