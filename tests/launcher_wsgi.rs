//! The embedded WSGI launcher behind the real corral binary: a pool with
//! `app = "wsgi:app:application"` serves a test app (wrapped in `wsgiref.validate` where the
//! case allows) over SCGI, and the built-in `corral_demo` app answers through
//! `app = "wsgi:corral_demo:application"`. The recipe conf/wsgi.toml serves
//! examples/wsgi/hello.py with only its paths and port moved. The launcher alone, on a Unix
//! listener passed as fd 0 with SCGI bytes written by hand: malformed heads close only their
//! connection, the CGI answer is exact, PEP 3333's corner cases (exc_info, bad headers, an
//! error after the head, wsgi.input lines) hold, and SIGTERM or SIGINT finish the request in
//! progress, then exit 0.

mod support;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::os::fd::OwnedFd;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use support::peers::{shared_dir, write_file};
use support::server::{http, parse_response, Corral};

/// The test app: one WSGI callable per path, most of them checked by `wsgiref.validate`.
const APP: &str = r#"import hashlib, os, time
from wsgiref.validate import validator

HERE = os.path.dirname(os.path.abspath(__file__))

def show(environ, start_response):
    text = "method=%s query=%s script=%r path=%r custom=%s scheme=%s version=%r" % (
        environ["REQUEST_METHOD"], environ["QUERY_STRING"], environ["SCRIPT_NAME"],
        environ["PATH_INFO"], environ.get("HTTP_X_CUSTOM_THING"),
        environ["wsgi.url_scheme"], environ["wsgi.version"])
    start_response("200 OK", [("Content-Type", "text/plain"),
                              ("Set-Cookie", "a=1; Path=/"), ("Set-Cookie", "b=2; Path=/")])
    return [text.encode()]

def echo(environ, start_response):
    stream, digest, parts = environ["wsgi.input"], hashlib.md5(), []
    while True:
        part = stream.read(65536)
        if not part:
            break
        digest.update(part)
        parts.append(part)
    body = b"".join(parts)
    start_response("200 OK", [("Content-Type", "application/octet-stream"),
                              ("X-Body-Md5", digest.hexdigest()),
                              ("X-Content-Length", environ.get("CONTENT_LENGTH", ""))])
    return [body]

class Stream:
    """Yields a chunk, waits until the test creates `go`, yields the rest; close() leaves
    a marker file."""
    def __iter__(self):
        yield b"first;"
        for _ in range(1000):
            if os.path.exists(os.path.join(HERE, "go")):
                break
            time.sleep(0.01)
        yield b"second;"
        yield b""
        yield b"third;"
    def close(self):
        with open(os.path.join(HERE, "closed"), "w") as f:
            f.write("closed")

def stream(environ, start_response):
    start_response("200 OK", [("Content-Type", "text/plain")])
    return Stream()

def write(environ, start_response):
    out = start_response("201 Created", [("Content-Type", "text/plain")])
    out(b"written;")
    return [b"returned"]

def boom(environ, start_response):
    raise RuntimeError("kaboom from the test app")

ROUTES = {"/echo": validator(echo), "/stream": validator(stream),
          "/write": validator(write), "/boom": boom}

def application(environ, start_response):
    app = ROUTES.get(environ["PATH_INFO"], validator(show))
    return app(environ, start_response)
"#;

/// A corral with one http listener in front of a one-worker pool running `app` from `dir`,
/// mounted at `/app` and at the root.
fn start(dir: &Path, app: &str) -> Corral {
    let config = format!(
        r#"
[server]
runtime_dir = "{run}"
grace = "5s"
kill_timeout = "2s"

[[listen]]
address = "127.0.0.1:0"
protocol = "http"

[pools.py]
app = "{app}"
cwd = "{dir}"
mode = "static"
min = 1
max = 1

[[contexts]]
prefix = "/app"
pool = "py"

[[contexts]]
prefix = "/"
pool = "py"
"#,
        run = dir.join("run").display(),
        dir = dir.display(),
    );
    Corral::start(&config, 1)
}

fn app_dir() -> tempfile::TempDir {
    let dir = shared_dir();
    write_file(dir.path(), "app.py", APP);
    dir
}

