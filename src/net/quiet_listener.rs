//! A listening Unix socket whose accepted connections are [`QuietUnix`] streams.
//!
//! tokio's own listener hands out its `UnixStream`, registered for reads and writes; turning
//! that into a read-only registration would cost two more `epoll_ctl` calls and a `fcntl`
//! per connection (nginx's plain `fastcgi_pass` makes one per request). Here the accepted
//! descriptor is made non-blocking by `accept4` itself and registered once, for reads, and
//! only when a read of it first finds nothing to take.

use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::{UnixListener as StdUnixListener, UnixStream as StdUnixStream};
use std::path::Path;

use nix::sys::socket::{accept4, SockFlag};
use tokio::io::unix::AsyncFd;
use tokio::io::Interest;

use super::quiet_unix::register;
use super::QuietUnix;

/// A Unix listener registered with the current runtime for accepts.
#[derive(Debug)]
pub struct QuietListener {
    io: AsyncFd<StdUnixListener>,
}

impl QuietListener {
    /// Binds `path` and listens with the system's backlog.
    pub fn bind(path: &Path) -> io::Result<QuietListener> {
        QuietListener::from_std(StdUnixListener::bind(path)?)
    }

    /// `listener` (made non-blocking here) registered with the current runtime.
    pub fn from_std(listener: StdUnixListener) -> io::Result<QuietListener> {
        listener.set_nonblocking(true)?;
        Ok(QuietListener {
            io: register(listener, Interest::READABLE)?,
        })
    }

    /// The socket out of the runtime, still non-blocking.
    pub fn into_std(self) -> io::Result<StdUnixListener> {
        Ok(self.io.into_inner())
    }

    /// The next connection, not registered with the reactor until a read of it finds
    /// nothing (`QuietUnix::accepted`): until then nothing watches it.
    pub async fn accept(&self) -> io::Result<QuietUnix> {
        let fd = self
            .io
            .async_io(Interest::READABLE, |l| {
                accept4(
                    l.as_raw_fd(),
                    SockFlag::SOCK_NONBLOCK | SockFlag::SOCK_CLOEXEC,
                )
                .map_err(io::Error::from)
            })
            .await?;
        // SAFETY: `accept4` returned a new descriptor that nothing else owns.
        let stream = StdUnixStream::from(unsafe { OwnedFd::from_raw_fd(fd) });
        Ok(QuietUnix::accepted(stream))
    }
}

impl AsFd for QuietListener {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.io.get_ref().as_fd()
    }
}

impl AsRawFd for QuietListener {
    fn as_raw_fd(&self) -> RawFd {
        self.io.get_ref().as_raw_fd()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::net::fdinfo::{epoll_events, inode};
    use std::future::Future;
    use std::io::{Read, Write};
    use std::task::{Context, Poll};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// A listener in a temporary directory, a client connected to it, and the accepted end.
    async fn accepted() -> (tempfile::TempDir, StdUnixStream, QuietUnix) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("front.sock");
        let listener = QuietListener::bind(&path).unwrap();
        let client = StdUnixStream::connect(&path).unwrap();
        let ours = listener.accept().await.unwrap();
        (dir, client, ours)
    }

    const EPOLLIN: u32 = libc::EPOLLIN as u32;
    const EPOLLOUT: u32 = libc::EPOLLOUT as u32;

    /// nginx writes its request as it connects: read at once, it costs the connection no
    /// registration with the reactor (nor the removal of one at its close).
    #[tokio::test]
    async fn a_request_already_there_is_read_without_registering_the_connection() {
        let (_dir, mut client, mut ours) = accepted().await;
        client.write_all(b"request").unwrap();
        let mut buf = [0u8; 16];
        assert_eq!(ours.read(&mut buf).await.unwrap(), 7);
        assert_eq!(&buf[..7], b"request");
        assert!(!ours.is_watched());
        let events = epoll_events(ours.fd(), inode(ours.fd()));
        assert!(events.is_empty(), "registered: {events:x?}");
    }

