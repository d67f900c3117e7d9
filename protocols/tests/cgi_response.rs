#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing,
    missing_docs
)]
//! CGI response head: hand-written heads from RFC 3875 §6 and from what php-cgi writes, every
//! malformed case with its error, limits, and round trip / chunking properties.

use bytes::{Bytes, BytesMut};
use corral_protocols::cgi_response::{
    encode_head, CgiResponseDecoder, CgiResponseError, CgiResponseHead, CgiStatus, ResponseKind,
};
use corral_protocols::Limits;
use proptest::prelude::*;

/// Decodes `input` in one piece; returns the head and what is left in the buffer.
fn decode(input: &[u8]) -> Result<(CgiResponseHead, Vec<u8>), CgiResponseError> {
    decode_with(input, &Limits::DEFAULT)
}

fn decode_with(
    input: &[u8],
    limits: &Limits,
) -> Result<(CgiResponseHead, Vec<u8>), CgiResponseError> {
    let mut buf = BytesMut::from(input);
    let head = CgiResponseDecoder::new(limits)
        .decode(&mut buf)?
        .expect("a complete head");
    Ok((head, buf.to_vec()))
}

/// Feeds `input` in pieces cut at `cuts`; returns the head and the remaining bytes.
fn decode_chunked(
    input: &[u8],
    cuts: &[usize],
) -> Result<Option<(CgiResponseHead, Vec<u8>)>, CgiResponseError> {
    let mut decoder = CgiResponseDecoder::new(&Limits::DEFAULT);
    let mut buf = BytesMut::new();
    let mut points: Vec<usize> = cuts.iter().map(|c| c % (input.len() + 1)).collect();
    points.push(input.len());
    points.sort_unstable();
    let mut start = 0;
    let mut head = None;
    for end in points {
        buf.extend_from_slice(&input[start..end]);
        start = end;
        if head.is_none() {
            head = decoder.decode(&mut buf)?;
        }
    }
    Ok(head.map(|h| (h, buf.to_vec())))
}

fn h(name: &str, value: &str) -> (Bytes, Bytes) {
    (
        Bytes::copy_from_slice(name.as_bytes()),
        Bytes::copy_from_slice(value.as_bytes()),
    )
}

#[test]
fn document_response_with_status() {
    // RFC 3875 §6.2.1 document-response, with a Status field (§6.3.3), CRLF endings.
    let input = b"Status: 404 Not Found\r\n\
                  Content-Type: text/html\r\n\
                  \r\n\
                  <h1>gone</h1>";
    let (head, body) = decode(input).unwrap();
    assert_eq!(
        head.status().cloned(),
        Some(CgiStatus {
            code: 404,
            reason: Bytes::from_static(b"Not Found")
        })
    );
    assert_eq!(head.headers(), vec![h("Content-Type", "text/html")]);
    assert_eq!(head.kind(), ResponseKind::Document);
    assert_eq!(head.status_code(), 404);
    assert_eq!(body, b"<h1>gone</h1>");
}

#[test]
fn php_cgi_head_with_lf_endings_and_default_status() {
    // What php-cgi writes for a plain echo; LF-only endings are allowed (RFC 3875 NL).
    let input = b"X-Powered-By: PHP/8.2.7\n\
                  Content-type: text/html; charset=UTF-8\n\
                  \n\
                  hello\r\n\r\nstill body";
    let (head, body) = decode(input).unwrap();
    assert_eq!(head.status(), None);
    assert_eq!(head.status_code(), 200);
    assert_eq!(
        head.header(b"content-type").unwrap(),
        &Bytes::from_static(b"text/html; charset=UTF-8")
    );
    assert_eq!(head.headers().len(), 2);
    assert_eq!(body, b"hello\r\n\r\nstill body");
}

