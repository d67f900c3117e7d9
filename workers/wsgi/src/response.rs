//! One request's answer as LSAPI packets, and the loop that serves a connection's requests.
//! Packets are queued in the connection's reused buffer and written together: REQ_RECEIVED
//! leads the first write (corral takes from it only that a byte came), the head leaves with
//! the first body bytes, and a list body leaves whole with RESP_END, so a small answer is
//! one write(2). An iterable the app yields from is written chunk by chunk (PEP 3333 forbids
//! holding a block back).
//!
//! The chunk that completes the Content-Length the head announces leaves with RESP_END, not
//! after the iterable ends: corral stops reading an answer at its Content-Length and may drop
//! an exchange whose end has not come with those bytes (its client gone, say), closing the
//! connection; an end written later would then find it closed, and corral would lose a
//! connection it could have kept. Bytes past the announced ones cannot follow RESP_END: the
//! worker logs them and closes the connection.

use corral_protocols::lsapi::{FlagRule, RequestView, ResponseEncoder};

use crate::conn::{Conn, End};
use crate::environ::{self, Keys};
use crate::python::{self, Outcome};

/// Response bytes queued before they are written.
const FLUSH_AT: usize = 64 * 1024;

/// The body of the 500 that replaces an app's failed answer.
const ERROR_BODY: &[u8] = b"Internal Server Error\n";

/// One request's answer, reached by python.c's callbacks while the app runs.
pub struct Exchange<'c> {
    conn: &'c mut Conn,
    /// The request, for log lines.
    view: &'c RequestView,
    encoder: ResponseEncoder,
    /// Where the head starts in the queue (a head replaced through exc_info is cut there).
    head_at: Option<usize>,
    /// Whether anything past REQ_RECEIVED was written.
    head_sent: bool,
    broken: bool,
    /// Body bytes the head's Content-Length still announces; None without one (or with two,
    /// or one that is not a plain count).
    left: Option<u64>,
    /// Whether RESP_END has been queued (the announced body is whole).
    ended: bool,
    /// Whether the app gave bytes past its Content-Length (logged; the connection closes).
    over: bool,
}

impl Exchange<'_> {
    /// "GET /path?query" for log lines (made only when a line is written).
    pub fn what(&self) -> String {
        describe(self.view)
    }

    /// wsgi.input's reads.
    pub fn read_body(&mut self, dst: &mut [u8]) -> Result<usize, ()> {
        self.conn.read_body(dst).map_err(|end| {
            let why = match end {
                End::Failed(why) => why,
                End::Closed | End::Stopping => "the connection ended".to_owned(),
            };
            crate::log(&format!("{}: reading the request body: {why}", self.what()));
            self.broken = true;
        })
    }

    /// Queues RESP_HEADER; a head not yet written is replaced (start_response with exc_info).
    pub fn head(&mut self, status: u16, headers: &[(&[u8], &[u8])]) -> Result<(), String> {
        if let Some(at) = self.head_at.take() {
            self.conn.out.truncate(at);
        }
        let at = self.conn.out.len();
        self.encoder
            .header(status, headers, &mut self.conn.out)
            .map_err(|e| e.to_string())?;
        self.head_at = Some(at);
        self.left = announced_length(headers);
        Ok(())
    }

    /// Queues body bytes, written at once with `flush` or when the queue is full; false
    /// when the connection is gone.
    pub fn write(&mut self, data: &[u8], flush: bool) -> bool {
        if self.broken {
            return false;
        }
        if let Some(left) = self.left.filter(|_| !data.is_empty()) {
            match usize::try_from(left) {
                Ok(left) if left <= data.len() => return self.complete(data, left),
                _ => self.left = Some(left - data.len() as u64),
            }
        }
        self.encoder.stream(data, &mut self.conn.out);
        if flush || self.conn.out.len() >= FLUSH_AT {
            self.flush();
        }
        !self.broken
    }

    /// `data` holds the last `left` bytes the head announced (and maybe more): they leave
    /// with RESP_END, in one write; what is past them is logged and closes the connection.
    fn complete(&mut self, data: &[u8], left: usize) -> bool {
        let (whole, past) = data.split_at(left.min(data.len()));
        if !self.ended {
            if !whole.is_empty() {
                self.encoder.stream(whole, &mut self.conn.out);
            }
            self.encoder.end(&mut self.conn.out);
            self.ended = true;
            self.left = Some(0);
            self.flush();
        }
        if !past.is_empty() {
            crate::log(&format!(
                "{}: the application gave more than its Content-Length; the connection closes",
                self.what()
            ));
            self.over = true;
            self.broken = true;
        }
        !self.broken
    }

    /// Whether any of the head has been written.
    pub fn head_sent(&self) -> bool {
        self.head_sent
    }

    fn flush(&mut self) {
        if self.broken {
            self.conn.out.clear();
            return;
        }
        self.head_sent = self.head_sent || self.head_at.is_some();
        if let Err(e) = self.conn.flush() {
            crate::log(&format!(
                "{}: connection to corral lost while answering ({e})",
                self.what()
            ));
            self.broken = true;
        }
    }

    /// RESP_END and the last write (unless the announced body already took it along);
    /// whether the connection can carry another request.
    fn end(mut self) -> bool {
        if !self.ended {
            self.encoder.end(&mut self.conn.out);
            self.flush();
        }
        !self.broken
    }

    /// Replaces the queued answer (none of it written) with `status` and a short text.
    fn answer(mut self, status: u16, body: &[u8]) -> bool {
        self.conn.out.clear();
        self.encoder.req_received(&mut self.conn.out);
        let mut length = [0u8; 20];
        let length = decimal(body.len(), &mut length);
        let headers: [(&[u8], &[u8]); 2] = [
            (b"Content-Type", b"text/plain; charset=utf-8"),
            (b"Content-Length", length),
        ];
        // A status and two short fixed headers always encode.
        let _ = self.encoder.header(status, &headers, &mut self.conn.out);
        self.head_at = Some(0);
        self.encoder.stream(body, &mut self.conn.out);
        self.end()
    }
}

