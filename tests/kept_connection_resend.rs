//! A kept FastCGI connection over TCP that the backend drops as a request goes out on it:
//! the kernel accepts corral's write (the backend's close has not reached corral, or came
//! after the checkout), so the request meets an EOF or a reset before any answer. A scripted
//! backend (fault injection: a real server does this when its idle timeout fires just as
//! corral reuses the connection) answers the first request of every connection, then reads
//! the second one whole and closes or resets the connection without a byte, or writes half
//! a head and closes, or never answers. corral sends an idempotent request (GET, HEAD,
//! OPTIONS) once more on a fresh connection; a POST gets a 502 and reaches the backend once;
//! half an answer, or a first-byte timeout, is never followed by a resend; and a resend
//! happens at most once.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing,
    missing_docs
)]

mod support;

use std::io::Write;
use std::net::TcpStream;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::Duration;

use bytes::BytesMut;
use corral::protocols::fastcgi::{encode_stdout, RequestDecoder as FcgiDecoder};
use corral::protocols::Limits;
use nix::sys::socket::{setsockopt, sockopt};
use support::invariants::counter;
use support::scripted::{self, fastcgi_answer, read_fastcgi, OneServer, Proto};
use support::server::Corral;

/// What the backend does with a request it does not answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Unanswered {
    /// Closes the connection once it has read the request whole: not a byte of answer.
    Close,
    /// Resets the connection (a close with a zero linger) once it has read the request.
    Reset,
    /// Writes the start of a response head, then closes.
    HalfHead,
    /// Never answers; the connection stays open until corral closes it.
    Silent,
}

/// Which requests the backend does not answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Which {
    /// The second and later requests on a connection (the first of each is answered).
    Reused,
    /// Every request after the very first the backend received, on any connection.
    AllButFirst,
}

#[derive(Default)]
struct Seen {
    connections: AtomicUsize,
    /// Every request the backend read whole, as "METHOD on connection N", in order.
    requests: Mutex<Vec<String>>,
    answered: AtomicUsize,
}

impl Seen {
    fn requests(&self) -> Vec<String> {
        self.requests.lock().unwrap().clone()
    }

    fn count(&self, method: &str) -> usize {
        let prefix = format!("{method} ");
        self.requests()
            .iter()
            .filter(|r| r.starts_with(&prefix))
            .count()
    }
}

fn serve(mut s: TcpStream, which: Which, unanswered: Unanswered, seen: &Seen) {
    let connection = seen.connections.fetch_add(1, Ordering::SeqCst) + 1;
    let mut dec = FcgiDecoder::new(&Limits::DEFAULT);
    let mut buf = BytesMut::new();
    let mut on_this = 0;
    while let Some((id, request)) = read_fastcgi(&mut s, &mut dec, &mut buf) {
        let method = String::from_utf8_lossy(&request.method).into_owned();
        on_this += 1;
        let overall = {
            let mut requests = seen.requests.lock().unwrap();
            requests.push(format!("{method} on connection {connection}"));
            requests.len()
        };
        let answer = match which {
            Which::Reused => on_this == 1,
            Which::AllButFirst => overall == 1,
        };
        if !answer {
            match unanswered {
                Unanswered::Close => {}
                Unanswered::Reset => {
                    let linger = libc::linger {
                        l_onoff: 1,
                        l_linger: 0,
                    };
                    setsockopt(&s, sockopt::Linger, &linger).unwrap();
                }
                Unanswered::HalfHead => {
                    let mut out = BytesMut::new();
                    encode_stdout(id, b"Status: 200 OK\r\nContent-Ty", &mut out);
                    s.write_all(&out).unwrap();
                }
                Unanswered::Silent => {
                    scripted::drain(&mut s);
                }
            }
            return;
        }
        let mut out = BytesMut::new();
        let cgi = format!(
            "Status: 200 OK\r\nContent-Type: text/plain\r\n\r\n{method} on connection {connection}"
        );
        fastcgi_answer(id, cgi.as_bytes(), &mut out);
        // Counted first: the client may have the answer before this thread runs again.
        seen.answered.fetch_add(1, Ordering::SeqCst);
        s.write_all(&out).unwrap();
        dec.finish(id);
    }
}

/// A corral with one pool of one TCP server (so one kept connection at most) scripted as
/// `which` and `unanswered` say, and `pool` added to the pool's settings.
fn corral_for(
    dir: &std::path::Path,
    which: Which,
    unanswered: Unanswered,
    pool: &str,
) -> (Corral, Arc<Seen>) {
    let seen = Arc::new(Seen::default());
    let port = scripted::tcp_backend(&seen, move |s, seen| serve(s, which, unanswered, seen));
    let one = OneServer {
        pool,
        status: true,
        ..OneServer::tcp(Proto::FastCgi, port)
    };
    (one.start(dir), seen)
}

fn request(corral: &Corral, method: &str, body: &[u8]) -> (u16, String) {
    scripted::ask(corral, method, body)
}

