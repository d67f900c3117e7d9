//! Answers whose body the HTTP front never sends (the answer to HEAD, a 204, a 304): hyper
//! drops such a body unread once the head is written, yet the backend sends it, or at least
//! the end of its response (php-cgi discards PHP's output for HEAD, but STDOUT's end and
//! END_REQUEST follow). corral must read that rest and keep the connection, not abort the
//! exchange and connect again for the next request; within bounds: a body past the bytes it
//! reads to keep the connection, or one that stalls until the request timeout, closes it.
//! Scripted FastCGI and LSAPI backends over TCP (fault injection: when the rest comes, how
//! big it is, whether it comes at all, are made certain) count the connections corral makes.

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
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::BytesMut;
use corral::protocols::fastcgi::{
    encode_end_request, encode_stdout, encode_stdout_end, ProtocolStatus,
    RequestDecoder as FcgiDecoder,
};
use corral::protocols::lsapi::{RequestDecoder as LsapiDecoder, ResponseEncoder};
use corral::protocols::Limits;
use support::scripted::{self, read_fastcgi, read_lsapi, OneServer, Proto};
use support::server::{http, Corral};
use tokio::time::Instant;

/// How the backend answers every request, HEAD included.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Rest {
    /// Head, body and end in one write (as the null backend does).
    Together,
    /// The head first; the body and the end once the test has the client's answer (for a
    /// HEAD, a 204 or a 304: a GET's body comes with its head).
    Later,
    /// The head, then a body of [`HUGE`] bytes and the end.
    Huge,
    /// The head, then nothing until corral closes the connection.
    Stall,
    /// The head (announcing [`TRICKLE`] bytes), then a byte of body every 50 ms until
    /// corral closes the connection (or for 10 s).
    Trickle,
}

/// The body length a trickled answer announces: more than 10 s of its bytes.
const TRICKLE: usize = 1000;

/// More body than corral reads to keep a connection (256 KiB).
const HUGE: usize = 1024 * 1024;

#[derive(Default)]
struct Seen {
    connections: AtomicUsize,
    answered: AtomicUsize,
    /// For `Rest::Later`: answers whose client has its whole response. The rest of answer N
    /// is written only once N are (or after ten seconds, so nothing hangs).
    released: AtomicUsize,
    /// For `Rest::Stall`: how long after the head each connection was closed by corral.
    closed_after: Mutex<Vec<Duration>>,
}

/// The answer to `uri` (its status is the path's first segment when it is a number: `/204`)
/// split where the backend pauses: the head, then the rest.
fn answer(
    proto: Proto,
    id: u16,
    enc: Option<&ResponseEncoder>,
    uri: &[u8],
    rest: Rest,
) -> (BytesMut, BytesMut) {
    let status: u16 = std::str::from_utf8(uri)
        .ok()
        .and_then(|u| u.trim_start_matches('/').parse().ok())
        .unwrap_or(200);
    let body = if rest == Rest::Huge {
        vec![b'x'; HUGE]
    } else {
        b"hello".to_vec()
    };
    let length = if rest == Rest::Trickle {
        TRICKLE.to_string()
    } else {
        body.len().to_string()
    };
    let (mut head, mut after) = (BytesMut::new(), BytesMut::new());
    match (proto, enc) {
        (Proto::FastCgi, _) => {
            let cgi = format!(
                "Status: {status} Whatever\r\nContent-Type: text/plain\r\nContent-Length: {length}\r\n\r\n"
            );
            encode_stdout(id, cgi.as_bytes(), &mut head);
            encode_stdout(id, &body, &mut after);
            encode_stdout_end(id, &mut after);
            encode_end_request(id, 0, ProtocolStatus::RequestComplete, &mut after);
        }
        (Proto::Lsapi, Some(enc)) => {
            let headers = [("Content-Type", "text/plain"), ("Content-Length", &length)];
            enc.header(status, &headers, &mut head).unwrap();
            enc.stream(&body, &mut after);
            enc.end(&mut after);
        }
        (Proto::Lsapi, None) => unreachable!("an LSAPI request has its encoder"),
    }
    (head, after)
}

