//! What a client names in its request head is checked before it routes the request or reaches
//! a script (ARCHITECTURE.md, "The request path in one page"): a Host that is no host name is a 400 on the
//! HTTP front and on the FastCGI front (as nginx refuses it), a context's `server_name` pins
//! SERVER_NAME whatever Host said, a FastCGI front's CONTENT_LENGTH that is no length
//! (`-1`) is refused, and on a wildcard listener SERVER_ADDR is the address the client
//! reached. Real php-cgi behind both fronts.

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
use std::path::{Path, PathBuf};
use std::time::Duration;

use support::fastcgi::fastcgi_status;
use support::peers::{shared_dir, write_file};
use support::server::{http, parse_response, Corral};

struct Site {
    corral: Corral,
    dir: tempfile::TempDir,
}

impl Site {
    fn root(&self) -> PathBuf {
        self.dir.path().join("www")
    }

    fn fastcgi_socket(&self) -> PathBuf {
        self.dir.path().join("fcgi.sock")
    }

    /// A FastCGI request for `/name.php` as nginx sends it, with `extra` set over the
    /// defaults.
    fn fastcgi(&self, extra: &[(&'static str, &str)]) -> (u16, String) {
        let mut params = fcgi_params(&self.root());
        for (name, value) in extra {
            params.retain(|(n, _)| n != name);
            params.push((name, value.to_string()));
        }
        let (status, out) = fastcgi_status(&self.fastcgi_socket(), &params);
        let text = String::from_utf8_lossy(&out).into_owned();
        let body = text.split("\r\n\r\n").nth(1).unwrap_or_default().to_owned();
        (status, body)
    }
}

fn fcgi_params(root: &Path) -> Vec<(&'static str, String)> {
    vec![
        ("REQUEST_METHOD", "GET".into()),
        ("SCRIPT_NAME", "/name.php".into()),
        ("REQUEST_URI", "/name.php".into()),
        ("DOCUMENT_URI", "/name.php".into()),
        ("DOCUMENT_ROOT", root.display().to_string()),
        (
            "SCRIPT_FILENAME",
            root.join("name.php").display().to_string(),
        ),
        ("SERVER_PROTOCOL", "HTTP/1.1".into()),
        ("GATEWAY_INTERFACE", "CGI/1.1".into()),
        ("REMOTE_ADDR", "127.0.0.1".into()),
        ("SERVER_NAME", "localhost".into()),
        ("SERVER_PORT", "80".into()),
        ("HTTP_HOST", "localhost".into()),
        ("CONTENT_LENGTH", String::new()),
        ("REDIRECT_STATUS", "200".into()),
    ]
}

fn site() -> Site {
    site_on("127.0.0.1:0")
}

/// The site with its HTTP listener on `listen`.
fn site_on(listen: &str) -> Site {
    let dir = shared_dir();
    let root = dir.path().join("www");
    std::fs::create_dir_all(&root).unwrap();
    write_file(
        &root,
        "name.php",
        "<?php echo $_SERVER['SERVER_NAME'], '|', strlen(file_get_contents('php://input'));",
    );
    let config = format!(
        r#"
[server]
runtime_dir = "{run}"
grace = "2s"
kill_timeout = "2s"

[[listen]]
address = "{listen}"
protocol = "http"

[[listen]]
address = "unix:{fcgi}"
protocol = "fastcgi"

[pools.php]
command = ["php-cgi"]
mode = "static"
max = 1

[[contexts]]
host = "pinned.example"
server_name = "www.pinned.example"
root = "{root}"
pool = "php"

[[contexts]]
root = "{root}"
pool = "php"
"#,
        run = dir.path().join("run").display(),
        fcgi = dir.path().join("fcgi.sock").display(),
        root = root.display(),
    );
    let corral = Corral::start(&config, 2);
    Site { corral, dir }
}

/// One HTTP/1.1 request whose Host line is `host` byte for byte; the status.
fn status_with_host(addr: SocketAddr, host: &[u8]) -> (u16, String) {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    let mut head = b"GET /name.php HTTP/1.1\r\nConnection: close\r\nHost: ".to_vec();
    head.extend_from_slice(host);
    head.extend_from_slice(b"\r\n\r\n");
    s.write_all(&head).unwrap();
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).unwrap();
    let r = parse_response(&raw);
    (r.status, r.text())
}

/// Host values nginx refuses too, each with what makes it no host name.
const BAD_HOSTS: &[&[u8]] = &[
    b"a/b",
    b"evil.example/../x",
    b"a\\b",
    b"a..b",
    b"..",
    b".example.com",
    b"",
    b"example.com:8x",
    b"[::1",
    b"a\x01b",
    b"a\x00b",
];

#[test]
fn the_http_front_refuses_a_host_that_is_no_host_name() {
    let site = site();
    let addr = site.corral.http_addr();
    for host in BAD_HOSTS {
        let (status, body) = status_with_host(addr, host);
        assert_eq!(
            status,
            400,
            "Host {:?}: {body}\n{}",
            host.escape_ascii().to_string(),
            site.corral.log()
        );
        assert!(!body.contains('|'), "no script ran for {host:?}: {body}");
    }
    // What is refused is named in the log.
    // The log is read on another thread: a line may trail the answer.
    assert!(
        site.corral.wait_log("Host holds a '/'"),
        "{}",
        site.corral.log()
    );
    assert!(site.corral.wait_log("Host has an empty label"));
    // Ordinary hosts still pass, the absolute form with its final dot too.
    for host in [
        &b"localhost"[..],
        b"localhost:8080",
        b"example.com.",
        b"[::1]:80",
    ] {
        assert_eq!(status_with_host(addr, host).0, 200, "{host:?}");
    }
}

#[test]
fn the_fastcgi_front_refuses_an_http_host_that_is_no_host_name() {
    let site = site();
    for host in BAD_HOSTS.iter().filter(|h| !h.is_empty()) {
        let host = String::from_utf8_lossy(host).into_owned();
        let (status, body) = site.fastcgi(&[("HTTP_HOST", &host)]);
        assert_eq!(
            status,
            400,
            "HTTP_HOST {host:?}: {body}\n{}",
            site.corral.log()
        );
        assert!(!body.contains('|'), "no script ran for {host:?}: {body}");
    }
    assert_eq!(site.fastcgi(&[("HTTP_HOST", "localhost")]).0, 200);
}

#[test]
fn a_context_server_name_is_what_scripts_see_whatever_the_host() {
    let site = site();
    let addr = site.corral.http_addr();
    let pinned = http(
        addr,
        "GET",
        "/name.php",
        &[("Host", "PINNED.example:8080")],
        b"",
    );
    assert_eq!(
        pinned.text(),
        "www.pinned.example|0",
        "{}",
        site.corral.log()
    );
    // Without a pin, SERVER_NAME is the client's Host, as nginx's `$host` would make it.
    let open = http(addr, "GET", "/name.php", &[("Host", "other.example")], b"");
    assert_eq!(open.text(), "other.example|0");
    // The FastCGI front: the pin wins over the front server's SERVER_NAME too.
    let (status, body) = site.fastcgi(&[
        ("HTTP_HOST", "pinned.example"),
        ("SERVER_NAME", "chosen-by-client.example"),
    ]);
    assert_eq!((status, body.as_str()), (200, "www.pinned.example|0"));
}

#[test]
fn a_fastcgi_content_length_that_is_no_length_is_refused() {
    let site = site();
    for bad in ["-1", "+5", "0x10", "18446744073709551616"] {
        let (status, body) = site.fastcgi(&[("CONTENT_LENGTH", bad)]);
        assert_eq!(
            status,
            400,
            "CONTENT_LENGTH {bad}: {body}\n{}",
            site.corral.log()
        );
        assert!(!body.contains('|'), "no script ran for {bad}: {body}");
    }
    assert!(
        site.corral
            .wait_log(r#"Content-Length "-1" is not a decimal number"#),
        "{}",
        site.corral.log()
    );
    assert_eq!(
        site.fastcgi(&[("CONTENT_LENGTH", "0")]),
        (200, "localhost|0".into())
    );
}

#[test]
fn server_addr_is_the_address_the_client_reached_on_a_wildcard_listener() {
    // nginx's `$server_addr`: on a listener bound to 0.0.0.0 or ::, the connection's own
    // local address, not the wildcard.
    let site = site_on("0.0.0.0:0");
    write_file(
        &site.root(),
        "addr.php",
        "<?php echo $_SERVER['SERVER_ADDR'], '|', $_SERVER['SERVER_PORT'];",
    );
    let corral = &site.corral;
    let port = corral.http_addr().port();
    for _ in 0..2 {
        let r = http(
            SocketAddr::from(([127, 0, 0, 1], port)),
            "GET",
            "/addr.php",
            &[("Host", "localhost")],
            b"",
        );
        assert_eq!(r.text(), format!("127.0.0.1|{port}"), "{}", corral.log());
    }
    // Another local address of the same host, when it has one: that one.
    let other = std::process::Command::new("hostname")
        .arg("-I")
        .output()
        .ok();
    let other = other
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .and_then(|s| {
            s.split_whitespace()
                .find_map(|a| a.parse::<std::net::Ipv4Addr>().ok())
        });
    if let Some(ip) = other {
        let r = http(
            SocketAddr::from((ip, port)),
            "GET",
            "/addr.php",
            &[("Host", "localhost")],
            b"",
        );
        assert_eq!(r.text(), format!("{ip}|{port}"), "{}", corral.log());
    }
}
