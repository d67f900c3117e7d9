//! Hostile request heads and backend responses on the `http` front listener, against real
//! php-cgi: smuggling set-ups (Transfer-Encoding other than `chunked`, beside Content-Length),
//! CONNECT, duplicate and mismatched Host, header names PHP would fold into another header's
//! variable, hop-by-hop headers and 1xx finals from the backend, and REMOTE_ADDR on a Unix
//! listener. Each case checks the status and that a good request beside it still succeeds.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing,
    missing_docs
)]

mod support;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::Duration;

use support::peers::{shared_dir, write_file};
use support::server::{http, parse_response, Corral, HttpResponse};
use support::weak::{read_until_closed, AT_ONCE};

struct Site {
    corral: Corral,
    dir: tempfile::TempDir,
    status: SocketAddr,
}

impl Site {
    fn addr(&self) -> SocketAddr {
        self.corral.http_addr()
    }

    fn unix(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// Sends `raw` as is and reads the answer up to the close, which must come at once:
    /// every case here either asks for the close or is refused with one.
    fn raw(&self, raw: &str) -> HttpResponse {
        let mut s = TcpStream::connect(self.addr()).unwrap();
        s.write_all(raw.as_bytes()).unwrap();
        parse_response(&read_until_closed(&mut s, AT_ONCE))
    }

    /// `accepted conn` of the pool, from the status page: requests that reached a worker.
    fn accepted(&self) -> u64 {
        let text = http(self.status, "GET", "/status", &[], b"").text();
        text.lines()
            .find_map(|l| l.strip_prefix("accepted conn:"))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or_else(|| panic!("no accepted conn in:\n{text}"))
    }

    fn good(&self) {
        let r = http(self.addr(), "GET", "/env.php", &[], b"");
        assert_eq!(r.status, 200, "{}", self.corral.log());
    }
}

fn site() -> Site {
    let dir = shared_dir();
    let root = dir.path().join("www");
    std::fs::create_dir_all(&root).unwrap();
    write_file(
        &root,
        "env.php",
        "<?php echo json_encode(['user' => $_SERVER['HTTP_X_AUTH_USER'] ?? null, \
         'addr' => $_SERVER['REMOTE_ADDR'] ?? null, 'https' => $_SERVER['HTTPS'] ?? null]);",
    );
    write_file(
        &root,
        "hop.php",
        "<?php header('Connection: close, X-Private'); header('X-Private: internal'); \
         header('Keep-Alive: timeout=5'); header('Upgrade: h2c'); header('X-Kept: yes'); \
         echo 'hop';",
    );
    write_file(
        &root,
        "early.php",
        "<?php header('Status: 101 Switching Protocols'); header('Upgrade: websocket'); echo 'x';",
    );
    write_file(
        &root,
        "info.php",
        "<?php header('Status: 103 Early Hints'); echo 'x';",
    );
    let config = format!(
        r#"
[server]
runtime_dir = "{run}"
grace = "2s"
kill_timeout = "2s"
log_level = "debug"

[[listen]]
address = "127.0.0.1:0"
protocol = "http"

[[listen]]
address = "unix:{plain}"
protocol = "http"

[[listen]]
address = "unix:{proxied}"
protocol = "http"
forwarded = "x-forwarded"

[[listen]]
address = "unix:{rfc}"
protocol = "http"
forwarded = "forwarded"

[status]
address = "127.0.0.1:0"

[pools.php]
command = ["php-cgi"]
mode = "static"
max = 2

[[contexts]]
root = "{root}"
pool = "php"
max_body = "64KiB"
"#,
        run = dir.path().join("run").display(),
        plain = dir.path().join("plain.sock").display(),
        proxied = dir.path().join("proxied.sock").display(),
        rfc = dir.path().join("rfc.sock").display(),
        root = root.display(),
    );
    let corral = Corral::start(&config, 4);
    let status = corral.status_ready_addr();
    let site = Site {
        corral,
        dir,
        status,
    };
    site.good();
    site
}

/// One request over a Unix socket; the answer read to EOF.
fn unix_request(path: &Path, raw: &str) -> HttpResponse {
    let mut s = UnixStream::connect(path).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    s.write_all(raw.as_bytes()).unwrap();
    let mut out = Vec::new();
    s.read_to_end(&mut out).unwrap();
    parse_response(&out)
}

#[test]
fn smuggling_heads_connect_and_hosts_are_refused() {
    let site = site();
    let cases: &[(&str, u16)] = &[
        ("CONNECT example.com:443 HTTP/1.1\r\nHost: example.com:443\r\n\r\n", 405),
        // chunked not last: the length cannot be known, so 400 and close (RFC 9112 §6.3).
        (
            "POST /env.php HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip\r\n\r\n",
            400,
        ),
        // Framed by chunked, but with a coding corral does not decode: 501 (RFC 9112 §6.1).
        (
            "POST /env.php HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip, chunked\r\n\r\n0\r\n\r\n",
            501,
        ),
        (
            "POST /env.php HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip\r\n\
             Transfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
            501,
        ),
        ("GET /env.php HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n", 400),
        ("GET /env.php HTTP/1.1\r\n\r\n", 400),
        (
            "GET http://other.example/env.php HTTP/1.1\r\nHost: x\r\n\r\n",
            400,
        ),
    ];
    for &(raw, status) in cases {
        let r = site.raw(raw);
        assert_eq!(r.status, status, "{raw:?}: {}", r.text());
        site.good();
    }
    // Content-Length beside chunked: framed by chunked, and the connection closes after the
    // answer, so what was smuggled after the body is never served as a second request.
    let mut s = TcpStream::connect(site.addr()).unwrap();
    s.write_all(
        b"POST /env.php HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\
          Transfer-Encoding: chunked\r\n\r\n0\r\n\r\nGET /hop.php HTTP/1.1\r\nHost: x\r\n\r\n",
    )
    .unwrap();
    let out = read_until_closed(&mut s, AT_ONCE);
    let out = String::from_utf8_lossy(&out);
    assert_eq!(out.matches("HTTP/1.1 ").count(), 1, "{out}");
    assert!(!out.contains("hop"), "{out}");
    // What is allowed still works: HTTP/1.0 without Host, an absolute-form target that
    // agrees with Host, and a plain chunked body.
    let r = site.raw("GET /env.php HTTP/1.0\r\n\r\n");
    assert_eq!(r.status, 200);
    let r = site.raw("GET http://x/env.php HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
    assert_eq!(r.status, 200);
    let r = site.raw(
        "POST /env.php HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\
         Transfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n",
    );
    assert_eq!(r.status, 200);
    assert!(
        site.corral.wait_log("only Transfer-Encoding: chunked"),
        "refusals are logged with their reason"
    );
}

#[test]
fn header_names_php_would_fold_are_dropped() {
    let site = site();
    let r = http(
        site.addr(),
        "GET",
        "/env.php",
        &[("X-Auth.User", "mallory")],
        b"",
    );
    assert_eq!(r.text(), r#"{"user":null,"addr":"127.0.0.1","https":null}"#);
    let r = http(
        site.addr(),
        "GET",
        "/env.php",
        &[("X-Auth User", "mallory")],
        b"",
    );
    // A space in a name is not even HTTP: refused before PHP.
    assert_eq!(r.status, 400);
    let r = http(
        site.addr(),
        "GET",
        "/env.php",
        &[("X-Auth-User", "alice")],
        b"",
    );
    assert_eq!(
        r.text(),
        r#"{"user":"alice","addr":"127.0.0.1","https":null}"#
    );
}

#[test]
fn backend_hop_by_hop_headers_and_1xx_finals_do_not_pass() {
    let site = site();
    let r = http(site.addr(), "GET", "/hop.php", &[], b"");
    assert_eq!(r.status, 200);
    assert_eq!(r.text(), "hop");
    assert_eq!(r.header("x-kept"), Some("yes"));
    for name in ["x-private", "keep-alive", "upgrade"] {
        assert_eq!(r.header(name), None, "{name} passed: {:?}", r.headers);
    }
    for script in ["/early.php", "/info.php"] {
        let r = http(site.addr(), "GET", script, &[], b"");
        assert_eq!(r.status, 502, "{script}");
        assert_eq!(r.header("upgrade"), None);
        site.good();
    }
    assert!(
        site.corral.wait_log("not a final status"),
        "{}",
        site.corral.log()
    );
}

#[test]
fn remote_addr_on_unix_listeners_comes_from_a_trusted_header_or_is_left_out() {
    let site = site();
    let get = |sock: &str, extra: &str| {
        unix_request(
            &site.unix(sock),
            &format!("GET /env.php HTTP/1.1\r\nHost: x\r\nConnection: close\r\n{extra}\r\n"),
        )
        .text()
    };
    assert_eq!(
        get("plain.sock", "X-Forwarded-For: 192.0.2.9\r\n"),
        r#"{"user":null,"addr":null,"https":null}"#,
        "no placeholder, and an untrusted header is ignored"
    );
    assert_eq!(
        get(
            "proxied.sock",
            "X-Forwarded-For: 203.0.113.5, 192.0.2.9\r\nX-Forwarded-Proto: https\r\n"
        ),
        r#"{"user":null,"addr":"192.0.2.9","https":"on"}"#,
        "the entry the trusted proxy added"
    );
    assert_eq!(
        get("proxied.sock", "X-Forwarded-For: not-an-address\r\n"),
        r#"{"user":null,"addr":null,"https":null}"#
    );
    assert_eq!(
        get(
            "rfc.sock",
            "Forwarded: for=203.0.113.5, for=\"[2001:db8::7]:4711\";proto=https\r\n"
        ),
        r#"{"user":null,"addr":"2001:db8::7","https":"on"}"#
    );
}

#[test]
fn bodies_over_max_body_get_413_before_any_worker() {
    let site = site();
    let big = vec![b'x'; 100 * 1024];
    let before = site.accepted();
    let r = http(site.addr(), "POST", "/env.php", &[], &big);
    assert_eq!(r.status, 413, "{}", r.text());
    assert_eq!(
        site.accepted(),
        before,
        "a 413 by Content-Length reached a worker"
    );
    site.good();
    let before = site.accepted();
    // Chunked: refused once the spool passes the limit.
    let mut raw = String::from(
        "POST /env.php HTTP/1.1\r\nHost: x\r\nConnection: close\r\nTransfer-Encoding: chunked\r\n\r\n",
    );
    for _ in 0..20 {
        raw.push_str(&format!("1000\r\n{}\r\n", "y".repeat(4096)));
    }
    raw.push_str("0\r\n\r\n");
    let r = site.raw(&raw);
    assert_eq!(r.status, 413);
    assert_eq!(site.accepted(), before, "a chunked 413 reached a worker");
    // A chunked upload to a missing script is a 404, not spooled first.
    let r = site.raw(
        "POST /missing.php HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\
         Transfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n",
    );
    assert_eq!(r.status, 404);
    assert_eq!(site.accepted(), before, "a 404 reached a worker");
    // Under the limit, both ways.
    let r = http(site.addr(), "POST", "/env.php", &[], &big[..60 * 1024]);
    assert_eq!(r.status, 200);
    let r = site.raw(
        "POST /env.php HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\
         Transfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n",
    );
    assert_eq!(r.status, 200);
    assert_eq!(
        site.accepted(),
        before + 2,
        "the two bodies under the limit reached a worker"
    );
    assert!(
        site.corral.wait_log("exceeds max_body"),
        "{}",
        site.corral.log()
    );
}
