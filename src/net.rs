//! Streams that are either TCP or Unix, for front listeners and backend connections alike.
//!
//! One enum over the two kinds lets codecs and exchanges be written once; both kinds are
//! `Unpin`, so the I/O traits forward with `Pin::new` and no unsafe code. The Unix kind is
//! watched for reads only (`quiet_unix.rs`), on the front and to backends alike; TCP is
//! registered as tokio does.

#[cfg(test)]
pub(crate) mod fdinfo;
mod owed;
mod quiet_halves;
mod quiet_listener;
mod quiet_unix;

pub use owed::peer_closed;
pub use quiet_halves::{QuietRead, QuietWrite};
pub use quiet_listener::QuietListener;
pub use quiet_unix::QuietUnix;

use std::io;
use std::time::Duration;

use tokio::net::TcpStream;

use crate::config::BackendAddress;

/// A connected TCP or Unix stream: an accepted front connection or a backend connection.
#[derive(Debug)]
pub enum Stream {
    /// TCP, registered as tokio registers it (TCP signals no write space it was not asked
    /// for).
    Tcp(TcpStream),
    /// Unix, registered for reads only: on a Unix socket every read the peer makes would
    /// otherwise wake the serving thread for write space it does not need.
    Unix(QuietUnix),
}

impl Stream {
    /// Connects to `addr` within `timeout`. TCP streams get `TCP_NODELAY`: every write corral
    /// makes is a whole record or packet, and Nagle's delay would add 40 ms stalls. A Unix
    /// connect never waits (it completes or fails at once), so it needs no timer.
    pub async fn connect(addr: &BackendAddress, timeout: Duration) -> io::Result<Stream> {
        let (host, port) = match addr {
            BackendAddress::Unix(p) => return Ok(Stream::Unix(QuietUnix::connect(p)?)),
            BackendAddress::Tcp { host, port } => (host, *port),
        };
        let connect = async {
            let s = TcpStream::connect((host.as_str(), port)).await?;
            s.set_nodelay(true)?;
            Ok(Stream::Tcp(s))
        };
        match tokio::time::timeout(timeout, connect).await {
            Ok(result) => result,
            Err(_) => Err(io::Error::new(
                io::ErrorKind::TimedOut,
                format!("connect did not complete within {timeout:?}"),
            )),
        }
    }

    /// The same connection registered with the runtime the caller runs in instead of the one
    /// it was made in: a backend connection one serving thread made and another one reuses
    /// (`crate::shards`) would otherwise have its every readiness event delivered by the
    /// first thread, which then has to wake the second. Two `epoll_ctl` calls, once per move.
    pub fn reregister(self) -> io::Result<Stream> {
        match self {
            Stream::Tcp(s) => Ok(Stream::Tcp(TcpStream::from_std(s.into_std()?)?)),
            Stream::Unix(s) => Ok(Stream::Unix(s.reregister()?)),
        }
    }

    /// The connection's descriptor.
    pub fn raw_fd(&self) -> std::os::fd::RawFd {
        use std::os::fd::AsRawFd;
        match self {
            Stream::Tcp(s) => s.as_raw_fd(),
            Stream::Unix(s) => s.fd(),
        }
    }

    /// Drops what a blocked write registered (`QuietUnix::settle`); nothing for TCP.
    pub fn settle(&mut self) {
        if let Stream::Unix(s) = self {
            s.settle();
        }
    }

    /// A kept backend connection's reads leave their bytes until the next request is
    /// written (`QuietUnix::leave_reads`); nothing for TCP, whose reads wake no one.
    pub fn leave_reads(&mut self) {
        if let Stream::Unix(s) = self {
            s.leave_reads();
        }
    }

    /// An accepted front connection's first read leaves its bytes on the socket until the
    /// next read or the drop (`QuietUnix::leave_first_read`); nothing for TCP, whose reads
    /// wake no one.
    pub fn leave_first_read(&mut self) {
        if let Stream::Unix(s) = self {
            s.leave_first_read();
        }
    }

