//! Front listeners: binding TCP and Unix sockets, applying a Unix socket's mode and owner, and
//! refusing TCP clients outside the allow-list.
//!
//! Binding is done by the caller of `app::run` (tests bind port 0), so this module offers
//! `bind` for the command line and `accept` for the serving loop. A Unix socket path left over
//! from an earlier run is removed only if nothing answers on it; a live socket is an error, so
//! two corral instances never steal each other's listener.

use std::io;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use tokio::net::{TcpListener, TcpSocket};
use tokio::time::Instant;

use crate::config::{Bind, Cidr, ListenAddress, UnixPermissions};
use crate::logs::{LineLimit, Verdict};
use crate::net::{QuietListener, Stream};

/// A bound front listener.
#[derive(Debug)]
pub enum Listener {
    /// TCP, with the client networks it accepts (empty = all).
    Tcp {
        /// The socket.
        listener: TcpListener,
        /// Allowed client networks; empty allows every client.
        allow: Vec<Cidr>,
    },
    /// Unix; the path is removed when the listener is dropped, unless it was inherited.
    Unix {
        /// The socket; what it accepts is registered for reads only.
        listener: QuietListener,
        /// Its path.
        path: PathBuf,
        /// Removes the socket file when dropped, if corral made it; an inherited socket's
        /// file belongs to whoever bound it (systemd keeps it across corral's restarts), and
        /// a serving thread's copy leaves it to the original.
        file: SocketFile,
    },
}

/// A Unix socket's file, removed when this is dropped if corral made it.
#[derive(Debug)]
pub struct SocketFile(Option<PathBuf>);

impl SocketFile {
    fn owned(path: &Path) -> SocketFile {
        SocketFile(Some(path.to_path_buf()))
    }

    fn not_owned() -> SocketFile {
        SocketFile(None)
    }
}

impl Drop for SocketFile {
    fn drop(&mut self) {
        if let Some(path) = &self.0 {
            let _ = std::fs::remove_file(path);
        }
    }
}

/// A bound listener taken out of every runtime (per-thread serving, `crate::shards`): it
/// keeps the socket (and, for Unix, the file's removal) while each serving thread accepts on
/// a duplicate registered with its own runtime ([`Parked::register`]). Not registered
/// anywhere itself, so no thread is woken for it when a client connects.
#[derive(Debug)]
pub enum Parked {
    /// TCP, with its allow-list.
    Tcp {
        /// The sockets: one per serving thread when they share the port by SO_REUSEPORT
        /// (the kernel spreads connections over their queues), else the one socket.
        listeners: Vec<std::net::TcpListener>,
        /// Allowed client networks; empty allows every client.
        allow: Vec<Cidr>,
    },
    /// Unix.
    Unix {
        /// The socket.
        listener: std::os::unix::net::UnixListener,
        /// Its path.
        path: PathBuf,
        /// As [`Listener::Unix`]'s.
        file: SocketFile,
    },
}

impl Parked {
    /// How many accept queues the listener has: one per serving thread for a TCP listener
    /// bound with SO_REUSEPORT, else one.
    pub fn queues(&self) -> usize {
        match self {
            Parked::Tcp { listeners, .. } => listeners.len(),
            Parked::Unix { .. } => 1,
        }
    }

    /// Queue `queue` (below [`Parked::queues`]) as a listener of the runtime the caller runs
    /// in: a duplicate of its socket. Must be called inside a runtime.
    pub fn register(&self, queue: usize) -> io::Result<Listener> {
        match self {
            Parked::Tcp { listeners, allow } => {
                let socket = listeners
                    .get(queue)
                    .ok_or_else(|| io::Error::other(format!("no accept queue {queue}")))?;
                Ok(Listener::Tcp {
                    listener: TcpListener::from_std(socket.try_clone()?)?,
                    allow: allow.clone(),
                })
            }
            Parked::Unix { listener, path, .. } => Ok(Listener::Unix {
                listener: QuietListener::from_std(listener.try_clone()?)?,
                path: path.clone(),
                file: SocketFile::not_owned(),
            }),
        }
    }

