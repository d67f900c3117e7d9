//! A Unix stream the reactor watches for reads only: corral's side of every Unix connection,
//! a backend connection and an accepted front connection alike.
//!
//! tokio registers every `UnixStream` for both readiness kinds, edge-triggered. On a Unix
//! socket the kernel signals write space each time the peer takes bytes off the socket, not
//! only after the writer found it full as TCP does. So when a backend read the request
//! corral had just sent, the serving thread, asleep in `epoll_wait` for the response, was
//! woken for a write it had no use for, went back to sleep and was woken again by the
//! response: three `epoll_wait` returns per request instead of two, and a wake-up the
//! backend paid for too (strace of the null-FastCGI hop, docs/decisions.md decision 35).
//!
//! The same happens on a front connection: each time nginx takes a response off corral's
//! FastCGI or SCGI Unix socket, the serving thread was woken for write space.
//!
//! Here the descriptor is registered for reads alone. Writes go straight to the socket; only
//! when one would block (a request body larger than the socket's buffer) is a duplicate of
//! the descriptor registered for write readiness, and it stays until [`QuietUnix::settle`]
//! (a kept connection's exchange ended) or the stream is dropped. [`QuietUnix::split`] gives
//! a reader and a writer that borrow the stream, for a front connection's one task.
//!
//! An accepted connection is not registered at all until a read finds nothing to take
//! ([`QuietUnix::accepted`]): nginx's plain `fastcgi_pass` writes its whole request as it
//! connects, so corral reads it, answers and closes, and a connection that never had to
//! wait costs no `epoll_ctl` to add it and none to remove it (two system calls of the
//! eleven such a request cost). What is not registered is not watched: the FastCGI front
//! stops reading a connection whose front server has sent all it will (`front/fastcgi/reader.rs`).
//!
//! A kept connection to a worker that waits for its next request blocked in `read` also
//! leaves each answer on the socket until the next request is written
//! ([`QuietUnix::leave_reads`], `owed.rs`): taking it off would wake that worker for nothing.

