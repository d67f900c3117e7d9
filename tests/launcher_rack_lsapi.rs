//! The Rack launcher on its own, started directly on a Unix listener and driven with
//! corral's LSAPI codec: it answers in the byte order of each request, reads a request
//! written byte by byte whole, survives malformed packets, answers 500 for a body that fails
//! before its first chunk and cuts the connection after it, and sends RESP_END with the last
//! bytes of the announced Content-Length. The app and the client are in
//! tests/support/launcher_rack.rs.

mod support;

use std::io::{Read, Write};
use std::net::Shutdown;
use std::time::Duration;

use bytes::BytesMut;
use corral::protocols::lsapi::{ByteOrder, FlagRule, ResponseDecoder, ResponseEvent};
use corral::protocols::Limits;
use support::launcher::{eventually, Launcher};
use support::launcher_rack::{begin_request, read_answer};
use support::lsapi::assert_closed_without_answer;

#[test]
fn the_launcher_answers_in_the_byte_order_of_each_request() {
    let launcher = Launcher::rack();
    let mut s = launcher.connect();
    for order in [ByteOrder::NATIVE, ByteOrder::Big, ByteOrder::Little] {
        s.write_all(&begin_request("POST", "/echo", "", b"some body", order))
            .unwrap();
        let a = read_answer(&mut s);
        let flag = FlagRule::HOST.flag_for(order);
        assert!(a.flags.iter().all(|&f| f == flag), "{order:?}: {a:?}");
        assert_eq!(a.events[0], ResponseEvent::ReqReceived, "{a:?}");
        assert_eq!((a.status, a.body.as_slice()), (200, &b"some body"[..]));
        assert_eq!(a.lines, ["content-type: text/plain"]);
    }
    // A hop-by-hop header from the app is dropped (and logged): corral owns the connection.
    s.write_all(&begin_request("GET", "/x", "", b"", ByteOrder::NATIVE))
        .unwrap();
    let a = read_answer(&mut s);
    assert_eq!((a.status, a.body.as_slice()), (200, &b"ok /x"[..]));
    assert_eq!(a.lines, ["content-type: text/plain"]);
    assert!(launcher.wait_stderr("dropped hop-by-hop header connection"));
    // A Rack 3 streaming body (call, not each) writes through the stream.
    s.write_all(&begin_request(
        "GET",
        "/callable",
        "",
        b"",
        ByteOrder::NATIVE,
    ))
    .unwrap();
    let a = read_answer(&mut s);
    assert_eq!(a.body, b"streamed;by call");
}

