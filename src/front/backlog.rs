//! The kernel's accept queue of each front listener, for status: connections the kernel has
//! completed that corral has not accepted yet, and the most it will hold (the listen backlog,
//! capped by `net.core.somaxconn`).
//!
//! Both numbers come from the kernel's sock_diag netlink interface (what `ss -l` reads), for
//! TCP and Unix listeners alike: a dump of the listening sockets of one family gives, for a
//! listening socket, the queue length and its maximum (`idiag_rqueue` and `idiag_wqueue` for
//! TCP, `UNIX_DIAG_RQLEN` for Unix), keyed by the socket's inode, which `fstat` on the
//! listener's descriptor gives. Unix sockets have no other way (`SIOCINQ` refuses a listening
//! one, and /proc/net/unix has no queue column), and for TCP the dump of listening sockets
//! costs the same whatever the number of connections on the host, unlike /proc/net/tcp. A
//! listener served by several threads with SO_REUSEPORT has one queue per thread; status
//! shows their sums.
//!
//! Listeners are registered as they start ([`Backlogs::add`]) and held weakly, so one a reload
//! removed drops out once its sockets are closed. Nothing here runs on the request path.

use std::collections::HashMap;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::sync::{Arc, Mutex, Weak};

use nix::sys::socket::{self, AddressFamily, MsgFlags, NetlinkAddr, SockFlag, SockType};

use crate::config::FrontProtocol;
use crate::front::listener::Listener;

/// The front listeners whose accept queues status reports.
#[derive(Debug, Default)]
pub struct Backlogs {
    entries: Mutex<Vec<Entry>>,
}

#[derive(Debug)]
struct Entry {
    address: String,
    protocol: &'static str,
    /// One per accept queue: its family, its inode, and what owns it (a front listener, or
    /// a direct pool's socket, `crate::pool::direct`), held weakly.
    sockets: Vec<(Family, u64, Weak<dyn std::any::Any + Send + Sync>)>,
}

/// A socket family with listeners corral may have.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Family {
    Inet,
    Inet6,
    Unix,
}

/// One front listener's accept queues, read now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Backlog {
    /// Where it listens (with the real port when it was configured as 0).
    pub address: String,
    /// `http`, `fastcgi` or `scgi`.
    pub protocol: &'static str,
    /// Its accept queues (one per serving thread for a TCP listener with SO_REUSEPORT).
    pub queues: usize,
    /// Connections waiting to be accepted, over every queue; `None` when the kernel could
    /// not be asked.
    pub queued: Option<u64>,
    /// The most the queues hold together.
    pub max: Option<u64>,
}

fn protocol_name(p: FrontProtocol) -> &'static str {
    match p {
        FrontProtocol::Http => "http",
        FrontProtocol::Fastcgi => "fastcgi",
        FrontProtocol::Scgi => "scgi",
    }
}

impl Backlogs {
    /// Registers a front listener served through `queues` (one listener per accept queue).
    /// A socket registered already (a listener restarted by a reload) moves to this entry.
    pub fn add(&self, protocol: FrontProtocol, queues: &[Arc<Listener>]) {
        let Some(first) = queues.first() else {
            return;
        };
        let address = first
            .local_address()
            .map_or_else(|e| format!("<unknown: {e}>"), |a| a.to_string());
        let sockets: Vec<(Family, u64, Weak<dyn std::any::Any + Send + Sync>)> = queues
            .iter()
            .filter_map(|l| {
                let (family, fd) = match &**l {
                    Listener::Tcp { listener, .. } => {
                        let family = match listener.local_addr() {
                            Ok(std::net::SocketAddr::V6(_)) => Family::Inet6,
                            _ => Family::Inet,
                        };
                        (family, listener.as_fd())
                    }
                    Listener::Unix { listener, .. } => (Family::Unix, listener.as_fd()),
                };
                let inode = nix::sys::stat::fstat(fd).ok()?.st_ino;
                let owner: Weak<dyn std::any::Any + Send + Sync> = Arc::downgrade(l) as Weak<_>;
                Some((family, inode, owner))
            })
            .collect();
        self.insert(address, protocol, sockets);
    }