    /// As [`Listener::local_address`].
    pub fn local_address(&self) -> io::Result<ListenAddress> {
        match self {
            Parked::Tcp { listeners, .. } => Ok(ListenAddress::Tcp(listeners[0].local_addr()?)),
            Parked::Unix { path, .. } => Ok(ListenAddress::Unix(path.clone())),
        }
    }
}

/// The client's address as a front listener sees it, for REMOTE_ADDR and REMOTE_PORT.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Peer {
    /// A TCP client.
    Tcp(SocketAddr),
    /// A Unix client (a front server on this host).
    Unix,
}

impl Listener {
    /// Binds a configured listener with its backlog. Unix sockets get their mode and
    /// owner; TCP sockets keep their allow-list.
    pub fn bind(bind: &Bind, backlog: u32) -> io::Result<Listener> {
        Listener::bind_with(bind, backlog, false)
    }

    /// As [`Listener::bind`]; `reuse_port` binds a TCP socket with SO_REUSEPORT, so that
    /// [`Listener::park`] can give each serving thread a socket of its own on the same port.
    /// The port must still be free: another process listening there (even one with
    /// SO_REUSEPORT, which would otherwise share it silently) is an error, as without it.
    pub fn bind_with(bind: &Bind, backlog: u32, reuse_port: bool) -> io::Result<Listener> {
        match bind {
            Bind::Tcp { addr: a, allow } => {
                let socket = match a {
                    SocketAddr::V4(_) => TcpSocket::new_v4()?,
                    SocketAddr::V6(_) => TcpSocket::new_v6()?,
                };
                socket.set_reuseaddr(true)?;
                if reuse_port {
                    if a.port() != 0 {
                        // A plain bind fails on a port anyone holds, SO_REUSEPORT or not.
                        let probe = match a {
                            SocketAddr::V4(_) => TcpSocket::new_v4()?,
                            SocketAddr::V6(_) => TcpSocket::new_v6()?,
                        };
                        probe.set_reuseaddr(true)?;
                        probe.bind(*a)?;
                    }
                    socket.set_reuseport(true)?;
                }
                socket.bind(*a)?;
                socket.set_nodelay(true)?;
                Ok(Listener::Tcp {
                    listener: socket.listen(backlog)?,
                    allow: allow.clone(),
                })
            }
            Bind::Unix { path, perms } => {
                remove_stale_socket(path)?;
                let listener = bind_socket(path, perms.mode)?;
                // The bind listened with the system's own backlog: listening again sets the
                // configured one (the kernel caps both at net.core.somaxconn).
                let queue = i32::try_from(backlog)
                    .unwrap_or(i32::MAX)
                    .min(libc::SOMAXCONN);
                nix::sys::socket::Backlog::new(queue)
                    .and_then(|b| nix::sys::socket::listen(&listener, b))
                    .map_err(io::Error::from)?;
                give_owner(path, perms)?;
                Ok(Listener::Unix {
                    listener,
                    path: path.clone(),
                    file: SocketFile::owned(path),
                })
            }
        }
    }

    /// A listener handed over by socket activation, for the `[[listen]]` block `bind` (whose
    /// allow-list still applies; its mode and owner are whoever bound it's business).
    pub fn inherited(socket: crate::systemd::Inherited, bind: &Bind) -> io::Result<Listener> {
        match socket {
            crate::systemd::Inherited::Tcp(l) => {
                l.set_nonblocking(true)?;
                nix::sys::socket::setsockopt(&l, nix::sys::socket::sockopt::TcpNoDelay, &true)
                    .map_err(io::Error::from)?;
                let allow = match bind {
                    Bind::Tcp { allow, .. } => allow.clone(),
                    Bind::Unix { .. } => Vec::new(),
                };
                Ok(Listener::Tcp {
                    listener: TcpListener::from_std(l)?,
                    allow,
                })
            }
            crate::systemd::Inherited::Unix(l) => {
                l.set_nonblocking(true)?;
                let path = l
                    .local_addr()?
                    .as_pathname()
                    .map(Path::to_path_buf)
                    .unwrap_or_default();
                Ok(Listener::Unix {
                    listener: QuietListener::from_std(l)?,
                    path,
                    file: SocketFile::not_owned(),
                })
            }
        }
    }

