//! A front connection's stream, wrapped: it tells the connection's [`ConnState`] when bytes
//! arrive (the first byte of a head starts `header_timeout`) and fails a write that stays
//! blocked for `send_timeout`.

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use super::ConnState;

/// A stream that tells its [`ConnState`] when bytes arrive.
#[derive(Debug)]
pub struct Watched<S> {
    inner: S,
    state: Arc<ConnState>,
    /// Longest a write may stay blocked on a client that reads nothing.
    send_timeout: Option<Duration>,
    /// Armed when a write blocks; cleared by the next byte written. Allocated only when a
    /// write has to wait, which a client that keeps up never makes it do.
    send_deadline: Option<Pin<Box<tokio::time::Sleep>>>,
}

impl<S> Watched<S> {
    /// Wraps `inner`.
    pub fn new(inner: S, state: Arc<ConnState>) -> Watched<S> {
        Watched {
            inner,
            state,
            send_timeout: None,
            send_deadline: None,
        }
    }

    /// Fails a write that stays blocked for `timeout` (a client that stopped reading): the
    /// connection then ends, which drops the response body and aborts the backend request,
    /// so the worker is freed without being blamed.
    pub fn with_send_timeout(mut self, timeout: Duration) -> Watched<S> {
        self.send_timeout = Some(timeout);
        self
    }

    /// Tracks a write's outcome against the send deadline.
    fn on_write<T>(
        &mut self,
        cx: &mut Context<'_>,
        polled: Poll<io::Result<T>>,
    ) -> Poll<io::Result<T>> {
        match &polled {
            Poll::Pending => {
                let Some(timeout) = self.send_timeout else {
                    return polled;
                };
                let deadline = self
                    .send_deadline
                    .get_or_insert_with(|| Box::pin(tokio::time::sleep(timeout)));
                if std::future::Future::poll(deadline.as_mut(), cx).is_ready() {
                    self.send_deadline = None;
                    return Poll::Ready(Err(io::Error::new(
                        io::ErrorKind::TimedOut,
                        format!("the client read nothing for {timeout:?} (send_timeout)"),
                    )));
                }
                polled
            }
            Poll::Ready(_) => {
                self.send_deadline = None;
                polled
            }
        }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Watched<S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        let polled = Pin::new(&mut this.inner).poll_read(cx, buf);
        if matches!(polled, Poll::Ready(Ok(()))) && buf.filled().len() > before {
            this.state.on_read();
        }
        polled
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Watched<S> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let polled = Pin::new(&mut this.inner).poll_write(cx, buf);
        this.on_write(cx, polled)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let polled = Pin::new(&mut this.inner).poll_write_vectored(cx, bufs);
        this.on_write(cx, polled)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let polled = Pin::new(&mut this.inner).poll_flush(cx);
        this.on_write(cx, polled)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }
}
