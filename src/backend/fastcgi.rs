//! FastCGI towards a backend (php-cgi, flup, ruby-fcgi): BEGIN_REQUEST with FCGI_KEEP_CONN,
//! PARAMS, the body as STDIN records as it arrives, then the answer's STDOUT parsed as a CGI
//! response; END_REQUEST frees the connection for the next request.
//!
//! php-cgi's habits are accepted: no empty STDOUT record before END_REQUEST, junk in
//! END_REQUEST's reserved bytes, STDERR records before any STDOUT.

use bytes::{Bytes, BytesMut};
use tokio::time::Instant;

use super::exchange::{begin, read_response, Codec as AnyCodec, CodecSource, Exchange, Step};
use super::Protocol;
use super::{
    BackendConnection, BackendError, BackendRequest, BackendResponse, ExchangeOptions, RequestBody,
};
use crate::protocols::cgi::CgiParams;
use crate::protocols::cgi_response::CgiResponseDecoder;
use crate::protocols::fastcgi::{
    encode_abort_request, encode_begin_request, encode_params_block, encode_stdin,
    encode_stdin_end, ProtocolStatus, ResponseDecoder, ResponseEvent, Role,
};
use crate::protocols::Limits;

/// The request id corral uses: one request at a time per connection, no multiplexing.
const REQUEST_ID: u16 = 1;

/// Sends `request` over `conn` as a FastCGI RESPONDER request with FCGI_KEEP_CONN and
/// returns once the CGI response head has arrived. A body of unknown length is streamed as
/// it comes; the caller's `CONTENT_LENGTH` parameter is passed on unchanged.
pub async fn send(
    conn: BackendConnection,
    request: BackendRequest,
    options: &ExchangeOptions,
) -> Result<BackendResponse, BackendError> {
    let params = CgiParams::from_pairs(&request.params).map_err(|e| BackendError::RequestHead {
        protocol: Protocol::FastCgi,
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
    read_response(prepare(conn, params, body, options, Instant::now())).await
}

/// The exchange of one request, its BEGIN_REQUEST, PARAMS records and (for an empty body)
/// the end of STDIN encoded into the connection's write buffer; nothing is sent yet.
pub(super) fn prepare(
    conn: BackendConnection,
    params: &CgiParams,
    body: RequestBody,
    options: &ExchangeOptions,
    started: Instant,
) -> Box<Exchange> {
    let mut conn = conn;
    let mut head = conn.take_outbuf(params.encoded().len() + 48);
    encode_begin_request(REQUEST_ID, Role::Responder, true, &mut head);
    encode_params_block(REQUEST_ID, params, &mut head);
    let declared = body.len();
    begin(
        conn,
        Fresh(&options.limits),
        head,
        body,
        declared,
        options,
        started,
    )
}

/// A FastCGI codec for the next request, made where the exchange keeps it: a spent
/// exchange's FastCGI codec is reset in place (see [`CodecSource`]).
struct Fresh<'a>(&'a Limits);

impl CodecSource for Fresh<'_> {
    #[inline]
    fn make(self) -> AnyCodec {
        AnyCodec::FastCgi(Codec::new(self.0))
    }

    #[inline]
    fn write_over(self, slot: &mut AnyCodec) {
        match slot {
            AnyCodec::FastCgi(codec) => codec.restart(self.0),
            other => *other = self.make(),
        }
    }
}

/// Turns the backend's records into exchange steps.
#[derive(Debug)]
pub(super) struct Codec {
    records: ResponseDecoder,
    /// The CGI head parser; kept (and restarted in place) across requests.
    parser: CgiResponseDecoder,
    /// Whether the head is still being read: until then STDOUT feeds `parser`.
    in_head: bool,
    /// STDOUT bytes gathered until the head is complete.
    head_bytes: BytesMut,
    /// Body bytes that arrived in the same record as the end of the head.
    pending: Option<Bytes>,
}

fn violation(rule: impl ToString) -> BackendError {
    BackendError::Protocol {
        protocol: Protocol::FastCgi,
        rule: rule.to_string(),
    }
}

impl Codec {
    fn new(limits: &Limits) -> Codec {
        Codec {
            records: ResponseDecoder::new(REQUEST_ID, true, limits),
            parser: CgiResponseDecoder::new(limits),
            in_head: true,
            head_bytes: BytesMut::new(),
            pending: None,
        }
    }

    /// What [`new`](Self::new) makes, written over this codec.
    fn restart(&mut self, limits: &Limits) {
        self.records = ResponseDecoder::new(REQUEST_ID, true, limits);
        self.parser.restart(limits);
        self.in_head = true;
        self.head_bytes = BytesMut::new();
        self.pending = None;
    }

