//! A request that waits in its pool's queue while its front gives up never reaches a worker
//! (decision 35; "Overflow" in docs/request-path.md). One real php-cgi worker is held busy by
//! `hold.php` (until the test creates `gate`); a second request queues behind it on a front
//! connection that then closes; once the gate opens, `mark.php`, which writes a marker file
//! when it runs, must not have run for it, and the next request is served as usual.
//!
//! FastCGI and SCGI: a plain connection whose request is wholly in is not read again, so the
//! gateway peeks at it once the slot comes. HTTP: hyper reads a busy connection for its end
//! and drops the request's future, which leaves the queue. A kept FastCGI connection that
//! stays open keeps its queued request.

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
use std::path::Path;
use std::thread;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use corral::protocols::fastcgi::{
    encode_begin_request, encode_params, encode_stdin_end, RecordDecoder, RecordType, Role,
};
use support::fastcgi::{cgi_status, nginx_params};
use support::peers;
use support::server::{http, pool_counter, Corral};

/// The log line of a request dropped because its front went away.
const GONE: &str = "the front closed while the request waited for a slot";

/// The status page's counter of those requests.
const COUNTER: &str = "front gone while queued";

/// corral with a FastCGI listener on a Unix socket beside `run` (nginx's usual way to reach
/// php-fpm: over TCP the FastCGI front reads the connection for its end anyway), SCGI and
/// HTTP listeners on TCP port 0, a status listener, an access log, and one php-cgi worker
/// serving `root`.
fn config(run: &Path, root: &Path, access: &Path) -> String {
    format!(
        r#"
[server]
runtime_dir = "{run}"
grace = "2s"
kill_timeout = "2s"
access_log = "{access}"

[[listen]]
address = "unix:{fcgi}"
protocol = "fastcgi"

[[listen]]
address = "127.0.0.1:0"
protocol = "scgi"

[[listen]]
address = "127.0.0.1:0"
protocol = "http"

[status]
address = "127.0.0.1:0"

[pools.php]
command = ["php-cgi"]
mode = "static"
max = 1
queue_timeout = "30s"

[[contexts]]
pool = "php"
root = "{root}"
"#,
        run = run.display(),
        root = root.display(),
        access = access.display(),
        fcgi = run.with_file_name("fcgi.sock").display(),
    )
}

struct Site {
    dir: tempfile::TempDir,
    corral: Corral,
    status: SocketAddr,
}

fn site() -> Site {
    let dir = peers::shared_dir();
    // Says it started (`started-TAG`), then holds its worker until `gate` exists.
    peers::write_file(
        dir.path(),
        "hold.php",
        "<?php file_put_contents(__DIR__ . '/started-' . basename($_GET['tag']), getmypid()); \
         for ($i = 0; $i < 3000 && !file_exists(__DIR__ . '/gate'); $i++) { usleep(10000); } \
         echo 'held ', $_GET['tag'];",
    );
    // Leaves `ran-TAG` behind when it runs.
    peers::write_file(
        dir.path(),
        "mark.php",
        "<?php file_put_contents(__DIR__ . '/ran-' . basename($_GET['tag']), getmypid()); \
         echo 'ran ', $_GET['tag'];",
    );
    let access = dir.path().join("access.log");
    let corral = Corral::start(&config(&dir.path().join("run"), dir.path(), &access), 3);
    let status = corral.status_ready_addr();
    Site {
        dir,
        corral,
        status,
    }
}

impl Site {
    fn exists(&self, name: &str) -> bool {
        self.dir.path().join(name).exists()
    }

    /// The params nginx sends for `/SCRIPT?tag=TAG`.
    fn params(&self, script: &str, tag: &str) -> Vec<(Bytes, Bytes)> {
        let uri = format!("/{script}?tag={tag}");
        nginx_params(self.dir.path(), &uri, &format!("/{script}"))
            .into_iter()
            .map(|(n, v)| {
                let v = if n == "QUERY_STRING" {
                    format!("tag={tag}")
                } else {
                    v
                };
                (Bytes::from(n), Bytes::from(v))
            })
            .collect()
    }

    /// A FastCGI connection with request 1 for `/SCRIPT?tag=TAG` written on it.
    fn fastcgi(&self, script: &str, tag: &str, keep_conn: bool) -> UnixStream {
        let mut s = UnixStream::connect(self.dir.path().join("fcgi.sock")).unwrap();
        let mut out = BytesMut::new();
        encode_begin_request(1, Role::Responder, keep_conn, &mut out);
        encode_params(1, &self.params(script, tag), &mut out).unwrap();
        encode_stdin_end(1, &mut out);
        s.write_all(&out).unwrap();
        s
    }