fn serve(mut s: TcpStream, proto: Proto, rest: Rest, seen: &Seen) {
    seen.connections.fetch_add(1, Ordering::SeqCst);
    s.set_nodelay(true).unwrap();
    let mut buf = BytesMut::new();
    let mut fcgi = FcgiDecoder::new(&Limits::DEFAULT);
    let mut lsapi = LsapiDecoder::new(&Limits::DEFAULT);
    loop {
        let (id, enc, request) = match proto {
            Proto::FastCgi => match read_fastcgi(&mut s, &mut fcgi, &mut buf) {
                Some((id, request)) => (id, None, request),
                None => return,
            },
            Proto::Lsapi => match read_lsapi(&mut s, &mut lsapi, &mut buf) {
                Some((enc, request)) => (0, Some(enc), request),
                None => return,
            },
        };
        let (mut head, after) = answer(proto, id, enc.as_ref(), &request.uri, rest);
        let n = seen.answered.fetch_add(1, Ordering::SeqCst) + 1;
        match rest {
            Rest::Together => {
                head.extend_from_slice(&after);
                s.write_all(&head).unwrap();
            }
            // A body the client reads comes at once.
            Rest::Later if request.method != b"HEAD" && request.uri == b"/x" => {
                head.extend_from_slice(&after);
                s.write_all(&head).unwrap();
            }
            Rest::Later => {
                s.write_all(&head).unwrap();
                support::eventually(Duration::from_secs(10), || {
                    seen.released.load(Ordering::SeqCst) >= n
                });
                if s.write_all(&after).is_err() {
                    return;
                }
            }
            Rest::Huge => {
                s.write_all(&head).unwrap();
                if s.write_all(&after).is_err() {
                    return;
                }
            }
            Rest::Stall => {
                s.write_all(&head).unwrap();
                let at = Instant::now();
                scripted::drain(&mut s);
                seen.closed_after.lock().unwrap().push(at.elapsed());
                return;
            }
            Rest::Trickle => {
                s.write_all(&head).unwrap();
                let at = Instant::now();
                for _ in 0..200 {
                    std::thread::sleep(Duration::from_millis(50));
                    let mut byte = BytesMut::new();
                    encode_stdout(id, b"x", &mut byte);
                    if s.write_all(&byte).is_err() {
                        break;
                    }
                }
                seen.closed_after.lock().unwrap().push(at.elapsed());
                return;
            }
        }
        if proto == Proto::FastCgi {
            fcgi.finish(id);
        }
    }
}

/// A corral with one pool of one scripted TCP server at `concurrency` (so as many kept
/// connections at most), with `pool` added to the pool's settings.
fn corral_for(
    dir: &std::path::Path,
    proto: Proto,
    rest: Rest,
    concurrency: u32,
    pool: &str,
) -> (Corral, Arc<Seen>) {
    let seen = Arc::new(Seen::default());
    let port = scripted::tcp_backend(&seen, move |s, seen| serve(s, proto, rest, seen));
    let mut one = OneServer::tcp(proto, port);
    one.pool = pool;
    let config = one.config(&dir.join("run")).replace(
        "concurrency = 1\n",
        &format!("concurrency = {concurrency}\n"),
    );
    (Corral::start(&config, 1), seen)
}

/// `method` to `target` on a new connection: the status and the body.
fn ask(corral: &Corral, method: &str, target: &str) -> (u16, String) {
    let r = http(corral.http_addr(), method, target, &[], b"");
    (r.status, r.text())
}

/// Reads one response head (to its blank line) from a kept-alive client connection.
fn read_head(s: &mut TcpStream) -> String {
    let mut raw = Vec::new();
    let mut byte = [0u8; 1];
    while !raw.ends_with(b"\r\n\r\n") {
        let n = s.read(&mut byte).expect("a response head in time");
        assert!(
            n > 0,
            "closed mid-head: {:?}",
            String::from_utf8_lossy(&raw)
        );
        raw.push(byte[0]);
    }
    String::from_utf8_lossy(&raw).into_owned()
}

/// HEADs and GETs, one after the other, all on the first backend connection.
fn heads_keep_the_connection(proto: Proto, rest: Rest) {
    let dir = tempfile::tempdir().unwrap();
    let (corral, seen) = corral_for(dir.path(), proto, rest, 1, "");
    let mut answers = 0;
    for method in ["HEAD", "GET", "HEAD", "HEAD", "GET"] {
        // With `Rest::Later`, the client has its answer before the rest is written: the
        // backend writes it only once the answer is here (else after 10 s, which this
        // would take).
        let started = Instant::now();
        let expected = if method == "HEAD" { "" } else { "hello" };
        assert_eq!(
            ask(&corral, method, "/x"),
            (200, expected.into()),
            "{}",
            corral.log()
        );
        assert!(
            started.elapsed() < Duration::from_secs(8),
            "{}",
            corral.log()
        );
        answers += 1;
        seen.released.store(answers, Ordering::SeqCst);
    }
    assert_eq!(seen.answered.load(Ordering::SeqCst), 5);
    assert_eq!(
        seen.connections.load(Ordering::SeqCst),
        1,
        "{}",
        corral.log()
    );
    assert!(
        corral.wait_log(
            "the rest of a response the client is not sent was read and discarded; connection kept"
        ),
        "{}",
        corral.log()
    );
    corral.assert_absent("backend exchange abandoned before its end");
}

