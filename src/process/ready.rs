//! Waiting for a new worker to accept connections, with a deadline, noticing when it
//! exits instead.

use std::io;
use std::time::Duration;

use tokio::process::Child;
use tokio::time::Instant;

use super::ExitKind;
use crate::config::BackendAddress;
use crate::net::Stream;

/// Why a worker never became ready.
#[derive(Debug, thiserror::Error)]
pub enum ReadyError {
    /// The worker ended before accepting a connection.
    #[error("worker for {address} {exit} before accepting connections")]
    Exited {
        /// The worker's socket.
        address: String,
        /// How it ended.
        exit: ExitKind,
    },
    /// The start timeout passed.
    #[error("worker for {address} accepted no connection within {after:?} (last attempt: {last})")]
    TimedOut {
        /// The worker's socket.
        address: String,
        /// The start timeout.
        after: Duration,
        /// The last connect error.
        last: io::Error,
    },
    /// Asking whether the child exited failed.
    #[error("cannot check on the worker for {address}: {source}")]
    Wait {
        /// The worker's socket.
        address: String,
        /// The error from `try_wait`.
        source: io::Error,
    },
}

/// Waits until `address` accepts a connection, `child` exits, or `start_timeout` passes.
///
/// The probe connection is closed at once; FastCGI, SCGI and LSAPI workers treat it as a
/// client that went away. With a socket corral bound itself the kernel accepts
/// connections into the backlog before the child even runs, so this mostly checks that
/// the child did not exit at once.
pub async fn wait_ready(
    address: &BackendAddress,
    child: &mut Child,
    start_timeout: Duration,
) -> Result<(), ReadyError> {
    let exited = || match child.try_wait() {
        Ok(Some(status)) => Err(ReadyError::Exited {
            address: address.to_string(),
            exit: ExitKind::of(status),
        }),
        Ok(None) => Ok(()),
        Err(source) => Err(ReadyError::Wait {
            address: address.to_string(),
            source,
        }),
    };
    connect_until(address, start_timeout, Duration::from_millis(5), exited).await
}

/// Waits until `address` accepts a connection or `start_timeout` passes, for a worker
/// corral is not the parent of (a preloader forked it: its exit is watched through a pidfd
/// by the caller, not here). A forked worker is running at once, so the first pause is
/// short.
pub async fn wait_listening(
    address: &BackendAddress,
    start_timeout: Duration,
) -> Result<(), ReadyError> {
    connect_until(address, start_timeout, Duration::from_millis(1), || Ok(())).await
}

/// Connects to `address` until it accepts, with pauses doubling from `pause` up to 50 ms,
/// asking `gone` before each attempt whether to give up.
async fn connect_until(
    address: &BackendAddress,
    start_timeout: Duration,
    mut pause: Duration,
    mut gone: impl FnMut() -> Result<(), ReadyError>,
) -> Result<(), ReadyError> {
    let deadline = Instant::now() + start_timeout;
    loop {
        gone()?;
        let left = deadline.saturating_duration_since(Instant::now());
        let last = match Stream::connect(address, left.min(Duration::from_secs(1))).await {
            Ok(_) => return Ok(()),
            Err(e) => e,
        };
        if Instant::now() >= deadline {
            return Err(ReadyError::TimedOut {
                address: address.to_string(),
                after: start_timeout,
                last,
            });
        }
        tokio::time::sleep(pause.min(deadline.saturating_duration_since(Instant::now()))).await;
        pause = (pause * 2).min(Duration::from_millis(50));
    }
}
