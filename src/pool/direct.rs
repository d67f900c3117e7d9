//! Direct pools (`accept = "direct"`, ARCHITECTURE.md "Direct pools"): the listening socket
//! every worker of the pool accepts on, shared across generations, and what the kernel says
//! about a worker (blocked in accept = idle).
//!
//! The socket of one address is bound once and kept while any pool holds it: a reload that
//! builds a new pool for the same address (its settings changed) gets the very socket the
//! old pool's workers accept on, so the new workers accept beside the old ones and no
//! connection the front server makes is refused. The registry holds sockets weakly; the last
//! pool to drop one closes it (and a Unix socket's file goes with it).

use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::{Arc, LazyLock, Mutex, Weak};

use crate::config::{BackendAddress, DirectListener, FrontProtocol, ListenAddress};
use crate::front::backlog::Backlogs;
use crate::front::listener::{Listener, Parked};
use crate::process::ExitKind;

/// A direct pool's listening socket.
#[derive(Debug)]
pub struct DirectSocket {
    /// The bound listener (a Unix socket's file is removed when it drops), out of every
    /// runtime: corral never accepts on it, and a registered socket would wake corral's
    /// reactor for every connection the front server makes. Its open file is blocking, as
    /// php-cgi expects of fd 0.
    listener: Parked,
    address: ListenAddress,
}

/// Every live direct socket, by address.
static SOCKETS: Mutex<Vec<(ListenAddress, Weak<DirectSocket>)>> = Mutex::new(Vec::new());

/// The accept queues of the direct sockets, for status (`front::backlog`).
static BACKLOGS: LazyLock<Backlogs> = LazyLock::new(Backlogs::default);

/// The direct sockets' accept queues.
pub fn backlogs() -> &'static Backlogs {
    &BACKLOGS
}

impl DirectSocket {
    /// The socket for `l`: the one already bound at its address if a pool holds it, else a
    /// new one. Must be called inside a tokio runtime (the listener is registered with it,
    /// though never polled).
    pub fn get(l: &DirectListener) -> io::Result<Arc<DirectSocket>> {
        let address = l.bind.address();
        let mut sockets = SOCKETS.lock().unwrap_or_else(|p| p.into_inner());
        sockets.retain(|(_, w)| w.strong_count() > 0);
        if let Some(s) = sockets
            .iter()
            .find(|(a, _)| *a == address)
            .and_then(|(_, w)| w.upgrade())
        {
            return Ok(s);
        }
        let listener = Listener::bind(&l.bind, l.backlog)
            .and_then(|b| b.park(1, l.backlog))
            .map_err(|e| io::Error::new(e.kind(), format!("cannot listen on {address}: {e}")))?;
        set_blocking(fd_of(&listener)?)?;
        let socket = Arc::new(DirectSocket {
            listener,
            address: address.clone(),
        });
        let weak: Weak<DirectSocket> = Arc::downgrade(&socket);
        let owner: Weak<dyn std::any::Any + Send + Sync> = weak;
        BACKLOGS.add_parked(FrontProtocol::Fastcgi, &socket.listener, owner);
        sockets.push((address, Arc::downgrade(&socket)));
        tracing::info!(listener = %socket.address, "direct pool socket bound");
        Ok(socket)
    }

    /// A duplicate of the socket, to become a worker's fd 0.
    pub fn duplicate(&self) -> io::Result<OwnedFd> {
        fd_of(&self.listener)?.try_clone_to_owned()
    }

    /// Connections waiting in the socket's accept queue now (sock_diag, as status reads
    /// it); `None` when the kernel could not be asked.
    pub fn queued(&self) -> Option<u64> {
        let address = self.address.to_string();
        BACKLOGS
            .read()
            .into_iter()
            .find(|b| b.address == address)
            .and_then(|b| b.queued)
    }

    /// The address, as a worker's address in logs and status.
    pub fn backend_address(&self) -> BackendAddress {
        match &self.address {
            ListenAddress::Tcp(a) => BackendAddress::Tcp {
                host: a.ip().to_string(),
                port: a.port(),
            },
            ListenAddress::Unix(p) => BackendAddress::Unix(p.clone()),
        }
    }
}

fn fd_of(l: &Parked) -> io::Result<BorrowedFd<'_>> {
    match l {
        Parked::Tcp { listeners, .. } => listeners
            .first()
            .map(AsFd::as_fd)
            .ok_or_else(|| io::Error::other("no socket was bound")),
        Parked::Unix { listener, .. } => Ok(listener.as_fd()),
    }
}

