//! A worker's stdout and stderr, forwarded into corral's log one line per event (target
//! `corral::worker`, fields `pool`, `pid`, `stream`), with lines bounded in length so a
//! worker that never writes a newline cannot make corral buffer without limit. Control bytes
//! are escaped (a line is one log line), and each stream of each worker is held to
//! [`LINES_PER_SECOND`] and [`BYTES_PER_SECOND`]: past them lines are dropped and counted, and
//! the next line logged is preceded by one saying how many were suppressed.

use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt};
use tokio::time::Instant;

use crate::logs::{escaped, LineLimit, Verdict};

/// Longest line of worker output logged as one event; longer lines are split.
const MAX_LINE: usize = 8192;
/// Lines one stream of one worker may log per second.
const LINES_PER_SECOND: u64 = 100;
/// Bytes one stream of one worker may log per second.
const BYTES_PER_SECOND: u64 = 64 * 1024;
/// After this long without output, the lines suppressed so far are reported.
const QUIET: Duration = Duration::from_secs(1);

/// Logs each line read from a worker's pipe until it closes.
pub(super) async fn log_lines(
    mut pipe: impl AsyncRead + Unpin,
    pool: String,
    pid: u32,
    stream: &str,
) {
    let limit = LineLimit::new(Duration::from_secs(1), LINES_PER_SECOND, BYTES_PER_SECOND);
    let mut pending: Vec<u8> = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        let read = match tokio::time::timeout(QUIET, pipe.read(&mut chunk)).await {
            // A flood that stopped is reported once the worker has been quiet a moment,
            // not at its next line (which may never come).
            Err(_) => {
                report_suppressed(limit.take_suppressed(), &pool, pid, stream);
                continue;
            }
            Ok(Ok(0) | Err(_)) => break,
            Ok(Ok(n)) => n,
        };
        pending.extend_from_slice(chunk.get(..read).unwrap_or_default());
        for line in take_lines(&mut pending) {
            limited(&limit, &line, &pool, pid, stream);
        }
    }
    if !pending.is_empty() {
        limited(&limit, &pending, &pool, pid, stream);
    }
    report_suppressed(limit.take_suppressed(), &pool, pid, stream);
}

fn limited(limit: &LineLimit, line: &[u8], pool: &str, pid: u32, stream: &str) {
    if let Verdict::Log { suppressed } = limit.check(Instant::now(), line.len()) {
        report_suppressed(suppressed, pool, pid, stream);
        log_line(line, pool, pid, stream);
    }
}

fn report_suppressed(suppressed: u64, pool: &str, pid: u32, stream: &str) {
    if suppressed > 0 {
        tracing::warn!(
            target: "corral::worker",
            pool,
            pid,
            stream,
            suppressed,
            "worker output over {LINES_PER_SECOND} lines or {BYTES_PER_SECOND} bytes a second: \
             suppressed {suppressed} lines"
        );
    }
}

/// Removes the complete lines from `pending` (newline included), and a line-less run of
/// [`MAX_LINE`] bytes or more as one piece; what is left is shorter than [`MAX_LINE`].
fn take_lines(pending: &mut Vec<u8>) -> Vec<Vec<u8>> {
    let mut lines = Vec::new();
    while let Some(end) = pending.iter().position(|&b| b == b'\n') {
        lines.push(pending.drain(..=end).collect());
    }
    if pending.len() >= MAX_LINE {
        lines.push(std::mem::take(pending));
    }
    lines
}

fn log_line(line: &[u8], pool: &str, pid: u32, stream: &str) {
    let line = line.strip_suffix(b"\n").unwrap_or(line);
    let line = line.strip_suffix(b"\r").unwrap_or(line);
    tracing::info!(target: "corral::worker", pool, pid, stream, "{}", escaped(line));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_are_split_at_newlines_and_bounded() {
        let mut pending = b"one\ntwo\r\nthr".to_vec();
        assert_eq!(
            take_lines(&mut pending),
            vec![b"one\n".to_vec(), b"two\r\n".to_vec()]
        );
        assert_eq!(pending, b"thr");
        let mut long = vec![b'x'; MAX_LINE + 10];
        assert_eq!(take_lines(&mut long), vec![vec![b'x'; MAX_LINE + 10]]);
        assert!(long.is_empty());
    }
}
