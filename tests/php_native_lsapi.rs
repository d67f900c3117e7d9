//! The native PHP worker read straight off its socket, without corral in between: it answers
//! well-formed LSAPI requests on a kept connection in the byte order of each, and bad input
//! (a wrong magic, a packet type a server never sends, a BEGIN_REQUEST longer than the
//! limit or shorter than its header, a connection closed inside a packet or a body) closes
//! that connection with a log line naming what was wrong, never a crash: the next connection
//! is served by the same process. A script that is not there is answered 404 without PHP.

mod support;

use std::io::{Read, Write};
use std::os::fd::OwnedFd;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use bytes::BytesMut;
use corral::protocols::lsapi::{ByteOrder, FlagRule, RequestBuilder};
use corral::protocols::Limits;
use support::lsapi::{assert_closed_without_answer, read_answer_from, Answer};
use support::native::worker;
use support::peers::{shared_dir, write_file};

struct Worker {
    child: Child,
    socket: PathBuf,
    stderr: PathBuf,
}

impl Worker {
    fn start(dir: &Path) -> Worker {
        let socket = dir.join("php.sock");
        let stderr = dir.join("stderr.log");
        let listener: OwnedFd = UnixListener::bind(&socket).unwrap().into();
        let child = Command::new(worker())
            .stdin(Stdio::from(listener))
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&stderr).unwrap())
            .spawn()
            .unwrap();
        Worker {
            child,
            socket,
            stderr,
        }
    }

    fn connect(&self) -> UnixStream {
        let s = UnixStream::connect(&self.socket).unwrap();
        s.set_read_timeout(Some(std::time::Duration::from_secs(30)))
            .unwrap();
        s
    }

    fn stderr(&self) -> String {
        std::fs::read_to_string(&self.stderr).unwrap_or_default()
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A BEGIN_REQUEST for `script` as corral writes it, integers in `order`, the body behind.
fn request(script: &Path, body: &[u8], order: ByteOrder) -> Vec<u8> {
    let method = if body.is_empty() { "GET" } else { "POST" };
    let line = format!("{method} /x.php HTTP/1.1");
    let mut b = RequestBuilder::new(&Limits::DEFAULT, line.as_bytes())
        .unwrap()
        .with_byte_order(order, FlagRule::HOST);
    for (name, value) in [
        ("REQUEST_METHOD", method),
        ("SCRIPT_NAME", "/x.php"),
        ("SCRIPT_FILENAME", &script.display().to_string()),
        ("REQUEST_URI", "/x.php"),
        ("QUERY_STRING", ""),
        ("SERVER_PROTOCOL", "HTTP/1.1"),
    ] {
        b.env(name.as_bytes(), value.as_bytes()).unwrap();
    }
    b.header(b"Host", b"localhost").unwrap();
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

fn answer(s: &mut UnixStream) -> Answer {
    let mut buf = BytesMut::new();
    let mut a = Answer::default();
    assert!(read_answer_from(s, &mut buf, &mut a), "no RESP_END: {a:?}");
    assert!(buf.is_empty(), "bytes after RESP_END: {buf:?}");
    a
}

#[test]
fn kept_connections_and_byte_orders() {
    let dir = shared_dir();
    let script = write_file(
        dir.path(),
        "x.php",
        "<?php echo $_SERVER['REQUEST_METHOD'], ' ', strlen(file_get_contents('php://input'));",
    );
    let w = Worker::start(dir.path());
    let mut s = w.connect();
    for (order, body) in [
        (ByteOrder::NATIVE, &b""[..]),
        (ByteOrder::Big, &b"abc"[..]),
        (ByteOrder::Little, &[7u8; 100_000][..]),
    ] {
        s.write_all(&request(&script, body, order)).unwrap();
        let a = answer(&mut s);
        let flag = FlagRule::HOST.flag_for(order);
        assert!(a.flags.iter().all(|&f| f == flag), "{order:?}: {a:?}");
        assert_eq!(a.status, 200);
        let method = if body.is_empty() { "GET" } else { "POST" };
        assert_eq!(a.text(), format!("{method} {}", body.len()));
    }
}

#[test]
fn bad_input_closes_the_connection_and_the_worker_serves_the_next() {
    let dir = shared_dir();
    let script = write_file(dir.path(), "x.php", "<?php echo 'fine';");
    let w = Worker::start(dir.path());
    let good = request(&script, b"", ByteOrder::NATIVE);
    let mut too_long = good.clone();
    // The packet length field (bytes 4..8) says 1 MiB, over the 64 KiB limit.
    too_long[4..8].copy_from_slice(&(1u32 << 20).to_ne_bytes());
    let mut too_short = good[..8].to_vec();
    too_short[4..8].copy_from_slice(&12u32.to_ne_bytes());
    too_short.extend_from_slice(&[0u8; 4]);
    let mut wrong_type = good.clone();
    wrong_type[2] = 3; // RESP_HEADER, which only a backend sends
    let cases: Vec<(&str, Vec<u8>, &str)> = vec![
        (
            "wrong magic",
            b"XS\x01\x00\x08\x00\x00\x00".to_vec(),
            "bad LSAPI request",
        ),
        ("a response packet", wrong_type, "bad LSAPI request"),
        ("over the limit", too_long, "bad LSAPI request"),
        ("shorter than its header", too_short, "bad LSAPI request"),
        (
            "cut inside the packet",
            good[..40].to_vec(),
            "closed inside a request packet",
        ),
    ];
    for (what, bytes, logged) in cases {
        let mut s = w.connect();
        s.write_all(&bytes).unwrap();
        s.shutdown(std::net::Shutdown::Write).unwrap();
        assert_closed_without_answer(&mut s);
        let mut s = w.connect();
        s.write_all(&good).unwrap();
        assert_eq!(answer(&mut s).text(), "fine", "{what}: {}", w.stderr());
        assert!(w.stderr().contains(logged), "{what}: {}", w.stderr());
    }
    // A body shorter than announced, then the end of the connection: no PHP runs.
    let mut cut = request(&script, &[1u8; 5000], ByteOrder::NATIVE);
    cut.truncate(cut.len() - 100);
    let mut s = w.connect();
    s.write_all(&cut).unwrap();
    s.shutdown(std::net::Shutdown::Write).unwrap();
    assert_closed_without_answer(&mut s);
    assert!(
        w.stderr().contains("closed inside a request body"),
        "{}",
        w.stderr()
    );
    let mut s = w.connect();
    s.write_all(&good).unwrap();
    assert_eq!(answer(&mut s).text(), "fine");
    let mut rest = Vec::new();
    drop(s.shutdown(std::net::Shutdown::Write));
    s.read_to_end(&mut rest).unwrap();
    assert!(rest.is_empty());
}

/// A script that is not there is answered 404 "No input file specified." without PHP: at
/// once for a path never found (misses are not remembered), and for a script removed once
/// the 2 s the worker trusts a file it found have passed (workers/php/src/script.rs), the
/// window OPcache itself keeps a removed script's cached copy for.
#[test]
fn a_missing_script_is_404_and_a_removed_one_once_the_window_has_passed() {
    let dir = shared_dir();
    let script = write_file(dir.path(), "x.php", "<?php echo 'here';");
    let w = Worker::start(dir.path());
    let mut s = w.connect();
    s.write_all(&request(&script, b"", ByteOrder::NATIVE))
        .unwrap();
    assert_eq!(answer(&mut s).text(), "here");
    let never = dir.path().join("never.php");
    for _ in 0..2 {
        s.write_all(&request(&never, b"", ByteOrder::NATIVE))
            .unwrap();
        let a = answer(&mut s);
        assert_eq!(
            (a.status, a.text().as_str()),
            (404, "No input file specified.\n")
        );
    }
    std::fs::remove_file(&script).unwrap();
    std::thread::sleep(std::time::Duration::from_millis(2_500));
    s.write_all(&request(&script, b"", ByteOrder::NATIVE))
        .unwrap();
    let a = answer(&mut s);
    assert_eq!(
        (a.status, a.text().as_str()),
        (404, "No input file specified.\n"),
        "{}",
        w.stderr()
    );
}