#[test]
fn a_fastcgi_head_answered_whole_keeps_the_connection() {
    heads_keep_the_connection(Proto::FastCgi, Rest::Together);
}

#[test]
fn an_lsapi_head_answered_whole_keeps_the_connection() {
    heads_keep_the_connection(Proto::Lsapi, Rest::Together);
}

/// The rest comes after the client has its answer: read by a task after the body was
/// dropped, the request's slot held meanwhile (the next request waits for it rather than
/// open a second connection).
#[test]
fn a_fastcgi_head_whose_rest_comes_later_keeps_the_connection() {
    heads_keep_the_connection(Proto::FastCgi, Rest::Later);
}

#[test]
fn an_lsapi_head_whose_rest_comes_later_keeps_the_connection() {
    heads_keep_the_connection(Proto::Lsapi, Rest::Later);
}

/// A 204 and a 304 with a body anyway: hyper sends neither body; the connection is kept.
#[test]
fn no_content_and_not_modified_answers_keep_the_connection() {
    let dir = tempfile::tempdir().unwrap();
    let (corral, seen) = corral_for(dir.path(), Proto::FastCgi, Rest::Later, 1, "");
    for (answers, (target, status)) in [("/204", 204), ("/304", 304), ("/x", 200), ("/204", 204)]
        .into_iter()
        .enumerate()
    {
        let r = http(corral.http_addr(), "GET", target, &[], b"");
        assert_eq!(r.status, status, "{}", corral.log());
        assert_eq!(r.text(), if status == 200 { "hello" } else { "" });
        seen.released.store(answers + 1, Ordering::SeqCst);
    }
    assert_eq!(
        seen.connections.load(Ordering::SeqCst),
        1,
        "{}",
        corral.log()
    );
}

/// A body past what corral reads to keep the connection: it is closed (with a line saying
/// why), not read to its end, and the next request gets a new connection.
#[test]
fn a_head_with_a_huge_body_closes_the_connection() {
    let dir = tempfile::tempdir().unwrap();
    let (corral, seen) = corral_for(dir.path(), Proto::FastCgi, Rest::Huge, 1, "");
    assert_eq!(ask(&corral, "HEAD", "/x"), (200, String::new()));
    assert!(
        corral.wait_log("a response the client is not sent ran past the bytes read"),
        "{}",
        corral.log()
    );
    assert_eq!(ask(&corral, "HEAD", "/x"), (200, String::new()));
    assert!(
        support::eventually(Duration::from_secs(5), || {
            seen.connections.load(Ordering::SeqCst) == 2
        }),
        "{}",
        corral.log()
    );
    corral.assert_absent("the rest of a response the client is not sent was read");
}

/// A backend that stalls after the head: the client has its answer at once and its
/// connection goes on serving; a request beside it is served on a second backend
/// connection; the stalled one is closed at the pool's request timeout, not before, not
/// long after.
#[test]
fn a_head_whose_backend_stalls_after_the_head_is_cut_at_the_request_timeout() {
    let dir = tempfile::tempdir().unwrap();
    let (corral, seen) = corral_for(
        dir.path(),
        Proto::FastCgi,
        Rest::Stall,
        2,
        "request_timeout = \"2s\"",
    );
    let mut client = TcpStream::connect(corral.http_addr()).unwrap();
    client
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let started = Instant::now();
    client
        .write_all(b"HEAD /x HTTP/1.1\r\nHost: localhost\r\n\r\n")
        .unwrap();
    let head = read_head(&mut client);
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    assert!(
        started.elapsed() < Duration::from_secs(1),
        "the answer waited {:?} for the backend's rest: {}",
        started.elapsed(),
        corral.log()
    );
    // The same client connection, and the pool, go on: a second HEAD is answered at once
    // on a second backend connection (the first still holds its slot).
    client
        .write_all(b"HEAD /x HTTP/1.1\r\nHost: localhost\r\n\r\n")
        .unwrap();
    let head = read_head(&mut client);
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    assert!(
        started.elapsed() < Duration::from_secs(1),
        "{}",
        corral.log()
    );
    assert_eq!(seen.connections.load(Ordering::SeqCst), 2);
    assert!(
        support::eventually(Duration::from_secs(8), || {
            seen.closed_after.lock().unwrap().len() == 2
        }),
        "{}",
        corral.log()
    );
    for after in seen.closed_after.lock().unwrap().iter() {
        assert!(
            *after >= Duration::from_millis(1800) && *after < Duration::from_secs(5),
            "closed {after:?} after the head: {}",
            corral.log()
        );
    }
    assert!(
        corral.wait_log("did not come within the request timeout; connection closed"),
        "{}",
        corral.log()
    );
    // The slots came back: a third HEAD is answered.
    client
        .write_all(b"HEAD /x HTTP/1.1\r\nHost: localhost\r\n\r\n")
        .unwrap();
    let head = read_head(&mut client);
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
}

