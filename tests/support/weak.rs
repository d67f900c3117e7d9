//! Checks that a connection is closed, not merely quiet: a read that ends in EOF (or a reset)
//! within a bound well below every timeout that would close a held connection anyway.

use std::io::{ErrorKind, Read};
use std::net::TcpStream;
use std::os::unix::net::UnixStream;
use std::time::Duration;

use tokio::time::Instant;

/// How soon a connection corral means to close "at once" must be closed: far below the
/// shortest timeout that would close a held one anyway (the front's 10 s `header_timeout`,
/// the status listener's 5 s + 10 s).
pub const AT_ONCE: Duration = Duration::from_secs(3);

/// A stream whose reads can be bounded in time.
pub trait Timed: Read {
    /// Sets the read timeout.
    fn bound_reads(&self, within: Duration);
}

impl Timed for TcpStream {
    fn bound_reads(&self, within: Duration) {
        self.set_read_timeout(Some(within))
            .expect("set_read_timeout");
    }
}

impl Timed for UnixStream {
    fn bound_reads(&self, within: Duration) {
        self.set_read_timeout(Some(within))
            .expect("set_read_timeout");
    }
}

/// Reads `s` until the peer closes it (EOF, or a reset), which must come within `within`;
/// what was read. Panics if the connection is still open then.
pub fn read_until_closed<S: Timed>(s: &mut S, within: Duration) -> Vec<u8> {
    let started = Instant::now();
    let mut out = Vec::new();
    let mut buf = [0u8; 16 * 1024];
    loop {
        let left = within.saturating_sub(started.elapsed());
        assert!(
            !left.is_zero(),
            "still open after {within:?}; read so far: {}",
            String::from_utf8_lossy(&out)
        );
        s.bound_reads(left);
        match s.read(&mut buf) {
            Ok(0) => return out,
            Ok(n) => out.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) if matches!(e.kind(), ErrorKind::ConnectionReset | ErrorKind::BrokenPipe) => {
                return out
            }
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => panic!(
                "still open after {:?} (a read timed out); read so far: {}",
                started.elapsed(),
                String::from_utf8_lossy(&out)
            ),
            Err(e) => panic!("read failed: {e}"),
        }
    }
}

/// Polls `check` every 10 ms without blocking the runtime (other tasks go on) until it
/// holds, for up to `within`; whether it held.
pub async fn until(within: Duration, mut check: impl FnMut() -> bool) -> bool {
    let deadline = tokio::time::Instant::now() + within;
    while tokio::time::Instant::now() < deadline {
        if check() {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    check()
}

/// Open descriptors of this process on spool files in `dir`: corral unlinks each spool file
/// at once and keeps only its descriptor, so these are the spooled bodies in flight.
pub fn spool_files_open(dir: &std::path::Path) -> usize {
    let prefix = dir.join("corral-spool-");
    let prefix = prefix.to_string_lossy();
    std::fs::read_dir("/proc/self/fd")
        .expect("/proc/self/fd")
        .filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
        .filter(|target| {
            let target = target.to_string_lossy();
            target.starts_with(&*prefix) && target.ends_with(" (deleted)")
        })
        .count()
}

/// Waits (up to 20 s) for a request body of `length` bytes to sit whole in one unlinked spool
/// file in `dir` while its request is in flight, with `used()` (the spool budget) holding
/// it all; panics naming what it saw instead.
pub async fn assert_spooled_in_flight(dir: &std::path::Path, length: u64, used: impl Fn() -> u64) {
    assert!(
        until(Duration::from_secs(20), || {
            spool_files_open(dir) == 1 && used() == length
        })
        .await,
        "no spool file of {length} bytes while the request was in flight: {} open, {} bytes held",
        spool_files_open(dir),
        used()
    );
    assert_eq!(
        std::fs::read_dir(dir).unwrap().count(),
        0,
        "the spool file is unlinked"
    );
}
