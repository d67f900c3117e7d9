//! Reads that leave their bytes on the socket until the peer is awake anyway: corral's side
//! of a kept backend connection over a Unix socket, and the first read of a front
//! connection accepted on a Unix socket while its serving thread has nothing else to do.
//!
//! A backend that has answered blocks in `read` for its next request. On a Unix socket
//! that read waits on the same queue as the write space our reads free, so taking its
//! answer off the socket woke it for nothing: it ran, found no request and slept again (php-cgi
//! switched twice per request where once is its due). At one request at a time on two
//! CPUs that wake-up is one more trip to a halted CPU (docs/decisions.md, decision 35).
//!
//! So the reads after a write peek (`MSG_PEEK`): the reader gets the bytes, the socket
//! keeps them, and the next read takes them off before its own. The last peek of an
//! answer is taken off after the next request has been written, when the backend is
//! awake anyway. Only the first [`PEEK_SPAN`] bytes after a write are peeked: each peek
//! costs a second `recv` and a second copy, worth paying for an answer of a few pieces,
//! not for a download.
//!
//! A front server that has written its request (nginx's `fastcgi_pass`, `scgi_pass`)
//! sleeps in `epoll_wait` with the connection registered for write space as well, so the
//! read that takes its request off woke it too: it ran, found nothing to do and slept again
//! until the answer, a second wake-up per request on a halted CPU at one request at a time
//! (`perf sched timehist`, decision 35). So that read peeks ([`Owed::first_read`]), and the
//! request's bytes come off when the connection drops, right after the answer's last write
//! has woken the front server, or at the next read, for a request that did not end in its
//! first read or a connection that is kept. Only while the serving thread has no other
//! front connection: under load the front server is rarely asleep, and the peek would be a
//! system call more per request for nothing.

use std::io;
use std::mem::MaybeUninit;
use std::os::fd::RawFd;

/// Bytes after a write that are read by peeking.
const PEEK_SPAN: usize = 64 * 1024;

/// What the peeking reads of one connection owe its socket.
#[derive(Debug, Default)]
pub(super) struct Owed {
    /// Bytes at the head of the socket the reader already has.
    len: usize,
    /// Bytes still to be read by peeking since the last write.
    peek_left: usize,
}

impl Owed {
    /// An accepted front connection's: its first read peeks, the ones after it do not.
    pub(super) fn first_read() -> Owed {
        Owed {
            len: 0,
            peek_left: 1,
        }
    }

    /// After a write of at least a byte: the answer's first bytes will be peeked.
    pub(super) fn wrote(&mut self) {
        self.peek_left = PEEK_SPAN;
    }

    /// Before a read of `fd`: takes off the bytes the last peek left there, into `spare`
    /// (the unfilled part of the buffer that read fills next, when it is the larger
    /// scratch), and gives the `recv` flags this read uses.
    pub(super) fn before_read(
        &mut self,
        fd: RawFd,
        spare: &mut [MaybeUninit<u8>],
    ) -> io::Result<libc::c_int> {
        if self.len > 0 {
            discard_into(fd, self.len, spare)?;
            self.len = 0;
        }
        Ok(if self.peek_left > 0 {
            libc::MSG_PEEK
        } else {
            0
        })
    }

    /// After a read made with `flags` that gave `n` bytes.
    pub(super) fn after_read(&mut self, flags: libc::c_int, n: usize) {
        if flags & libc::MSG_PEEK != 0 {
            self.len = n;
            self.peek_left = self.peek_left.saturating_sub(n);
        }
    }

    /// Bytes at the head of the socket the reader already has.
    pub(super) fn len(&self) -> usize {
        self.len
    }
}

/// Takes `len` bytes, already read by a peek, off the socket `fd`.
pub(super) fn discard(fd: RawFd, len: usize) -> io::Result<()> {
    discard_into(fd, len, &mut [])
}

/// [`discard`] into `spare` when it is larger than the 4 KiB of the stack: the unfilled part
/// of a read buffer, which the next read overwrites, so a 17 KiB answer's peeked head comes
/// off in one `recv`, not five.
fn discard_into(fd: RawFd, mut len: usize, spare: &mut [MaybeUninit<u8>]) -> io::Result<()> {
    // Uninitialised: the bytes are thrown away, and zeroing 4 KiB per answer cost more
    // than the rest of the request's reading (callgrind).
    let mut stack = [MaybeUninit::<u8>::uninit(); 4096];
    let scratch = if spare.len() > stack.len() {
        spare
    } else {
        &mut stack[..]
    };
    while len > 0 {
        let want = len.min(scratch.len());
        // SAFETY: `scratch` is valid for writes of `want` bytes for the call; what it writes
        // there is never read (uninitialised memory written, not assumed initialised).
        let n = unsafe { libc::recv(fd, scratch.as_mut_ptr().cast(), want, libc::MSG_DONTWAIT) };
        match n {
            1.. => len = len.saturating_sub(n.unsigned_abs()),
            0 => return Err(io::ErrorKind::UnexpectedEof.into()),
            _ => {
                let e = io::Error::last_os_error();
                if e.kind() != io::ErrorKind::Interrupted {
                    return Err(e);
                }
            }
        }
    }
    Ok(())
}

