//! Streams that are either TCP or Unix, for front listeners and backend connections alike.
//!
//! One enum over the two kinds lets codecs and exchanges be written once; both kinds are
//! `Unpin`, so the I/O traits forward with `Pin::new` and no unsafe code.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpStream, UnixStream};

use crate::config::BackendAddress;

/// A connected TCP or Unix stream.
#[derive(Debug)]
pub enum Stream {
    /// TCP.
    Tcp(TcpStream),
    /// Unix.
    Unix(UnixStream),
}

impl Stream {
    /// Connects to `addr` within `timeout`. TCP streams get `TCP_NODELAY`: every write corral
    /// makes is a whole record or packet, and Nagle's delay would add 40 ms stalls.
    pub async fn connect(addr: &BackendAddress, timeout: Duration) -> io::Result<Stream> {
        let connect = async {
            match addr {
                BackendAddress::Tcp { host, port } => {
                    let s = TcpStream::connect((host.as_str(), *port)).await?;
                    s.set_nodelay(true)?;
                    Ok(Stream::Tcp(s))
                }
                BackendAddress::Unix(p) => Ok(Stream::Unix(UnixStream::connect(p).await?)),
            }
        };
        match tokio::time::timeout(timeout, connect).await {
            Ok(result) => result,
            Err(_) => Err(io::Error::new(
                io::ErrorKind::TimedOut,
                format!("connect did not complete within {timeout:?}"),
            )),
        }
    }
}

impl Stream {
    /// The same connection registered with the runtime the caller runs in instead of the one
    /// it was made in: a backend connection one serving thread made and another one reuses
    /// (`crate::shards`) would otherwise have its every readiness event delivered by the
    /// first thread, which then has to wake the second. Two `epoll_ctl` calls, once per move.
    pub fn reregister(self) -> io::Result<Stream> {
        match self {
            Stream::Tcp(s) => Ok(Stream::Tcp(TcpStream::from_std(s.into_std()?)?)),
            Stream::Unix(s) => Ok(Stream::Unix(UnixStream::from_std(s.into_std()?)?)),
        }
    }
}

impl AsyncRead for Stream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Stream::Tcp(s) => Pin::new(s).poll_read(cx, buf),
            Stream::Unix(s) => Pin::new(s).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for Stream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Stream::Tcp(s) => Pin::new(s).poll_write(cx, buf),
            Stream::Unix(s) => Pin::new(s).poll_write(cx, buf),
        }
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Stream::Tcp(s) => Pin::new(s).poll_write_vectored(cx, bufs),
            Stream::Unix(s) => Pin::new(s).poll_write_vectored(cx, bufs),
        }
    }

    fn is_write_vectored(&self) -> bool {
        match self {
            Stream::Tcp(s) => s.is_write_vectored(),
            Stream::Unix(s) => s.is_write_vectored(),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Stream::Tcp(s) => Pin::new(s).poll_flush(cx),
            Stream::Unix(s) => Pin::new(s).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Stream::Tcp(s) => Pin::new(s).poll_shutdown(cx),
            Stream::Unix(s) => Pin::new(s).poll_shutdown(cx),
        }
    }
}
