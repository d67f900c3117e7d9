//! The native WSGI worker (`workers/wsgi`, CPython embedded) behind the real corral binary:
//! a pool with `app = "wsgi:app:application"` and `worker = "native"` serves a test app over
//! LSAPI. The environ is PEP 3333's with corral's CGI variables; a large POST body streams
//! through wsgi.input without being held whole; status, headers, write() and generators
//! reach the client as the app gave them; an app that raises, or returns what WSGI forbids,
//! is answered 500 with a log line and the worker goes on; an unread body does not desync
//! the kept connection; recycling by max_requests fails no request; a worker that dies in a
//! request is answered 502 and replaced; max_memory replaces a worker that grows; a
//! virtualenv's site-packages are found; a request past request_timeout has the worker's
//! Python stack logged (SIGUSR2) before the kill and a 504; and `corral check` refuses what
//! cannot work.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing,
    missing_docs
)]

mod support;

use std::collections::HashSet;
use std::io::{Read, Write};
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use support::apps::{setup, sha256, upload_bytes};
use support::native::wsgi_worker;
use support::peers::{shared_dir, write_file};
use support::python_apps::PYTHON;
use support::server::{http, Corral};

/// The test app: one behaviour per path.
const APP: &str = r#"import hashlib, os, resource, sys, time

HOLD = []

def application(environ, start_response):
    path = environ["PATH_INFO"]
    if path == "/env":
        keys = ("REQUEST_METHOD", "SCRIPT_NAME", "PATH_INFO", "QUERY_STRING", "CONTENT_LENGTH",
                "HTTP_X_TWICE", "HTTP_COOKIE", "wsgi.version", "wsgi.url_scheme",
                "wsgi.multithread", "wsgi.multiprocess", "wsgi.run_once")
        text = "".join("%s=%r\n" % (k, environ.get(k)) for k in keys)
        text += "errors=%s\n" % (environ["wsgi.errors"] is sys.stderr)
        text += "content_type=%r\n" % environ.get("CONTENT_TYPE")
        body = text.encode()
        start_response("200 OK", [("Content-Type", "text/plain")])
        return [body]
    if path == "/pid":
        start_response("200 OK", [("Content-Type", "text/plain")])
        return [str(os.getpid()).encode()]
    if path == "/maxrss":
        start_response("200 OK", [])
        return [str(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss).encode()]
    if path == "/digest":
        # Read in blocks; the peak RSS (against /maxrss before) says whether the body was
        # ever held whole, by the app or by the worker before the app ran.
        digest, size, inp = hashlib.sha256(), 0, environ["wsgi.input"]
        while True:
            block = inp.read(65536)
            if not block:
                break
            digest.update(block)
            size += len(block)
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        body = ("%d %s %d" % (size, digest.hexdigest(), peak)).encode()
        start_response("200 OK", [("Content-Type", "text/plain")])
        return [body]
    if path == "/lines":
        inp = environ["wsgi.input"]
        lines = [inp.readline(), inp.readline()] + inp.readlines()
        start_response("200 OK", [])
        return [repr(lines).encode()]
    if path == "/status":
        start_response("299 Fine Indeed", [("X-One", "1"), ("X-Two", "zwei"),
                                            ("Set-Cookie", "a=1"), ("Set-Cookie", "b=2"),
                                            ("Connection", "close")])
        return (b"tuple ", b"body")
    if path == "/keep":
        # The app keeps this request's start_response and write() past its end.
        HOLD.append((start_response, start_response("201 Created", [("X-Kept", "1")])))
        return [b"kept"]
    if path == "/stale":
        # ...and calls them in a later request: each must refuse, this answer untouched.
        kept_start, kept_write = HOLD.pop()
        said = []
        for call in (lambda: kept_start("500 Oops", []), lambda: kept_write(b"x")):
            try:
                call()
                said.append("ran")
            except RuntimeError as e:
                said.append(str(e))
        start_response("200 OK", [("Content-Type", "text/plain")])
        return [";".join(said).encode()]
    if path == "/write":
        write = start_response("200 OK", [("Content-Type", "text/plain")])
        write(b"written;")
        return iter([b"yielded;", b"", b"done"])
    if path == "/stream":
        closed = environ["QUERY_STRING"]
        class Body:
            def __iter__(self):
                for i in range(3):
                    yield b"part%d;" % i
            def close(self):
                open(closed, "w").close()
        start_response("200 OK", [("Content-Type", "text/plain")])
        return Body()
    if path == "/raise":
        raise RuntimeError("the app broke on purpose")
    if path == "/str":
        start_response("200 OK", [])
        return ["not bytes"]
    if path == "/badheader":
        start_response("200 OK", [("X-Evil", "a\r\nInjected: yes")])
        return [b"never"]
    if path == "/nostart":
        return [b"no start_response"]
    if path == "/excinfo":
        start_response("200 OK", [("X-Before", "1")])
        try:
            raise ValueError("late trouble")
        except ValueError:
            start_response("503 Service Unavailable", [("Content-Type", "text/plain")],
                           sys.exc_info())
        return [b"sorry"]
    if path == "/midway":
        def gen():
            yield b"a first part that is sent;"
            raise RuntimeError("broke midway")
        start_response("200 OK", [("Content-Type", "text/plain")])
        return gen()
    if path == "/sleep":
        time.sleep(60)  # BLOCK-SLEEP
    if path == "/die":
        os._exit(3)
    if path == "/grow":
        HOLD.append(bytearray(96 << 20))
        for i in range(0, len(HOLD[-1]), 4096):
            HOLD[-1][i] = 1
        start_response("200 OK", [])
        return [b"grown"]
    start_response("200 OK", [("Content-Type", "text/plain"), ("Content-Length", "5")])
    return [b"hello"]