#[test]
fn redirects() {
    // §6.2.2 local redirect: a local path and no Status.
    let (head, body) = decode(b"Location: /other.php?x=1\r\n\r\n").unwrap();
    assert_eq!(
        head.kind(),
        ResponseKind::LocalRedirect {
            location: b"/other.php?x=1"
        }
    );
    assert!(body.is_empty());
    // §6.2.3 client redirect: an absolute URI; the status defaults to 302.
    let (head, _) = decode(b"Location: http://example.com/x\r\n\r\n").unwrap();
    assert_eq!(
        head.kind(),
        ResponseKind::ClientRedirect {
            location: b"http://example.com/x"
        }
    );
    assert_eq!(head.status_code(), 302);
    // §6.2.4 client redirect with document: Status given.
    let (head, body) = decode(b"Status: 301 Moved Permanently\r\nLocation: https://example.com/\r\nContent-Type: text/html\r\n\r\nmoved").unwrap();
    assert_eq!(
        head.kind(),
        ResponseKind::ClientRedirect {
            location: b"https://example.com/"
        }
    );
    assert_eq!(head.status_code(), 301);
    assert_eq!(body, b"moved");
    // php-cgi's header("Location: /x") comes with its own Status: a client redirect.
    let (head, _) = decode(b"Status: 302 Found\r\nLocation: /login.php\r\n\r\n").unwrap();
    assert_eq!(
        head.kind(),
        ResponseKind::ClientRedirect {
            location: b"/login.php"
        }
    );
    // A relative reference without Status goes to the client too.
    let (head, _) = decode(b"Location: next.php\r\n\r\n").unwrap();
    assert_eq!(
        head.kind(),
        ResponseKind::ClientRedirect {
            location: b"next.php"
        }
    );
}

#[test]
fn status_forms() {
    let ok = |input: &[u8], code: u16, reason: &[u8]| {
        let (head, _) = decode(input).unwrap();
        assert_eq!(
            head.status().cloned(),
            Some(CgiStatus {
                code,
                reason: Bytes::copy_from_slice(reason)
            }),
            "{input:?}"
        );
    };
    ok(b"Status: 204\r\n\r\n", 204, b"");
    ok(b"status:200 OK\r\n\r\n", 200, b"OK");
    ok(
        b"STATUS: \t 500  Internal  Error \t\r\n\r\n",
        500,
        b"Internal  Error",
    );
    ok(b"Status: 100\n\n", 100, b"");
    ok(b"Status: 999 Custom\n\n", 999, b"Custom");
}

#[test]
fn empty_head_is_a_document() {
    let (head, body) = decode(b"\r\nbody").unwrap();
    assert_eq!(head, CgiResponseHead::default());
    assert_eq!(body, b"body");
    let (head, body) = decode(b"\nbody").unwrap();
    assert_eq!(head, CgiResponseHead::default());
    assert_eq!(body, b"body");
}

#[test]
fn malformed_heads() {
    use CgiResponseError as E;
    let cases: &[(&[u8], E)] = &[
        (
            b"Status: 20\r\n\r\n",
            E::InvalidStatus {
                value: b"20".to_vec(),
            },
        ),
        (
            b"Status: 099 Low\r\n\r\n",
            E::InvalidStatus {
                value: b"099 Low".to_vec(),
            },
        ),
        (
            b"Status: 1000\r\n\r\n",
            E::InvalidStatus {
                value: b"1000".to_vec(),
            },
        ),
        (
            b"Status: 200OK\r\n\r\n",
            E::InvalidStatus {
                value: b"200OK".to_vec(),
            },
        ),
        (
            b"Status: abc\r\n\r\n",
            E::InvalidStatus {
                value: b"abc".to_vec(),
            },
        ),
        (
            b"Status:\r\n\r\n",
            E::InvalidStatus {
                value: b"".to_vec(),
            },
        ),
        (b"Status: 200 OK\r\nStatus: 404\r\n\r\n", E::DuplicateStatus),
        (
            b"Location: /a\r\nlocation: /b\r\n\r\n",
            E::DuplicateLocation,
        ),
        (
            b"Location:\r\n\r\n",
            E::InvalidLocation {
                value: b"".to_vec(),
            },
        ),
        (
            b"Location: /a b\r\n\r\n",
            E::InvalidLocation {
                value: b"/a b".to_vec(),
            },
        ),
        // A line without a colon must never pass as body or header (OpenBSD httpd, CVE-2025-1734).
        (
            b"PHP Warning something\r\n\r\n",
            E::MissingColon { line: 1 },
        ),
        (
            b"Content-Type: text/html\r\n folded\r\n\r\n",
            E::ObsFold { line: 2 },
        ),
        (b"\tX: y\r\n\r\n", E::ObsFold { line: 1 }),
        (
            b"Bad Name: x\r\n\r\n",
            E::InvalidName {
                name: b"Bad Name".to_vec(),
            },
        ),
        (
            b"Name : x\r\n\r\n",
            E::InvalidName {
                name: b"Name ".to_vec(),
            },
        ),
        (b": x\r\n\r\n", E::InvalidName { name: b"".to_vec() }),
        (
            b"X\0: x\r\n\r\n",
            E::InvalidName {
                name: b"X\0".to_vec(),
            },
        ),
        (
            b"X: a\0b\r\n\r\n",
            E::InvalidValue {
                name: b"X".to_vec(),
            },
        ),
        (
            b"X: a\x7f\r\n\r\n",
            E::InvalidValue {
                name: b"X".to_vec(),
            },
        ),
        (
            b"X: a\x01\r\n\r\n",
            E::InvalidValue {
                name: b"X".to_vec(),
            },
        ),
        (b"X: a\rSet-Cookie: y\r\n\r\n", E::BareCr { line: 1 }),
        (b"X: a\r\r\n\r\n", E::BareCr { line: 1 }),
        (b"X: a\r\n\r\r\n", E::BareCr { line: 2 }),
    ];
    for (input, expected) in cases {
        assert_eq!(
            decode(input).unwrap_err(),
            *expected,
            "{:?}",
            input.escape_ascii().to_string()
        );
    }
}

