//! The embedded WSGI launcher behind the real corral binary: a pool with
//! `app = "wsgi:app:application"` serves a test app (wrapped in `wsgiref.validate` where the
//! case allows) over LSAPI, one worker answering sequential requests on one kept connection,
//! and the built-in `corral_demo` app answers through `app = "wsgi:corral_demo:application"`.
//! The recipe conf/wsgi.toml serves examples/wsgi/hello.py with only its paths and port moved.
//! The launcher alone, driven with corral's LSAPI codec, is tested in
//! tests/launcher_wsgi_lsapi.rs (its requests and answers) and tests/launcher_wsgi_process.rs
//! (how it stops).

mod support;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::{Command, Stdio};
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
