#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing,
    missing_docs
)]
//! SCGI: the example request from the protocol document byte for byte, netstring and header
//! block rules with their errors, the responder's exchange, and round trip / chunking
//! properties.

use bytes::{Bytes, BytesMut};
use corral_protocols::scgi::{
    encode_netstring, encode_request_head, NetstringDecoder, ScgiError, ScgiRequestDecoder,
    ScgiRequestEvent, ScgiRequestHead,
};
use corral_protocols::Limits;
use proptest::prelude::*;

/// The request of the SCGI protocol document, section 3 ("What is the answer to life?").
const SPEC_REQUEST: &[u8] = b"70:\
CONTENT_LENGTH\x0027\x00\
SCGI\x001\x00\
REQUEST_METHOD\x00POST\x00\
REQUEST_URI\x00/deepthought\x00\
,\
What is the answer to life?";

fn b(s: &str) -> Bytes {
    Bytes::copy_from_slice(s.as_bytes())
}

/// Feeds `input` to a fresh responder decoder in pieces cut at `cuts`; returns the events with
/// adjacent body chunks merged, or the first error.
fn run(input: &[u8], cuts: &[usize], limits: &Limits) -> Result<Vec<ScgiRequestEvent>, ScgiError> {
    let mut decoder = ScgiRequestDecoder::new(limits);
    let mut points: Vec<usize> = cuts.iter().map(|c| c % (input.len() + 1)).collect();
    points.push(input.len());
    points.sort_unstable();
    let mut buf = BytesMut::new();
    let mut events: Vec<ScgiRequestEvent> = Vec::new();
    let mut start = 0;
    for end in points {
        buf.extend_from_slice(&input[start..end]);
        start = end;
        while let Some(event) = decoder.decode(&mut buf)? {
            match (events.last_mut(), event) {
                (Some(ScgiRequestEvent::Body(prev)), ScgiRequestEvent::Body(more)) => {
                    assert!(!more.is_empty(), "body chunks are never empty");
                    let mut joined = BytesMut::from(&prev[..]);
                    joined.extend_from_slice(&more);
                    *prev = joined.freeze();
                }
                (_, event) => events.push(event),
            }
        }
    }
    Ok(events)
}

fn run_whole(input: &[u8]) -> Result<Vec<ScgiRequestEvent>, ScgiError> {
    run(input, &[], &Limits::DEFAULT)
}

#[test]
fn spec_example_decodes() {
    let events = run_whole(SPEC_REQUEST).unwrap();
    assert_eq!(
        events,
        vec![
            ScgiRequestEvent::Head(ScgiRequestHead {
                content_length: 27,
                params: vec![
                    (b("REQUEST_METHOD"), b("POST")),
                    (b("REQUEST_URI"), b("/deepthought"))
                ],
            }),
            ScgiRequestEvent::Body(b("What is the answer to life?")),
            ScgiRequestEvent::End,
        ]
    );
}

#[test]
fn spec_example_encodes_byte_for_byte() {
    let mut out = BytesMut::new();
    let params = [("REQUEST_METHOD", "POST"), ("REQUEST_URI", "/deepthought")];
    encode_request_head(27, &params, &Limits::DEFAULT, &mut out).unwrap();
    out.extend_from_slice(b"What is the answer to life?");
    assert_eq!(&out[..], SPEC_REQUEST);
}

#[test]
fn body_arrives_in_pieces_without_waiting() {
    let mut decoder = ScgiRequestDecoder::new(&Limits::DEFAULT);
    let head_len = SPEC_REQUEST.len() - 27;
    let mut buf = BytesMut::from(&SPEC_REQUEST[..head_len + 4]);
    assert!(matches!(
        decoder.decode(&mut buf).unwrap(),
        Some(ScgiRequestEvent::Head(_))
    ));
    assert_eq!(
        decoder.decode(&mut buf).unwrap(),
        Some(ScgiRequestEvent::Body(b("What")))
    );
    assert_eq!(decoder.decode(&mut buf).unwrap(), None);
    buf.extend_from_slice(&SPEC_REQUEST[head_len + 4..]);
    assert_eq!(
        decoder.decode(&mut buf).unwrap(),
        Some(ScgiRequestEvent::Body(b(" is the answer to life?")))
    );
    assert!(!decoder.is_finished());
    assert_eq!(
        decoder.decode(&mut buf).unwrap(),
        Some(ScgiRequestEvent::End)
    );
    assert!(decoder.is_finished());
    assert_eq!(decoder.decode(&mut buf).unwrap(), None);
    buf.extend_from_slice(b"xy");
    assert_eq!(
        decoder.decode(&mut buf).unwrap_err(),
        ScgiError::BytesAfterBody
    );
}

