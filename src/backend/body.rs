//! The request body a front hands to a backend exchange: a pull-based source of `Bytes`
//! chunks that knows its length when the front knows it.
//!
//! The exchange pulls a chunk only when the previous one has been written to the backend, so
//! a slow backend slows the client down (backpressure) and at most one chunk per request sits
//! in gateway memory.

use std::fmt;
use std::future::poll_fn;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use tokio::sync::mpsc;

/// Why a request body could not be read (the client went away, a front decoding error...).
pub type BodyError = Box<dyn std::error::Error + Send + Sync>;

/// The client sent no body bytes for `after` while the body was being read. A front's body
/// source fails with this; the exchange answers 408 (if nothing was sent yet) and the
/// backend is not blamed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("the client sent no request body bytes for {after:?}")]
pub struct BodyTimeout {
    /// The body timeout.
    pub after: std::time::Duration,
}

/// The client took longer than `body_deadline`, all waits for it together, to send its
/// request body: a client trickling a byte per `body_timeout` is cut off too (408).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("the client did not send its request body within body_deadline ({after:?} of waiting)")]
pub struct BodyDeadline {
    /// The deadline.
    pub after: std::time::Duration,
}

/// A request body of unknown length ran past the context's `max_body` while it streamed:
/// the client's doing (413).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("the request body passed max_body of {limit} bytes")]
pub struct BodyOverLimit {
    /// The limit.
    pub limit: u64,
}

/// Something that yields the bytes of a request body, in order.
///
/// A front implements this over its own body type (hyper's `Incoming`, the STDIN stream of a
/// FastCGI front, the rest of an SCGI connection).
pub trait BodySource: Send {
    /// The next chunk; `None` at the end of the body. Empty chunks are allowed and skipped.
    fn poll_chunk(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Bytes, BodyError>>>;
}

/// A request body: nothing, bytes already in memory, or a source streamed chunk by chunk.
pub struct RequestBody {
    kind: Kind,
    len: Option<u64>,
}

enum Kind {
    Empty,
    Full(Option<Bytes>),
    Source(Pin<Box<dyn BodySource>>),
}

impl fmt::Debug for RequestBody {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let kind = match &self.kind {
            Kind::Empty => "empty",
            Kind::Full(_) => "full",
            Kind::Source(_) => "source",
        };
        f.debug_struct("RequestBody")
            .field("kind", &kind)
            .field("len", &self.len)
            .finish()
    }
}

impl RequestBody {
    /// A body of zero bytes.
    pub fn empty() -> RequestBody {
        RequestBody {
            kind: Kind::Empty,
            len: Some(0),
        }
    }

    /// A body already in memory.
    pub fn full(bytes: Bytes) -> RequestBody {
        RequestBody {
            len: Some(bytes.len() as u64),
            kind: Kind::Full(Some(bytes)),
        }
    }

    /// A body read from `source`; `len` is its length when the front knows it (a
    /// Content-Length), `None` for a chunked body.
    pub fn from_source(source: impl BodySource + 'static, len: Option<u64>) -> RequestBody {
        RequestBody {
            kind: Kind::Source(Box::pin(source)),
            len,
        }
    }

    /// A body fed through the returned sender, holding at most `capacity` chunks in flight.
    pub fn channel(len: Option<u64>, capacity: usize) -> (BodySender, RequestBody) {
        let (tx, rx) = mpsc::channel(capacity.max(1));
        (
            BodySender { tx },
            RequestBody::from_source(ChannelSource { rx }, len),
        )
    }

    /// This body, failing with [`BodyOverLimit`] once more than `limit` bytes have come when
    /// its length was not known beforehand (a known length is checked before any byte is
    /// read, so it is returned unchanged).
    pub fn limited(self, limit: u64) -> RequestBody {
        match self.kind {
            Kind::Source(source) if self.len.is_none() => RequestBody::from_source(
                LimitSource {
                    inner: source,
                    left: limit,
                    limit,
                },
                None,
            ),
            _ => self,
        }
    }

    /// A second copy of this body to send again, when that is possible without the client:
    /// an empty body, or one wholly in memory (shared, not copied). A streamed or spooled
    /// body cannot be replayed once the exchange has begun to read it: `None`.
    pub fn replayable(&self) -> Option<RequestBody> {
        match &self.kind {
            Kind::Empty => Some(RequestBody::empty()),
            Kind::Full(Some(bytes)) => Some(RequestBody::full(bytes.clone())),
            // A source announced as empty (a FastCGI front's GET) has nothing to replay.
            Kind::Source(_) if self.len == Some(0) => Some(RequestBody::empty()),
            Kind::Full(None) | Kind::Source(_) => None,
        }
    }

