//! corral's side of preload and fork (ARCHITECTURE.md, "Preload and fork"): the control socket
//! to a pool's preloader, the messages on it, and the pidfd through which corral sees a forked
//! worker end although it is not that worker's parent.
//!
//! The control socket is a `SOCK_SEQPACKET` pair, so every message is one datagram and needs
//! no framing. corral sends `fork KEY` with the worker's listening socket attached by
//! SCM_RIGHTS; the preloader sends `ready PID` once the app is loaded, `forked KEY PID` after
//! each fork, and `exited PID code N` / `exited PID signal N` when it reaps a worker. What the
//! preloader sends is peer bytes: [`parse`] checks length, words and numbers and answers a
//! [`ControlError`], never a panic; descriptors it might attach are dropped by the kernel,
//! since corral passes no room for them.

use std::io::{self, IoSlice, IoSliceMut};
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd};

use nix::fcntl::{fcntl, FcntlArg, OFlag};
use nix::sys::socket::{
    recvmsg, sendmsg, socketpair, AddressFamily, ControlMessage, MsgFlags, SockFlag, SockType,
    UnixAddr,
};
use tokio::io::unix::AsyncFd;

use super::ExitKind;

/// Longest message either side sends; a longer one from the preloader is malformed.
pub const MAX_MESSAGE: usize = 256;

/// The signal that makes a worker read its control socket for `promote` (docs/pools.md,
/// "Reforking"). SIGURG, because its default action is to be ignored: a worker with no
/// handler for it (a native worker, an app started without reforking) is not harmed, and
/// the TERM/INT/QUIT/USR1/USR2 family already means something to workers and apps.
pub const PROMOTE_SIGNAL: nix::sys::signal::Signal = nix::sys::signal::Signal::SIGURG;

/// Sends [`PROMOTE_SIGNAL`] to the worker `pid` alone (not its group).
pub fn signal_promote(pid: u32) -> io::Result<()> {
    let pid = i32::try_from(pid)
        .ok()
        .filter(|&p| p > 1)
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "not a worker's pid"))?;
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), PROMOTE_SIGNAL).map_err(io::Error::from)
}

/// What a preloader says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Message {
    /// The app is loaded; workers can be forked. The pid is the preloader's own.
    Ready {
        /// The preloader's pid as it sees itself.
        pid: u32,
    },
    /// The worker asked for under `key` runs as `pid`.
    Forked {
        /// The key corral sent with `fork`.
        key: u64,
        /// The forked worker's pid.
        pid: u32,
    },
    /// The preloader reaped the worker `pid`.
    Exited {
        /// The worker's pid.
        pid: u32,
        /// How it ended.
        exit: ExitKind,
    },
}

/// Why the control socket cannot be used any more.
#[derive(Debug, thiserror::Error)]
pub enum ControlError {
    /// The preloader closed its end.
    #[error("the preloader closed the control socket")]
    Closed,
    /// It sent something that is not one of the messages.
    #[error("the preloader sent a malformed control message ({len} bytes{truncated})", truncated = if *.truncated { ", truncated" } else { "" })]
    Malformed {
        /// How many bytes arrived.
        len: usize,
        /// Whether it was longer than [`MAX_MESSAGE`].
        truncated: bool,
    },
    /// Reading or writing failed.
    #[error("control socket: {0}")]
    Io(#[from] io::Error),
}

/// A connected pair for one preloader: corral's end (non-blocking), and the end that
/// becomes the preloader's fd 0 (blocking: O_NONBLOCK belongs to the open file, which the
/// child's fd 0 shares, and a launcher may read it with plain blocking calls). Both
/// close-on-exec (fd 0 is a fresh `dup2` in the child, which has no such flag).
pub fn control_pair() -> io::Result<(OwnedFd, OwnedFd)> {
    let (ours, theirs) = socketpair(
        AddressFamily::Unix,
        SockType::SeqPacket,
        None,
        SockFlag::SOCK_CLOEXEC,
    )?;
    let flags = OFlag::from_bits_retain(fcntl(&ours, FcntlArg::F_GETFL)?);
    fcntl(&ours, FcntlArg::F_SETFL(flags | OFlag::O_NONBLOCK))?;
    Ok((ours, theirs))
}

/// corral's end of a preloader's control socket.
#[derive(Debug)]
pub struct Control {
    fd: AsyncFd<OwnedFd>,
}

impl Control {
    /// Wraps corral's end of [`control_pair`] (must be called inside a tokio runtime).
    pub fn new(fd: OwnedFd) -> io::Result<Control> {
        Ok(Control { fd: register(fd)? })
    }

    /// Asks for a worker under `key` serving `listener`, and, for a pool that reforks,
    /// holding `channel`: the worker's own end of a control socket, through which it may
    /// later be promoted to be the template (docs/pools.md, "Reforking"). The message is a
    /// few bytes on a socket that carries nothing else from this side, so a full buffer
    /// means the preloader stopped reading: an error, not a wait.
    pub fn send_fork(
        &self,
        key: u64,
        listener: &OwnedFd,
        channel: Option<&OwnedFd>,
    ) -> io::Result<()> {
        let text = format!("fork {key}");
        let mut fds = vec![listener.as_raw_fd()];
        fds.extend(channel.map(AsRawFd::as_raw_fd));
        self.send(&text, &fds)
    }

