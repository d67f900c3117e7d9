//! The FastCGI backend exchange against tiny fake backends, for the faults real ones do not
//! commit: garbage, silence, a response cut short or stalled, a kept connection the backend
//! closed, an answer before the body was read, a client that goes away; and the idle stack
//! of kept connections skipping the closed and the noisy. The exchange with real php-cgi
//! and flup is in `tests/backend_fastcgi.rs`.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing,
    missing_docs
)]

mod support;

use std::path::Path;
use std::time::Duration;

use bytes::Bytes;
use corral::backend::{
    fastcgi, BackendConnection, BackendError, BackendRequest, Connections, RequestBody,
};
use corral::config::BackendAddress;
use corral::net::{QuietUnix, Stream};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::UnixListener;

use support::backend_fastcgi::{address, options, read_all};
use support::peers::shared_dir;

/// A fake FastCGI backend on a Unix socket: accepts one connection and runs `behave` on it.
async fn fake<F, Fut>(dir: &Path, behave: F) -> BackendAddress
where
    F: FnOnce(tokio::net::UnixStream) -> Fut + Send + 'static,
    Fut: std::future::Future<Output = ()> + Send,
{
    let socket = dir.join("fake.sock");
    let listener = UnixListener::bind(&socket).unwrap();
    tokio::spawn(async move {
        let (stream, _) = listener.accept().await.unwrap();
        behave(stream).await;
    });
    address(&socket)
}

/// Reads the request up to and including the empty STDIN record (type 5, length 0).
async fn read_request(stream: &mut tokio::net::UnixStream) -> Vec<u8> {
    let mut seen = Vec::new();
    let mut buf = [0u8; 4096];
    while !seen.windows(8).any(|w| w == [1, 5, 0, 1, 0, 0, 0, 0]) {
        let n = stream.read(&mut buf).await.unwrap();
        assert!(n > 0, "request cut short");
        seen.extend_from_slice(&buf[..n]);
    }
    seen
}

fn simple_request() -> BackendRequest {
    BackendRequest {
        params: vec![(Bytes::from("REQUEST_METHOD"), Bytes::from("GET"))],
        body: RequestBody::empty(),
    }
}

/// STDOUT record for request 1 with `content` (no padding needed when a multiple of 8 is
/// not required: padding 0 is valid).
fn stdout_record(content: &[u8]) -> Vec<u8> {
    let len = content.len() as u16;
    let mut record = vec![1, 6, 0, 1, (len >> 8) as u8, len as u8, 0, 0];
    record.extend_from_slice(content);
    record
}

#[tokio::test]
async fn garbage_from_the_backend_is_a_protocol_error() {
    let dir = shared_dir();
    let addr = fake(dir.path(), |mut s| async move {
        read_request(&mut s).await;
        s.write_all(b"HTTP/1.1 200 OK\r\n\r\nnot fastcgi")
            .await
            .unwrap();
        let _ = s.read(&mut [0u8; 16]).await;
    })
    .await;
    let conns = Connections::new(2);
    let conn = conns.get(&addr, Duration::from_secs(5)).await.unwrap();
    let err = fastcgi::send(conn, simple_request(), &options())
        .await
        .unwrap_err();
    assert!(matches!(err, BackendError::Protocol { .. }), "{err:?}");
    assert!(err.to_string().contains("version"), "{err}");
    assert_eq!(err.status(), 502);
    assert!(!err.connection_reusable());
    assert_eq!(conns.idle(&addr), 0, "a broken connection is never kept");
}

#[tokio::test]
async fn a_silent_backend_is_a_first_byte_timeout() {
    let dir = shared_dir();
    let addr = fake(dir.path(), |mut s| async move {
        read_request(&mut s).await;
        // Say nothing; hold the connection until the client closes it.
        let _ = s.read(&mut [0u8; 16]).await;
    })
    .await;
    let mut options = options();
    options.timeouts.first_byte = Duration::from_millis(300);
    let conn = BackendConnection::connect(&addr, Duration::from_secs(5))
        .await
        .unwrap();
    let started = tokio::time::Instant::now();
    let err = fastcgi::send(conn, simple_request(), &options)
        .await
        .unwrap_err();
    assert!(
        matches!(err, BackendError::FirstByteTimeout { .. }),
        "{err:?}"
    );
    assert_eq!(err.status(), 504);
    assert!(started.elapsed() < Duration::from_secs(5));
}