    /// The body length, when known before reading it.
    pub fn len(&self) -> Option<u64> {
        self.len
    }

    /// Whether the body is known to be empty.
    pub fn is_empty(&self) -> bool {
        self.len == Some(0)
    }

    /// Polls for the next non-empty chunk; `None` at the end.
    pub fn poll_chunk(&mut self, cx: &mut Context<'_>) -> Poll<Option<Result<Bytes, BodyError>>> {
        match &mut self.kind {
            Kind::Empty => Poll::Ready(None),
            Kind::Full(bytes) => Poll::Ready(bytes.take().filter(|b| !b.is_empty()).map(Ok)),
            Kind::Source(source) => loop {
                match source.as_mut().poll_chunk(cx) {
                    Poll::Ready(Some(Ok(chunk))) if chunk.is_empty() => continue,
                    other => return other,
                }
            },
        }
    }

    /// The next non-empty chunk; `None` at the end.
    pub async fn next_chunk(&mut self) -> Option<Result<Bytes, BodyError>> {
        poll_fn(|cx| self.poll_chunk(cx)).await
    }
}

/// The writing end of [`RequestBody::channel`].
#[derive(Debug, Clone)]
pub struct BodySender {
    tx: mpsc::Sender<Result<Bytes, BodyError>>,
}

/// The body's reader is gone: the exchange ended or failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("the backend exchange no longer reads the request body")]
pub struct BodyClosed;

impl BodySender {
    /// Sends the next chunk, waiting while the channel is full.
    pub async fn send(&self, chunk: Bytes) -> Result<(), BodyClosed> {
        self.tx.send(Ok(chunk)).await.map_err(|_| BodyClosed)
    }

    /// Ends the body with an error (the client went away); the exchange fails with it.
    pub async fn fail(&self, error: BodyError) -> Result<(), BodyClosed> {
        self.tx.send(Err(error)).await.map_err(|_| BodyClosed)
    }
}

struct ChannelSource {
    rx: mpsc::Receiver<Result<Bytes, BodyError>>,
}

impl BodySource for ChannelSource {
    fn poll_chunk(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Bytes, BodyError>>> {
        self.rx.poll_recv(cx)
    }
}

/// Counts a source's bytes against a limit.
struct LimitSource {
    inner: Pin<Box<dyn BodySource>>,
    left: u64,
    limit: u64,
}

impl BodySource for LimitSource {
    fn poll_chunk(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Bytes, BodyError>>> {
        let this = self.get_mut();
        match this.inner.as_mut().poll_chunk(cx) {
            Poll::Ready(Some(Ok(chunk))) => match this.left.checked_sub(chunk.len() as u64) {
                Some(left) => {
                    this.left = left;
                    Poll::Ready(Some(Ok(chunk)))
                }
                None => Poll::Ready(Some(Err(Box::new(BodyOverLimit { limit: this.limit })))),
            },
            other => other,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn drain(mut body: RequestBody) -> Result<u64, BodyError> {
        let mut n = 0;
        while let Some(chunk) = std::future::poll_fn(|cx| body.poll_chunk(cx)).await {
            n += chunk?.len() as u64;
        }
        Ok(n)
    }

    fn streamed(parts: &'static [&'static [u8]], len: Option<u64>) -> RequestBody {
        let (tx, body) = RequestBody::channel(len, parts.len().max(1));
        tokio::spawn(async move {
            for p in parts {
                if tx.send(Bytes::from_static(p)).await.is_err() {
                    return;
                }
            }
        });
        body
    }

    #[tokio::test]
    async fn an_unknown_length_is_held_to_the_limit_as_it_streams() {
        let ok = streamed(&[b"abc", b"def"], None).limited(6);
        assert_eq!(drain(ok).await.unwrap(), 6);
        let over = streamed(&[b"abc", b"defg"], None).limited(6);
        let err = drain(over).await.unwrap_err();
        assert!(err.is::<BodyOverLimit>(), "{err}");
        let status = crate::backend::BackendError::ClientBody { source: err }.status();
        assert_eq!(status, 413);
        // A known length was checked before reading: left as it is.
        let known = streamed(&[b"abcdefgh"], Some(8)).limited(6);
        assert_eq!(known.len(), Some(8));
        assert_eq!(drain(known).await.unwrap(), 8);
    }
}
