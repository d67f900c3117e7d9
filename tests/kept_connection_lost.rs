//! A kept backend connection that the backend drops while it is idle, found out only as the
//! next request goes out on it: scripted FastCGI and LSAPI backends (fault injection: a real
//! worker does this only when it exits just then) that answer one request per connection,
//! then either shut their end of it (the next request's first write meets a broken pipe,
//! as when a worker closed the connection between corral's checkout and its write; the
//! checkout's EOF test cannot see a read shutdown, so this case is deterministic) or read
//! the next request and close without answering. corral sends the request again on a
//! fresh connection when that is safe (a body it still has, and not one byte written), and
//! answers 502 otherwise. And a real php-cgi worker killed while it runs a request that came
//! on a kept connection: that request fails (it ran), and the worker is out of rotation at
//! once, its process exiting.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing,
    missing_docs
)]

mod support;

use std::io::Write;
use std::net::Shutdown;
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::Duration;

use bytes::BytesMut;
use corral::protocols::fastcgi::RequestDecoder as FcgiDecoder;
use corral::protocols::lsapi::RequestDecoder as LsapiDecoder;
use corral::protocols::Limits;
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use support::peers;
use support::scripted::{
    self, fastcgi_answer, read_fastcgi, read_lsapi, OneServer, Proto, Request,
};
use support::server::{http, Corral};

/// What the backend does with the second request on a connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Then {
    /// Shuts its reading end: the next request cannot be written (a broken pipe).
    Gone,
    /// Reads it whole, then closes without answering: a clean close.
    Close,
}

#[derive(Default)]
struct Seen {
    connections: AtomicUsize,
    answered: AtomicUsize,
}

/// The answer: which connection served it, then the method and body it got.
fn answer_text(connection: usize, request: &Request) -> Vec<u8> {
    let mut text = format!("{connection} ").into_bytes();
    text.extend_from_slice(&request.method);
    text.push(b' ');
    text.extend_from_slice(&request.body);
    text
}

fn serve(mut s: UnixStream, proto: Proto, then: Then, seen: &Seen) {
    let connection = seen.connections.fetch_add(1, Ordering::SeqCst) + 1;
    let mut buf = BytesMut::new();
    let mut out = BytesMut::new();
    match proto {
        Proto::FastCgi => {
            let mut dec = FcgiDecoder::new(&Limits::DEFAULT);
            let Some((id, request)) = read_fastcgi(&mut s, &mut dec, &mut buf) else {
                return;
            };
            let mut cgi = b"Status: 200 OK\r\nContent-Type: text/plain\r\n\r\n".to_vec();
            cgi.extend_from_slice(&answer_text(connection, &request));
            fastcgi_answer(id, &cgi, &mut out);
            seen.answered.fetch_add(1, Ordering::SeqCst);
            gone_before_answer(&s, then);
            s.write_all(&out).unwrap();
            dec.finish(id);
            if then == Then::Close {
                let _ = read_fastcgi(&mut s, &mut dec, &mut buf);
            }
        }
        Proto::Lsapi => {
            let mut dec = LsapiDecoder::new(&Limits::DEFAULT);
            let Some((enc, request)) = read_lsapi(&mut s, &mut dec, &mut buf) else {
                return;
            };
            enc.header(200, &[("Content-Type", "text/plain")], &mut out)
                .unwrap();
            enc.stream(&answer_text(connection, &request), &mut out);
            enc.end(&mut out);
            seen.answered.fetch_add(1, Ordering::SeqCst);
            gone_before_answer(&s, then);
            s.write_all(&out).unwrap();
            if then == Then::Close {
                let _ = read_lsapi(&mut s, &mut dec, &mut buf);
            }
        }
    }
    if then == Then::Gone {
        // Held (closing it would let corral see an EOF) until corral has moved on: it opened
        // a later connection, for the request sent again or for the next one.
        support::eventually(Duration::from_secs(20), || {
            seen.connections.load(Ordering::SeqCst) > connection
        });
    }
}

/// With `Then::Gone`, shuts the reading end before the answer goes out: the connection still
/// looks open from corral's side (no EOF to read), but its next write is refused. Done after
/// the answer, it could race the next request, which corral may write as soon as it has the
/// answer.
fn gone_before_answer(s: &UnixStream, then: Then) {
    if then == Then::Gone {
        s.shutdown(Shutdown::Read).unwrap();
    }
}

/// A corral with one pool of one server (so one kept connection at most), and one context
/// with `context` added.
fn corral_for(dir: &Path, proto: Proto, then: Then, context: &str) -> (Corral, Arc<Seen>) {
    let socket = dir.join("backend.sock");
    let seen = Arc::new(Seen::default());
    scripted::unix_backend(&socket, &seen, move |s, seen| serve(s, proto, then, seen));
    let one = OneServer {
        context,
        ..OneServer::unix(proto, &socket)
    };
    (one.start(dir), seen)
}

fn get(corral: &Corral, method: &str, body: &[u8]) -> (u16, String) {
    scripted::ask(corral, method, body)
}

