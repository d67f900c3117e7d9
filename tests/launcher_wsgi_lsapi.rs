//! The WSGI launcher alone, on a Unix listener passed as fd 0, driven with corral's LSAPI
//! codec: the answer is exact and in each request's byte order, the environ follows the LSAPI
//! request, a request arrives whole however it is written, PEP 3333's corner cases (exc_info,
//! bad headers, an error after the head, wsgi.input lines, wsgi.file_wrapper) hold, malformed
//! or garbage packets close only their connection, and RESP_END leaves with the last bytes of
//! the announced Content-Length. The app and the client are in tests/support/launcher_wsgi.rs.

mod support;

use std::io::{Read, Write};
use std::net::Shutdown;
use std::time::Duration;

use bytes::BytesMut;
use corral::protocols::lsapi::{ByteOrder, FlagRule, ResponseEvent};
use support::launcher::{eventually, Launcher};
use support::launcher_wsgi::{exchange, get, read_answer, request, try_read_answer};
use support::lsapi::{assert_closed_without_answer, read_answer_from, Answer};
use support::peers::shared_dir;

#[test]
fn the_answer_is_exact_and_the_environ_follows_the_lsapi_request() {
    let dir = shared_dir();
    let launcher = Launcher::wsgi(dir.path());
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
    let launcher = Launcher::wsgi(dir.path());
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
    let launcher = Launcher::wsgi(dir.path());
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
    let launcher = Launcher::wsgi(dir.path());
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
    let launcher = Launcher::wsgi(dir.path());
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
    let launcher = Launcher::wsgi(dir.path());
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
    let launcher = Launcher::wsgi(dir.path());
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
