//! The backend's stderr: each piece logged with the pool and request id, escaped, within a
//! per-exchange rate bound, and passed to the exchange's extra sink if it has one.

use tokio::time::Instant;

use super::Exchange;
use crate::logs::{escaped, LineLimit, Verdict};

/// Pieces of backend stderr one exchange may log per second.
const STDERR_LINES_PER_SECOND: u64 = 100;
/// Bytes of backend stderr one exchange may log per second.
const STDERR_BYTES_PER_SECOND: u64 = 64 * 1024;

/// The stderr bound of one exchange.
pub(super) fn limit() -> LineLimit {
    LineLimit::new(
        std::time::Duration::from_secs(1),
        STDERR_LINES_PER_SECOND,
        STDERR_BYTES_PER_SECOND,
    )
}

impl Exchange {
    /// Logs a piece of the backend's stderr, escaped, at most [`STDERR_LINES_PER_SECOND`]
    /// pieces and [`STDERR_BYTES_PER_SECOND`] bytes a second per exchange (a backend serves
    /// one exchange at a time per slot); past that they are counted and reported with the
    /// next piece logged, or when the exchange ends.
    pub(super) fn log_stderr(&self, text: &[u8]) {
        if let Some(sink) = &self.stderr {
            sink(text);
        }
        let Verdict::Log { suppressed } = self.stderr_limit.check(Instant::now(), text.len())
        else {
            return;
        };
        self.report_suppressed_stderr(suppressed);
        let line = text.strip_suffix(b"\n").unwrap_or(text);
        tracing::warn!(
            pool = %self.pool,
            request_id = self.request_id,
            protocol = %self.protocol(),
            stderr = %escaped(line),
            "backend wrote to stderr"
        );
    }

    pub(super) fn report_suppressed_stderr(&self, suppressed: u64) {
        if suppressed > 0 {
            tracing::warn!(
                pool = %self.pool,
                request_id = self.request_id,
                suppressed,
                "backend stderr over {STDERR_LINES_PER_SECOND} records or \
                 {STDERR_BYTES_PER_SECOND} bytes a second: suppressed {suppressed} lines"
            );
        }
    }
}