    /// The socket out of the runtime it was registered with, for `threads` serving threads
    /// to accept on duplicates of ([`Parked`]). A TCP socket bound with SO_REUSEPORT
    /// ([`Listener::bind_with`]) gets a sibling per further thread, listening with `backlog`.
    pub fn park(self, threads: usize, backlog: u32) -> io::Result<Parked> {
        match self {
            Listener::Tcp { listener, allow } => {
                let first = listener.into_std()?;
                first.set_nonblocking(true)?;
                let shared =
                    nix::sys::socket::getsockopt(&first, nix::sys::socket::sockopt::ReusePort)
                        .map_err(io::Error::from)?;
                let mut listeners = vec![first];
                if shared {
                    let addr = listeners[0].local_addr()?;
                    for _ in 1..threads {
                        listeners.push(reuse_port_sibling(addr, backlog)?);
                    }
                }
                Ok(Parked::Tcp { listeners, allow })
            }
            Listener::Unix {
                listener,
                path,
                file,
            } => {
                let listener = listener.into_std()?;
                Ok(Parked::Unix {
                    listener,
                    path,
                    file,
                })
            }
        }
    }

    /// The address actually bound (with the real port when port 0 was asked for).
    pub fn local_address(&self) -> io::Result<ListenAddress> {
        match self {
            Listener::Tcp { listener, .. } => Ok(ListenAddress::Tcp(listener.local_addr()?)),
            Listener::Unix { path, .. } => Ok(ListenAddress::Unix(path.clone())),
        }
    }

    /// Accepts the next client. A TCP client outside the allow-list is closed at once and
    /// reported as `Ok(None)` so the caller can log it and go on accepting.
    pub async fn accept(&self) -> io::Result<Option<(Stream, Peer)>> {
        match self {
            Listener::Tcp { listener, allow } => {
                let (stream, peer) = listener.accept().await?;
                if !allow.is_empty() && !allow.iter().any(|c| c.contains(peer.ip())) {
                    // A client that reconnects in a loop gets one line a second, with a count.
                    static REFUSED: LineLimit = LineLimit::per_second();
                    if let Verdict::Log { suppressed } = REFUSED.check(Instant::now(), 0) {
                        tracing::warn!(client = %peer, suppressed, "refused a client outside the listener's allow list");
                    }
                    return Ok(None);
                }
                // No TCP_NODELAY here: the listening socket has it, and Linux copies it to
                // every connection accepted from it (a system call per connection saved).
                Ok(Some((Stream::Tcp(stream), Peer::Tcp(peer))))
            }
            Listener::Unix { listener, .. } => {
                let stream = listener.accept().await?;
                Ok(Some((Stream::Unix(stream), Peer::Unix)))
            }
        }
    }
}

/// Another listening socket on `addr`, bound with SO_REUSEPORT as the first one was, taken
/// out of the runtime the caller runs in at once.
fn reuse_port_sibling(addr: SocketAddr, backlog: u32) -> io::Result<std::net::TcpListener> {
    let socket = match addr {
        SocketAddr::V4(_) => TcpSocket::new_v4()?,
        SocketAddr::V6(_) => TcpSocket::new_v6()?,
    };
    socket.set_reuseaddr(true)?;
    socket.set_reuseport(true)?;
    socket.bind(addr)?;
    socket.set_nodelay(true)?;
    let listener = socket.listen(backlog)?.into_std()?;
    listener.set_nonblocking(true)?;
    Ok(listener)
}

/// Binds a Unix socket at `path` that has `mode` from the moment it exists: the umask
/// around `bind` sets it, so no `chmod` by path follows, which a symbolic link swapped in at
/// the path would redirect to another file (a root corral would chmod it).
fn bind_socket(path: &Path, mode: u32) -> io::Result<QuietListener> {
    crate::process::own::with_umask(!mode & 0o777, || QuietListener::bind(path))
}

