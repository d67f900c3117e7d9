//! SCGI towards a backend (Python's `scgi` package, any SCGI server): one connection
//! per request; the netstring head (CONTENT_LENGTH first, `SCGI` = `1`), the body, then a
//! CGI response read until the backend closes the connection.

use bytes::BytesMut;
use tokio::time::Instant;

use super::exchange::{begin, known_length, read_response, Codec as AnyCodec, Exchange, Step};
use super::{
    BackendConnection, BackendError, BackendRequest, BackendResponse, ExchangeOptions, Protocol,
    RequestBody,
};
use crate::protocols::cgi::CgiParams;
use crate::protocols::cgi_response::CgiResponseDecoder;
use crate::protocols::scgi::encode_request_head;
use crate::protocols::Limits;

/// Sends `request` over `conn` and returns once the CGI response head has arrived. The
/// caller's `CONTENT_LENGTH` and `SCGI` parameters are replaced by the real ones; a body of
/// unknown length is spooled first to learn its length.
pub async fn send(
    conn: BackendConnection,
    request: BackendRequest,
    options: &ExchangeOptions,
) -> Result<BackendResponse, BackendError> {
    let params = CgiParams::from_pairs(&request.params).map_err(|e| BackendError::RequestHead {
        protocol: Protocol::Scgi,
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
    let params: Vec<(&[u8], &[u8])> = params
        .iter()
        .filter(|(name, _)| *name != b"CONTENT_LENGTH" && *name != b"SCGI")
        .collect();
    let mut head = BytesMut::with_capacity(1024);
    encode_request_head(len, &params, &options.limits, &mut head).map_err(|e| {
        BackendError::RequestHead {
            protocol: Protocol::Scgi,
            reason: e.to_string(),
        }
    })?;
    let codec = AnyCodec::Scgi(Codec::new(&options.limits));
    Ok(begin(conn, codec, head, body, Some(len), options, started))
}

/// The response is the raw byte stream: a CGI head, then body bytes until EOF.
#[derive(Debug)]
pub(super) struct Codec {
    /// The head parser until the head is complete, then `None`.
    head: Option<CgiResponseDecoder>,
}

impl Codec {
    fn new(limits: &Limits) -> Codec {
        Codec {
            head: Some(CgiResponseDecoder::new(limits)),
        }
    }

    pub(super) fn decode(&mut self, src: &mut BytesMut) -> Result<Option<Step>, BackendError> {
        let Some(parser) = self.head.as_mut() else {
            if src.is_empty() {
                return Ok(None);
            }
            return Ok(Some(Step::Data(src.split().freeze())));
        };
        match parser.decode(src) {
            Ok(Some(head)) => {
                self.head = None;
                Ok(Some(Step::Head(head)))
            }
            Ok(None) => Ok(None),
            // The head is all the framing SCGI has: a head that is no head (no colon, a
            // bare CR, past the limits) may be a worker out of step and stays a protocol
            // violation; a well-formed head with a bad field is the application's error.
            Err(e) if e.is_field_error() => Err(BackendError::InvalidHead {
                protocol: Protocol::Scgi,
                rule: e.to_string(),
            }),
            Err(e) => Err(BackendError::Protocol {
                protocol: Protocol::Scgi,
                rule: e.to_string(),
            }),
        }
    }

    pub(super) fn eof(&mut self, _src: &mut BytesMut) -> Result<Step, BackendError> {
        if self.head.is_some() {
            return Err(BackendError::ClosedEarly {
                protocol: Protocol::Scgi,
                stage: "before the response head was complete",
                stale: false,
            });
        }
        Ok(Step::End { reusable: false })
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::panic)]

    use super::*;

    fn decode(head: &[u8]) -> BackendError {
        let mut codec = Codec::new(&Limits::default());
        let mut src = BytesMut::from(head);
        match codec.decode(&mut src) {
            Err(e) => e,
            Ok(step) => panic!("{head:?} decoded to {step:?}"),
        }
    }

    #[test]
    fn a_bad_field_is_the_applications_error_and_garbage_a_protocol_violation() {
        let e = decode(b"Status: 200 OK\r\nX-A: a\x01b\r\n\r\n");
        assert!(matches!(e, BackendError::InvalidHead { .. }), "{e}");
        let e = decode(b"\x00\x01\x02 this is no CGI head\r\n\r\n");
        assert!(matches!(e, BackendError::Protocol { .. }), "{e}");
    }
}
