//! The FastCGI backend exchange against a real php-cgi and a flup WSGI app, and against tiny
//! fake backends for the faults real ones do not commit (garbage, silence, a cut response,
//! a client that goes away).

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing,
    missing_docs
)]

mod support;

use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use corral::backend::{
    fastcgi, BackendConnection, BackendError, BackendRequest, BackendResponse, Connections,
    ExchangeOptions, RequestBody, StderrSink, Timeouts,
};
use corral::config::BackendAddress;
use corral::net::{QuietUnix, Stream};
use corral::protocols::cgi_response::ResponseKind;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::UnixListener;

use support::peers::{cgi_params, md5_hex, php_cgi, python, shared_dir, write_file};

const TEN_MIB: usize = 10 * 1024 * 1024;

fn options() -> ExchangeOptions {
    let mut options = ExchangeOptions::new("php", 7);
    options.timeouts = Timeouts {
        connect: Duration::from_secs(5),
        first_byte: Duration::from_secs(20),
        request: Duration::from_secs(60),
    };
    options
}

fn address(socket: &Path) -> BackendAddress {
    BackendAddress::Unix(socket.to_path_buf())
}

async fn connect(socket: &Path) -> BackendConnection {
    BackendConnection::connect(&address(socket), Duration::from_secs(5))
        .await
        .unwrap()
}

/// Reads the whole body, checking that no chunk is larger than a FastCGI record.
async fn read_all(response: &mut BackendResponse) -> Vec<u8> {
    let mut all = Vec::new();
    while let Some(chunk) = response.body.next_chunk().await {
        let chunk = chunk.unwrap();
        assert!(chunk.len() <= 65535, "chunk of {} bytes", chunk.len());
        all.extend_from_slice(&chunk);
    }
    assert!(response.body.is_ended());
    all
}

fn header<'a>(response: &'a BackendResponse, name: &str) -> Vec<&'a [u8]> {
    response
        .head
        .headers()
        .iter()
        .filter(|(n, _)| n.eq_ignore_ascii_case(name.as_bytes()))
        .map(|(_, v)| v.as_ref())
        .collect()
}

#[tokio::test]
async fn php_get_hello() {
    let dir = shared_dir();
    let script = write_file(
        dir.path(),
        "hello.php",
        "<?php echo 'Hello, ', $_GET['name'] ?? 'nobody', \"\\n\";",
    );
    let php = php_cgi(dir.path());
    let request = BackendRequest {
        params: cgi_params("GET", &script, "name=corral", &[]),
        body: RequestBody::empty(),
    };
    let mut response = fastcgi::send(connect(&php.socket).await, request, &options())
        .await
        .unwrap();
    assert_eq!(response.head.status_code(), 200);
    assert_eq!(response.head.kind(), ResponseKind::Document);
    assert_eq!(
        header(&response, "content-type"),
        vec![&b"text/html; charset=UTF-8"[..]]
    );
    assert_eq!(read_all(&mut response).await, b"Hello, corral\n");
    assert!(
        response.body.take_connection().is_some(),
        "KEEP_CONN keeps it"
    );
}

#[tokio::test]
async fn php_post_form_body() {
    let dir = shared_dir();
    let script = write_file(
        dir.path(),
        "form.php",
        "<?php echo $_SERVER['REQUEST_METHOD'], ' ', $_POST['name'], ' ', $_POST['lang'];",
    );
    let php = php_cgi(dir.path());
    let body = "name=corral&lang=rust%20%26%20c";
    let length = body.len().to_string();
    let request = BackendRequest {
        params: cgi_params(
            "POST",
            &script,
            "",
            &[
                ("CONTENT_TYPE", "application/x-www-form-urlencoded"),
                ("CONTENT_LENGTH", &length),
            ],
        ),
        body: RequestBody::full(Bytes::from(body)),
    };
    let mut response = fastcgi::send(connect(&php.socket).await, request, &options())
        .await
        .unwrap();
    assert_eq!(read_all(&mut response).await, b"POST corral rust & c");
}

#[tokio::test]
async fn php_streams_a_10_mib_upload() {
    let dir = shared_dir();
    let script = write_file(
        dir.path(),
        "upload.php",
        "<?php $d = file_get_contents('php://input'); echo strlen($d), ' ', md5($d);",
    );
    let php = php_cgi(dir.path());
    let data: Vec<u8> = (0..TEN_MIB).map(|i| (i * 7 % 251) as u8).collect();
    let expected = format!("{} {}", TEN_MIB, md5_hex(dir.path(), &data));
    let length = TEN_MIB.to_string();
    let (sender, body) = RequestBody::channel(Some(TEN_MIB as u64), 2);
    let feeder = tokio::spawn(async move {
        for chunk in data.chunks(100_000) {
            sender.send(Bytes::copy_from_slice(chunk)).await.unwrap();
        }
    });
    let request = BackendRequest {
        params: cgi_params(
            "POST",
            &script,
            "",
            &[
                ("CONTENT_TYPE", "application/octet-stream"),
                ("CONTENT_LENGTH", &length),
            ],
        ),
        body,
    };
    let mut response = fastcgi::send(connect(&php.socket).await, request, &options())
        .await
        .unwrap();
    let text = read_all(&mut response).await;
    feeder.await.unwrap();
    assert_eq!(String::from_utf8(text).unwrap(), expected);
}

