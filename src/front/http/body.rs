//! The bodies of the http front: the client's request body as a backend body source (with
//! its idle and total timeouts), and the response body handed to hyper.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use hyper::body::Incoming;
use tokio::time::{Instant, Sleep};

use crate::backend::{BodyDeadline, BodyError, BodySource, BodyTimeout, RequestBody};
use crate::config::FrontTimeouts;
use crate::front::file::FileBody;
use crate::front::limits::BusyGuard;
use crate::gateway::GatewayBody;

use super::head::HeadFields;

/// The request body as a backend body source; its length when the client declared one.
pub(super) fn request_body(
    fields: &HeadFields<'_>,
    incoming: Incoming,
    timeouts: &FrontTimeouts,
) -> RequestBody {
    let chunked = fields.transfer_encoding.is_some();
    let len = if chunked {
        None
    } else {
        fields
            .content_length
            .and_then(|v| v.to_str().ok()?.parse::<u64>().ok())
            .or(Some(0))
    };
    if len == Some(0) {
        return RequestBody::empty();
    }
    RequestBody::from_source(IncomingSource::new(incoming, timeouts), len)
}

/// hyper's request body as a backend body source, failing with [`BodyTimeout`] when the
/// client sends nothing for `timeout` while the body is being read, and with
/// [`BodyDeadline`] once the waits for it add up to `total` (`body_deadline`).
struct IncomingSource {
    body: Incoming,
    timeout: std::time::Duration,
    total: std::time::Duration,
    /// Armed while a poll is waiting for the client. Only that time counts: while the
    /// exchange is busy writing to a slow backend it does not poll, and the client is not
    /// to blame for that.
    timer: Pin<Box<Sleep>>,
    /// When the current wait began, while a poll is waiting for the client.
    waiting: Option<Instant>,
    /// The earlier waits for the client, added up.
    waited: std::time::Duration,
}

impl IncomingSource {
    fn new(body: Incoming, timeouts: &FrontTimeouts) -> IncomingSource {
        IncomingSource {
            body,
            timeout: timeouts.body,
            total: timeouts.body_total,
            timer: Box::pin(tokio::time::sleep(timeouts.body)),
            waiting: None,
            waited: std::time::Duration::ZERO,
        }
    }
}

impl BodySource for IncomingSource {
    fn poll_chunk(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Bytes, BodyError>>> {
        let this = self.get_mut();
        loop {
            let polled = match Pin::new(&mut this.body).poll_frame(cx) {
                Poll::Pending => None,
                Poll::Ready(None) => Some(Poll::Ready(None)),
                Poll::Ready(Some(Ok(frame))) => match frame.into_data() {
                    Ok(data) => Some(Poll::Ready(Some(Ok(data)))),
                    // Trailers carry nothing CGI can pass on.
                    Err(_) => continue,
                },
                Poll::Ready(Some(Err(e))) => Some(Poll::Ready(Some(Err(BodyError::from(e))))),
            };
            if let Some(ready) = polled {
                if let Some(since) = this.waiting.take() {
                    this.waited += since.elapsed();
                }
                return ready;
            }
            let since = match this.waiting {
                Some(since) => since,
                None => {
                    let now = Instant::now();
                    this.waiting = Some(now);
                    // Whichever comes first: this wait's body_timeout, or what is left of
                    // body_deadline.
                    let left = this.total.saturating_sub(this.waited);
                    this.timer.as_mut().reset(now + this.timeout.min(left));
                    now
                }
            };
            if this.timer.as_mut().poll(cx).is_ready() {
                // Logged once, with the request, where the 408 is answered.
                if this.waited + since.elapsed() >= this.total {
                    return Poll::Ready(Some(Err(Box::new(BodyDeadline { after: this.total }))));
                }
                return Poll::Ready(Some(Err(Box::new(BodyTimeout {
                    after: this.timeout,
                }))));
            }
            return Poll::Pending;
        }
    }
}

/// A response body for hyper: fixed bytes (corral's own answers) or a backend body pulled
/// chunk by chunk. Dropping it mid-way (the client went away) drops the backend body, which
/// aborts the backend request and gives the slot back.
pub struct FrontBody {
    kind: BodyKind,
    /// Keeps the connection counted busy until hyper drops the body.
    busy: Option<BusyGuard>,
}

// One body per response, moved once: boxing the larger variant would cost an allocation per
// response to save a few bytes that are never copied.
#[allow(clippy::large_enum_variant)]
enum BodyKind {
    Full(Option<Bytes>),
    File(FileBody),
    Backend {
        /// Bytes already read from the backend, sent first (an HTTP/1.0 answer).
        first: Option<Bytes>,
        /// The rest, pulled from hyper's poll (no future per chunk); `None` once it ended.
        body: Option<GatewayBody>,
        request_id: u64,
    },
}

impl FrontBody {
    pub(in crate::front) fn full(bytes: Bytes) -> FrontBody {
        FrontBody {
            kind: BodyKind::Full(Some(bytes)),
            busy: None,
        }
    }

