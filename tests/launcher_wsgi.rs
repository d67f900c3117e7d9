//! The embedded WSGI launcher behind the real corral binary: a pool with
//! `app = "wsgi:app:application"` serves a test app (wrapped in `wsgiref.validate` where the
//! case allows) over LSAPI, one worker answering sequential requests on one kept connection,
//! and the built-in `corral_demo` app answers through `app = "wsgi:corral_demo:application"`.
//! The recipe conf/wsgi.toml serves examples/wsgi/hello.py with only its paths and port moved.
//! The launcher alone, on a Unix listener passed as fd 0, driven with corral's LSAPI codec:
//! malformed or garbage packets close only their connection, the answer is exact and in each
//! request's byte order, PEP 3333's corner cases (exc_info, bad headers, an error after the
//! head, wsgi.input lines, wsgi.file_wrapper) hold, RESP_END leaves with the last bytes of
//! the announced Content-Length, and SIGTERM or SIGINT finish the request in progress, then
//! exit 0, at once when idle between requests.

mod support;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{Shutdown, TcpStream};
use std::os::fd::OwnedFd;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::BytesMut;
use corral::protocols::lsapi::{ByteOrder, FlagRule, RequestBuilder, ResponseEvent};
use corral::protocols::Limits;
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use support::lsapi::{assert_closed_without_answer, read_answer_from, Answer};
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
    try:
        getattr(stream, "input", stream).fileno()  # under the validator's wrapper
        spooled = "file"
    except (AttributeError, OSError):
        spooled = "memory"
    start_response("200 OK", [("Content-Type", "application/octet-stream"),
                              ("X-Body-Md5", digest.hexdigest()),
                              ("X-Content-Length", environ.get("CONTENT_LENGTH", "")),
                              ("X-Body-In", spooled)])
    return [body]

def conn(environ, start_response):
    start_response("200 OK", [("Content-Type", "text/plain")])
    return [b"%d %d" % (os.getpid(), environ["corral.connection_requests"])]

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

def sleep(environ, start_response):
    # Slower than any first_byte_timeout under test: it waits for a file no test writes.
    for _ in range(2000):
        if os.path.exists(os.path.join(HERE, "wake")):
            break
        time.sleep(0.01)
    start_response("200 OK", [("Content-Type", "text/plain")])
    return [b"slept"]

def boom(environ, start_response):
    raise RuntimeError("kaboom from the test app")

ROUTES = {"/echo": validator(echo), "/stream": validator(stream),
          "/write": validator(write), "/boom": boom, "/conn": validator(conn),
          "/sleep": sleep}

def application(environ, start_response):
    app = ROUTES.get(environ["PATH_INFO"], validator(show))
    return app(environ, start_response)
"#;

/// A corral with one http listener in front of a one-worker pool running `app` from `dir`,
/// mounted at `/app` and at the root.
fn start(dir: &Path, app: &str) -> Corral {
    start_with(dir, app, "")
}

