//! The native WSGI worker alone, on a Unix listener passed as fd 0 and driven with corral's
//! LSAPI codec: SIGTERM and SIGINT finish the request in progress and then exit 0 (at once
//! when idle), SIGUSR2 writes the Python stack and corral's end line, garbage closes only
//! its connection, a readiness probe is answered without calling the app, and RESP_END
//! leaves with the last bytes of the announced Content-Length (bytes past it close the
//! connection).

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing,
    missing_docs
)]

mod support;

use std::io::{BufRead, BufReader, Read, Write};
use std::os::fd::OwnedFd;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::BytesMut;
use corral::protocols::lsapi::{ByteOrder, FlagRule, RequestBuilder};
use corral::protocols::Limits;
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use support::lsapi::{read_answer_from, Answer};
use support::native::wsgi_worker;
use support::peers::{shared_dir, write_file};
use support::python_apps::PYTHON;

/// `/gate` says it started, then waits for the file `go` (20 s at most), counting its rounds
/// in `ticks`; `/length-then-wait` and `/write-then-wait` give the 5 bytes their
/// Content-Length announces, then wait for the file `done` (6 s at most) before their
/// iterable ends; `/length-then-raise` raises once they are given; the `/over-*` paths give
/// more than their Content-Length; `/` says hello.
const APP: &str = r#"import os, time

HERE = os.path.dirname(os.path.abspath(__file__))

def application(environ, start_response):
    if environ["PATH_INFO"] == "/gate":
        open(os.path.join(HERE, "started"), "w").close()
        for tick in range(2000):
            if os.path.exists(os.path.join(HERE, "go")):
                break
            with open(os.path.join(HERE, "ticks.tmp"), "w") as f:
                f.write(str(tick))
            os.replace(os.path.join(HERE, "ticks.tmp"), os.path.join(HERE, "ticks"))
            time.sleep(0.01)  # WAITING
        start_response("200 OK", [])
        return [b"finished"]
    if environ["PATH_INFO"] in ("/length-then-wait", "/write-then-wait"):
        def wait():
            for _ in range(600):
                if os.path.exists(os.path.join(HERE, "done")):
                    break
                time.sleep(0.01)
            yield b""
        write = start_response("200 OK", [("Content-Length", "5")])
        if environ["PATH_INFO"] == "/write-then-wait":
            write(b"whole")
            return wait()
        def gen():
            yield b"whole"
            yield from wait()
        return gen()
    if environ["PATH_INFO"] == "/over-generator":
        start_response("200 OK", [("Content-Length", "5")])
        return (part for part in [b"who", b"", b"le and more", b"and more"])
    if environ["PATH_INFO"] == "/length-then-raise":
        def gen():
            yield b"whole"
            raise RuntimeError("raised past the announced body")
        start_response("200 OK", [("Content-Length", "5")])
        return gen()
    if environ["PATH_INFO"] == "/over-list":
        start_response("200 OK", [("Content-Length", " 5 ")])
        return [b"whole", b"and more"]
    if environ.get("CORRAL_READY_PROBE"):
        raise RuntimeError("the probe reached the app")
    start_response("200 OK", [])
    return [b"hello"]
"#;

struct Worker {
    child: Child,
    socket: PathBuf,
    stderr: Arc<Mutex<String>>,
}

fn eventually(check: impl FnMut() -> bool) -> bool {
    support::eventually(Duration::from_secs(20), check)
}

impl Worker {
    fn start(dir: &Path) -> Worker {
        write_file(dir, "app.py", APP);
        let socket = dir.join("wsgi.sock");
        let listener: OwnedFd = UnixListener::bind(&socket).unwrap().into();
        let mut child = Command::new(wsgi_worker())
            .args([PYTHON, "app:application"])
            .current_dir(dir)
            .stdin(Stdio::from(listener))
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("run the worker");
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
        let worker = Worker {
            child,
            socket,
            stderr,
        };
        worker.wait_log("serving app:application");
        worker
    }

    fn stderr(&self) -> String {
        self.stderr.lock().unwrap().clone()
    }

    fn wait_log(&self, needle: &str) {
        assert!(
            eventually(|| self.stderr().contains(needle)),
            "no {needle:?} in:\n{}",
            self.stderr()
        );
    }

    fn connect(&self) -> UnixStream {
        let s = UnixStream::connect(&self.socket).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        s
    }

