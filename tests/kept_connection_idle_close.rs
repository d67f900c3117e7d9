//! What a backend does to a kept connection while it lies idle on corral's stack, at chosen
//! moments: a scripted FastCGI backend over TCP (fault injection: over TCP a request written
//! to a connection the backend already closed is accepted by the kernel, so only the
//! checkout's test stands between such a connection and a 502 for a POST, or a GET sent
//! twice: tests/kept_connection_resend.rs), answering one request per
//! connection and then closing it, or writing stray bytes on it, while corral holds it idle.
//! The next request must find that out at checkout (corral reads the readiness its reactor
//! keeps, and peeks only at a connection marked readable) and go out on a fresh connection.
//! A backend that keeps its connections open must see them reused, every request on one.

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
use std::sync::Arc;
use std::thread;
use std::time::Duration;

use bytes::BytesMut;
use corral::protocols::fastcgi::RequestDecoder as FcgiDecoder;
use corral::protocols::Limits;
use support::scripted::{self, fastcgi_answer, read_fastcgi, OneServer, Proto};
use support::server::Corral;

/// What the backend does once it has answered a request on a connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum After {
    /// Waits for the next request on the same connection.
    Keep,
    /// Closes the connection: corral holds it idle, closed at the other end.
    Close,
    /// Writes bytes no request asked for, then waits for the connection's end.
    Stray,
}

#[derive(Default)]
struct Seen {
    connections: AtomicUsize,
    answered: AtomicUsize,
    /// Connections the backend has closed or written stray bytes on while idle.
    spoiled: AtomicUsize,
}

fn serve(mut s: TcpStream, after: After, seen: &Seen) {
    let connection = seen.connections.fetch_add(1, Ordering::SeqCst) + 1;
    let mut dec = FcgiDecoder::new(&Limits::DEFAULT);
    let mut buf = BytesMut::new();
    while let Some((id, _)) = read_fastcgi(&mut s, &mut dec, &mut buf) {
        let mut out = BytesMut::new();
        let cgi =
            format!("Status: 200 OK\r\nContent-Type: text/plain\r\n\r\nconnection {connection}");
        fastcgi_answer(id, cgi.as_bytes(), &mut out);
        s.write_all(&out).unwrap();
        dec.finish(id);
        seen.answered.fetch_add(1, Ordering::SeqCst);
        match after {
            After::Keep => {}
            After::Close => {
                // Once corral has surely put the connection back on its stack.
                thread::sleep(Duration::from_millis(50));
                drop(s);
                seen.spoiled.fetch_add(1, Ordering::SeqCst);
                return;
            }
            After::Stray => {
                thread::sleep(Duration::from_millis(50));
                s.write_all(b"not asked for").unwrap();
                seen.spoiled.fetch_add(1, Ordering::SeqCst);
                // Held open until corral drops it (a read that ends at its close).
                scripted::drain(&mut s);
                return;
            }
        }
    }
}

/// A corral with one pool of one TCP server (so one kept connection at most) scripted to do
/// `after` once it answers.
fn corral_for(dir: &std::path::Path, after: After) -> (Corral, Arc<Seen>) {
    let seen = Arc::new(Seen::default());
    let port = scripted::tcp_backend(&seen, move |s, seen| serve(s, after, seen));
    (OneServer::tcp(Proto::FastCgi, port).start(dir), seen)
}

fn get(corral: &Corral) -> (u16, String) {
    scripted::ask(corral, "GET", b"")
}

/// Each request waits until the backend has spoiled the connection the previous one left
/// idle, and a moment more for corral's reactor to see it; each must then go out on a new
/// connection and succeed, none of them sent twice.
fn spoiled_idle_connections_are_not_used(after: After) {
    let dir = tempfile::tempdir().unwrap();
    let (corral, seen) = corral_for(dir.path(), after);
    for n in 1..=4 {
        assert_eq!(
            get(&corral),
            (200, format!("connection {n}")),
            "{}",
            corral.log()
        );
        assert!(
            support::eventually(Duration::from_secs(10), || {
                seen.spoiled.load(Ordering::SeqCst) >= n
            }),
            "the backend never spoiled connection {n}"
        );
        // corral's serving thread waits in epoll_wait: it sees the close or the bytes as
        // they come, in far less than this even on a loaded machine.
        thread::sleep(Duration::from_millis(300));
    }
    assert_eq!(seen.answered.load(Ordering::SeqCst), 4);
    assert!(
        !corral.log().contains("sending the request again"),
        "{}",
        corral.log()
    );
    // Found at checkout, before the request went out.
    assert!(
        corral.wait_log("dropping an idle backend connection the backend closed or wrote on"),
        "{}",
        corral.log()
    );
}

#[test]
fn an_idle_connection_the_backend_closed_is_not_used() {
    spoiled_idle_connections_are_not_used(After::Close);
}

#[test]
fn an_idle_connection_the_backend_wrote_on_is_not_used() {
    spoiled_idle_connections_are_not_used(After::Stray);
}

/// Readiness left from an exchange (or a peek that found nothing) must not cost the
/// connection: every request of a run goes out on the one kept connection.
#[test]
fn a_quiet_idle_connection_is_reused_every_time() {
    let dir = tempfile::tempdir().unwrap();
    let (corral, seen) = corral_for(dir.path(), After::Keep);
    for _ in 0..30 {
        assert_eq!(
            get(&corral),
            (200, "connection 1".into()),
            "{}",
            corral.log()
        );
    }
    assert_eq!(seen.connections.load(Ordering::SeqCst), 1);
}