#[test]
fn head_size_and_line_limits() {
    let limits = Limits {
        max_response_head_bytes: 32,
        max_response_headers: 3,
        ..Limits::DEFAULT
    };
    // Exactly 32 bytes including the blank line is accepted.
    let exact32 = b"X-A: 01234567890123456789012\r\n\r\n";
    assert_eq!(exact32.len(), 32);
    assert!(decode_with(exact32, &limits).is_ok());
    let over = b"X-A: 012345678901234567890123\r\n\r\n";
    assert_eq!(
        decode_with(over, &limits).unwrap_err(),
        CgiResponseError::HeadTooLarge { limit: 32 }
    );
    // No line end at all: refused once the buffer reaches the limit, without waiting.
    let mut buf = BytesMut::from(&[b'x'; 32][..]);
    let mut decoder = CgiResponseDecoder::new(&limits);
    assert_eq!(
        decoder.decode(&mut buf).unwrap_err(),
        CgiResponseError::HeadTooLarge { limit: 32 }
    );
    let mut buf = BytesMut::from(&[b'x'; 31][..]);
    assert_eq!(
        CgiResponseDecoder::new(&limits).decode(&mut buf).unwrap(),
        None
    );
    let many = b"A: 1\nB: 2\nC: 3\nD: 4\n\n";
    assert_eq!(
        decode_with(many, &limits).unwrap_err(),
        CgiResponseError::TooManyHeaders { limit: 3 }
    );
    assert!(decode_with(b"A: 1\nB: 2\nC: 3\n\n", &limits).is_ok());
}

#[test]
fn byte_by_byte_and_reuse() {
    let input = b"Status: 200 OK\r\nContent-Type: text/plain\r\n\r\nbody";
    let mut decoder = CgiResponseDecoder::new(&Limits::DEFAULT);
    let mut buf = BytesMut::new();
    let head_len = input.len() - 4;
    for (i, &b) in input[..head_len].iter().enumerate() {
        buf.extend_from_slice(&[b]);
        let got = decoder.decode(&mut buf).unwrap();
        assert_eq!(got.is_some(), i + 1 == head_len, "after {} bytes", i + 1);
        if let Some(head) = got {
            assert_eq!(head.status_code(), 200);
            assert!(buf.is_empty());
        }
    }
    // The same decoder parses the next response.
    let mut buf = BytesMut::from(&b"Status: 500\n\n"[..]);
    assert_eq!(
        decoder.decode(&mut buf).unwrap().unwrap().status_code(),
        500
    );
}

#[test]
fn encoder_writes_the_expected_bytes() {
    let head = CgiResponseHead::new(
        Some(CgiStatus {
            code: 404,
            reason: Bytes::from_static(b"Not Found"),
        }),
        vec![h("Content-Type", "text/plain"), h("X-Id", "7")],
    );
    let mut out = BytesMut::new();
    encode_head(&head, &mut out).unwrap();
    assert_eq!(
        &out[..],
        b"Status: 404 Not Found\r\nContent-Type: text/plain\r\nX-Id: 7\r\n\r\n"
    );
    let mut out = BytesMut::new();
    let bare = CgiResponseHead::new(
        Some(CgiStatus {
            code: 204,
            reason: Bytes::new(),
        }),
        vec![],
    );
    encode_head(&bare, &mut out).unwrap();
    assert_eq!(&out[..], b"Status: 204\r\n\r\n");
}

