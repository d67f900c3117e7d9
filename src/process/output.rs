//! A worker's stdout and stderr, forwarded into corral's log one line per event (target
//! `corral::worker`, fields `pool`, `pid`, `stream`), with lines bounded in length so a
//! worker that never writes a newline cannot make corral buffer without limit. Control bytes
//! are escaped (a line is one log line), and each stream of each worker is held to 100 lines
//! and 64 KiB a second (`LINES_PER_SECOND`, `BYTES_PER_SECOND`): past them lines are dropped
//! and counted, and the next line logged is preceded by one saying how many were suppressed.
//!
//! A pool keeps the last few stderr lines of all its processes (workers and preloader) in a
//! [`Tail`], so a worker that cannot come up is reported with what it said last (the
//! Python traceback, Ruby's LoadError): ARCHITECTURE.md, "Generations and reload".

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
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

/// Lines a [`Tail`] keeps.
pub const TAIL_LINES: usize = 12;
/// Longest line a [`Tail`] keeps (longer ones are cut, with "...").
const TAIL_LINE: usize = 300;

/// The last [`TAIL_LINES`] stderr lines a pool's processes wrote, escaped as logged, and how
/// many of its stderr pipes have closed (a process that exited has closed its own: waiting
/// for that count to move tells when a failed process's last words are in).
#[derive(Debug, Default)]
pub struct Tail {
    lines: Mutex<VecDeque<String>>,
    closed: AtomicU64,
    /// Stack dumps asked of the pool's workers, collected from the same streams.
    pub stacks: super::stacks::StackDumps,
}

impl Tail {
    /// The lines kept, oldest first.
    pub fn lines(&self) -> Vec<String> {
        self.lines
            .lock()
            .map(|l| l.iter().cloned().collect())
            .unwrap_or_default()
    }

    /// How many stderr pipes of the pool have closed so far.
    pub fn closed(&self) -> u64 {
        self.closed.load(Ordering::Acquire)
    }

    fn push(&self, line: String) {
        if let Ok(mut lines) = self.lines.lock() {
            if lines.len() >= TAIL_LINES {
                lines.pop_front();
            }
            lines.push_back(line);
        }
    }
}

/// Where a pool's stderr lines are kept: compares equal to any other (it is where output
/// goes, not a setting, so it never makes two spawns differ).
#[derive(Debug, Clone, Default)]
pub struct TailHandle(pub Option<Arc<Tail>>);

impl PartialEq for TailHandle {
    fn eq(&self, _: &TailHandle) -> bool {
        true
    }
}

impl Eq for TailHandle {}

/// Logs each line read from a worker's pipe until it closes, keeping the lines in `tail`
/// too when there is one.
pub(super) async fn log_lines(
    mut pipe: impl AsyncRead + Unpin,
    pool: String,
    pid: u32,
    stream: &str,
    tail: Option<Arc<Tail>>,
) {
    let limit = LineLimit::new(Duration::from_secs(1), LINES_PER_SECOND, BYTES_PER_SECOND);
    let mut pending: Vec<u8> = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        // A flood that stopped is reported once the worker has been quiet a moment, not at
        // its next line (which may never come). Only then is a timer armed: a worker that
        // writes nothing, as most do most of the time, costs corral no wake-up.
        let read = if limit.suppressed() > 0 {
            match tokio::time::timeout(QUIET, pipe.read(&mut chunk)).await {
                Err(_) => {
                    report_suppressed(limit.take_suppressed(), &pool, pid, stream);
                    continue;
                }
                Ok(read) => read,
            }
        } else {
            pipe.read(&mut chunk).await
        };
        let read = match read {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        pending.extend_from_slice(chunk.get(..read).unwrap_or_default());
        for line in take_lines(&mut pending) {
            keep(tail.as_deref(), &line);
            if dumping(tail.as_deref(), pid, &line) {
                // A dump asked for is logged whole: it is bounded where it is kept.
                log_line(&line, &pool, pid, stream);
            } else {
                limited(&limit, &line, &pool, pid, stream);
            }
        }
    }
    if !pending.is_empty() {
        keep(tail.as_deref(), &pending);
        limited(&limit, &pending, &pool, pid, stream);
    }
    report_suppressed(limit.take_suppressed(), &pool, pid, stream);
    if let Some(tail) = tail {
        tail.closed.fetch_add(1, Ordering::Release);
    }
}

/// Hands `line` to the stack dumps being collected from this stream, if any; true when one is.
fn dumping(tail: Option<&Tail>, pid: u32, line: &[u8]) -> bool {
    let Some(tail) = tail.filter(|t| t.stacks.collecting()) else {
        return false;
    };
    let line = line.strip_suffix(b"\n").unwrap_or(line);
    let line = line.strip_suffix(b"\r").unwrap_or(line);
    tail.stacks.line(pid, &escaped(line).to_string())
}