#[test]
fn zero_length_body_ends_at_once() {
    // 24 = "CONTENT_LENGTH\0" (15) + "0\0" (2) + "SCGI\0" (5) + "1\0" (2)
    let input = b"24:CONTENT_LENGTH\x000\x00SCGI\x001\x00,";
    let events = run_whole(input).unwrap();
    assert_eq!(
        events,
        vec![
            ScgiRequestEvent::Head(ScgiRequestHead {
                content_length: 0,
                params: vec![]
            }),
            ScgiRequestEvent::End
        ]
    );
}

#[test]
fn netstring_vectors() {
    let ok = |input: &[u8], payload: &[u8], rest: &[u8]| {
        let mut buf = BytesMut::from(input);
        let got = NetstringDecoder::new(100)
            .decode(&mut buf)
            .unwrap()
            .unwrap();
        assert_eq!((&got[..], &buf[..]), (payload, rest));
    };
    ok(b"0:,", b"", b"");
    ok(b"3:abc,", b"abc", b"");
    ok(b"12:hello world!,tail", b"hello world!", b"tail");
    ok(b"3::,,,", b":,,", b"");
    // Incomplete input: nothing consumed, whatever the decoder has checked so far.
    for input in [&b""[..], b"1", b"10", b"3:", b"3:ab", b"3:abc", b"100:"] {
        let mut buf = BytesMut::from(input);
        assert_eq!(
            NetstringDecoder::new(100).decode(&mut buf).unwrap(),
            None,
            "{input:?}"
        );
        assert_eq!(&buf[..], input);
    }
}

#[test]
fn netstring_malformed() {
    let err = |max: usize, input: &[u8]| {
        NetstringDecoder::new(max)
            .decode(&mut BytesMut::from(input))
            .unwrap_err()
    };
    assert_eq!(err(100, b":abc,"), ScgiError::EmptyLength);
    assert_eq!(err(100, b"01:a,"), ScgiError::LeadingZero);
    assert_eq!(err(100, b"00:,"), ScgiError::LeadingZero);
    assert_eq!(
        err(100, b"3x:abc,"),
        ScgiError::InvalidLengthByte { byte: b'x' }
    );
    assert_eq!(
        err(100, b"-1:a,"),
        ScgiError::InvalidLengthByte { byte: b'-' }
    );
    assert_eq!(
        err(100, b" 3:abc,"),
        ScgiError::InvalidLengthByte { byte: b' ' }
    );
    assert_eq!(
        err(100, b"3 :abc,"),
        ScgiError::InvalidLengthByte { byte: b' ' }
    );
    assert_eq!(err(100, b"3:abcd"), ScgiError::MissingComma { found: b'd' });
    assert_eq!(err(100, b"0:;"), ScgiError::MissingComma { found: b';' });
    assert_eq!(err(10, b"11:"), ScgiError::LengthOverLimit { limit: 10 });
    // Overlong digits fail as soon as their value passes the limit, before any ':'.
    assert_eq!(
        err(65536, b"65537"),
        ScgiError::LengthOverLimit { limit: 65536 }
    );
    assert_eq!(
        err(usize::MAX, b"99999999999999999999999"),
        ScgiError::LengthOverLimit { limit: usize::MAX }
    );
    let mut buf = BytesMut::from(&b"10:0123456789,"[..]);
    assert_eq!(
        &NetstringDecoder::new(10).decode(&mut buf).unwrap().unwrap()[..],
        b"0123456789"
    );
}

#[test]
fn netstring_encoding() {
    let mut out = BytesMut::new();
    encode_netstring(b"hello world!", &mut out);
    encode_netstring(b"", &mut out);
    assert_eq!(&out[..], b"12:hello world!,0:,");
}

/// Wraps a hand-written header block in its netstring.
fn with_netstring(block: &[u8]) -> Vec<u8> {
    let mut v = format!("{}:", block.len()).into_bytes();
    v.extend_from_slice(block);
    v.push(b',');
    v
}

