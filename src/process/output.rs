//! A worker's stdout and stderr, forwarded into corral's log one line per event (target
//! `corral::worker`, fields `pool`, `pid`, `stream`), with lines bounded in length so a
//! worker that never writes a newline cannot make corral buffer without limit.

use tokio::io::{AsyncRead, AsyncReadExt};

/// Longest line of worker output logged as one event; longer lines are split.
const MAX_LINE: usize = 8192;

/// Logs each line read from a worker's pipe until it closes.
pub(super) async fn log_lines(
    mut pipe: impl AsyncRead + Unpin,
    pool: String,
    pid: u32,
    stream: &str,
) {
    let mut pending: Vec<u8> = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        let read = match pipe.read(&mut chunk).await {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        pending.extend_from_slice(chunk.get(..read).unwrap_or_default());
        for line in take_lines(&mut pending) {
            log_line(&line, &pool, pid, stream);
        }
    }
    if !pending.is_empty() {
        log_line(&pending, &pool, pid, stream);
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
    let text = String::from_utf8_lossy(line);
    let text = text.trim_end_matches(['\n', '\r']);
    tracing::info!(target: "corral::worker", pool, pid, stream, "{text}");
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
