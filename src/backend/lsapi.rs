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
    LsapiError, RequestBuilder, ResponseDecoder, ResponseEvent, TextEvent, POINTED_ENV,
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
/// lsphp never parses it, but header offsets count from it. The parameters it is made of
/// are found in one pass (the first of each name, as [`CgiParams::get`] finds).
fn request_line(params: &CgiParams, line: &mut Vec<u8>) {
    const METHOD: usize = 0;
    const PROTOCOL: usize = 1;
    const URI: usize = 2;
    const SCRIPT: usize = 3;
    const PATH_INFO: usize = 4;
    const QUERY: usize = 5;
    let mut found: [Option<&[u8]>; 6] = [None; 6];
    for (name, value) in params.iter() {
        let at = match name {
            b"REQUEST_METHOD" => METHOD,
            b"SERVER_PROTOCOL" => PROTOCOL,
            b"REQUEST_URI" => URI,
            b"SCRIPT_NAME" => SCRIPT,
            b"PATH_INFO" => PATH_INFO,
            b"QUERY_STRING" => QUERY,
            _ => continue,
        };
        if let Some(slot @ None) = found.get_mut(at) {
            *slot = Some(value);
        }
    }
    let [method, protocol, uri, script, path_info, query] = found;
    line.clear();
    line.extend_from_slice(method.unwrap_or(b"GET"));
    line.push(b' ');
    match uri.filter(|u| !u.is_empty()) {
        Some(uri) => line.extend_from_slice(uri),
        None => {
            line.extend_from_slice(script.unwrap_or(b"/"));
            line.extend_from_slice(path_info.unwrap_or_default());
            if let Some(q) = query.filter(|q| !q.is_empty()) {
                line.push(b'?');
                line.extend_from_slice(q);
            }
        }
    }
    line.push(b' ');
    line.extend_from_slice(protocol.unwrap_or(b"HTTP/1.1"));
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
    // The pointed variables the parameters lacked (the builder saw every env pair).
    let mut missing = [""; POINTED_ENV.len()];
    for (slot, name) in missing.iter_mut().zip(builder.missing_pointed()) {
        *slot = name;
    }
    for name in missing.into_iter().filter(|n| !n.is_empty()) {
        let value: &[u8] = if name == "REQUEST_METHOD" {
            b"GET"
        } else {
            b""
        };
        builder.env(name.as_bytes(), value)?;
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
        let event = match self.packets.decode_text(src) {
            Ok(Some(TextEvent::Head { status, text })) => {
                self.head_seen = true;
                return Ok(Some(Step::Head(cgi_head(status, text, &self.limits)?)));
            }
            Ok(Some(TextEvent::Event(event))) => event,
            Ok(None) => return Ok(None),
            // A line with a CR or LF: the packet is well framed, the application's head
            // is not.
            Err(e @ LsapiError::InvalidHeaderBytes { .. }) => {
                return Err(BackendError::InvalidHead {
                    protocol: Protocol::Lsapi,
                    rule: e.to_string(),
                })
            }
            Err(e) => return Err(violation(e)),
        };
        let step = match event {
            ResponseEvent::ReqReceived | ResponseEvent::Pid(_) => Step::Nothing,
            ResponseEvent::Stderr(text) => Step::Stderr(text),
            // decode_text gives RESP_HEADER as text (above).
            ResponseEvent::Header(_) => Step::Nothing,
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

/// RESP_HEADER as a CGI head: its lines, as `text` (see `ResponseDecoder::decode_text`), go
/// through the same strict parser as a CGI response, without a copy; a non-zero
/// `m_status` wins over a `Status:` line (protocols/LSAPI.md §3.2).
///
/// A line the parser refuses is the application's error ([`BackendError::InvalidHead`]), not
/// a broken packet: the packet itself was well framed.
fn cgi_head(status: u16, text: Bytes, limits: &Limits) -> Result<CgiResponseHead, BackendError> {
    let mut text = text;
    let mut parsed = CgiResponseDecoder::new(limits)
        .decode_bytes(&mut text)
        .map_err(|e| BackendError::InvalidHead {
            protocol: Protocol::Lsapi,
            rule: e.to_string(),
        })?
        .ok_or_else(|| violation("RESP_HEADER lines do not form a complete head"))?;
    if status != 0 {
        let reason = match &parsed.status {
            Some(s) if s.code == status => s.reason.clone(),
            _ => Bytes::new(),
        };
        parsed.status = Some(CgiStatus {
            code: status,
            reason,
        });
    }
    Ok(parsed)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::panic)]

    use super::*;

    /// A RESP_HEADER packet (native byte order) with `lines`.
    fn head_packet(status: i32, lines: &[&[u8]]) -> BytesMut {
        let mut payload = Vec::new();
        payload.extend_from_slice(&i32::try_from(lines.len()).unwrap().to_ne_bytes());
        payload.extend_from_slice(&status.to_ne_bytes());
        for line in lines {
            payload.extend_from_slice(&u16::try_from(line.len() + 1).unwrap().to_ne_bytes());
        }
        for line in lines {
            payload.extend_from_slice(line);
            payload.push(0);
        }
        let mut packet = BytesMut::new();
        crate::protocols::lsapi::ResponseEncoder::default().req_received(&mut packet);
        let mut head = BytesMut::new();
        let fields: Vec<(&[u8], &[u8])> = Vec::new();
        crate::protocols::lsapi::ResponseEncoder::default()
            .header(200, &fields, &mut head)
            .unwrap();
        // The encoder's 8-byte packet header, with this payload's length.
        let len = 8 + payload.len();
        let mut header = head.split_to(8);
        header[4..8].copy_from_slice(&i32::try_from(len).unwrap().to_ne_bytes());
        packet.extend_from_slice(&header);
        packet.extend_from_slice(&payload);
        packet
    }

    fn decode_head(status: i32, lines: &[&[u8]]) -> Result<Option<Step>, BackendError> {
        let mut src = head_packet(status, lines);
        let mut codec = Codec::new(&Limits::default());
        assert!(matches!(codec.decode(&mut src), Ok(Some(Step::Nothing))));
        codec.decode(&mut src)
    }

    #[test]
    fn a_bad_header_line_is_the_applications_error() {
        for line in [
            &b"X-A: a\x01b"[..],
            b"X A: b",
            b"X-A: a\rb",
            b"X-A: a\nX-B: b",
        ] {
            match decode_head(200, &[line]) {
                Err(BackendError::InvalidHead { .. }) => {}
                Ok(Some(Step::Head(head))) => {
                    panic!("{}: passed as {:?}", line.escape_ascii(), head.headers)
                }
                other => panic!("{}: {other:?}", line.escape_ascii()),
            }
        }
        assert!(matches!(
            decode_head(200, &[b"X-A: ab"]),
            Ok(Some(Step::Head(_)))
        ));
    }

    #[test]
    fn a_head_keeps_its_lines_and_the_packets_status() {
        let Ok(Some(Step::Head(head))) = decode_head(
            404,
            &[
                b"Content-Type: text/html",
                b"Set-Cookie: a=1",
                b"Set-Cookie:b=2",
                b"Status: 200 OK",
            ],
        ) else {
            panic!("no head");
        };
        assert_eq!(head.status.as_ref().map(|s| s.code), Some(404));
        let lines: Vec<String> = head
            .headers
            .iter()
            .map(|(n, v)| format!("{}={}", n.escape_ascii(), v.escape_ascii()))
            .collect();
        assert_eq!(
            lines,
            ["Content-Type=text/html", "Set-Cookie=a=1", "Set-Cookie=b=2"]
        );
        let Ok(Some(Step::Head(head))) = decode_head(0, &[]) else {
            panic!("no empty head");
        };
        assert!(head.headers.is_empty() && head.status.is_none());
    }

    /// The request line built with one lookup per parameter, as it was before the one pass.
    fn line_by_lookups(params: &CgiParams) -> Vec<u8> {
        let get = |n: &str| params.get(n.as_bytes());
        let mut line = get("REQUEST_METHOD").unwrap_or(b"GET").to_vec();
        line.push(b' ');
        match get("REQUEST_URI").filter(|u| !u.is_empty()) {
            Some(uri) => line.extend_from_slice(uri),
            None => {
                line.extend_from_slice(get("SCRIPT_NAME").unwrap_or(b"/"));
                line.extend_from_slice(get("PATH_INFO").unwrap_or_default());
                if let Some(q) = get("QUERY_STRING").filter(|q| !q.is_empty()) {
                    line.push(b'?');
                    line.extend_from_slice(q);
                }
            }
        }
        line.push(b' ');
        line.extend_from_slice(get("SERVER_PROTOCOL").unwrap_or(b"HTTP/1.1"));
        line
    }

    #[test]
    fn the_request_line_takes_the_first_of_each_parameter() {
        let cases: &[&[(&str, &str)]] = &[
            &[],
            &[
                ("REQUEST_METHOD", "POST"),
                ("REQUEST_URI", "/a?b"),
                ("SERVER_PROTOCOL", "HTTP/1.0"),
            ],
            &[
                ("REQUEST_URI", ""),
                ("SCRIPT_NAME", "/s.php"),
                ("PATH_INFO", "/p"),
                ("QUERY_STRING", "q=1"),
            ],
            &[("SCRIPT_NAME", "/s.php"), ("QUERY_STRING", "")],
            &[
                ("REQUEST_URI", "/first"),
                ("REQUEST_URI", "/second"),
                ("REQUEST_METHOD", "PUT"),
                ("REQUEST_METHOD", "GET"),
            ],
            &[
                ("QUERY_STRING", "a"),
                ("QUERY_STRING", "b"),
                ("SCRIPT_NAME", "/x"),
                ("HTTP_HOST", "h"),
            ],
        ];
        let mut line = Vec::new();
        for pairs in cases {
            let params = CgiParams::from_pairs(pairs).unwrap();
            request_line(&params, &mut line);
            assert_eq!(
                line.escape_ascii().to_string(),
                line_by_lookups(&params).escape_ascii().to_string(),
                "{pairs:?}"
            );
        }
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