/// A client that goes away in the middle of a body it was reading is not a body the front
/// does not send: the backend exchange is still aborted and its connection closed at once,
/// not read on to its end.
#[test]
fn a_client_gone_mid_body_still_aborts_the_exchange() {
    let dir = tempfile::tempdir().unwrap();
    let (corral, seen) = corral_for(dir.path(), Proto::FastCgi, Rest::Trickle, 1, "");
    let mut client = TcpStream::connect(corral.http_addr()).unwrap();
    client
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    client
        .write_all(b"GET /x HTTP/1.1\r\nHost: localhost\r\n\r\n")
        .unwrap();
    let head = read_head(&mut client);
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    let mut byte = [0u8; 1];
    assert_eq!(client.read(&mut byte).unwrap(), 1);
    drop(client);
    assert!(
        corral.wait_log("backend exchange abandoned before its end; connection closed"),
        "{}",
        corral.log()
    );
    assert!(
        support::eventually(Duration::from_secs(8), || {
            !seen.closed_after.lock().unwrap().is_empty()
        }),
        "{}",
        corral.log()
    );
    let after = seen.closed_after.lock().unwrap()[0];
    assert!(after < Duration::from_secs(5), "closed after {after:?}");
    corral.assert_absent("the rest of a response the client is not sent");
}

/// The socket descriptors process `pid` holds, by inode (`socket:[N]`), sorted.
fn sockets_of(pid: u32) -> Vec<String> {
    let mut sockets: Vec<String> = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
        .map(|to| to.display().to_string())
        .filter(|to| to.starts_with("socket:"))
        .collect();
    sockets.sort();
    sockets
}

/// corral's null backend, which answers HEAD with a body as it does GET: after HEADs, the
/// next GET still goes out on the connection the first GET opened (the null backend holds
/// the same sockets: a new connection would be a new one). One serving thread, so that
/// every request meets the same idle stack.
#[test]
fn heads_to_the_null_backend_keep_the_connection() {
    let dir = support::peers::shared_dir();
    let null = support::sync2::null_backend(dir.path());
    let corral = Corral::start(
        &support::sync2::config(&null, "threads = 1", &[("http", "")]),
        1,
    );
    assert_eq!(ask(&corral, "GET", "/x").0, 200, "{}", corral.log());
    let before = sockets_of(null.pid());
    for _ in 0..3 {
        assert_eq!(ask(&corral, "HEAD", "/x"), (200, String::new()));
    }
    assert_eq!(ask(&corral, "GET", "/x").0, 200, "{}", corral.log());
    assert_eq!(sockets_of(null.pid()), before, "{}", corral.log());
    corral.assert_absent("backend exchange abandoned before its end");
}

/// PHP run by php-cgi discards its output for HEAD, but the end of STDOUT and END_REQUEST
/// still follow: after HEADs, php-cgi still serves the connection the first GET opened (the
/// script lists the sockets php-cgi holds: its listener and the connection it serves).
#[test]
fn heads_to_php_cgi_keep_the_connection() {
    let dir = support::peers::shared_dir();
    support::peers::write_file(
        dir.path(),
        "sockets.php",
        r#"<?php
foreach (scandir('/proc/self/fd') as $fd) {
    $to = @readlink("/proc/self/fd/$fd");
    if ($to !== false && strncmp($to, 'socket:', 7) === 0) {
        echo "$to\n";
    }
}
"#,
    );
    let config =
        support::sync2::php_config(dir.path()).replacen("[server]\n", "[server]\nthreads = 1\n", 1);
    let corral = Corral::start(&config, 1);
    let (status, before) = ask(&corral, "GET", "/sockets.php");
    assert_eq!(status, 200, "{}", corral.log());
    assert_eq!(before.lines().count(), 2, "{before}");
    for _ in 0..3 {
        assert_eq!(ask(&corral, "HEAD", "/sockets.php"), (200, String::new()));
    }
    assert_eq!(
        ask(&corral, "GET", "/sockets.php"),
        (200, before),
        "{}",
        corral.log()
    );
    corral.assert_absent("backend exchange abandoned before its end");
}
