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
use std::time::Duration;

use bytes::Bytes;
use corral::backend::{
    scgi, BackendConnection, BackendRequest, BackendResponse, ExchangeOptions, RequestBody,
    SpoolConfig,
};
use corral::config::BackendAddress;

use support::peers::{cgi_params, python, shared_dir, write_file, Peer};

/// An SCGI app on the Unix socket named by argv[1]: answers with the method, the body
/// length it was told, the body, and a header; says "ready" once it listens.
const APP: &str = r#"import socket, sys
from scgi.scgi_server import SCGIServer
from scgi.util import SCGIHandler

class Handler(SCGIHandler):
    def produce(self, env, bodysize, input, output):
        body = input.read(bodysize) if bodysize else b''
        text = '%s %s len=%d scgi=%s body=%s' % (
            env['REQUEST_METHOD'], env.get('QUERY_STRING', ''), bodysize,
            env.get('SCGI'), body.decode('latin-1'))
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
    options.spool = SpoolConfig {
        dir: spool_dir.path().into(),
        max_bytes: 1 << 20,
        memory_bytes: 16,
        ..SpoolConfig::default()
    };
    let (sender, body) = RequestBody::channel(None, 1);
    let feeder = tokio::spawn(async move {
        for part in ["chunked ", "body ", "in ", "five ", "parts"] {
            sender.send(Bytes::from(part)).await.unwrap();
        }
    });
    let request = BackendRequest {
        params: cgi_params("PUT", &dir.path().join("app"), "", &[]),
        body,
    };
    let mut response = scgi::send(connect(&app).await, request, &options)
        .await
        .unwrap();
    feeder.await.unwrap();
    assert_eq!(
        body_text(&mut response).await,
        "PUT  len=26 scgi=1 body=chunked body in five parts"
    );
    assert_eq!(
        std::fs::read_dir(spool_dir.path()).unwrap().count(),
        0,
        "the spool file is unlinked"
    );
}
