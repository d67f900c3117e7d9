//! A response whose end record (FastCGI END_REQUEST, LSAPI RESP_END) comes in a write of its
//! own after the last byte its Content-Length announced, as it often does under load. The
//! HTTP front has the whole body by then and lets it go; corral must keep the connection
//! (the record is awaited briefly, the request's slot held meanwhile), not close it and
//! connect again for the next request. Scripted FastCGI and LSAPI backends over TCP (fault
//! injection: the gap is made wide and certain) that answer every request with a 5-byte
//! body, then the end record once the client has its answer, or, after a pause, junk, or
//! nothing at all.

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

use tokio::time::Instant;

use bytes::BytesMut;
use corral::protocols::fastcgi::{
    encode_end_request, encode_stdout, encode_stdout_end, ProtocolStatus,
    RequestDecoder as FcgiDecoder,
};
use corral::protocols::lsapi::{RequestDecoder as LsapiDecoder, ResponseEncoder};
use corral::protocols::Limits;
use support::scripted::{self, read_fastcgi, read_lsapi, OneServer, Proto};
use support::server::Corral;

/// What follows the body.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Then {
    /// The end record, once the test has the answer.
    End,
    /// Bytes that are no record at all.
    Junk,
    /// More body than the head announced, then the end record.
    Extra,
    /// Nothing: the connection stays open until corral closes it.
    Nothing,
}

/// The gap between the body's last byte and junk after it.
const PAUSE: Duration = Duration::from_millis(40);

#[derive(Default)]
struct Seen {
    connections: AtomicUsize,
    answered: AtomicUsize,
    /// For `Then::Nothing`: how long after the body each connection was closed by corral.
    closed_after: Mutex<Vec<Duration>>,
    /// For `Then::End`: answers whose client has its whole response. The end record of
    /// answer N is written only once N are (or after ten seconds, so nothing hangs).
    released: AtomicUsize,
}

/// The answer's head and body, then what comes after the pause.
fn answer(
    proto: Proto,
    id: u16,
    enc: Option<&ResponseEncoder>,
    then: Then,
) -> (BytesMut, BytesMut) {
    let (mut first, mut after) = (BytesMut::new(), BytesMut::new());
    match (proto, enc) {
        (Proto::FastCgi, _) => {
            let cgi =
                b"Status: 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 5\r\n\r\nhello";
            encode_stdout(id, cgi, &mut first);
            if then == Then::Extra {
                encode_stdout(id, b"more", &mut after);
            }
            encode_stdout_end(id, &mut after);
            encode_end_request(id, 0, ProtocolStatus::RequestComplete, &mut after);
        }
        (Proto::Lsapi, Some(enc)) => {
            let headers = [("Content-Type", "text/plain"), ("Content-Length", "5")];
            enc.header(200, &headers, &mut first).unwrap();
            enc.stream(b"hello", &mut first);
            if then == Then::Extra {
                enc.stream(b"more", &mut after);
            }
            enc.end(&mut after);
        }
        (Proto::Lsapi, None) => unreachable!("an LSAPI request has its encoder"),
    }
    if then == Then::Junk {
        after = BytesMut::from(&b"\x07 not a record at all"[..]);
    }
    (first, after)
}

fn serve(mut s: TcpStream, proto: Proto, then: Then, seen: &Seen) {
    seen.connections.fetch_add(1, Ordering::SeqCst);
    s.set_nodelay(true).unwrap();
    let mut buf = BytesMut::new();
    let mut fcgi = FcgiDecoder::new(&Limits::DEFAULT);
    let mut lsapi = LsapiDecoder::new(&Limits::DEFAULT);
    loop {
        let (id, enc) = match proto {
            Proto::FastCgi => match read_fastcgi(&mut s, &mut fcgi, &mut buf) {
                Some((id, _)) => (id, None),
                None => return,
            },
            Proto::Lsapi => match read_lsapi(&mut s, &mut lsapi, &mut buf) {
                Some((enc, _)) => (0, Some(enc)),
                None => return,
            },
        };
        let (first, after) = answer(proto, id, enc.as_ref(), then);
        let n = seen.answered.fetch_add(1, Ordering::SeqCst) + 1;
        s.write_all(&first).unwrap();
        let body_at = Instant::now();
        if then == Then::Nothing {
            scripted::drain(&mut s);
            seen.closed_after.lock().unwrap().push(body_at.elapsed());
            return;
        }
        if then == Then::End {
            support::eventually(Duration::from_secs(10), || {
                seen.released.load(Ordering::SeqCst) >= n
            });
        } else {
            thread::sleep(PAUSE);
        }
        if s.write_all(&after).is_err() {
            return;
        }
        if proto == Proto::FastCgi {
            fcgi.finish(id);
        }
    }
}