#[tokio::test]
async fn php_streams_a_10_mib_download() {
    let dir = shared_dir();
    let script = write_file(
        dir.path(),
        "download.php",
        "<?php $s = str_repeat('0123456789abcdef', 65536); for ($i = 0; $i < 10; $i++) { echo $s; }",
    );
    let php = php_cgi(dir.path());
    let request = BackendRequest {
        params: cgi_params("GET", &script, "", &[]),
        body: RequestBody::empty(),
    };
    let mut response = fastcgi::send(connect(&php.socket).await, request, &options())
        .await
        .unwrap();
    let mut total = 0usize;
    let mut chunks = 0usize;
    while let Some(chunk) = response.body.next_chunk().await {
        let chunk = chunk.unwrap();
        assert!(chunk.len() <= 65535);
        for (i, b) in chunk.iter().enumerate() {
            assert_eq!(*b, b"0123456789abcdef"[(total + i) % 16]);
        }
        total += chunk.len();
        chunks += 1;
    }
    assert_eq!(total, TEN_MIB);
    assert!(chunks >= 160, "streamed in {chunks} chunks");
}

#[tokio::test]
async fn php_404_with_two_cookies_and_stderr() {
    let dir = shared_dir();
    let script = write_file(
        dir.path(),
        "missing.php",
        "<?php http_response_code(404); setcookie('a', '1'); \
         setcookie('b', 'two', ['path' => '/', 'httponly' => true]); \
         error_log('corral test: something went wrong'); echo \"not found\\n\";",
    );
    let php = php_cgi(dir.path());
    let seen = Arc::new(Mutex::new(Vec::<u8>::new()));
    let sink_seen = seen.clone();
    let sink: StderrSink = Arc::new(move |text: &[u8]| {
        sink_seen.lock().unwrap().extend_from_slice(text);
    });
    let mut options = options();
    options.stderr = Some(sink);
    let request = BackendRequest {
        params: cgi_params("GET", &script, "", &[]),
        body: RequestBody::empty(),
    };
    let mut response = fastcgi::send(connect(&php.socket).await, request, &options)
        .await
        .unwrap();
    assert_eq!(response.head.status_code(), 404);
    assert_eq!(
        header(&response, "set-cookie"),
        vec![&b"a=1"[..], &b"b=two; path=/; HttpOnly"[..]]
    );
    assert_eq!(read_all(&mut response).await, b"not found\n");
    let seen = String::from_utf8(seen.lock().unwrap().clone()).unwrap();
    assert!(
        seen.contains("corral test: something went wrong"),
        "stderr seen: {seen:?}"
    );
}

#[tokio::test]
async fn php_location_is_a_client_redirect() {
    let dir = shared_dir();
    let script = write_file(
        dir.path(),
        "go.php",
        "<?php header('Location: /elsewhere');",
    );
    let php = php_cgi(dir.path());
    let request = BackendRequest {
        params: cgi_params("GET", &script, "", &[]),
        body: RequestBody::empty(),
    };
    let mut response = fastcgi::send(connect(&php.socket).await, request, &options())
        .await
        .unwrap();
    // php-cgi adds "Status: 302 Found", so this is not a local redirect.
    assert_eq!(response.head.status_code(), 302);
    assert_eq!(
        response.head.kind(),
        ResponseKind::ClientRedirect {
            location: b"/elsewhere"
        }
    );
    assert_eq!(read_all(&mut response).await, b"");
}

#[tokio::test]
async fn php_serves_several_requests_on_one_kept_connection() {
    let dir = shared_dir();
    let script = write_file(dir.path(), "pid.php", "<?php echo getmypid();");
    let php = php_cgi(dir.path());
    let conns = Connections::new(2);
    let addr = address(&php.socket);
    let mut pids = Vec::new();
    for _ in 0..4 {
        let conn = conns.get(&addr, Duration::from_secs(5)).await.unwrap();
        let request = BackendRequest {
            params: cgi_params("GET", &script, "", &[]),
            body: RequestBody::empty(),
        };
        let mut response = fastcgi::send(conn, request, &options()).await.unwrap();
        pids.push(String::from_utf8(read_all(&mut response).await).unwrap());
        assert_eq!(
            conns.idle(&addr),
            1,
            "the connection went back to the stack"
        );
    }
    assert!(pids.iter().all(|p| *p == php.pid().to_string()), "{pids:?}");
    // php-cgi (PHP_FCGI_CHILDREN=0) serves one connection at a time: a second connection
    // would hang while the first is kept, so four answers prove the reuse.
    let conn = conns.get(&addr, Duration::from_secs(5)).await.unwrap();
    assert_eq!(conn.requests_served(), 4);
}

#[tokio::test]
async fn flup_wsgi_app_answers_a_get() {
    let dir = shared_dir();
    let script = write_file(
        dir.path(),
        "app.py",
        r#"import sys
from flup.server.fcgi import WSGIServer

def app(environ, start_response):
    start_response('200 OK', [('Content-Type', 'text/plain'), ('X-App', 'flup')])
    return [b'hello from flup ', environ.get('QUERY_STRING', '').encode()]

WSGIServer(app, bindAddress=sys.argv[1]).run()
"#,
    );
    let socket = dir.path().join("flup.sock");
    let flup = python(&script, &socket, false);
    let request = BackendRequest {
        params: cgi_params("GET", &script, "x=1", &[]),
        body: RequestBody::empty(),
    };
    let mut response = fastcgi::send(connect(&flup.socket).await, request, &options())
        .await
        .unwrap();
    assert_eq!(response.head.status_code(), 200);
    assert_eq!(header(&response, "x-app"), vec![&b"flup"[..]]);
    assert_eq!(read_all(&mut response).await, b"hello from flup x=1");
}

// ---- fault injection with a fake backend -------------------------------------------------

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
