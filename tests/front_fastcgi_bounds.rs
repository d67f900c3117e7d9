//! The `fastcgi` front listener's per-connection bounds, with a FastCGI web server written out
//! by hand (multiplexing, aborts, hostile streams: what nginx never does) against corral in
//! front of one php-cgi with `max_conns = 1`, so a second request waits in the pool's queue.
//!
//! - a request waiting in the queue does not stop the reader: its FCGI_ABORT_REQUEST is
//!   answered at once, and a third request on the same connection is answered while it waits;
//! - a connection may carry `Limits::max_concurrent_requests` (128) ids; the next is refused
//!   with FCGI_OVERLOADED;
//! - a multiplexed request whose body outruns the backend is refused with a 503 and
//!   FCGI_OVERLOADED (the one served in the connection's own task as well as one in a task
//!   of its own), and the other requests go on; a request alone on its connection is
//!   never refused for that, it waits;
//! - an oversized FCGI_PARAMS stream closes the connection with a log line.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing,
    missing_docs
)]

mod support;

use std::collections::HashMap;
use std::io::Write;
use std::path::PathBuf;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use corral::protocols::fastcgi::{
    encode_abort_request, encode_begin_request, encode_params, encode_stdin, encode_stdin_end,
    RecordType, Role,
};
use support::front::{php_cgi_with, Corral};
use support::peers::{cgi_params, shared_dir, write_file, Peer};
use support::raw_fastcgi::RawConn;
use tokio::time::Instant;

/// FCGI_END_REQUEST protocol status values (FastCGI 1.0, section 5.5).
const REQUEST_COMPLETE: u8 = 0;
const OVERLOADED: u8 = 2;
/// How long the first request holds the pool's one slot.
const SLOW_MS: u64 = 2000;
/// An answer "at once": well inside the slow request's time.
const AT_ONCE: Duration = Duration::from_millis(700);

struct Setup {
    dir: tempfile::TempDir,
    corral: Corral,
    _php: Peer,
}

impl Setup {
    fn www(&self) -> PathBuf {
        self.dir.path().join("www")
    }

    fn connect(&self) -> Raw {
        Raw {
            conn: RawConn::connect(&self.corral.socket),
            stdout: HashMap::new(),
        }
    }

    fn params(&self, method: &str, script: &str, query: &str, len: usize) -> Vec<(Bytes, Bytes)> {
        let len = len.to_string();
        let extra: &[(&str, &str)] = if method == "POST" {
            &[
                ("CONTENT_LENGTH", &len),
                ("CONTENT_TYPE", "application/octet-stream"),
            ]
        } else {
            &[]
        };
        cgi_params(method, &self.www().join(script), query, extra)
    }
}

fn setup() -> Setup {
    setup_with(&["post_max_size=64M"])
}

/// [`setup`] with php-cgi given the `ini` settings.
fn setup_with(ini: &[&str]) -> Setup {
    let dir = shared_dir();
    let root = dir.path().join("www");
    std::fs::create_dir(&root).unwrap();
    write_file(
        &root,
        "sleep.php",
        "<?php if (isset($_GET['mark'])) { file_put_contents(__DIR__ . '/' . basename($_GET['mark']), getmypid()); } \
         usleep((int)($_GET['ms'] ?? 0) * 1000); echo 'slept ', $_GET['ms'] ?? 0;",
    );
    write_file(
        &root,
        "upload.php",
        "<?php echo 'got ', strlen(file_get_contents('php://input'));",
    );
    // Writes its head and first bytes at once, then sleeps without reading its body.
    write_file(
        &root,
        "early.php",
        "<?php header('X-Early: yes'); echo 'early '; while (ob_get_level()) { ob_end_flush(); } \
         flush(); usleep(1500000); echo 'late';",
    );
    let php = php_cgi_with(dir.path(), ini);
    let socket = dir.path().join("corral-fcgi.sock");
    let config = format!(
        r#"
[server]
runtime_dir = "{dir}/run"

[[listen]]
address = "unix:{socket}"
protocol = "fastcgi"

[pools.php]
servers = ["unix:{php}"]
max_conns = 1
queue_size = 16
queue_timeout = "30s"

[[contexts]]
prefix = "/"
extension = "php"
root = "{root}"
pool = "php"
"#,
        dir = dir.path().display(),
        socket = socket.display(),
        php = php.socket.display(),
        root = root.display(),
    );
    let corral = Corral::start(dir.path(), &config, &socket);
    Setup {
        dir,
        corral,
        _php: php,
    }
}