    /// Tells a worker, on the control socket it got at its fork, to become the template
    /// once it is idle (corral signals it after this: `PROMOTE_SIGNAL`).
    pub fn send_promote(&self) -> io::Result<()> {
        self.send("promote", &[])
    }

    fn send(&self, text: &str, fds: &[std::os::fd::RawFd]) -> io::Result<()> {
        let cmsg = [ControlMessage::ScmRights(fds)];
        let cmsg = if fds.is_empty() { &[][..] } else { &cmsg[..] };
        let sent = sendmsg::<UnixAddr>(
            self.fd.get_ref().as_raw_fd(),
            &[IoSlice::new(text.as_bytes())],
            cmsg,
            MsgFlags::MSG_DONTWAIT | MsgFlags::MSG_NOSIGNAL,
            None,
        )?;
        if sent != text.len() {
            return Err(io::Error::other("the control message was cut short"));
        }
        Ok(())
    }

    /// The next message from the preloader.
    pub async fn recv(&self) -> Result<Message, ControlError> {
        let mut buf = [0u8; MAX_MESSAGE];
        loop {
            let mut guard = self.fd.readable().await?;
            let got = guard.try_io(|fd| {
                let mut iov = [IoSliceMut::new(&mut buf)];
                let msg = recvmsg::<()>(
                    fd.get_ref().as_fd().as_raw_fd(),
                    &mut iov,
                    None,
                    MsgFlags::MSG_DONTWAIT | MsgFlags::MSG_CMSG_CLOEXEC,
                )
                .map_err(io::Error::from)?;
                Ok((msg.bytes, msg.flags.contains(MsgFlags::MSG_TRUNC)))
            });
            match got {
                Ok(Ok((0, _))) => return Err(ControlError::Closed),
                Ok(Ok((len, true))) => {
                    return Err(ControlError::Malformed {
                        len,
                        truncated: true,
                    })
                }
                Ok(Ok((len, false))) => return parse(buf.get(..len).unwrap_or_default()),
                Ok(Err(e)) => return Err(ControlError::Io(e)),
                // Spurious readiness: wait again.
                Err(_would_block) => continue,
            }
        }
    }
}

/// Parses one message from a preloader.
pub fn parse(bytes: &[u8]) -> Result<Message, ControlError> {
    let malformed = || ControlError::Malformed {
        len: bytes.len(),
        truncated: false,
    };
    let text = std::str::from_utf8(bytes).map_err(|_| malformed())?;
    let words: Vec<&str> = text.split(' ').collect();
    let pid = |w: &str| {
        w.parse::<u32>()
            .ok()
            .filter(|&p| p > 1 && i32::try_from(p).is_ok())
            .ok_or_else(malformed)
    };
    let number = |w: &str| w.parse::<i32>().map_err(|_| malformed());
    match words.as_slice() {
        ["ready", p] => Ok(Message::Ready { pid: pid(p)? }),
        ["forked", key, p] => Ok(Message::Forked {
            key: key.parse().map_err(|_| malformed())?,
            pid: pid(p)?,
        }),
        ["exited", p, "code", n] => Ok(Message::Exited {
            pid: pid(p)?,
            exit: ExitKind::Code(number(n)?),
        }),
        ["exited", p, "signal", n] => Ok(Message::Exited {
            pid: pid(p)?,
            exit: ExitKind::Signal(number(n)?),
        }),
        _ => Err(malformed()),
    }
}

/// A pidfd for a process corral did not fork: readable once that process has ended.
#[derive(Debug)]
pub struct PidFd {
    fd: AsyncFd<OwnedFd>,
}

impl PidFd {
    /// Opens a pidfd for `pid` (Linux 5.3 or later). `ESRCH` means it is gone already.
    pub fn open(pid: u32) -> io::Result<PidFd> {
        let pid = libc::pid_t::try_from(pid)
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "pid out of range"))?;
        // SAFETY: pidfd_open takes a pid and flags by value and returns a new descriptor
        // or -1; no memory is shared with the kernel.
        let ret = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
        if ret < 0 {
            return Err(io::Error::last_os_error());
        }
        let raw = i32::try_from(ret).map_err(|_| io::Error::other("pidfd out of range"))?;
        // SAFETY: `raw` is a descriptor the kernel just returned to this process and
        // nothing else owns it.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        Ok(PidFd { fd: register(fd)? })
    }

    /// Returns once the process has ended (it may not be reaped yet: its parent does that).
    pub async fn exited(&self) {
        // A pidfd turns readable at the exit and stays so; an error means it cannot be
        // watched, which is treated as gone rather than waited on forever.
        let _ = self.fd.readable().await;
    }
}