/// Gives a Unix socket file its configured owner and group (names are looked up in the
/// system's user and group databases), without following a symbolic link at the path
/// (`lchown`, that is `fchownat` with `AT_SYMLINK_NOFOLLOW`): a link swapped in after the
/// bind gets the owner itself, and what it points to keeps its own.
fn give_owner(path: &Path, perms: &UnixPermissions) -> io::Result<()> {
    let lookup_err = |what: &str, name: &str| {
        io::Error::new(
            io::ErrorKind::NotFound,
            format!("{what} `{name}` for {} does not exist", path.display()),
        )
    };
    let uid = match &perms.owner {
        Some(name) => Some(
            nix::unistd::User::from_name(name)
                .map_err(io::Error::from)?
                .ok_or_else(|| lookup_err("user", name))?
                .uid
                .as_raw(),
        ),
        None => None,
    };
    let gid = match &perms.group {
        Some(name) => Some(
            nix::unistd::Group::from_name(name)
                .map_err(io::Error::from)?
                .ok_or_else(|| lookup_err("group", name))?
                .gid
                .as_raw(),
        ),
        None => None,
    };
    if uid.is_none() && gid.is_none() {
        return Ok(());
    }
    std::os::unix::fs::lchown(path, uid, gid).map_err(|e| {
        if e.raw_os_error() == Some(nix::libc::EPERM) {
            owner_refused(path, perms, e)
        } else {
            e
        }
    })
}

/// Why a non-root corral cannot give its socket `perms`' owner or group, and what to do.
fn owner_refused(path: &Path, perms: &UnixPermissions, e: io::Error) -> io::Error {
    let me = nix::unistd::Uid::effective();
    let name = nix::unistd::User::from_uid(me)
        .ok()
        .flatten()
        .map_or_else(|| format!("uid {me}"), |u| format!("{} (uid {me})", u.name));
    let text = match (&perms.owner, &perms.group) {
        (Some(owner), _) => format!(
            "cannot give {} the owner `{owner}`: only root may give a file to another user, and \
             corral runs as {name}; run corral as root, or remove `owner` (with `group` set to \
             a group {name} is in and mode = \"0660\", that group's front server can connect)",
            path.display()
        ),
        (None, group) => format!(
            "cannot give {} the group `{}`: corral runs as {name}, who is not in that group; \
             add {name} to it, run corral as root, or remove `group`",
            path.display(),
            group.as_deref().unwrap_or_default()
        ),
    };
    io::Error::new(e.kind(), format!("{text} ({e})"))
}