/// One request's end as the client saw it: its STDOUT text and FCGI_END_REQUEST body.
#[derive(Debug)]
struct End {
    stdout: String,
    protocol_status: u8,
    at: Instant,
}

/// The hand-written FastCGI web server (`support::raw_fastcgi`) with this suite's requests
/// and the output of requests not yet ended.
struct Raw {
    conn: RawConn,
    stdout: HashMap<u16, String>,
}

impl std::ops::Deref for Raw {
    type Target = RawConn;
    fn deref(&self) -> &RawConn {
        &self.conn
    }
}

impl std::ops::DerefMut for Raw {
    fn deref_mut(&mut self) -> &mut RawConn {
        &mut self.conn
    }
}

impl Raw {
    fn begin(&mut self, id: u16, params: &[(Bytes, Bytes)]) {
        let mut out = BytesMut::new();
        encode_begin_request(id, Role::Responder, true, &mut out);
        encode_params(id, params, &mut out).unwrap();
        self.send(&out);
    }

    /// A whole GET: BEGIN_REQUEST, PARAMS and the end of STDIN.
    fn get(&mut self, id: u16, params: &[(Bytes, Bytes)]) {
        self.begin(id, params);
        let mut out = BytesMut::new();
        encode_stdin_end(id, &mut out);
        self.send(&out);
    }

    /// `len` bytes of STDIN in records of `record` bytes (no end).
    fn stdin(&mut self, id: u16, len: usize, record: usize) {
        let mut out = BytesMut::new();
        let data = vec![b'x'; record];
        let mut left = len;
        while left > 0 {
            let n = left.min(record);
            encode_stdin(id, &data[..n], &mut out);
            left -= n;
        }
        self.send(&out);
    }

    /// Reads until request `id`'s FCGI_STDOUT holds `needle`, before any request ends.
    fn stdout_until(&mut self, id: u16, needle: &str) {
        while !self.stdout.get(&id).is_some_and(|s| s.contains(needle)) {
            let r = self.record().expect("output before the close");
            match r.kind {
                RecordType::Stdout => self
                    .stdout
                    .entry(r.request_id)
                    .or_default()
                    .push_str(&String::from_utf8_lossy(&r.content)),
                RecordType::Stderr => {}
                other => panic!("unexpected {other:?} record before {needle:?}"),
            }
        }
    }

    /// Reads until request `id` ends; other requests' records are kept for later.
    fn end_of(&mut self, id: u16, ended: &mut HashMap<u16, End>) -> End {
        loop {
            if let Some(end) = ended.remove(&id) {
                return end;
            }
            let r = self.record().expect("END_REQUEST before the close");
            match r.kind {
                RecordType::Stdout => self
                    .stdout
                    .entry(r.request_id)
                    .or_default()
                    .push_str(&String::from_utf8_lossy(&r.content)),
                RecordType::EndRequest => {
                    let end = End {
                        stdout: self.stdout.remove(&r.request_id).unwrap_or_default(),
                        protocol_status: r.content[4],
                        at: Instant::now(),
                    };
                    assert!(
                        ended.insert(r.request_id, end).is_none(),
                        "a second END_REQUEST for {}",
                        r.request_id
                    );
                }
                RecordType::Stderr => {}
                other => panic!("unexpected {other:?} record"),
            }
        }
    }
}

