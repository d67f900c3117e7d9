//! What corral says to, and takes from, systemd (or anything speaking its protocols):
//!
//! - **Readiness** (`Type=notify`): datagrams to the socket named by `NOTIFY_SOCKET`:
//!   `READY=1` once the listeners are bound and every pool has its `min` workers ready,
//!   `STATUS=...` with live counts while serving, `STOPPING=1` when a stop begins, and
//!   `WATCHDOG=1` at half the interval `WATCHDOG_USEC` asks for. Without `NOTIFY_SOCKET`
//!   nothing is sent. Every message is best effort: a supervisor that went away never stops
//!   corral.
//! - **Socket activation**: listening sockets handed over as descriptors 3.. with
//!   `LISTEN_FDS` (and `LISTEN_PID` naming this process). Each is matched to the `[[listen]]`
//!   block with the same address and used instead of binding; one that matches nothing is
//!   reported and left alone.

use std::io;
use std::os::fd::{FromRawFd, RawFd};
use std::os::unix::net::UnixDatagram;
use std::path::PathBuf;
use std::time::Duration;

/// The first descriptor of a socket-activation handoff (`SD_LISTEN_FDS_START`).
const LISTEN_FDS_START: RawFd = 3;
/// Most descriptors taken from `LISTEN_FDS`: far more than any configuration has listeners.
const LISTEN_FDS_MAX: RawFd = 256;

/// Where notifications go: the socket `NOTIFY_SOCKET` names, if any.
#[derive(Debug)]
pub struct Notifier {
    target: Option<(UnixDatagram, Target)>,
}

#[derive(Debug, Clone)]
enum Target {
    Path(PathBuf),
    Abstract(Vec<u8>),
}

impl Notifier {
    /// From `NOTIFY_SOCKET` (a path, or `@name` for an abstract socket); a notifier that
    /// sends nothing when it is unset or unusable.
    pub fn from_env() -> Notifier {
        let Some(value) = std::env::var_os("NOTIFY_SOCKET") else {
            return Notifier { target: None };
        };
        let bytes = std::os::unix::ffi::OsStrExt::as_bytes(value.as_os_str()).to_vec();
        let target = match bytes.split_first() {
            Some((b'@', name)) => Target::Abstract(name.to_vec()),
            Some((b'/', _)) => Target::Path(PathBuf::from(value)),
            _ => {
                tracing::warn!(value = ?value, "NOTIFY_SOCKET is neither a path nor @name; not notifying");
                return Notifier { target: None };
            }
        };
        match UnixDatagram::unbound() {
            Ok(socket) => Notifier {
                target: Some((socket, target)),
            },
            Err(e) => {
                tracing::warn!(error = %e, "cannot make a socket for NOTIFY_SOCKET; not notifying");
                Notifier { target: None }
            }
        }
    }

    /// Whether anything listens for notifications.
    pub fn is_active(&self) -> bool {
        self.target.is_some()
    }

    /// Sends `message` (`KEY=value` lines); failures are logged at debug only.
    pub fn notify(&self, message: &str) {
        let Some((socket, target)) = &self.target else {
            return;
        };
        let sent = match target {
            Target::Path(path) => socket.send_to(message.as_bytes(), path),
            Target::Abstract(name) => {
                use std::os::linux::net::SocketAddrExt;
                std::os::unix::net::SocketAddr::from_abstract_name(name)
                    .and_then(|addr| socket.send_to_addr(message.as_bytes(), &addr))
            }
        };
        if let Err(e) = sent {
            tracing::debug!(error = %e, "a systemd notification was not delivered");
        }
    }

    /// How often to send `WATCHDOG=1`: half of `WATCHDOG_USEC`, when it is set for this
    /// process (`WATCHDOG_PID` unset or ours).
    pub fn watchdog_interval(&self) -> Option<Duration> {
        self.target.as_ref()?;
        if let Some(pid) = std::env::var_os("WATCHDOG_PID") {
            if pid.to_str()?.parse::<u32>().ok()? != std::process::id() {
                return None;
            }
        }
        let usec: u64 = std::env::var("WATCHDOG_USEC").ok()?.parse().ok()?;
        (usec > 0).then(|| Duration::from_micros(usec / 2))
    }
}