    pub(super) fn decode(&mut self, src: &mut BytesMut) -> Result<Option<Step>, BackendError> {
        if let Some(body) = self.pending.take() {
            return Ok(Some(Step::Data(body)));
        }
        let Some(event) = self.records.decode(src).map_err(violation)? else {
            return Ok(None);
        };
        let step = match event {
            ResponseEvent::Stdout(bytes) => self.stdout(bytes)?,
            ResponseEvent::Stderr(bytes) => Step::Stderr(bytes),
            ResponseEvent::StdoutEnd | ResponseEvent::StderrEnd => Step::Nothing,
            ResponseEvent::End {
                protocol_status: ProtocolStatus::RequestComplete,
                ..
            } => {
                if self.in_head {
                    return Err(violation(
                        "END_REQUEST arrived before the CGI response head on STDOUT was complete",
                    ));
                }
                Step::End {
                    reusable: self.records.is_reusable(),
                }
            }
            ResponseEvent::End {
                protocol_status, ..
            } => {
                return Err(BackendError::Refused {
                    protocol: Protocol::FastCgi,
                    reason: protocol_status.to_string(),
                    overloaded: protocol_status == ProtocolStatus::Overloaded,
                })
            }
            ResponseEvent::GetValuesResult(_) | ResponseEvent::UnknownType { .. } => {
                return Err(violation(
                    "a management record arrived although corral sent no management request",
                ))
            }
        };
        Ok(Some(step))
    }

    fn stdout(&mut self, bytes: Bytes) -> Result<Step, BackendError> {
        if !self.in_head {
            return Ok(Step::Data(bytes));
        }
        let parser = &mut self.parser;
        let bad_head =
            |e: crate::protocols::cgi_response::CgiResponseError| BackendError::InvalidHead {
                protocol: Protocol::FastCgi,
                rule: e.to_string(),
            };
        if self.head_bytes.is_empty() {
            // The usual case: the whole head is in the first STDOUT record, and is parsed
            // where it lies, with no copy.
            let mut bytes = bytes;
            if let Some(head) = parser.decode_bytes(&mut bytes).map_err(bad_head)? {
                self.body_begins();
                if !bytes.is_empty() {
                    self.pending = Some(bytes);
                }
                return Ok(Step::Head(head));
            }
            self.head_bytes.extend_from_slice(&bytes);
            return Ok(Step::Nothing);
        }
        self.head_bytes.extend_from_slice(&bytes);
        let parsed = parser.decode(&mut self.head_bytes).map_err(bad_head)?;
        match parsed {
            None => Ok(Step::Nothing),
            Some(head) => {
                self.body_begins();
                let rest = std::mem::take(&mut self.head_bytes);
                if !rest.is_empty() {
                    self.pending = Some(rest.freeze());
                }
                Ok(Step::Head(head))
            }
        }
    }

    /// The head is read: STDOUT now carries body bytes, which go on as reads bring them
    /// (`ResponseDecoder::partial_stdout`), so the read buffer never keeps part of a record
    /// behind and its refill copies nothing.
    fn body_begins(&mut self) {
        self.in_head = false;
        self.records.partial_stdout(true);
    }

    pub(super) fn eof(&mut self, _src: &mut BytesMut) -> Result<Step, BackendError> {
        Err(BackendError::ClosedEarly {
            protocol: Protocol::FastCgi,
            stale: false,
            stage: if self.in_head {
                "before the response head was complete"
            } else {
                "before END_REQUEST"
            },
        })
    }

    pub(super) fn encode_body(&self, chunk: &[u8], dst: &mut BytesMut) {
        encode_stdin(REQUEST_ID, chunk, dst);
    }

    pub(super) fn encode_body_end(&self, dst: &mut BytesMut) {
        encode_stdin_end(REQUEST_ID, dst);
    }

    pub(super) fn abort_bytes(&self) -> BytesMut {
        let mut dst = BytesMut::new();
        encode_abort_request(REQUEST_ID, &mut dst);
        dst
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::panic)]

    use super::*;
    use crate::protocols::fastcgi::{encode_end_request, encode_stdout};

    /// After the head, a STDOUT record cut by reads goes on in pieces as they come, so the
    /// read buffer is empty after each read's steps (its refill then copies nothing); the
    /// head's own record, cut the same way, waits whole as before.
    #[test]
    fn body_records_cut_by_reads_leave_nothing_buffered() {
        let mut wire = BytesMut::new();
        encode_stdout(REQUEST_ID, b"Content-Type: text/plain\r\n\r\nhi", &mut wire);
        encode_stdout(REQUEST_ID, &[b'x'; 5001], &mut wire);
        encode_end_request(REQUEST_ID, 0, ProtocolStatus::RequestComplete, &mut wire);
        let mut codec = Codec::new(&Limits::default());
        let mut src = BytesMut::new();
        let (mut head, mut body, mut ended) = (false, Vec::new(), false);
        for piece in wire.chunks(1000) {
            src.extend_from_slice(piece);
            loop {
                match codec.decode(&mut src).unwrap() {
                    Some(Step::Head(_)) => head = true,
                    Some(Step::Data(bytes)) => body.extend_from_slice(&bytes),
                    Some(Step::End { reusable }) => ended = reusable,
                    Some(_) => {}
                    None => break,
                }
            }
            if head {
                assert!(src.is_empty(), "{} bytes left after the head", src.len());
            }
        }
        assert!(head && ended);
        assert_eq!(body.len(), 2 + 5001);
        assert!(body.starts_with(b"hix") && body.iter().skip(2).all(|&b| b == b'x'));
    }
}