/// Removes a socket file left by a process that is gone. A path that is not a socket, or a
/// socket something still answers on, is left alone and reported.
fn remove_stale_socket(path: &Path) -> io::Result<()> {
    use std::os::unix::fs::FileTypeExt;
    let meta = match std::fs::symlink_metadata(path) {
        Ok(m) => m,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(e),
    };
    if !meta.file_type().is_socket() {
        return Err(io::Error::new(
            io::ErrorKind::AlreadyExists,
            format!("{} exists and is not a socket", path.display()),
        ));
    }
    if std::os::unix::net::UnixStream::connect(path).is_ok() {
        return Err(io::Error::new(
            io::ErrorKind::AddrInUse,
            format!("another process is listening on {}", path.display()),
        ));
    }
    std::fs::remove_file(path)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::{MetadataExt, PermissionsExt};

    #[tokio::test]
    async fn a_socket_has_its_mode_from_the_bind_and_its_owner_without_following_a_link() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.sock");
        for mode in [0o660, 0o600, 0o666] {
            let _l = bind_socket(&path, mode).unwrap();
            let got = std::fs::symlink_metadata(&path).unwrap().mode() & 0o777;
            assert_eq!(got, mode, "{mode:o}");
            std::fs::remove_file(&path).unwrap();
        }
        // The umask is put back.
        use nix::sys::stat::{umask, Mode};
        let outer = umask(Mode::from_bits_truncate(0o027));
        let _l = bind_socket(&path, 0o666).unwrap();
        let after = umask(outer);
        assert_eq!(after.bits() & 0o777, 0o027);

        // A symbolic link swapped in at the socket's path after the bind: the link is given
        // the owner, not what it points to. Needs root to give a file away (CI runs as root).
        if !nix::unistd::Uid::effective().is_root() {
            return;
        }
        let target = dir.path().join("shadow");
        std::fs::write(&target, "").unwrap();
        let link = dir.path().join("swapped.sock");
        std::os::unix::fs::symlink(&target, &link).unwrap();
        let perms = UnixPermissions {
            mode: 0o660,
            owner: Some("nobody".into()),
            group: None,
        };
        give_owner(&link, &perms).unwrap();
        assert_eq!(
            std::fs::metadata(&target).unwrap().uid(),
            0,
            "followed the link"
        );
        let nobody = nix::unistd::User::from_name("nobody").unwrap().unwrap();
        assert_eq!(
            std::fs::symlink_metadata(&link).unwrap().uid(),
            nobody.uid.as_raw()
        );
    }

    /// Whether the client connection `listener` accepts next has TCP_NODELAY.
    async fn accepted_nodelay(listener: &Listener) -> bool {
        let Ok(ListenAddress::Tcp(addr)) = listener.local_address() else {
            panic!("not a TCP listener");
        };
        let _client = tokio::net::TcpStream::connect(addr).await.unwrap();
        match listener.accept().await.unwrap() {
            Some((Stream::Tcp(s), _)) => s.nodelay().unwrap(),
            other => panic!("accepted {other:?}"),
        }
    }

    #[tokio::test]
    async fn tcp_clients_are_accepted_with_nodelay_from_every_kind_of_listener() {
        // Set on the listening socket, not per connection: the kernel copies it to each
        // accepted one, whether corral bound the socket, a sibling shares its port or
        // socket activation handed it over.
        let bind = Bind::Tcp {
            addr: "127.0.0.1:0".parse().unwrap(),
            allow: Vec::new(),
        };
        let bound = Listener::bind(&bind, 16).unwrap();
        assert!(accepted_nodelay(&bound).await, "bound");

        let shared = Listener::bind_with(&bind, 16, true).unwrap();
        let parked = shared.park(2, 16).unwrap();
        for queue in 0..parked.queues() {
            let l = parked.register(queue).unwrap();
            // SO_REUSEPORT spreads clients over the two queues: connect until this one
            // has one waiting.
            let Ok(ListenAddress::Tcp(addr)) = l.local_address() else {
                panic!()
            };
            let mut clients = Vec::new();
            let accepted = loop {
                clients.push(tokio::net::TcpStream::connect(addr).await.unwrap());
                let next = tokio::time::timeout(std::time::Duration::from_millis(20), l.accept());
                if let Ok(got) = next.await {
                    break got.unwrap();
                }
            };
            match accepted {
                Some((Stream::Tcp(s), _)) => assert!(s.nodelay().unwrap(), "queue {queue}"),
                other => panic!("accepted {other:?}"),
            }
        }

        let handed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let inherited = Listener::inherited(crate::systemd::Inherited::Tcp(handed), &bind).unwrap();
        assert!(accepted_nodelay(&inherited).await, "inherited");
    }

    #[tokio::test]
    async fn unix_listener_gets_its_mode_and_clears_a_stale_socket() {
        let dir = std::env::temp_dir().join(format!("corral-listener-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("front.sock");
        // A stale socket file from a process that is gone.
        drop(std::os::unix::net::UnixListener::bind(&path).unwrap());
        let bind = Bind::Unix {
            path: path.clone(),
            perms: UnixPermissions {
                mode: 0o660,
                owner: None,
                group: None,
            },
        };
        let l = Listener::bind(&bind, 16).unwrap();
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o660);
        // A live socket is not taken over.
        assert!(Listener::bind(&bind, 16).is_err());
        drop(l);
        assert!(!path.exists());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
