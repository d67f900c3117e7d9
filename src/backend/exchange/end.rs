//! How an exchange ends: the connection handed back after a clean end; the end record
//! awaited, briefly, when the client already has every byte the head announced; or, for an
//! exchange left before its end, an abort and a close.
//!
//! The wait is for a response whose last Content-Length byte and end record (FastCGI
//! END_REQUEST, LSAPI RESP_END) came in separate reads. The HTTP front stops pulling a body
//! at its announced length and drops it, so without the wait such a connection was closed
//! (and a FastCGI worker told to abort a request it had finished): under load the end record
//! often trails in the next segment, and a new connection was made for the next request. The
//! client is not kept waiting: its last byte has gone out when the body is dropped. The
//! request's slot waits with the connection, so that no request is sent to the worker
//! before its connection is back on the idle stack (a worker that serves one connection at a
//! time, php-cgi, would not accept a new one while this one is open). The wait is bounded
//! by [`END_WAIT`], and by the request's own deadline.
//!
//! A body the front never sends is let go before its end too: hyper drops the body of an
//! answer to HEAD, or of a 204 or 304, unread, once the head is written, and an X-Sendfile
//! answer replaces it with a file. Backends send such a body anyway (PHP discards its output
//! for HEAD, but the end of STDOUT and END_REQUEST still follow; an application may render
//! the whole page), and aborting the exchange there cost every HEAD its kept connection. The
//! front marks such a body (`ResponseBody::discard_unsent`); dropped, the rest of its
//! response is read and thrown away, at most [`DISCARD_MAX`] bytes and within the request's
//! deadline, its slot held meanwhile as for a body a client reads (the worker is still
//! answering), and the connection is kept when the end record comes. What is already read
//! is settled at once, without a task: the usual HEAD, whose end came with its head.

use std::future::poll_fn;
use std::time::Duration;

use tokio::time::Instant;

use super::body::BodyState;
use super::{BackendConnection, BackendError, Exchange, Protocol, Step};
use crate::protocols::cgi_response::CgiResponseHead;

/// Longest wait for an end record after the body's last byte. A worker writes it right
/// after its last output, so it trails by microseconds, or by a scheduling delay on a loaded
/// machine; a worker still busy after this long (a script that runs on after its output was
/// complete) keeps its slot no longer, and its connection is closed as before.
pub(crate) const END_WAIT: Duration = Duration::from_millis(250);

/// Most body bytes read and thrown away to keep the connection of a response the front does
/// not send (HEAD, 204, 304): a page an application renders for HEAD as for GET, a few
/// reads of a local socket; a longer one closes the connection, as a client gone does.
pub(crate) const DISCARD_MAX: u64 = 256 * 1024;

/// The body length a response head announces: its Content-Length when that is one
/// well-formed number.
pub(super) fn announced_length(head: &CgiResponseHead) -> Option<u64> {
    let (_, value) = head.headers().iter().find(|(name, _)| {
        // The usual spelling first: one comparison rather than fourteen folded bytes.
        name.len() == 14
            && (name.as_ref() == b"Content-Length" || name.eq_ignore_ascii_case(b"content-length"))
    })?;
    if value.is_empty() {
        return None;
    }
    value.iter().try_fold(0u64, |n, &b| {
        let digit = b.checked_sub(b'0').filter(|d| *d <= 9)?;
        n.checked_mul(10)?.checked_add(u64::from(digit))
    })
}

impl Exchange {
    /// The response ended cleanly: the connection goes back to its stack (or to the caller)
    /// when the protocol and the state of the exchange allow it.
    pub(super) fn finish(&mut self, reusable: bool) -> Option<BackendConnection> {
        self.clean = true;
        let mut conn = self.conn.take()?;
        let reusable = reusable
            && self.inbuf.is_empty()
            && self.write_error.is_none()
            && self.request_sent()
            && !self.eof;
        if reusable {
            // Empty, and usually the only owner of its allocation again once the body's
            // last chunk is dropped: the next exchange reads into it without allocating.
            conn.inbuf = std::mem::take(&mut self.inbuf);
            conn.outbuf = std::mem::take(&mut self.outbuf);
            conn.finish()
        } else {
            None
        }
    }

    /// Every byte the head announced has been handed out, and nothing else is pending: what
    /// is left of the response is its end record.
    #[inline]
    pub(super) fn body_complete(&self) -> bool {
        self.state == BodyState::Streaming
            && self.ahead.is_none()
            && self.announced == Some(self.handed)
    }

    /// Whether, dropped now, the exchange could still leave a reusable connection once the
    /// rest of its response arrives: every byte the head announced was handed out, or the
    /// front sends none of the body (`discard`).
    #[inline]
    pub(super) fn awaits_end(&self) -> bool {
        (self.body_complete() || (self.discard > 0 && self.state == BodyState::Streaming))
            && self.conn.is_some()
            && self.write_error.is_none()
            && self.request_sent()
            && !self.eof
            // SCGI ends with the connection: nothing to keep.
            && self.protocol() != Protocol::Scgi
    }

    /// Ends the wait with what is already read, without I/O: true when that was enough (the
    /// response's end was there, or something that fails the wait), false when the rest is
    /// still to come. The end of an answer to HEAD usually arrives with its head.
    pub(super) fn end_buffered(&mut self) -> bool {
        let unsent = self.discard > 0;
        loop {
            let step = match self.buffered_step() {
                Ok(None) => return false,
                Ok(Some(step)) => Ok(step),
                Err(e) => Err(e),
            };
            if self.after_body(step, unsent, None).is_some() {
                return true;
            }
        }
    }

