//! A [`QuietUnix`]'s read and write halves, borrowed from it, for a front connection's one
//! task that reads requests while it writes answers (`crate::front::halves`). The reader
//! keeps the stream's read registration and the bytes its reads left on the socket
//! (`super::owed`); the writer keeps its write registration.

use std::io;
use std::os::fd::{OwnedFd, RawFd};
use std::os::unix::net::UnixStream as StdUnixStream;
use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::io::unix::AsyncFd;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use super::owed::Owed;
use super::quiet_unix::{poll_read_owing, poll_write, send, send_vectored, shutdown_write};
use super::QuietUnix;

impl QuietUnix {
    /// A reader and a writer that borrow the stream, for a task that reads requests while
    /// it writes answers (a front connection). The writer keeps the stream's write
    /// registration: one a blocked write made stays until the stream settles or drops.
    pub fn split(&mut self) -> (QuietRead<'_>, QuietWrite<'_>) {
        let QuietUnix {
            watch,
            room,
            owed,
            stream,
        } = self;
        let stream = &*stream;
        (
            QuietRead {
                stream,
                watch,
                owed,
            },
            QuietWrite { stream, room },
        )
    }
}

/// The reading half of a [`QuietUnix`] (see [`QuietUnix::split`]); the only side that
/// registers the stream for reads.
#[derive(Debug)]
pub struct QuietRead<'a> {
    stream: &'a StdUnixStream,
    watch: &'a mut Option<AsyncFd<RawFd>>,
    owed: &'a mut Option<Owed>,
}

impl QuietRead<'_> {
    /// Whether the reactor watches the stream for reads ([`QuietUnix::is_watched`]).
    pub fn is_watched(&self) -> bool {
        self.watch.is_some()
    }
}

/// The writing half of a [`QuietUnix`]; shutting it down shuts the stream down for writing.
#[derive(Debug)]
pub struct QuietWrite<'a> {
    stream: &'a StdUnixStream,
    room: &'a mut Option<AsyncFd<OwnedFd>>,
}

impl QuietWrite<'_> {
    /// As [`QuietUnix::settle`]: drops the write registration a blocked write made, if any.
    pub fn settle(&mut self) {
        *self.room = None;
    }
}

impl AsyncRead for QuietRead<'_> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        poll_read_owing(this.stream, this.watch, this.owed, cx, buf)
    }
}

impl AsyncWrite for QuietWrite<'_> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        poll_write(this.stream, this.room, cx, |fd| send(fd, buf))
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        poll_write(this.stream, this.room, cx, |fd| send_vectored(fd, bufs))
    }

    fn is_write_vectored(&self) -> bool {
        true
    }

    fn poll_flush(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        shutdown_write(self.stream)
    }
}