/// Starts the slow request as id 1 and waits until php-cgi runs it (the slot is taken):
/// `sleep.php` writes the marker file `running` before it starts its `SLOW_MS` sleep, so
/// from then on id 1 holds the one slot for `SLOW_MS` (the slow backend is the fixture).
fn hold_the_slot(s: &Setup, raw: &mut Raw) -> Instant {
    let marker = s.www().join("running");
    let started = Instant::now();
    raw.get(
        1,
        &s.params("GET", "sleep.php", &format!("ms={SLOW_MS}&mark=running"), 0),
    );
    assert!(
        support::eventually(Duration::from_secs(10), || marker.exists()),
        "php-cgi never started id 1:\n{}",
        s.corral.log()
    );
    started
}

fn assert_slow_one_completes(raw: &mut Raw, ended: &mut HashMap<u16, End>, started: Instant) {
    let first = raw.end_of(1, ended);
    assert_eq!(first.protocol_status, REQUEST_COMPLETE);
    assert!(
        first.stdout.contains(&format!("slept {SLOW_MS}")),
        "{first:?}"
    );
    assert!(first.at - started >= Duration::from_millis(SLOW_MS));
}

#[test]
fn an_abort_of_a_queued_request_is_answered_while_the_first_runs() {
    let s = setup();
    let mut raw = s.connect();
    let started = hold_the_slot(&s, &mut raw);
    // Id 2 waits for the slot, with 200 KiB of its body sent in 8 KiB records: more records
    // than a request may have in flight to its exchange, less than its byte budget.
    raw.begin(2, &s.params("POST", "upload.php", "", 300 * 1024));
    raw.stdin(2, 200 * 1024, 8 * 1024);
    let mut out = BytesMut::new();
    encode_abort_request(2, &mut out);
    let aborted_at = Instant::now();
    raw.send(&out);
    let mut ended = HashMap::new();
    let second = raw.end_of(2, &mut ended);
    assert_eq!(second.protocol_status, REQUEST_COMPLETE);
    assert!(
        second.at - aborted_at < AT_ONCE,
        "the abort took {:?}",
        second.at - aborted_at
    );
    assert!(
        !ended.contains_key(&1),
        "the slow request was still running"
    );
    assert_slow_one_completes(&mut raw, &mut ended, started);
}

#[test]
fn a_third_request_is_read_while_a_queued_one_sends_its_body() {
    let s = setup();
    let mut raw = s.connect();
    let started = hold_the_slot(&s, &mut raw);
    raw.begin(2, &s.params("POST", "upload.php", "", 200 * 1024));
    raw.stdin(2, 200 * 1024, 8 * 1024);
    // Id 3 names a script that does not exist: corral answers 404 itself, without a slot,
    // as soon as it reads the request.
    let asked = Instant::now();
    raw.get(3, &s.params("GET", "missing.php", "", 0));
    let mut ended = HashMap::new();
    let third = raw.end_of(3, &mut ended);
    assert!(
        third.at - asked < AT_ONCE,
        "id 3 took {:?}",
        third.at - asked
    );
    assert!(third.stdout.starts_with("Status: 404"), "{third:?}");
    assert!(
        !ended.contains_key(&1),
        "the slow request was still running"
    );
    // Id 2 is intact: its body ends, it gets the slot after id 1 and is answered in full.
    let mut out = BytesMut::new();
    encode_stdin_end(2, &mut out);
    raw.send(&out);
    assert_slow_one_completes(&mut raw, &mut ended, started);
    let second = raw.end_of(2, &mut ended);
    assert_eq!(second.protocol_status, REQUEST_COMPLETE);
    assert!(second.stdout.contains("got 204800"), "{second:?}");
}

