//! Front connection limits against the real binary and real sockets: the raised file limit
//! and the connection caps (1,200 idle sockets under a soft limit of 1,024, the server-wide
//! and the per-client cap closing the connection idle longest, the status listener's own
//! cap), and the phase timeouts of every listener (a head sent a byte at a time, a kept-alive
//! connection left idle, a body that stalls) on HTTP, FastCGI, SCGI and the status listener.
//! Backends are `corral null-backend --protocol fastcgi` and, where a worker must survive,
//! php-cgi.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing,
    missing_docs
)]

mod support;

use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::process::{Command, Stdio};
use std::thread;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use corral::protocols::fastcgi::{
    encode_begin_request, encode_params, encode_stdin, encode_stdin_end, RecordDecoder, RecordType,
    Role,
};
use tokio::time::Instant;

use support::fastcgi::{cgi_status, Answers};
use support::peers::{cgi_params, shared_dir, write_file, Peer};
use support::server::{http, Corral};
use support::CORRAL;

/// `corral null-backend --protocol fastcgi` on `dir/fastcgi.sock`, ready to accept.
fn null_backend(dir: &Path) -> Peer {
    let socket = dir.join("fastcgi.sock");
    let mut cmd = Command::new(CORRAL);
    cmd.args(["null-backend", "--protocol", "fastcgi", "--listen"])
        .arg(format!("unix:{}", socket.display()))
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    Peer::spawn(cmd, &socket).wait_connectable()
}

/// A configuration with `server` keys, one TCP listener per `(protocol, extra keys)`, a
/// status listener, and the null backend as the only pool.
fn config(null: &Peer, server: &str, listeners: &[(&str, &str)]) -> String {
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

fn connect(addr: SocketAddr) -> TcpStream {
    let s = TcpStream::connect(addr).expect("connect to corral");
    s.set_read_timeout(Some(Duration::from_millis(200)))
        .unwrap();
    s
}

/// Reads what `s` still has until corral closes it, for at most `limit`: what was read, or
/// `None` if it is still open then.
fn closed_within(s: &mut TcpStream, limit: Duration) -> Option<Vec<u8>> {
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
fn still_open(s: &mut TcpStream) -> bool {
    s.set_read_timeout(Some(Duration::from_millis(20))).unwrap();
    let mut byte = [0u8; 1];
    matches!(s.read(&mut byte), Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut))
}

/// Sends `bytes` one at a time, `every` apart, until corral closes the connection: the time
/// from the first byte to the close and what corral sent, or `None` if all bytes went out
/// and it was still open `every` after the last (or after `limit` in all).
fn trickle(s: &mut TcpStream, bytes: &[u8], every: Duration, limit: Duration) -> Option<Duration> {
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
fn fds(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .map(|d| d.count())
        .unwrap_or(0)
}

/// Waits (at most 10 s) until corral holds at least `n` descriptors; how many it holds.
fn wait_fds(pid: u32, n: usize) -> usize {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let open = fds(pid);
        if open >= n || Instant::now() > deadline {
            return open;
        }
        thread::sleep(Duration::from_millis(50));
    }
}

fn rss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap()
}

#[test]
fn a_thousand_idle_sockets_do_not_take_it_down() {
    let dir = shared_dir();
    let null = null_backend(dir.path());
    let corral = Corral::start_via(
        &["prlimit", "--nofile=1024:4096", "--"],
        &config(
            &null,
            "header_timeout = \"60s\"",
            &[("http", "max_connections_per_client = 0")],
        ),
        1,
    );
    assert!(
        corral.wait_log("raised the soft file-descriptor limit (RLIMIT_NOFILE) old=1024 new=4096"),
        "{}",
        corral.log()
    );
    let addr = corral.http_addr();
    let status = corral.status_ready_addr();
    let before = rss_kib(corral.pid());
    let base = fds(corral.pid());
    let idle: Vec<TcpStream> = (0..1200).map(|_| connect(addr)).collect();
    let open = wait_fds(corral.pid(), base + 1200);
    assert!(
        open >= base + 1200,
        "corral holds {open} descriptors:\n{}",
        corral.log()
    );
    let after = rss_kib(corral.pid());
    eprintln!(
        "corral RSS: {before} KiB before, {after} KiB with 1,200 idle connections \
         ({} bytes each)",
        (after.saturating_sub(before)) * 1024 / 1200
    );

    let started = Instant::now();
    let r = http(addr, "GET", "/fresh", &[], b"");
    assert_eq!(r.status, 200, "{}", corral.log());
    assert!(started.elapsed() < Duration::from_secs(5));
    let started = Instant::now();
    let r = http(status, "GET", "/ping", &[], b"");
    assert_eq!(r.text(), "pong\n");
    assert!(started.elapsed() < Duration::from_secs(5));
    drop(idle);
}