/// `start` with `keys` added to the pool.
fn start_with(dir: &Path, app: &str, keys: &str) -> Corral {
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
{keys}

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
    // wsgiref.validate did not warn (up to a marker corral logs after the last answer).
    corral.assert_absent("WSGIWarning");
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
    assert_eq!(r.header("x-body-in"), Some("memory"));

    // 5 MiB: spooled to a temporary file before the app runs, read back whole.
    let huge: Vec<u8> = (0u32..5 << 20)
        .map(|i| (i.wrapping_mul(2_246_822_519) >> 24) as u8)
        .collect();
    let r = http(addr, "POST", "/echo", &[], &huge);
    assert_eq!(r.status, 200, "{}", corral.log());
    assert_eq!(r.header("x-body-in"), Some("file"));
    assert_eq!(r.header("x-content-length"), Some("5242880"));
    assert_eq!(r.header("x-body-md5"), Some(md5sum(&huge).as_str()));
    assert!(r.body == huge, "the echoed 5 MiB body differs");

    // An app that never reads the body still answers whole, and the worker goes on.
    for body in [&big, &huge, &big] {
        let r = http(addr, "POST", "/ignored", &[], body);
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

/// Connections to the workers' sockets under `run`, counted from the accepting side
/// (/proc/net/unix names an accepted socket by its listener's path; state 03 is
/// connected), so neither corral's nor the launcher's own bookkeeping is trusted.
fn worker_connections(run: &Path) -> usize {
    let table = std::fs::read_to_string("/proc/net/unix").unwrap();
    let run = run.display().to_string();
    table
        .lines()
        .filter(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            fields.len() == 8 && fields[5] == "03" && fields[7].starts_with(&run)
        })
        .count()
}

#[test]
fn sequential_requests_share_one_worker_and_one_kept_connection() {
    let dir = app_dir();
    let corral = start(dir.path(), "wsgi:app:application");
    let addr = corral.http_addr();
    let run = dir.path().join("run");
    let answers: Vec<(String, u32, usize)> = (0..8)
        .map(|i| {
            // Some with a body, so the body's framing is kept too.
            let r = if i % 2 == 0 {
                http(addr, "GET", "/conn", &[], b"")
            } else {
                http(addr, "POST", "/conn", &[], b"a body the app never reads")
            };
            assert_eq!(r.status, 200, "{}", corral.log());
            let text = r.text();
            let (pid, n) = text.split_once(' ').unwrap();
            (pid.to_owned(), n.parse().unwrap(), worker_connections(&run))
        })
        .collect();
    let pid = &answers[0].0;
    assert!(answers.iter().all(|(p, _, _)| p == pid), "{answers:?}");
    // Each request is the next one on the same kept LSAPI connection, and that connection
    // is the only one to the worker once each answer is in.
    let first = answers[0].1;
    let counts: Vec<u32> = answers.iter().map(|(_, n, _)| *n).collect();
    assert_eq!(
        counts,
        (first..first + 8).collect::<Vec<_>>(),
        "{answers:?}"
    );
    assert!(answers.iter().all(|(_, _, c)| *c == 1), "{answers:?}");
    corral.assert_absent("bad LSAPI");
}

#[test]
fn first_byte_timeout_covers_the_app_until_its_answer() {
    // The launcher acknowledges a request with the answer's first write, so corral's
    // first-byte deadline runs while the app does (sent alone, REQ_RECEIVED would end it).
    let dir = app_dir();
    let corral = start_with(
        dir.path(),
        "wsgi:app:application",
        "first_byte_timeout = \"1s\"",
    );
    let r = http(corral.http_addr(), "GET", "/sleep", &[], b"");
    assert_eq!(r.status, 504, "{}", corral.log());
}

/// Polls `check` for up to 5 s.
fn eventually(check: impl FnMut() -> bool) -> bool {
    support::eventually(Duration::from_secs(5), check)
}

// ---------------------------------------------------------------------------------------
// The launcher alone, with corral's LSAPI codec as the client

/// The app for the direct cases: each path shows one corner of PEP 3333.
const DIRECT_APP: &str = r#"import os, sys, time

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

    fn connect(&self) -> UnixStream {
        let s = UnixStream::connect(&self.socket).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        s
    }

    fn signal(&self, signal: Signal) {
        kill(Pid::from_raw(self.child.id() as i32), signal).unwrap();
    }

    /// Waits (5 s at most) for the exit code.
    fn exit_code(&mut self) -> Option<i32> {
        let mut status = None;
        assert!(
            eventually(|| {
                status = self.child.try_wait().unwrap();
                status.is_some()
            }),
            "the launcher did not exit:\n{}",
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

/// A BEGIN_REQUEST as corral writes it for `path` (a POST when there is a body), with
/// `vars` as further env pairs and `headers` as HTTP headers, integers in `order`, the body
/// behind it.
fn request(
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

fn get(path: &str) -> Vec<u8> {
    request(path, &[], &[], b"", ByteOrder::NATIVE)
}

/// Reads packets until RESP_END, `partial` holding those read when the connection ends
/// first; nothing may follow RESP_END, since one request was sent.
fn try_read_answer(s: &mut UnixStream, partial: &mut Answer) -> bool {
    let mut buf = BytesMut::new();
    let ended = read_answer_from(s, &mut buf, partial);
    assert!(buf.is_empty(), "bytes after RESP_END: {buf:?}");
    ended
}

fn read_answer(s: &mut UnixStream) -> Answer {
    let mut answer = Answer::default();
    assert!(
        try_read_answer(s, &mut answer),
        "connection closed before RESP_END: {answer:?}"
    );
    answer
}

/// One request on a new connection.
fn exchange(launcher: &Launcher, raw: &[u8]) -> Answer {
    let mut s = launcher.connect();
    s.write_all(raw).unwrap();
    read_answer(&mut s)
}

#[test]
fn the_answer_is_exact_and_the_environ_follows_the_lsapi_request() {
    let dir = shared_dir();
    let launcher = Launcher::start(dir.path());
    // Every answer on one kept connection, each in the byte order of its request.
    let mut s = launcher.connect();
    for order in [ByteOrder::NATIVE, ByteOrder::Big, ByteOrder::Little] {
        s.write_all(&request("/", &[], &[], b"", order)).unwrap();
        let a = read_answer(&mut s);
        let flag = FlagRule::HOST.flag_for(order);
        assert!(a.flags.iter().all(|&f| f == flag), "{order:?}: {a:?}");
        assert_eq!(a.events[0], ResponseEvent::ReqReceived, "{a:?}");
        assert_eq!(a.events.last(), Some(&ResponseEvent::End), "{a:?}");
        assert_eq!((a.status, a.text().as_str()), (201, "hello"));
        assert_eq!(a.lines, ["Content-Type: text/plain"]);
    }
    // HTTPS=on means https; a SCRIPT_NAME of "/" is the root app, PEP 3333's "";
    // Content-Type and Content-Length come from the known-header index, X-Custom-Thing from
    // the unknown-header table.
    s.write_all(&request(
        "env",
        &[("HTTPS", "on"), ("SCRIPT_NAME", "/")],
        &[("Content-Type", "text/plain"), ("X-Custom-Thing", "yes")],
        b"12345",
        ByteOrder::NATIVE,
    ))
    .unwrap();
    assert_eq!(
        read_answer(&mut s).text(),
        "scheme=https script='' path='/env' length='5' type='text/plain' custom='yes'"
    );
    // Hop-by-hop headers are the gateway's: dropped with a log line.
    s.write_all(&get("/hop")).unwrap();
    let a = read_answer(&mut s);
    assert_eq!(
        (a.status, a.lines.as_slice()),
        (200, &["X-Kept: yes".to_owned()][..])
    );
    launcher.wait_log("dropped hop-by-hop header Connection");
    // A reason phrase of the app's own also goes as a Status: line, so a CGI front can
    // relay it.
    s.write_all(&get("/reason")).unwrap();
    let a = read_answer(&mut s);
    assert_eq!(
        (a.status, a.lines.as_slice()),
        (299, &["Status: 299 Custom Reason".to_owned()][..])
    );
}

#[test]
fn wsgi_input_gives_lines_and_ends_at_the_announced_length() {
    let dir = shared_dir();
    let launcher = Launcher::start(dir.path());
    // The bytes after the body are the next request on the connection: the app never sees
    // them, and that request is answered.
    let mut raw = request(
        "/lines",
        &[],
        &[],
        b"one\ntwo\nthree\nfour",
        ByteOrder::NATIVE,
    );
    let mut s = launcher.connect();
    raw.extend_from_slice(&get("/"));
    s.write_all(&raw).unwrap();
    // Both answers may come in one read.
    let mut buf = BytesMut::new();
    let (mut first, mut second) = (Answer::default(), Answer::default());
    assert!(read_answer_from(&mut s, &mut buf, &mut first), "{first:?}");
    assert!(
        read_answer_from(&mut s, &mut buf, &mut second),
        "{second:?}"
    );
    assert_eq!(
        first.text(),
        r#"(b'one\n', b'two', [b'\n', b'three\n', b'four'], b'', b'')"#
    );
    assert_eq!((second.text().as_str(), buf.len()), ("hello", 0));
}

#[test]
fn a_request_written_byte_by_byte_is_read_whole() {
    let dir = shared_dir();
    let launcher = Launcher::start(dir.path());
    let mut s = launcher.connect();
    let body: Vec<u8> = (0..40_000u32).map(|i| b'a' + (i % 26) as u8).collect();
    for b in request("/echo", &[], &[], &body, ByteOrder::NATIVE) {
        s.write_all(&[b]).unwrap();
    }
    let a = read_answer(&mut s);
    assert_eq!(a.body, body);
    // 40000 bytes come back in packets of at most 16 KiB.
    let streams = a
        .events
        .iter()
        .filter(|e| matches!(e, ResponseEvent::Stream(_)))
        .count();
    assert_eq!(streams, 3, "{:?}", a.flags);
}

#[test]
fn a_file_wrapper_answer_arrives_whole_in_packets_of_at_most_16_kib() {
    let dir = shared_dir();
    let data: Vec<u8> = (0..100_000u32)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 24) as u8)
        .collect();
    std::fs::write(dir.path().join("data.bin"), &data).unwrap();
    let launcher = Launcher::start(dir.path());
    let a = exchange(&launcher, &get("/file"));
    assert_eq!(a.status, 200);
    assert!(a.body == data, "the file arrived changed");
    // The app's 10000-byte blocks are sent as they come, each a packet.
    for e in &a.events {
        if let ResponseEvent::Stream(d) = e {
            assert!(d.len() <= 16384, "{}", d.len());
        }
    }
}

#[test]
fn pep_3333_corner_cases() {
    let dir = shared_dir();
    let launcher = Launcher::start(dir.path());
    let error_lines = [
        "Content-Type: text/plain; charset=utf-8",
        "Content-Length: 22",
    ];
    // start_response again with exc_info before the head went out replaces the answer.
    let a = exchange(&launcher, &get("/exc-info"));
    assert_eq!((a.status, a.text().as_str()), (503, "later"));
    assert_eq!(a.lines, ["Content-Type: text/plain", "Retry-After: 1"]);
    // A header value with CR LF, a malformed status, no start_response (with an empty body
    // or with a chunk): 500s, each on the same connection, which stays usable.
    let mut s = launcher.connect();
    for path in ["/bad-header", "/bad-status", "/no-start", "/chunk-no-start"] {
        s.write_all(&get(path)).unwrap();
        let a = read_answer(&mut s);
        assert_eq!(
            (a.status, a.text().as_str()),
            (500, "Internal Server Error\n"),
            "{path}"
        );
        assert_eq!(a.lines, error_lines, "{path}");
    }
    s.write_all(&get("/")).unwrap();
    assert_eq!(read_answer(&mut s).text(), "hello");
    for line in [
        "ValueError: header X-Bad has a value with a control character",
        "ValueError: status 'OK' is not '<3 digits> <reason>'",
        "returned without calling start_response()",
        "gave a body chunk before calling start_response()",
    ] {
        launcher.wait_log(line);
    }
    // An error after the head cuts the answer short: no RESP_END, the connection closed.
    // (The launcher serves one connection at a time: the kept one must go first.)
    drop(s);
    let mut s = launcher.connect();
    s.write_all(&get("/late-error")).unwrap();
    let mut a = Answer::default();
    assert!(!try_read_answer(&mut s, &mut a), "{a:?}");
    assert_eq!((a.status, a.text().as_str()), (200, "partial;"));
    launcher.wait_log("RuntimeError: failed after the head");
    assert_eq!(exchange(&launcher, &get("/")).text(), "hello");
}

#[test]
fn bad_packets_close_the_connection_and_the_launcher_keeps_serving() {
    let dir = shared_dir();
    let launcher = Launcher::start(dir.path());
    let good = request("/", &[], &[], b"", ByteOrder::Little);
    let with = |at: usize, bytes: &[u8]| {
        let mut p = good.clone();
        p[at..at + bytes.len()].copy_from_slice(bytes);
        p
    };
    let garbage: Vec<u8> = (0..4096u32)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
        .collect();
    let cases: Vec<(&str, Vec<u8>, &str)> = vec![
        ("bad magic", with(0, b"XS"), "packet magic"),
        (
            "a response packet type",
            with(2, &[3]),
            "is not BEGIN_REQUEST",
        ),
        // Packet length (little-endian) 65536: over the limit; and one shorter than a
        // request header.
        (
            "too long",
            with(4, &[0x00, 0x00, 0x01, 0x00]),
            "length 65536 is outside",
        ),
        (
            "too short",
            with(4, &[100, 0, 0, 0]),
            "length 100 is outside",
        ),
        // The first env pair's key length (big-endian, after the 44-byte header and the
        // empty special env list) runs past the packet.
        (
            "pair past the end",
            with(48, &[0xff, 0xff]),
            "runs past the",
        ),
        ("zero pair length", with(48, &[0x00, 0x00]), "zero length"),
        // A body length of -1.
        (
            "negative body",
            with(12, &[0xff, 0xff, 0xff, 0xff]),
            "m_reqBodyLen -1",
        ),
        // m_cntEnv one too many: the terminator is read as a pair; a count over 8192.
        ("env count", with(36, &[9, 0, 0, 0]), "zero length"),
        (
            "huge env count",
            with(36, &[0xff, 0xff, 0, 0]),
            "pair counts",
        ),
        // A string offset outside the packet; a header block length that does not end
        // the packet; an unknown-header count that runs past it.
        (
            "offset outside",
            with(16, &[0xff, 0xff, 0, 0]),
            "string offset",
        ),
        (
            "header block length",
            with(8, &[0xff, 0, 0, 0]),
            "sections end at",
        ),
        (
            "unknown header count",
            with(32, &[0xff, 0xff, 0xff, 0x7f]),
            "sections end at",
        ),
        // The peer closes in the middle of the packet, or of its header.
        (
            "truncated",
            good[..good.len() - 3].to_vec(),
            "connection closed inside the BEGIN_REQUEST",
        ),
        (
            "truncated header",
            good[..5].to_vec(),
            "connection closed inside the packet header",
        ),
        // Random bytes.
        ("garbage", garbage, "packet magic"),
    ];
    let n = cases.len();
    let complaints = || launcher.stderr().matches("bad LSAPI request").count();
    for (i, (name, bytes, message)) in cases.into_iter().enumerate() {
        let mut s = launcher.connect();
        // The launcher may close before reading everything: a failed write is fine.
        let _ = s
            .write_all(&bytes)
            .and_then(|()| s.shutdown(Shutdown::Write));
        assert_closed_without_answer(&mut s);
        assert!(
            eventually(|| complaints() == i + 1),
            "{name}: {}",
            launcher.stderr()
        );
        launcher.wait_log(message);
        // The next connection is served.
        assert_eq!(
            exchange(&launcher, &get("/")).text(),
            "hello",
            "after {name}"
        );
    }
    // A bad packet after a good request on the same connection: the answer to the first
    // arrives, then the connection closes.
    let mut s = launcher.connect();
    s.write_all(&get("/")).unwrap();
    assert_eq!(read_answer(&mut s).text(), "hello");
    s.write_all(&with(0, b"XS")).unwrap();
    assert_closed_without_answer(&mut s);
    // A connection that only opens and closes (a readiness probe) is not an error.
    drop(launcher.connect());
    assert_eq!(exchange(&launcher, &get("/")).text(), "hello");
    // One more bad packet is the marker: its complaint is the last line read, so the probe
    // and the good request made none, and nothing before it was a traceback.
    let mut s = launcher.connect();
    let _ = s
        .write_all(&with(0, b"XS"))
        .and_then(|()| s.shutdown(Shutdown::Write));
    assert_closed_without_answer(&mut s);
    assert!(
        eventually(|| complaints() >= n + 2),
        "{}",
        launcher.stderr()
    );
    let log = launcher.stderr();
    assert_eq!(complaints(), n + 2, "{log}");
    assert!(
        log.lines()
            .rfind(|l| l.contains("bad LSAPI request"))
            .is_some_and(|l| l.contains("packet magic")),
        "{log}"
    );
    assert!(!log.contains("Traceback"), "{log}");
}

#[test]
fn resp_end_leaves_with_the_last_bytes_of_the_announced_content_length() {
    // corral stops reading an answer once it has the bytes Content-Length announced and
    // drops an exchange whose RESP_END has not come with them: an end written only when
    // the iterable ends would find the connection closed ("Broken pipe" in the log) and
    // cost corral the connection.
    let dir = shared_dir();
    let launcher = Launcher::start(dir.path());
    let mut s = launcher.connect();
    s.write_all(&get("/length-then-wait")).unwrap();
    let asked = tokio::time::Instant::now();
    let mut answer = Answer::default();
    assert!(
        try_read_answer(&mut s, &mut answer),
        "no RESP_END: {answer:?}\n{}",
        launcher.stderr()
    );
    assert_eq!((answer.status, answer.text().as_str()), (200, "whole"));
    assert!(
        asked.elapsed() < Duration::from_secs(3),
        "RESP_END came only when the iterable ended, after {:?}",
        asked.elapsed()
    );
    // Once the iterable ends, the connection carries the next request.
    std::fs::write(dir.path().join("go"), "").unwrap();
    s.write_all(&get("/")).unwrap();
    assert_eq!(read_answer(&mut s).text(), "hello");
    // (The launcher serves one connection at a time.)
    drop(s);

    // More bytes after the announced ones cannot follow RESP_END: the answer ends at the
    // Content-Length, then the connection closes, and the log says why.
    let mut s = launcher.connect();
    s.write_all(&get("/over-length")).unwrap();
    assert_eq!(read_answer(&mut s).text(), "whole");
    let mut rest = Vec::new();
    s.read_to_end(&mut rest).unwrap();
    assert!(rest.is_empty(), "{rest:?}");
    launcher.wait_log("GET /over-length: the application gave more than its Content-Length");
    // The launcher serves on.
    assert_eq!(exchange(&launcher, &get("/")).text(), "hello");
}

#[test]
fn sigterm_and_sigint_finish_the_request_in_progress_then_exit_0() {
    for signal in [Signal::SIGTERM, Signal::SIGINT] {
        let dir = shared_dir();
        let mut launcher = Launcher::start(dir.path());
        let mut s = launcher.connect();
        s.write_all(&get("/slow")).unwrap();
        assert!(eventually(|| dir.path().join("started").exists()));
        let ticks = dir.path().join("ticks");
        let tick = || {
            std::fs::read_to_string(&ticks)
                .ok()
                .and_then(|t| t.trim().parse::<u32>().ok())
        };
        let at_signal = tick().unwrap_or(0);
        launcher.signal(signal);
        // Python runs signal handlers on the main thread, which runs the app: two rounds of
        // its loop after the signal, the handler has run (or the launcher is gone).
        assert!(eventually(|| {
            tick().is_some_and(|t| t >= at_signal + 2)
                || launcher.child.try_wait().unwrap().is_some()
        }));
        // Still running: the request is not done.
        assert!(
            launcher.child.try_wait().unwrap().is_none(),
            "{signal}: the launcher exited with its request in progress\n{}",
            launcher.stderr()
        );
        std::fs::write(dir.path().join("go"), "").unwrap();
        assert_eq!(read_answer(&mut s).text(), "finished", "{signal}");
        // Then the connection closes and the launcher exits.
        let mut rest = Vec::new();
        s.read_to_end(&mut rest).unwrap();
        assert!(rest.is_empty(), "{rest:?}");
        assert_eq!(launcher.exit_code(), Some(0), "{}", launcher.stderr());

        // An idle launcher, waiting for a connection, stops at once.
        let dir = shared_dir();
        let mut launcher = Launcher::start(dir.path());
        launcher.signal(signal);
        assert_eq!(launcher.exit_code(), Some(0), "{}", launcher.stderr());

        // So does one waiting for the next request on a kept connection.
        let dir = shared_dir();
        let mut launcher = Launcher::start(dir.path());
        let mut s = launcher.connect();
        s.write_all(&get("/")).unwrap();
        assert_eq!(read_answer(&mut s).text(), "hello");
        launcher.signal(signal);
        assert_eq!(launcher.exit_code(), Some(0), "{}", launcher.stderr());
    }
}