#[tokio::test]
async fn a_backend_closing_mid_response_is_an_error() {
    let dir = shared_dir();
    let addr = fake(dir.path(), |mut s| async move {
        read_request(&mut s).await;
        let out = stdout_record(b"Content-Type: text/plain\r\n\r\nhalf a bo");
        s.write_all(&out).await.unwrap();
        // Close without END_REQUEST.
    })
    .await;
    let conn = BackendConnection::connect(&addr, Duration::from_secs(5))
        .await
        .unwrap();
    let mut response = fastcgi::send(conn, simple_request(), &options())
        .await
        .unwrap();
    assert_eq!(
        response.body.next_chunk().await.unwrap().unwrap(),
        &b"half a bo"[..]
    );
    let err = response.body.next_chunk().await.unwrap().unwrap_err();
    assert!(matches!(err, BackendError::ClosedEarly { .. }), "{err:?}");
    assert_eq!(err.status(), 502);
    assert!(response.body.next_chunk().await.is_none());
    assert!(response.body.take_connection().is_none());
}

#[tokio::test]
async fn a_client_going_away_sends_abort_request() {
    let dir = shared_dir();
    let (tx, rx) = tokio::sync::oneshot::channel();
    let addr = fake(dir.path(), |mut s| async move {
        read_request(&mut s).await;
        s.write_all(&stdout_record(b"Content-Type: text/plain\r\n\r\nfirst"))
            .await
            .unwrap();
        let mut rest = Vec::new();
        let _ = s.read_to_end(&mut rest).await;
        let _ = tx.send(rest);
    })
    .await;
    let conn = BackendConnection::connect(&addr, Duration::from_secs(5))
        .await
        .unwrap();
    let mut response = fastcgi::send(conn, simple_request(), &options())
        .await
        .unwrap();
    assert_eq!(
        response.body.next_chunk().await.unwrap().unwrap(),
        &b"first"[..]
    );
    response.body.abort();
    let after = tokio::time::timeout(Duration::from_secs(5), rx)
        .await
        .unwrap()
        .unwrap();
    // FCGI_ABORT_REQUEST for request 1: version 1, type 2, id 1, no content; then EOF.
    assert_eq!(after, [1, 2, 0, 1, 0, 0, 0, 0]);
}

/// STDOUT with a whole head and body, then END_REQUEST (complete) for request 1.
fn whole_response(body: &[u8]) -> Vec<u8> {
    let mut content = b"Content-Type: text/plain\r\n\r\n".to_vec();
    content.extend_from_slice(body);
    let mut out = stdout_record(&content);
    out.extend_from_slice(&[1, 3, 0, 1, 0, 8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]);
    out
}

#[tokio::test]
async fn a_kept_connection_closed_by_the_backend_is_stale_and_retryable() {
    let dir = shared_dir();
    let addr = fake(dir.path(), |mut s| async move {
        read_request(&mut s).await;
        s.write_all(&whole_response(b"once")).await.unwrap();
        // Close the kept connection, as a restarted worker would.
    })
    .await;
    let conn = BackendConnection::connect(&addr, Duration::from_secs(5))
        .await
        .unwrap();
    let mut response = fastcgi::send(conn, simple_request(), &options())
        .await
        .unwrap();
    assert_eq!(read_all(&mut response).await, b"once");
    let kept = response.body.take_connection().expect("KEEP_CONN keeps it");
    let err = fastcgi::send(kept, simple_request(), &options())
        .await
        .unwrap_err();
    // Closed before the request was written: over a Unix socket the write meets a broken
    // pipe (the backend read none of it), over TCP the read may see the close first.
    assert!(
        matches!(
            err,
            BackendError::StaleReset { .. } | BackendError::ClosedEarly { stale: true, .. }
        ),
        "{err:?}"
    );
    assert!(err.is_stale() && err.retryable());
    assert_eq!(err.status(), 502);
}

#[tokio::test]
async fn a_backend_stalling_mid_body_is_a_request_timeout() {
    let dir = shared_dir();
    let addr = fake(dir.path(), |mut s| async move {
        read_request(&mut s).await;
        s.write_all(&stdout_record(b"Content-Type: text/plain\r\n\r\nslow"))
            .await
            .unwrap();
        let _ = s.read(&mut [0u8; 16]).await;
    })
    .await;
    let mut options = options();
    options.timeouts.request = Duration::from_millis(400);
    let conn = BackendConnection::connect(&addr, Duration::from_secs(5))
        .await
        .unwrap();
    let mut response = fastcgi::send(conn, simple_request(), &options)
        .await
        .unwrap();
    assert_eq!(
        response.body.next_chunk().await.unwrap().unwrap(),
        &b"slow"[..]
    );
    let err = response.body.next_chunk().await.unwrap().unwrap_err();
    assert!(
        matches!(err, BackendError::RequestTimeout { .. }),
        "{err:?}"
    );
    assert_eq!(err.status(), 504);
}