#[test]
fn beyond_max_connections_the_connection_idle_longest_is_closed() {
    let dir = shared_dir();
    let null = null_backend(dir.path());
    let corral = Corral::start(
        &config(
            &null,
            "max_connections = 20",
            &[("http", "max_connections_per_client = 0")],
        ),
        1,
    );
    let addr = corral.http_addr();
    let base = fds(corral.pid());
    let mut conns: Vec<TcpStream> = Vec::new();
    for _ in 0..20 {
        conns.push(connect(addr));
        // Accepted in order, so that "idle longest" is the first opened.
        thread::sleep(Duration::from_millis(5));
    }
    assert!(wait_fds(corral.pid(), base + 20) >= base + 20);
    let r = http(addr, "GET", "/over-the-cap", &[], b"");
    assert_eq!(r.status, 200, "{}", corral.log());
    assert!(
        closed_within(&mut conns[0], Duration::from_secs(3)).is_some(),
        "the oldest idle connection is closed"
    );
    assert!(still_open(&mut conns[19]), "the newest stays open");
    assert!(
        corral.wait_log("connection cap reached"),
        "{}",
        corral.log()
    );
}

#[test]
fn the_per_client_cap_closes_that_clients_oldest_idle_connection() {
    let dir = shared_dir();
    let null = null_backend(dir.path());
    let corral = Corral::start(
        &config(&null, "", &[("http", "max_connections_per_client = 4")]),
        1,
    );
    let addr = corral.http_addr();
    let mut conns: Vec<TcpStream> = Vec::new();
    for _ in 0..4 {
        conns.push(connect(addr));
        thread::sleep(Duration::from_millis(20));
    }
    // The fifth from 127.0.0.1 makes room by closing the first.
    conns.push(connect(addr));
    assert!(
        closed_within(&mut conns[0], Duration::from_secs(3)).is_some(),
        "{}",
        corral.log()
    );
    for c in &mut conns[1..] {
        assert!(still_open(c));
    }
    // A request (a sixth connection) still gets through, closing the second.
    let r = http(addr, "GET", "/within-the-cap", &[], b"");
    assert_eq!(r.status, 200, "{}", corral.log());
    assert!(closed_within(&mut conns[1], Duration::from_secs(3)).is_some());
    assert!(still_open(&mut conns[4]));
    assert!(
        corral.wait_log("evicted_at_client_cap=1"),
        "{}",
        corral.log()
    );
}

#[test]
fn an_http_head_sent_a_byte_every_two_seconds_is_cut_off() {
    let dir = shared_dir();
    let null = null_backend(dir.path());
    let corral = Corral::start(
        &config(&null, "header_timeout = \"3s\"", &[("http", "")]),
        1,
    );
    let addr = corral.http_addr();
    let mut slow = connect(addr);
    let beside = thread::spawn(move || {
        thread::sleep(Duration::from_millis(500));
        http(addr, "GET", "/beside", &[], b"").status
    });
    let cut = trickle(
        &mut slow,
        b"GET /slow HTTP/1.1\r\nHost: localhost\r\nX-Padding: aaaaaaaaaaaaaaaa\r\n\r\n",
        Duration::from_secs(2),
        Duration::from_secs(20),
    )
    .expect("the slow head is cut off");
    assert!(
        cut >= Duration::from_millis(2500) && cut < Duration::from_secs(8),
        "cut after {cut:?}"
    );
    assert_eq!(beside.join().unwrap(), 200);
}