/// Keeps `line` (as logged, bounded) in `tail`; blank lines are not worth a place.
fn keep(tail: Option<&Tail>, line: &[u8]) {
    let Some(tail) = tail else { return };
    let line = line.strip_suffix(b"\n").unwrap_or(line);
    let line = line.strip_suffix(b"\r").unwrap_or(line);
    if line.iter().all(u8::is_ascii_whitespace) {
        return;
    }
    let mut text = escaped(line).to_string();
    if text.len() > TAIL_LINE {
        let mut cut = TAIL_LINE;
        while !text.is_char_boundary(cut) {
            cut -= 1;
        }
        text.truncate(cut);
        text.push_str("...");
    }
    tail.push(text);
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
    use std::pin::Pin;
    use std::task::{Context, Poll};

    use tokio::io::ReadBuf;

    use super::*;

    /// A pipe that hands out `chunks` (each at most 4 KiB), then stays open and silent,
    /// counting the reads that found it so: each is the reader waking up.
    struct Silent {
        chunks: VecDeque<Vec<u8>>,
        waits: Arc<AtomicU64>,
    }

    impl AsyncRead for Silent {
        fn poll_read(
            mut self: Pin<&mut Self>,
            _: &mut Context<'_>,
            buf: &mut ReadBuf<'_>,
        ) -> Poll<std::io::Result<()>> {
            match self.chunks.pop_front() {
                Some(chunk) => {
                    buf.put_slice(&chunk);
                    Poll::Ready(Ok(()))
                }
                None => {
                    self.waits.fetch_add(1, Ordering::Relaxed);
                    Poll::Pending
                }
            }
        }
    }

    /// Reads `chunks` with `log_lines` for 10 s of paused time; returns how often the reader
    /// waited on the silent pipe, and the warnings logged by then.
    async fn read_for_ten_seconds(chunks: Vec<Vec<u8>>) -> (u64, Vec<(Duration, String)>) {
        let (captured, subscriber) = crate::logs::capture::warnings();
        let _guard = tracing::subscriber::set_default(subscriber);
        let waits = Arc::new(AtomicU64::new(0));
        let pipe = Silent {
            chunks: chunks.into(),
            waits: Arc::clone(&waits),
        };
        let start = Instant::now();
        let task = tokio::spawn(log_lines(pipe, "p".into(), 1, "stderr", None));
        // Each warning with the time it was first seen, looking every 100 ms.
        let mut warnings = Vec::new();
        for _ in 0..100 {
            tokio::time::sleep(Duration::from_millis(100)).await;
            let text = captured.text();
            for line in text.lines().skip(warnings.len()) {
                warnings.push((start.elapsed(), line.to_owned()));
            }
        }
        task.abort();
        (waits.load(Ordering::Relaxed), warnings)
    }

    #[tokio::test(start_paused = true)]
    async fn a_silent_pipe_arms_no_timer() {
        let (waits, warnings) = read_for_ten_seconds(vec![b"one line\n".to_vec()]).await;
        assert_eq!(waits, 1, "woken by nothing once the line was read");
        assert!(warnings.is_empty(), "{warnings:?}");
    }

    #[tokio::test(start_paused = true)]
    async fn a_flood_is_reported_once_after_a_quiet_second_then_no_timer_is_armed() {
        let flood = b"x\n".repeat(2 * LINES_PER_SECOND as usize);
        let (waits, warnings) = read_for_ten_seconds(vec![flood]).await;
        let [(at, warning)] = &warnings[..] else {
            panic!("one report expected: {warnings:?}");
        };
        assert!(warning.contains("suppressed 100 lines"), "{warning}");
        assert!(
            *at >= QUIET && *at <= QUIET + Duration::from_millis(100),
            "{at:?}"
        );
        // Woken once by the timer that reported (which looks at the pipe once more before
        // it gives up on it), then never again.
        assert_eq!(waits, 3);
    }

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

    #[tokio::test]
    async fn a_tail_keeps_the_last_lines_escaped_and_counts_closed_pipes() {
        let tail = Arc::new(Tail::default());
        let mut text = String::new();
        for i in 0..20 {
            text.push_str(&format!("line {i}\n"));
        }
        text.push_str("\n   \nlast \x1b[31mred\x1b[0m");
        log_lines(
            text.as_bytes(),
            "p".into(),
            1,
            "stderr",
            Some(Arc::clone(&tail)),
        )
        .await;
        let lines = tail.lines();
        assert_eq!(lines.len(), TAIL_LINES);
        assert_eq!(lines.first().map(String::as_str), Some("line 9"));
        assert!(
            lines
                .last()
                .is_some_and(|l| l.starts_with("last ") && !l.contains('\x1b')),
            "{lines:?}"
        );
        assert_eq!(tail.closed(), 1);
    }
}
