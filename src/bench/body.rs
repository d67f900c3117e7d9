//! A hyper body that is one buffer known in advance (or nothing): the null HTTP backend's
//! answer and the load generator's request body, without pulling in http-body-util.

use std::convert::Infallible;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};

/// One data frame of known length, then the end.
#[derive(Debug, Clone, Default)]
pub struct FixedBody(Option<Bytes>);

impl FixedBody {
    /// A body made of `bytes` (empty bytes make an empty body).
    pub fn new(bytes: Bytes) -> FixedBody {
        FixedBody((!bytes.is_empty()).then_some(bytes))
    }
}

impl Body for FixedBody {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        Poll::Ready(self.get_mut().0.take().map(|b| Ok(Frame::data(b))))
    }

    fn is_end_stream(&self) -> bool {
        self.0.is_none()
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::with_exact(self.0.as_ref().map_or(0, |b| b.len() as u64))
    }
}