/// Reads one HTTP response from a kept-alive connection (Content-Length or chunked body).
fn read_one_response(s: &mut TcpStream) -> String {
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut raw = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        let text = String::from_utf8_lossy(&raw).into_owned();
        if let Some(end) = text.find("\r\n\r\n") {
            let head = text[..end].to_ascii_lowercase();
            let body = &text[end + 4..];
            let length = head
                .lines()
                .find_map(|l| l.strip_prefix("content-length:"))
                .and_then(|v| v.trim().parse::<usize>().ok());
            let done = match length {
                Some(n) => body.len() >= n,
                None => body.ends_with("0\r\n\r\n"),
            };
            if done {
                return text;
            }
        }
        let n = s.read(&mut chunk).expect("a response in time");
        assert!(
            n > 0,
            "closed mid-response: {:?}",
            String::from_utf8_lossy(&raw)
        );
        raw.extend_from_slice(&chunk[..n]);
    }
}

#[test]
fn a_kept_alive_http_connection_gets_idle_timeout_not_header_timeout() {
    let dir = shared_dir();
    let null = null_backend(dir.path());
    let corral = Corral::start(
        &config(
            &null,
            "header_timeout = \"2s\"\nidle_timeout = \"5s\"",
            &[("http", "")],
        ),
        1,
    );
    let mut s = connect(corral.http_addr());
    for _ in 0..2 {
        s.write_all(b"GET /kept HTTP/1.1\r\nHost: localhost\r\n\r\n")
            .unwrap();
        assert!(read_one_response(&mut s).starts_with("HTTP/1.1 200"));
    }
    let idle = Instant::now();
    // Past header_timeout the kept connection is still there...
    assert!(closed_within(&mut s, Duration::from_secs(3)).is_none());
    // ...and still serves a request.
    s.write_all(b"GET /kept HTTP/1.1\r\nHost: localhost\r\n\r\n")
        .unwrap();
    assert!(read_one_response(&mut s).starts_with("HTTP/1.1 200"));
    let idle_again = Instant::now();
    assert!(
        closed_within(&mut s, Duration::from_secs(10)).is_some(),
        "closed after idle_timeout"
    );
    let waited = idle_again.elapsed();
    assert!(
        waited >= Duration::from_millis(4500) && waited < Duration::from_secs(9),
        "closed {waited:?} after its last request ({:?} after the first idle wait)",
        idle.elapsed()
    );
}