/// A corral with one pool of one scripted TCP server (so one kept connection at most).
fn corral_for(dir: &std::path::Path, proto: Proto, then: Then) -> (Corral, Arc<Seen>) {
    let seen = Arc::new(Seen::default());
    let port = scripted::tcp_backend(&seen, move |s, seen| serve(s, proto, then, seen));
    (OneServer::tcp(proto, port).start(dir), seen)
}

fn get(corral: &Corral) -> (u16, String) {
    scripted::ask(corral, "GET", b"")
}

/// Every request after the first goes out on the first connection: its end record, awaited
/// after the body, put it back on the idle stack before the next request took the slot.
fn a_trailing_end_record_keeps_the_connection(proto: Proto) {
    let dir = tempfile::tempdir().unwrap();
    let (corral, seen) = corral_for(dir.path(), proto, Then::End);
    for _ in 0..5 {
        // The client has its whole answer before the end record is written: the backend
        // writes it only once the answer is here (else after 10 s, which this would take).
        let started = Instant::now();
        assert_eq!(get(&corral), (200, "hello".into()), "{}", corral.log());
        assert!(
            started.elapsed() < Duration::from_secs(8),
            "{}",
            corral.log()
        );
        seen.released.fetch_add(1, Ordering::SeqCst);
    }
    assert_eq!(seen.answered.load(Ordering::SeqCst), 5);
    assert_eq!(
        seen.connections.load(Ordering::SeqCst),
        1,
        "{}",
        corral.log()
    );
    assert!(
        corral.wait_log("the end record came after the body's last byte; connection kept"),
        "{}",
        corral.log()
    );
}

#[test]
fn a_fastcgi_end_request_after_the_body_keeps_the_connection() {
    a_trailing_end_record_keeps_the_connection(Proto::FastCgi);
}

#[test]
fn an_lsapi_resp_end_after_the_body_keeps_the_connection() {
    a_trailing_end_record_keeps_the_connection(Proto::Lsapi);
}

/// An end record that never comes holds the slot (and the connection) for the bound, not
/// longer: the connection is closed, and the next request is answered on a new one.
#[test]
fn an_end_record_that_never_comes_does_not_hold_the_slot_past_the_bound() {
    let dir = tempfile::tempdir().unwrap();
    let (corral, seen) = corral_for(dir.path(), Proto::FastCgi, Then::Nothing);
    assert_eq!(get(&corral), (200, "hello".into()), "{}", corral.log());
    let started = Instant::now();
    assert_eq!(get(&corral), (200, "hello".into()), "{}", corral.log());
    // It waited for the first connection's end for the bound (250 ms), and no longer
    // (slack for a loaded machine).
    let took = started.elapsed();
    assert!(took < Duration::from_secs(3), "{took:?}");
    assert_eq!(seen.connections.load(Ordering::SeqCst), 2);
    assert!(
        support::eventually(Duration::from_secs(5), || {
            seen.closed_after.lock().unwrap().len() == 2
        }),
        "{}",
        corral.log()
    );
    for after in seen.closed_after.lock().unwrap().iter() {
        assert!(
            *after >= Duration::from_millis(200) && *after < Duration::from_secs(2),
            "closed {after:?} after the body: {}",
            corral.log()
        );
    }
    assert!(
        corral.wait_log("no end record within the wait after the body's last byte"),
        "{}",
        corral.log()
    );
}

/// Junk where the end record should be: the connection is closed, with a line saying why,
/// and the next request gets a new one.
fn junk_after_the_body_closes_the_connection(then: Then, line: &str) {
    let dir = tempfile::tempdir().unwrap();
    let (corral, seen) = corral_for(dir.path(), Proto::FastCgi, then);
    assert_eq!(get(&corral), (200, "hello".into()), "{}", corral.log());
    assert!(corral.wait_log(line), "{}", corral.log());
    assert_eq!(get(&corral), (200, "hello".into()), "{}", corral.log());
    assert_eq!(seen.connections.load(Ordering::SeqCst), 2);
}

#[test]
fn bytes_that_are_no_record_after_the_body_close_the_connection() {
    junk_after_the_body_closes_the_connection(
        Then::Junk,
        "the response's end after its last body byte failed; connection closed",
    );
}

#[test]
fn more_body_than_announced_closes_the_connection() {
    junk_after_the_body_closes_the_connection(
        Then::Extra,
        "the backend sent more than the Content-Length it announced",
    );
}