/// Clears O_NONBLOCK on the open file (shared by every duplicate): php-cgi's accept loop
/// treats EAGAIN as an error and would exit.
fn set_blocking(fd: BorrowedFd<'_>) -> io::Result<()> {
    use nix::fcntl::{fcntl, FcntlArg, OFlag};
    let flags = fcntl(fd, FcntlArg::F_GETFL).map_err(io::Error::from)?;
    let flags = OFlag::from_bits_truncate(flags) & !OFlag::O_NONBLOCK;
    fcntl(fd, FcntlArg::F_SETFL(flags)).map_err(io::Error::from)?;
    Ok(())
}

/// Whether process `pid` is blocked in accept(2) or accept4(2) now, from the first field
/// of /proc/PID/syscall (the number of the system call it is blocked in, `running` when it
/// runs): a direct worker doing so holds no connection, so it is idle. `None` when the file
/// cannot be read (the process is gone, or belongs to another user and corral is not root).
pub fn in_accept(pid: u32) -> Option<bool> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/syscall")).ok()?;
    let first = text.split_ascii_whitespace().next()?;
    let Ok(nr) = first.parse::<i64>() else {
        return Some(false); // "running"
    };
    Some(nr == libc::SYS_accept || nr == libc::SYS_accept4)
}

/// What the scheduler says of process `pid` (/proc/PID/schedstat, world-readable): the
/// CPU time it has used, in nanoseconds, and how many times it has been scheduled to run.
/// A worker blocked in accept is not scheduled at all, so a count that moved between two
/// looks means it served something in between, even if both looks found it in accept.
/// `None` when the file cannot be read.
pub fn sched(pid: u32) -> Option<Sched> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/schedstat")).ok()?;
    let mut f = text.split_ascii_whitespace();
    let cpu_ns = f.next()?.parse().ok()?;
    let runs = f.nth(1)?.parse().ok()?;
    Some(Sched { cpu_ns, runs })
}

/// One reading of /proc/PID/schedstat ([`sched`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sched {
    /// CPU time used, in nanoseconds.
    pub cpu_ns: u64,
    /// Times scheduled to run.
    pub runs: u64,
}

/// What corral can tell of one direct worker's life without seeing its requests, logged
/// when the worker leaves (the per-worker record: a direct pool has no per-request access
/// log). Every figure is the kernel's: the CPU time and the busy share come from the looks
/// the driver takes every tick (so they are as of the last look, at most 100 ms old), and
/// the request count is known only when php-cgi stopped on its own after its
/// `PHP_FCGI_MAX_REQUESTS`.
#[derive(Debug, Clone)]
pub struct WorkerRecord {
    started: tokio::time::Instant,
    /// `PHP_FCGI_MAX_REQUESTS` it was started with (0: none).
    budget: u64,
    looks: u64,
    busy: u64,
    last: Option<Sched>,
    asked: bool,
}

impl WorkerRecord {
    /// A worker started now with request budget `budget` (0: none).
    pub fn new(budget: u64) -> WorkerRecord {
        WorkerRecord {
            started: tokio::time::Instant::now(),
            budget,
            looks: 0,
            busy: 0,
            last: None,
            asked: false,
        }
    }

    /// Takes one look (`busy`: not blocked in accept; `sched`: its schedstat now); true
    /// when it ran since the previous look (or this is the first, or it cannot be told).
    pub fn look(&mut self, busy: bool, sched: Option<Sched>) -> bool {
        self.looks += 1;
        self.busy += u64::from(busy);
        let ran = match (sched, self.last) {
            (Some(now), Some(before)) => now.runs != before.runs,
            _ => true,
        };
        if sched.is_some() {
            self.last = sched;
        }
        ran
    }

    /// corral sent it its stop signal: an exit 0 after that is not php-cgi's own count.
    pub fn asked_to_stop(&mut self) {
        self.asked = true;
    }

    /// Requests it served, when the kernel can tell: it exited 0 on its own with a budget,
    /// so php-cgi counted exactly `budget`.
    pub fn requests(&self, exit: ExitKind) -> Option<u64> {
        (exit == ExitKind::Code(0) && !self.asked && self.budget > 0).then_some(self.budget)
    }

    /// The record's fields, for the log line: lifetime, CPU, busy share, requests.
    pub fn summary(&self, exit: ExitKind) -> RecordSummary {
        RecordSummary {
            lifetime_ms: u64::try_from(self.started.elapsed().as_millis()).unwrap_or(u64::MAX),
            cpu_ms: self.last.map(|s| s.cpu_ns / 1_000_000),
            busy_percent: (self.looks > 0).then(|| self.busy * 100 / self.looks),
            looks: self.looks,
            requests: self.requests(exit),
        }
    }
}

/// A [`WorkerRecord`]'s figures as logged.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RecordSummary {
    /// From spawn to exit.
    pub lifetime_ms: u64,
    /// CPU time at the last look.
    pub cpu_ms: Option<u64>,
    /// Share of the looks that found it not in accept.
    pub busy_percent: Option<u64>,
    /// How many looks were taken.
    pub looks: u64,
    /// Requests served, when known ([`WorkerRecord::requests`]).
    pub requests: Option<u64>,
}

