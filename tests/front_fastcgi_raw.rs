//! The `fastcgi` front listener with a FastCGI web server written out by hand, talking
//! straight to corral's socket in front of php-cgi, for what nginx never does: several
//! requests multiplexed on one connection, FCGI_ABORT_REQUEST (answered at once, the slot
//! freed), management records and refused roles, a body in many STDIN records, a front
//! server that goes away mid-response, and a graceful stop with a request in progress. The
//! same site behind nginx is `tests/front_fastcgi.rs`.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing,
    missing_docs
)]

mod support;

use std::collections::HashMap;
use std::time::Duration;

use bytes::BytesMut;
use corral::protocols::fastcgi::{
    encode_abort_request, encode_begin_request, encode_params, encode_stdin, encode_stdin_end,
    RecordType, Role,
};
use support::front::connected_unix_sockets;
use support::front_fastcgi::{site, Site};
use support::peers::{cgi_params, md5_hex};
use support::raw_fastcgi::RawConn;
use support::weak::AT_ONCE;
use tokio::time::Instant;

/// A connection of the hand-written FastCGI web server (`support::raw_fastcgi`) to `c`.
fn connect(c: &Site) -> RawConn {
    RawConn::connect(&c.corral.socket)
}

/// This suite's requests, sent by the hand-written FastCGI web server.
trait Requests {
    fn get(&mut self, c: &Site, id: u16, keep_conn: bool, script: &str, query: &str);
    fn answers(&mut self, ids: &[u16]) -> HashMap<u16, (String, Vec<u8>)>;
}

impl Requests for RawConn {
    /// BEGIN_REQUEST, PARAMS for a GET of `script?query`, and the end of STDIN.
    fn get(&mut self, c: &Site, id: u16, keep_conn: bool, script: &str, query: &str) {
        let mut out = BytesMut::new();
        encode_begin_request(id, Role::Responder, keep_conn, &mut out);
        let params = cgi_params("GET", &c.path().join("www").join(script), query, &[]);
        encode_params(id, &params, &mut out).unwrap();
        encode_stdin_end(id, &mut out);
        self.send(&out);
    }

    /// Reads until every id in `ids` has its END_REQUEST: each id's STDOUT and END_REQUEST
    /// body.
    fn answers(&mut self, ids: &[u16]) -> HashMap<u16, (String, Vec<u8>)> {
        let mut stdout: HashMap<u16, String> = HashMap::new();
        let mut done = HashMap::new();
        while done.len() < ids.len() {
            let r = self.record().expect("END_REQUEST before the close");
            match r.kind {
                RecordType::Stdout => stdout
                    .entry(r.request_id)
                    .or_default()
                    .push_str(&String::from_utf8_lossy(&r.content)),
                RecordType::EndRequest => {
                    let out = stdout.remove(&r.request_id).unwrap_or_default();
                    assert!(
                        done.insert(r.request_id, (out, r.content.to_vec()))
                            .is_none(),
                        "a second END_REQUEST for {}",
                        r.request_id
                    );
                }
                RecordType::Stderr => {}
                other => panic!("unexpected {other:?} record"),
            }
        }
        done
    }
}

/// FCGI_END_REQUEST's body: app status 0 and the given protocol status.
fn end_body(protocol_status: u8) -> Vec<u8> {
    vec![0, 0, 0, 0, protocol_status, 0, 0, 0]
}

#[test]
fn multiplexed_requests_share_one_connection() {
    let c = site();
    let mut raw = connect(&c);
    // Three requests in flight at once: php-cgi serves one at a time, so two wait in
    // corral's queue while the first sleeps.
    raw.get(&c, 7, true, "sleep.php", "ms=300");
    raw.get(&c, 1, true, "query.php", "q=one");
    raw.get(&c, 300, true, "query.php", "q=three");
    let answers = raw.answers(&[7, 1, 300]);
    for (id, want) in [
        (7, "slept 300"),
        (1, "q=one method=GET"),
        (300, "q=three method=GET"),
    ] {
        let (out, end) = &answers[&id];
        assert!(out.ends_with(want), "request {id}: {out:?}");
        assert!(
            out.contains("Content-type: text/html"),
            "a CGI head first: {out:?}"
        );
        assert_eq!(end, &end_body(0), "REQUEST_COMPLETE");
    }
    // The ids are free again: reuse one on the same connection.
    raw.get(&c, 1, false, "query.php", "q=again");
    assert!(raw.answers(&[1])[&1].0.ends_with("q=again method=GET"));
    assert!(
        raw.record().is_none(),
        "closed after a request without KEEP_CONN"
    );
}

