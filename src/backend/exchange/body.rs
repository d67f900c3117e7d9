//! The response body the front pulls from, and the exchange's side of it: the chunks as
//! they are decoded, a look ahead for the end after each one, the connection handed back
//! after a clean end, and a body dropped at its announced length left to wait for its end
//! record (`end.rs`).

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
        if exchange.held.is_some() {
            super::end::linger(exchange);
        } else {
            super::spare::recycle(exchange);
        }
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

    /// Whether every chunk has been handed out and the response ended cleanly, or all the
    /// bytes its head announced (Content-Length) have been and its end record may still be
    /// on its way (see [`hold_until_end`](Self::hold_until_end)).
    pub fn is_ended(&self) -> bool {
        let exchange = &self.exchange;
        (exchange.state == BodyState::Ended && exchange.ahead.is_none()) || exchange.body_complete()
    }

    /// For a body dropped once every byte its head announced was handed out, but before its
    /// end record arrived, or a body the front does not send ([`discard_unsent`]) dropped
    /// before its end: ends the exchange at once when the rest of the response is already
    /// read, or else takes `guard` (the request's slot) and keeps it until the end record
    /// arrives and the connection is back on its idle stack, or until the wait for it ends
    /// (the connection is then closed): at most `END_WAIT` after a complete body, the
    /// request's deadline and `DISCARD_MAX` bytes for one not sent (`exchange/end.rs`).
    /// Leaves `guard` where it is when there is nothing to wait for.
    ///
    /// [`discard_unsent`]: Self::discard_unsent
    #[inline]
    pub fn hold_until_end<G: Send + 'static>(&mut self, guard: &mut Option<G>) {
        if self.exchange.awaits_end() && !self.exchange.end_buffered() {
            if let Some(guard) = guard.take() {
                self.exchange.held = Some(Box::new(guard));
            }
        }
    }

    /// Says that the front will send none of this body (the answer to a HEAD request, a 204
    /// or a 304, whose body HTTP forbids; a file sent in its place): dropped before its end,
    /// the rest of the response is read and thrown away, within bounds, so that the
    /// connection is kept instead of aborted and closed.
    #[inline]
    pub fn discard_unsent(&mut self) {
        self.exchange.discard = super::end::DISCARD_MAX;
    }

    /// Whether [`discard_unsent`](Self::discard_unsent) was said of this body.
    #[inline]
    pub fn is_unsent(&self) -> bool {
        self.exchange.discard > 0
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
            if let Ok(chunk) = &ahead {
                self.handed += chunk.len() as u64;
            }
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
                    self.handed += chunk.len() as u64;
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