    pub(in crate::front) fn file(file: FileBody) -> FrontBody {
        FrontBody {
            kind: BodyKind::File(file),
            busy: None,
        }
    }

    pub(super) fn backend(body: GatewayBody, request_id: u64) -> FrontBody {
        FrontBody::backend_after(Bytes::new(), body, request_id)
    }

    /// `first`, then the rest of the backend body.
    pub(in crate::front) fn backend_after(
        first: Bytes,
        body: GatewayBody,
        request_id: u64,
    ) -> FrontBody {
        FrontBody {
            kind: BodyKind::Backend {
                first: (!first.is_empty()).then_some(first),
                body: Some(body),
                request_id,
            },
            busy: None,
        }
    }

    /// Keeps `guard` until the body is dropped.
    pub(super) fn hold(&mut self, guard: BusyGuard) {
        self.busy = Some(guard);
    }

    /// Tells the busy guard when `backend` ended, which its timer read: the connection is
    /// idle from then, with no clock read of its own when the guard is dropped.
    fn note_end(busy: &mut Option<BusyGuard>, backend: &GatewayBody) {
        if let (Some(guard), Some(at)) = (busy.as_mut(), backend.ended_at()) {
            guard.ended_at(at);
        }
    }
}

impl Drop for FrontBody {
    fn drop(&mut self) {
        // hyper drops a body whose last chunk it has (`is_end_stream`) without polling it
        // to its end.
        if let BodyKind::Backend {
            body: Some(backend),
            ..
        } = &self.kind
        {
            FrontBody::note_end(&mut self.busy, backend);
        }
    }
}

impl Body for FrontBody {
    type Data = Bytes;
    type Error = BodyError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BodyError>>> {
        let this = self.get_mut();
        match &mut this.kind {
            BodyKind::Full(bytes) => Poll::Ready(bytes.take().map(|b| Ok(Frame::data(b)))),
            BodyKind::File(file) => file.poll_chunk(cx),
            BodyKind::Backend {
                first,
                body,
                request_id,
            } => {
                if let Some(data) = first.take() {
                    return Poll::Ready(Some(Ok(Frame::data(data))));
                }
                let Some(backend) = body.as_mut() else {
                    return Poll::Ready(None);
                };
                match backend.poll_chunk(cx) {
                    Poll::Pending => Poll::Pending,
                    Poll::Ready(Some(Ok(data))) => Poll::Ready(Some(Ok(Frame::data(data)))),
                    Poll::Ready(Some(Err(e))) => {
                        *body = None;
                        tracing::warn!(request_id = *request_id, error = %e, "backend response broke off");
                        Poll::Ready(Some(Err(e.into())))
                    }
                    // The end: dropping the body gives the slot back now, not when hyper
                    // drops this one.
                    Poll::Ready(None) => {
                        FrontBody::note_end(&mut this.busy, backend);
                        *body = None;
                        Poll::Ready(None)
                    }
                }
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        match &self.kind {
            BodyKind::Full(bytes) => bytes.is_none(),
            BodyKind::File(file) => file.remaining() == 0,
            BodyKind::Backend { first, body, .. } => {
                first.is_none() && body.as_ref().is_none_or(GatewayBody::is_ended)
            }
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.kind {
            BodyKind::Full(Some(b)) => SizeHint::with_exact(b.len() as u64),
            BodyKind::Full(None) => SizeHint::with_exact(0),
            BodyKind::File(file) => SizeHint::with_exact(file.remaining()),
            BodyKind::Backend { .. } => SizeHint::default(),
        }
    }
}