"#;

/// A corral whose pool `py` runs the test app on the native worker, with `keys` added.
fn start(dir: &Path, keys: &str) -> Corral {
    write_file(dir, "app.py", APP);
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
app = "wsgi:app:application"
worker = "native"
worker_path = "{worker}"
python = "{PYTHON}"
cwd = "{dir}"
mode = "static"
max = 1
queue_timeout = "60s"
{keys}

[[contexts]]
prefix = "/mount"
pool = "py"

[[contexts]]
prefix = "/"
pool = "py"
"#,
        run = dir.join("run").display(),
        dir = dir.display(),
        worker = wsgi_worker().display(),
    );
    Corral::start(&config, 1)
}

fn get(c: &Corral, target: &str) -> support::server::HttpResponse {
    http(c.http_addr(), "GET", target, &[], b"")
}

#[test]
fn the_environ_is_pep_3333s_with_corrals_variables() {
    let dir = shared_dir();
    let c = start(dir.path(), "");
    let r = get(&c, "/");
    assert_eq!((r.status, r.text().as_str()), (200, "hello"), "{}", c.log());
    let r = http(
        c.http_addr(),
        "GET",
        "/mount/env?q=1",
        &[
            ("X-Twice", "one"),
            ("X-Twice", "two"),
            ("Cookie", "a=1"),
            ("Cookie", "b=2"),
        ],
        b"",
    );
    let text = r.text();
    for line in [
        "REQUEST_METHOD='GET'\n",
        "SCRIPT_NAME='/mount'\n",
        "PATH_INFO='/env'\n",
        "QUERY_STRING='q=1'\n",
        "CONTENT_LENGTH='0'\n",
        "HTTP_X_TWICE='one, two'\n",
        "HTTP_COOKIE='a=1; b=2'\n",
        "wsgi.version=(1, 0)\n",
        "wsgi.url_scheme='http'\n",
        "wsgi.multithread=False\n",
        "wsgi.multiprocess=True\n",
        "wsgi.run_once=False\n",
        "errors=True\n",
        "content_type=None\n",
    ] {
        assert!(text.contains(line), "{line:?} missing from:\n{text}");
    }
    // The log names the worker and its Python.
    assert!(c.wait_log("corral-wsgi-worker: serving app:application (Python 3."));
}

#[test]
fn a_large_post_body_streams_through_wsgi_input() {
    let dir = shared_dir();
    let c = start(dir.path(), "");
    let before: u64 = get(&c, "/maxrss").text().parse().unwrap();
    let body = upload_bytes(64 << 20);
    let r = http(
        c.http_addr(),
        "POST",
        "/digest",
        &[("Content-Type", "application/octet-stream")],
        &body,
    );
    assert_eq!(r.status, 200, "{}\n{}", r.text(), c.log());
    let text = r.text();
    let fields: Vec<&str> = text.split(' ').collect();
    assert_eq!(fields[0], body.len().to_string());
    assert_eq!(fields[1], sha256(&body));
    // Read block by block, the 64 MiB body never made the worker grow by half of it.
    let grew_mib = (fields[2].parse::<u64>().unwrap() - before) / 1024;
    assert!(
        grew_mib < 32,
        "the worker grew by {grew_mib} MiB reading the body"
    );

    // readline and readlines over a body, up to its end.
    let r = http(
        c.http_addr(),
        "POST",
        "/lines",
        &[],
        b"one\ntwo\nthree\nfour",
    );
    assert_eq!(r.text(), "[b'one\\n', b'two\\n', b'three\\n', b'four']");
}

