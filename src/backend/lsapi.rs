//! LSAPI towards a backend (lsphp): one BEGIN_REQUEST packet carrying the CGI variables and
//! the HTTP headers (rebuilt from the `HTTP_*` parameters), the body raw after it, then
//! REQ_RECEIVED, STDERR, RESP_HEADER, RESP_STREAM… RESP_END; the connection then carries
//! the next request unless the backend sent CONN_CLOSE.
//!
//! BEGIN_REQUEST must state the body length, so a body of unknown length is spooled first.

use bytes::{Bytes, BytesMut};
use tokio::time::Instant;

use super::exchange::{begin, known_length, read_response, Codec as AnyCodec, Exchange, Step};
use super::{
    BackendConnection, BackendError, BackendRequest, BackendResponse, ExchangeOptions, Protocol,
    RequestBody,
};
use crate::protocols::cgi::CgiParams;
use crate::protocols::cgi_response::{CgiResponseDecoder, CgiResponseHead, CgiStatus};
use crate::protocols::lsapi::{
    LsapiError, RequestBuilder, ResponseDecoder, ResponseEvent, ResponseHead, POINTED_ENV,
};
use crate::protocols::Limits;

/// Sends `request` over `conn` and returns once RESP_HEADER has arrived.
pub async fn send(
    conn: BackendConnection,
    request: BackendRequest,
    options: &ExchangeOptions,
) -> Result<BackendResponse, BackendError> {
    let params = CgiParams::from_pairs(&request.params).map_err(|e| BackendError::RequestHead {
        protocol: Protocol::Lsapi,
        reason: e.to_string(),
    })?;
    send_params(conn, &params, request.body, options).await
}

/// [`send`] with the parameters borrowed.
pub async fn send_params(
    conn: BackendConnection,
    params: &CgiParams,
    body: RequestBody,
    options: &ExchangeOptions,
) -> Result<BackendResponse, BackendError> {
    let started = Instant::now();
    let body = known_length(body, options, started).await?;
    read_response(prepare(conn, params, body, options, started)?).await
}

/// The exchange of one request whose body length is known (`known_length`), its head
/// encoded into the connection's write buffer; nothing is sent yet.
pub(super) fn prepare(
    conn: BackendConnection,
    params: &CgiParams,
    body: RequestBody,
    options: &ExchangeOptions,
    started: Instant,
) -> Result<Box<Exchange>, BackendError> {
    let len = body.len().unwrap_or(0);
    let mut conn = conn;
    let mut head = conn.take_outbuf(2048);
    encode_begin_request(params, len, &options.limits, &mut head).map_err(|e| {
        BackendError::RequestHead {
            protocol: Protocol::Lsapi,
            reason: e.to_string(),
        }
    })?;
    let codec = AnyCodec::Lsapi(Codec::new(&options.limits));
    Ok(begin(conn, codec, head, body, Some(len), options, started))
}

fn param<'a>(params: &'a CgiParams, name: &str) -> Option<&'a [u8]> {
    params.get(name.as_bytes())
}

/// What building one BEGIN_REQUEST needs besides the packet's bytes, kept by each serving
/// thread from one request to the next so that a request allocates none of it: the builder
/// and the two lines it is fed from. Each grows at most to lsphp's 64 KiB packet limit.
struct Scratch {
    builder: Option<RequestBuilder>,
    line: Vec<u8>,
    name: Vec<u8>,
}

thread_local! {
    static SCRATCH: std::cell::RefCell<Scratch> = const {
        std::cell::RefCell::new(Scratch {
            builder: None,
            line: Vec::new(),
            name: Vec::new(),
        })
    };
}

/// Appends the BEGIN_REQUEST packet of a request with a body of `body_len` bytes to `dst`,
/// built with this thread's scratch.
fn encode_begin_request(
    params: &CgiParams,
    body_len: u64,
    limits: &Limits,
    dst: &mut BytesMut,
) -> Result<(), LsapiError> {
    SCRATCH.with(|scratch| {
        // Nothing in here awaits or calls back into this function: the borrow cannot fail,
        // but a scratch of its own is as good if it ever did.
        let mut own = None;
        let mut borrowed = scratch.try_borrow_mut().ok();
        let Scratch {
            builder,
            line,
            name,
        } = match borrowed.as_deref_mut() {
            Some(s) => s,
            None => own.insert(Scratch {
                builder: None,
                line: Vec::new(),
                name: Vec::new(),
            }),
        };
        request_line(params, line);
        let builder = match builder {
            Some(b) => {
                b.restart(limits, line)?;
                b
            }
            None => builder.insert(RequestBuilder::new(limits, line)?),
        };
        begin_request(params, body_len, builder, name)?;
        builder.encode(dst)
    })
}