#[test]
fn a_validated_get_sees_its_query_headers_and_mount_point() {
    let dir = app_dir();
    let corral = start(dir.path(), "wsgi:app:application");
    let addr = corral.http_addr();
    let r = http(
        addr,
        "GET",
        "/some/where?x=1&y=two",
        &[("X-Custom-Thing", "hello")],
        b"",
    );
    assert_eq!(r.status, 200, "{}", corral.log());
    assert_eq!(
        r.text(),
        "method=GET query=x=1&y=two script='' path='/some/where' custom=hello scheme=http \
         version=(1, 0)"
    );
    let cookies: Vec<&str> = r
        .headers
        .iter()
        .filter(|(n, _)| n == "set-cookie")
        .map(|(_, v)| v.as_str())
        .collect();
    assert_eq!(cookies, ["a=1; Path=/", "b=2; Path=/"]);

    // Under the `/app` context the prefix is SCRIPT_NAME and the rest PATH_INFO.
    let r = http(addr, "GET", "/app/some/path?q=1", &[], b"");
    assert_eq!(r.status, 200, "{}", corral.log());
    assert!(
        r.text()
            .starts_with("method=GET query=q=1 script='/app' path='/some/path' "),
        "{}",
        r.text()
    );
    let r = http(addr, "GET", "/app", &[], b"");
    assert!(r.text().contains("script='/app' path=''"), "{}", r.text());
    assert!(
        !corral.log().contains("WSGIWarning"),
        "wsgiref.validate warned:\n{}",
        corral.log()
    );
}

#[test]
fn posted_bodies_arrive_whole_through_wsgi_input() {
    let dir = app_dir();
    let corral = start(dir.path(), "wsgi:app:application");
    let addr = corral.http_addr();
    let r = http(addr, "POST", "/echo", &[], b"hello body");
    assert_eq!(r.status, 200, "{}", corral.log());
    assert_eq!(r.text(), "hello body");
    assert_eq!(r.header("x-content-length"), Some("10"));

    // 1 MiB of non-repeating bytes: echoed back unchanged, and the app's md5 agrees.
    let big: Vec<u8> = (0u32..1 << 20)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 24) as u8)
        .collect();
    let r = http(addr, "POST", "/echo", &[], &big);
    assert_eq!(r.status, 200, "{}", corral.log());
    assert_eq!(r.body.len(), big.len());
    assert!(r.body == big, "the echoed 1 MiB body differs");
    assert_eq!(r.header("x-body-md5"), Some(md5sum(&big).as_str()));

    // An app that never reads the body still answers whole, and the worker goes on.
    for _ in 0..3 {
        let r = http(addr, "POST", "/ignored", &[], &big);
        assert_eq!(r.status, 200, "{}", corral.log());
        assert!(r.text().starts_with("method=POST "), "{}", r.text());
    }

    // An empty POST reads an empty input.
    let r = http(addr, "POST", "/echo", &[], b"");
    assert_eq!((r.status, r.body.len()), (200, 0), "{}", corral.log());
}

/// The md5 of `data` in hex, from coreutils' md5sum (an oracle independent of Python).
fn md5sum(data: &[u8]) -> String {
    let mut child = Command::new("md5sum")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("run md5sum");
    child.stdin.take().unwrap().write_all(data).unwrap();
    let out = child.wait_with_output().unwrap();
    String::from_utf8(out.stdout).unwrap()[..32].to_owned()
}