#[test]
fn an_unread_body_leaves_the_kept_connection_in_step() {
    let dir = shared_dir();
    let c = start(dir.path(), "");
    let pid = get(&c, "/pid").text();
    // The app ignores these bodies; the next request on the same kept connection must
    // still be read from its start.
    for size in [10, 70_000, 3 << 20] {
        let r = http(c.http_addr(), "POST", "/", &[], &upload_bytes(size));
        assert_eq!((r.status, r.text().as_str()), (200, "hello"), "{size}");
        let r = get(&c, "/mount/env");
        assert!(r.text().contains("PATH_INFO='/env'"), "{}", r.text());
    }
    assert_eq!(get(&c, "/pid").text(), pid, "the worker was replaced");
    c.assert_absent("bad LSAPI request");
}

#[test]
fn status_headers_write_and_generators_reach_the_client() {
    let dir = shared_dir();
    let c = start(dir.path(), "");
    let r = get(&c, "/status");
    assert_eq!(r.status, 299, "{}", c.log());
    assert_eq!(r.text(), "tuple body");
    assert_eq!(r.header("x-one"), Some("1"));
    assert_eq!(r.header("x-two"), Some("zwei"));
    let cookies: Vec<&str> = r
        .headers
        .iter()
        .filter(|(n, _)| n == "set-cookie")
        .map(|(_, v)| v.as_str())
        .collect();
    assert_eq!(cookies, ["a=1", "b=2"]);
    // The app's Connection header is the gateway's business: dropped, with a log line.
    assert!(c.wait_log("dropped hop-by-hop header Connection: close"));

    let r = get(&c, "/write");
    assert_eq!((r.status, r.text().as_str()), (200, "written;yielded;done"));

    // A start_response and write() kept past their request are dead in the next one (the
    // worker reuses a start_response only when nothing else holds it), and requests after
    // it get their own status and headers.
    let r = get(&c, "/keep");
    assert_eq!((r.status, r.header("x-kept")), (201, Some("1")));
    let r = get(&c, "/stale");
    assert_eq!(
        (r.status, r.text().as_str()),
        (
            200,
            "start_response of a finished request;write() of a finished request"
        )
    );
    assert_eq!(r.header("x-kept"), None);
    let r = get(&c, "/write");
    assert_eq!((r.status, r.text().as_str()), (200, "written;yielded;done"));

    let closed = dir.path().join("closed");
    let r = get(&c, &format!("/stream?{}", closed.display()));
    assert_eq!(r.text(), "part0;part1;part2;");
    assert!(closed.exists(), "the iterable's close() was not called");

    // exc_info before anything was sent replaces the answer.
    let r = get(&c, "/excinfo");
    assert_eq!((r.status, r.text().as_str()), (503, "sorry"));
    assert_eq!(r.header("x-before"), None);
}

