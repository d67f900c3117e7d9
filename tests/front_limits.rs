//! Front phase timeouts against the real binary and real sockets, on every listener: a head
//! sent a byte at a time, a kept-alive connection left idle, a body that stalls and one
//! trickled within each `body_timeout` until `body_deadline`, on HTTP, FastCGI and SCGI. The
//! connection caps are in tests/front_limits_eviction.rs. Backends are
//! `corral null-backend --protocol fastcgi` and, where a worker must survive, php-cgi.
//!
//! The client's pace (a byte every second) and the waits it causes are what these tests
//! measure, so they are timed; everything else waits on an event (tests/support/sync2.rs).

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
use std::thread;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use corral::protocols::fastcgi::{
    encode_begin_request, encode_params, encode_stdin, encode_stdin_end, RecordDecoder, RecordType,
    Role,
};
use tokio::time::Instant;

use support::fastcgi::{cgi_status, Answers};
use support::peers::{cgi_params, shared_dir, write_file};
use support::server::{http, Corral};
use support::sync2::{
    backend_errors, closed_within, config, connect, fastcgi_log_marker, fds, http_log_marker,
    null_backend, php_config, trickle, wait_fds,
};

#[test]
fn an_http_head_sent_a_byte_every_two_seconds_is_cut_off() {
    let dir = shared_dir();
    let null = null_backend(dir.path());
    let corral = Corral::start(
        &config(&null, "header_timeout = \"3s\"", &[("http", "")]),
        1,
    );
    let addr = corral.http_addr();
    let pid = corral.pid();
    let base = fds(pid);
    let mut slow = connect(addr);
    // Another request, once corral holds the slow connection: answered while that head is
    // still coming in.
    let beside = thread::spawn(move || {
        assert!(
            wait_fds(pid, base + 1) > base,
            "the slow connection was never accepted"
        );
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
    // No worker was killed: a line about it would be in the log before this marker's.
    http_log_marker(&corral, addr, "after-the-408");
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
    // No worker was killed: a line about it would be in the log before this marker's.
    fastcgi_log_marker(&corral, addr, dir.path(), "after-the-deadline");
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