#[test]
fn header_block_malformed() {
    use ScgiError as E;
    let cases: &[(&[u8], E)] = &[
        (b"", E::ContentLengthNotFirst { found: vec![] }),
        (
            b"SCGI\x001\x00CONTENT_LENGTH\x000\x00",
            E::ContentLengthNotFirst {
                found: b"SCGI".to_vec(),
            },
        ),
        (
            b"CONTENT_LENGTH\x00x\x00SCGI\x001\x00",
            E::InvalidContentLength {
                value: b"x".to_vec(),
            },
        ),
        (
            b"CONTENT_LENGTH\x00\x00SCGI\x001\x00",
            E::InvalidContentLength { value: vec![] },
        ),
        (
            b"CONTENT_LENGTH\x00-1\x00SCGI\x001\x00",
            E::InvalidContentLength {
                value: b"-1".to_vec(),
            },
        ),
        (
            b"CONTENT_LENGTH\x00 1\x00SCGI\x001\x00",
            E::InvalidContentLength {
                value: b" 1".to_vec(),
            },
        ),
        (
            b"CONTENT_LENGTH\x0018446744073709551616\x00SCGI\x001\x00",
            E::InvalidContentLength {
                value: b"18446744073709551616".to_vec(),
            },
        ),
        (b"CONTENT_LENGTH\x000\x00", E::MissingScgi),
        (
            b"CONTENT_LENGTH\x000\x00SCGI\x002\x00",
            E::ScgiVersion {
                value: b"2".to_vec(),
            },
        ),
        (
            b"CONTENT_LENGTH\x000\x00SCGI\x00\x00",
            E::ScgiVersion { value: vec![] },
        ),
        (
            b"CONTENT_LENGTH\x000\x00SCGI\x001\x00SCGI\x001\x00",
            E::DuplicateName {
                name: b"SCGI".to_vec(),
            },
        ),
        (
            b"CONTENT_LENGTH\x000\x00SCGI\x001\x00CONTENT_LENGTH\x000\x00",
            E::DuplicateName {
                name: b"CONTENT_LENGTH".to_vec(),
            },
        ),
        (
            b"CONTENT_LENGTH\x000\x00SCGI\x001\x00A\x00x\x00A\x00y\x00",
            E::DuplicateName {
                name: b"A".to_vec(),
            },
        ),
        (
            b"CONTENT_LENGTH\x000\x00SCGI\x001\x00\x00x\x00",
            E::EmptyName,
        ),
        (b"CONTENT_LENGTH\x000\x00SCGI\x001\x00A", E::TruncatedPair),
        (
            b"CONTENT_LENGTH\x000\x00SCGI\x001\x00A\x00x",
            E::TruncatedPair,
        ),
        (b"CONTENT_LENGTH", E::TruncatedPair),
    ];
    for (block, expected) in cases {
        let got = run_whole(&with_netstring(block)).unwrap_err();
        assert_eq!(got, *expected, "{}", block.escape_ascii());
    }
    // Leading zeros in CONTENT_LENGTH are allowed: the spec asks only for digits.
    let events = run_whole(&with_netstring(b"CONTENT_LENGTH\x00007\x00SCGI\x001\x00")).unwrap();
    assert_eq!(
        events[0],
        ScgiRequestEvent::Head(ScgiRequestHead {
            content_length: 7,
            params: vec![]
        })
    );
}

#[test]
fn header_block_limits() {
    let block = b"CONTENT_LENGTH\x000\x00SCGI\x001\x00NAME\x00value\x00";
    let input = with_netstring(block);
    assert!(run_whole(&input).is_ok());
    let limit = |l: Limits| run(&input, &[], &l).unwrap_err();
    assert_eq!(
        limit(Limits {
            max_params_count: 2,
            ..Limits::DEFAULT
        }),
        ScgiError::TooManyParams { limit: 2 }
    );
    assert_eq!(
        limit(Limits {
            max_name_len: 13,
            ..Limits::DEFAULT
        }),
        ScgiError::NameTooLong {
            name: b"CONTENT_LENGTH".to_vec(),
            limit: 13
        }
    );
    assert_eq!(
        limit(Limits {
            max_value_len: 4,
            ..Limits::DEFAULT
        }),
        ScgiError::ValueTooLong {
            name: b"NAME".to_vec(),
            limit: 4
        }
    );
    let max_params_bytes = block.len() - 1;
    assert_eq!(
        limit(Limits {
            max_params_bytes,
            ..Limits::DEFAULT
        }),
        ScgiError::LengthOverLimit {
            limit: max_params_bytes
        }
    );
}

