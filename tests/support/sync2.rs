//! Front-limit fixtures shared by tests/front_limits.rs (phase timeouts) and
//! tests/front_limits_eviction.rs (connection caps): the null backend, the configurations,
//! raw client connections and the waits on what corral does with them.
//!
//! Nothing here waits on time alone: a connection is known to be accepted when corral holds
//! one more descriptor, closed when it reads end of stream, and a log is known to be
//! complete up to a point when a marker line caused after that point has arrived.

use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::thread;
use std::time::Duration;

use bytes::BytesMut;
use corral::protocols::fastcgi::{encode_begin_request, encode_params, encode_stdin_end, Role};
use tokio::time::Instant;

use super::fastcgi::Answers;
use super::peers::{cgi_params, Peer};
use super::server::{http, Corral};

/// `corral null-backend --protocol fastcgi` on `dir/fastcgi.sock`, ready to accept.
pub fn null_backend(dir: &Path) -> Peer {
    super::null_backend::null_backend(dir, "fastcgi", &[])
}

/// A configuration with `server` keys, one TCP listener per `(protocol, extra keys)`, a
/// status listener, and the null backend as the only pool.
pub fn config(null: &Peer, server: &str, listeners: &[(&str, &str)]) -> String {
    let mut text = format!("[server]\ngrace = \"1s\"\nlog_level = \"debug\"\n{server}\n");
    for (protocol, extra) in listeners {
        text.push_str(&format!(
            "[[listen]]\naddress = \"127.0.0.1:0\"\nprotocol = \"{protocol}\"\n{extra}\n"
        ));
    }
    text.push_str(&format!(
        "[status]\naddress = \"127.0.0.1:0\"\n\n[pools.null]\nservers = [\"unix:{}\"]\n\
         concurrency = 8\n\n[[contexts]]\npool = \"null\"\n",
        null.socket.display()
    ));
    text
}

/// A php-cgi site (a static pool of one worker) served from `dir`.
pub fn php_config(dir: &Path) -> String {
    format!(
        r#"
[server]
runtime_dir = "{run}"
grace = "1s"
kill_timeout = "2s"
body_timeout = "2s"
body_deadline = "5s"

[[listen]]
address = "127.0.0.1:0"
protocol = "http"

[status]
address = "127.0.0.1:0"

[pools.php]
command = ["php-cgi"]
mode = "static"
max = 1

[[contexts]]
pool = "php"
root = "{root}"
"#,
        run = dir.join("run").display(),
        root = dir.display()
    )
}

/// A connection to `addr` with a short read timeout.
pub fn connect(addr: SocketAddr) -> TcpStream {
    let s = TcpStream::connect(addr).expect("connect to corral");
    s.set_read_timeout(Some(Duration::from_millis(200)))
        .unwrap();
    s
}

/// Connects `n` times to `addr`, each connection accepted by corral (`pid` holds one more
/// descriptor) before the next is opened, so that corral counts them in this order. Only
/// under a cap: a connection that makes room for itself leaves the count unchanged.
pub fn connect_in_order(addr: SocketAddr, pid: u32, n: usize) -> Vec<TcpStream> {
    (0..n)
        .map(|i| {
            let before = fds(pid);
            let s = connect(addr);
            let held = wait_fds(pid, before + 1);
            assert!(
                held > before,
                "connection {i} to {addr} never accepted ({held} descriptors)"
            );
            s
        })
        .collect()
}

/// Reads what `s` still has until corral closes it, for at most `limit`: what was read, or
/// `None` if it is still open then.
pub fn closed_within(s: &mut TcpStream, limit: Duration) -> Option<Vec<u8>> {
    s.set_read_timeout(Some(Duration::from_millis(50))).unwrap();
    let deadline = Instant::now() + limit;
    let mut got = Vec::new();
    let mut chunk = [0u8; 4096];
    while Instant::now() < deadline {
        match s.read(&mut chunk) {
            Ok(0) => return Some(got),
            Ok(n) => got.extend_from_slice(&chunk[..n]),
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
            Err(_) => return Some(got), // reset: closed too
        }
    }
    None
}

/// Whether corral still holds `s` open (nothing to read, no end of stream).
pub fn still_open(s: &mut TcpStream) -> bool {
    s.set_read_timeout(Some(Duration::from_millis(20))).unwrap();
    let mut byte = [0u8; 1];
    matches!(s.read(&mut byte), Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut))
}

/// Sends `bytes` one at a time, `every` apart (the pace is what the test measures), until
/// corral closes the connection: the time from the first byte to the close, or `None` if
/// all bytes went out and it was still open `every` after the last (or after `limit`).
pub fn trickle(
    s: &mut TcpStream,
    bytes: &[u8],
    every: Duration,
    limit: Duration,
) -> Option<Duration> {
    let start = Instant::now();
    for b in bytes {
        if s.write_all(&[*b]).is_err() {
            return Some(start.elapsed());
        }
        if closed_within(s, every).is_some() {
            return Some(start.elapsed());
        }
        if start.elapsed() > limit {
            return None;
        }
    }
    None
}

/// The descriptors process `pid` holds.
pub fn fds(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .map(|d| d.count())
        .unwrap_or(0)
}

/// Waits (at most 10 s) until `pid` holds at least `n` descriptors; how many it holds.
pub fn wait_fds(pid: u32, n: usize) -> usize {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let open = fds(pid);
        if open >= n || Instant::now() > deadline {
            return open;
        }
        thread::sleep(Duration::from_millis(10));
    }
}

/// The status page's `backend errors:` value.
pub fn backend_errors(status: SocketAddr) -> String {
    let page = http(status, "GET", "/status", &[], b"").text();
    page.lines()
        .find(|l| l.starts_with("backend errors:"))
        .map(|l| l.trim_start_matches("backend errors:").trim().to_owned())
        .unwrap_or_else(|| panic!("no backend errors line in {page}"))
}

/// Asks the HTTP front at `addr` for the missing script `/{tag}.php` and waits for corral's
/// line naming it: everything corral logged about what happened before is in the log by
/// then (for a negative check on it).
pub fn http_log_marker(corral: &Corral, addr: SocketAddr, tag: &str) {
    let r = http(addr, "GET", &format!("/{tag}.php"), &[], b"");
    assert_eq!(r.status, 404, "{}", corral.log());
    assert!(corral.wait_log(tag), "no marker line:\n{}", corral.log());
}

/// [`http_log_marker`] through the FastCGI front at `addr`, for the missing script
/// `root/{tag}.php`.
pub fn fastcgi_log_marker(corral: &Corral, addr: SocketAddr, root: &Path, tag: &str) {
    let mut s = TcpStream::connect(addr).expect("connect to corral");
    let mut out = BytesMut::new();
    encode_begin_request(1, Role::Responder, false, &mut out);
    let params = cgi_params("GET", &root.join(format!("{tag}.php")), "", &[]);
    encode_params(1, &params, &mut out).unwrap();
    encode_stdin_end(1, &mut out);
    s.write_all(&out).unwrap();
    let mut answers = Answers::default();
    assert!(
        answers.read_until_end(&mut s, 1, Duration::from_secs(10)),
        "the marker request was not answered\n{}",
        corral.log()
    );
    assert!(corral.wait_log(tag), "no marker line:\n{}", corral.log());
}