/// An idle connection's state past the `owed` bytes at the head of its socket `fd`, told
/// as a one-byte peek would be without them: `WouldBlock` when nothing else is there,
/// `Ok(0)` when the backend has closed it, `Ok(n)` when it wrote bytes no request asked
/// for. Two system calls (`poll` for the close, which the bytes in front would hide from a
/// peek, and `FIONREAD`), made only where a peek was made before.
pub(super) fn past(fd: RawFd, owed: usize) -> io::Result<usize> {
    if peer_closed(fd)? {
        return Ok(0);
    }
    let mut queued: libc::c_int = 0;
    // SAFETY: FIONREAD writes one c_int through the pointer, valid for it.
    if unsafe { libc::ioctl(fd, libc::FIONREAD, &mut queued) } < 0 {
        return Err(io::Error::last_os_error());
    }
    match usize::try_from(queued).unwrap_or(0) {
        q if q == owed => Err(io::ErrorKind::WouldBlock.into()),
        q => Ok(q.saturating_sub(owed).max(1)),
    }
}

/// Whether the peer of the stream socket `fd` has closed or shut down its side, whatever
/// bytes wait unread in front of that end (which a peek would report instead): one `poll`,
/// no wait.
pub fn peer_closed(fd: RawFd) -> io::Result<bool> {
    let mut probe = libc::pollfd {
        fd,
        events: libc::POLLRDHUP,
        revents: 0,
    };
    // SAFETY: one valid pollfd, no wait.
    if unsafe { libc::poll(&mut probe, 1, 0) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(probe.revents & (libc::POLLRDHUP | libc::POLLHUP | libc::POLLERR) != 0)
}

#[cfg(test)]
mod tests {
    use std::os::fd::AsRawFd;
    use std::os::unix::net::UnixStream as StdUnixStream;

    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    use super::super::QuietUnix;

    /// What `fd` has sent that its peer has not taken off the socket yet (`SIOCOUTQ`: on
    /// a Unix socket the memory its queued messages hold, not their bytes; 0 when none).
    fn unread(fd: &StdUnixStream) -> usize {
        let mut queued: libc::c_int = 0;
        // SAFETY: TIOCOUTQ writes one c_int through the pointer, valid for it.
        assert!(unsafe { libc::ioctl(fd.as_raw_fd(), libc::TIOCOUTQ, &mut queued) } >= 0);
        usize::try_from(queued).unwrap()
    }

    fn kept_pair() -> (QuietUnix, StdUnixStream) {
        let (ours, theirs) = StdUnixStream::pair().unwrap();
        let mut ours = QuietUnix::new(ours).unwrap();
        ours.leave_reads();
        (ours, theirs)
    }

    /// The answer a request got stays on the backend's socket until the next request is
    /// written, and is not read twice.
    #[tokio::test]
    async fn an_answer_comes_off_the_socket_after_the_next_request() {
        let (mut ours, mut theirs) = kept_pair();
        ours.write_all(b"request 1").await.unwrap();
        std::io::Write::write_all(&mut theirs, b"answer 1").unwrap();
        let one_answer = unread(&theirs);
        assert!(one_answer > 0);
        let mut got = [0u8; 64];
        let n = ours.read(&mut got).await.unwrap();
        assert_eq!(&got[..n], b"answer 1");
        assert_eq!(
            unread(&theirs),
            one_answer,
            "taken off at once: the backend was woken for it"
        );
        assert_eq!(ours.owed(), 8);

        let mut request = [0u8; 9];
        std::io::Read::read_exact(&mut theirs, &mut request).unwrap();
        ours.write_all(b"request 2").await.unwrap();
        std::io::Write::write_all(&mut theirs, b"answer 2").unwrap();
        let n = ours.read(&mut got).await.unwrap();
        assert_eq!(&got[..n], b"answer 2", "the first answer read again");
        assert_eq!(
            unread(&theirs),
            one_answer,
            "only the second answer is left"
        );
    }

    /// Without a write in between, reads take their bytes as reads always did; a
    /// connection that was not asked to leave them never does.
    #[tokio::test]
    async fn reads_past_the_span_or_on_other_streams_take_their_bytes() {
        let (mut ours, mut theirs) = kept_pair();
        ours.write_all(b"q").await.unwrap();
        let big = vec![5u8; super::PEEK_SPAN + 1000];
        let writer = std::thread::spawn(move || {
            std::io::Write::write_all(&mut theirs, &big).unwrap();
            theirs
        });
        let mut got = Vec::new();
        let mut buf = vec![0u8; 16 * 1024];
        while got.len() < super::PEEK_SPAN + 1000 {
            let n = ours.read(&mut buf).await.unwrap();
            assert!(n > 0);
            got.extend_from_slice(&buf[..n]);
        }
        assert!(got.iter().all(|&b| b == 5), "a byte read twice or lost");
        assert_eq!(got.len(), super::PEEK_SPAN + 1000);
        let theirs = writer.join().unwrap();
        assert_eq!(unread(&theirs), 0, "past the span, reads take their bytes");

        let (ours, mut theirs) = StdUnixStream::pair().unwrap();
        let mut ours = QuietUnix::new(ours).unwrap();
        ours.write_all(b"q").await.unwrap();
        std::io::Write::write_all(&mut theirs, b"answer").unwrap();
        let n = ours.read(&mut buf).await.unwrap();
        assert_eq!(n, 6);
        assert_eq!(unread(&theirs), 0);
    }

    /// An idle connection's check looks past the bytes left on it: quiet with only them,
    /// closed when the backend closed it behind them, talking when it wrote more.
    #[tokio::test]
    async fn the_idle_check_sees_past_the_left_bytes() {
        let idle = |ours: &QuietUnix| ours.peek_past_owed();
        for ending in ["quiet", "closed", "talking"] {
            let (mut ours, mut theirs) = kept_pair();
            ours.write_all(b"request").await.unwrap();
            std::io::Write::write_all(&mut theirs, b"answer").unwrap();
            let mut got = [0u8; 64];
            assert_eq!(ours.read(&mut got).await.unwrap(), 6);
            match ending {
                "quiet" => {
                    let e = idle(&ours).unwrap_err();
                    assert_eq!(e.kind(), std::io::ErrorKind::WouldBlock, "{ending}");
                }
                "closed" => {
                    drop(theirs);
                    assert_eq!(idle(&ours).unwrap(), 0, "{ending}");
                }
                _ => {
                    std::io::Write::write_all(&mut theirs, b"xy").unwrap();
                    assert_eq!(idle(&ours).unwrap(), 2, "{ending}");
                }
            }
        }
    }

    /// Dropped with bytes left on it, the connection takes them off first, so the backend
    /// reads the end of its connection, not a reset.
    #[tokio::test]
    async fn a_dropped_connection_ends_cleanly_for_the_backend() {
        let (mut ours, mut theirs) = kept_pair();
        ours.write_all(b"request").await.unwrap();
        let mut request = [0u8; 7];
        std::io::Read::read_exact(&mut theirs, &mut request).unwrap();
        std::io::Write::write_all(&mut theirs, b"answer").unwrap();
        let mut got = [0u8; 64];
        assert_eq!(ours.read(&mut got).await.unwrap(), 6);
        drop(ours);
        let mut rest = [0u8; 8];
        assert_eq!(
            std::io::Read::read(&mut theirs, &mut rest).unwrap(),
            0,
            "not ECONNRESET"
        );
    }

    /// A front connection whose first read peeks: the request stays on the front server's
    /// socket through the answer's write, is not read twice by a later read, and comes off
    /// before the close, so the front server reads the answer and then the end, not a reset.
    #[tokio::test]
    async fn a_front_request_stays_until_the_answer_is_out() {
        for later_read in [false, true] {
            let (ours, mut theirs) = StdUnixStream::pair().unwrap();
            let mut ours = QuietUnix::new(ours).unwrap();
            ours.leave_first_read();
            std::io::Write::write_all(&mut theirs, b"request").unwrap();
            let sent = unread(&theirs);
            assert!(sent > 0);
            let mut got = [0u8; 64];
            {
                let (mut reader, mut writer) = ours.split();
                assert_eq!(reader.read(&mut got).await.unwrap(), 7);
                assert_eq!(&got[..7], b"request");
                assert_eq!(unread(&theirs), sent, "taken off: the front server woken");
                writer.write_all(b"answer").await.unwrap();
                if later_read {
                    // A kept connection reads on: its next bytes, not the request again.
                    std::io::Write::write_all(&mut theirs, b"next").unwrap();
                    assert_eq!(reader.read(&mut got).await.unwrap(), 4);
                    assert_eq!(&got[..4], b"next", "{later_read}");
                    assert_eq!(unread(&theirs), 0, "read past, the request came off");
                }
            }
            assert_eq!(ours.owed(), if later_read { 0 } else { 7 });
            drop(ours);
            let mut answer = Vec::new();
            std::io::Read::read_to_end(&mut theirs, &mut answer).unwrap();
            assert_eq!(
                answer, b"answer",
                "the answer, then the end, not ECONNRESET"
            );
        }
    }
}
