//! The one place that touches Unix signals: each is translated once into a [`Control`] value
//! (ARCHITECTURE.md decision 10). Tests inject `Control` values instead of raising signals.
//!
//! | signal  | control        | what corral does                                         |
//! |---------|----------------|----------------------------------------------------------|
//! | SIGTERM | `GracefulStop` | stop accepting, finish requests up to `grace`, exit 0     |
//! | SIGQUIT | `GracefulStop` | the same                                                 |
//! | SIGINT  | `FastStop`     | stop accepting and exit without waiting for requests     |
//! | SIGHUP  | `Reload`       | re-read, validate and apply the configuration            |
//! | SIGUSR1 | `ReopenLogs`   | reopen the access and slow-request log files             |
//! | SIGUSR2 | `Upgrade`      | rolling restart of every worker, new before old          |

use tokio::signal::unix::{signal, SignalKind};
use tokio::sync::mpsc;

/// What an operator asked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Control {
    /// Stop accepting, finish what is in flight within the grace period, exit.
    GracefulStop,
    /// Stop at once.
    FastStop,
    /// Re-read the configuration.
    Reload,
    /// Reopen log files.
    ReopenLogs,
    /// Restart every worker, one at a time.
    Upgrade,
}

/// Starts listening for the signals of the table above; each arrives as a [`Control`].
pub fn listen() -> std::io::Result<mpsc::Receiver<Control>> {
    let (tx, rx) = mpsc::channel(16);
    let table = [
        (SignalKind::terminate(), Control::GracefulStop),
        (SignalKind::quit(), Control::GracefulStop),
        (SignalKind::interrupt(), Control::FastStop),
        (SignalKind::hangup(), Control::Reload),
        (SignalKind::user_defined1(), Control::ReopenLogs),
        (SignalKind::user_defined2(), Control::Upgrade),
    ];
    for (kind, control) in table {
        let mut stream = signal(kind)?;
        let tx = tx.clone();
        tokio::spawn(async move {
            while stream.recv().await.is_some() {
                if tx.send(control).await.is_err() {
                    return;
                }
            }
        });
    }
    Ok(rx)
}