/// The body length `headers` announce: their one Content-Length, a plain count (spaces
/// around it allowed); None without one, with two, or with anything else.
fn announced_length(headers: &[(&[u8], &[u8])]) -> Option<u64> {
    let mut found = None;
    for (name, value) in headers {
        if name.len() != 14 || !name.eq_ignore_ascii_case(b"content-length") {
            continue;
        }
        if found.is_some() {
            return None;
        }
        let digits = value.trim_ascii();
        if digits.is_empty() || digits.len() > 18 || !digits.iter().all(u8::is_ascii_digit) {
            return None;
        }
        found = Some(
            digits
                .iter()
                .fold(0u64, |n, d| n * 10 + u64::from(d - b'0')),
        );
    }
    found
}

fn decimal(mut n: usize, buf: &mut [u8; 20]) -> &[u8] {
    let mut at = buf.len();
    loop {
        at -= 1;
        if let Some(slot) = buf.get_mut(at) {
            *slot = b'0' + (n % 10) as u8;
        }
        n /= 10;
        if n == 0 || at == 0 {
            break;
        }
    }
    buf.get(at..).unwrap_or_default()
}

/// Serves one connection's requests until it ends, each decoded into `view`.
pub fn serve_connection(conn: &mut Conn, keys: &mut Keys, view: &mut RequestView) -> End {
    loop {
        if let Err(end) = conn.next_request(view) {
            return end;
        }
        if !serve_request(conn, keys, view) {
            return End::Closed;
        }
        if let Err(end) = conn.drain_body() {
            return end;
        }
        if crate::stopping() {
            return End::Stopping;
        }
    }
}

/// Answers one request; whether the connection can carry another.
fn serve_request(conn: &mut Conn, keys: &mut Keys, view: &RequestView) -> bool {
    let served = conn.served;
    conn.out.clear();
    let encoder = ResponseEncoder::new(view.order(), FlagRule::HOST);
    encoder.req_received(&mut conn.out);
    let exchange = Exchange {
        conn,
        view,
        encoder,
        head_at: None,
        head_sent: false,
        broken: false,
        left: None,
        ended: false,
        over: false,
    };
    if environ::env(view, b"CORRAL_READY_PROBE") == Some(b"1") {
        // corral asking whether the app is loaded (it is: this loop runs only once it is),
        // before the worker gets traffic. The app is not called.
        let mut exchange = exchange;
        let none: [(&[u8], &[u8]); 0] = [];
        let _ = exchange.head(204, &none);
        return exchange.end();
    }
    let Some(environ) = environ::build(keys, view, served) else {
        crate::log(&format!(
            "{}: cannot build the environ; answering 500",
            exchange.what()
        ));
        return exchange.answer(500, ERROR_BODY);
    };
    let mut exchange = exchange;
    match python::call(&mut exchange, environ, view.body_len()) {
        Outcome::Answered => exchange.end(),
        Outcome::FailedUnsent if !exchange.broken => exchange.answer(500, ERROR_BODY),
        // The announced body went out whole with RESP_END before the app failed: the
        // answer is complete and the connection in step (the traceback is logged).
        Outcome::FailedSent if exchange.ended && !exchange.broken => true,
        Outcome::FailedUnsent | Outcome::FailedSent | Outcome::Gone => {
            // Bytes past the Content-Length were logged when they came.
            if exchange.head_sent && !exchange.over {
                crate::log(&format!(
                    "{}: the answer was cut short; closing the connection",
                    exchange.what()
                ));
            }
            false
        }
    }
}

/// "GET /path?query" for log lines.
fn describe(view: &RequestView) -> String {
    let text = |b: Option<&[u8]>| String::from_utf8_lossy(b.unwrap_or_default()).into_owned();
    let method = environ::env(view, b"REQUEST_METHOD").or(view.request_method());
    let uri = environ::env(view, b"REQUEST_URI");
    format!("{} {}", text(method), text(uri))
}

#[cfg(test)]
mod tests {
    use super::announced_length;

    #[test]
    fn the_announced_length_is_one_plain_count() {
        let one = |value: &'static [u8]| announced_length(&[(b"Content-Length", value)]);
        assert_eq!(one(b"5"), Some(5));
        assert_eq!(one(b" 0 "), Some(0));
        assert_eq!(one(b"999999999999999999"), Some(999_999_999_999_999_999));
        // Too long to be a count corral accepts, signed, not decimal, empty.
        for bad in [
            &b"1000000000000000000"[..],
            b"+5",
            b"-1",
            b"0x5",
            b"5 5",
            b"",
            b" ",
        ] {
            assert_eq!(one(bad), None, "{bad:?}");
        }
        let cased: [(&[u8], &[u8]); 2] = [(b"Content-Type", b"7"), (b"content-LENGTH", b"7")];
        assert_eq!(announced_length(&cased), Some(7));
        // Two of them (even equal): no end is known ahead; none: the same.
        let two: [(&[u8], &[u8]); 2] = [(b"Content-Length", b"5"), (b"Content-Length", b"5")];
        assert_eq!(announced_length(&two), None);
        assert_eq!(announced_length(&[(b"Content-Lengths", b"5")]), None);
        assert_eq!(announced_length(&[]), None);
    }
}
