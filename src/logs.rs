//! Log hygiene for what peers control: escaping of peer bytes before they reach a log line,
//! and rate limits for lines a peer can make corral write at will.
//!
//! A log line is one line: a request path, a header name or a backend's stderr text with a
//! raw LF, CR or ESC in it would forge lines or terminal escapes in an operator's log, so
//! [`escaped`] writes every control character as an escape ([`json_escape`] does the same
//! inside a JSON string, the JSON access log's). And a client that reconnects in
//! a loop, or a script that writes to stderr in a loop, must not flood the log: a [`LineLimit`]
//! lets a kind of line through at a bounded rate and counts what it held back, so the next
//! line that goes out can say how many were suppressed.

use std::fmt::{self, Write as _};
use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;

/// `bytes` for a log line: printable UTF-8 as is, a backslash doubled, and control
/// characters (C0, DEL, C1) and invalid UTF-8 as `\n`, `\r`, `\t`, `\xNN` or `\u{NNNN}`.
pub fn escaped(bytes: &[u8]) -> Escaped<'_> {
    Escaped(bytes)
}

/// `text` rendered and [`escaped`], for a log field: error messages quote peer bytes (a
/// request path, a header name) in their text.
pub fn clean(text: impl fmt::Display) -> String {
    escaped(text.to_string().as_bytes()).to_string()
}

/// See [`escaped`].
#[derive(Debug, Clone, Copy)]
pub struct Escaped<'a>(&'a [u8]);

impl fmt::Display for Escaped<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for chunk in self.0.utf8_chunks() {
            for c in chunk.valid().chars() {
                match c {
                    '\n' => f.write_str("\\n")?,
                    '\r' => f.write_str("\\r")?,
                    '\t' => f.write_str("\\t")?,
                    '\\' => f.write_str("\\\\")?,
                    c if c.is_control() && c.is_ascii() => write!(f, "\\x{:02x}", c as u32)?,
                    c if c.is_control() => write!(f, "\\u{{{:04x}}}", c as u32)?,
                    c => fmt::Write::write_char(f, c)?,
                }
            }
            for b in chunk.invalid() {
                write!(f, "\\x{b:02x}")?;
            }
        }
        Ok(())
    }
}

/// Peer bytes as the inside of a JSON string (the JSON access log's fields), so the line stays one valid JSON object that
/// no log viewer can be fooled by, and every byte can be told apart once decoded:
///
/// - valid UTF-8 is kept, except what JSON or a viewer reads as something else: `"`, C0
///   controls, DEL and the C1 controls (U+0080–U+009F, NEL among them) as `\u00XX`; U+2028
///   and U+2029 (line breaks to JavaScript and many viewers) and the invisible bidirectional
///   and zero-width format characters (U+200B–U+200F, U+202A–U+202E, U+2060–U+2069, U+FEFF),
///   which reorder or hide the text around them, as `\uXXXX`;
/// - in the decoded string a backslash is an escape of corral's own: a backslash the peer
///   sent is `\\` (two backslashes, `\\\\` in the raw JSON) and a byte that is not
///   UTF-8 is `\xNN` (`\\xNN` raw). A JSON `\u00NN` would decode to the character U+00NN,
///   which a peer can send as well, so it cannot stand for an invalid byte.
pub fn json_escape(out: &mut String, bytes: &[u8]) {
    for chunk in bytes.utf8_chunks() {
        for c in chunk.valid().chars() {
            match c {
                '"' => out.push_str("\\\""),
                '\\' => out.push_str("\\\\\\\\"),
                c if c.is_control() || hides_text(c) => {
                    let _ = write!(out, "\\u{:04x}", c as u32);
                }
                c => out.push(c),
            }
        }
        for &b in chunk.invalid() {
            let _ = write!(out, "\\\\x{b:02x}");
        }
    }
}

/// Line separators and invisible format characters a log viewer would act on (see
/// [`json_escape`]).
fn hides_text(c: char) -> bool {
    matches!(
        c,
        '\u{2028}'
            | '\u{2029}'
            | '\u{200b}'..='\u{200f}'
            | '\u{202a}'..='\u{202e}'
            | '\u{2060}'..='\u{2069}'
            | '\u{feff}'
    )
}

/// Lets at most `lines` lines and `bytes` bytes through per `period`, and counts the lines it
/// held back until the next period lets one through.
#[derive(Debug)]
pub struct LineLimit {
    period: Duration,
    lines: u64,
    bytes: u64,
    state: Mutex<Window>,
}

#[derive(Debug, Default)]
struct Window {
    start: Option<Instant>,
    lines: u64,
    bytes: u64,
    suppressed: u64,
}

/// What to do with one line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Log it; `suppressed` lines were held back since the last one logged (say so).
    Log {
        /// Lines dropped before this one.
        suppressed: u64,
    },
    /// Drop it (it is counted).
    Suppress,
}

impl LineLimit {
    /// At most `lines` lines and `bytes` bytes per `period`.
    pub const fn new(period: Duration, lines: u64, bytes: u64) -> LineLimit {
        LineLimit {
            period,
            lines,
            bytes,
            state: Mutex::new(Window {
                start: None,
                lines: 0,
                bytes: 0,
                suppressed: 0,
            }),
        }
    }

    /// One line per second, whatever its length: for per-connection warnings.
    pub const fn per_second() -> LineLimit {
        LineLimit::new(Duration::from_secs(1), 1, u64::MAX)
    }