/// A php-cgi site (a static pool of one worker): `pid.php` and `len.php`.
fn php_config(dir: &Path) -> String {
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

fn backend_errors(status: SocketAddr) -> String {
    let page = http(status, "GET", "/status", &[], b"").text();
    page.lines()
        .find(|l| l.starts_with("backend errors:"))
        .map(|l| l.trim_start_matches("backend errors:").trim().to_owned())
        .unwrap_or_else(|| panic!("no backend errors line in {page}"))
}

#[test]
fn a_stalled_http_body_gets_408_and_the_worker_lives_on() {
    let dir = shared_dir();
    write_file(dir.path(), "pid.php", "<?php echo getmypid();");
    write_file(
        dir.path(),
        "len.php",
        "<?php echo strlen(file_get_contents('php://input'));",
    );
    let corral = Corral::start(&php_config(dir.path()), 1);
    let addr = corral.http_addr();
    let status = corral.status_ready_addr();
    let pid = http(addr, "GET", "/pid.php", &[], b"");
    assert_eq!(pid.status, 200, "{}", corral.log());

    let mut s = connect(addr);
    s.write_all(
        b"POST /len.php HTTP/1.1\r\nHost: localhost\r\nContent-Length: 100\r\n\r\n0123456789",
    )
    .unwrap();
    let started = Instant::now();
    let answer = closed_within(&mut s, Duration::from_secs(10)).expect("cut off");
    let answer = String::from_utf8_lossy(&answer);
    assert!(
        answer.starts_with("HTTP/1.1 408"),
        "{answer:?}\n{}",
        corral.log()
    );
    assert!(
        started.elapsed() >= Duration::from_millis(1500)
            && started.elapsed() < Duration::from_secs(8),
        "{:?}",
        started.elapsed()
    );

    // The same worker answers the next requests, and nothing was counted against it.
    let r = http(addr, "POST", "/len.php", &[], b"0123456789");
    assert_eq!(r.text(), "10");
    assert_eq!(http(addr, "GET", "/pid.php", &[], b"").text(), pid.text());
    assert_eq!(backend_errors(status), "0");
    assert!(!corral.log().contains("killed"), "{}", corral.log());
}

#[test]
fn a_body_trickled_a_byte_within_each_body_timeout_is_cut_off_at_body_deadline() {
    let dir = shared_dir();
    write_file(
        dir.path(),
        "len.php",
        "<?php echo strlen(file_get_contents('php://input'));",
    );
    let corral = Corral::start(&php_config(dir.path()), 1);
    let addr = corral.http_addr();
    let mut s = connect(addr);
    s.write_all(b"POST /len.php HTTP/1.1\r\nHost: localhost\r\nContent-Length: 1000\r\n\r\n")
        .unwrap();
    // A byte every second, well within body_timeout (2s): only body_deadline (5s) ends it.
    let started = Instant::now();
    let answer = loop {
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "still reading the trickled body after {:?}\n{}",
            started.elapsed(),
            corral.log()
        );
        if s.write_all(b"x").is_err() {
            break closed_within(&mut s, Duration::from_secs(1)).unwrap_or_default();
        }
        if let Some(answer) = closed_within(&mut s, Duration::from_secs(1)) {
            break answer;
        }
    };
    let cut = started.elapsed();
    let answer = String::from_utf8_lossy(&answer);
    assert!(
        answer.starts_with("HTTP/1.1 408"),
        "{answer:?}\n{}",
        corral.log()
    );
    assert!(
        cut >= Duration::from_millis(4500) && cut < Duration::from_secs(12),
        "cut after {cut:?}"
    );
    assert!(corral.wait_log("body_deadline"), "{}", corral.log());
}

#[test]
fn the_per_client_cap_counts_ipv6_clients_too() {
    let dir = shared_dir();
    let null = null_backend(dir.path());
    let text = config(&null, "", &[("http", "max_connections_per_client = 2")]).replacen(
        "address = \"127.0.0.1:0\"",
        "address = \"[::1]:0\"",
        1,
    );
    let corral = Corral::start(&text, 1);
    let addr = corral.http_addr();
    assert!(addr.is_ipv6(), "{addr}");
    let mut conns: Vec<TcpStream> = Vec::new();
    for _ in 0..2 {
        conns.push(connect(addr));
        assert!(still_open(conns.last_mut().unwrap()));
    }
    // The third from ::1 makes room by closing the first.
    conns.push(connect(addr));
    assert!(
        closed_within(&mut conns[0], Duration::from_secs(3)).is_some(),
        "{}",
        corral.log()
    );
    assert!(still_open(&mut conns[1]) && still_open(&mut conns[2]));
    assert!(
        corral.wait_log("evicted_at_client_cap=1"),
        "{}",
        corral.log()
    );
}

/// FastCGI params for a request to the null backend.
fn fcgi_params(content_length: usize) -> Vec<(Bytes, Bytes)> {
    [
        (
            "REQUEST_METHOD",
            if content_length > 0 { "POST" } else { "GET" },
        ),
        ("REQUEST_URI", "/hello"),
        ("DOCUMENT_URI", "/hello"),
        ("QUERY_STRING", ""),
        ("SERVER_NAME", "localhost"),
        ("SERVER_PROTOCOL", "HTTP/1.1"),
        ("CONTENT_LENGTH", &content_length.to_string()),
    ]
    .iter()
    .map(|(n, v)| (Bytes::from(n.to_string()), Bytes::from(v.to_string())))
    .collect()
}

