//! A front connection's read and write halves, borrowed from its stream.
//!
//! `tokio::io::split` puts the stream behind an `Arc` and a lock taken on every read and
//! write: an allocation per connection, and a lock per poll, for halves that never leave the
//! connection's task. The halves of the stream's own `split` borrow it instead: the reader
//! and the writer of a CGI front connection run in its one task, which owns the stream.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{tcp, unix};

use crate::net::Stream;

/// The read half of a [`Stream`].
#[derive(Debug)]
pub(crate) enum ReadPart<'a> {
    Tcp(tcp::ReadHalf<'a>),
    Unix(unix::ReadHalf<'a>),
}

/// The write half of a [`Stream`]; shutting it down shuts the stream down for writing.
#[derive(Debug)]
pub(crate) enum WritePart<'a> {
    Tcp(tcp::WriteHalf<'a>),
    Unix(unix::WriteHalf<'a>),
}

/// Splits `stream` into halves that borrow it.
pub(crate) fn halves(stream: &mut Stream) -> (ReadPart<'_>, WritePart<'_>) {
    match stream {
        Stream::Tcp(s) => {
            let (r, w) = s.split();
            (ReadPart::Tcp(r), WritePart::Tcp(w))
        }
        Stream::Unix(s) => {
            let (r, w) = s.split();
            (ReadPart::Unix(r), WritePart::Unix(w))
        }
    }
}

impl AsyncRead for ReadPart<'_> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            ReadPart::Tcp(r) => Pin::new(r).poll_read(cx, buf),
            ReadPart::Unix(r) => Pin::new(r).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for WritePart<'_> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            WritePart::Tcp(w) => Pin::new(w).poll_write(cx, buf),
            WritePart::Unix(w) => Pin::new(w).poll_write(cx, buf),
        }
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            WritePart::Tcp(w) => Pin::new(w).poll_write_vectored(cx, bufs),
            WritePart::Unix(w) => Pin::new(w).poll_write_vectored(cx, bufs),
        }
    }

    fn is_write_vectored(&self) -> bool {
        match self {
            WritePart::Tcp(w) => w.is_write_vectored(),
            WritePart::Unix(w) => w.is_write_vectored(),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            WritePart::Tcp(w) => Pin::new(w).poll_flush(cx),
            WritePart::Unix(w) => Pin::new(w).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            WritePart::Tcp(w) => Pin::new(w).poll_shutdown(cx),
            WritePart::Unix(w) => Pin::new(w).poll_shutdown(cx),
        }
    }
}