/// The pool's `in flight` count on corral's status page: requests holding a slot.
fn in_flight(c: &Site) -> String {
    let log = c
        .corral
        .wait_log("status listener ready", Duration::from_secs(10));
    let addr: std::net::SocketAddr = log
        .lines()
        .find(|l| l.contains("status listener ready"))
        .and_then(|l| {
            l.split_whitespace()
                .find_map(|w| w.strip_prefix("listener="))
        })
        .and_then(|a| a.parse().ok())
        .unwrap_or_else(|| panic!("no status listener address in:\n{log}"));
    let text = support::server::http(addr, "GET", "/status", &[], b"").text();
    text.lines()
        .find_map(|l| l.strip_prefix("in flight:"))
        .map(|v| v.trim().to_owned())
        .unwrap_or_else(|| panic!("no in flight in:\n{text}"))
}

#[test]
fn an_aborted_request_ends_at_once_and_frees_its_slot() {
    // The script sleeps 8 s; the abort must be answered, and its slot freed, in under 3 s.
    const SCRIPT_MS: u64 = 8000;
    let c = site();
    let mut raw = connect(&c);
    raw.get(&c, 1, true, "sleep.php", &format!("ms={SCRIPT_MS}"));
    // Once the request holds a slot and has reached php-cgi, abort it.
    assert!(
        support::eventually(Duration::from_secs(10), || {
            connected_unix_sockets(&c.php.socket) > 0 && in_flight(&c) == "1"
        }),
        "the request never reached php-cgi"
    );
    let started = Instant::now();
    let mut out = BytesMut::new();
    encode_abort_request(1, &mut out);
    raw.send(&out);
    let answers = raw.answers(&[1]);
    let took = started.elapsed();
    assert!(
        took < AT_ONCE,
        "the abort was answered after {took:?}, against a {SCRIPT_MS} ms script"
    );
    assert_eq!(answers[&1].1, end_body(0));
    // The slot is free while php-cgi still sleeps.
    assert!(
        support::eventually(AT_ONCE, || in_flight(&c) == "0"),
        "the aborted request still holds its slot\n{}",
        c.corral.log()
    );
    let freed = started.elapsed();
    assert!(
        freed < Duration::from_millis(SCRIPT_MS) / 2,
        "the slot came free after {freed:?}, against a {SCRIPT_MS} ms script"
    );
    // And a new request is served (once php-cgi, one request at a time, is done sleeping).
    raw.get(&c, 1, true, "query.php", "q=next");
    assert!(raw.answers(&[1])[&1].0.ends_with("q=next method=GET"));
}

