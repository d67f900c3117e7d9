//! HTTP/1.0 clients on corral's `http` listener, with a real php-cgi pool: HTTP/1.0 has no
//! chunked coding, so a keep-alive answer needs a Content-Length. php-cgi gives none; corral
//! reads a small body whole and sends its length (the connection is kept), and ends a long or
//! slow one with the connection, saying `Connection: close`. `ab -k` (HTTP/1.0 keep-alive)
//! gets all its requests answered; HTTP/1.1 answers are still chunked, not buffered.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing,
    missing_docs
)]

mod support;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use support::peers;
use support::server::Corral;

fn config(run: &Path, root: &Path) -> String {
    format!(
        r#"
[server]
runtime_dir = "{run}"

[[listen]]
address = "127.0.0.1:0"
protocol = "http"

[pools.php]
command = ["php-cgi"]
mode = "static"
max = 4

[[contexts]]
pool = "php"
root = "{root}"
"#,
        run = run.display(),
        root = root.display()
    )
}

/// corral with the test scripts, and the temp dir they live in.
fn start() -> (Corral, tempfile::TempDir) {
    let dir = peers::shared_dir();
    peers::write_file(dir.path(), "hello.php", "<?php echo 'Hello, world';");
    // 200 KiB, flushed as it goes: more than corral reads before the head.
    peers::write_file(
        dir.path(),
        "big.php",
        "<?php for ($i = 0; $i < 200; $i++) { echo str_repeat('x', 1024); flush(); }",
    );
    // A first part at once (past PHP's own output buffer), the rest once the test creates
    // `gate`, which it does only after reading the first part: streamed, not held back.
    peers::write_file(
        dir.path(),
        "slow.php",
        "<?php while (ob_get_level()) { ob_end_flush(); } echo 'first '; flush(); \
         for ($i = 0; $i < 3000 && !file_exists(__DIR__ . '/gate'); $i++) { usleep(10000); } \
         echo file_exists(__DIR__ . '/gate') ? 'second' : 'late';",
    );
    let corral = Corral::start(&config(&dir.path().join("run"), dir.path()), 1);
    (corral, dir)
}

/// One response read off a connection that may stay open: the head, then the body by its
/// Content-Length, or to EOF without one.
struct Answer {
    status_line: String,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
}

impl Answer {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }
}

fn read_answer(r: &mut BufReader<TcpStream>) -> Answer {
    let mut status_line = String::new();
    r.read_line(&mut status_line).unwrap();
    let mut headers = Vec::new();
    loop {
        let mut line = String::new();
        r.read_line(&mut line).unwrap();
        let line = line.trim_end();
        if line.is_empty() {
            break;
        }
        let (n, v) = line.split_once(':').unwrap();
        headers.push((n.trim().to_ascii_lowercase(), v.trim().to_owned()));
    }
    let mut a = Answer {
        status_line: status_line.trim_end().to_owned(),
        headers,
        body: Vec::new(),
    };
    match a
        .header("content-length")
        .map(|v| v.parse::<usize>().unwrap())
    {
        Some(n) => {
            a.body = vec![0; n];
            r.read_exact(&mut a.body).unwrap();
        }
        None => {
            r.read_to_end(&mut a.body).unwrap();
        }
    }
    a
}

fn connect(addr: SocketAddr) -> (TcpStream, BufReader<TcpStream>) {
    let s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    let r = BufReader::new(s.try_clone().unwrap());
    (s, r)
}

#[test]
fn an_http10_keep_alive_answer_has_a_length_and_the_connection_stays_open() {
    let (corral, _dir) = start();
    let (mut s, mut r) = connect(corral.http_addr());
    for i in 0..3 {
        write!(
            s,
            "GET /hello.php?i={i} HTTP/1.0\r\nHost: localhost\r\nConnection: keep-alive\r\n\r\n"
        )
        .unwrap();
        let a = read_answer(&mut r);
        assert_eq!(a.status_line, "HTTP/1.0 200 OK", "{}", corral.log());
        assert_eq!(a.header("content-length"), Some("12"), "{:?}", a.headers);
        assert_eq!(
            a.header("connection")
                .map(str::to_ascii_lowercase)
                .as_deref(),
            Some("keep-alive")
        );
        assert_eq!(a.body, b"Hello, world");
    }
    // Without keep-alive the answer ends with the connection, as HTTP/1.0 says.
    let (mut s, mut r) = connect(corral.http_addr());
    write!(s, "GET /hello.php HTTP/1.0\r\n\r\n").unwrap();
    let a = read_answer(&mut r);
    assert_eq!(a.status_line, "HTTP/1.0 200 OK");
    assert_eq!(a.body, b"Hello, world");
    assert_ne!(
        a.header("connection")
            .map(str::to_ascii_lowercase)
            .as_deref(),
        Some("keep-alive")
    );
}