#[test]
fn an_app_that_raises_or_breaks_wsgi_is_answered_500_and_the_worker_goes_on() {
    let dir = shared_dir();
    let c = start(dir.path(), "");
    let pid = get(&c, "/pid").text();
    for (path, logged) in [
        ("/raise", "RuntimeError: the app broke on purpose"),
        ("/str", "TypeError: the app gave str, not bytes"),
        (
            "/badheader",
            "has a value that is not latin-1 text without control characters",
        ),
        ("/nostart", "before calling start_response()"),
    ] {
        let r = get(&c, path);
        assert_eq!(r.status, 500, "{path}: {}", r.text());
        assert_eq!(r.text(), "Internal Server Error\n", "{path}");
        assert_eq!(r.header("injected"), None);
        assert!(c.wait_log(logged), "{path}: no {logged:?} in\n{}", c.log());
        assert!(c.wait_log(&format!("GET {path}: the application raised an error")));
    }
    // An error after part of the answer was sent can only cut it short.
    // The worker closes its connection without RESP_END, and corral breaks the answer off:
    // the client never sees it end as if complete.
    let mut s = std::net::TcpStream::connect(c.http_addr()).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    s.write_all(b"GET /midway HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .unwrap();
    let mut raw = Vec::new();
    let _ = s.read_to_end(&mut raw);
    let raw = String::from_utf8_lossy(&raw);
    assert!(!raw.ends_with("0\r\n\r\n"), "{raw}");
    assert!(c.wait_log("RuntimeError: broke midway"));
    assert!(c.wait_log("GET /midway: the answer was cut short; closing the connection"));
    assert_eq!(get(&c, "/pid").text(), pid, "the worker was replaced");
    assert_eq!(get(&c, "/").text(), "hello");
}

#[test]
fn recycling_by_max_requests_fails_no_request() {
    let dir = shared_dir();
    let c = start(dir.path(), "max_requests = 10\nmax_requests_jitter = 0");
    let addr = c.http_addr();
    let threads: Vec<_> = (0..4)
        .map(|_| {
            std::thread::spawn(move || {
                (0..25)
                    .map(|_| {
                        let r = http(addr, "GET", "/pid", &[], b"");
                        assert_eq!(r.status, 200, "{}", r.text());
                        r.text()
                    })
                    .collect::<Vec<_>>()
            })
        })
        .collect();
    let pids: HashSet<String> = threads
        .into_iter()
        .flat_map(|t| t.join().unwrap())
        .collect();
    // 100 requests at 10 per worker: several workers served them, every request answered.
    assert!(pids.len() >= 5, "{pids:?}\n{}", c.log());
}

#[test]
fn a_worker_that_dies_in_a_request_is_answered_502_and_replaced() {
    let dir = shared_dir();
    let c = start(dir.path(), "");
    let pid = get(&c, "/pid").text();
    let r = get(&c, "/die");
    assert_eq!(r.status, 502, "{}\n{}", r.text(), c.log());
    let mut next = String::new();
    assert!(
        support::eventually(Duration::from_secs(20), || {
            let r = get(&c, "/pid");
            next = r.text();
            r.status == 200
        }),
        "{}",
        c.log()
    );
    assert_ne!(next, pid);
}

#[test]
fn max_memory_replaces_a_worker_that_grows() {
    let dir = shared_dir();
    let c = start(dir.path(), "max_memory = \"64M\"");
    let pid = get(&c, "/pid").text();
    assert_eq!(get(&c, "/grow").text(), "grown");
    let mut now = pid.clone();
    assert!(
        support::eventually(Duration::from_secs(20), || {
            let r = get(&c, "/pid");
            assert_eq!(r.status, 200, "{}", r.text());
            now = r.text();
            now != pid
        }),
        "worker {pid} was not replaced:\n{}",
        c.log()
    );
}

#[test]
fn a_virtualenv_pools_native_worker_finds_the_venvs_packages() {
    let dir = shared_dir();
    let venv = dir.path().join("venv");
    // No pip needed: the package is written straight into the venv's site-packages.
    let mut create = Command::new(PYTHON);
    create.args(["-m", "venv", "--without-pip"]).arg(&venv);
    setup(create, Duration::from_secs(120));
    let site = venv.join("lib/python3.11/site-packages");
    assert!(site.is_dir(), "{} is not there", site.display());
    write_file(&site, "onlyinvenv.py", "WHERE = __file__\n");
    write_file(
        dir.path(),
        "venvapp.py",
        r#"import os, sys
import onlyinvenv

def application(environ, start_response):
    start_response("200 OK", [])
    return [("%s|%s|%s" % (onlyinvenv.WHERE, sys.prefix, os.environ.get("VIRTUAL_ENV"))).encode()]
"#,
    );
    let mut read = Command::new("chmod");
    read.args(["-R", "a+rX"]).arg(dir.path());
    setup(read, Duration::from_secs(30));
    let config = format!(
        r#"
[server]
runtime_dir = "{d}/run"

[[listen]]
address = "127.0.0.1:0"
protocol = "http"

[pools.venv]
app = "wsgi:venvapp:application"
worker = "native"
worker_path = "{worker}"
virtualenv = "{d}/venv"
cwd = "{d}"
max = 1

[[contexts]]
pool = "venv"
"#,
        d = dir.path().display(),
        worker = wsgi_worker().display(),
    );
    let c = Corral::start(&config, 1);
    let r = get(&c, "/");
    assert_eq!(r.status, 200, "{}\n{}", r.text(), c.log());
    let v = venv.display();
    assert_eq!(
        r.text(),
        format!("{v}/lib/python3.11/site-packages/onlyinvenv.py|{v}|{v}")
    );
}

/// `corral check` on a pool of the test app with `keys`; its stdout and stderr.
fn check(dir: &Path, keys: &str) -> String {
    let text = format!(
        "[[listen]]\naddress = \"127.0.0.1:0\"\nprotocol = \"http\"\n\n[pools.py]\n\
         app = \"wsgi:app:application\"\nworker = \"native\"\npython = \"{PYTHON}\"\n\
         cwd = \"{}\"\n{keys}\n",
        dir.display()
    );
    let file = support::config_file(&text);
    let out = support::corral(&["check", "-c", file.path().to_str().unwrap()]);
    format!("{}{}", out.stdout, out.stderr)
}

#[test]
fn corral_check_says_what_the_native_worker_needs() {
    let dir = shared_dir();
    let worker = wsgi_worker();
    let ok = check(
        dir.path(),
        &format!("worker_path = \"{}\"", worker.display()),
    );
    assert!(ok.contains(": ok"), "{ok}");
    let missing = check(
        dir.path(),
        "worker_path = \"/nonexistent/corral-wsgi-worker\"",
    );
    assert!(
        missing.contains("\"/nonexistent/corral-wsgi-worker\" does not exist"),
        "{missing}"
    );
    // Rack apps have their own launcher: worker = "native" is refused with what to do.
    let text = "[[listen]]\naddress = \"127.0.0.1:0\"\nprotocol = \"http\"\n\n[pools.rb]\n\
                app = \"rack:config.ru\"\nworker = \"native\"\n";
    let file = support::config_file(text);
    let out = support::corral(&["check", "-c", file.path().to_str().unwrap()]);
    assert_eq!(out.code, Some(64), "{}", out.stderr);
    assert!(
        out.stderr
            .contains("a Rack app runs on the embedded Ruby launcher (remove worker)"),
        "{}",
        out.stderr
    );
}

#[test]
fn past_request_timeout_the_workers_stack_is_logged_then_it_is_killed() {
    let dir = shared_dir();
    let c = start(dir.path(), "request_timeout = \"2s\"");
    let pid = get(&c, "/pid").text();
    let r = get(&c, "/sleep");
    assert_eq!(r.status, 504, "{}", c.log());
    let kill = "exceeded request_timeout and was killed";
    assert!(c.wait_log(kill), "{}", c.log());
    let log = c.log();
    let before_kill = &log[..log.find(kill).unwrap()];
    let line = APP.lines().position(|l| l.contains("BLOCK-SLEEP")).unwrap() + 1;
    let site = format!("app.py\", line {line} in application");
    assert!(
        before_kill.contains(&site),
        "no {site:?} before the kill:\n{log}"
    );
    assert!(
        before_kill.contains("the worker's stacks at request_timeout are logged above"),
        "the dump did not end before the kill:\n{log}"
    );
    let mut now = pid.clone();
    assert!(support::eventually(Duration::from_secs(20), || {
        now = get(&c, "/pid").text();
        now != pid && !now.is_empty()
    }));
}

#[test]
fn the_native_wsgi_recipe_serves_the_example_app() {
    // corral finds the worker beside its own executable, as the recipe expects.
    wsgi_worker();
    let dir = shared_dir();
    let recipe = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("conf/wsgi-native.toml"),
    )
    .unwrap();
    let examples = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/wsgi");
    for old in ["/srv/corral/examples/wsgi", "/run/corral", "127.0.0.1:8080"] {
        assert!(
            recipe.contains(old),
            "conf/wsgi-native.toml no longer says {old}"
        );
    }
    let config = recipe
        .replace("/srv/corral/examples/wsgi", &examples.display().to_string())
        .replace("/run/corral", &dir.path().join("run").display().to_string())
        .replace("127.0.0.1:8080", "127.0.0.1:0");
    let c = Corral::start(&config, 1);
    let r = http(c.http_addr(), "POST", "/echo", &[], b"some text");
    assert_eq!(
        (r.status, r.text().as_str()),
        (200, "some text"),
        "{}",
        c.log()
    );
    assert!(c.wait_log("corral-wsgi-worker: serving hello:application"));
}