/// Reads records until request 1's END_REQUEST; false if the connection closed first.
fn fcgi_answered(s: &mut TcpStream) -> bool {
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut decoder = RecordDecoder::new();
    let mut buf = BytesMut::new();
    let mut chunk = [0u8; 4096];
    loop {
        while let Some(r) = decoder.decode(&mut buf).unwrap() {
            if r.kind == RecordType::EndRequest {
                return true;
            }
        }
        match s.read(&mut chunk) {
            Ok(0) | Err(_) => return false,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
    }
}

#[test]
fn fastcgi_front_times_its_params_its_idle_kept_connections_and_its_stdin() {
    let dir = shared_dir();
    let null = null_backend(dir.path());
    let corral = Corral::start(
        &config(
            &null,
            "",
            &[(
                "fastcgi",
                "header_timeout = \"3s\"\nidle_timeout = \"2s\"\nbody_timeout = \"2s\"",
            )],
        ),
        1,
    );
    let addr = corral.addr_of("Fastcgi");
    let status = corral.status_ready_addr();

    // PARAMS a byte every second, after a whole BEGIN_REQUEST: cut off after 3 s.
    let mut s = connect(addr);
    let mut begin = BytesMut::new();
    encode_begin_request(1, Role::Responder, true, &mut begin);
    s.write_all(&begin).unwrap();
    let mut params = BytesMut::new();
    encode_params(1, &fcgi_params(0), &mut params).unwrap();
    let cut = trickle(
        &mut s,
        &params,
        Duration::from_secs(1),
        Duration::from_secs(20),
    )
    .expect("slow PARAMS are cut off");
    assert!(
        cut >= Duration::from_millis(2500) && cut < Duration::from_secs(7),
        "{cut:?}"
    );

    // A whole request with KEEP_CONN is answered; the idle connection is closed after 2 s.
    let mut s = connect(addr);
    let mut request = begin.clone();
    request.extend_from_slice(&params);
    encode_stdin_end(1, &mut request);
    s.write_all(&request).unwrap();
    assert!(fcgi_answered(&mut s), "{}", corral.log());
    let idle = Instant::now();
    assert!(closed_within(&mut s, Duration::from_secs(8)).is_some());
    assert!(
        idle.elapsed() >= Duration::from_millis(1500) && idle.elapsed() < Duration::from_secs(6),
        "{:?}",
        idle.elapsed()
    );

    // STDIN that stalls after 3 of 10 bytes: the connection is closed after 2 s.
    let mut s = connect(addr);
    let mut stalled = begin.clone();
    encode_params(1, &fcgi_params(10), &mut stalled).unwrap();
    encode_stdin(1, b"abc", &mut stalled);
    s.write_all(&stalled).unwrap();
    let started = Instant::now();
    assert!(closed_within(&mut s, Duration::from_secs(8)).is_some());
    assert!(
        started.elapsed() >= Duration::from_millis(1500)
            && started.elapsed() < Duration::from_secs(6),
        "{:?}",
        started.elapsed()
    );

    // The backend was not blamed, and serves the next request.
    let mut s = connect(addr);
    s.write_all(&request).unwrap();
    assert!(fcgi_answered(&mut s), "{}", corral.log());
    assert_eq!(backend_errors(status), "0");
}

/// An SCGI request head for the null backend, as a netstring.
fn scgi_head(content_length: usize) -> Vec<u8> {
    let mut head = format!("CONTENT_LENGTH\0{content_length}\0SCGI\x001\0").into_bytes();
    head.extend_from_slice(
        b"REQUEST_METHOD\0POST\0REQUEST_URI\0/hello\0QUERY_STRING\0\0SERVER_NAME\0localhost\0",
    );
    let mut out = format!("{}:", head.len()).into_bytes();
    out.extend_from_slice(&head);
    out.push(b',');
    out
}

#[test]
fn an_scgi_body_trickled_within_each_body_timeout_is_cut_off_at_body_deadline() {
    let dir = shared_dir();
    let null = null_backend(dir.path());
    let corral = Corral::start(
        &config(
            &null,
            "",
            &[("scgi", "body_timeout = \"2s\"\nbody_deadline = \"4s\"")],
        ),
        1,
    );
    let mut s = connect(corral.addr_of("Scgi"));
    s.write_all(&scgi_head(1000)).unwrap();
    // A byte a second, within body_timeout: only body_deadline ends it.
    let cut = trickle(
        &mut s,
        &[b'x'; 1000],
        Duration::from_secs(1),
        Duration::from_secs(20),
    )
    .expect("the trickled body is cut off");
    assert!(
        cut >= Duration::from_millis(3500) && cut < Duration::from_secs(10),
        "cut after {cut:?}\n{}",
        corral.log()
    );
    assert!(corral.wait_log("within body_deadline"), "{}", corral.log());
}

#[test]
fn a_fastcgi_stdin_trickled_within_each_body_timeout_is_cut_off_at_body_deadline() {
    let dir = shared_dir();
    write_file(dir.path(), "pid.php", "<?php echo getmypid();");
    write_file(
        dir.path(),
        "len.php",
        "<?php echo strlen(file_get_contents('php://input'));",
    );
    let text = php_config(dir.path())
        .replace(
            "protocol = \"http\"",
            "protocol = \"fastcgi\"\nbody_timeout = \"1s\"\nbody_deadline = \"3s\"",
        )
        .replace("max = 1", "max = 1\nqueue_timeout = \"20s\"");
    let corral = Corral::start(&text, 1);
    let addr = corral.addr_of("Fastcgi");
    let status = corral.status_ready_addr();
    let script = |name: &str| dir.path().join(name);

    // Request 1 declares 1000 body bytes and takes the only worker; request 2, multiplexed
    // beside it with its whole (empty) body sent, waits in the queue for that worker.
    let mut s = connect(addr);
    let mut out = BytesMut::new();
    encode_begin_request(1, Role::Responder, true, &mut out);
    let post = cgi_params(
        "POST",
        &script("len.php"),
        "",
        &[("CONTENT_LENGTH", "1000")],
    );
    encode_params(1, &post, &mut out).unwrap();
    encode_begin_request(2, Role::Responder, true, &mut out);
    encode_params(2, &cgi_params("GET", &script("pid.php"), "", &[]), &mut out).unwrap();
    encode_stdin_end(2, &mut out);
    s.write_all(&out).unwrap();

    // A byte of request 1's body every half second, within body_timeout (1 s): only
    // body_deadline (3 s) ends it.
    let mut answers = Answers::default();
    let started = Instant::now();
    loop {
        assert!(
            started.elapsed() < Duration::from_secs(15),
            "still reading the trickled STDIN after {:?}\n{}",
            started.elapsed(),
            corral.log()
        );
        let mut byte = BytesMut::new();
        encode_stdin(1, b"x", &mut byte);
        s.write_all(&byte).unwrap();
        if answers.read_until_end(&mut s, 1, Duration::from_millis(500)) {
            break;
        }
        assert!(!answers.closed, "closed unanswered\n{}", corral.log());
    }
    let cut = started.elapsed();
    assert!(
        cut >= Duration::from_millis(2500) && cut < Duration::from_secs(8),
        "cut after {cut:?}\n{}",
        corral.log()
    );
    assert_eq!(
        cgi_status(&answers.stdout[&1]),
        408,
        "{:?}\n{}",
        answers.text(1),
        corral.log()
    );
    assert!(corral.wait_log("within body_deadline"), "{}", corral.log());

    // Only request 1 was ended: the worker it held is free, and request 2, on the same
    // connection, gets it and is answered.
    assert!(
        answers.read_until_end(&mut s, 2, Duration::from_secs(10)),
        "request 2 unanswered ({:?})\n{}",
        answers,
        corral.log()
    );
    let pid = answers.text(2);
    assert!(
        pid.lines().last().is_some_and(|p| p.parse::<u32>().is_ok()),
        "{pid:?}"
    );
    assert_eq!(backend_errors(status), "0");
    assert!(!corral.log().contains("killed"), "{}", corral.log());
}

#[test]
fn scgi_front_times_its_head_and_its_body() {
    let dir = shared_dir();
    let null = null_backend(dir.path());
    let corral = Corral::start(
        &config(
            &null,
            "",
            &[("scgi", "header_timeout = \"3s\"\nbody_timeout = \"2s\"")],
        ),
        1,
    );
    let addr = corral.addr_of("Scgi");
    let status = corral.status_ready_addr();

    let mut s = connect(addr);
    let cut = trickle(
        &mut s,
        &scgi_head(0),
        Duration::from_secs(1),
        Duration::from_secs(20),
    )
    .expect("a slow netstring head is cut off");
    assert!(
        cut >= Duration::from_millis(2500) && cut < Duration::from_secs(7),
        "{cut:?}"
    );

    let mut s = connect(addr);
    let mut request = scgi_head(10);
    request.extend_from_slice(b"abc");
    s.write_all(&request).unwrap();
    let started = Instant::now();
    let answer = closed_within(&mut s, Duration::from_secs(8)).expect("a stalled body is cut off");
    assert!(
        started.elapsed() >= Duration::from_millis(1500)
            && started.elapsed() < Duration::from_secs(6),
        "{:?}",
        started.elapsed()
    );
    assert!(answer.is_empty(), "{:?}", String::from_utf8_lossy(&answer));

    let mut s = connect(addr);
    let mut whole = scgi_head(3);
    whole.extend_from_slice(b"abc");
    s.write_all(&whole).unwrap();
    let answer = closed_within(&mut s, Duration::from_secs(10)).unwrap();
    assert!(
        String::from_utf8_lossy(&answer).starts_with("Status: 200"),
        "{:?}\n{}",
        String::from_utf8_lossy(&answer),
        corral.log()
    );
    assert_eq!(backend_errors(status), "0");
}

#[test]
fn the_status_listener_has_its_own_cap_and_timeouts() {
    let dir = shared_dir();
    let null = null_backend(dir.path());
    let corral = Corral::start(&config(&null, "", &[("http", "")]), 1);
    let status = corral.status_ready_addr();

    // A slow head is cut off after the status listener's 5 s.
    let mut s = connect(status);
    let cut = trickle(
        &mut s,
        b"GET /ping HTTP/1.1\r\nHost: localhost\r\n\r\n",
        Duration::from_secs(2),
        Duration::from_secs(20),
    )
    .expect("a slow status head is cut off");
    assert!(
        cut >= Duration::from_millis(4500) && cut < Duration::from_secs(10),
        "{cut:?}"
    );

    // More idle connections than its cap: the idle longest makes room, /ping answers.
    let mut idle: Vec<TcpStream> = Vec::new();
    for _ in 0..40 {
        idle.push(connect(status));
        thread::sleep(Duration::from_millis(5));
    }
    assert_eq!(http(status, "GET", "/ping", &[], b"").text(), "pong\n");
    assert!(closed_within(&mut idle[0], Duration::from_secs(3)).is_some());
    assert!(still_open(&mut idle[39]));
    // /metrics counts them: 40 idle connections and the /ping's are 9 beyond the cap of 32.
    let metrics = http(status, "GET", "/metrics", &[], b"").text();
    let evicted = metrics
        .lines()
        .find_map(|l| l.strip_prefix("corral_connections_evicted_total{listeners=\"status\"} "))
        .and_then(|n| n.parse::<u64>().ok())
        .unwrap_or_else(|| panic!("{metrics}"));
    assert_eq!(evicted, 9, "{metrics}");
    assert!(
        metrics.contains("corral_max_connections{listeners=\"status\"} 32"),
        "{metrics}"
    );
}

/// The soft and hard "Max open files" of process `pid`.
fn nofile_of(pid: &str) -> (String, String) {
    let limits = std::fs::read_to_string(format!("/proc/{pid}/limits")).unwrap();
    let line = limits
        .lines()
        .find(|l| l.starts_with("Max open files"))
        .unwrap();
    let mut fields = line["Max open files".len()..].split_whitespace();
    (
        fields.next().unwrap().to_owned(),
        fields.next().unwrap().to_owned(),
    )
}

#[test]
fn workers_get_back_the_file_limit_corral_started_with() {
    let dir = shared_dir();
    write_file(dir.path(), "pid.php", "<?php echo getmypid();");
    let corral = Corral::start_via(
        &["prlimit", "--nofile=1024:4096", "--"],
        &php_config(dir.path()),
        1,
    );
    let corral_pid = corral.pid().to_string();
    assert_eq!(nofile_of(&corral_pid), ("4096".into(), "4096".into()));
    let worker = http(corral.http_addr(), "GET", "/pid.php", &[], b"");
    assert_eq!(worker.status, 200, "{}", corral.log());
    assert_eq!(nofile_of(&worker.text()), ("1024".into(), "4096".into()));
}