#[test]
fn management_records_and_refusals() {
    let c = site();
    let mut raw = connect(&c);
    // FCGI_GET_VALUES (type 9, id 0) asking for FCGI_MPXS_CONNS, FCGI_MAX_REQS and a name
    // FastCGI does not define: pairs of (1-byte name length, 1-byte value length, name).
    let mut query = vec![1, 9, 0, 0, 0, 0, 0, 0];
    for name in [&b"FCGI_MPXS_CONNS"[..], b"FCGI_MAX_REQS", b"X_UNKNOWN"] {
        query.extend_from_slice(&[name.len() as u8, 0]);
        query.extend_from_slice(name);
    }
    let content_len = (query.len() - 8) as u16;
    query[4..6].copy_from_slice(&content_len.to_be_bytes());
    raw.send(&query);
    let r = raw.record().unwrap();
    assert_eq!(r.kind, RecordType::GetValuesResult);
    assert_eq!(r.request_id, 0);
    let content = r.content.to_vec();
    assert!(
        content.starts_with(b"\x0f\x01FCGI_MPXS_CONNS1"),
        "{:?}",
        String::from_utf8_lossy(&content)
    );
    assert!(content.windows(13).any(|w| w == b"FCGI_MAX_REQS"));
    assert!(!content.windows(9).any(|w| w == b"X_UNKNOWN"));

    // A record of type 42 on id 0: FCGI_UNKNOWN_TYPE (11) naming it.
    raw.send(&[1, 42, 0, 0, 0, 0, 0, 0]);
    let r = raw.record().unwrap();
    assert_eq!((r.kind, r.request_id), (RecordType::UnknownType, 0));
    assert_eq!(&r.content[..], &[42, 0, 0, 0, 0, 0, 0, 0]);

    // BEGIN_REQUEST for the FILTER role (3), then for role 9: FCGI_UNKNOWN_ROLE (3) both.
    raw.send(&[1, 1, 0, 5, 0, 8, 0, 0, 0, 3, 1, 0, 0, 0, 0, 0]);
    assert_eq!(raw.answers(&[5])[&5].1, end_body(3));
    raw.send(&[1, 1, 0, 6, 0, 8, 0, 0, 0, 9, 1, 0, 0, 0, 0, 0]);
    assert_eq!(raw.answers(&[6])[&6].1, end_body(3));

    // The connection still serves requests.
    raw.get(&c, 2, true, "query.php", "q=after");
    assert!(raw.answers(&[2])[&2].0.ends_with("q=after method=GET"));

    // A record of version 2 breaks the protocol: corral says why in its log and closes.
    raw.send(&[2, 1, 0, 1, 0, 8, 0, 0, 0, 1, 1, 0, 0, 0, 0, 0]);
    assert!(raw.record().is_none());
    c.corral
        .wait_log("broke the protocol", Duration::from_secs(10));
}

#[test]
fn a_request_body_streams_in_many_stdin_records() {
    let c = site();
    let mut raw = connect(&c);
    let body: Vec<u8> = (0..1_000_000u32).map(|i| (i % 253) as u8).collect();
    let mut out = BytesMut::new();
    encode_begin_request(4, Role::Responder, true, &mut out);
    let len = body.len().to_string();
    let params = cgi_params(
        "POST",
        &c.path().join("www").join("upload.php"),
        "",
        &[
            ("CONTENT_LENGTH", &len),
            ("CONTENT_TYPE", "application/octet-stream"),
        ],
    );
    encode_params(4, &params, &mut out).unwrap();
    raw.send(&out);
    for piece in body.chunks(10_000) {
        let mut out = BytesMut::new();
        encode_stdin(4, piece, &mut out);
        raw.send(&out);
    }
    let mut out = BytesMut::new();
    encode_stdin_end(4, &mut out);
    raw.send(&out);
    let md5 = md5_hex(c.path(), &body);
    let (text, end) = &raw.answers(&[4])[&4];
    assert!(text.ends_with(&format!("{md5} {len} {len}")), "{text:?}");
    assert_eq!(end, &end_body(0));
}

#[test]
fn a_front_server_that_goes_away_aborts_the_backend_request() {
    let c = site();
    let mut raw = connect(&c);
    raw.get(&c, 1, true, "download.php", "");
    let first = raw.record().unwrap();
    assert_eq!(first.kind, RecordType::Stdout);
    // Gone mid-response, 10 MiB still to come: corral must drop the backend request, or
    // php-cgi (one request at a time) would block writing into a full socket and hold the
    // pool's only slot.
    drop(raw);
    let mut raw = connect(&c);
    raw.get(&c, 1, true, "query.php", "q=next");
    let (text, _) = &raw.answers(&[1])[&1];
    assert!(text.ends_with("q=next method=GET"), "{text:?}");
}

#[test]
fn a_graceful_stop_finishes_the_request_in_progress_then_closes() {
    let c = site();
    let mut raw = connect(&c);
    raw.get(&c, 3, true, "sleep.php", "ms=500");
    let deadline = Instant::now() + Duration::from_secs(10);
    while connected_unix_sockets(&c.php.socket) == 0 {
        assert!(
            Instant::now() < deadline,
            "the request never reached php-cgi"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    let status = std::process::Command::new("kill")
        .args(["-TERM", &c.corral.pid().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    let (text, end) = &raw.answers(&[3])[&3];
    assert!(text.ends_with("slept 500"), "{text:?}");
    assert_eq!(end, &end_body(0));
    assert!(
        raw.record().is_none(),
        "the kept connection closes once it is idle"
    );
}