#[test]
fn a_request_written_byte_by_byte_is_read_whole() {
    let launcher = Launcher::rack();
    let mut s = launcher.connect();
    let body: Vec<u8> = (0..40_000u32).map(|i| (i % 251) as u8).collect();
    for b in begin_request("POST", "/echo", "", &body, ByteOrder::NATIVE) {
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
fn bad_packets_close_the_connection_and_the_launcher_keeps_serving() {
    let launcher = Launcher::rack();
    let good = begin_request("GET", "/x", "", b"", ByteOrder::Little);
    let with = |at: usize, bytes: &[u8]| {
        let mut p = good.clone();
        p[at..at + bytes.len()].copy_from_slice(bytes);
        p
    };
    // The first env pair starts after the 44-byte header and the empty special env list;
    // its lengths are big-endian and count the NUL.
    let key_len = u16::from_be_bytes([good[48], good[49]]) as usize;
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
        // The first env pair's key length runs past the packet.
        (
            "pair past the end",
            with(48, &[0xff, 0xff]),
            "runs past the",
        ),
        ("zero pair length", with(48, &[0x00, 0x00]), "zero length"),
        // The first key's NUL is not where its length puts it.
        (
            "key not NUL-terminated",
            with(48 + 4 + key_len - 1, b"X"),
            "env pair 0 is not NUL-terminated",
        ),
        // A packet length that cuts the env list: the pairs go on in the bytes after the
        // packet, with their NULs where their lengths say, yet they are not the packet's.
        (
            "env list past the packet length",
            with(4, &[210, 0, 0, 0]),
            "runs past the 210-byte packet",
        ),
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
            "pair count 65535",
        ),
        // A string offset outside the packet; a header block length that does not end
        // the packet; an unknown-header count that runs past it.
        (
            "offset outside",
            with(16, &[0xff, 0xff, 0, 0]),
            "Off 65535 is outside",
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
            "connection closed inside BEGIN_REQUEST",
        ),
        (
            "truncated header",
            good[..5].to_vec(),
            "connection closed inside a packet header (5 of 8 bytes)",
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
        let log = launcher.stderr();
        let last = log.lines().rfind(|l| l.contains("bad LSAPI request"));
        assert!(
            last.is_some_and(|l| l.contains(message)),
            "{name}: wanted {message:?} in {last:?}"
        );
    }
    // A bad packet after a good request on the same connection: the answer to the first
    // arrives, then the connection closes.
    let mut s = launcher.connect();
    s.write_all(&good).unwrap();
    assert_eq!(read_answer(&mut s).body, b"ok /x");
    s.write_all(&with(0, b"XS")).unwrap();
    assert_closed_without_answer(&mut s);
    // A connection that only opens and closes (a readiness probe) is not an error.
    drop(launcher.connect());
    let mut s = launcher.connect();
    s.write_all(&good).unwrap();
    assert_eq!(read_answer(&mut s).body, b"ok /x");
    drop(s);
    // One more bad packet is the marker: its complaint is the last, so the probe and the
    // good requests made none (the launcher serves one connection after the other).
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
    assert_eq!(log.matches("bad LSAPI request").count(), n + 2, "{log}");
    assert!(
        log.lines()
            .rfind(|l| l.contains("bad LSAPI request"))
            .is_some_and(|l| l.contains("magic")),
        "{log}"
    );
}

#[test]
fn a_body_that_fails_before_its_first_chunk_is_a_500_and_after_it_a_cut_connection() {
    let launcher = Launcher::rack();
    let mut s = launcher.connect();
    for path in ["/fail-early", "/bad-header"] {
        s.write_all(&begin_request("GET", path, "", b"", ByteOrder::NATIVE))
            .unwrap();
        let a = read_answer(&mut s);
        assert_eq!(
            (a.status, a.body.as_slice()),
            (500, &b"Internal Server Error\n"[..]),
            "{path}"
        );
    }
    assert!(launcher.wait_stderr("no chunk at all"));
    assert!(launcher.wait_stderr("not an HTTP token"));
    // Still the same connection; now a failure after the head cuts it.
    s.write_all(&begin_request(
        "GET",
        "/fail-late",
        "",
        b"",
        ByteOrder::NATIVE,
    ))
    .unwrap();
    let mut rest = Vec::new();
    s.read_to_end(&mut rest).unwrap();
    let mut decoder = ResponseDecoder::new(&Limits::DEFAULT);
    let mut buf = BytesMut::from(&rest[..]);
    let mut events = Vec::new();
    while let Some(e) = decoder.decode(&mut buf).unwrap() {
        events.push(e);
    }
    assert!(buf.is_empty(), "a partial packet: {buf:?}");
    assert!(matches!(events.first(), Some(ResponseEvent::ReqReceived)));
    assert!(matches!(events.get(1), Some(ResponseEvent::Header(h)) if h.status == 200));
    assert_eq!(events.get(2), Some(&ResponseEvent::Stream("part;".into())));
    assert_eq!(
        events.len(),
        3,
        "no RESP_END after a failed body: {events:?}"
    );
    assert!(launcher.wait_stderr("half way"));
}

#[test]
fn resp_end_leaves_with_the_last_bytes_of_the_announced_content_length() {
    // corral stops reading an answer once it has the bytes Content-Length announced and
    // drops an exchange whose RESP_END has not come with them: an end written only when
    // the body ends would find the connection closed and cost corral the connection.
    let launcher = Launcher::rack();
    let mut s = launcher.connect();
    s.write_all(&begin_request(
        "GET",
        "/length-then-wait",
        "",
        b"",
        ByteOrder::NATIVE,
    ))
    .unwrap();
    let asked = tokio::time::Instant::now();
    let answer = read_answer(&mut s);
    assert_eq!((answer.status, answer.text().as_str()), (200, "whole"));
    assert!(
        asked.elapsed() < Duration::from_secs(3),
        "RESP_END came only when the body ended, after {:?}",
        asked.elapsed()
    );
    // Once the body ends, the connection carries the next request.
    std::fs::write(launcher.dir().join("go"), "").unwrap();
    s.write_all(&begin_request("GET", "/", "", b"", ByteOrder::NATIVE))
        .unwrap();
    assert_eq!(read_answer(&mut s).text(), "ok /");
    drop(s);

    // More bytes after the announced ones cannot follow RESP_END: the answer ends at the
    // Content-Length, then the connection closes, and the log says why.
    let mut s = launcher.connect();
    s.write_all(&begin_request(
        "GET",
        "/over-length",
        "",
        b"",
        ByteOrder::NATIVE,
    ))
    .unwrap();
    assert_eq!(read_answer(&mut s).text(), "whole");
    let mut rest = Vec::new();
    s.read_to_end(&mut rest).unwrap();
    assert!(rest.is_empty(), "{rest:?}");
    assert!(launcher.wait_stderr("GET /over-length: the body gave more than its Content-Length"));
    // The launcher serves on.
    let mut s = launcher.connect();
    s.write_all(&begin_request("GET", "/", "", b"", ByteOrder::NATIVE))
        .unwrap();
    assert_eq!(read_answer(&mut s).text(), "ok /");
}