#[test]
fn a_generator_streams_chunk_by_chunk_and_is_closed() {
    let dir = app_dir();
    let corral = start(dir.path(), "wsgi:app:application");
    let mut s = TcpStream::connect(corral.http_addr()).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.write_all(b"GET /stream HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
        .unwrap();
    // The first chunk must arrive while the generator is still waiting for `go`.
    let mut raw = Vec::new();
    let mut buf = [0u8; 4096];
    while !String::from_utf8_lossy(&raw).contains("first;") {
        let n = s.read(&mut buf).unwrap_or_else(|e| {
            panic!(
                "no first chunk before the app finished ({e}): {:?}\n{}",
                String::from_utf8_lossy(&raw),
                corral.log()
            )
        });
        assert!(n > 0, "closed before the first chunk:\n{}", corral.log());
        raw.extend_from_slice(&buf[..n]);
    }
    assert!(!String::from_utf8_lossy(&raw).contains("second;"));
    std::fs::write(dir.path().join("go"), "").unwrap();
    s.read_to_end(&mut raw).unwrap();
    let r = parse_response(&raw);
    assert_eq!(r.status, 200);
    assert_eq!(r.text(), "first;second;third;");
    assert!(r.header("content-length").is_none(), "{:?}", r.headers);
    let closed = dir.path().join("closed");
    assert!(
        eventually(|| closed.exists()),
        "the iterable's close() was not called:\n{}",
        corral.log()
    );

    // The write() callable comes before the returned iterable.
    let r = http(corral.http_addr(), "GET", "/write", &[], b"");
    assert_eq!((r.status, r.text().as_str()), (201, "written;returned"));
}

#[test]
fn an_app_error_is_a_500_with_the_traceback_in_corrals_log() {
    let dir = app_dir();
    let corral = start(dir.path(), "wsgi:app:application");
    let addr = corral.http_addr();
    let r = http(addr, "GET", "/boom", &[], b"");
    assert_eq!(r.status, 500, "{}", corral.log());
    assert_eq!(r.text(), "Internal Server Error\n");
    assert!(
        corral.wait_log("RuntimeError: kaboom from the test app"),
        "{}",
        corral.log()
    );
    assert!(corral.log().contains("Traceback"), "{}", corral.log());
    // The worker keeps serving.
    let r = http(addr, "GET", "/after", &[], b"");
    assert_eq!(r.status, 200, "{}", corral.log());
}

#[test]
fn the_built_in_demo_app_answers() {
    // No corral_demo.py anywhere: the launcher's own module answers.
    let dir = shared_dir();
    let corral = start(dir.path(), "wsgi:corral_demo:application");
    let addr = corral.http_addr();
    let r = http(addr, "GET", "/hello", &[], b"");
    assert_eq!(r.status, 200, "{}", corral.log());
    assert!(r.header("content-type").unwrap().starts_with("text/html"));
    let page = r.text();
    assert!(page.contains("corral is running"), "{page}");
    assert!(page.contains("WSGI"), "{page}");
    assert!(page.contains("<code>/hello</code>"), "{page}");
    assert!(page.contains("Python"), "{page}");
    let r = http(addr, "GET", "/env", &[], b"");
    assert_eq!(r.status, 200, "{}", corral.log());
    let keys: Vec<&str> = r
        .body
        .split(|&b| b == b'\n')
        .map(|k| std::str::from_utf8(k).unwrap())
        .collect();
    for key in ["PATH_INFO", "REQUEST_METHOD", "wsgi.input", "wsgi.version"] {
        assert!(keys.contains(&key), "{key} missing from {keys:?}");
    }
}

#[test]
fn the_wsgi_recipe_serves_the_example_app() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let read = |p: &str| std::fs::read_to_string(root.join(p)).unwrap();
    // A copy of the example, so Python's bytecode cache is not written into the repository.
    let dir = shared_dir();
    write_file(dir.path(), "hello.py", &read("examples/wsgi/hello.py"));
    let recipe = read("conf/wsgi.toml");
    for old in ["/srv/corral/examples/wsgi", "/run/corral", "127.0.0.1:8080"] {
        assert!(recipe.contains(old), "conf/wsgi.toml no longer says {old}");
    }
    let config = recipe
        .replace(
            "/srv/corral/examples/wsgi",
            &dir.path().display().to_string(),
        )
        .replace("/run/corral", &dir.path().join("run").display().to_string())
        .replace("127.0.0.1:8080", "127.0.0.1:0");
    let corral = Corral::start(&config, 1);
    let addr = corral.http_addr();
    let r = http(addr, "GET", "/hello", &[], b"");
    assert_eq!(r.status, 200, "{}", corral.log());
    assert!(
        r.text().starts_with("Hello from WSGI on Python 3."),
        "{}",
        r.text()
    );
    assert!(r.text().ends_with("You asked for /hello\n"), "{}", r.text());
    let r = http(addr, "POST", "/echo", &[], b"some text");
    assert_eq!((r.status, r.text().as_str()), (200, "some text"));
}