use std::io;
use std::os::fd::{AsFd, AsRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream as StdUnixStream;
use std::path::Path;
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use nix::sys::socket::{connect, socket, AddressFamily, SockFlag, SockType, UnixAddr};
use tokio::io::unix::AsyncFd;
use tokio::io::{AsyncRead, AsyncWrite, Interest, ReadBuf};

use super::owed::Owed;

/// A connected Unix stream registered with the current runtime for read readiness only.
///
/// The fields drop in order: the registrations (an `epoll_ctl` each, to remove them) before
/// the stream whose descriptor they name.
#[derive(Debug)]
pub struct QuietUnix {
    // The fields are the halves' too (`super::quiet_halves`).
    /// The read registration, of the stream's own descriptor. `None` while a just-accepted
    /// connection has not yet had to wait for bytes: its reads ask the socket directly.
    pub(super) watch: Option<AsyncFd<RawFd>>,
    /// A duplicate descriptor registered for write readiness while a write waits for room.
    pub(super) room: Option<AsyncFd<OwnedFd>>,
    /// The peeking reads (`super::owed`) of a kept backend connection, or of an accepted
    /// front connection's first read; `None` elsewhere.
    pub(super) owed: Option<Owed>,
    pub(super) stream: StdUnixStream,
}

impl QuietUnix {
    /// Registers `stream` (made non-blocking here) with the current runtime, reads only.
    pub fn new(stream: StdUnixStream) -> io::Result<QuietUnix> {
        stream.set_nonblocking(true)?;
        QuietUnix::registered(stream)
    }

    /// Registers `stream`, already non-blocking, with the current runtime, reads only.
    pub(super) fn registered(stream: StdUnixStream) -> io::Result<QuietUnix> {
        Ok(QuietUnix {
            watch: Some(watch(&stream)?),
            room: None,
            owed: None,
            stream,
        })
    }

    /// A connection a listener just accepted (already non-blocking), not registered yet:
    /// its reads ask the socket at once (the client's request is likely there already, as
    /// tokio assumes of what its listeners accept), and the first that finds nothing
    /// registers it with the current runtime, reads only, and waits. Until then nothing
    /// watches it: neither bytes nor the peer's close wake anyone.
    pub(super) fn accepted(stream: StdUnixStream) -> QuietUnix {
        QuietUnix {
            watch: None,
            room: None,
            owed: None,
            stream,
        }
    }

    /// Whether the reactor watches the stream for reads: an accepted connection is watched
    /// only once a read of it has found nothing (`QuietUnix::accepted`).
    pub fn is_watched(&self) -> bool {
        self.watch.is_some()
    }

    /// A tokio stream (a test's socketpair, say) taken out of its runtime and registered
    /// with the current one, reads only.
    pub fn from_tokio(stream: tokio::net::UnixStream) -> io::Result<QuietUnix> {
        QuietUnix::new(stream.into_std()?)
    }

    /// Connects to the socket at `path` without blocking. A Unix connect completes at once
    /// or fails at once (`WouldBlock` when the listener's accept queue is full), as tokio's
    /// own connect does on a Unix socket.
    pub fn connect(path: &Path) -> io::Result<QuietUnix> {
        let fd = socket(
            AddressFamily::Unix,
            SockType::Stream,
            SockFlag::SOCK_NONBLOCK | SockFlag::SOCK_CLOEXEC,
            None,
        )?;
        let addr = UnixAddr::new(path)?;
        connect(fd.as_raw_fd(), &addr)?;
        QuietUnix::registered(StdUnixStream::from(fd))
    }

    /// The same connection registered with the runtime the caller runs in.
    pub fn reregister(mut self) -> io::Result<QuietUnix> {
        self.room = None;
        self.watch = None;
        self.stream.set_nonblocking(true)?;
        self.watch = Some(watch(&self.stream)?);
        Ok(self)
    }

    /// From now on the reads that follow a write peek, and the next read takes their bytes
    /// off (`super::owed`): for a kept backend connection.
    pub fn leave_reads(&mut self) {
        self.owed.get_or_insert_with(Owed::default);
    }

    /// The first read of this (accepted) connection peeks, and its bytes stay on the socket
    /// until the next read or the drop (`super::owed`, `Owed::first_read`): for a front
    /// connection whose thread has nothing else to do, so that the front server, asleep until
    /// the answer, is not woken for the room the read would make.
    pub fn leave_first_read(&mut self) {
        self.owed = Some(Owed::first_read());
    }

    /// Bytes at the head of the socket the last read peeked and left there.
    pub fn owed(&self) -> usize {
        self.owed.as_ref().map_or(0, Owed::len)
    }

    /// For the check of an idle connection, past the bytes the last read left on the
    /// socket: as a one-byte non-blocking peek would answer without them (`Ok(0)` closed,
    /// `Ok(n)` bytes, `WouldBlock` quiet; `super::owed::past`).
    pub fn peek_past_owed(&self) -> io::Result<usize> {
        super::owed::past(self.fd(), self.owed())
    }

    /// After a write: what it wrote, noted by the peeking reads.
    fn wrote(&mut self, wrote: Poll<io::Result<usize>>) -> Poll<io::Result<usize>> {
        if let (Some(owed), Poll::Ready(Ok(1..))) = (&mut self.owed, &wrote) {
            owed.wrote();
        }
        wrote
    }

    /// Drops the write registration, if a blocked write made one: the connection goes back
    /// to waking its thread for reads only.
    pub fn settle(&mut self) {
        self.room = None;
    }

    /// The duplicate descriptor a blocked write registered for write readiness, if any.
    #[cfg(test)]
    pub(crate) fn room_fd(&self) -> Option<RawFd> {
        self.room.as_ref().map(|r| r.get_ref().as_raw_fd())
    }

    /// The descriptor.
    pub fn fd(&self) -> RawFd {
        self.stream.as_raw_fd()
    }

    /// One non-blocking write, no wait and no `SIGPIPE`.
    pub fn try_write(&self, bytes: &[u8]) -> io::Result<usize> {
        send(self.fd(), bytes)
    }

    /// Waits until the reactor sees the stream readable (bytes or the peer's close), and
    /// leaves that readiness set. An error for a stream nothing watches yet.
    pub async fn readable(&self) -> io::Result<()> {
        let Some(watch) = &self.watch else {
            return Err(io::Error::other("the stream is not registered yet"));
        };
        watch.readable().await.map(|mut guard| guard.retain_ready())
    }

    /// `f` on the descriptor if the reactor last saw it readable, else `WouldBlock`; a
    /// `WouldBlock` from `f` clears that readiness (tokio's `try_io`). A stream nothing
    /// watches yet is asked directly.
    pub fn try_read_io<R>(&self, f: impl FnOnce(RawFd) -> io::Result<R>) -> io::Result<R> {
        match &self.watch {
            Some(watch) => watch.try_io(Interest::READABLE, |fd| f(*fd)),
            None => f(self.fd()),
        }
    }
}

/// `inner` registered with the current runtime for `interest`.
pub(super) fn register<T: AsRawFd>(inner: T, interest: Interest) -> io::Result<AsyncFd<T>> {
    // SAFETY: `inner` owns its descriptor (a std `UnixListener` or an `OwnedFd`), which stays
    // open and names the same socket until the `AsyncFd` drops it or gives it back.
    unsafe { AsyncFd::register_with_interest(inner, interest) }.map_err(|e| e.into_parts().1)
}

/// The read registration of `stream`'s descriptor, with the current runtime. The caller
/// keeps the stream open for as long as the registration: [`QuietUnix`] drops it first.
fn watch(stream: &StdUnixStream) -> io::Result<AsyncFd<RawFd>> {
    // SAFETY: the descriptor is `stream`'s, which the registration's owner (a `QuietUnix`,
    // whose fields drop the registration before the stream) keeps open and unchanged while
    // the registration lives.
    unsafe { AsyncFd::register_with_interest(stream.as_raw_fd(), Interest::READABLE) }
        .map_err(|e| e.into_parts().1)
}

pub(super) fn send(fd: RawFd, bytes: &[u8]) -> io::Result<usize> {
    nix::sys::socket::send(fd, bytes, nix::sys::socket::MsgFlags::MSG_NOSIGNAL)
        .map_err(io::Error::from)
}

/// One gathering write of `bufs`, no `SIGPIPE` (hyper writes a response's head and body
/// this way rather than copying them together).
pub(super) fn send_vectored(fd: RawFd, bufs: &[io::IoSlice<'_>]) -> io::Result<usize> {
    nix::sys::socket::sendmsg::<UnixAddr>(
        fd,
        bufs,
        &[],
        nix::sys::socket::MsgFlags::MSG_NOSIGNAL,
        None,
    )
    .map_err(io::Error::from)
}

impl AsyncRead for QuietUnix {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        poll_read_owing(&this.stream, &mut this.watch, &mut this.owed, cx, buf)
    }
}

/// One read from `stream` ([`poll_read`]), through `owed` when its reads peek: the bytes
/// the last peek left are taken off first, and this read peeks if it is due to.
pub(super) fn poll_read_owing(
    stream: &StdUnixStream,
    watch: &mut Option<AsyncFd<RawFd>>,
    owed: &mut Option<Owed>,
    cx: &mut Context<'_>,
    buf: &mut ReadBuf<'_>,
) -> Poll<io::Result<()>> {
    let Some(owed) = owed else {
        return poll_read(stream, watch, cx, buf, 0);
    };
    // SAFETY: the bytes thrown away are written into the unfilled part and never marked
    // initialised or filled; the read that follows writes over them.
    let flags = owed.before_read(stream.as_raw_fd(), unsafe { buf.unfilled_mut() })?;
    let before = buf.filled().len();
    let read = poll_read(stream, watch, cx, buf, flags);
    if let Poll::Ready(Ok(())) = read {
        owed.after_read(flags, buf.filled().len() - before);
    }
    read
}

impl Drop for QuietUnix {
    /// Takes the bytes a peek left off the socket before it closes: a Unix socket closed
    /// with bytes unread makes its peer's next read fail with `ECONNRESET`, not end.
    fn drop(&mut self) {
        let owed = self.owed();
        if owed > 0 {
            let _ = super::owed::discard(self.stream.as_raw_fd(), owed);
        }
    }
}

/// One read from `stream`: at once while nothing watches it (registering it, for reads, when
/// that read finds nothing), else once the reactor has seen it readable.
fn poll_read(
    stream: &StdUnixStream,
    watch: &mut Option<AsyncFd<RawFd>>,
    cx: &mut Context<'_>,
    buf: &mut ReadBuf<'_>,
    flags: libc::c_int,
) -> Poll<io::Result<()>> {
    let fd = stream.as_raw_fd();
    let io = match watch {
        Some(io) => io,
        None => {
            match recv(fd, buf, flags) {
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Poll::Ready(Err(e)),
                Ok(_) => return Poll::Ready(Ok(())),
            }
            // Added after the read that found nothing, epoll still reports bytes that came
            // in between: it reports a descriptor's current state when it is added.
            watch.insert(self::watch(stream)?)
        }
    };
    loop {
        let mut guard = ready!(io.poll_read_ready(cx))?;
        let len = buf.remaining();
        match recv(fd, buf, flags) {
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => guard.clear_ready(),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Poll::Ready(Err(e)),
            Ok(n) => {
                // A short read emptied the socket (epoll reports new bytes as a new edge):
                // the next read waits for the reactor instead of asking the kernel for
                // nothing, as tokio's own streams do.
                if n > 0 && n < len {
                    guard.clear_ready();
                }
                return Poll::Ready(Ok(()));
            }
        }
    }
}

/// One `recv` with `flags` into the unfilled part of `buf`, which it advances by what it
/// read.
fn recv(fd: RawFd, buf: &mut ReadBuf<'_>, flags: libc::c_int) -> io::Result<usize> {
    // SAFETY: `recv` writes at most `unfilled.len()` bytes into the unfilled part and only
    // the `n` bytes it reports are then marked initialised; nothing is read from the
    // uninitialised part.
    let unfilled = unsafe { buf.unfilled_mut() };
    // SAFETY: the pointer and length describe `unfilled`, valid for writes of its length
    // for the duration of the call.
    let n = unsafe { libc::recv(fd, unfilled.as_mut_ptr().cast(), unfilled.len(), flags) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    let n = n.unsigned_abs();
    // SAFETY: `recv` initialised these `n` bytes.
    unsafe { buf.assume_init(n) };
    buf.advance(n);
    Ok(n)
}

/// The write registration of `stream`, made on first need.
fn room<'r>(
    stream: &StdUnixStream,
    room: &'r mut Option<AsyncFd<OwnedFd>>,
) -> io::Result<&'r AsyncFd<OwnedFd>> {
    if room.is_none() {
        let dup = stream.as_fd().try_clone_to_owned()?;
        *room = Some(register(dup, Interest::WRITABLE)?);
    }
    match room {
        Some(room) => Ok(room),
        None => Err(io::Error::other("no write registration")),
    }
}