/// The sockets process `pid` holds other than its listener on fd 0 (inodes, sorted): the
/// connection a direct worker accepted, and whatever sockets its script keeps (a database's).
/// `None` when /proc cannot be read.
pub fn held_sockets(pid: u32) -> Option<Vec<u64>> {
    let fds = std::fs::read_dir(format!("/proc/{pid}/fd")).ok()?;
    let mut out: Vec<u64> = fds
        .flatten()
        .filter(|e| e.file_name() != "0")
        .filter_map(|e| std::fs::read_link(e.path()).ok())
        .filter_map(|l| {
            let l = l.to_str()?;
            l.strip_prefix("socket:[")?.strip_suffix(']')?.parse().ok()
        })
        .collect();
    out.sort_unstable();
    Some(out)
}

/// Whether direct worker `pid` has begun serving: it is blocked in accept, or it holds a
/// socket other than its listener on fd 0 (a connection it accepted; php-cgi opens none
/// before its first request). Under load a new worker may never be seen in accept: a
/// connection is always waiting, so each accept returns at once.
pub fn serving(pid: u32) -> bool {
    if in_accept(pid) == Some(true) {
        return true;
    }
    let Ok(fds) = std::fs::read_dir(format!("/proc/{pid}/fd")) else {
        return false;
    };
    fds.flatten().any(|e| {
        e.file_name() != "0"
            && std::fs::read_link(e.path())
                .is_ok_and(|l| l.as_os_str().as_encoded_bytes().starts_with(b"socket:"))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_process_not_in_accept_is_busy_and_a_gone_one_unknown() {
        assert_eq!(in_accept(std::process::id()), Some(false));
        assert_eq!(in_accept(u32::MAX), None);
    }

    #[test]
    fn a_process_that_runs_is_counted_and_a_gone_one_unknown() {
        // This thread (tests do not run on the process's main thread): /proc/TID works too.
        let link = std::fs::read_link("/proc/thread-self").unwrap();
        let tid: u32 = link.file_name().unwrap().to_str().unwrap().parse().unwrap();
        let before = sched(tid).unwrap();
        // Work for a while (CPU time), then block (one more time scheduled after).
        let mut x = 0u64;
        for i in 0..20_000_000u64 {
            x = std::hint::black_box(x.wrapping_add(i));
        }
        std::thread::sleep(std::time::Duration::from_millis(2));
        let after = sched(tid).unwrap();
        assert!(after.runs > before.runs, "{before:?} {after:?}");
        assert!(
            after.cpu_ns >= before.cpu_ns + 1_000_000,
            "{before:?} {after:?}"
        );
        assert_eq!(sched(u32::MAX), None);
    }

    #[test]
    fn a_record_counts_requests_only_when_php_cgi_counted_them() {
        let mut r = WorkerRecord::new(500);
        let s = |runs| {
            Some(Sched {
                cpu_ns: 7_000_000,
                runs,
            })
        };
        assert!(r.look(true, s(1)), "the first look");
        assert!(!r.look(false, s(1)), "not scheduled since");
        assert!(r.look(false, s(2)));
        assert!(r.look(false, None), "unknown counts as ran");
        let sum = r.summary(ExitKind::Code(0));
        assert_eq!(sum.requests, Some(500), "exit 0 on its own: its budget");
        assert_eq!(
            (sum.busy_percent, sum.looks, sum.cpu_ms),
            (Some(25), 4, Some(7))
        );
        assert_eq!(r.requests(ExitKind::Signal(9)), None, "killed: unknown");
        assert_eq!(r.requests(ExitKind::Code(255)), None);
        r.asked_to_stop();
        assert_eq!(
            r.requests(ExitKind::Code(0)),
            None,
            "stopped by corral: unknown"
        );
        let none = WorkerRecord::new(0);
        assert_eq!(none.requests(ExitKind::Code(0)), None, "no budget: unknown");
        assert_eq!(none.summary(ExitKind::Code(0)).busy_percent, None);
    }

    #[test]
    fn one_address_is_bound_once_while_a_pool_holds_it() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("d.sock");
        let l = DirectListener {
            bind: crate::config::Bind::Unix {
                path: path.clone(),
                perms: crate::config::UnixPermissions {
                    mode: 0o600,
                    owner: None,
                    group: None,
                },
            },
            backlog: 16,
            child_max_memory: None,
        };
        rt.block_on(async {
            let a = DirectSocket::get(&l).unwrap();
            let b = DirectSocket::get(&l).unwrap();
            assert!(Arc::ptr_eq(&a, &b));
            drop((a, b));
            assert!(!path.exists(), "the last holder closes it");
            let c = DirectSocket::get(&l).unwrap();
            assert!(path.exists());
            drop(c);
        });
    }
}