#[test]
fn encoder_refusals() {
    use CgiResponseError as E;
    let status = |code, reason: &'static [u8]| {
        Some(CgiStatus {
            code,
            reason: Bytes::from_static(reason),
        })
    };
    let cases: Vec<(CgiResponseHead, E)> = vec![
        (
            CgiResponseHead::new(status(99, b""), vec![]),
            E::InvalidStatus { value: vec![] },
        ),
        (
            CgiResponseHead::new(status(1000, b""), vec![]),
            E::InvalidStatus { value: vec![] },
        ),
        (
            CgiResponseHead::new(status(200, b"O\r\nK"), vec![]),
            E::InvalidStatus {
                value: b"O\r\nK".to_vec(),
            },
        ),
        (
            CgiResponseHead::new(status(200, b" OK"), vec![]),
            E::InvalidStatus {
                value: b" OK".to_vec(),
            },
        ),
        (
            CgiResponseHead::new(None, vec![h("Status", "200")]),
            E::DuplicateStatus,
        ),
        (
            CgiResponseHead::new(None, vec![h("A B", "x")]),
            E::InvalidName {
                name: b"A B".to_vec(),
            },
        ),
        (
            CgiResponseHead::new(None, vec![h("X", "a\nb")]),
            E::InvalidValue {
                name: b"X".to_vec(),
            },
        ),
        (
            CgiResponseHead::new(None, vec![h("X", " a")]),
            E::InvalidValue {
                name: b"X".to_vec(),
            },
        ),
        (
            CgiResponseHead::new(None, vec![h("A", "fine"), h("X", "a\t")]),
            E::InvalidValue {
                name: b"X".to_vec(),
            },
        ),
        (
            CgiResponseHead::new(None, vec![h("X", "a\x7fb")]),
            E::InvalidValue {
                name: b"X".to_vec(),
            },
        ),
        (
            CgiResponseHead::new(None, vec![h("X", "a\rb")]),
            E::InvalidValue {
                name: b"X".to_vec(),
            },
        ),
        (
            CgiResponseHead::new(status(200, b"OK "), vec![]),
            E::InvalidStatus {
                value: b"OK ".to_vec(),
            },
        ),
        (
            CgiResponseHead::new(None, vec![h("Location", "/a"), h("Location", "/b")]),
            E::DuplicateLocation,
        ),
        (
            CgiResponseHead::new(None, vec![h("Location", "")]),
            E::InvalidLocation { value: vec![] },
        ),
    ];
    for (head, expected) in cases {
        // A refused head leaves nothing of itself behind, even when parts of it were fine.
        let mut out = BytesMut::from(&b"before"[..]);
        assert_eq!(
            encode_head(&head, &mut out).unwrap_err(),
            expected,
            "{head:?}"
        );
        assert_eq!(&out[..], b"before", "{head:?}");
    }
    // A tab inside a value is a field-value byte; an empty value is allowed.
    let fine = CgiResponseHead::new(None, vec![h("X", "a\tb"), h("Y", "")]);
    let mut out = BytesMut::new();
    encode_head(&fine, &mut out).unwrap();
    assert_eq!(&out[..], b"X: a\tb\r\nY: \r\n\r\n");
}

fn arb_head() -> impl Strategy<Value = CgiResponseHead> {
    let status =
        prop::option::of(
            (100u16..=999, "[ -~]{0,12}").prop_map(|(code, reason)| CgiStatus {
                code,
                reason: Bytes::from(reason.trim_matches(|c| c == ' ' || c == '\t').to_owned()),
            }),
        );
    let header = (
        "X-[A-Za-z0-9!#$%&'*+.^_`|~-]{0,10}",
        "[!-~]([ -~\u{80}-\u{ff}]{0,20}[!-~])?",
    )
        .prop_map(|(n, v)| (Bytes::from(n), Bytes::from(v)));
    let location = prop::option::of("(/|http://h/)[!-~]{0,10}".prop_map(Bytes::from));
    (status, prop::collection::vec(header, 0..8), location).prop_map(
        |(status, mut headers, location)| {
            if let Some(l) = location {
                headers.push((Bytes::from_static(b"Location"), l));
            }
            CgiResponseHead::new(status, headers)
        },
    )
}

