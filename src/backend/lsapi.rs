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
    encode_cgi_request, CgiScratch, LsapiError, ResponseDecoder, ResponseEvent, TextEvent,
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

thread_local! {
    /// What encoding one BEGIN_REQUEST reuses, kept by each serving thread from one request
    /// to the next so that a request allocates none of it.
    static SCRATCH: std::cell::RefCell<CgiScratch> = std::cell::RefCell::new(CgiScratch::default());
}

/// Appends the BEGIN_REQUEST packet of a request with a body of `body_len` bytes to `dst`,
/// encoded straight from the CGI variables with this thread's scratch
/// ([`encode_cgi_request`]: `HTTP_*` variables and `CONTENT_TYPE` become request headers,
/// `Content-Length` carries the real body length, any other variable is an env pair).
fn encode_begin_request(
    params: &CgiParams,
    body_len: u64,
    limits: &Limits,
    dst: &mut BytesMut,
) -> Result<(), LsapiError> {
    SCRATCH.with(|scratch| match scratch.try_borrow_mut() {
        Ok(mut scratch) => encode_cgi_request(params, body_len, limits, &mut scratch, dst),
        // Nothing in here awaits or calls back into this function: the borrow cannot fail,
        // but a scratch of its own is as good if it ever did.
        Err(_) => encode_cgi_request(params, body_len, limits, &mut CgiScratch::default(), dst),
    })
}

fn violation(rule: impl ToString) -> BackendError {
    BackendError::Protocol {
        protocol: Protocol::Lsapi,
        rule: rule.to_string(),
    }
}

/// What an empty read buffer is given room for before the next read: a native worker's
/// largest write (64 KiB of RESP_STREAM packets and their headers).
const READ_ROOM: usize = 64 * 1024 + 4 * 8;

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
            // Body bytes go on as they are read: the read buffer never keeps part of a
            // packet behind, so refilling it copies nothing (ResponseDecoder::partial_streams).
            packets: ResponseDecoder::new(limits).partial_streams(true),
            limits: limits.clone(),
            head_seen: false,
            closing: false,
        }
    }

    pub(super) fn decode(&mut self, src: &mut BytesMut) -> Result<Option<Step>, BackendError> {
        let event = match self.packets.decode_text(src) {
            Ok(None) if src.is_empty() => {
                // Room for a whole write of the worker's (its packets go out 64 KiB at a
                // time) before the exchange reads: with nothing buffered this moves no byte,
                // and the answer then comes in one read rather than in 32 KiB reads.
                if src.capacity() < READ_ROOM {
                    src.reserve(READ_ROOM);
                }
                return Ok(None);
            }
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
    // The packet's status wins over a different `Status:` line (whose reason then goes with
    // it); one that agrees leaves the head as decoded, so it is not checked again when written.
    if status != 0 && parsed.status().map(|s| s.code) != Some(status) {
        parsed.set_status(Some(CgiStatus {
            code: status,
            reason: Bytes::new(),
        }));
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
                    panic!("{}: passed as {:?}", line.escape_ascii(), head.headers())
                }
                other => panic!("{}: {other:?}", line.escape_ascii()),
            }
        }
        assert!(matches!(
            decode_head(200, &[b"X-A: ab"]),
            Ok(Some(Step::Head(_)))
        ));
    }

    /// An empty line would end the head's text early, dropping the lines after it unseen:
    /// the head is refused (502, the rule named in the log) rather than cut.
    #[test]
    fn an_empty_header_line_is_the_applications_error() {
        for lines in [
            &[&b"X-A: a"[..], b"", b"Set-Cookie: s=1"][..],
            &[b""],
            &[b"Content-Type: text/plain", b""],
        ] {
            match decode_head(200, lines) {
                Err(BackendError::InvalidHead { rule, .. }) => {
                    assert!(rule.contains("empty"), "{rule}")
                }
                other => panic!("{lines:?}: {other:?}"),
            }
        }
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
        assert_eq!(head.status().map(|s| s.code), Some(404));
        let lines: Vec<String> = head
            .headers()
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
        assert!(head.headers().is_empty() && head.status().is_none());
    }

    /// Once everything buffered is decoded, the buffer has room for a whole write of the
    /// worker's, without moving the stream bytes already handed out (they keep theirs).
    #[test]
    fn an_emptied_buffer_gets_room_for_a_whole_write() {
        let mut src = head_packet(200, &[b"Content-Type: text/plain"]);
        let encoder = crate::protocols::lsapi::ResponseEncoder::default();
        encoder.stream(&[b'x'; 16384], &mut src);
        encoder.stream(b"tail", &mut src);
        let mut codec = Codec::new(&Limits::default());
        let mut data = Vec::new();
        loop {
            match codec.decode(&mut src) {
                Ok(Some(Step::Data(bytes))) => data.push(bytes),
                Ok(Some(_)) => {}
                Ok(None) => break,
                Err(e) => panic!("{e}"),
            }
        }
        assert!(src.is_empty());
        assert!(src.capacity() >= READ_ROOM, "{}", src.capacity());
        assert_eq!(data.iter().map(|d| d.len()).sum::<usize>(), 16388);
        assert!(data[0].iter().all(|&b| b == b'x'));
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