/// One listening socket handed over by socket activation.
#[derive(Debug)]
pub enum Inherited {
    /// A TCP listener.
    Tcp(std::net::TcpListener),
    /// A Unix stream listener.
    Unix(std::os::unix::net::UnixListener),
}

impl Inherited {
    /// Its address as a `[[listen]]` block would name it.
    pub fn address(&self) -> io::Result<crate::config::ListenAddress> {
        match self {
            Inherited::Tcp(l) => Ok(crate::config::ListenAddress::Tcp(l.local_addr()?)),
            Inherited::Unix(l) => l
                .local_addr()?
                .as_pathname()
                .map(|p| crate::config::ListenAddress::Unix(p.to_path_buf()))
                .ok_or_else(|| io::Error::other("an unnamed or abstract Unix socket")),
        }
    }
}

/// `CLOCK_MONOTONIC` now in microseconds, for `MONOTONIC_USEC=` beside `RELOADING=1` (systemd
/// uses it to tell this reload from an earlier one); 0 if the clock cannot be read.
pub fn monotonic_usec() -> u64 {
    nix::time::clock_gettime(nix::time::ClockId::CLOCK_MONOTONIC).map_or(0, |t| {
        let secs = u64::try_from(t.tv_sec()).unwrap_or(0);
        let micros = u64::try_from(t.tv_nsec()).unwrap_or(0) / 1_000;
        secs.saturating_mul(1_000_000).saturating_add(micros)
    })
}

/// The listening sockets passed with `LISTEN_FDS` to this process (`LISTEN_PID` must name
/// it); empty when there are none. Call it once, before anything else opens descriptors.
pub fn listen_fds() -> Vec<Inherited> {
    let ours = std::env::var("LISTEN_PID")
        .ok()
        .and_then(|p| p.parse::<u32>().ok())
        .is_some_and(|p| p == std::process::id());
    let count = std::env::var("LISTEN_FDS")
        .ok()
        .and_then(|n| n.parse::<RawFd>().ok())
        .unwrap_or(0);
    if !ours || count <= 0 {
        return Vec::new();
    }
    let mut out = Vec::new();
    for fd in LISTEN_FDS_START..LISTEN_FDS_START + count.min(LISTEN_FDS_MAX) {
        match classify(fd) {
            Ok(Some(kind)) => out.push(kind),
            Ok(None) => tracing::warn!(
                fd,
                "an inherited descriptor is not a listening stream socket; left alone"
            ),
            Err(e) => tracing::warn!(fd, error = %e, "cannot use an inherited descriptor"),
        }
    }
    out
}

/// What kind of listening socket `fd` is, taking ownership of it when it is one.
fn classify(fd: RawFd) -> io::Result<Option<Inherited>> {
    use nix::sys::socket::{
        getsockname, getsockopt, sockopt, AddressFamily, SockaddrLike, SockaddrStorage,
    };
    // SAFETY: `fd` is a descriptor of the socket-activation range that nothing else in this
    // process refers to; it is only borrowed here for two queries.
    let borrowed = unsafe { std::os::fd::BorrowedFd::borrow_raw(fd) };
    let listening = getsockopt(&borrowed, sockopt::AcceptConn).map_err(io::Error::from)?;
    let stream = getsockopt(&borrowed, sockopt::SockType).map_err(io::Error::from)?
        == nix::sys::socket::SockType::Stream;
    if !listening || !stream {
        return Ok(None);
    }
    let family = getsockname::<SockaddrStorage>(fd)
        .map_err(io::Error::from)?
        .family();
    Ok(match family {
        // SAFETY: the descriptor is a listening stream socket of this family, handed to this
        // process to own; it is wrapped once and never closed elsewhere.
        Some(AddressFamily::Inet | AddressFamily::Inet6) => Some(Inherited::Tcp(unsafe {
            std::net::TcpListener::from_raw_fd(fd)
        })),
        // SAFETY: as above, for a Unix stream listener.
        Some(AddressFamily::Unix) => Some(Inherited::Unix(unsafe {
            std::os::unix::net::UnixListener::from_raw_fd(fd)
        })),
        _ => None,
    })
}