    fn signal(&self, signal: Signal) {
        kill(Pid::from_raw(self.child.id() as i32), signal).unwrap();
    }

    fn exit_code(&mut self) -> Option<i32> {
        let mut status = None;
        assert!(
            eventually(|| {
                status = self.child.try_wait().unwrap();
                status.is_some()
            }),
            "the worker did not exit:\n{}",
            self.stderr()
        );
        status.and_then(|s| s.code())
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A BEGIN_REQUEST for GET `path` with `vars` added to the env.
fn get(path: &str, vars: &[(&str, &str)]) -> Vec<u8> {
    let line = format!("GET {path} HTTP/1.1");
    let mut b = RequestBuilder::new(&Limits::DEFAULT, line.as_bytes())
        .unwrap()
        .with_byte_order(ByteOrder::NATIVE, FlagRule::HOST);
    for (name, value) in [
        ("REQUEST_METHOD", "GET"),
        ("SCRIPT_NAME", ""),
        ("SCRIPT_FILENAME", ""),
        ("PATH_INFO", path),
        ("QUERY_STRING", ""),
    ]
    .iter()
    .chain(vars)
    {
        b.env(name.as_bytes(), value.as_bytes()).unwrap();
    }
    b.header(b"Host", b"localhost").unwrap();
    let mut out = BytesMut::new();
    b.encode(&mut out).unwrap();
    out.to_vec()
}

fn read_answer(s: &mut UnixStream) -> Answer {
    let mut answer = Answer::default();
    let mut buf = BytesMut::new();
    assert!(
        read_answer_from(s, &mut buf, &mut answer),
        "closed before RESP_END: {answer:?}"
    );
    answer
}

#[test]
fn sigterm_and_sigint_finish_the_request_in_progress_then_exit_0() {
    for signal in [Signal::SIGTERM, Signal::SIGINT] {
        let dir = shared_dir();
        let mut worker = Worker::start(dir.path());
        let mut s = worker.connect();
        s.write_all(&get("/gate", &[])).unwrap();
        assert!(eventually(|| dir.path().join("started").exists()));
        let ticks = dir.path().join("ticks");
        let tick = || {
            std::fs::read_to_string(&ticks)
                .ok()
                .and_then(|t| t.trim().parse::<u32>().ok())
        };
        assert!(eventually(|| tick().is_some()));
        let at_signal = tick().unwrap_or(0);
        worker.signal(signal);
        // The signal only raises a flag: two rounds of the app's loop later, it goes on.
        assert!(eventually(|| {
            tick().is_some_and(|t| t >= at_signal + 2) || worker.child.try_wait().unwrap().is_some()
        }));
        assert!(
            worker.child.try_wait().unwrap().is_none(),
            "{signal}: the worker exited with its request in progress\n{}",
            worker.stderr()
        );
        std::fs::write(dir.path().join("go"), "").unwrap();
        assert_eq!(read_answer(&mut s).text(), "finished", "{signal}");
        let mut rest = Vec::new();
        s.read_to_end(&mut rest).unwrap();
        assert!(rest.is_empty(), "{rest:?}");
        assert_eq!(worker.exit_code(), Some(0), "{}", worker.stderr());

        // Idle in accept: it stops at once.
        let dir = shared_dir();
        let mut worker = Worker::start(dir.path());
        worker.signal(signal);
        assert_eq!(worker.exit_code(), Some(0), "{}", worker.stderr());

        // Waiting for the next request on a kept connection: at once too.
        let dir = shared_dir();
        let mut worker = Worker::start(dir.path());
        let mut s = worker.connect();
        s.write_all(&get("/", &[])).unwrap();
        assert_eq!(read_answer(&mut s).text(), "hello");
        worker.signal(signal);
        assert_eq!(worker.exit_code(), Some(0), "{}", worker.stderr());
    }
}

#[test]
fn sigusr2_writes_the_python_stack_then_corrals_end_line() {
    let dir = shared_dir();
    let worker = Worker::start(dir.path());
    let mut s = worker.connect();
    s.write_all(&get("/gate", &[])).unwrap();
    assert!(eventually(|| dir.path().join("started").exists()));
    worker.signal(Signal::SIGUSR2);
    let end = format!("corral-stacks: end of pid {}\n", worker.child.id());
    worker.wait_log(&end);
    // The app is somewhere in its waiting loop (mostly asleep on the WAITING line, but the
    // signal may find it at any line of the loop's file work on a busy machine).
    let first = APP.lines().position(|l| l.contains("for tick")).unwrap() + 1;
    let last = APP.lines().position(|l| l.contains("WAITING")).unwrap() + 1;
    let text = worker.stderr();
    let site = (first..=last)
        .find_map(|line| text.find(&format!("app.py\", line {line} in application")))
        .unwrap_or_else(|| panic!("no stack line in the app's loop:\n{text}"));
    assert!(site < text.find(&end).unwrap(), "{text}");
    // The worker goes on with its request.
    std::fs::write(dir.path().join("go"), "").unwrap();
    assert_eq!(read_answer(&mut s).text(), "finished");
}

#[test]
fn garbage_closes_only_its_connection_and_the_probe_skips_the_app() {
    let dir = shared_dir();
    let worker = Worker::start(dir.path());
    let mut bad = worker.connect();
    bad.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
    let mut rest = Vec::new();
    bad.read_to_end(&mut rest).unwrap();
    assert!(rest.is_empty(), "{rest:?}");
    worker.wait_log("bad LSAPI request");
    let mut s = worker.connect();
    s.write_all(&get("/", &[("CORRAL_READY_PROBE", "1")]))
        .unwrap();
    assert_eq!(read_answer(&mut s).status, 204);
    s.write_all(&get("/", &[])).unwrap();
    assert_eq!(read_answer(&mut s).text(), "hello");
    assert!(!worker.stderr().contains("the probe reached the app"));
}

#[test]
fn resp_end_leaves_with_the_last_bytes_of_the_announced_content_length() {
    // corral stops reading an answer at its Content-Length and may drop an exchange whose
    // RESP_END has not come with those bytes (its client gone): an end written only when
    // the iterable ends would find the connection closed and cost corral the connection.
    let dir = shared_dir();
    let worker = Worker::start(dir.path());
    let mut s = worker.connect();
    for path in ["/length-then-wait", "/write-then-wait"] {
        let _ = std::fs::remove_file(dir.path().join("done"));
        s.write_all(&get(path, &[])).unwrap();
        let asked = tokio::time::Instant::now();
        let answer = read_answer(&mut s);
        assert_eq!((answer.status, answer.text().as_str()), (200, "whole"));
        assert!(
            asked.elapsed() < Duration::from_secs(3),
            "{path}: RESP_END came only when the iterable ended, after {:?}",
            asked.elapsed()
        );
        // Once the iterable ends, the same connection carries the next request.
        std::fs::write(dir.path().join("done"), "").unwrap();
        s.write_all(&get("/", &[])).unwrap();
        assert_eq!(read_answer(&mut s).text(), "hello", "{path}");
    }
    drop(s);

    // Bytes past the announced ones cannot follow RESP_END: the answer is the announced
    // bytes, then the connection closes and the log says why; the worker serves on.
    for path in ["/over-generator", "/over-list"] {
        let mut s = worker.connect();
        s.write_all(&get(path, &[("REQUEST_URI", path)])).unwrap();
        let mut answer = Answer::default();
        let mut buf = BytesMut::new();
        assert!(
            read_answer_from(&mut s, &mut buf, &mut answer),
            "{path}: {answer:?}"
        );
        assert_eq!(answer.text(), "whole", "{path}");
        let mut rest = buf.to_vec();
        s.read_to_end(&mut rest).unwrap();
        assert!(rest.is_empty(), "{path}: {rest:?}");
        worker.wait_log(&format!(
            "GET {path}: the application gave more than its Content-Length; the connection closes"
        ));
        let mut s = worker.connect();
        s.write_all(&get("/", &[])).unwrap();
        assert_eq!(read_answer(&mut s).text(), "hello", "{path}");
    }
    let log = worker.stderr();
    assert!(!log.contains("Traceback"), "{log}");

    // An error once the announced body has gone whole with RESP_END: that answer stands
    // and the connection, in step, carries the next request.
    let mut s = worker.connect();
    s.write_all(&get("/length-then-raise", &[])).unwrap();
    assert_eq!(read_answer(&mut s).text(), "whole");
    worker.wait_log("RuntimeError: raised past the announced body");
    s.write_all(&get("/", &[])).unwrap();
    assert_eq!(read_answer(&mut s).text(), "hello");
    let log = worker.stderr();
    assert!(!log.contains("cut short"), "{log}");
}