    /// As a one-byte non-blocking peek (`Ok(0)` closed, `Ok(n)` bytes, `WouldBlock`
    /// quiet), past the bytes the last read left on the socket (`QuietUnix::owed`).
    pub fn peek_idle(&self) -> io::Result<usize> {
        match self {
            Stream::Unix(s) if s.owed() > 0 => s.peek_past_owed(),
            _ => {
                let mut probe = [0u8; 1];
                let flags = libc::MSG_PEEK | libc::MSG_DONTWAIT;
                // SAFETY: `probe` is valid for writes of its one byte.
                let n = unsafe { libc::recv(self.raw_fd(), probe.as_mut_ptr().cast(), 1, flags) };
                usize::try_from(n).map_err(|_| io::Error::last_os_error())
            }
        }
    }
}

/// `AsyncRead` for an enum whose two variants each hold an `AsyncRead + Unpin` value: every
/// call goes to the variant's own. Used by [`Stream`] and by a front connection's borrowed
/// halves (`crate::front::halves`).
macro_rules! forward_read {
    ($ty:ty, $a:path, $b:path) => {
        impl tokio::io::AsyncRead for $ty {
            fn poll_read(
                self: std::pin::Pin<&mut Self>,
                cx: &mut std::task::Context<'_>,
                buf: &mut tokio::io::ReadBuf<'_>,
            ) -> std::task::Poll<std::io::Result<()>> {
                match self.get_mut() {
                    $a(s) => std::pin::Pin::new(s).poll_read(cx, buf),
                    $b(s) => std::pin::Pin::new(s).poll_read(cx, buf),
                }
            }
        }
    };
}

/// `AsyncWrite` for an enum whose two variants each hold an `AsyncWrite + Unpin` value, the
/// same way as [`forward_read`].
macro_rules! forward_write {
    ($ty:ty, $a:path, $b:path) => {
        impl tokio::io::AsyncWrite for $ty {
            fn poll_write(
                self: std::pin::Pin<&mut Self>,
                cx: &mut std::task::Context<'_>,
                buf: &[u8],
            ) -> std::task::Poll<std::io::Result<usize>> {
                match self.get_mut() {
                    $a(s) => std::pin::Pin::new(s).poll_write(cx, buf),
                    $b(s) => std::pin::Pin::new(s).poll_write(cx, buf),
                }
            }

            fn poll_write_vectored(
                self: std::pin::Pin<&mut Self>,
                cx: &mut std::task::Context<'_>,
                bufs: &[std::io::IoSlice<'_>],
            ) -> std::task::Poll<std::io::Result<usize>> {
                match self.get_mut() {
                    $a(s) => std::pin::Pin::new(s).poll_write_vectored(cx, bufs),
                    $b(s) => std::pin::Pin::new(s).poll_write_vectored(cx, bufs),
                }
            }

            fn is_write_vectored(&self) -> bool {
                match self {
                    $a(s) => s.is_write_vectored(),
                    $b(s) => s.is_write_vectored(),
                }
            }

            fn poll_flush(
                self: std::pin::Pin<&mut Self>,
                cx: &mut std::task::Context<'_>,
            ) -> std::task::Poll<std::io::Result<()>> {
                match self.get_mut() {
                    $a(s) => std::pin::Pin::new(s).poll_flush(cx),
                    $b(s) => std::pin::Pin::new(s).poll_flush(cx),
                }
            }

            fn poll_shutdown(
                self: std::pin::Pin<&mut Self>,
                cx: &mut std::task::Context<'_>,
            ) -> std::task::Poll<std::io::Result<()>> {
                match self.get_mut() {
                    $a(s) => std::pin::Pin::new(s).poll_shutdown(cx),
                    $b(s) => std::pin::Pin::new(s).poll_shutdown(cx),
                }
            }
        }
    };
}

pub(crate) use {forward_read, forward_write};

forward_read!(Stream, Stream::Tcp, Stream::Unix);
forward_write!(Stream, Stream::Tcp, Stream::Unix);