/// Polls `check` every 20 ms for up to 5 s.
fn eventually(mut check: impl FnMut() -> bool) -> bool {
    for _ in 0..250 {
        if check() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    check()
}

// ---------------------------------------------------------------------------------------
// The launcher alone

/// The app for the direct cases: each path shows one corner of PEP 3333.
const DIRECT_APP: &str = r#"import os, sys, time

HERE = os.path.dirname(os.path.abspath(__file__))

def text(start_response, body, status="200 OK"):
    start_response(status, [("Content-Type", "text/plain")])
    return [body.encode()]

def application(environ, start_response):
    path = environ["PATH_INFO"]
    if path == "/env":
        return text(start_response, "scheme=%s script=%r path=%r length=%r type=%r" % (
            environ["wsgi.url_scheme"], environ["SCRIPT_NAME"], environ["PATH_INFO"],
            environ.get("CONTENT_LENGTH"), environ.get("CONTENT_TYPE")))
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
    if path == "/slow":
        open(os.path.join(HERE, "started"), "w").close()
        for _ in range(1000):
            if os.path.exists(os.path.join(HERE, "go")):
                break
            time.sleep(0.01)
        return text(start_response, "finished")
    return text(start_response, "hello", "201 Created")
"#;

/// `python3 corral-wsgi.py direct:application` on a Unix listener passed as fd 0; killed on
/// drop.
struct Launcher {
    child: Child,
    socket: PathBuf,
    stderr: Arc<Mutex<String>>,
}

impl Launcher {
    fn start(dir: &Path) -> Launcher {
        write_file(dir, "direct.py", DIRECT_APP);
        let script = write_file(dir, "corral-wsgi.py", corral::launchers::WSGI);
        let socket = dir.join("wsgi.sock");
        let listener: OwnedFd = UnixListener::bind(&socket).unwrap().into();
        let mut child = Command::new("python3")
            .arg(&script)
            .arg("direct:application")
            .current_dir(dir)
            .stdin(Stdio::from(listener))
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("run python3");
        let pipe = child.stderr.take().unwrap();
        let stderr = Arc::new(Mutex::new(String::new()));
        let sink = Arc::clone(&stderr);
        std::thread::spawn(move || {
            for line in BufReader::new(pipe).lines().map_while(Result::ok) {
                let mut text = sink.lock().unwrap();
                text.push_str(&line);
                text.push('\n');
            }
        });
        let launcher = Launcher {
            child,
            socket,
            stderr,
        };
        assert!(
            eventually(|| launcher.stderr().contains("serving direct:application")),
            "the launcher did not start:\n{}",
            launcher.stderr()
        );
        launcher
    }

    fn stderr(&self) -> String {
        self.stderr.lock().unwrap().clone()
    }

    /// Waits until the launcher has logged `needle` (read on another thread, so a line may
    /// trail the answer it belongs to).
    fn wait_log(&self, needle: &str) {
        assert!(
            eventually(|| self.stderr().contains(needle)),
            "no log line saying {needle:?}:\n{}",
            self.stderr()
        );
    }

    /// Sends `raw` on a new connection and reads until the launcher closes it.
    fn exchange(&self, raw: &[u8]) -> String {
        let mut s = UnixStream::connect(&self.socket).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        s.write_all(raw).unwrap();
        let mut out = Vec::new();
        // A reset (the launcher closed with our bytes unread) also ends the answer.
        let _ = s.read_to_end(&mut out);
        String::from_utf8(out).unwrap()
    }

    fn get(&self, path: &str) -> String {
        self.exchange(&scgi(&[("PATH_INFO", path)], b""))
    }

    /// Sends `signal` and waits (10 s at most) for the exit code.
    fn stop(&mut self, signal: nix::sys::signal::Signal) -> Option<i32> {
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(self.child.id() as i32), signal).unwrap();
        let mut status = None;
        assert!(
            eventually(|| {
                status = self.child.try_wait().unwrap();
                status.is_some()
            }),
            "the launcher did not exit on {signal}:\n{}",
            self.stderr()
        );
        status.and_then(|s| s.code())
    }
}

