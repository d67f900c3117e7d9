//! Shared by the `tests/invariants_*.rs` files: reading corral's status page and its own
//! memory, and timing an answer.

use std::net::SocketAddr;
use std::time::Duration;

use tokio::time::Instant;

use super::server::{http, HttpResponse};

/// The status page of one pool as text (`/status?pool=NAME`, with `?full` rows when `full`).
pub fn status_text(status: SocketAddr, pool: &str, full: bool) -> String {
    let target = if full {
        format!("/status?pool={pool}&full")
    } else {
        format!("/status?pool={pool}")
    };
    let r = http(status, "GET", &target, &[], b"");
    assert_eq!(r.status, 200, "status page: {}", r.text());
    r.text()
}

/// The value of `label:` in a block of status text (the first one).
pub fn field<'a>(text: &'a str, label: &str) -> Option<&'a str> {
    let key = format!("{label}:");
    text.lines()
        .find_map(|l| l.strip_prefix(key.as_str()))
        .map(str::trim)
}

/// The number `label:` shows for `pool` on the status page.
pub fn counter(status: SocketAddr, pool: &str, label: &str) -> u64 {
    let text = status_text(status, pool, false);
    field(&text, label)
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no number for {label:?} in:\n{text}"))
}

/// Every number `label:` shows in the `?full` rows of `pool` (one per worker or server).
pub fn row_counters(status: SocketAddr, pool: &str, label: &str) -> Vec<u64> {
    let text = status_text(status, pool, true);
    let key = format!("{label}:");
    text.split("************************")
        .skip(1)
        .filter_map(|row| {
            row.lines()
                .find_map(|l| l.strip_prefix(key.as_str()))
                .and_then(|v| v.trim().parse().ok())
        })
        .collect()
}

/// A line of `/proc/PID/status` in KiB (`VmHWM`, `VmRSS`).
pub fn proc_kib(pid: u32, name: &str) -> u64 {
    let text = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("read proc status");
    text.lines()
        .find_map(|l| l.strip_prefix(&format!("{name}:")))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or_else(|| panic!("no {name} in /proc/{pid}/status"))
}

/// Resets the peak RSS (`VmHWM`) of `pid` to its current RSS (`/proc/PID/clear_refs` 5).
/// false when the kernel does not let this process do it.
pub fn reset_peak(pid: u32) -> bool {
    std::fs::write(format!("/proc/{pid}/clear_refs"), "5").is_ok()
}

/// Runs `f` and returns what it gave with how long it took.
pub fn timed<T>(f: impl FnOnce() -> T) -> (T, Duration) {
    let start = Instant::now();
    let out = f();
    (out, start.elapsed())
}

/// `http` with its time.
pub fn timed_http(
    addr: SocketAddr,
    method: &str,
    target: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> (HttpResponse, Duration) {
    timed(|| http(addr, method, target, headers, body))
}

/// Sends `raw` as is on a new connection to `addr` and reads the answer to EOF (20 s at
/// most); with the time it took.
pub fn raw_http(addr: SocketAddr, raw: &str) -> (HttpResponse, Duration) {
    use std::io::{Read, Write};
    timed(|| {
        let mut s = std::net::TcpStream::connect(addr).expect("connect to corral");
        s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        s.write_all(raw.as_bytes()).unwrap();
        let mut out = Vec::new();
        if let Err(e) = s.read_to_end(&mut out) {
            assert!(!out.is_empty(), "no answer to {raw:?}: {e}");
        }
        super::server::parse_response(&out)
    })
}

/// Waits (`within` at most) until `path` exists.
pub fn wait_file(path: &std::path::Path, within: Duration) -> bool {
    super::eventually(within, || path.exists())
}

/// Leaves a Unix socket file at `path` that refuses every connection, as a killed server's
/// does: bound, never listened on, closed. A listener bound and closed would not do: a child
/// another test thread forks holds a copy until its exec, and a connect made in that window is
/// accepted into its queue.
pub fn refusing_socket(path: &std::path::Path) {
    use nix::sys::socket::{bind, socket, AddressFamily, SockFlag, SockType, UnixAddr};
    use std::os::fd::AsRawFd;
    let fd = socket(
        AddressFamily::Unix,
        SockType::Stream,
        SockFlag::SOCK_CLOEXEC,
        None,
    )
    .expect("a Unix socket");
    bind(fd.as_raw_fd(), &UnixAddr::new(path).expect("a socket path")).expect("bind");
    drop(fd);
    assert!(
        std::os::unix::net::UnixStream::connect(path).is_err(),
        "{} refuses connections",
        path.display()
    );
}