/// The request line of the synthesised HTTP head, written into `line` (cleared first):
/// lsphp never parses it, but header offsets count from it.
fn request_line(params: &CgiParams, line: &mut Vec<u8>) {
    let method = param(params, "REQUEST_METHOD").unwrap_or(b"GET");
    let protocol = param(params, "SERVER_PROTOCOL").unwrap_or(b"HTTP/1.1");
    line.clear();
    line.extend_from_slice(method);
    line.push(b' ');
    match param(params, "REQUEST_URI").filter(|u| !u.is_empty()) {
        Some(uri) => line.extend_from_slice(uri),
        None => {
            line.extend_from_slice(param(params, "SCRIPT_NAME").unwrap_or(b"/"));
            line.extend_from_slice(param(params, "PATH_INFO").unwrap_or_default());
            if let Some(q) = param(params, "QUERY_STRING").filter(|q| !q.is_empty()) {
                line.push(b'?');
                line.extend_from_slice(q);
            }
        }
    }
    line.push(b' ');
    line.extend_from_slice(protocol);
}

/// `HTTP_X_CUSTOM_THING` → `X-Custom-Thing` (lsphp turns it back into the same variable),
/// written into `name` (cleared first), which the caller reuses for every header.
fn header_name<'n>(cgi: &[u8], name: &'n mut Vec<u8>) -> &'n [u8] {
    name.clear();
    for (i, word) in cgi.split(|&b| b == b'_').enumerate() {
        if i > 0 {
            name.push(b'-');
        }
        for (j, &b) in word.iter().enumerate() {
            name.push(if j == 0 {
                b.to_ascii_uppercase()
            } else {
                b.to_ascii_lowercase()
            });
        }
    }
    name
}

/// Fills BEGIN_REQUEST into `builder` (started with the request line): `HTTP_*`
/// parameters and `CONTENT_TYPE` become request headers, `Content-Length` carries the real
/// body length, every other parameter is an env pair. `name_buf` holds each header name.
fn begin_request(
    params: &CgiParams,
    body_len: u64,
    builder: &mut RequestBuilder,
    name_buf: &mut Vec<u8>,
) -> Result<(), LsapiError> {
    let mut had_length = false;
    for (name, value) in params.iter() {
        match name {
            // The body goes raw with its real length; copies of the entity headers that
            // some fronts send as HTTP_* would repeat a known header.
            b"HTTP_CONTENT_LENGTH" | b"HTTP_CONTENT_TYPE" | b"HTTP_TRANSFER_ENCODING" => {}
            b"CONTENT_LENGTH" => had_length = true,
            b"CONTENT_TYPE" => {
                if !value.is_empty() {
                    builder.header(b"Content-Type", value)?;
                }
            }
            n if n.starts_with(b"HTTP_") => {
                let cgi = n.get(5..).unwrap_or_default();
                builder.header(header_name(cgi, name_buf), value)?;
            }
            n => builder.env(n, value)?,
        }
    }
    if body_len > 0 || had_length {
        let mut digits = [0u8; 20];
        builder.header(b"Content-Length", decimal(body_len, &mut digits))?;
    }
    for name in POINTED_ENV {
        if param(params, name).is_none() {
            let value: &[u8] = if name == "REQUEST_METHOD" {
                b"GET"
            } else {
                b""
            };
            builder.env(name.as_bytes(), value)?;
        }
    }
    builder.body_len(body_len);
    Ok(())
}

/// `n` in decimal, written at the end of `buf` (20 digits hold any u64): no allocation.
fn decimal(mut n: u64, buf: &mut [u8; 20]) -> &[u8] {
    let mut at = buf.len();
    loop {
        at -= 1;
        buf[at] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            return &buf[at..];
        }
    }
}

fn violation(rule: impl ToString) -> BackendError {
    BackendError::Protocol {
        protocol: Protocol::Lsapi,
        rule: rule.to_string(),
    }
}

/// Turns the backend's packets into exchange steps.
#[derive(Debug)]
pub(super) struct Codec {
    packets: ResponseDecoder,
    limits: Limits,
    head_seen: bool,
    /// CONN_CLOSE arrived: finish this response, then drop the connection.
    closing: bool,
}

impl Codec {
    fn new(limits: &Limits) -> Codec {
        Codec {
            packets: ResponseDecoder::new(limits),
            limits: limits.clone(),
            head_seen: false,
            closing: false,
        }
    }

    pub(super) fn decode(&mut self, src: &mut BytesMut) -> Result<Option<Step>, BackendError> {
        let Some(event) = self.packets.decode(src).map_err(violation)? else {
            return Ok(None);
        };
        let step = match event {
            ResponseEvent::ReqReceived | ResponseEvent::Pid(_) => Step::Nothing,
            ResponseEvent::Stderr(text) => Step::Stderr(text),
            ResponseEvent::Header(head) => {
                self.head_seen = true;
                Step::Head(cgi_head(&head, &self.limits)?)
            }
            ResponseEvent::Stream(bytes) if bytes.is_empty() => Step::Nothing,
            ResponseEvent::Stream(bytes) => Step::Data(bytes),
            ResponseEvent::ConnClose => {
                self.closing = true;
                Step::Nothing
            }
            // Bytes left after RESP_END (lsphp writes CONN_CLOSE right behind it when it
            // closes) make the exchange keep the connection out of the idle stack.
            ResponseEvent::End => Step::End {
                reusable: !self.closing,
            },
        };
        Ok(Some(step))
    }