proptest! {
    #[test]
    fn round_trip_with_any_chunking(head in arb_head(), body in prop::collection::vec(any::<u8>(), 0..40),
                                    cuts in prop::collection::vec(any::<usize>(), 0..6)) {
        let mut wire = BytesMut::new();
        encode_head(&head, &mut wire).unwrap();
        wire.extend_from_slice(&body);
        let whole = decode(&wire).unwrap();
        prop_assert_eq!(&whole.0, &head);
        prop_assert_eq!(&whole.1, &body);
        let chunked = decode_chunked(&wire, &cuts).unwrap().unwrap();
        prop_assert_eq!(chunked, whole);
    }

    #[test]
    fn any_bytes_same_verdict_for_any_chunking(input in prop::collection::vec(
            prop::sample::select(b"Status: 20Loc/\r\n :xX\0\t".to_vec()), 0..60),
            cuts in prop::collection::vec(any::<usize>(), 0..6)) {
        let whole = {
            let mut buf = BytesMut::from(&input[..]);
            CgiResponseDecoder::new(&Limits::DEFAULT).decode(&mut buf).map(|h| h.map(|h| (h, buf.to_vec())))
        };
        prop_assert_eq!(decode_chunked(&input, &cuts), whole);
    }
}

/// A head parsed where it lies (`decode_bytes`) is the head `decode` makes of the same
/// bytes, with the same body left over; an incomplete one consumes nothing and the scan
/// goes on in a buffer that starts with the same bytes.
#[test]
fn a_head_parsed_in_place_matches_the_buffered_parse() {
    let inputs: [&[u8]; 4] = [
        b"Status: 404 Not Found\r\nContent-Type: text/plain\r\n\r\nbody",
        b"Content-Type: text/html\n\n",
        b"Location: /x\r\nX-A: 1\r\nX-A: 2\r\n\r\n<html>",
        b"X-Bad\x01: 1\r\n\r\n",
    ];
    for input in inputs {
        let mut bytes = Bytes::copy_from_slice(input);
        let in_place = CgiResponseDecoder::new(&Limits::DEFAULT).decode_bytes(&mut bytes);
        let buffered = decode(input);
        match (in_place, buffered) {
            (Ok(Some(a)), Ok((b, rest))) => {
                assert_eq!(a, b);
                assert_eq!(&bytes[..], &rest[..]);
            }
            (Err(a), Err(b)) => assert_eq!(a, b),
            (a, b) => panic!("{input:?}: {a:?} against {b:?}"),
        }
    }
    let whole = b"Content-Type: text/plain\r\nX-Long: 1\r\n\r\nrest";
    let mut decoder = CgiResponseDecoder::new(&Limits::DEFAULT);
    let mut first = Bytes::copy_from_slice(&whole[..30]);
    assert_eq!(decoder.decode_bytes(&mut first).unwrap(), None);
    assert_eq!(first.len(), 30, "nothing consumed");
    let mut buf = BytesMut::from(&first[..]);
    buf.extend_from_slice(&whole[30..]);
    let head = decoder.decode(&mut buf).unwrap().expect("the head");
    assert_eq!(head, decode(whole).unwrap().0);
    assert_eq!(&buf[..], b"rest");
}

/// The parser keeps the first header lines inline and the rest in a list: a head with more
/// lines than fit inline keeps every one, in order, and a decoder reused after it starts
/// from none.
#[test]
fn a_head_with_many_header_lines_keeps_them_all_in_order() {
    let mut text = String::from("Status: 201 Created\r\n");
    for i in 0..40 {
        text.push_str(&format!("X-Field-{i}: value {i}\r\n"));
    }
    text.push_str("\r\nbody");
    let mut decoder = CgiResponseDecoder::new(&Limits::DEFAULT);
    let mut buf = BytesMut::from(text.as_bytes());
    let head = decoder.decode(&mut buf).unwrap().expect("a complete head");
    assert_eq!(head.status().map(|s| s.code), Some(201));
    assert_eq!(head.headers().len(), 40);
    for (i, (name, value)) in head.headers().iter().enumerate() {
        assert_eq!(&name[..], format!("X-Field-{i}").as_bytes());
        assert_eq!(&value[..], format!("value {i}").as_bytes());
    }
    assert_eq!(&buf[..], b"body");
    let mut next = BytesMut::from(&b"A: 1\r\n\r\n"[..]);
    let head = decoder.decode(&mut next).unwrap().expect("the second head");
    assert_eq!(head.headers().len(), 1);
    assert_eq!(&head.headers()[0].0[..], b"A");
}