    /// A request that comes after the accept: the read that finds nothing registers the
    /// connection, for reads only, and the bytes then wake it.
    #[tokio::test]
    async fn a_request_that_comes_later_registers_the_connection_for_reads_only() {
        let (_dir, mut client, mut ours) = accepted().await;
        let fd = ours.fd();
        let mut buf = [0u8; 16];
        let mut read = std::pin::pin!(ours.read(&mut buf));
        let mut cx = Context::from_waker(std::task::Waker::noop());
        assert!(read.as_mut().poll(&mut cx).is_pending(), "nothing was sent");
        let events = epoll_events(fd, inode(fd));
        assert_eq!(events.len(), 1, "registered once: {events:?}");
        assert_eq!(events[0] & EPOLLIN, EPOLLIN);
        assert_eq!(events[0] & EPOLLOUT, 0, "no write readiness: {events:x?}");
        client.write_all(b"late").unwrap();
        let n = tokio::time::timeout(std::time::Duration::from_secs(5), read)
            .await
            .expect("the bytes woke the read")
            .unwrap();
        assert_eq!(&buf[..n], b"late");
    }

    /// nginx writes its request as it connects: the first read takes it without waiting
    /// for a readiness event the reactor has not delivered yet.
    #[tokio::test]
    async fn the_first_read_does_not_wait_for_the_reactor() {
        let (_dir, mut client, mut ours) = accepted().await;
        client.write_all(b"request").unwrap();
        let mut buf = [0u8; 16];
        let (mut reader, _writer) = ours.split();
        let mut read = std::pin::pin!(reader.read(&mut buf));
        let mut cx = Context::from_waker(std::task::Waker::noop());
        match read.as_mut().poll(&mut cx) {
            Poll::Ready(n) => assert_eq!(n.unwrap(), 7),
            Poll::Pending => panic!("the bytes were there"),
        }
        assert_eq!(&buf[..7], b"request");
    }

    /// The split halves read a request, write an answer, wait for room when the answer
    /// outgrows the socket (a write registration made then, on a duplicate), and see the
    /// client's close as an end.
    #[tokio::test]
    async fn the_halves_read_write_wait_for_room_and_see_the_close() {
        let (_dir, mut client, mut ours) = accepted().await;
        client.write_all(b"GET").unwrap();
        let big = vec![9u8; 4 << 20];
        let reading = std::thread::spawn(move || {
            let mut got = Vec::new();
            // Reads the answer until corral shuts its side down, then closes.
            client.read_to_end(&mut got).unwrap();
            got
        });
        {
            let (mut reader, mut writer) = ours.split();
            let mut head = [0u8; 3];
            reader.read_exact(&mut head).await.unwrap();
            assert_eq!(&head, b"GET");
            writer.write_all(b"small").await.unwrap();
            writer.write_all(&big).await.unwrap();
            writer.shutdown().await.unwrap();
        }
        let fd = ours.fd();
        let with_room = ours.room_fd();
        let room = with_room.expect("4 MiB cannot fit a Unix socket's buffer");
        let ino = inode(fd);
        // The request was read as it came: only the write registration is there.
        assert!(epoll_events(fd, ino).is_empty());
        let room_events = epoll_events(room, ino);
        assert_eq!(room_events.len(), 1);
        assert!(room_events.iter().all(|e| e & EPOLLOUT == EPOLLOUT));
        ours.settle();
        assert!(
            epoll_events(room, ino).is_empty(),
            "settled: {room_events:?}"
        );
        let got = reading.join().unwrap();
        assert_eq!(&got[..5], b"small");
        assert_eq!(got.len(), 5 + big.len());
        assert!(got[5..].iter().all(|&b| b == 9));
        let mut end = [0u8; 1];
        assert_eq!(ours.read(&mut end).await.unwrap(), 0, "the client closed");
    }

    #[tokio::test]
    async fn a_client_that_closes_at_once_is_an_end() {
        let (_dir, client, mut ours) = accepted().await;
        drop(client);
        let mut buf = [0u8; 8];
        assert_eq!(ours.read(&mut buf).await.unwrap(), 0);
        assert!(
            !ours.is_watched(),
            "an end read at once needs no registration"
        );
        // Writing to it fails (no SIGPIPE) rather than waiting.
        let e = ours.write_all(b"late answer").await.unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::BrokenPipe);
    }
}
