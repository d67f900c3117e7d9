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
    begin_request(params, len, &options.limits)
        .and_then(|builder| builder.encode(&mut head))
        .map_err(|e| BackendError::RequestHead {
            protocol: Protocol::Lsapi,
            reason: e.to_string(),
        })?;
    let codec = AnyCodec::Lsapi(Codec::new(&options.limits));
    Ok(begin(conn, codec, head, body, Some(len), options, started))
}

fn param<'a>(params: &'a CgiParams, name: &str) -> Option<&'a [u8]> {
    params.get(name.as_bytes())
}

/// The request line of the synthesised HTTP head: lsphp never parses it, but header
/// offsets count from it.
fn request_line(params: &CgiParams) -> Vec<u8> {
    let method = param(params, "REQUEST_METHOD").unwrap_or(b"GET");
    let protocol = param(params, "SERVER_PROTOCOL").unwrap_or(b"HTTP/1.1");
    let mut line = method.to_vec();
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
    line
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

/// Builds BEGIN_REQUEST: `HTTP_*` parameters and `CONTENT_TYPE` become request headers,
/// `Content-Length` carries the real body length, every other parameter is an env pair.
fn begin_request(
    params: &CgiParams,
    body_len: u64,
    limits: &Limits,
) -> Result<RequestBuilder, LsapiError> {
    let mut builder = RequestBuilder::new(limits, &request_line(params))?;
    let mut had_length = false;
    let mut name_buf = Vec::with_capacity(64);
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
                builder.header(header_name(cgi, &mut name_buf), value)?;
            }
            n => builder.env(n, value)?,
        }
    }
    if body_len > 0 || had_length {
        builder.header(b"Content-Length", body_len.to_string().as_bytes())?;
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
    Ok(builder)
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
    let mut text = BytesMut::new();
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
}