    pub(super) fn eof(&mut self, _src: &mut BytesMut) -> Result<Step, BackendError> {
        Err(BackendError::ClosedEarly {
            protocol: Protocol::Lsapi,
            stale: false,
            stage: if self.head_seen {
                "before RESP_END"
            } else {
                "before RESP_HEADER"
            },
        })
    }
}

/// RESP_HEADER as a CGI head: the lines go through the same strict parser as a CGI
/// response, and a non-zero `m_status` wins over a `Status:` line (protocols/LSAPI.md §3.2).
///
/// A line the parser refuses is the application's error ([`BackendError::InvalidHead`]), not
/// a broken packet: the packet itself was well framed.
fn cgi_head(head: &ResponseHead, limits: &Limits) -> Result<CgiResponseHead, BackendError> {
    let invalid = |rule: String| BackendError::InvalidHead {
        protocol: Protocol::Lsapi,
        rule,
    };
    // Sized once: grown line by line, the text was reallocated as it doubled.
    let len = head.lines.iter().map(|l| l.len() + 2).sum::<usize>() + 2;
    let mut text = BytesMut::with_capacity(len);
    for (index, line) in head.lines.iter().enumerate() {
        if line.iter().any(|&b| b == b'\r' || b == b'\n') {
            return Err(invalid(format!(
                "RESP_HEADER line {index} holds a CR or LF byte"
            )));
        }
        text.extend_from_slice(line);
        text.extend_from_slice(b"\r\n");
    }
    text.extend_from_slice(b"\r\n");
    let mut parsed = CgiResponseDecoder::new(limits)
        .decode(&mut text)
        .map_err(|e| invalid(e.to_string()))?
        .ok_or_else(|| violation("RESP_HEADER lines do not form a complete head"))?;
    if head.status != 0 {
        let reason = match &parsed.status {
            Some(s) if s.code == head.status => s.reason.clone(),
            _ => Bytes::new(),
        };
        parsed.status = Some(CgiStatus {
            code: head.status,
            reason,
        });
    }
    Ok(parsed)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::panic)]

    use super::*;

    #[test]
    fn a_bad_header_line_is_the_applications_error() {
        let head = |line: &'static [u8]| ResponseHead {
            status: 200,
            lines: vec![Bytes::from_static(line)],
        };
        for line in [&b"X-A: a\x01b"[..], b"X A: b", b"X-A: a\rb"] {
            match cgi_head(&head(line), &Limits::default()) {
                Err(BackendError::InvalidHead { .. }) => {}
                other => panic!("{}: {other:?}", line.escape_ascii()),
            }
        }
        assert!(cgi_head(&head(b"X-A: ab"), &Limits::default()).is_ok());
    }

    #[test]
    fn decimal_writes_every_u64() {
        let mut buf = [0u8; 20];
        for n in [0, 7, 10, 1234, u64::from(u32::MAX) + 1, u64::MAX] {
            assert_eq!(decimal(n, &mut buf), n.to_string().as_bytes());
        }
    }

    /// The packet a thread's first request gets, from a scratch no request has used.
    fn first_on_a_new_thread(params: CgiParams, body_len: u64) -> BytesMut {
        std::thread::spawn(move || {
            let mut out = BytesMut::new();
            encode_begin_request(&params, body_len, &Limits::default(), &mut out).unwrap();
            out
        })
        .join()
        .unwrap()
    }

    #[test]
    fn the_reused_scratch_encodes_as_a_fresh_one() {
        let big = CgiParams::from_pairs(&[
            ("REQUEST_METHOD", "POST"),
            ("REQUEST_URI", "/a/rather/long/uri.php?with=a&query=string"),
            ("SCRIPT_FILENAME", "/srv/www/uri.php"),
            ("CONTENT_LENGTH", "11"),
            ("CONTENT_TYPE", "text/plain"),
            ("HTTP_X_FIRST_ONLY", "one"),
            ("HTTP_ACCEPT_LANGUAGE", "en"),
            ("HTTP_HOST", "example.test"),
            ("ONLY_IN_THE_FIRST", "env"),
        ])
        .unwrap();
        let small = CgiParams::from_pairs(&[
            ("REQUEST_METHOD", "GET"),
            ("REQUEST_URI", "/b.php"),
            ("SCRIPT_FILENAME", "/srv/www/b.php"),
            ("HTTP_HOST", "b"),
        ])
        .unwrap();
        let expected = first_on_a_new_thread(small.clone(), 0);
        let big_fresh = first_on_a_new_thread(big.clone(), 11);
        std::thread::spawn(move || {
            for _ in 0..2 {
                let mut out = BytesMut::new();
                encode_begin_request(&big, 11, &Limits::default(), &mut out).unwrap();
                assert_eq!(out, big_fresh);
                let mut out = BytesMut::new();
                encode_begin_request(&small, 0, &Limits::default(), &mut out).unwrap();
                assert_eq!(out, expected);
            }
        })
        .join()
        .unwrap();
    }
}