/// The first request leaves connection 1 kept; `method` goes out on it, is dropped, and is
/// answered on connection 2.
fn idempotent_request_is_sent_again(method: &str, unanswered: Unanswered, answer: &str) {
    let dir = tempfile::tempdir().unwrap();
    let (corral, seen) = corral_for(dir.path(), Which::Reused, unanswered, "");
    assert_eq!(
        request(&corral, "GET", b""),
        (200, "GET on connection 1".into()),
        "{}",
        corral.log()
    );
    assert_eq!(
        request(&corral, method, b""),
        (200, answer.into()),
        "{}",
        corral.log()
    );
    assert_eq!(
        seen.requests(),
        [
            "GET on connection 1".to_string(),
            format!("{method} on connection 1"),
            format!("{method} on connection 2"),
        ]
    );
    assert_eq!(seen.answered.load(Ordering::SeqCst), 2);
    assert!(
        corral.wait_log("sending the request again"),
        "{}",
        corral.log()
    );
    // Counted where status shows it, and not as a backend error: the client was answered.
    let status = corral.status_ready_addr();
    assert_eq!(counter(status, "app", "requests resent"), 1);
    assert_eq!(counter(status, "app", "backend errors"), 0);
}

#[test]
fn a_get_dropped_on_a_kept_connection_is_sent_again_on_a_fresh_one() {
    idempotent_request_is_sent_again("GET", Unanswered::Close, "GET on connection 2");
}

/// A HEAD's answer has no body; its status says it was answered.
#[test]
fn a_head_dropped_on_a_kept_connection_is_sent_again_on_a_fresh_one() {
    idempotent_request_is_sent_again("HEAD", Unanswered::Close, "");
}

#[test]
fn an_options_dropped_on_a_kept_connection_is_sent_again_on_a_fresh_one() {
    idempotent_request_is_sent_again("OPTIONS", Unanswered::Close, "OPTIONS on connection 2");
}

/// A reset rather than a close: the same.
#[test]
fn a_get_reset_on_a_kept_connection_is_sent_again_on_a_fresh_one() {
    idempotent_request_is_sent_again("GET", Unanswered::Reset, "GET on connection 2");
}

/// A POST the backend read and then dropped may have run: a 502, and it reached the backend
/// once, though its body is in memory and could have been sent again. The server stays in
/// rotation.
fn a_post_is_not_sent_twice(unanswered: Unanswered) {
    let dir = tempfile::tempdir().unwrap();
    let (corral, seen) = corral_for(dir.path(), Which::Reused, unanswered, "");
    assert_eq!(request(&corral, "GET", b"").0, 200, "{}", corral.log());
    let (status, _) = request(&corral, "POST", b"a body in memory");
    assert_eq!(status, 502, "{}", corral.log());
    assert_eq!(seen.count("POST"), 1, "{:?}", seen.requests());
    assert_eq!(seen.connections.load(Ordering::SeqCst), 1);
    assert_eq!(
        request(&corral, "GET", b""),
        (200, "GET on connection 2".into()),
        "{}",
        corral.log()
    );
    assert!(
        !corral.log().contains("sending the request again"),
        "{}",
        corral.log()
    );
    let status = corral.status_ready_addr();
    assert_eq!(counter(status, "app", "requests resent"), 0);
    assert_eq!(counter(status, "app", "backend errors"), 1);
}

#[test]
fn a_post_dropped_on_a_kept_connection_is_not_sent_twice() {
    a_post_is_not_sent_twice(Unanswered::Close);
}

#[test]
fn a_post_reset_on_a_kept_connection_is_not_sent_twice() {
    a_post_is_not_sent_twice(Unanswered::Reset);
}

/// Bytes of an answer arrived: the backend ran the request, so it is not sent again, GET
/// or not.
#[test]
fn half_a_head_then_a_close_is_a_502_not_a_resend() {
    let dir = tempfile::tempdir().unwrap();
    let (corral, seen) = corral_for(dir.path(), Which::Reused, Unanswered::HalfHead, "");
    assert_eq!(request(&corral, "GET", b"").0, 200, "{}", corral.log());
    let (status, _) = request(&corral, "GET", b"");
    assert_eq!(status, 502, "{}", corral.log());
    assert_eq!(
        seen.requests(),
        ["GET on connection 1", "GET on connection 1"],
        "{}",
        corral.log()
    );
    assert_eq!(seen.connections.load(Ordering::SeqCst), 1);
}

/// A worker that is slow may be running the request: a first-byte timeout is a 504, and
/// the request is not sent again.
#[test]
fn a_timeout_on_a_kept_connection_is_not_followed_by_a_resend() {
    let dir = tempfile::tempdir().unwrap();
    let (corral, seen) = corral_for(
        dir.path(),
        Which::Reused,
        Unanswered::Silent,
        r#"first_byte_timeout = "1s""#,
    );
    assert_eq!(request(&corral, "GET", b"").0, 200, "{}", corral.log());
    let (status, _) = request(&corral, "GET", b"");
    assert_eq!(status, 504, "{}", corral.log());
    assert_eq!(seen.count("GET"), 2, "{:?}", seen.requests());
    assert_eq!(seen.connections.load(Ordering::SeqCst), 1);
}

/// The resend fails too (the fresh connection is dropped as well): a 502, and the request
/// reached the backend twice, not more.
#[test]
fn a_request_is_sent_again_once_at_most() {
    let dir = tempfile::tempdir().unwrap();
    let (corral, seen) = corral_for(dir.path(), Which::AllButFirst, Unanswered::Close, "");
    assert_eq!(request(&corral, "GET", b"").0, 200, "{}", corral.log());
    let (status, _) = request(&corral, "GET", b"");
    assert_eq!(status, 502, "{}", corral.log());
    // Left a moment to make a third attempt it must not make.
    thread::sleep(Duration::from_millis(300));
    assert_eq!(
        seen.requests(),
        [
            "GET on connection 1",
            "GET on connection 1",
            "GET on connection 2"
        ],
        "{}",
        corral.log()
    );
}