#[tokio::test]
async fn a_backend_answering_before_reading_the_body_does_not_deadlock() {
    let dir = shared_dir();
    let (done_tx, done_rx) = tokio::sync::oneshot::channel::<()>();
    let addr = fake(dir.path(), |mut s| async move {
        // Read only BEGIN_REQUEST and PARAMS (up to the empty PARAMS record), answer, and
        // never read the 8 MiB body.
        let mut seen = Vec::new();
        let mut buf = [0u8; 512];
        while !seen.windows(8).any(|w| w == [1, 4, 0, 1, 0, 0, 0, 0]) {
            let n = s.read(&mut buf).await.unwrap();
            seen.extend_from_slice(&buf[..n]);
        }
        s.write_all(&whole_response(b"early")).await.unwrap();
        let _ = done_rx.await;
    })
    .await;
    let size = 8 * 1024 * 1024;
    let (sender, body) = RequestBody::channel(Some(size as u64), 1);
    let feeder = tokio::spawn(async move {
        let chunk = Bytes::from(vec![b'x'; 64 * 1024]);
        for _ in 0..size / chunk.len() {
            if sender.send(chunk.clone()).await.is_err() {
                return false;
            }
        }
        true
    });
    let request = BackendRequest {
        params: vec![(Bytes::from("REQUEST_METHOD"), Bytes::from("POST"))],
        body,
    };
    let conn = BackendConnection::connect(&addr, Duration::from_secs(5))
        .await
        .unwrap();
    let mut response = tokio::time::timeout(
        Duration::from_secs(10),
        fastcgi::send(conn, request, &options()),
    )
    .await
    .expect("no deadlock")
    .unwrap();
    assert_eq!(read_all(&mut response).await, b"early");
    assert!(
        response.body.take_connection().is_none(),
        "a connection with unsent body is not kept"
    );
    drop(response);
    assert!(!feeder.await.unwrap(), "the body source was dropped");
    let _ = done_tx.send(());
}

#[tokio::test]
async fn the_idle_stack_is_bounded_and_skips_closed_or_noisy_connections() {
    let dir = shared_dir();
    let addr = address(&dir.path().join("nobody-listens.sock"));
    let conns = Connections::new(3);
    let mut backends = Vec::new();
    for _ in 0..4 {
        let (ours, theirs) = tokio::net::UnixStream::pair().unwrap();
        backends.push(theirs);
        conns.put(
            BackendConnection::from_stream(
                Stream::Unix(QuietUnix::from_tokio(ours).unwrap()),
                addr.clone(),
            )
            .unwrap(),
        );
    }
    assert_eq!(conns.idle(&addr), 3, "the fourth was dropped");
    // Newest first: backends[2] closes its end, backends[1] sends stray bytes; get() must
    // skip both and hand out the connection to backends[0].
    drop(backends.remove(2));
    backends[1].write_all(b"junk").await.unwrap();
    // Checkout reads the readiness the reactor keeps: a close or bytes it has not seen yet
    // are for the request to meet. Parked for a moment, the runtime's reactor sees them.
    tokio::time::sleep(Duration::from_millis(20)).await;
    let conn = conns.get(&addr, Duration::from_secs(1)).await.unwrap();
    assert_eq!(conns.idle(&addr), 0);
    // The noisy one was closed by get(); the one handed out is still open.
    let mut rest = Vec::new();
    // (EOF, or a reset since our side closed with its junk unread.)
    let _ = backends[1].read_to_end(&mut rest).await;
    let still_open =
        tokio::time::timeout(Duration::from_millis(100), backends[0].read(&mut [0u8; 1])).await;
    assert!(
        still_open.is_err(),
        "backends[0]'s connection is the one handed out"
    );
    drop(conn);
    // Nothing idle and nobody listening: a connect error, which may be retried.
    let err = conns.get(&addr, Duration::from_secs(1)).await.unwrap_err();
    assert!(matches!(err, BackendError::Connect { .. }), "{err:?}");
    assert!(err.retryable());
    assert_eq!(err.status(), 502);
}