fn closed_kept_connection_is_retried(proto: Proto) {
    let dir = tempfile::tempdir().unwrap();
    let (corral, seen) = corral_for(dir.path(), proto, Then::Gone, "");
    assert_eq!(
        get(&corral, "GET", b""),
        (200, "1 GET ".into()),
        "{}",
        corral.log()
    );
    // The kept connection is found closed as this request goes out on it: sent again on a
    // fresh one, the request succeeds.
    assert_eq!(
        get(&corral, "GET", b""),
        (200, "2 GET ".into()),
        "{}",
        corral.log()
    );
    // A POST's buffered body is sent again whole: the backend got none of the first try.
    assert_eq!(
        get(&corral, "POST", b"hello body"),
        (200, "3 POST hello body".into()),
        "{}",
        corral.log()
    );
    assert_eq!(seen.answered.load(Ordering::SeqCst), 3);
    assert_eq!(seen.connections.load(Ordering::SeqCst), 3);
    // The log is read on another thread: the line may trail the answer.
    assert!(
        corral.wait_log("sending the request again"),
        "{}",
        corral.log()
    );
}

#[test]
fn a_fastcgi_connection_closed_while_kept_is_retried_on_a_fresh_one() {
    closed_kept_connection_is_retried(Proto::FastCgi);
}

#[test]
fn an_lsapi_connection_closed_while_kept_is_retried_on_a_fresh_one() {
    closed_kept_connection_is_retried(Proto::Lsapi);
}

/// A body streamed from the client as it was sent cannot be sent twice: 502, as before.
#[test]
fn a_streamed_body_is_not_sent_again() {
    let dir = tempfile::tempdir().unwrap();
    let (corral, seen) = corral_for(
        dir.path(),
        Proto::FastCgi,
        Then::Gone,
        "request_buffering = false",
    );
    assert_eq!(
        get(&corral, "GET", b""),
        (200, "1 GET ".into()),
        "{}",
        corral.log()
    );
    let (status, _) = get(&corral, "POST", b"streamed");
    assert_eq!(status, 502, "{}", corral.log());
    assert_eq!(seen.answered.load(Ordering::SeqCst), 1);
    // The server stays in rotation: the next request gets a fresh connection and succeeds.
    assert_eq!(get(&corral, "GET", b"").0, 200, "{}", corral.log());
}

/// A clean close before any answer follows a backend that read the whole request: it may
/// have run it, so a POST is not sent again (a 502), and the server stays in rotation. (A
/// GET would be: tests/kept_connection_resend.rs.)
#[test]
fn after_a_clean_close_the_request_is_not_sent_again() {
    let dir = tempfile::tempdir().unwrap();
    let (corral, seen) = corral_for(dir.path(), Proto::Lsapi, Then::Close, "");
    assert_eq!(
        get(&corral, "GET", b""),
        (200, "1 GET ".into()),
        "{}",
        corral.log()
    );
    let (status, _) = get(&corral, "POST", b"once");
    assert_eq!(status, 502, "{}", corral.log());
    assert_eq!(seen.answered.load(Ordering::SeqCst), 1);
    assert_eq!(seen.connections.load(Ordering::SeqCst), 1, "sent again");
    assert_eq!(
        get(&corral, "GET", b""),
        (200, "2 GET ".into()),
        "{}",
        corral.log()
    );
}

/// php-cgi killed while it runs a request that came on a kept connection: corral sees the
/// kept connection closed before any answer, which alone would say nothing about the
/// worker; it finds the process exiting and takes the worker out of rotation at once, so
/// the next request goes to the replacement rather than to a dead worker left routable
/// until its exit is reaped. The request itself ran and is a POST, so it fails
/// (ARCHITECTURE.md decision 8; a GET would be sent again, to the replacement).
#[test]
fn a_worker_killed_under_a_kept_connection_is_out_of_rotation_at_once() {
    let dir = peers::shared_dir();
    peers::write_file(dir.path(), "pid.php", "<?php echo getmypid();");
    // Says it started, then holds its worker until it is killed (the test opens no gate).
    peers::write_file(
        dir.path(),
        "slow.php",
        "<?php file_get_contents('php://input'); file_put_contents(__DIR__ . '/started', \
         getmypid()); for ($i = 0; $i < 3000 && !file_exists(__DIR__ . '/gate'); $i++) \
         { usleep(10000); } echo getmypid();",
    );
    let config = format!(
        r#"
[server]
runtime_dir = "{run}"
log_level = "debug"

[[listen]]
address = "127.0.0.1:0"
protocol = "http"

[pools.php]
command = ["php-cgi"]
mode = "static"
min = 1
max = 1
queue_timeout = "20s"

[[contexts]]
pool = "php"
root = "{root}"
"#,
        run = dir.path().join("run").display(),
        root = dir.path().display()
    );
    let corral = Corral::start(&config, 1);
    let addr = corral.http_addr();
    let first = http(addr, "GET", "/pid.php", &[], b"");
    assert_eq!(first.status, 200, "{}", corral.log());
    let victim: i32 = first.text().trim().parse().unwrap();
    // The next request goes out on the connection the first one left kept.
    let slow = thread::spawn(move || http(addr, "POST", "/slow.php", &[], b"x"));
    let started = dir.path().join("started");
    assert!(
        support::eventually(Duration::from_secs(10), || started.exists()),
        "slow.php never started: {}",
        corral.log()
    );
    assert_eq!(
        std::fs::read_to_string(&started).unwrap(),
        victim.to_string()
    );
    kill(Pid::from_raw(victim), Signal::SIGKILL).unwrap();
    let r = slow.join().unwrap();
    assert_eq!(r.status, 502, "{}", corral.log());
    // Out of rotation by the failed request itself ("marked suspect" is Pool::fault's), not
    // only once the driver reaps the exit.
    assert!(corral.wait_log("marked suspect"), "{}", corral.log());
    let next = http(addr, "GET", "/pid.php", &[], b"");
    assert_eq!(next.status, 200, "{}", corral.log());
    assert_ne!(next.text().trim(), victim.to_string());
}