    /// An SCGI connection with the request for `/SCRIPT?tag=TAG` written on it.
    fn scgi(&self, script: &str, tag: &str) -> TcpStream {
        let mut s = TcpStream::connect(self.corral.addr_of("Scgi")).unwrap();
        let mut head = b"CONTENT_LENGTH\x000\x00SCGI\x001\x00".to_vec();
        for (n, v) in self.params(script, tag) {
            if n.as_ref() != b"CONTENT_LENGTH" {
                head.extend_from_slice(&n);
                head.push(0);
                head.extend_from_slice(&v);
                head.push(0);
            }
        }
        let mut out = format!("{}:", head.len()).into_bytes();
        out.extend_from_slice(&head);
        out.push(b',');
        s.write_all(&out).unwrap();
        s
    }

    /// Request 1's CGI status and text on a FastCGI connection (20 s at most).
    fn answer(s: &mut UnixStream) -> (u16, String) {
        s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        let mut decoder = RecordDecoder::new();
        let (mut buf, mut stdout) = (BytesMut::new(), Vec::new());
        loop {
            while let Some(r) = decoder.decode(&mut buf).unwrap() {
                match r.kind {
                    RecordType::Stdout => stdout.extend_from_slice(&r.content),
                    RecordType::EndRequest => {
                        let text = String::from_utf8_lossy(&stdout).into_owned();
                        return (cgi_status(&stdout), text);
                    }
                    _ => {}
                }
            }
            let mut chunk = [0u8; 16384];
            let n = s.read(&mut chunk).expect("an answer within 20 s");
            assert!(n > 0, "closed before FCGI_END_REQUEST");
            buf.extend_from_slice(&chunk[..n]);
        }
    }

    /// Holds the one worker with `hold.php?tag=TAG` on a FastCGI connection of its own,
    /// until `gate` exists; returns the thread that reads its answer.
    fn hold(&self, tag: &'static str) -> thread::JoinHandle<(u16, String)> {
        let mut s = self.fastcgi("hold.php", tag, false);
        let held = support::eventually(Duration::from_secs(20), || {
            self.exists(&format!("started-{tag}"))
        });
        assert!(held, "hold.php never ran:\n{}", self.corral.log());
        thread::spawn(move || Site::answer(&mut s))
    }

    /// Waits until `n` requests wait in the pool's queue.
    fn queued(&self, n: u64) {
        let seen = support::eventually(Duration::from_secs(10), || {
            pool_counter(self.status, "php", "listen queue") == n
        });
        assert!(seen, "never {n} queued:\n{}", self.corral.log());
    }

    fn open_gate(&self) {
        std::fs::write(self.dir.path().join("gate"), "").unwrap();
    }

    /// A request after the others is served by the worker as usual.
    fn served_after(&self, tag: &str) {
        let mut s = self.fastcgi("mark.php", tag, false);
        let (status, text) = Site::answer(&mut s);
        assert_eq!(status, 200, "{text}\n{}", self.corral.log());
        assert!(text.contains(&format!("ran {tag}")), "{text}");
        assert!(self.exists(&format!("ran-{tag}")));
    }

    /// The one request dropped while queued, `tag`, was counted, logged (found gone `how`)
    /// and written to the access log as aborted.
    fn gone_once(&self, tag: &str, how: &str) {
        assert_eq!(self.counter(), 1);
        assert!(self.corral.wait_log(GONE), "{}", self.corral.log());
        let log = self.corral.log();
        let line = log.lines().find(|l| l.contains(GONE)).unwrap();
        assert!(line.contains(how) && line.contains("waited="), "{line}");
        let access = self.dir.path().join("access.log");
        let logged = support::eventually(Duration::from_secs(5), || {
            std::fs::read_to_string(&access)
                .unwrap_or_default()
                .contains(&format!("tag={tag}"))
        });
        assert!(logged, "no access-log line for {tag}");
        let text = std::fs::read_to_string(&access).unwrap();
        let needle = format!("tag={tag}");
        let line = text.lines().find(|l| l.contains(&needle)).unwrap();
        assert!(
            line.contains(" 499 ") && line.contains("pid=-") && line.ends_with(" aborted"),
            "{line}"
        );
    }

    fn counter(&self) -> u64 {
        pool_counter(self.status, "php", COUNTER)
    }
}