#[test]
fn ids_over_the_connection_limit_are_refused_with_overloaded() {
    let s = setup();
    let mut raw = s.connect();
    // 128 requests begun, none finishing its parameters: the connection's limit.
    let mut out = BytesMut::new();
    for id in 1..=128u16 {
        encode_begin_request(id, Role::Responder, true, &mut out);
    }
    encode_begin_request(129, Role::Responder, true, &mut out);
    raw.send(&out);
    let mut ended = HashMap::new();
    let refused = raw.end_of(129, &mut ended);
    assert_eq!(refused.protocol_status, OVERLOADED);
    assert!(ended.is_empty(), "only the refused id ended: {ended:?}");
    s.corral.wait_log(
        "began more requests than one connection may carry",
        Duration::from_secs(5),
    );
    // The connection still serves: ending id 128's parameters runs it.
    let params = s.params("GET", "sleep.php", "ms=0", 0);
    let mut out = BytesMut::new();
    encode_params(128, &params, &mut out).unwrap();
    encode_stdin_end(128, &mut out);
    raw.send(&out);
    let served = raw.end_of(128, &mut ended);
    assert!(served.stdout.contains("slept 0"), "{served:?}");
}

#[test]
fn a_multiplexed_body_faster_than_the_backend_is_refused_and_the_rest_goes_on() {
    let s = setup();
    let mut raw = s.connect();
    let started = hold_the_slot(&s, &mut raw);
    // Id 2 waits for the slot and sends 2 MiB of body: over its budget while id 1 shares
    // the connection.
    raw.begin(2, &s.params("POST", "upload.php", "", 2 * 1024 * 1024));
    let sent = Instant::now();
    raw.stdin(2, 2 * 1024 * 1024, 32 * 1024);
    let mut ended = HashMap::new();
    let refused = raw.end_of(2, &mut ended);
    assert_eq!(refused.protocol_status, OVERLOADED);
    assert!(refused.stdout.starts_with("Status: 503"), "{refused:?}");
    assert!(refused.at - sent < Duration::from_millis(SLOW_MS));
    s.corral.wait_log(
        "sends a request body faster than the backend reads it",
        Duration::from_secs(5),
    );
    assert_slow_one_completes(&mut raw, &mut ended, started);
}

#[test]
fn the_inline_request_s_body_outrunning_its_backend_is_refused_beside_another() {
    let s = setup();
    // Another connection holds the one slot.
    let mut holder = s.connect();
    let started = hold_the_slot(&s, &mut holder);
    let mut raw = s.connect();
    // Id 1 is served in the connection's own task and waits for the slot; id 2 is begun
    // beside it, in a task of its own. Id 1's body then outruns its budget.
    raw.begin(1, &s.params("POST", "upload.php", "", 2 * 1024 * 1024));
    raw.get(2, &s.params("GET", "sleep.php", "ms=0", 0));
    let sent = Instant::now();
    raw.stdin(1, 2 * 1024 * 1024, 32 * 1024);
    let mut ended = HashMap::new();
    let refused = raw.end_of(1, &mut ended);
    assert_eq!(refused.protocol_status, OVERLOADED);
    assert!(refused.stdout.starts_with("Status: 503"), "{refused:?}");
    assert!(refused.at - sent < Duration::from_millis(SLOW_MS));
    // The other request goes on once the slot is free.
    let second = raw.end_of(2, &mut ended);
    assert_eq!(second.protocol_status, REQUEST_COMPLETE);
    assert!(second.stdout.contains("slept 0"), "{second:?}");
    assert_slow_one_completes(&mut holder, &mut HashMap::new(), started);
}

#[test]
fn the_inline_request_refused_after_its_head_went_out_gets_no_second_head() {
    // php-cgi that leaves bodies to the script runs it at once: its head goes out while
    // the body still comes, and the body then outruns its budget beside another request.
    // The head is the script's: the refusal may only end the request (FCGI_OVERLOADED), not
    // write a 503 head after it.
    let s = setup_with(&["post_max_size=64M", "enable_post_data_reading=0"]);
    let mut raw = s.connect();
    raw.begin(1, &s.params("POST", "early.php", "", 2 * 1024 * 1024));
    raw.stdout_until(1, "early");
    raw.get(2, &s.params("GET", "sleep.php", "ms=0", 0));
    raw.stdin(1, 2 * 1024 * 1024, 32 * 1024);
    let mut ended = HashMap::new();
    let refused = raw.end_of(1, &mut ended);
    assert_eq!(refused.protocol_status, OVERLOADED, "{refused:?}");
    assert!(refused.stdout.contains("X-Early: yes"), "{refused:?}");
    assert!(!refused.stdout.contains("Status: 503"), "{refused:?}");
    assert!(!refused.stdout.contains("late"), "{refused:?}");
    s.corral.wait_log(
        "sends a request body faster than the backend reads it",
        Duration::from_secs(5),
    );
    // The other request goes on once the slot is free.
    let second = raw.end_of(2, &mut ended);
    assert_eq!(second.protocol_status, REQUEST_COMPLETE);
    assert!(second.stdout.contains("slept 0"), "{second:?}");
}