/// Registers an owned descriptor with tokio's reactor.
fn register(fd: OwnedFd) -> io::Result<AsyncFd<OwnedFd>> {
    // SAFETY: an `OwnedFd` is a valid open descriptor that stays open, and names the same
    // description, until it is dropped, which happens only with the `AsyncFd` holding it.
    unsafe { AsyncFd::register(fd) }.map_err(|e| e.into_parts().1)
}

/// The parent pid of `pid` from `/proc/PID/stat`: a pid a preloader names is believed only
/// when the preloader is its parent.
pub fn parent_of(pid: u32) -> io::Result<u32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    // "PID (COMM) STATE PPID ...": COMM may hold spaces and parentheses, so split after
    // the last ')'.
    let bad = || io::Error::new(io::ErrorKind::InvalidData, "unexpected /proc stat format");
    let rest = stat.rsplit_once(')').ok_or_else(bad)?.1;
    let mut fields = rest.split_ascii_whitespace();
    let _state = fields.next().ok_or_else(bad)?;
    fields.next().ok_or_else(bad)?.parse().map_err(|_| bad())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_parse_and_bad_ones_are_errors() {
        assert_eq!(parse(b"ready 42").unwrap(), Message::Ready { pid: 42 });
        assert_eq!(
            parse(b"forked 7 4242").unwrap(),
            Message::Forked { key: 7, pid: 4242 }
        );
        assert_eq!(
            parse(b"exited 4242 code 3").unwrap(),
            Message::Exited {
                pid: 4242,
                exit: ExitKind::Code(3)
            }
        );
        assert_eq!(
            parse(b"exited 4242 signal 9").unwrap(),
            Message::Exited {
                pid: 4242,
                exit: ExitKind::Signal(9)
            }
        );
        for bad in [
            &b""[..],
            b"ready",
            b"ready 0",
            b"ready 1",
            b"ready -5",
            b"ready 4294967295",
            b"ready 42 ",
            b"forked x 42",
            b"forked 7",
            b"exited 42 code",
            b"exited 42 coredump 1",
            b"\xff\xfe",
            b"fork 7",
        ] {
            assert!(
                matches!(parse(bad), Err(ControlError::Malformed { .. })),
                "{bad:?}"
            );
        }
    }

    #[tokio::test]
    async fn a_fork_request_carries_the_socket_and_replies_are_read() {
        let (ours, theirs) = control_pair().unwrap();
        let blocking = |fd: &OwnedFd| {
            !OFlag::from_bits_retain(fcntl(fd, FcntlArg::F_GETFL).unwrap())
                .contains(OFlag::O_NONBLOCK)
        };
        assert!(!blocking(&ours) && blocking(&theirs));
        let control = Control::new(ours).unwrap();
        let listener = std::os::unix::net::UnixListener::bind(
            tempfile::tempdir().unwrap().path().join("w.sock"),
        )
        .unwrap();
        control
            .send_fork(3, &OwnedFd::from(listener), None)
            .unwrap();
        // The other side as a preloader would read it.
        let mut buf = [0u8; 64];
        let mut space = nix::cmsg_space!([std::os::fd::RawFd; 2]);
        let mut iov = [IoSliceMut::new(&mut buf)];
        let msg = recvmsg::<()>(
            theirs.as_raw_fd(),
            &mut iov,
            Some(&mut space),
            MsgFlags::empty(),
        )
        .unwrap();
        let fds: Vec<_> = msg
            .cmsgs()
            .unwrap()
            .filter_map(|c| match c {
                nix::sys::socket::ControlMessageOwned::ScmRights(fds) => Some(fds),
                _ => None,
            })
            .flatten()
            .collect();
        assert_eq!(fds.len(), 1);
        let n = msg.bytes;
        assert_eq!(&buf[..n], b"fork 3");
        for fd in fds {
            // SAFETY: received just now, owned by nobody else.
            drop(unsafe { OwnedFd::from_raw_fd(fd) });
        }
        // Replies, a malformed one, an oversized one, then the close.
        for reply in [&b"ready 77"[..], b"bogus", &[b'x'; 300]] {
            nix::sys::socket::send(theirs.as_raw_fd(), reply, MsgFlags::empty()).unwrap();
        }
        assert_eq!(control.recv().await.unwrap(), Message::Ready { pid: 77 });
        assert!(matches!(
            control.recv().await,
            Err(ControlError::Malformed {
                truncated: false,
                ..
            })
        ));
        assert!(matches!(
            control.recv().await,
            Err(ControlError::Malformed {
                truncated: true,
                ..
            })
        ));
        drop(theirs);
        assert!(matches!(control.recv().await, Err(ControlError::Closed)));
    }

    #[tokio::test]
    async fn a_pidfd_sees_a_process_end() {
        let mut child = tokio::process::Command::new("sleep")
            .arg("0.1")
            .spawn()
            .unwrap();
        let pid = child.id().unwrap();
        assert_eq!(parent_of(pid).unwrap(), std::process::id());
        let fd = PidFd::open(pid).unwrap();
        tokio::time::timeout(std::time::Duration::from_secs(5), fd.exited())
            .await
            .unwrap();
        child.wait().await.unwrap();
    }
}