#[test]
fn a_long_or_slow_http10_answer_says_connection_close() {
    let (corral, dir) = start();
    let (mut s, mut r) = connect(corral.http_addr());
    write!(
        s,
        "GET /big.php HTTP/1.0\r\nHost: localhost\r\nConnection: keep-alive\r\n\r\n"
    )
    .unwrap();
    let a = read_answer(&mut r);
    assert_eq!(a.status_line, "HTTP/1.0 200 OK", "{}", corral.log());
    assert_eq!(a.header("content-length"), None, "{:?}", a.headers);
    assert_eq!(a.header("connection"), Some("close"), "{:?}", a.headers);
    assert_eq!(a.body.len(), 200 * 1024, "read to the close");
    assert!(a.body.iter().all(|&b| b == b'x'));

    // The first part of a slow answer arrives before the rest exists: the script writes the
    // rest only once the gate is open, and the test opens it only after reading the first
    // part (a held-back head would leave it shut, and the answer "late").
    let (mut s, mut r) = connect(corral.http_addr());
    write!(
        s,
        "GET /slow.php HTTP/1.0\r\nHost: localhost\r\nConnection: keep-alive\r\n\r\n"
    )
    .unwrap();
    let mut head = String::new();
    loop {
        let mut line = String::new();
        r.read_line(&mut line).unwrap();
        assert!(!line.is_empty(), "closed in the head: {head}");
        head.push_str(&line);
        if line == "\r\n" {
            break;
        }
    }
    let mut first = [0u8; 6];
    r.read_exact(&mut first).unwrap();
    assert_eq!(&first, b"first ", "{head}");
    std::fs::write(dir.path().join("gate"), "").unwrap();
    let mut rest = Vec::new();
    r.read_to_end(&mut rest).unwrap();
    assert_eq!(String::from_utf8_lossy(&rest), "second", "{head}");
    assert!(head.starts_with("HTTP/1.0 200 OK\r\n"), "{head}");
    assert!(
        head.to_ascii_lowercase().contains("connection: close\r\n"),
        "{head}"
    );
}

#[test]
fn http11_answers_are_still_chunked() {
    let (corral, _dir) = start();
    let (mut s, mut r) = connect(corral.http_addr());
    write!(s, "GET /hello.php HTTP/1.1\r\nHost: localhost\r\n\r\n").unwrap();
    let mut status = String::new();
    r.read_line(&mut status).unwrap();
    assert_eq!(status, "HTTP/1.1 200 OK\r\n", "{}", corral.log());
    let mut head = Vec::new();
    loop {
        let mut line = String::new();
        r.read_line(&mut line).unwrap();
        if line == "\r\n" {
            break;
        }
        head.push(line.to_ascii_lowercase());
    }
    assert!(
        head.contains(&"transfer-encoding: chunked\r\n".to_owned()),
        "{head:?}"
    );
}

/// ApacheBench's keep-alive mode speaks HTTP/1.0 with `Connection: keep-alive`: every one of
/// 200 requests from 4 clients is answered, all on kept connections.
#[test]
fn ab_keep_alive_gets_every_answer() {
    let (corral, _dir) = start();
    let url = format!("http://{}/hello.php", corral.http_addr());
    let out = Command::new("ab")
        .args(["-k", "-n", "200", "-c", "4", "-s", "20", &url])
        .output()
        .expect("run ab (apache2-utils)");
    let text = String::from_utf8_lossy(&out.stdout);
    let field = |name: &str| -> u64 {
        text.lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.split_whitespace().next())
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| {
                panic!(
                    "no {name:?} in ab's output:\n{text}\n{}\n{}",
                    String::from_utf8_lossy(&out.stderr),
                    corral.log()
                )
            })
    };
    assert_eq!(field("Complete requests:"), 200, "{text}");
    assert_eq!(field("Failed requests:"), 0, "{text}\n{}", corral.log());
    assert_eq!(field("Keep-Alive requests:"), 200, "{text}");
}
