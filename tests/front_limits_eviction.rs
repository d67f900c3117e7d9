//! Front connection limits against the real binary and real sockets: the raised file limit
//! (1,200 idle sockets under a soft limit of 1,024, and workers given back the limit corral
//! started with) and the connection caps (the server-wide and the per-client cap closing the
//! connection idle longest, the status listener's own cap and timeouts). Backends are
//! `corral null-backend --protocol fastcgi` and php-cgi. The phase timeouts of every
//! listener are in tests/front_limits.rs.
//!
//! "Idle longest" needs corral to count the connections in a known order: each is opened
//! once corral has accepted the one before (it holds one more descriptor), or once the one
//! it evicts is seen closed (tests/support/sync2.rs).

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing,
    missing_docs
)]

mod support;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use bytes::BytesMut;
use corral::protocols::fastcgi::{encode_begin_request, encode_params, encode_stdin_end, Role};
use tokio::time::Instant;

use support::fastcgi::Answers;
use support::peers::{cgi_params, shared_dir, write_file};
use support::server::{http, parse_response, Corral};
use support::sync2::{
    closed_within, config, connect, connect_in_order, fds, null_backend, php_config, still_open,
    trickle, wait_fds,
};

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
    // Accepted in order, so that "idle longest" is the first opened.
    let mut conns = connect_in_order(addr, corral.pid(), 20);
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

/// Sends one GET (request id 1) on a FastCGI connection, with FCGI_KEEP_CONN as asked, and
/// reads its answer to FCGI_END_REQUEST.
fn fastcgi_get(s: &mut TcpStream, keep_conn: bool, path: &str) -> Answers {
    let mut out = BytesMut::new();
    encode_begin_request(1, Role::Responder, keep_conn, &mut out);
    let params = cgi_params("GET", std::path::Path::new(path), "", &[]);
    encode_params(1, &params, &mut out).unwrap();
    encode_stdin_end(1, &mut out);
    s.write_all(&out).unwrap();
    let mut answers = Answers::default();
    assert!(
        answers.read_until_end(s, 1, Duration::from_secs(10)),
        "no FCGI_END_REQUEST for {path}"
    );
    answers
}

#[test]
fn an_idle_fastcgi_keep_conn_connection_is_closed_for_room() {
    // The FastCGI front watches the eviction only while it waits with no request in
    // progress: a kept connection that has served its request is the one a front server
    // (nginx `fastcgi_keep_conn`, an upstream keepalive pool) leaves idle.
    let dir = shared_dir();
    let null = null_backend(dir.path());
    let corral = Corral::start(
        &config(
            &null,
            "max_connections = 3",
            &[("fastcgi", "max_connections_per_client = 0")],
        ),
        1,
    );
    let addr = corral.addr_of("Fastcgi");
    let mut kept = connect_in_order(addr, corral.pid(), 3);
    // Served in order, so that the first is the one idle longest.
    for (i, s) in kept.iter_mut().enumerate() {
        let a = fastcgi_get(s, true, &format!("/kept-{i}"));
        assert!(
            !a.closed,
            "FCGI_KEEP_CONN connection {i} was closed after its request"
        );
        assert!(a.text(1).contains("200"), "{}", a.text(1));
    }
    let mut fourth = connect(addr);
    let a = fastcgi_get(&mut fourth, false, "/over-the-cap");
    assert!(a.text(1).contains("200"), "{}\n{}", a.text(1), corral.log());
    assert!(
        closed_within(&mut kept[0], Duration::from_secs(3)).is_some(),
        "the kept connection idle longest is closed\n{}",
        corral.log()
    );
    assert!(
        still_open(&mut kept[2]),
        "the newest kept connection stays open"
    );
    // The one left open still serves.
    let a = fastcgi_get(&mut kept[2], true, "/still-kept");
    assert!(!a.closed && a.text(1).contains("200"), "{}", a.text(1));
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
    let mut conns = connect_in_order(addr, corral.pid(), 4);
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
    let mut conns = connect_in_order(addr, corral.pid(), 2);
    assert!(still_open(&mut conns[0]) && still_open(&mut conns[1]));
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

    // More idle connections than its cap of 32, counted in order: the first 32 each once
    // accepted, then each further one closes the idle longest, the oldest of those left.
    let mut idle = connect_in_order(status, corral.pid(), 32);
    for i in 32..40 {
        idle.push(connect(status));
        assert!(
            closed_within(&mut idle[i - 32], Duration::from_secs(3)).is_some(),
            "connection {} not closed for connection {i}\n{}",
            i - 32,
            corral.log()
        );
        assert!(
            still_open(&mut idle[i - 31]),
            "connection {} closed too",
            i - 31
        );
    }
    // /ping makes room too, by closing the next oldest.
    assert_eq!(http(status, "GET", "/ping", &[], b"").text(), "pong\n");
    assert!(closed_within(&mut idle[8], Duration::from_secs(3)).is_some());
    assert!(still_open(&mut idle[9]) && still_open(&mut idle[39]));
    // /metrics, asked on the newest idle connection (a new one would make room again),
    // counts them: 40 idle connections and the /ping's are 9 beyond the cap.
    let newest = &mut idle[39];
    newest
        .write_all(b"GET /metrics HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
        .unwrap();
    newest
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let mut raw = Vec::new();
    newest.read_to_end(&mut raw).unwrap();
    let metrics = parse_response(&raw).text();
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