    /// The verdict on a line of `len` bytes at `now`.
    pub fn check(&self, now: Instant, len: usize) -> Verdict {
        let mut w = match self.state.lock() {
            Ok(w) => w,
            // A panic elsewhere while holding the lock leaves a window that is still valid.
            Err(poisoned) => poisoned.into_inner(),
        };
        if w.start.is_none_or(|s| now.duration_since(s) >= self.period) {
            w.start = Some(now);
            w.lines = 0;
            w.bytes = 0;
        }
        let len = len as u64;
        if w.lines >= self.lines || (w.lines > 0 && w.bytes.saturating_add(len) > self.bytes) {
            w.suppressed += 1;
            return Verdict::Suppress;
        }
        w.lines += 1;
        w.bytes = w.bytes.saturating_add(len);
        Verdict::Log {
            suppressed: std::mem::take(&mut w.suppressed),
        }
    }

    /// Lines held back and not yet reported, leaving the count as it is.
    pub fn suppressed(&self) -> u64 {
        match self.state.lock() {
            Ok(w) => w.suppressed,
            Err(poisoned) => poisoned.into_inner().suppressed,
        }
    }

    /// Lines held back and not yet reported; resets the count (for a last report when the
    /// source ends).
    pub fn take_suppressed(&self) -> u64 {
        match self.state.lock() {
            Ok(mut w) => std::mem::take(&mut w.suppressed),
            Err(poisoned) => std::mem::take(&mut poisoned.into_inner().suppressed),
        }
    }
}

/// Test support: what the code under test logs, as text.
#[cfg(test)]
pub(crate) mod capture {
    use std::sync::{Arc, Mutex};

    /// The text a [`warnings`] subscriber wrote so far.
    #[derive(Clone, Default)]
    pub(crate) struct Captured(Arc<Mutex<Vec<u8>>>);

    impl Captured {
        pub(crate) fn text(&self) -> String {
            let bytes = self.0.lock().unwrap_or_else(|p| p.into_inner()).clone();
            String::from_utf8_lossy(&bytes).into_owned()
        }
    }

    impl std::io::Write for Captured {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .extend_from_slice(buf);
            Ok(buf.len())
        }

        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    /// A subscriber writing warnings and worse, without colour, to the returned buffer.
    pub(crate) fn warnings() -> (Captured, impl tracing::Subscriber + Send + Sync) {
        let captured = Captured::default();
        let writer = captured.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_max_level(tracing::Level::WARN)
            .with_ansi(false)
            .with_writer(move || writer.clone())
            .finish();
        (captured, subscriber)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn control_bytes_are_escaped() {
        let text = escaped(b"/\x1b[31mred\r\nINFO forged\tline\\ \x7f \xc2\x85 caf\xc3\xa9 \xff");
        assert_eq!(
            text.to_string(),
            "/\\x1b[31mred\\r\\nINFO forged\\tline\\\\ \\x7f \\u{0085} caf\u{e9} \\xff"
        );
        let s = text.to_string();
        assert!(!s.bytes().any(|b| b.is_ascii_control()), "{s:?}");
    }

    #[test]
    fn json_escapes_c1_line_separators_and_marks_invalid_bytes_apart() {
        let mut out = String::new();
        json_escape(
            &mut out,
            "a\u{85}b\u{9f}c\u{2028}d\u{2029}e\u{202e}f\u{feff}g\u{e9}\\xff".as_bytes(),
        );
        out.push('|');
        json_escape(&mut out, b"\xff\xc3");
        assert_eq!(
            out,
            r#"a\u0085b\u009fc\u2028d\u2029e\u202ef\ufeffgé\\\\xff|\\xff\\xc3"#
        );
        // A literal "\xff" typed by a client and an invalid byte 0xff differ once decoded,
        // and so do the character U+00FF and the byte 0xff.
        let field = |bytes: &[u8]| {
            let mut s = String::new();
            json_escape(&mut s, bytes);
            s
        };
        assert_ne!(field(b"\\xff"), field(b"\xff"));
        assert_ne!(field("\u{ff}".as_bytes()), field(b"\xff"));
        assert!(!out.contains('\u{85}') && !out.contains('\u{2028}'));
    }

    #[test]
    fn a_limit_lets_one_line_a_second_through_and_counts_the_rest() {
        let limit = LineLimit::per_second();
        let t0 = Instant::now();
        assert_eq!(limit.check(t0, 10), Verdict::Log { suppressed: 0 });
        for i in 1..=5 {
            let t = t0 + Duration::from_millis(100 * i);
            assert_eq!(limit.check(t, 10), Verdict::Suppress);
        }
        let t1 = t0 + Duration::from_secs(1);
        assert_eq!(limit.check(t1, 10), Verdict::Log { suppressed: 5 });
        assert_eq!(limit.check(t1, 10), Verdict::Suppress);
        assert_eq!(limit.suppressed(), 1, "a look leaves the count");
        assert_eq!(limit.suppressed(), 1);
        assert_eq!(limit.take_suppressed(), 1);
        assert_eq!(limit.take_suppressed(), 0);
        assert_eq!(limit.suppressed(), 0);
    }

    #[test]
    fn a_limit_counts_bytes_too_but_always_lets_a_first_line_through() {
        let limit = LineLimit::new(Duration::from_secs(1), 100, 20);
        let t0 = Instant::now();
        assert_eq!(limit.check(t0, 50), Verdict::Log { suppressed: 0 });
        assert_eq!(limit.check(t0, 1), Verdict::Suppress);
        let limit = LineLimit::new(Duration::from_secs(1), 100, 20);
        assert_eq!(limit.check(t0, 8), Verdict::Log { suppressed: 0 });
        assert_eq!(limit.check(t0, 8), Verdict::Log { suppressed: 0 });
        assert_eq!(limit.check(t0, 8), Verdict::Suppress);
        assert_eq!(
            limit.check(t0 + Duration::from_secs(2), 8),
            Verdict::Log { suppressed: 1 }
        );
    }
}