impl Drop for Launcher {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// An SCGI request written the way the SCGI specification lays it out: a netstring whose
/// payload is NUL-terminated name/value pairs, CONTENT_LENGTH first, SCGI=1, then the body.
fn scgi(vars: &[(&str, &str)], body: &[u8]) -> Vec<u8> {
    let length = body.len().to_string();
    let mut head: Vec<(&str, &str)> = vec![
        ("CONTENT_LENGTH", &length),
        ("SCGI", "1"),
        ("REQUEST_METHOD", "POST"),
        ("SERVER_NAME", "localhost"),
        ("SERVER_PORT", "80"),
        ("SERVER_PROTOCOL", "HTTP/1.1"),
        ("SCRIPT_NAME", ""),
        ("QUERY_STRING", ""),
    ];
    // A variable in `vars` replaces the default of the same name (SCGI forbids repeats).
    head.retain(|(name, _)| !vars.iter().any(|(n, _)| n == name));
    head.extend_from_slice(vars);
    let mut payload = Vec::new();
    for (name, value) in head {
        payload.extend_from_slice(name.as_bytes());
        payload.push(0);
        payload.extend_from_slice(value.as_bytes());
        payload.push(0);
    }
    let mut raw = format!("{}:", payload.len()).into_bytes();
    raw.extend_from_slice(&payload);
    raw.push(b',');
    raw.extend_from_slice(body);
    raw
}

#[test]
fn the_cgi_answer_is_exact_and_the_environ_follows_the_scgi_variables() {
    let dir = shared_dir();
    let launcher = Launcher::start(dir.path());
    assert_eq!(
        launcher.get("/"),
        "Status: 201 Created\r\nContent-Type: text/plain\r\n\r\nhello"
    );
    // HTTPS=on means https; a SCRIPT_NAME of "/" is the root app, PEP 3333's "".
    let r = launcher.exchange(&scgi(
        &[
            ("HTTPS", "on"),
            ("SCRIPT_NAME", "/"),
            ("PATH_INFO", "env"),
            ("CONTENT_TYPE", "text/plain"),
        ],
        b"12345",
    ));
    assert!(
        r.ends_with("scheme=https script='' path='/env' length='5' type='text/plain'"),
        "{r}"
    );
    // Hop-by-hop headers are the gateway's: dropped with a log line.
    assert_eq!(
        launcher.get("/hop"),
        "Status: 200 OK\r\nX-Kept: yes\r\n\r\nhop"
    );
    launcher.wait_log("dropped hop-by-hop header Connection");
}

#[test]
fn wsgi_input_gives_lines_and_ends_at_content_length() {
    let dir = shared_dir();
    let launcher = Launcher::start(dir.path());
    // Bytes after CONTENT_LENGTH are not the app's: it must never see "EXTRA".
    let mut raw = scgi(&[("PATH_INFO", "/lines")], b"one\ntwo\nthree\nfour");
    raw.extend_from_slice(b"EXTRA");
    let r = launcher.exchange(&raw);
    assert!(
        r.ends_with(r#"(b'one\n', b'two', [b'\n', b'three\n', b'four'], b'', b'')"#),
        "{r}"
    );
}

#[test]
fn pep_3333_corner_cases() {
    let dir = shared_dir();
    let launcher = Launcher::start(dir.path());
    const ERROR: &str = "Status: 500 Internal Server Error\r\n\
                         Content-Type: text/plain; charset=utf-8\r\n\
                         Content-Length: 22\r\n\r\nInternal Server Error\n";
    // start_response again with exc_info before the head went out replaces the answer.
    assert_eq!(
        launcher.get("/exc-info"),
        "Status: 503 Service Unavailable\r\nContent-Type: text/plain\r\nRetry-After: 1\r\n\r\nlater"
    );
    // A header value with CR LF, a malformed status, no start_response (with an empty body
    // or with a chunk): 500s.
    for path in ["/bad-header", "/bad-status", "/no-start", "/chunk-no-start"] {
        assert_eq!(launcher.get(path), ERROR, "{path}");
    }
    for line in [
        "ValueError: header X-Bad has a value with a control character",
        "ValueError: status 'OK' is not '<3 digits> <reason>'",
        "returned without calling start_response()",
        "gave a body chunk before calling start_response()",
    ] {
        launcher.wait_log(line);
    }
    // An error after the head cuts the answer short; the traceback is logged.
    assert_eq!(
        launcher.get("/late-error"),
        "Status: 200 OK\r\nContent-Type: text/plain\r\n\r\npartial;"
    );
    launcher.wait_log("RuntimeError: failed after the head");
}

#[test]
fn malformed_scgi_heads_close_their_connection_and_the_launcher_keeps_serving() {
    let dir = shared_dir();
    let launcher = Launcher::start(dir.path());
    let cases: &[(&[u8], &str)] = &[
        // netstring length with a leading zero
        (b"024:CONTENT_LENGTH\x000\x00SCGI\x001\x00,", "leading zero"),
        // a length that is not a number
        (b"x4:CONTENT_LENGTH\x000\x00SCGI\x001\x00,", "not a digit"),
        // a 65 537-byte head announced: over the 64 KiB bound, refused before reading it
        (b"65537:CONTENT_LENGTH\x00", "over the 65536 byte limit"),
        // six digits: refused before the ':'
        (b"100000", "more than 5 digits"),
        // the netstring's closing ',' is a ';'
        (
            b"24:CONTENT_LENGTH\x000\x00SCGI\x001\x00;",
            "does not end with ','",
        ),
        // the payload does not end with NUL
        (
            b"23:CONTENT_LENGTH\x000\x00SCGI\x001,",
            "does not end with NUL",
        ),
        // a name with no value
        (
            b"28:CONTENT_LENGTH\x000\x00SCGI\x001\x00ODD\x00,",
            "name without a value",
        ),
        // CONTENT_LENGTH not first
        (
            b"24:SCGI\x001\x00CONTENT_LENGTH\x000\x00,",
            "does not start with CONTENT_LENGTH",
        ),
        // CONTENT_LENGTH not a number
        (
            b"25:CONTENT_LENGTH\x00-1\x00SCGI\x001\x00,",
            "is not a decimal number",
        ),
        // SCGI=1 missing
        (b"17:CONTENT_LENGTH\x000\x00,", "does not carry SCGI=1"),
        // a variable twice
        (
            b"31:CONTENT_LENGTH\x000\x00SCGI\x001\x00SCGI\x001\x00,",
            "repeats the variable SCGI",
        ),
        // the peer closes in the middle of the head
        (
            b"24:CONTENT_LENGTH\x00",
            "connection closed inside the SCGI head",
        ),
    ];
    for (raw, message) in cases {
        let mut s = UnixStream::connect(&launcher.socket).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        s.write_all(raw).unwrap();
        s.shutdown(std::net::Shutdown::Write).unwrap();
        let mut out = Vec::new();
        let _ = s.read_to_end(&mut out);
        assert!(out.is_empty(), "{message}: answered {out:?}");
        launcher.wait_log(message);
        assert!(launcher.get("/").ends_with("hello"), "after {message}");
    }
    // A connection closed before any byte is no error at all.
    drop(UnixStream::connect(&launcher.socket).unwrap());
    assert!(launcher.get("/").ends_with("hello"));
    let bad = launcher.stderr().matches("bad SCGI request").count();
    assert_eq!(bad, cases.len(), "{}", launcher.stderr());
}

#[test]
fn sigterm_and_sigint_finish_the_request_in_progress_then_exit_0() {
    use nix::sys::signal::Signal;
    for signal in [Signal::SIGTERM, Signal::SIGINT] {
        let dir = shared_dir();
        let mut launcher = Launcher::start(dir.path());
        let socket = launcher.socket.clone();
        let request = std::thread::spawn(move || {
            let mut s = UnixStream::connect(socket).unwrap();
            s.write_all(&scgi(&[("PATH_INFO", "/slow")], b"")).unwrap();
            let mut out = String::new();
            s.read_to_string(&mut out).unwrap();
            out
        });
        assert!(eventually(|| dir.path().join("started").exists()));
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(launcher.child.id() as i32),
            signal,
        )
        .unwrap();
        // Still running: the request is not done.
        std::thread::sleep(Duration::from_millis(100));
        assert!(launcher.child.try_wait().unwrap().is_none(), "{signal}");
        std::fs::write(dir.path().join("go"), "").unwrap();
        assert!(request.join().unwrap().ends_with("finished"), "{signal}");
        let mut status = None;
        assert!(eventually(|| {
            status = launcher.child.try_wait().unwrap();
            status.is_some()
        }));
        assert_eq!(status.unwrap().code(), Some(0), "{}", launcher.stderr());

        // An idle launcher stops at once.
        let dir = shared_dir();
        let mut launcher = Launcher::start(dir.path());
        assert_eq!(launcher.stop(signal), Some(0), "{}", launcher.stderr());
    }
}
