//! The SCGI responder's side of one request: the header netstring, then exactly
//! CONTENT_LENGTH body bytes handed out as they arrive, then the end.
//!
//! The response needs no state machine of its own: it is a CGI response head and body written
//! until the connection closes (see [`crate::cgi_response`]).

use std::marker::PhantomData;

use bytes::{Bytes, BytesMut};

use super::{NetstringDecoder, ScgiError, ScgiHead, ScgiRequestHead};
use crate::Limits;

/// One step of an SCGI request, in order: `Head`, zero or more `Body`, `End`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ScgiRequestEvent<H = ScgiRequestHead> {
    /// The header block.
    Head(H),
    /// The next body bytes (never empty), sliced from the input without copying.
    Body(Bytes),
    /// All CONTENT_LENGTH body bytes have been delivered.
    End,
}

#[derive(Debug, Clone)]
enum State {
    Head(NetstringDecoder),
    Body { remaining: u64 },
    End,
    Done,
}

/// Decoder of one SCGI request, for the responder role; its header block is decoded into
/// `H`.
///
/// After an error the connection is broken and the decoder must not be used again.
#[derive(Debug, Clone)]
pub struct ScgiRequestDecoder<H = ScgiRequestHead> {
    limits: Limits,
    state: State,
    head: PhantomData<fn() -> H>,
}

impl ScgiRequestDecoder {
    /// A decoder for one request, bounded by `limits`.
    pub fn new(limits: &Limits) -> Self {
        ScgiRequestDecoder::decoding(limits)
    }
}

impl<H: ScgiHead> ScgiRequestDecoder<H> {
    /// A decoder for one request whose head is decoded into `H`, bounded by `limits`.
    pub fn decoding(limits: &Limits) -> Self {
        ScgiRequestDecoder {
            limits: limits.clone(),
            state: State::Head(NetstringDecoder::new(limits.max_params_bytes)),
            head: PhantomData,
        }
    }

    /// Whether `End` has been returned.
    pub fn is_finished(&self) -> bool {
        matches!(self.state, State::Done)
    }

    /// Returns the next event once its bytes are in `src`, `Ok(None)` before. Bytes after the
    /// body are an error ([`ScgiError::BytesAfterBody`]).
    pub fn decode(&mut self, src: &mut BytesMut) -> Result<Option<ScgiRequestEvent<H>>, ScgiError> {
        match &mut self.state {
            State::Head(netstring) => {
                let Some(payload) = netstring.decode(src)? else {
                    return Ok(None);
                };
                let head = H::decode(payload, &self.limits)?;
                self.state = match head.content_length() {
                    0 => State::End,
                    remaining => State::Body { remaining },
                };
                Ok(Some(ScgiRequestEvent::Head(head)))
            }
            State::Body { remaining } => {
                if src.is_empty() {
                    return Ok(None);
                }
                let take = usize::try_from(*remaining).map_or(src.len(), |r| r.min(src.len()));
                let chunk = src.split_to(take).freeze();
                *remaining -= chunk.len() as u64;
                if *remaining == 0 {
                    self.state = State::End;
                }
                Ok(Some(ScgiRequestEvent::Body(chunk)))
            }
            State::End => {
                self.state = State::Done;
                Ok(Some(ScgiRequestEvent::End))
            }
            State::Done if src.is_empty() => Ok(None),
            State::Done => Err(ScgiError::BytesAfterBody),
        }
    }
}
