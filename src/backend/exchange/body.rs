//! The response body the front pulls from, and the exchange's side of it: the chunks as
//! they are decoded, a look ahead for the end after each one, and the connection handed back
//! after a clean end.

use std::future::poll_fn;
use std::mem::ManuallyDrop;
use std::task::{Context, Poll};

use bytes::Bytes;

use super::{BackendConnection, BackendError, Exchange, Step};

/// The body of a backend response, pulled chunk by chunk. Dropping it before the end
/// aborts the backend request (FastCGI ABORT_REQUEST, then close; SCGI and LSAPI: close).
///
/// One pointer: its state lives in the exchange's box, so the response the gateway and the
/// front move on to hyper carries eight bytes of it, not the kept connection's two hundred.
/// Dropped, it gives that exchange back to its thread, released, for a later one
/// (`exchange::spare`).
pub struct ResponseBody {
    exchange: ManuallyDrop<Box<Exchange>>,
}

impl Drop for ResponseBody {
    fn drop(&mut self) {
        // SAFETY: `exchange` is taken once, here, and `self` is not used after `drop`.
        let exchange = unsafe { ManuallyDrop::take(&mut self.exchange) };
        super::spare::recycle(exchange);
    }
}

/// Where a response body stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum BodyState {
    Streaming,
    Ended,
    Failed,
}

impl std::fmt::Debug for ResponseBody {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ResponseBody")
            .field("protocol", &self.exchange.protocol())
            .field("state", &self.exchange.state)
            .finish()
    }
}

impl ResponseBody {
    pub(super) fn new(exchange: Box<Exchange>) -> ResponseBody {
        ResponseBody {
            exchange: ManuallyDrop::new(exchange),
        }
    }

    /// The next body chunk; `None` at the clean end of the response. After an error the
    /// connection is gone and every later call gives `None`.
    pub async fn next_chunk(&mut self) -> Option<Result<Bytes, BackendError>> {
        poll_fn(|cx| self.poll_chunk(cx)).await
    }

    /// [`next_chunk`](Self::next_chunk) as a poll function (cancel-safe: the state is in
    /// the exchange), so a front can pull the body without a future per chunk.
    pub fn poll_chunk(
        &mut self,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Bytes, BackendError>>> {
        self.exchange.poll_body(cx)
    }

    /// Whether the response ended cleanly and every chunk has been handed out.
    pub fn is_ended(&self) -> bool {
        self.exchange.state == BodyState::Ended && self.exchange.ahead.is_none()
    }

    /// After a clean end, the connection if it may carry another request and did not come
    /// from a [`crate::backend::Connections`] stack (those go back by themselves).
    pub fn take_connection(&mut self) -> Option<BackendConnection> {
        self.exchange.kept.take()
    }

    /// The client went away: abort the backend request and close the connection. Same as
    /// dropping the body, but says so in the code.
    pub fn abort(self) {
        drop(self);
    }
}

/// The response body's side of the exchange.
impl Exchange {
    fn poll_body(&mut self, cx: &mut Context<'_>) -> Poll<Option<Result<Bytes, BackendError>>> {
        if let Some(ahead) = self.ahead.take() {
            return Poll::Ready(Some(ahead));
        }
        if self.state != BodyState::Streaming {
            return Poll::Ready(None);
        }
        loop {
            let step = match self.poll_step(cx) {
                Poll::Ready(step) => step,
                Poll::Pending => return Poll::Pending,
            };
            match step {
                Ok(Step::Data(chunk)) => {
                    self.look_ahead();
                    return Poll::Ready(Some(Ok(chunk)));
                }
                Ok(Step::End { reusable }) => {
                    self.state = BodyState::Ended;
                    self.kept = self.finish(reusable);
                    return Poll::Ready(None);
                }
                Ok(Step::Head(_)) => {
                    return Poll::Ready(Some(Err(self.fail(BackendError::Protocol {
                        protocol: self.protocol(),
                        rule: "the response carried a second head".into(),
                    }))))
                }
                Ok(Step::Stderr(_) | Step::Nothing) => {}
                Err(e) => return Poll::Ready(Some(Err(self.fail(e)))),
            }
        }
    }

    /// Decodes what is already buffered after a chunk, without waiting. When the end of
    /// the response is there too (the usual case: the last chunk and END_REQUEST or
    /// RESP_END arrive together), the exchange is finished at once, so a front that stops
    /// reading when it has the announced Content-Length still leaves a reusable connection.
    fn look_ahead(&mut self) {
        loop {
            match self.buffered_step() {
                Ok(None) => return,
                Ok(Some(Step::End { reusable })) => {
                    self.state = BodyState::Ended;
                    self.kept = self.finish(reusable);
                    return;
                }
                Ok(Some(Step::Data(chunk))) if chunk.is_empty() => {}
                Ok(Some(Step::Data(chunk))) => {
                    self.ahead = Some(Ok(chunk));
                    return;
                }
                Ok(Some(Step::Head(_))) => {
                    let e = self.fail(BackendError::Protocol {
                        protocol: self.protocol(),
                        rule: "the response carried a second head".into(),
                    });
                    self.ahead = Some(Err(e));
                    return;
                }
                Ok(Some(Step::Stderr(_) | Step::Nothing)) => {}
                Err(e) => {
                    let e = self.fail(e);
                    self.ahead = Some(Err(e));
                    return;
                }
            }
        }
    }

    fn fail(&mut self, e: BackendError) -> BackendError {
        self.state = BodyState::Failed;
        // Dropping the connection now (rather than with the body) closes it at once.
        if let Some(conn) = self.conn.take() {
            drop(conn);
        }
        e
    }
}
