//! A backend's response as the fronts see it: the head, and the body that holds its slot
//! (and finishes the request's timings and access-log line) until it ends or is dropped.

use std::sync::Arc;

use bytes::Bytes;

use crate::access::{AccessLog, LogSettings, Record};
use crate::backend::{BackendError, ResponseBody};
use crate::pool::requests::RequestTimer;
use crate::pool::slots::Slot;
use crate::protocols::cgi_response::CgiResponseHead;

use super::{slow_stacks, Pool};

/// A backend's response with the slot it holds until the body ends.
#[derive(Debug)]
pub struct GatewayResponse {
    /// Status, headers and Location semantics.
    pub head: CgiResponseHead,
    /// The body and the slot.
    pub body: GatewayBody,
}

/// A response body holding its slot: the slot is given back when the body ends or is
/// dropped (the client went away, which also aborts the backend request).
#[derive(Debug)]
pub struct GatewayBody {
    pub(super) body: ResponseBody,
    /// The slot; taken only as the body is dropped, by a connection that waits for its end
    /// record (`ResponseBody::hold_until_end`).
    pub(super) slot: Option<Slot>,
    /// Its pool: the counters the timer records into and the driver told of a timeout
    /// (one reference, not a clone of each).
    pub(super) pool: Arc<Pool>,
    pub(super) timer: RequestTimer,
    /// The request's access-log line to finish, when a request log is on.
    pub(super) log: Option<Box<Logged>>,
}

/// A request's log record with where it goes.
#[derive(Debug)]
pub(super) struct Logged {
    pub(super) record: Record,
    pub(super) settings: Arc<LogSettings>,
    pub(super) writer: AccessLog,
    /// Asks the worker for its stacks if the request passes `slow_threshold` (app pools
    /// with a slow log: `slow_stacks.rs`).
    pub(super) slow: Option<slow_stacks::SlowWatch>,
}

impl Logged {
    /// Fills in the timings and writes the line (once the stacks asked for are in).
    pub(super) fn finish(mut self: Box<Self>, timer: &RequestTimer) {
        let [queue, connect, head, total] = timer.split();
        self.record.queue = queue;
        self.record.connect = connect;
        self.record.head = head;
        self.record.total = total;
        self.send();
    }

    /// Writes the line now, or once the stacks asked for are in.
    pub(super) fn send(mut self: Box<Self>) {
        match self.slow.take() {
            Some(watch) => watch.finish(self),
            None => self.write(),
        }
    }

    pub(super) fn write(&self) {
        self.writer.write(&self.settings, &self.record);
    }
}

impl Drop for GatewayBody {
    fn drop(&mut self) {
        // Dropped before its clean end: the client went away, or the backend broke off;
        // unless the front does not send this body (`discard_unsent`): the client then has
        // its whole answer.
        if let Some(mut logged) = self.log.take() {
            logged.record.aborted = !self.body.is_ended() && !self.body.is_unsent();
            logged.finish(&self.timer);
        }
        // Dropped at its Content-Length before the end record came, or unsent before its
        // end: the slot waits with the connection for the rest of the response
        // (`src/backend/exchange/end.rs`).
        self.body.hold_until_end(&mut self.slot);
    }
}

impl GatewayBody {
    /// Whether every chunk has been handed out and the response ended cleanly (its slot
    /// is then as good as free: dropping the body costs nothing).
    pub fn is_ended(&self) -> bool {
        self.body.is_ended()
    }

    /// Says that the front sends none of this body (an answer to HEAD, a 204 or a 304, or
    /// one a file replaces): dropped before its end, the rest of the response is read and
    /// thrown away so that its connection is kept (`ResponseBody::discard_unsent`), and its
    /// access-log line is not marked aborted.
    pub fn discard_unsent(&mut self) {
        self.body.discard_unsent();
    }

    /// When the body ended cleanly (the request's timer read the clock then), if it has.
    pub fn ended_at(&self) -> Option<tokio::time::Instant> {
        self.timer.ended_at()
    }

    /// The next chunk; `None` at the clean end.
    pub async fn next_chunk(&mut self) -> Option<Result<Bytes, BackendError>> {
        std::future::poll_fn(|cx| self.poll_chunk(cx)).await
    }

    /// [`next_chunk`](Self::next_chunk) as a poll function (cancel-safe), for a front that
    /// pulls the body from its own `poll` without a future per chunk.
    pub fn poll_chunk(
        &mut self,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<Bytes, BackendError>>> {
        let chunk = std::task::ready!(self.body.poll_chunk(cx));
        let ended = match &chunk {
            Some(Err(e)) => {
                self.pool.requests.backend_error(e);
                false
            }
            // A reader may stop at the last chunk once `is_ended` says so.
            None => true,
            Some(Ok(_)) => self.body.is_ended(),
        };
        if let (Some(logged), Some(Ok(data))) = (self.log.as_mut(), &chunk) {
            logged.record.bytes += data.len() as u64;
        }
        if ended {
            self.timer.end(&self.pool.requests);
            if let Some(logged) = self.log.take() {
                logged.finish(&self.timer);
            }
        }
        if let (Some(Err(error)), Some(slot)) = (&chunk, &self.slot) {
            self.pool.report(slot, error);
        }
        std::task::Poll::Ready(chunk)
    }
}
