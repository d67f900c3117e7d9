//! The WSGI launcher on its own, shared by `tests/launcher_wsgi_lsapi.rs` and
//! `tests/launcher_wsgi_process.rs`: the app those tests run (each path one corner of PEP
//! 3333), the launcher started on it, and corral's LSAPI codec as the client (a
//! BEGIN_REQUEST as corral writes it, an answer read to its RESP_END).

use std::io::Write;
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::process::Command;

use bytes::BytesMut;
use corral::protocols::lsapi::{ByteOrder, FlagRule, RequestBuilder};
use corral::protocols::Limits;

use super::launcher::Launcher;
use super::lsapi::{read_answer_from, Answer};
use super::peers::write_file;

/// The app for the direct cases: each path shows one corner of PEP 3333.
pub const DIRECT_APP: &str = r#"import os, sys, time

HERE = os.path.dirname(os.path.abspath(__file__))

def text(start_response, body, status="200 OK"):
    start_response(status, [("Content-Type", "text/plain")])
    return [body.encode()]

def application(environ, start_response):
    path = environ["PATH_INFO"]
    if path == "/env":
        return text(start_response, "scheme=%s script=%r path=%r length=%r type=%r custom=%r" % (
            environ["wsgi.url_scheme"], environ["SCRIPT_NAME"], environ["PATH_INFO"],
            environ.get("CONTENT_LENGTH"), environ.get("CONTENT_TYPE"),
            environ.get("HTTP_X_CUSTOM_THING")))
    if path == "/echo":
        return text(start_response, environ["wsgi.input"].read().decode("latin-1"))
    if path == "/lines":
        body = environ["wsgi.input"]
        first = body.readline()
        three = body.read(3)
        rest = list(body)
        return text(start_response, repr((first, three, rest, body.read(), body.readline())))
    if path == "/exc-info":
        start_response("200 OK", [("Content-Type", "text/plain")])
        try:
            raise ValueError("changed my mind")
        except ValueError:
            start_response("503 Service Unavailable", [("Content-Type", "text/plain"),
                                                       ("Retry-After", "1")], sys.exc_info())
        return [b"later"]
    if path == "/reason":
        start_response("299 Custom Reason", [])
        return [b"custom"]
    if path == "/bad-header":
        start_response("200 OK", [("X-Bad", "one\r\nX-Injected: two")])
        return [b"never"]
    if path == "/bad-status":
        start_response("OK", [])
        return [b"never"]
    if path == "/no-start":
        return []
    if path == "/chunk-no-start":
        return [b"never"]
    if path == "/hop":
        start_response("200 OK", [("Connection", "close"), ("X-Kept", "yes")])
        return [b"hop"]
    if path == "/late-error":
        def gen():
            yield b"partial;"
            raise RuntimeError("failed after the head")
        start_response("200 OK", [("Content-Type", "text/plain")])
        return gen()
    if path == "/length-then-wait":
        # The body its Content-Length announces, then an iterable that ends once `go` is
        # there (6 s at most).
        def gen():
            yield b"whole"
            for _ in range(600):
                if os.path.exists(os.path.join(HERE, "go")):
                    break
                time.sleep(0.01)
        start_response("200 OK", [("Content-Length", "5")])
        return gen()
    if path == "/over-length":
        start_response("200 OK", [("Content-Length", "5")])
        return (part for part in [b"whole", b"", b"and more"])
    if path == "/file":
        start_response("200 OK", [("Content-Type", "application/octet-stream")])
        return environ["wsgi.file_wrapper"](open(os.path.join(HERE, "data.bin"), "rb"), 10000)
    if path == "/slow":
        # Runs until the test writes `go`, counting its rounds in `ticks`.
        open(os.path.join(HERE, "started"), "w").close()
        for i in range(2000):
            if os.path.exists(os.path.join(HERE, "go")):
                break
            with open(os.path.join(HERE, "ticks"), "w") as f:
                f.write(str(i))
            time.sleep(0.01)
        return text(start_response, "finished")
    return text(start_response, "hello", "201 Created")
"#;

impl Launcher {
    /// `python3 corral-wsgi.py direct:application` in `dir`, on a Unix listener passed as
    /// fd 0; killed on drop.
    pub fn wsgi(dir: &Path) -> Launcher {
        write_file(dir, "direct.py", DIRECT_APP);
        let script = write_file(dir, "corral-wsgi.py", corral::launchers::WSGI);
        let mut cmd = Command::new("python3");
        cmd.arg(&script).arg("direct:application");
        Launcher::spawn(cmd, dir, "wsgi.sock", "serving direct:application", None)
    }
}

/// A BEGIN_REQUEST as corral writes it for `path` (a POST when there is a body), with
/// `vars` as further env pairs and `headers` as HTTP headers, integers in `order`, the body
/// behind it.
pub fn request(
    path: &str,
    vars: &[(&str, &str)],
    headers: &[(&str, &str)],
    body: &[u8],
    order: ByteOrder,
) -> Vec<u8> {
    let method = if body.is_empty() { "GET" } else { "POST" };
    let line = format!("{method} {path} HTTP/1.1");
    let mut b = RequestBuilder::new(&Limits::DEFAULT, line.as_bytes())
        .unwrap()
        .with_byte_order(order, FlagRule::HOST);
    let mut env: Vec<(&str, &str)> = vec![
        ("REQUEST_METHOD", method),
        ("SCRIPT_NAME", ""),
        ("SCRIPT_FILENAME", ""),
        ("PATH_INFO", path),
        ("QUERY_STRING", ""),
        ("SERVER_NAME", "localhost"),
        ("SERVER_PORT", "80"),
        ("SERVER_PROTOCOL", "HTTP/1.1"),
    ];
    // A variable in `vars` replaces the default of the same name.
    env.retain(|(name, _)| !vars.iter().any(|(n, _)| n == name));
    env.extend_from_slice(vars);
    for (name, value) in env {
        b.env(name.as_bytes(), value.as_bytes()).unwrap();
    }
    b.header(b"Host", b"localhost").unwrap();
    for (name, value) in headers {
        b.header(name.as_bytes(), value.as_bytes()).unwrap();
    }
    if !body.is_empty() {
        b.header(b"Content-Length", body.len().to_string().as_bytes())
            .unwrap();
        b.body_len(body.len() as u64);
    }
    let mut out = BytesMut::new();
    b.encode(&mut out).unwrap();
    out.extend_from_slice(body);
    out.to_vec()
}

pub fn get(path: &str) -> Vec<u8> {
    request(path, &[], &[], b"", ByteOrder::NATIVE)
}

/// Reads packets until RESP_END, `partial` holding those read when the connection ends
/// first; nothing may follow RESP_END, since one request was sent.
pub fn try_read_answer(s: &mut UnixStream, partial: &mut Answer) -> bool {
    let mut buf = BytesMut::new();
    let ended = read_answer_from(s, &mut buf, partial);
    assert!(buf.is_empty(), "bytes after RESP_END: {buf:?}");
    ended
}

pub fn read_answer(s: &mut UnixStream) -> Answer {
    let mut answer = Answer::default();
    assert!(
        try_read_answer(s, &mut answer),
        "connection closed before RESP_END: {answer:?}"
    );
    answer
}

/// One request on a new connection.
pub fn exchange(launcher: &Launcher, raw: &[u8]) -> Answer {
    let mut s = launcher.connect();
    s.write_all(raw).unwrap();
    read_answer(&mut s)
}
