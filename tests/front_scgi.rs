//! The `scgi` front listener end to end: curl → nginx (`scgi_pass` to corral's Unix socket,
//! Debian's `scgi_params`, which carry no SCRIPT_NAME) → corral → a Python app served by the
//! `scgi` package. The app reports what it saw, so the test checks the derived SCRIPT_NAME and
//! PATH_INFO and that a body arrives intact.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing,
    missing_docs
)]

mod support;

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::time::Duration;

use support::front::{curl, Corral, Nginx};
use support::peers::{md5_hex, python, shared_dir, write_file, Peer};

/// An SCGI app on the Unix socket named by argv[1]: answers with the variables it was given
/// and the md5 of the body; says "ready" once it listens.
const APP: &str = r#"import hashlib, socket, sys
from scgi.scgi_server import SCGIServer
from scgi.util import SCGIHandler

class Handler(SCGIHandler):
    def produce(self, env, bodysize, input, output):
        body = input.read(bodysize) if bodysize else b''
        seen = ' '.join('%s=%s' % (k, env.get(k, '-')) for k in (
            'REQUEST_METHOD', 'SCRIPT_NAME', 'PATH_INFO', 'QUERY_STRING', 'CONTENT_LENGTH',
            'HTTP_HOST', 'HTTP_X_CORRAL_TEST'))
        text = '%s len=%d md5=%s' % (seen, len(body), hashlib.md5(body).hexdigest())
        output.write(b'Status: 201 Created\r\nContent-Type: text/plain\r\n'
                     b'X-App: scgi\r\n\r\n' + text.encode('latin-1'))

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

struct Chain {
    dir: tempfile::TempDir,
    nginx: Nginx,
    corral: Corral,
    _app: Peer,
}

fn chain() -> Chain {
    let dir = shared_dir();
    let script = write_file(dir.path(), "app.py", APP);
    let app = python(&script, &dir.path().join("app.sock"), true);
    let socket = dir.path().join("corral-scgi.sock");
    let config = format!(
        r#"
[server]
# Not {dir} itself: the shared dir is world-writable, which corral refuses.
runtime_dir = "{dir}/run"

[[listen]]
address = "unix:{socket}"
protocol = "scgi"

[pools.app]
protocol = "scgi"
servers = ["unix:{app}"]

[[contexts]]
prefix = "/app"
pool = "app"
"#,
        dir = dir.path().display(),
        socket = socket.display(),
        app = app.socket.display(),
    );
    let corral = Corral::start(dir.path(), &config, &socket);
    let server = format!(
        "    location /app {{\n      include /etc/nginx/scgi_params;\n      \
         scgi_pass unix:{};\n    }}",
        socket.display()
    );
    let nginx = Nginx::start(dir.path(), "", &[server]);
    Chain {
        dir,
        nginx,
        corral,
        _app: app,
    }
}

#[test]
fn get_derives_script_name_and_path_info() {
    let c = chain();
    let r = curl(
        &format!("{}/app/hello/world?page=2", c.nginx.url(0)),
        &["-H", "X-Corral-Test: sesame"],
    );
    assert_eq!(r.status, 201, "{r:?}\n{}", c.corral.log());
    assert_eq!(r.header("x-app"), Some("scgi"));
    assert_eq!(
        r.text(),
        "REQUEST_METHOD=GET SCRIPT_NAME=/app PATH_INFO=/hello/world QUERY_STRING=page=2 \
         CONTENT_LENGTH=0 HTTP_HOST=127.0.0.1 HTTP_X_CORRAL_TEST=sesame len=0 \
         md5=d41d8cd98f00b204e9800998ecf8427e"
    );
}

#[test]
fn post_body_arrives_intact() {
    let c = chain();
    let body: Vec<u8> = (0..3 * 1024 * 1024)
        .map(|i: usize| (i * 13 % 256) as u8)
        .collect();
    let file = c.dir.path().join("body.bin");
    std::fs::write(&file, &body).unwrap();
    let md5 = md5_hex(c.dir.path(), &body);
    let r = curl(
        &format!("{}/app/upload", c.nginx.url(0)),
        &[
            "-H",
            "Content-Type: application/octet-stream",
            "--data-binary",
            &format!("@{}", file.display()),
        ],
    );
    assert_eq!(r.status, 201, "{r:?}\n{}", c.corral.log());
    let len = body.len();
    assert_eq!(
        r.text(),
        format!(
            "REQUEST_METHOD=POST SCRIPT_NAME=/app PATH_INFO=/upload QUERY_STRING= \
             CONTENT_LENGTH={len} HTTP_HOST=127.0.0.1 HTTP_X_CORRAL_TEST=- len={len} md5={md5}"
        )
    );
}

#[test]
fn a_path_outside_every_context_is_404() {
    let c = chain();
    // nginx sends it on (the location matches the prefix string), corral finds no context.
    let r = curl(&format!("{}/application", c.nginx.url(0)), &[]);
    assert_eq!(r.status, 404, "{r:?}");
    // The same with a body corral never reads: it drains it after answering, so the answer
    // is not lost to a connection reset.
    let file = c.dir.path().join("big.bin");
    std::fs::write(&file, vec![b'x'; 4 * 1024 * 1024]).unwrap();
    let r = curl(
        &format!("{}/application", c.nginx.url(0)),
        &["--data-binary", &format!("@{}", file.display())],
    );
    assert_eq!(r.status, 404, "{r:?}\n{}", c.nginx.error_log());
}

#[test]
fn a_broken_head_gets_400_and_a_close() {
    let c = chain();
    let mut s = UnixStream::connect(&c.corral.socket).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    // A netstring whose length is not a number.
    s.write_all(b"12x:CONTENT_LENGTH\x000\x00,").unwrap();
    let mut answer = Vec::new();
    s.read_to_end(&mut answer).unwrap();
    let answer = String::from_utf8_lossy(&answer);
    assert!(
        answer.starts_with("Status: 400 Bad Request\r\n"),
        "{answer:?}"
    );
    c.corral
        .wait_log("scgi client broke the protocol", Duration::from_secs(10));
}

#[test]
fn a_request_without_nginx_is_served_too() {
    let c = chain();
    let mut s = UnixStream::connect(&c.corral.socket).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    // The SCGI head written by hand: CONTENT_LENGTH first, SCGI=1, then the request.
    let head: &[u8] = b"CONTENT_LENGTH\x005\x00SCGI\x001\x00REQUEST_METHOD\x00PUT\x00\
        REQUEST_URI\x00/app/x?y=1\x00QUERY_STRING\x00y=1\x00SERVER_NAME\x00localhost\x00";
    let mut request = format!("{}:", head.len()).into_bytes();
    request.extend_from_slice(head);
    request.extend_from_slice(b",hello");
    s.write_all(&request).unwrap();
    let mut answer = Vec::new();
    s.read_to_end(&mut answer).unwrap();
    let answer = String::from_utf8_lossy(&answer);
    assert!(answer.starts_with("Status: 201 Created\r\n"), "{answer:?}");
    assert!(
        answer.ends_with(
            "REQUEST_METHOD=PUT SCRIPT_NAME=/app PATH_INFO=/x QUERY_STRING=y=1 \
             CONTENT_LENGTH=5 HTTP_HOST=- HTTP_X_CORRAL_TEST=- len=5 \
             md5=5d41402abc4b2a76b9719d911017c592"
        ),
        "{answer:?}"
    );
}