#[test]
fn a_body_alone_on_its_connection_waits_for_the_slot_instead() {
    let s = setup();
    let mut first = s.connect();
    let started = hold_the_slot(&s, &mut first);
    // A second connection, as nginx opens one per request: its 2 MiB body is held back by
    // backpressure while it waits, never refused.
    let mut second = s.connect();
    let len = 2 * 1024 * 1024;
    second.begin(1, &s.params("POST", "upload.php", "", len));
    let writer = {
        let mut stream = second.stream.try_clone().unwrap();
        std::thread::spawn(move || {
            let mut out = BytesMut::new();
            let data = vec![b'y'; 32 * 1024];
            for _ in 0..len / data.len() {
                encode_stdin(1, &data, &mut out);
            }
            encode_stdin_end(1, &mut out);
            stream.write_all(&out).unwrap();
        })
    };
    let mut ended = HashMap::new();
    let answer = second.end_of(1, &mut ended);
    writer.join().unwrap();
    assert_eq!(answer.protocol_status, REQUEST_COMPLETE);
    assert!(answer.stdout.contains(&format!("got {len}")), "{answer:?}");
    assert!(answer.at - started >= Duration::from_millis(SLOW_MS));
    assert_slow_one_completes(&mut first, &mut HashMap::new(), started);
}

/// A GET whose parameters pass the limit: five values of 15,000 bytes, each under the
/// 16 KiB value limit, together over the 64 KiB of one request's parameters.
fn oversized_params(s: &Setup) -> Vec<(Bytes, Bytes)> {
    let mut params = s.params("GET", "sleep.php", "ms=0", 0);
    for i in 0..5 {
        params.push((
            Bytes::from(format!("HTTP_X_BIG_{i}")),
            Bytes::from(vec![b'v'; 15_000]),
        ));
    }
    params
}

#[test]
fn oversized_params_close_the_connection_with_a_log_line() {
    let s = setup();
    let mut raw = s.connect();
    let params = oversized_params(&s);
    raw.get(1, &params);
    assert!(raw.record().is_none(), "corral closes the connection");
    s.corral
        .wait_log("over the limit of 65536", Duration::from_secs(5));
}

/// A front server still sending when corral refuses what it sent (parameters past the limit,
/// then 256 KiB more): corral lingers, reading what follows, so the front server reads the
/// connection's end, not a reset (closing a socket with unread bytes resets it, and a reset
/// can destroy what was written before it).
#[test]
fn a_refused_connection_still_sending_is_closed_not_reset() {
    let s = setup();
    let mut raw = s.connect();
    let params = oversized_params(&s);
    let mut out = BytesMut::new();
    encode_begin_request(1, Role::Responder, true, &mut out);
    encode_params(1, &params, &mut out).unwrap();
    let stdin = vec![b'x'; 8192];
    for _ in 0..32 {
        encode_stdin(1, &stdin, &mut out);
    }
    // Written from another thread: corral stops decoding at the limit, so the write may
    // outlast the refusal (an error there is the reset this test is about, seen below).
    let mut writer = raw.stream.try_clone().unwrap();
    let sending = std::thread::spawn(move || writer.write_all(&out).is_ok());
    assert!(raw.record().is_none(), "corral closes the connection");
    assert!(
        sending.join().unwrap(),
        "the front server's writes were reset"
    );
    s.corral
        .wait_log("over the limit of 65536", Duration::from_secs(5));
}
