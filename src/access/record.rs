//! One request's access-log line: the fields a `Record` keeps and their text (nginx's
//! combined format with corral's fields after it) and JSON forms, with the UTC calendar
//! arithmetic the timestamps need.

use std::fmt::Write as _;
use std::time::{Duration, SystemTime};

use bytes::Bytes;

use crate::config::AccessFormat;
use crate::protocols::cgi::CgiParams;

use super::SlowStack;

/// One request, as its log line shows it. Made only when a log is on.
#[derive(Debug, Clone)]
pub struct Record {
    /// The client (REMOTE_ADDR), if known.
    pub client: Bytes,
    /// REQUEST_METHOD.
    pub method: Bytes,
    /// REQUEST_URI.
    pub uri: Bytes,
    /// SERVER_PROTOCOL.
    pub protocol: Bytes,
    /// HTTP_HOST.
    pub host: Bytes,
    /// HTTP_REFERER.
    pub referer: Bytes,
    /// HTTP_USER_AGENT.
    pub user_agent: Bytes,
    /// The pool.
    pub pool: std::sync::Arc<str>,
    /// The generation that routed it.
    pub generation: u64,
    /// corral's request id.
    pub request_id: u64,
    /// The worker that served it, when one did and corral knows its pid.
    pub worker_pid: Option<u32>,
    /// The status sent.
    pub status: u16,
    /// Response body bytes sent on.
    pub bytes: u64,
    /// Waiting for a slot.
    pub queue: Duration,
    /// Getting a backend connection.
    pub connect: Duration,
    /// From the request sent to the response head.
    pub head: Duration,
    /// From asking for a slot to the response's end.
    pub total: Duration,
    /// The client went away (or the backend broke off) before the response ended.
    pub aborted: bool,
    /// The worker's stacks when the request passed `slow_threshold` (slow log only).
    pub stack: Option<std::sync::Arc<SlowStack>>,
}

impl Record {
    /// The fields of a request from its CGI variables.
    pub fn from_params(
        params: &CgiParams,
        pool: std::sync::Arc<str>,
        generation: u64,
        request_id: u64,
    ) -> Record {
        // One pass over the variables (some thirty) rather than one per field, and one
        // copy of the seven values, which the fields then share.
        let mut found: [&[u8]; 7] = [&[]; 7];
        for (name, value) in params.iter() {
            let slot = match name {
                b"REMOTE_ADDR" => 0,
                b"REQUEST_METHOD" => 1,
                b"REQUEST_URI" => 2,
                b"SERVER_PROTOCOL" => 3,
                b"HTTP_HOST" => 4,
                b"HTTP_REFERER" => 5,
                b"HTTP_USER_AGENT" => 6,
                _ => continue,
            };
            if let Some(f) = found.get_mut(slot) {
                *f = value;
            }
        }
        let all = Bytes::from(found.concat());
        let mut at = 0;
        let fields = found.map(|value| {
            let field = all.slice(at..at + value.len());
            at += value.len();
            field
        });
        let [client, method, uri, protocol, host, referer, user_agent] = fields;
        Record {
            client,
            method,
            uri,
            protocol,
            host,
            referer,
            user_agent,
            pool,
            generation,
            request_id,
            worker_pid: None,
            status: 0,
            bytes: 0,
            queue: Duration::ZERO,
            connect: Duration::ZERO,
            head: Duration::ZERO,
            total: Duration::ZERO,
            aborted: false,
            stack: None,
        }
    }

    /// The line in `format`, ending with a newline.
    pub fn line(&self, format: AccessFormat, at: SystemTime) -> String {
        match format {
            AccessFormat::Text => self.text(at),
            AccessFormat::Json => self.json(at),
        }
    }

    fn text(&self, at: SystemTime) -> String {
        // Every request with an access log comes through here: the line is pushed piece by
        // piece (no `write!`, whose machinery was most of the log's cost per request) and
        // the time is formatted once per second.
        let mut out = String::with_capacity(
            200 + self.uri.len() + self.user_agent.len() + self.referer.len() + self.host.len(),
        );
        fn or_dash(b: &[u8]) -> &[u8] {
            if b.is_empty() {
                b"-"
            } else {
                b
            }
        }
        push_quoted(&mut out, or_dash(&self.client));
        out.push_str(" - - [");
        push_clf_time(&mut out, at);
        out.push_str("] \"");
        push_quoted(&mut out, &self.method);
        out.push(' ');
        push_quoted(&mut out, &self.uri);
        out.push(' ');
        push_quoted(&mut out, &self.protocol);
        out.push_str("\" ");
        push_u64(&mut out, u64::from(self.status));
        out.push(' ');
        push_u64(&mut out, self.bytes);
        out.push_str(" \"");
        push_quoted(&mut out, or_dash(&self.referer));
        out.push_str("\" \"");
        push_quoted(&mut out, or_dash(&self.user_agent));
        out.push_str("\" host=\"");
        push_quoted(&mut out, &self.host);
        out.push_str("\" pool=");
        out.push_str(&self.pool);
        out.push_str(" pid=");
        match self.worker_pid {
            Some(p) => push_u64(&mut out, u64::from(p)),
            None => out.push('-'),
        }
        out.push_str(" gen=");
        push_u64(&mut out, self.generation);
        out.push_str(" id=");
        push_u64(&mut out, self.request_id);
        for (name, d) in [
            (" queue=", self.queue),
            (" connect=", self.connect),
            (" head=", self.head),
            (" total=", self.total),
        ] {
            out.push_str(name);
            push_seconds(&mut out, d);
        }
        if self.aborted {
            out.push_str(" aborted");
        }
        out.push('\n');
        out
    }

