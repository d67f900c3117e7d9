//! The SCGI backend exchange against a Python app served by the `scgi` package: a GET, a
//! POST with a body of known length, and one of unknown length that is spooled first.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing,
    missing_docs
)]

mod support;

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use corral::backend::{
    scgi, BackendConnection, BackendRequest, BackendResponse, ExchangeOptions, RequestBody,
    SpoolConfig,
};
use corral::config::BackendAddress;

use support::peers::{cgi_params, md5_hex, python, shared_dir, write_file, Peer};
use support::weak::{assert_spooled_in_flight, spool_files_open, until};

/// An SCGI app on the Unix socket named by argv[1]: answers with the method, the body
/// length it was told, the body, and a header; says "ready" once it listens.
/// Asked with the query `wait`, it reads the body only once a `gate` file is beside its socket,
/// and answers with the body's MD5 in place of the body.
const APP: &str = r#"import hashlib, os, socket, sys, time
from scgi.scgi_server import SCGIServer
from scgi.util import SCGIHandler

class Handler(SCGIHandler):
    def produce(self, env, bodysize, input, output):
        wait = env.get('QUERY_STRING') == 'wait'
        if wait:
            gate = os.path.join(os.path.dirname(sys.argv[1]), 'gate')
            while not os.path.exists(gate):
                time.sleep(0.01)
        body = input.read(bodysize) if bodysize else b''
        shown = hashlib.md5(body).hexdigest() if wait else body.decode('latin-1')
        text = '%s %s len=%d scgi=%s body=%s' % (
            env['REQUEST_METHOD'], env.get('QUERY_STRING', ''), bodysize,
            env.get('SCGI'), shown)
        output.write(b'Status: 201 Created\r\nContent-Type: text/plain\r\n'
                     b'X-Seen-Length: ' + env['CONTENT_LENGTH'].encode() + b'\r\n\r\n'
                     + text.encode('latin-1'))

class UnixServer(SCGIServer):
    def get_listening_socket(self):
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.bind(sys.argv[1])
        return s

    def serve_on_socket(self, s):
        s.listen(40)
        print('ready', flush=True)
        SCGIServer.serve_on_socket(self, s)

UnixServer(handler_class=Handler, max_children=2).serve()
"#;

fn start(dir: &Path) -> Peer {
    let script = write_file(dir, "app.py", APP);
    python(&script, &dir.join("scgi.sock"), true)
}

async fn connect(peer: &Peer) -> BackendConnection {
    BackendConnection::connect(
        &BackendAddress::Unix(peer.socket.clone()),
        Duration::from_secs(5),
    )
    .await
    .unwrap()
}

async fn body_text(response: &mut BackendResponse) -> String {
    let mut all = Vec::new();
    while let Some(chunk) = response.body.next_chunk().await {
        all.extend_from_slice(&chunk.unwrap());
    }
    assert!(response.body.is_ended());
    assert!(
        response.body.take_connection().is_none(),
        "SCGI never reuses a connection"
    );
    String::from_utf8(all).unwrap()
}

#[tokio::test]
async fn scgi_get() {
    let dir = shared_dir();
    let app = start(dir.path());
    let request = BackendRequest {
        params: cgi_params("GET", &dir.path().join("app"), "page=2", &[]),
        body: RequestBody::empty(),
    };
    let options = ExchangeOptions::new("wsgi", 1);
    let mut response = scgi::send(connect(&app).await, request, &options)
        .await
        .unwrap();
    assert_eq!(response.head.status_code(), 201);
    assert_eq!(
        response.head.header(b"x-seen-length").unwrap().as_ref(),
        b"0"
    );
    assert_eq!(
        body_text(&mut response).await,
        "GET page=2 len=0 scgi=1 body="
    );
}

#[tokio::test]
async fn scgi_post_with_body() {
    let dir = shared_dir();
    let app = start(dir.path());
    let body = r#"{"name":"corral","tags":["a","b"]}"#;
    let request = BackendRequest {
        // A stale CONTENT_LENGTH from the caller is replaced by the real one.
        params: cgi_params(
            "POST",
            &dir.path().join("app"),
            "",
            &[
                ("CONTENT_TYPE", "application/json"),
                ("CONTENT_LENGTH", "999"),
            ],
        ),
        body: RequestBody::full(Bytes::from(body)),
    };
    let options = ExchangeOptions::new("wsgi", 2);
    let mut response = scgi::send(connect(&app).await, request, &options)
        .await
        .unwrap();
    assert_eq!(
        response.head.header(b"x-seen-length").unwrap().as_ref(),
        b"34"
    );
    assert_eq!(
        body_text(&mut response).await,
        format!("POST  len=34 scgi=1 body={body}")
    );
}

#[tokio::test]
async fn scgi_post_of_unknown_length_is_spooled() {
    let dir = shared_dir();
    let app = start(dir.path());
    let spool_dir = tempfile::tempdir().unwrap();
    let mut options = ExchangeOptions::new("wsgi", 3);
    let spool = SpoolConfig {
        dir: spool_dir.path().into(),
        max_bytes: 4 << 20,
        memory_bytes: 16,
        ..SpoolConfig::default()
    };
    let budget = Arc::clone(&spool.budget);
    options.spool = Some(spool);
    // Larger than the socket buffers: while the app waits for its gate, the body is in
    // flight and its spool file open.
    let data: Vec<u8> = (0..2_000_000usize).map(|i| (i * 7 % 251) as u8).collect();
    let length = data.len() as u64;
    let md5 = md5_hex(dir.path(), &data);
    let (sender, body) = RequestBody::channel(None, 1);
    let feeder = tokio::spawn(async move {
        for part in data.chunks(100_000) {
            sender.send(Bytes::copy_from_slice(part)).await.unwrap();
        }
    });
    let request = BackendRequest {
        params: cgi_params("PUT", &dir.path().join("app"), "wait", &[]),
        body,
    };
    let conn = connect(&app).await;
    let exchange = tokio::spawn(async move {
        let mut response = scgi::send(conn, request, &options).await.unwrap();
        body_text(&mut response).await
    });
    assert_spooled_in_flight(spool_dir.path(), length, || budget.used()).await;
    feeder.await.unwrap();
    std::fs::write(dir.path().join("gate"), b"").unwrap();
    assert_eq!(
        exchange.await.unwrap(),
        format!("PUT wait len={length} scgi=1 body={md5}")
    );
    assert!(
        until(Duration::from_secs(5), || {
            spool_files_open(spool_dir.path()) == 0 && budget.used() == 0
        })
        .await,
        "the spool file outlived its request"
    );
}