    /// Reads what follows the body's last byte, or what the front does not send of it: the
    /// connection is kept when the end record comes, closed with a log line when anything
    /// else comes, more than [`DISCARD_MAX`] bytes of an unsent body, or nothing in time
    /// ([`END_WAIT`] after a complete body; the request's deadline for an unsent one, as for
    /// a body a client reads). Returns once the connection is back on its stack or closed.
    async fn wait_for_end(&mut self) {
        let since = Instant::now();
        let unsent = self.discard > 0;
        if !unsent {
            // The exchange's own deadline, brought forward: the connection's timer serves.
            self.request_deadline = self.request_deadline.min(since + END_WAIT);
        }
        loop {
            let step = poll_fn(|cx| self.poll_step(cx)).await;
            if self.after_body(step, unsent, Some(since)).is_some() {
                return;
            }
        }
    }

    /// Takes one step read after the front let the body go (`unsent`: a body the front
    /// does not send, whose bytes are read and thrown away within `discard`). `None`: keep
    /// reading; `Some(true)`: the response ended, and its connection went back where it
    /// belongs (or was closed, as the backend asked); `Some(false)`: the wait failed and
    /// the connection is closed. `since`: when the wait began, for the log.
    fn after_body(
        &mut self,
        step: Result<Step, BackendError>,
        unsent: bool,
        since: Option<Instant>,
    ) -> Option<bool> {
        let waited = since.map(|t| t.elapsed());
        let why = match step {
            // Within what may be thrown away; an empty piece is nothing at all.
            Ok(Step::Data(chunk)) if chunk.len() as u64 <= self.discard => {
                self.discard -= chunk.len() as u64;
                return None;
            }
            // `poll_step` and `buffered_step` log stderr and skip what means nothing.
            Ok(Step::Stderr(_) | Step::Nothing) => return None,
            Ok(Step::End { reusable }) => {
                self.state = BodyState::Ended;
                self.kept = self.finish(reusable);
                let why = match (unsent, reusable) {
                    (true, true) => "the rest of a response the client is not sent was read and discarded; connection kept",
                    (true, false) => "the rest of a response the client is not sent was read and discarded; the backend asked for the connection's close",
                    (false, true) => "the end record came after the body's last byte; connection kept",
                    (false, false) => "the end record came after the body's last byte, asking for the connection's close",
                };
                tracing::debug!(pool = %self.pool, request_id = self.request_id, protocol = %self.protocol(), ?waited, "{why}");
                return Some(true);
            }
            Ok(Step::Data(_) | Step::Head(_)) if unsent => {
                "a response the client is not sent ran past the bytes read to keep its connection (DISCARD_MAX); connection closed"
            }
            Ok(Step::Data(_) | Step::Head(_)) => {
                "the backend sent more than the Content-Length it announced, instead of the end of its response; connection closed"
            }
            Err(BackendError::RequestTimeout { .. }) if unsent => {
                "the rest of a response the client is not sent did not come within the request timeout; connection closed"
            }
            Err(BackendError::RequestTimeout { .. }) => {
                tracing::debug!(pool = %self.pool, request_id = self.request_id, protocol = %self.protocol(), ?waited, "no end record within the wait after the body's last byte; connection closed");
                self.state = BodyState::Failed;
                return Some(false);
            }
            Err(error) => {
                tracing::warn!(pool = %self.pool, request_id = self.request_id, protocol = %self.protocol(), %error, "the response's end after its last body byte failed; connection closed");
                self.state = BodyState::Failed;
                return Some(false);
            }
        };
        tracing::warn!(pool = %self.pool, request_id = self.request_id, protocol = %self.protocol(), ?waited, "{why}");
        self.state = BodyState::Failed;
        Some(false)
    }
}

/// Ends a dropped exchange that holds something until its end record (`held`): a task on
/// this thread's runtime waits for the record, gives the connection back or closes it, and
/// only then lets go of what it held. Without a runtime, the connection is closed at once.
pub(super) fn linger(mut exchange: Box<Exchange>) {
    let Ok(runtime) = tokio::runtime::Handle::try_current() else {
        super::spare::recycle(exchange);
        return;
    };
    runtime.spawn(async move {
        let held = exchange.held.take();
        exchange.wait_for_end().await;
        super::spare::recycle(exchange);
        drop(held);
    });
}

impl Drop for Exchange {
    fn drop(&mut self) {
        self.abandon();
    }
}

impl Exchange {
    /// What ending the exchange owes the backend and the log: suppressed stderr reported
    /// and, for an exchange that did not end cleanly, an abort where the protocol has one
    /// and the connection closed. Once: the connection is taken.
    pub(super) fn abandon(&mut self) {
        self.report_suppressed_stderr(self.stderr_limit.take_suppressed());
        let Some(conn) = self.conn.take() else {
            return;
        };
        if self.clean {
            return;
        }
        // The front went away (or the exchange failed) mid-request: tell the backend where
        // the protocol has a way, without waiting, then close the connection. Only at a
        // record boundary, so the abort cannot land inside a half-written record.
        if let Some(abort) = self.codec.abort_bytes() {
            if self.outbuf.is_empty() && self.write_error.is_none() {
                let _ = conn.try_write(&abort);
            }
        }
        tracing::debug!(
            pool = %self.pool,
            request_id = self.request_id,
            protocol = %self.protocol(),
            "backend exchange abandoned before its end; connection closed"
        );
    }
}