/// nginx's plain `fastcgi_pass` gives up on a queued request (its client went away): it
/// closes the connection. The request is dropped when its slot comes, unsent, counted, logged
/// and written to the access log as aborted.
#[test]
fn a_queued_fastcgi_request_whose_connection_closed_never_reaches_the_worker() {
    let site = site();
    let held = site.hold("a");
    let queued = site.fastcgi("mark.php", "b", false);
    site.queued(1);
    drop(queued);
    site.open_gate();
    let (status, text) = held.join().unwrap();
    assert_eq!(status, 200, "{text}");
    // The queue is served in arrival order: once `c` ran, `b` was handled.
    site.served_after("c");
    assert!(!site.exists("ran-b"), "the abandoned request ran");
    assert!(
        site.corral.wait_log(GONE),
        "no line says the front went away:\n{}",
        site.corral.log()
    );
    let line = site
        .corral
        .log()
        .lines()
        .find(|l| l.contains(GONE))
        .unwrap()
        .to_owned();
    assert!(
        line.contains("pool=php") && line.contains("request_id=") && line.contains("waited="),
        "{line}"
    );
    assert_eq!(site.counter(), 1);
    // Its access-log line: 499, no worker, aborted (the log is written by its own task).
    let access = site.dir.path().join("access.log");
    let logged = support::eventually(Duration::from_secs(5), || {
        std::fs::read_to_string(&access)
            .unwrap_or_default()
            .contains("tag=b")
    });
    assert!(logged);
    let text = std::fs::read_to_string(&access).unwrap();
    let line = text.lines().find(|l| l.contains("tag=b")).unwrap();
    assert!(
        line.contains(" 499 ") && line.contains("pid=-") && line.ends_with(" aborted"),
        "{line}"
    );
}

/// The same through the SCGI front (nginx's `scgi_pass`).
#[test]
fn a_queued_scgi_request_whose_connection_closed_never_reaches_the_worker() {
    let site = site();
    let held = site.hold("a");
    let queued = site.scgi("mark.php", "b");
    site.queued(1);
    drop(queued);
    site.open_gate();
    assert_eq!(held.join().unwrap().0, 200);
    site.served_after("c");
    assert!(!site.exists("ran-b"), "the abandoned request ran");
    assert!(site.corral.wait_log(GONE), "{}", site.corral.log());
    assert_eq!(site.counter(), 1);
}

/// An HTTP client that closes its connection while its request is queued: hyper sees the
/// end of the busy connection and drops the request, which leaves the queue at once, and is
/// counted, logged and written to the access log as the peeked-at ones are.
#[test]
fn a_queued_http_request_whose_client_closed_never_reaches_the_worker() {
    let site = site();
    let held = site.hold("a");
    let mut client = TcpStream::connect(site.corral.addr_of("Http")).unwrap();
    client
        .write_all(b"GET /mark.php?tag=b HTTP/1.1\r\nHost: localhost\r\n\r\n")
        .unwrap();
    site.queued(1);
    drop(client);
    site.queued(0);
    site.open_gate();
    assert_eq!(held.join().unwrap().0, 200);
    let r = http(
        site.corral.addr_of("Http"),
        "GET",
        "/mark.php?tag=c",
        &[],
        b"",
    );
    assert_eq!(r.status, 200, "{}", site.corral.log());
    assert!(!site.exists("ran-b"), "the abandoned request ran");
    site.gone_once("b", "dropped by its front");
}

/// nginx's `fastcgi_keep_conn on`: a kept connection that stays open is no front gone,
/// however long its request waited; one that closes takes its queued request with it.
#[test]
fn a_kept_fastcgi_connection_keeps_its_queued_request_while_open() {
    let site = site();
    let held = site.hold("a");
    let mut kept = site.fastcgi("mark.php", "b", true);
    site.queued(1);
    site.open_gate();
    assert_eq!(held.join().unwrap().0, 200);
    let (status, text) = Site::answer(&mut kept);
    assert_eq!(status, 200, "{text}\n{}", site.corral.log());
    assert!(text.contains("ran b"), "{text}");
    assert!(site.exists("ran-b"));
    assert_eq!(site.counter(), 0);
    assert!(!site.corral.log().contains(GONE), "{}", site.corral.log());

    // Closed while its request waits: the request is gone with it.
    std::fs::remove_file(site.dir.path().join("gate")).unwrap();
    let held = site.hold("d");
    let kept = site.fastcgi("mark.php", "e", true);
    site.queued(1);
    drop(kept);
    site.open_gate();
    assert_eq!(held.join().unwrap().0, 200);
    site.served_after("f");
    assert!(!site.exists("ran-e"), "the abandoned request ran");
    site.gone_once("e", "dropped by its front");
}