/// One write (`send` on the descriptor) to `stream`: straight to the socket while no write
/// has found it full, else once the write registration `slot` reports room.
pub(super) fn poll_write(
    stream: &StdUnixStream,
    slot: &mut Option<AsyncFd<OwnedFd>>,
    cx: &mut Context<'_>,
    send: impl Fn(RawFd) -> io::Result<usize>,
) -> Poll<io::Result<usize>> {
    let fd = stream.as_raw_fd();
    if slot.is_none() {
        match send(fd) {
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
            done => return Poll::Ready(done),
        }
    }
    // The socket was full: wait for room through the write registration. Made after the
    // failed write, it still sees room that came in between: epoll reports a descriptor's
    // current state when it is added.
    let room = room(stream, slot)?;
    loop {
        let mut guard = ready!(room.poll_write_ready(cx))?;
        match send(fd) {
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => guard.clear_ready(),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            done => return Poll::Ready(done),
        }
    }
}

pub(super) fn shutdown_write(stream: &StdUnixStream) -> Poll<io::Result<()>> {
    Poll::Ready(
        nix::sys::socket::shutdown(stream.as_raw_fd(), nix::sys::socket::Shutdown::Write)
            .map_err(io::Error::from),
    )
}

impl AsyncWrite for QuietUnix {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let wrote = poll_write(&this.stream, &mut this.room, cx, |fd| send(fd, buf));
        this.wrote(wrote)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let wrote = poll_write(&this.stream, &mut this.room, cx, |fd| {
            send_vectored(fd, bufs)
        });
        this.wrote(wrote)
    }

    fn is_write_vectored(&self) -> bool {
        true
    }

    fn poll_flush(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        shutdown_write(&self.stream)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    fn pair() -> (QuietUnix, StdUnixStream) {
        let (ours, theirs) = StdUnixStream::pair().unwrap();
        (QuietUnix::new(ours).unwrap(), theirs)
    }

    /// As [`pair`], the peer's end a tokio stream.
    fn async_pair() -> (QuietUnix, tokio::net::UnixStream) {
        let (ours, theirs) = pair();
        theirs.set_nonblocking(true).unwrap();
        (ours, tokio::net::UnixStream::from_std(theirs).unwrap())
    }

    #[tokio::test]
    async fn reads_and_writes_both_ways() {
        let (mut ours, mut theirs) = async_pair();
        ours.write_all(b"ping").await.unwrap();
        let mut got = [0u8; 4];
        theirs.read_exact(&mut got).await.unwrap();
        assert_eq!(&got, b"ping");
        theirs.write_all(b"pong!").await.unwrap();
        let mut back = [0u8; 5];
        ours.read_exact(&mut back).await.unwrap();
        assert_eq!(&back, b"pong!");
        drop(theirs);
        assert_eq!(
            ours.read(&mut back).await.unwrap(),
            0,
            "the peer's close is an end"
        );
    }

    /// A write larger than the socket's buffer blocks, waits on the write registration
    /// made for it, completes as the peer reads, and `settle` drops that registration.
    #[tokio::test]
    async fn a_write_that_fills_the_socket_waits_for_room() {
        let (mut ours, mut theirs) = async_pair();
        let big = vec![7u8; 8 << 20];
        let reader = tokio::spawn(async move {
            let mut got = Vec::new();
            theirs.read_to_end(&mut got).await.unwrap();
            got
        });
        ours.write_all(&big).await.unwrap();
        assert!(
            ours.room.is_some(),
            "8 MiB cannot fit a Unix socket's buffer"
        );
        ours.settle();
        assert!(ours.room.is_none());
        ours.shutdown().await.unwrap();
        let got = reader.await.unwrap();
        assert_eq!(got.len(), big.len());
        assert!(got.iter().all(|&b| b == 7));
    }

    /// A gathering write sends every slice in one call, in order, and the halves gather too.
    #[tokio::test]
    async fn vectored_writes_gather_the_slices() {
        let (mut ours, mut theirs) = pair();
        assert!(ours.is_write_vectored());
        let slices = [io::IoSlice::new(b"head;"), io::IoSlice::new(b"body")];
        assert_eq!(ours.write_vectored(&slices).await.unwrap(), 9);
        let (_, mut writer) = ours.split();
        assert!(writer.is_write_vectored());
        assert_eq!(writer.write_vectored(&slices).await.unwrap(), 9);
        let mut got = [0u8; 18];
        std::io::Read::read_exact(&mut theirs, &mut got).unwrap();
        assert_eq!(&got, b"head;bodyhead;body");
    }

    #[tokio::test]
    async fn connecting_to_nothing_fails_at_once() {
        let dir = tempfile::tempdir().unwrap();
        let e = QuietUnix::connect(&dir.path().join("none.sock")).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::NotFound);
        let path = dir.path().join("l.sock");
        let listener = std::os::unix::net::UnixListener::bind(&path).unwrap();
        let mut ours = QuietUnix::connect(&path).unwrap();
        let (mut theirs, _) = listener.accept().unwrap();
        ours.write_all(b"hi").await.unwrap();
        let mut got = [0u8; 2];
        std::io::Read::read_exact(&mut theirs, &mut got).unwrap();
        assert_eq!(&got, b"hi");
    }
}