#[test]
fn encoder_refusals() {
    let enc = |params: &[(&str, &str)], limits: &Limits| {
        encode_request_head(0, params, limits, &mut BytesMut::new())
    };
    let d = Limits::DEFAULT;
    assert_eq!(enc(&[("", "x")], &d).unwrap_err(), ScgiError::EmptyName);
    assert_eq!(
        enc(&[("A\0B", "x")], &d).unwrap_err(),
        ScgiError::NulInParam {
            name: b"A\0B".to_vec()
        }
    );
    assert_eq!(
        enc(&[("A", "x\0")], &d).unwrap_err(),
        ScgiError::NulInParam {
            name: b"A".to_vec()
        }
    );
    assert_eq!(
        enc(&[("SCGI", "1")], &d).unwrap_err(),
        ScgiError::ReservedName {
            name: b"SCGI".to_vec()
        }
    );
    assert_eq!(
        enc(&[("CONTENT_LENGTH", "1")], &d).unwrap_err(),
        ScgiError::ReservedName {
            name: b"CONTENT_LENGTH".to_vec()
        }
    );
    assert_eq!(
        enc(&[("A", "1"), ("A", "2")], &d).unwrap_err(),
        ScgiError::DuplicateName {
            name: b"A".to_vec()
        }
    );
    let few = Limits {
        max_params_count: 2,
        ..d.clone()
    };
    assert_eq!(
        enc(&[("A", "1")], &few).unwrap_err(),
        ScgiError::TooManyParams { limit: 2 }
    );
    // "CONTENT_LENGTH\00\0" (17) + "SCGI\01\0" (7) + "A\01\0" (4) = 28 bytes.
    let tight = Limits {
        max_params_bytes: 27,
        ..d.clone()
    };
    assert_eq!(
        enc(&[("A", "1")], &tight).unwrap_err(),
        ScgiError::HeaderTooLarge { len: 28, limit: 27 }
    );
    assert!(enc(
        &[("A", "1")],
        &Limits {
            max_params_bytes: 28,
            ..d
        }
    )
    .is_ok());
}

fn arb_head() -> impl Strategy<Value = ScgiRequestHead> {
    let name =
        "[A-Z][A-Z_]{0,12}".prop_filter("reserved", |n| n != "SCGI" && n != "CONTENT_LENGTH");
    let value = prop::collection::vec(1u8..=255, 0..24);
    (0u64..64, prop::collection::btree_map(name, value, 0..10)).prop_map(
        |(content_length, params)| ScgiRequestHead {
            content_length,
            params: params
                .into_iter()
                .map(|(n, v)| (Bytes::from(n), Bytes::from(v)))
                .collect(),
        },
    )
}

proptest! {
    #[test]
    fn request_round_trip_with_any_chunking(head in arb_head(), seed in any::<u8>(),
                                            cuts in prop::collection::vec(any::<usize>(), 0..8)) {
        let body: Vec<u8> = (0..head.content_length).map(|i| seed.wrapping_add(i as u8)).collect();
        let mut wire = BytesMut::new();
        head.encode(&Limits::DEFAULT, &mut wire).unwrap();
        wire.extend_from_slice(&body);
        let mut expected = vec![ScgiRequestEvent::Head(head.clone())];
        if !body.is_empty() {
            expected.push(ScgiRequestEvent::Body(Bytes::from(body)));
        }
        expected.push(ScgiRequestEvent::End);
        prop_assert_eq!(run(&wire, &cuts, &Limits::DEFAULT).unwrap(), expected);
    }

    #[test]
    fn netstring_round_trip_with_any_chunking(payload in prop::collection::vec(any::<u8>(), 0..300),
                                              cuts in prop::collection::vec(any::<usize>(), 0..8)) {
        let mut wire = BytesMut::new();
        encode_netstring(&payload, &mut wire);
        wire.extend_from_slice(b"next");
        let mut points: Vec<usize> = cuts.iter().map(|c| c % (wire.len() + 1)).collect();
        points.push(wire.len());
        points.sort_unstable();
        let mut decoder = NetstringDecoder::new(300);
        let mut buf = BytesMut::new();
        let (mut start, mut got) = (0, None);
        for end in points {
            buf.extend_from_slice(&wire[start..end]);
            start = end;
            if got.is_none() {
                got = decoder.decode(&mut buf).unwrap();
            }
        }
        prop_assert_eq!(got.unwrap(), Bytes::from(payload));
        prop_assert_eq!(&buf[..], b"next");
    }

    #[test]
    fn any_bytes_same_verdict_for_any_chunking(input in prop::collection::vec(
            prop::sample::select(b"0129:,\0SCGI_CONTENT_LENGTHx".to_vec()), 0..80),
            cuts in prop::collection::vec(any::<usize>(), 0..8)) {
        prop_assert_eq!(run(&input, &[], &Limits::DEFAULT), run(&input, &cuts, &Limits::DEFAULT));
    }
}