    fn json(&self, at: SystemTime) -> String {
        let mut out = String::with_capacity(320);
        out.push('{');
        let field = |out: &mut String, name: &str, value: &[u8]| {
            let _ = write!(out, "\"{name}\":\"");
            crate::logs::json_escape(out, value);
            out.push_str("\",");
        };
        field(&mut out, "time", iso_time(at).as_bytes());
        field(&mut out, "client", &self.client);
        field(&mut out, "method", &self.method);
        field(&mut out, "uri", &self.uri);
        field(&mut out, "protocol", &self.protocol);
        field(&mut out, "host", &self.host);
        field(&mut out, "referer", &self.referer);
        field(&mut out, "user_agent", &self.user_agent);
        field(&mut out, "pool", self.pool.as_bytes());
        let _ = write!(
            out,
            "\"status\":{},\"bytes\":{},\"worker_pid\":{},\"generation\":{},\"request_id\":{},\
             \"queue_ms\":{:.3},\"connect_ms\":{:.3},\"head_ms\":{:.3},\"total_ms\":{:.3},\
             \"aborted\":{}}}",
            self.status,
            self.bytes,
            self.worker_pid
                .map_or_else(|| "null".to_owned(), |p| p.to_string()),
            self.generation,
            self.request_id,
            ms(self.queue),
            ms(self.connect),
            ms(self.head),
            ms(self.total),
            self.aborted,
        );
        out.push('\n');
        out
    }
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// Peer bytes inside a quoted text field: `"` and `\` escaped, and anything not printable
/// ASCII as `\xHH`, so a line can never be split or forged by what a client sent.
fn push_quoted(out: &mut String, bytes: &[u8]) {
    const HEX: &[u8; 16] = b"0123456789ABCDEF";
    for &b in bytes {
        match b {
            b'"' => out.push_str("\\\""),
            b'\\' => out.push_str("\\\\"),
            0x20..=0x7e => out.push(char::from(b)),
            _ => {
                out.push_str("\\x");
                out.push(char::from(HEX[usize::from(b >> 4)]));
                out.push(char::from(HEX[usize::from(b & 0xf)]));
            }
        }
    }
}

/// `v` in decimal.
fn push_u64(out: &mut String, mut v: u64) {
    let mut digits = [0u8; 20];
    let mut at = digits.len();
    loop {
        at -= 1;
        digits[at] = b'0' + (v % 10) as u8;
        v /= 10;
        if v == 0 {
            break;
        }
    }
    for &d in &digits[at..] {
        out.push(char::from(d));
    }
}

/// `d` in seconds with six decimals (`0.000123`).
fn push_seconds(out: &mut String, d: Duration) {
    push_u64(out, d.as_secs());
    out.push('.');
    let micros = d.subsec_micros();
    let mut div = 100_000;
    while div > 0 {
        out.push(char::from(b'0' + (micros / div % 10) as u8));
        div /= 10;
    }
}

/// (year, month, day, hour, minute, second, millisecond) of `at`, in UTC.
fn civil(at: SystemTime) -> (i64, u32, u32, u32, u32, u32, u32) {
    let since = at
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap_or(Duration::ZERO);
    let secs = i64::try_from(since.as_secs()).unwrap_or(0);
    let days = secs.div_euclid(86_400);
    let rem = secs.rem_euclid(86_400);
    // Days since 1970-01-01 to a proleptic Gregorian date (Howard Hinnant's method).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    let n = |v: i64| u32::try_from(v).unwrap_or(0);
    (
        year,
        n(month),
        n(day),
        n(rem / 3600),
        n(rem % 3600 / 60),
        n(rem % 60),
        since.subsec_millis(),
    )
}

/// `01/Dec/2026:10:15:34 +0000`, the common log format's time, in UTC.
fn clf_time(at: SystemTime) -> String {
    const MONTHS: [&str; 12] = [
        "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
    ];
    let (y, mo, d, h, mi, s, _) = civil(at);
    let month = MONTHS
        .get(usize::try_from(mo.saturating_sub(1)).unwrap_or(0))
        .unwrap_or(&"Jan");
    format!("{d:02}/{month}/{y}:{h:02}:{mi:02}:{s:02} +0000")
}

/// Appends [`clf_time`], formatted once per second per thread.
fn push_clf_time(out: &mut String, at: SystemTime) {
    thread_local! {
        static LAST: std::cell::RefCell<(u64, String)> = const { std::cell::RefCell::new((u64::MAX, String::new())) };
    }
    let second = at
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    LAST.with(|last| {
        let mut last = last.borrow_mut();
        if last.0 != second {
            *last = (second, clf_time(at));
        }
        out.push_str(&last.1);
    });
}

/// `2026-12-01T10:15:34.123Z`.
fn iso_time(at: SystemTime) -> String {
    let (y, mo, d, h, mi, s, ms) = civil(at);
    format!("{y}-{mo:02}-{d:02}T{h:02}:{mi:02}:{s:02}.{ms:03}Z")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record() -> Record {
        let params = vec![
            (
                Bytes::from_static(b"REMOTE_ADDR"),
                Bytes::from_static(b"192.0.2.1"),
            ),
            (
                Bytes::from_static(b"REQUEST_METHOD"),
                Bytes::from_static(b"GET"),
            ),
            (
                Bytes::from_static(b"REQUEST_URI"),
                Bytes::from_static(b"/a\"b\n\xff"),
            ),
            (
                Bytes::from_static(b"SERVER_PROTOCOL"),
                Bytes::from_static(b"HTTP/1.1"),
            ),
        ];
        let params = CgiParams::from_pairs(&params).unwrap();
        let mut r = Record::from_params(&params, "php".into(), 2, 9);
        r.status = 200;
        r.bytes = 12;
        r.worker_pid = Some(77);
        r.total = Duration::from_millis(15);
        r
    }

    #[test]
    fn times_are_utc_calendar_dates() {
        let at = SystemTime::UNIX_EPOCH + Duration::from_millis(1_796_120_134_123);
        assert_eq!(iso_time(at), "2026-12-01T10:15:34.123Z");
        assert_eq!(clf_time(at), "01/Dec/2026:10:15:34 +0000");
        let leap = SystemTime::UNIX_EPOCH + Duration::from_secs(951_782_400);
        assert_eq!(iso_time(leap), "2000-02-29T00:00:00.000Z");
    }

    #[test]
    fn peer_bytes_cannot_break_a_text_line() {
        let line = record().line(AccessFormat::Text, SystemTime::UNIX_EPOCH);
        assert_eq!(line.matches('\n').count(), 1);
        assert!(
            line.contains("\"GET /a\\\"b\\x0A\\xFF HTTP/1.1\" 200 12 \"-\" \"-\""),
            "{line}"
        );
        assert!(line.contains(" pool=php pid=77 gen=2 id=9 "), "{line}");
        assert!(line.contains(" total=0.015000"), "{line}");
    }

    #[test]
    fn a_text_line_is_the_common_log_format_and_corrals_fields() {
        let mut r = record();
        r.queue = Duration::from_micros(1_000_007);
        r.worker_pid = None;
        r.aborted = true;
        let at = SystemTime::UNIX_EPOCH + Duration::from_millis(1_796_120_134_123);
        assert_eq!(
            r.line(AccessFormat::Text, at),
            "192.0.2.1 - - [01/Dec/2026:10:15:34 +0000] \"GET /a\\\"b\\x0A\\xFF HTTP/1.1\" \
             200 12 \"-\" \"-\" host=\"\" pool=php pid=- gen=2 id=9 queue=1.000007 \
             connect=0.000000 head=0.000000 total=0.015000 aborted\n"
        );
        // The per-second time cache follows the clock.
        let later = r.line(AccessFormat::Text, at + Duration::from_secs(61));
        assert!(later.contains("[01/Dec/2026:10:16:35 +0000]"), "{later}");
    }

    #[test]
    fn json_lines_escape_what_json_cannot_hold() {
        let line = record().line(AccessFormat::Json, SystemTime::UNIX_EPOCH);
        assert_eq!(line.matches('\n').count(), 1);
        assert!(line.contains(r#""uri":"/a\"b\u000a\\xff""#), "{line}");
        assert!(
            line.contains(r#""status":200,"bytes":12,"worker_pid":77"#),
            "{line}"
        );
        assert!(line.contains(r#""total_ms":15.000"#), "{line}");
    }
}