    /// Registers a listener no runtime serves (a direct pool's socket, which its workers
    /// accept on), reported for as long as `owner` lives.
    pub fn add_parked(
        &self,
        protocol: FrontProtocol,
        parked: &crate::front::listener::Parked,
        owner: Weak<dyn std::any::Any + Send + Sync>,
    ) {
        use crate::front::listener::Parked;
        let address = parked
            .local_address()
            .map_or_else(|e| format!("<unknown: {e}>"), |a| a.to_string());
        let (family, fd) = match parked {
            Parked::Tcp { listeners, .. } => {
                let Some(first) = listeners.first() else {
                    return;
                };
                let family = match first.local_addr() {
                    Ok(std::net::SocketAddr::V6(_)) => Family::Inet6,
                    _ => Family::Inet,
                };
                (family, first.as_fd())
            }
            Parked::Unix { listener, .. } => (Family::Unix, listener.as_fd()),
        };
        let Ok(stat) = nix::sys::stat::fstat(fd) else {
            return;
        };
        self.insert(address, protocol, vec![(family, stat.st_ino, owner)]);
    }

    fn insert(
        &self,
        address: String,
        protocol: FrontProtocol,
        sockets: Vec<(Family, u64, Weak<dyn std::any::Any + Send + Sync>)>,
    ) {
        let mut entries = self.lock();
        for e in entries.iter_mut() {
            e.sockets
                .retain(|(_, inode, _)| !sockets.iter().any(|(_, i, _)| i == inode));
        }
        entries.retain(|e| !e.sockets.is_empty());
        entries.push(Entry {
            address,
            protocol: protocol_name(protocol),
            sockets,
        });
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<Entry>> {
        self.entries.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Every live listener's queues, from one sock_diag dump per family in use.
    pub fn read(&self) -> Vec<Backlog> {
        let mut entries = self.lock();
        for e in entries.iter_mut() {
            e.sockets.retain(|(_, _, l)| l.strong_count() > 0);
        }
        entries.retain(|e| !e.sockets.is_empty());
        let mut dumps: HashMap<Family, Option<Queues>> = HashMap::new();
        for e in entries.iter() {
            for (family, _, _) in &e.sockets {
                dumps
                    .entry(*family)
                    .or_insert_with(|| match listening(*family) {
                        Ok(map) => Some(map),
                        Err(err) => {
                            tracing::debug!(error = %err, ?family, "sock_diag dump failed");
                            None
                        }
                    });
            }
        }
        entries
            .iter()
            .map(|e| {
                let mut sum = Some((0u64, 0u64));
                for (family, inode, _) in &e.sockets {
                    let found = dumps
                        .get(family)
                        .and_then(Option::as_ref)
                        .and_then(|m| m.get(inode));
                    sum = match (sum, found) {
                        (Some((q, m)), Some((dq, dm))) => Some((q + dq, m + dm)),
                        _ => None,
                    };
                }
                Backlog {
                    address: e.address.clone(),
                    protocol: e.protocol,
                    queues: e.sockets.len(),
                    queued: sum.map(|(q, _)| q),
                    max: sum.map(|(_, m)| m),
                }
            })
            .collect()
    }
}

/// The listening sockets of one family: inode → (accept queue length, its maximum).
type Queues = HashMap<u64, (u64, u64)>;

/// `SOCK_DIAG_BY_FAMILY` (linux/sock_diag.h).
const SOCK_DIAG_BY_FAMILY: u16 = 20;
/// `NLM_F_REQUEST | NLM_F_DUMP` (linux/netlink.h).
const DUMP_REQUEST: u16 = 0x1 | 0x300;
/// `NLMSG_ERROR` and `NLMSG_DONE`.
const NLMSG_ERROR: u16 = 2;
const NLMSG_DONE: u16 = 3;
/// Bytes of a `struct nlmsghdr`.
const NLMSG_HDR_LEN: usize = 16;
/// `TCP_LISTEN`, the state of a listening socket of either family.
const TCP_LISTEN: u32 = 10;
/// `UDIAG_SHOW_RQLEN` and the `UNIX_DIAG_RQLEN` attribute it adds (linux/unix_diag.h).
const UDIAG_SHOW_RQLEN: u32 = 0x10;
const UNIX_DIAG_RQLEN: u16 = 4;
/// Bytes of `struct unix_diag_msg`, and where its inode is.
const UNIX_DIAG_MSG_LEN: usize = 16;
/// Bytes of `struct inet_diag_msg`, and where its queue, maximum and inode are.
const INET_DIAG_MSG_LEN: usize = 72;
const INET_RQUEUE_AT: usize = 56;
const INET_WQUEUE_AT: usize = 60;
const INET_INODE_AT: usize = 68;
/// A dump that has not ended after this many bytes is abandoned (a host has a few hundred
/// listening sockets at most; each is under 100 bytes).
const MAX_DUMP: usize = 4 << 20;

/// The listening sockets of `family`: inode → (accept queue length, its maximum).
fn listening(family: Family) -> std::io::Result<Queues> {
    let fd = socket::socket(
        AddressFamily::Netlink,
        SockType::Datagram,
        SockFlag::SOCK_CLOEXEC,
        socket::SockProtocol::NetlinkSockDiag,
    )?;
    // The kernel answers a dump at once; the timeout only bounds the unexpected.
    socket::setsockopt(
        &fd,
        socket::sockopt::ReceiveTimeout,
        &nix::sys::time::TimeVal::new(1, 0),
    )?;
    let mut req = Vec::with_capacity(NLMSG_HDR_LEN + 56);
    let body = request_body(family);
    let len = u32::try_from(NLMSG_HDR_LEN + body.len()).unwrap_or(u32::MAX);
    req.extend_from_slice(&len.to_ne_bytes());
    req.extend_from_slice(&SOCK_DIAG_BY_FAMILY.to_ne_bytes());
    req.extend_from_slice(&DUMP_REQUEST.to_ne_bytes());
    req.extend_from_slice(&1u32.to_ne_bytes()); // sequence number
    req.extend_from_slice(&0u32.to_ne_bytes()); // port id: the kernel assigns ours
    req.extend_from_slice(&body);
    socket::sendto(
        fd.as_raw_fd(),
        &req,
        &NetlinkAddr::new(0, 0),
        MsgFlags::empty(),
    )?;
    read_dump(&fd, family)
}

/// The request after the netlink header: `inet_diag_req_v2` for TCP over IPv4 or IPv6,
/// `unix_diag_req` for Unix, each asking for listening sockets only.
fn request_body(family: Family) -> Vec<u8> {
    let states = (1u32 << TCP_LISTEN).to_ne_bytes();
    match family {
        Family::Inet | Family::Inet6 => {
            let af = if family == Family::Inet {
                libc::AF_INET
            } else {
                libc::AF_INET6
            };
            let mut b = vec![0u8; 56];
            b[0] = u8::try_from(af).unwrap_or(0);
            b[1] = u8::try_from(libc::IPPROTO_TCP).unwrap_or(0);
            b[4..8].copy_from_slice(&states);
            b
        }
        Family::Unix => {
            let mut b = vec![0u8; 24];
            b[0] = u8::try_from(libc::AF_UNIX).unwrap_or(0);
            b[4..8].copy_from_slice(&states);
            b[12..16].copy_from_slice(&UDIAG_SHOW_RQLEN.to_ne_bytes());
            // No cookie to check: INET_DIAG_NOCOOKIE.
            b[16..24].fill(0xff);
            b
        }
    }
}

fn read_dump(fd: &OwnedFd, family: Family) -> std::io::Result<Queues> {
    let mut out = HashMap::new();
    let mut buf = vec![0u8; 64 * 1024];
    let mut total = 0usize;
    loop {
        let n = socket::recv(fd.as_raw_fd(), &mut buf, MsgFlags::empty())?;
        if n == 0 {
            return Ok(out);
        }
        total += n;
        if total > MAX_DUMP {
            return Err(std::io::Error::other("the sock_diag dump did not end"));
        }
        let mut msgs = buf.get(..n).unwrap_or_default();
        while msgs.len() >= NLMSG_HDR_LEN {
            let len = u32_at(msgs, 0).unwrap_or(0) as usize;
            let kind = u16_at(msgs, 4).unwrap_or(0);
            if len < NLMSG_HDR_LEN || len > msgs.len() {
                return Err(std::io::Error::other(format!(
                    "a sock_diag message says it has {len} bytes of {}",
                    msgs.len()
                )));
            }
            let payload = msgs.get(NLMSG_HDR_LEN..len).unwrap_or_default();
            match kind {
                NLMSG_DONE => return Ok(out),
                NLMSG_ERROR => {
                    let errno = u32_at(payload, 0).map_or(0, |e| e as i32);
                    return Err(std::io::Error::from_raw_os_error(-errno));
                }
                SOCK_DIAG_BY_FAMILY => {
                    if let Some((inode, queue)) = parse(payload, family) {
                        out.insert(inode, queue);
                    }
                }
                _ => {}
            }
            let next = len.saturating_add(3) & !3;
            msgs = msgs.get(next..).unwrap_or_default();
        }
    }
}

/// One socket of a dump: its inode, accept queue length and maximum.
fn parse(msg: &[u8], family: Family) -> Option<(u64, (u64, u64))> {
    match family {
        Family::Inet | Family::Inet6 => {
            if msg.len() < INET_DIAG_MSG_LEN {
                return None;
            }
            let queue = u64::from(u32_at(msg, INET_RQUEUE_AT)?);
            let max = u64::from(u32_at(msg, INET_WQUEUE_AT)?);
            Some((u64::from(u32_at(msg, INET_INODE_AT)?), (queue, max)))
        }
        Family::Unix => {
            let inode = u64::from(u32_at(msg, 4)?);
            let mut attrs = msg.get(UNIX_DIAG_MSG_LEN..)?;
            while attrs.len() >= 4 {
                let len = usize::from(u16_at(attrs, 0)?);
                let kind = u16_at(attrs, 2)?;
                if len < 4 || len > attrs.len() {
                    return None;
                }
                if kind == UNIX_DIAG_RQLEN && len >= 12 {
                    let queue = u64::from(u32_at(attrs, 4)?);
                    let max = u64::from(u32_at(attrs, 8)?);
                    return Some((inode, (queue, max)));
                }
                attrs = attrs.get((len + 3) & !3..).unwrap_or_default();
            }
            None
        }
    }
}

fn u32_at(b: &[u8], at: usize) -> Option<u32> {
    let bytes: [u8; 4] = b.get(at..at + 4)?.try_into().ok()?;
    Some(u32::from_ne_bytes(bytes))
}

fn u16_at(b: &[u8], at: usize) -> Option<u16> {
    let bytes: [u8; 2] = b.get(at..at + 2)?.try_into().ok()?;
    Some(u16::from_ne_bytes(bytes))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{Bind, UnixPermissions};

    /// Connections nobody accepts are counted on the listener they wait on, TCP and Unix.
    #[tokio::test]
    async fn unaccepted_connections_are_counted_per_listener() {
        let dir = tempfile::tempdir().unwrap();
        let tcp = Arc::new(
            Listener::bind(
                &Bind::Tcp {
                    addr: "127.0.0.1:0".parse().unwrap(),
                    allow: Vec::new(),
                },
                16,
            )
            .unwrap(),
        );
        let path = dir.path().join("front.sock");
        let unix = Arc::new(
            Listener::bind(
                &Bind::Unix {
                    path: path.clone(),
                    perms: UnixPermissions {
                        mode: 0o600,
                        owner: None,
                        group: None,
                    },
                },
                8,
            )
            .unwrap(),
        );
        let backlogs = Backlogs::default();
        backlogs.add(FrontProtocol::Http, &[Arc::clone(&tcp)]);
        backlogs.add(FrontProtocol::Fastcgi, &[Arc::clone(&unix)]);
        let before = backlogs.read();
        assert_eq!(before.len(), 2, "{before:?}");
        assert_eq!(before[0].queued, Some(0), "{before:?}");
        assert_eq!(before[0].max, Some(16), "{before:?}");
        assert_eq!(before[1].queued, Some(0), "{before:?}");
        assert_eq!(before[1].max, Some(8), "{before:?}");
        let addr = match &*tcp {
            Listener::Tcp { listener, .. } => listener.local_addr().unwrap(),
            Listener::Unix { .. } => unreachable!(),
        };
        let _held: Vec<std::net::TcpStream> = (0..3)
            .map(|_| std::net::TcpStream::connect(addr).unwrap())
            .collect();
        let _held_unix: Vec<std::os::unix::net::UnixStream> = (0..2)
            .map(|_| std::os::unix::net::UnixStream::connect(&path).unwrap())
            .collect();
        let after = backlogs.read();
        assert_eq!(after[0].queued, Some(3), "{after:?}");
        assert_eq!(after[1].queued, Some(2), "{after:?}");
        assert_eq!(after[0].protocol, "http");
        // A listener that is gone drops out.
        drop(unix);
        assert_eq!(backlogs.read().len(), 1);
        // One started again on the same socket (a reload changed its settings) is listed
        // once, as it is now.
        backlogs.add(FrontProtocol::Scgi, &[Arc::clone(&tcp)]);
        let again = backlogs.read();
        assert_eq!(again.len(), 1, "{again:?}");
        assert_eq!(again[0].protocol, "scgi");
    }
}
