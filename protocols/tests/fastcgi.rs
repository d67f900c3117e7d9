#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing,
    missing_docs
)]
//! FastCGI 1.0 conformance: byte vectors written by hand from the specification for every
//! record type in both roles (valid and malformed, each malformed case naming its error), and
//! property tests for round trips and chunking invariance.

use bytes::{Bytes, BytesMut};
use corral_protocols::fastcgi::*;
use corral_protocols::Limits;
use proptest::prelude::*;

fn cat(parts: &[&[u8]]) -> Vec<u8> {
    parts.concat()
}

/// Feeds `bytes` to a decoder in pieces cut at `cuts` (positions taken modulo the length),
/// collecting every event; the first error ends the run.
fn feed<T>(
    bytes: &[u8],
    cuts: &[usize],
    mut step: impl FnMut(&mut BytesMut) -> Result<Option<T>, FastCgiError>,
) -> Result<Vec<T>, FastCgiError> {
    let mut points: Vec<usize> = cuts.iter().map(|c| c % (bytes.len() + 1)).collect();
    points.push(0);
    points.push(bytes.len());
    points.sort_unstable();
    let mut buf = BytesMut::new();
    let mut out = Vec::new();
    for pair in points.windows(2) {
        buf.extend_from_slice(&bytes[pair[0]..pair[1]]);
        while let Some(event) = step(&mut buf)? {
            out.push(event);
        }
    }
    assert!(buf.is_empty(), "{} bytes left undecoded", buf.len());
    Ok(out)
}

fn respond(bytes: &[u8], limits: &Limits) -> Result<Vec<RequestEvent>, FastCgiError> {
    let mut decoder = RequestDecoder::new(limits);
    let whole = feed(bytes, &[], |b| decoder.decode(b));
    // The same bytes one at a time must give the same answer.
    let mut decoder = RequestDecoder::new(limits);
    let cuts: Vec<usize> = (0..bytes.len()).collect();
    assert_eq!(whole, feed(bytes, &cuts, |b| decoder.decode(b)));
    whole
}

fn answer(bytes: &[u8], id: u16, keep: bool) -> Result<Vec<ResponseEvent>, FastCgiError> {
    let mut decoder = ResponseDecoder::new(id, keep, &Limits::DEFAULT);
    let whole = feed(bytes, &[], |b| decoder.decode(b));
    let mut decoder = ResponseDecoder::new(id, keep, &Limits::DEFAULT);
    let cuts: Vec<usize> = (0..bytes.len()).collect();
    assert_eq!(whole, feed(bytes, &cuts, |b| decoder.decode(b)));
    whole
}

fn b(s: &[u8]) -> Bytes {
    Bytes::copy_from_slice(s)
}

// ---- hand-written records (header: version, type, id B1 B0, length B1 B0, padding, reserved)

/// {FCGI_BEGIN_REQUEST, 1, {FCGI_RESPONDER, FCGI_KEEP_CONN}}
const BEGIN_1_RESPONDER_KEEP: &[u8] = &[
    1, 1, 0, 1, 0, 8, 0, 0, // version 1, BEGIN_REQUEST, id 1, 8 content bytes, no padding
    0, 1, 1, 0, 0, 0, 0, 0, // role 1 RESPONDER, flags KEEP_CONN, 5 reserved
];
/// {FCGI_PARAMS, 1, "SCRIPT_NAME" = "/i.php"}: 19 content bytes padded by 5.
fn params_1_script_name() -> Vec<u8> {
    cat(&[
        &[1, 4, 0, 1, 0, 19, 5, 0], // PARAMS, id 1, 19 content bytes, 5 padding
        &[11, 6],                   // name length 11, value length 6 (1-byte forms)
        b"SCRIPT_NAME",
        b"/i.php",
        &[0, 0, 0, 0, 0], // padding
    ])
}
/// {FCGI_PARAMS, 1, ""}: end of the PARAMS stream.
const PARAMS_1_END: &[u8] = &[1, 4, 0, 1, 0, 0, 0, 0];
/// {FCGI_STDIN, 1, "hello"}: 5 content bytes padded by 3.
const STDIN_1_HELLO: &[u8] = &[
    1, 5, 0, 1, 0, 5, 3, 0, b'h', b'e', b'l', b'l', b'o', 0, 0, 0,
];
/// {FCGI_STDIN, 1, ""}: end of the request body.
const STDIN_1_END: &[u8] = &[1, 5, 0, 1, 0, 0, 0, 0];
/// {FCGI_STDOUT, 1, "Status: 200\r\n\r\nhi!\n"}: 19 content bytes padded by 5.
fn stdout_1() -> Vec<u8> {
    cat(&[
        &[1, 6, 0, 1, 0, 19, 5, 0], // STDOUT, id 1, 19 content bytes, 5 padding
        b"Status: 200\r\n\r\nhi!\n",
        &[0, 0, 0, 0, 0], // padding
    ])
}
/// {FCGI_STDERR, 1, "oops"}: 4 content bytes padded by 4.
const STDERR_1: &[u8] = &[1, 7, 0, 1, 0, 4, 4, 0, b'o', b'o', b'p', b's', 0, 0, 0, 0];
const STDOUT_1_END: &[u8] = &[1, 6, 0, 1, 0, 0, 0, 0];
const STDERR_1_END: &[u8] = &[1, 7, 0, 1, 0, 0, 0, 0];
/// {FCGI_END_REQUEST, 1, {0, FCGI_REQUEST_COMPLETE}}
const END_1_COMPLETE: &[u8] = &[
    1, 3, 0, 1, 0, 8, 0, 0, // END_REQUEST, id 1, 8 content bytes
    0, 0, 0, 0, // appStatus 0
    0, 0, 0, 0, // protocolStatus REQUEST_COMPLETE, 3 reserved
];
/// {FCGI_GET_VALUES, 0, {FCGI_MAX_CONNS, FCGI_MAX_REQS, FCGI_MPXS_CONNS}} with empty values.
fn get_values() -> Vec<u8> {
    cat(&[
        &[1, 9, 0, 0, 0, 48, 0, 0], // GET_VALUES, id 0, 48 content bytes, no padding
        &[14, 0],                   // name length 14, value length 0
        b"FCGI_MAX_CONNS",
        &[13, 0],
        b"FCGI_MAX_REQS",
        &[15, 0],
        b"FCGI_MPXS_CONNS",
    ])
}
/// {FCGI_GET_VALUES_RESULT, 0, {MAX_CONNS=1, MAX_REQS=1, MPXS_CONNS=0}}: 51 bytes + 5 padding.
fn get_values_result() -> Vec<u8> {
    cat(&[
        &[1, 10, 0, 0, 0, 51, 5, 0], // GET_VALUES_RESULT, id 0, 51 content bytes, 5 padding
        &[14, 1],                    // name length 14, value length 1
        b"FCGI_MAX_CONNS1",
        &[13, 1],
        b"FCGI_MAX_REQS1",
        &[15, 1],
        b"FCGI_MPXS_CONNS0",
        &[0, 0, 0, 0, 0], // padding
    ])
}
/// {FCGI_UNKNOWN_TYPE, 0, {12}}
const UNKNOWN_TYPE_12: &[u8] = &[1, 11, 0, 0, 0, 8, 0, 0, 12, 0, 0, 0, 0, 0, 0, 0];

fn simple_request() -> Vec<u8> {
    cat(&[
        BEGIN_1_RESPONDER_KEEP,
        &params_1_script_name(),
        PARAMS_1_END,
        STDIN_1_HELLO,
        STDIN_1_END,
    ])
}

// ---- record layer

#[test]
fn record_header_fields_and_padding_are_read_from_the_spec_layout() {
    // STDIN, id 0x0102, 3 content bytes, 255 padding bytes (any padding is legal).
    let mut bytes = cat(&[&[1, 5, 1, 2, 0, 3, 255, 0], b"abc"]);
    bytes.extend_from_slice(&[0xAA; 255]);
    bytes.extend_from_slice(&[1, 5, 1, 2, 0, 0, 0, 0]);
    let mut decoder = RecordDecoder::new();
    let records = feed(&bytes, &[3, 9, 100], |b| decoder.decode(b)).unwrap();
    assert_eq!(
        records,
        vec![
            Record {
                kind: RecordType::Stdin,
                request_id: 0x0102,
                content: b(b"abc")
            },
            Record {
                kind: RecordType::Stdin,
                request_id: 0x0102,
                content: Bytes::new()
            },
        ]
    );
    let header = RecordHeader::decode([1, 5, 1, 2, 0, 3, 255, 0]).unwrap();
    assert_eq!(header.record_len(), 8 + 3 + 255);
    assert_eq!(
        RecordHeader::new(RecordType::Stdout, 1, 5).to_bytes(),
        [1, 6, 0, 1, 0, 5, 3, 0]
    );
    assert_eq!(
        (HEADER_LEN, MAX_CONTENT_LEN, STREAM_CHUNK_LEN),
        (8, 65535, 65528)
    );
}

#[test]
fn every_type_byte_maps_both_ways() {
    for byte in 0..=255u8 {
        assert_eq!(RecordType::from_u8(byte).as_u8(), byte);
    }
    assert_eq!(RecordType::from_u8(11), RecordType::UnknownType);
    assert_eq!(RecordType::from_u8(12), RecordType::Other(12));
    assert_eq!(RecordType::from_u8(0), RecordType::Other(0));
}

#[test]
fn record_version_and_reserved_byte_are_checked() {
    let mut decoder = RecordDecoder::new();
    for version in [0u8, 2, 255] {
        let mut src = BytesMut::from(&[version, 6, 0, 1, 0, 0, 0, 0][..]);
        assert_eq!(
            decoder.decode(&mut src),
            Err(FastCgiError::UnsupportedVersion { version })
        );
    }
    let mut src = BytesMut::from(&[1, 6, 0, 1, 0, 0, 0, 9][..]);
    assert_eq!(
        decoder.decode(&mut src),
        Err(FastCgiError::ReservedNotZero { value: 9 })
    );
}

#[test]
fn partial_record_waits_and_reserves_no_more_than_one_record() {
    // STDOUT claiming 65535 content bytes and 255 padding, only 10 bytes present.
    let mut src = BytesMut::from(&[1, 6, 0, 1, 0xff, 0xff, 0xff, 0, b'x', b'y'][..]);
    assert_eq!(RecordDecoder::new().decode(&mut src), Ok(None));
    assert_eq!(src.len(), 10, "nothing consumed while incomplete");
    assert!(src.capacity() >= MAX_RECORD_LEN && src.capacity() < 2 * MAX_RECORD_LEN);
}

#[test]
fn encoders_pad_to_eight_and_split_streams() {
    let mut dst = BytesMut::new();
    encode_stdin(1, b"hello", &mut dst);
    encode_stdin_end(1, &mut dst);
    assert_eq!(&dst[..], cat(&[STDIN_1_HELLO, STDIN_1_END]));

    let data: Vec<u8> = (0..200_000u32).map(|i| i as u8).collect();
    let mut dst = BytesMut::new();
    encode_stdout(3, &data, &mut dst);
    assert_eq!(dst.len(), stream_encoded_len(data.len()));
    let mut decoder = RecordDecoder::new();
    let mut joined = Vec::new();
    let mut offset = 0;
    while let Some(record) = decoder.decode(&mut dst).unwrap() {
        assert_eq!((record.kind, record.request_id), (RecordType::Stdout, 3));
        assert!(!record.content.is_empty() && record.content.len() <= MAX_CONTENT_LEN);
        offset += HEADER_LEN + record.content.len() + padding_for(record.content.len());
        assert_eq!(offset % 8, 0, "every record ends on an 8-byte boundary");
        joined.extend_from_slice(&record.content);
    }
    assert_eq!(joined, data);

    let mut dst = BytesMut::new();
    encode_stdout(1, b"", &mut dst);
    assert!(dst.is_empty(), "empty data must not end the stream");
    let too_big = vec![0u8; MAX_CONTENT_LEN + 1];
    assert_eq!(
        encode_record(RecordType::Stdout, 1, &too_big, &mut dst),
        Err(FastCgiError::ContentTooLong {
            kind: RecordType::Stdout,
            len: 65536
        })
    );
}

#[test]
fn discrete_record_encoders_match_the_spec_bytes() {
    let mut dst = BytesMut::new();
    encode_begin_request(1, Role::Responder, true, &mut dst);
    assert_eq!(&dst[..], BEGIN_1_RESPONDER_KEEP);

    let mut dst = BytesMut::new();
    encode_begin_request(0x0203, Role::Filter, false, &mut dst);
    assert_eq!(&dst[..], [1, 1, 2, 3, 0, 8, 0, 0, 0, 3, 0, 0, 0, 0, 0, 0]);

    let mut dst = BytesMut::new();
    encode_params(1, &[("SCRIPT_NAME", "/i.php")], &mut dst).unwrap();
    assert_eq!(&dst[..], cat(&[&params_1_script_name(), PARAMS_1_END]));

    let mut dst = BytesMut::new();
    encode_abort_request(1, &mut dst);
    assert_eq!(&dst[..], [1, 2, 0, 1, 0, 0, 0, 0]);

    let mut dst = BytesMut::new();
    encode_end_request(1, 0x0102_0304, ProtocolStatus::Overloaded, &mut dst);
    assert_eq!(&dst[..], [1, 3, 0, 1, 0, 8, 0, 0, 1, 2, 3, 4, 2, 0, 0, 0]);

    let mut dst = BytesMut::new();
    encode_request_complete(1, 0, &mut dst);
    assert_eq!(&dst[..], cat(&[STDOUT_1_END, END_1_COMPLETE]));

    let mut dst = BytesMut::new();
    encode_unknown_type(12, &mut dst);
    assert_eq!(&dst[..], UNKNOWN_TYPE_12);

    let mut dst = BytesMut::new();
    encode_get_values(&[MAX_CONNS, MAX_REQS, MPXS_CONNS], &mut dst).unwrap();
    assert_eq!(&dst[..], &get_values());

    let caps = Capabilities {
        max_conns: Some(1),
        max_reqs: Some(1),
        mpxs_conns: Some(false),
    };
    let mut dst = BytesMut::new();
    answer_get_values(
        &[MAX_CONNS, MAX_REQS, b"FCGI_NO_SUCH", MPXS_CONNS],
        &caps,
        &mut dst,
    )
    .unwrap();
    assert_eq!(&dst[..], &get_values_result(), "unknown names are omitted");

    let mut dst = BytesMut::new();
    encode_stderr(1, b"oops", &mut dst);
    encode_stderr_end(1, &mut dst);
    assert_eq!(&dst[..], cat(&[STDERR_1, STDERR_1_END]));
}

// ---- name-value pairs

#[test]
fn four_byte_lengths_are_used_above_127_and_decoded() {
    // name "X" (1-byte length 1), value of 200 'v' (4-byte length 0x800000C8).
    let mut record = cat(&[&[1, 4, 0, 1, 0, 206, 2, 0], &[1, 0x80, 0, 0, 200], b"X"]);
    record.extend_from_slice(&[b'v'; 200]);
    record.extend_from_slice(&[0, 0]); // padding to 216
    let mut dst = BytesMut::new();
    encode_params(1, &[(&b"X"[..], &[b'v'; 200][..])], &mut dst).unwrap();
    assert_eq!(&dst[..], cat(&[&record, PARAMS_1_END]));

    // name of 128 'N' (4-byte length 0x80000080), value "1"; exactly 127 stays 1-byte.
    let mut block = vec![0x80, 0, 0, 128, 1];
    block.extend_from_slice(&[b'N'; 128]);
    block.push(b'1');
    block.extend_from_slice(&[127, 0]);
    block.extend_from_slice(&[b'M'; 127]);
    let pairs = ParamsDecoder::decode_block(Bytes::from(block.clone()), &Limits::DEFAULT).unwrap();
    assert_eq!(
        pairs,
        vec![(b(&[b'N'; 128]), b(b"1")), (b(&[b'M'; 127]), Bytes::new())]
    );
    assert_eq!(
        encoded_pair_len(128, 1) + encoded_pair_len(127, 0),
        block.len()
    );
}

#[test]
fn a_pair_split_across_params_records_is_reassembled() {
    let bytes = cat(&[
        BEGIN_1_RESPONDER_KEEP,
        &[1, 4, 0, 1, 0, 4, 4, 0, 4, 3, b'N', b'A', 0, 0, 0, 0], // lengths 4, 3 then "NA"
        &[1, 4, 0, 1, 0, 3, 5, 0, b'M', b'E', b'v', 0, 0, 0, 0, 0], // "ME" "v"
        &[1, 4, 0, 1, 0, 3, 5, 0, b'a', b'l', 0x80, 0, 0, 0, 0, 0], // "al", 1st byte of 4-byte len
        &[1, 4, 0, 1, 0, 4, 4, 0, 0, 0, 1, 0, 0, 0, 0, 0], // rest of name length 1, value len 0
        &[1, 4, 0, 1, 0, 1, 7, 0, b'Z', 0, 0, 0, 0, 0, 0, 0], // name "Z"
        PARAMS_1_END,
    ]);
    let events = respond(&bytes, &Limits::DEFAULT).unwrap();
    assert_eq!(
        events[1],
        RequestEvent::Params {
            request_id: 1,
            params: vec![(b(b"NAME"), b(b"val")), (b(b"Z"), Bytes::new())]
        }
    );
}

#[test]
fn params_encoder_keeps_pairs_whole_unless_longer_than_a_record() {
    // 40 pairs of ~2 KiB: each PARAMS record must parse on its own (as php-cgi requires).
    let pairs: Vec<(String, String)> = (0..40)
        .map(|i| (format!("HTTP_X_{i}"), "y".repeat(2000 + i)))
        .collect();
    let mut dst = BytesMut::new();
    encode_params(7, &pairs, &mut dst).unwrap();
    let mut decoder = RecordDecoder::new();
    let mut seen = Vec::new();
    let mut records = 0;
    while let Some(record) = decoder.decode(&mut dst).unwrap() {
        assert!(record.content.len() <= STREAM_CHUNK_LEN);
        seen.extend(ParamsDecoder::decode_block(record.content, &Limits::DEFAULT).unwrap());
        records += 1;
    }
    assert_eq!(records, 3, "two data records and the end record");
    assert_eq!(seen.len(), 40);

    // One value longer than a record has to be split; limits raised to accept it.
    let limits = Limits {
        max_value_len: 100_000,
        max_params_bytes: 200_000,
        ..Limits::DEFAULT
    };
    let big = vec![b'z'; 70_000];
    let mut dst = BytesMut::new();
    encode_params(1, &[(&b"A"[..], &b"1"[..]), (b"BIG", &big[..])], &mut dst).unwrap();
    let bytes = cat(&[BEGIN_1_RESPONDER_KEEP, &dst]);
    let events = respond(&bytes, &limits).unwrap();
    assert_eq!(
        events[1],
        RequestEvent::Params {
            request_id: 1,
            params: vec![(b(b"A"), b(b"1")), (b(b"BIG"), Bytes::from(big))]
        }
    );
}

fn with_params(body: &[u8]) -> Vec<u8> {
    let mut dst = BytesMut::from(BEGIN_1_RESPONDER_KEEP);
    encode_record(RecordType::Params, 1, body, &mut dst).unwrap();
    encode_stream_end(RecordType::Params, 1, &mut dst);
    dst.to_vec()
}

#[test]
fn name_value_overruns_and_limits_are_refused() {
    // Lengths say 5 + 9 bytes but the stream ends after 3.
    assert_eq!(
        respond(&with_params(&[5, 9, b'a', b'b', b'c']), &Limits::DEFAULT),
        Err(FastCgiError::TruncatedPair { missing: 11 })
    );
    // The stream ends inside a 4-byte length.
    assert_eq!(
        respond(&with_params(&[0x80, 0]), &Limits::DEFAULT),
        Err(FastCgiError::TruncatedPair { missing: 1 })
    );
    let small = Limits {
        max_name_len: 4,
        max_value_len: 8,
        max_params_count: 2,
        ..Limits::DEFAULT
    };
    // A name length of 0x7fffffff is refused from its prefix alone, before any buffering.
    assert_eq!(
        respond(&with_params(&[0xff, 0xff, 0xff, 0xff, 0]), &small),
        Err(FastCgiError::NameTooLong {
            len: 0x7fff_ffff,
            limit: 4
        })
    );
    assert_eq!(
        respond(&with_params(&[1, 9, b'n']), &small),
        Err(FastCgiError::ValueTooLong { len: 9, limit: 8 })
    );
    assert_eq!(
        respond(&with_params(&[1, 0, b'a', 1, 0, b'b', 1, 0, b'c']), &small),
        Err(FastCgiError::TooManyParams { limit: 2 })
    );
    let tight = Limits {
        max_params_bytes: 10,
        ..Limits::DEFAULT
    };
    assert_eq!(
        respond(&with_params(&[1, 9, b'n', 1, 2, 3, 4, 5, 6, 7, 8]), &tight),
        Err(FastCgiError::ParamsTooLarge { len: 11, limit: 10 })
    );
    // GET_VALUES is bounded and checked the same way.
    assert_eq!(
        respond(
            &[1, 9, 0, 0, 0, 2, 6, 0, 5, 0, 0, 0, 0, 0, 0, 0],
            &Limits::DEFAULT
        ),
        Err(FastCgiError::TruncatedPair { missing: 5 })
    );
}

// ---- responder role

#[test]
fn responder_decodes_a_simple_request() {
    assert_eq!(
        respond(&simple_request(), &Limits::DEFAULT).unwrap(),
        vec![
            RequestEvent::Begin {
                request_id: 1,
                role: Role::Responder,
                keep_conn: true
            },
            RequestEvent::Params {
                request_id: 1,
                params: vec![(b(b"SCRIPT_NAME"), b(b"/i.php"))]
            },
            RequestEvent::Stdin {
                request_id: 1,
                data: b(b"hello")
            },
            RequestEvent::StdinEnd { request_id: 1 },
        ]
    );
}

#[test]
fn responder_decodes_authorizer_filter_abort_and_management() {
    let bytes = cat(&[
        &[1, 1, 0, 2, 0, 8, 0, 0, 0, 2, 0, 0, 0, 0, 0, 0], // BEGIN id 2 AUTHORIZER, no keep
        &[1, 4, 0, 2, 0, 0, 0, 0],                         // PARAMS end, id 2
        &[1, 1, 0, 3, 0, 8, 0, 0, 0, 3, 1, 0, 0, 0, 0, 0], // BEGIN id 3 FILTER, keep
        &[1, 4, 0, 3, 0, 0, 0, 0],                         // PARAMS end, id 3
        &[1, 5, 0, 3, 0, 0, 0, 0],                         // STDIN end, id 3
        &[1, 8, 0, 3, 0, 3, 5, 0, b'a', b'b', b'c', 0, 0, 0, 0, 0], // DATA "abc", id 3
        &[1, 8, 0, 3, 0, 0, 0, 0],                         // DATA end, id 3
        &[1, 2, 0, 2, 0, 0, 0, 0],                         // ABORT id 2
        &get_values(),
        &[1, 12, 0, 0, 0, 3, 5, 0, 9, 9, 9, 0, 0, 0, 0, 0], // management type 12
        &[1, 200, 0, 3, 0, 0, 0, 0],                        // type 200 on active id 3
        &[1, 200, 0, 9, 0, 0, 0, 0],                        // type 200 on inactive id 9: ignored
    ]);
    assert_eq!(
        respond(&bytes, &Limits::DEFAULT).unwrap(),
        vec![
            RequestEvent::Begin {
                request_id: 2,
                role: Role::Authorizer,
                keep_conn: false
            },
            RequestEvent::Params {
                request_id: 2,
                params: vec![]
            },
            RequestEvent::Begin {
                request_id: 3,
                role: Role::Filter,
                keep_conn: true
            },
            RequestEvent::Params {
                request_id: 3,
                params: vec![]
            },
            RequestEvent::StdinEnd { request_id: 3 },
            RequestEvent::Data {
                request_id: 3,
                data: b(b"abc")
            },
            RequestEvent::DataEnd { request_id: 3 },
            RequestEvent::Abort { request_id: 2 },
            RequestEvent::GetValues {
                names: vec![b(MAX_CONNS), b(MAX_REQS), b(MPXS_CONNS)]
            },
            RequestEvent::UnknownType { kind: 12 },
            RequestEvent::UnknownType { kind: 200 },
        ]
    );
}

#[test]
fn records_for_inactive_ids_are_ignored_and_finish_deactivates() {
    let limits = Limits::DEFAULT;
    let mut decoder = RequestDecoder::new(&limits);
    let mut src = BytesMut::from(&simple_request()[..]);
    // Records for id 7, which never began, are consumed silently.
    src.extend_from_slice(&[1, 5, 0, 7, 0, 1, 7, 0, b'x', 0, 0, 0, 0, 0, 0, 0]);
    src.extend_from_slice(&[1, 2, 0, 7, 0, 0, 0, 0]);
    let events = feed(&src.split().freeze(), &[], |b| decoder.decode(b)).unwrap();
    assert_eq!(events.len(), 4);
    assert!(decoder.is_active(1));
    assert!(decoder.finish(1));
    assert!(!decoder.finish(1));
    assert_eq!(decoder.active_count(), 0);
    // Late STDIN for the finished id is ignored; a new BEGIN for it is accepted.
    let more = cat(&[STDIN_1_HELLO, BEGIN_1_RESPONDER_KEEP]);
    let events = feed(&more, &[], |b| decoder.decode(b)).unwrap();
    assert_eq!(
        events,
        vec![RequestEvent::Begin {
            request_id: 1,
            role: Role::Responder,
            keep_conn: true
        }]
    );
}

#[test]
fn too_many_concurrent_ids_and_unknown_roles_are_rejected() {
    let begin = |id: u8, role: u8| [1, 1, 0, id, 0, 8, 0, 0, 0, role, 1, 0, 0, 0, 0, 0];
    let one = Limits {
        max_concurrent_requests: 1,
        ..Limits::DEFAULT
    };
    let bytes = cat(&[
        &begin(1, 1),
        &begin(2, 1),
        &[1, 4, 0, 2, 0, 0, 0, 0],
        &begin(3, 9),
    ]);
    assert_eq!(
        respond(&bytes, &one).unwrap(),
        vec![
            RequestEvent::Begin {
                request_id: 1,
                role: Role::Responder,
                keep_conn: true
            },
            RequestEvent::Rejected {
                request_id: 2,
                keep_conn: true,
                status: ProtocolStatus::CantMpxConn
            },
            RequestEvent::Rejected {
                request_id: 3,
                keep_conn: true,
                status: ProtocolStatus::UnknownRole
            },
        ]
    );
    let two = Limits {
        max_concurrent_requests: 2,
        ..Limits::DEFAULT
    };
    let bytes = cat(&[&begin(1, 1), &begin(2, 2), &begin(3, 3)]);
    assert_eq!(
        respond(&bytes, &two).unwrap()[2],
        RequestEvent::Rejected {
            request_id: 3,
            keep_conn: true,
            status: ProtocolStatus::Overloaded
        }
    );
}

#[test]
fn responder_refuses_broken_streams() {
    let d = &Limits::DEFAULT;
    let err = |bytes: Vec<u8>| respond(&bytes, d).unwrap_err();
    assert_eq!(
        err(cat(&[BEGIN_1_RESPONDER_KEEP, BEGIN_1_RESPONDER_KEEP])),
        FastCgiError::RequestAlreadyActive { request_id: 1 }
    );
    assert_eq!(
        err(cat(&[
            BEGIN_1_RESPONDER_KEEP,
            PARAMS_1_END,
            &params_1_script_name()
        ])),
        FastCgiError::StreamAfterEnd {
            kind: RecordType::Params,
            request_id: 1
        }
    );
    assert_eq!(
        err(cat(&[&simple_request(), STDIN_1_HELLO])),
        FastCgiError::StreamAfterEnd {
            kind: RecordType::Stdin,
            request_id: 1
        }
    );
    assert_eq!(
        err(cat(&[BEGIN_1_RESPONDER_KEEP, STDIN_1_HELLO])),
        FastCgiError::StreamBeforeParams {
            kind: RecordType::Stdin,
            request_id: 1
        }
    );
    assert_eq!(
        err(cat(&[
            BEGIN_1_RESPONDER_KEEP,
            PARAMS_1_END,
            &[1, 8, 0, 1, 0, 0, 0, 0]
        ])),
        FastCgiError::DataWithoutFilterRole {
            request_id: 1,
            role: Role::Responder
        }
    );
    let filter = [1, 1, 0, 1, 0, 8, 0, 0, 0, 3, 0, 0, 0, 0, 0, 0];
    let data_end = [1, 8, 0, 1, 0, 0, 0, 0];
    assert_eq!(
        err(cat(&[&filter, PARAMS_1_END, &data_end, &data_end])),
        FastCgiError::StreamAfterEnd {
            kind: RecordType::Data,
            request_id: 1
        }
    );
    // BEGIN_REQUEST with 9 content bytes (and 7 padding).
    assert_eq!(
        err(vec![
            1, 1, 0, 1, 0, 9, 7, 0, 0, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0
        ]),
        FastCgiError::BodyLength {
            kind: RecordType::BeginRequest,
            len: 9,
            expected: 8
        }
    );
    assert_eq!(
        err(cat(&[
            BEGIN_1_RESPONDER_KEEP,
            &[1, 2, 0, 1, 0, 1, 7, 0, 0, 0, 0, 0, 0, 0, 0, 0]
        ])),
        FastCgiError::BodyLength {
            kind: RecordType::AbortRequest,
            len: 1,
            expected: 0
        }
    );
    assert_eq!(
        err(vec![1, 1, 0, 0, 0, 8, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0]),
        FastCgiError::NullRequestId {
            kind: RecordType::BeginRequest
        }
    );
    assert_eq!(
        err(vec![1, 9, 0, 1, 0, 0, 0, 0]),
        FastCgiError::ManagementRequestId {
            kind: RecordType::GetValues,
            request_id: 1
        }
    );
    assert_eq!(
        err(stdout_1()),
        FastCgiError::WrongDirection {
            kind: RecordType::Stdout,
            sender: Side::WebServer
        }
    );
    assert_eq!(
        err(cat(&[&[2], &BEGIN_1_RESPONDER_KEEP[1..]])),
        FastCgiError::UnsupportedVersion { version: 2 }
    );
}

// ---- client role

#[test]
fn client_decodes_a_backend_answer() {
    let bytes = cat(&[
        &stdout_1(),
        STDERR_1,
        STDOUT_1_END,
        STDERR_1_END,
        END_1_COMPLETE,
    ]);
    assert_eq!(
        answer(&bytes, 1, false).unwrap(),
        vec![
            ResponseEvent::Stdout(b(b"Status: 200\r\n\r\nhi!\n")),
            ResponseEvent::Stderr(b(b"oops")),
            ResponseEvent::StdoutEnd,
            ResponseEvent::StderrEnd,
            ResponseEvent::End {
                app_status: 0,
                protocol_status: ProtocolStatus::RequestComplete
            },
        ]
    );
    let statuses = [
        (0, ProtocolStatus::RequestComplete),
        (1, ProtocolStatus::CantMpxConn),
        (2, ProtocolStatus::Overloaded),
        (3, ProtocolStatus::UnknownRole),
    ];
    for (byte, status) in statuses {
        let end = [1, 3, 0, 1, 0, 8, 0, 0, 0xff, 0, 0, 1, byte, 0, 0, 0];
        assert_eq!(
            answer(&end, 1, true).unwrap(),
            vec![ResponseEvent::End {
                app_status: 0xff00_0001,
                protocol_status: status
            }]
        );
    }
}

/// The records a decoder reads where they lie (an empty stream end, END_REQUEST) still take
/// their padding with them, whole or a byte at a time, and the next record starts after it.
#[test]
fn client_records_read_in_place_take_their_padding() {
    let stdout_end_padded = [1, 6, 0, 1, 0, 0, 3, 0, 0xaa, 0xbb, 0xcc];
    let end_padded = [
        1, 3, 0, 1, 0, 8, 8, 0, 0, 0, 0, 7, 0, 0, 0, 0, 9, 9, 9, 9, 9, 9, 9, 9,
    ];
    let bytes = cat(&[&stdout_1(), &stdout_end_padded, &end_padded]);
    assert_eq!(
        answer(&bytes, 1, true).unwrap(),
        vec![
            ResponseEvent::Stdout(b(b"Status: 200\r\n\r\nhi!\n")),
            ResponseEvent::StdoutEnd,
            ResponseEvent::End {
                app_status: 7,
                protocol_status: ProtocolStatus::RequestComplete
            },
        ]
    );
}

#[test]
fn client_reports_management_records() {
    let bytes = cat(&[&get_values_result(), UNKNOWN_TYPE_12]);
    let events = answer(&bytes, 1, true).unwrap();
    let ResponseEvent::GetValuesResult(pairs) = &events[0] else {
        panic!("{events:?}")
    };
    assert_eq!(
        Capabilities::from_pairs(pairs),
        Capabilities {
            max_conns: Some(1),
            max_reqs: Some(1),
            mpxs_conns: Some(false)
        }
    );
    assert_eq!(events[1], ResponseEvent::UnknownType { kind: 12 });
}

#[test]
fn client_connection_reuse_follows_keep_conn() {
    let limits = Limits::DEFAULT;
    let mut decoder = ResponseDecoder::new(1, true, &limits);
    assert_eq!(
        decoder.reuse(1, true),
        Err(FastCgiError::NotReusable { request_id: 1 })
    );
    let mut src = BytesMut::from(&cat(&[STDOUT_1_END, END_1_COMPLETE])[..]);
    decoder.decode(&mut src).unwrap();
    assert!(!decoder.is_ended());
    decoder.decode(&mut src).unwrap();
    assert!(decoder.is_ended() && decoder.is_reusable());
    // Management records are still fine between requests; application records are not.
    let mut src = BytesMut::from(UNKNOWN_TYPE_12);
    assert!(decoder.decode(&mut src).unwrap().is_some());
    let mut src = BytesMut::from(&stdout_1()[..]);
    assert_eq!(
        decoder.decode(&mut src),
        Err(FastCgiError::RecordAfterEnd {
            kind: RecordType::Stdout,
            request_id: 1
        })
    );
    decoder.reuse(1, false).unwrap();
    let mut src = BytesMut::from(&stdout_1()[..]);
    assert!(matches!(
        decoder.decode(&mut src),
        Ok(Some(ResponseEvent::Stdout(_)))
    ));
    let mut src = BytesMut::from(END_1_COMPLETE);
    decoder.decode(&mut src).unwrap();
    assert!(decoder.is_ended() && !decoder.is_reusable());
    assert_eq!(
        decoder.reuse(2, true),
        Err(FastCgiError::NotReusable { request_id: 2 })
    );
}

#[test]
fn client_refuses_what_a_responder_must_not_send() {
    let err = |bytes: Vec<u8>| answer(&bytes, 1, true).unwrap_err();
    assert_eq!(
        err(cat(&[&[1, 6, 0, 2], &stdout_1()[4..]])), // STDOUT_1 with request id 2
        FastCgiError::WrongRequestId {
            kind: RecordType::Stdout,
            expected: 1,
            got: 2
        }
    );
    assert_eq!(
        err(STDIN_1_HELLO.to_vec()),
        FastCgiError::WrongDirection {
            kind: RecordType::Stdin,
            sender: Side::Application
        }
    );
    assert_eq!(
        err(BEGIN_1_RESPONDER_KEEP.to_vec()),
        FastCgiError::WrongDirection {
            kind: RecordType::BeginRequest,
            sender: Side::Application
        }
    );
    assert_eq!(
        err(vec![1, 12, 0, 1, 0, 0, 0, 0]),
        FastCgiError::UnknownRecordType { kind: 12 }
    );
    assert_eq!(
        err(vec![1, 6, 0, 0, 0, 0, 0, 0]),
        FastCgiError::NullRequestId {
            kind: RecordType::Stdout
        }
    );
    assert_eq!(
        err(vec![1, 10, 0, 1, 0, 0, 0, 0]),
        FastCgiError::ManagementRequestId {
            kind: RecordType::GetValuesResult,
            request_id: 1
        }
    );
    assert_eq!(
        err(cat(&[STDOUT_1_END, &stdout_1()])),
        FastCgiError::StreamAfterEnd {
            kind: RecordType::Stdout,
            request_id: 1
        }
    );
    assert_eq!(
        err(cat(&[STDERR_1_END, STDERR_1])),
        FastCgiError::StreamAfterEnd {
            kind: RecordType::Stderr,
            request_id: 1
        }
    );
    assert_eq!(
        err(cat(&[END_1_COMPLETE, STDOUT_1_END])),
        FastCgiError::RecordAfterEnd {
            kind: RecordType::Stdout,
            request_id: 1
        }
    );
    assert_eq!(
        err(vec![1, 3, 0, 1, 0, 8, 0, 0, 0, 0, 0, 0, 4, 0, 0, 0]),
        FastCgiError::UnknownProtocolStatus { status: 4 }
    );
    assert_eq!(
        err(vec![1, 3, 0, 1, 0, 4, 4, 0, 0, 0, 0, 0, 0, 0, 0, 0]),
        FastCgiError::BodyLength {
            kind: RecordType::EndRequest,
            len: 4,
            expected: 8
        }
    );
    assert_eq!(
        err(vec![1, 11, 0, 0, 0, 1, 7, 0, 12, 0, 0, 0, 0, 0, 0, 0]),
        FastCgiError::BodyLength {
            kind: RecordType::UnknownType,
            len: 1,
            expected: 8
        }
    );
    assert_eq!(
        err(cat(&[&[0], &stdout_1()[1..]])),
        FastCgiError::UnsupportedVersion { version: 0 }
    );
}

// ---- properties

/// Limits wide enough for the generated names and values.
fn roomy() -> Limits {
    Limits {
        max_params_bytes: 1 << 20,
        max_name_len: 4096,
        ..Limits::DEFAULT
    }
}

fn bytes_up_to(max: usize) -> impl Strategy<Value = Vec<u8>> {
    prop::collection::vec(any::<u8>(), 0..max)
}

/// Field lengths around the 1-byte/4-byte boundary, occasionally long.
fn field() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![bytes_up_to(4), bytes_up_to(200), bytes_up_to(3000)]
}

#[derive(Debug, Clone)]
struct Req {
    role: Role,
    keep_conn: bool,
    params: Vec<(Vec<u8>, Vec<u8>)>,
    stdin: Vec<Vec<u8>>,
    data: Vec<Vec<u8>>,
    abort: bool,
}

fn req() -> impl Strategy<Value = Req> {
    (
        prop_oneof![
            Just(Role::Responder),
            Just(Role::Authorizer),
            Just(Role::Filter)
        ],
        any::<bool>(),
        prop::collection::vec((field(), field()), 0..12),
        prop::collection::vec(prop::collection::vec(any::<u8>(), 1..300), 0..4),
        prop::collection::vec(prop::collection::vec(any::<u8>(), 1..300), 0..3),
        any::<bool>(),
    )
        .prop_map(|(role, keep_conn, params, stdin, data, abort)| Req {
            role,
            keep_conn,
            params,
            stdin,
            data: if role == Role::Filter { data } else { vec![] },
            abort,
        })
}

/// One request's wire units (each unit a whole number of records, all for that request).
fn units(id: u16, r: &Req) -> Vec<Vec<u8>> {
    let unit = |f: &dyn Fn(&mut BytesMut)| {
        let mut dst = BytesMut::new();
        f(&mut dst);
        dst.to_vec()
    };
    let mut out = vec![unit(&|d| encode_begin_request(id, r.role, r.keep_conn, d))];
    out.push(unit(&|d| encode_params(id, &r.params, d).unwrap()));
    out.extend(r.stdin.iter().map(|c| unit(&|d| encode_stdin(id, c, d))));
    out.push(unit(&|d| encode_stdin_end(id, d)));
    if r.role == Role::Filter {
        out.extend(r.data.iter().map(|c| unit(&|d| encode_data(id, c, d))));
        out.push(unit(&|d| encode_data_end(id, d)));
    }
    if r.abort {
        out.push(unit(&|d| encode_abort_request(id, d)));
    }
    out
}

/// Folds events back into requests, checking each request's events come in protocol order.
fn fold(events: &[RequestEvent], n: usize) -> (Vec<Req>, usize) {
    let mut reqs: Vec<Option<Req>> = vec![None; n];
    let mut stdin_done = vec![false; n];
    let mut get_values = 0;
    for event in events {
        let slot = |id: u16| id as usize - 1;
        match event.clone() {
            RequestEvent::Begin {
                request_id,
                role,
                keep_conn,
            } => {
                assert!(reqs[slot(request_id)].is_none());
                reqs[slot(request_id)] = Some(Req {
                    role,
                    keep_conn,
                    params: vec![],
                    stdin: vec![],
                    data: vec![],
                    abort: false,
                });
            }
            RequestEvent::Params { request_id, params } => {
                reqs[slot(request_id)].as_mut().unwrap().params = params
                    .into_iter()
                    .map(|(k, v)| (k.to_vec(), v.to_vec()))
                    .collect();
            }
            RequestEvent::Stdin { request_id, data } => {
                assert!(!stdin_done[slot(request_id)]);
                reqs[slot(request_id)]
                    .as_mut()
                    .unwrap()
                    .stdin
                    .push(data.to_vec());
            }
            RequestEvent::StdinEnd { request_id } => stdin_done[slot(request_id)] = true,
            RequestEvent::Data { request_id, data } => {
                reqs[slot(request_id)]
                    .as_mut()
                    .unwrap()
                    .data
                    .push(data.to_vec());
            }
            RequestEvent::DataEnd { .. } => {}
            RequestEvent::Abort { request_id } => {
                reqs[slot(request_id)].as_mut().unwrap().abort = true;
            }
            RequestEvent::GetValues { names } => {
                assert_eq!(names, vec![b(MAX_CONNS), b(MPXS_CONNS)]);
                get_values += 1;
            }
            other => panic!("unexpected {other:?}"),
        }
    }
    (reqs.into_iter().map(Option::unwrap).collect(), get_values)
}

fn same_req(a: &Req, b: &Req) -> bool {
    (
        a.role,
        a.keep_conn,
        &a.params,
        a.stdin.concat(),
        a.data.concat(),
        a.abort,
    ) == (
        b.role,
        b.keep_conn,
        &b.params,
        b.stdin.concat(),
        b.data.concat(),
        b.abort,
    )
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 200, ..ProptestConfig::default() })]

    #[test]
    fn responder_round_trip_interleaved_and_chunked(
        reqs in prop::collection::vec(req(), 1..5),
        schedule in prop::collection::vec(0usize..6, 0..80),
        cuts in prop::collection::vec(any::<usize>(), 0..40),
    ) {
        // Interleave whole units of different requests (multiplexing), plus GET_VALUES units.
        let mut queues: Vec<std::collections::VecDeque<Vec<u8>>> =
            reqs.iter().enumerate().map(|(i, r)| units(i as u16 + 1, r).into()).collect();
        let mut mgmt = BytesMut::new();
        encode_get_values(&[MAX_CONNS, MPXS_CONNS], &mut mgmt).unwrap();
        let mut wire = Vec::new();
        let mut mgmt_sent = 0;
        for pick in schedule {
            match queues.get_mut(pick) {
                Some(q) => wire.extend(q.pop_front().unwrap_or_default()),
                None => { wire.extend_from_slice(&mgmt); mgmt_sent += 1; }
            }
        }
        for q in &mut queues { wire.extend(q.drain(..).flatten()); }

        let limits = roomy();
        let mut whole = RequestDecoder::new(&limits);
        let expected = feed(&wire, &[], |b| whole.decode(b)).unwrap();
        let mut chunked = RequestDecoder::new(&limits);
        prop_assert_eq!(&expected, &feed(&wire, &cuts, |b| chunked.decode(b)).unwrap());
        let (decoded, get_values) = fold(&expected, reqs.len());
        prop_assert_eq!(get_values, mgmt_sent);
        for (got, want) in decoded.iter().zip(&reqs) {
            prop_assert!(same_req(got, want), "{:?} != {:?}", got, want);
        }
        prop_assert_eq!(whole.active_count(), reqs.len());
    }

    #[test]
    fn params_split_at_any_record_boundary_decode_the_same(
        pairs in prop::collection::vec((field(), field()), 0..10),
        splits in prop::collection::vec(any::<usize>(), 0..10),
        cuts in prop::collection::vec(any::<usize>(), 0..10),
    ) {
        let mut body = BytesMut::new();
        for (name, value) in &pairs { encode_pair(name, value, &mut body).unwrap(); }
        let mut points: Vec<usize> = splits.iter().map(|s| s % (body.len() + 1)).collect();
        points.extend([0, body.len()]);
        points.sort_unstable();
        points.dedup();
        let mut wire = BytesMut::from(BEGIN_1_RESPONDER_KEEP);
        for w in points.windows(2) {
            encode_record(RecordType::Params, 1, &body[w[0]..w[1]], &mut wire).unwrap();
        }
        encode_stream_end(RecordType::Params, 1, &mut wire);
        let mut decoder = RequestDecoder::new(&roomy());
        let events = feed(&wire, &cuts, |b| decoder.decode(b)).unwrap();
        let want: Vec<(Bytes, Bytes)> =
            pairs.iter().map(|(n, v)| (b(n), b(v))).collect();
        prop_assert_eq!(&events[1], &RequestEvent::Params { request_id: 1, params: want });
    }

    #[test]
    fn client_round_trip_and_chunked(
        ops in prop::collection::vec((0u8..3, prop::collection::vec(any::<u8>(), 1..400)), 0..20),
        close in (any::<bool>(), any::<bool>()),
        app_status in any::<u32>(),
        status in 0u8..4,
        id in 1u16..,
        cuts in prop::collection::vec(any::<usize>(), 0..40),
    ) {
        let status = ProtocolStatus::from_u8(status).unwrap();
        let mut wire = BytesMut::new();
        let mut want = Vec::new();
        for (op, data) in &ops {
            match op {
                0 => { encode_stdout(id, data, &mut wire); want.push(ResponseEvent::Stdout(b(data))); }
                1 => { encode_stderr(id, data, &mut wire); want.push(ResponseEvent::Stderr(b(data))); }
                _ => {
                    let values = [(MAX_REQS, data.clone())];
                    encode_get_values_result(&values, &mut wire).unwrap();
                    want.push(ResponseEvent::GetValuesResult(vec![(b(MAX_REQS), b(data))]));
                }
            }
        }
        if close.0 { encode_stdout_end(id, &mut wire); want.push(ResponseEvent::StdoutEnd); }
        if close.1 { encode_stderr_end(id, &mut wire); want.push(ResponseEvent::StderrEnd); }
        encode_end_request(id, app_status, status, &mut wire);
        want.push(ResponseEvent::End { app_status, protocol_status: status });

        let mut decoder = ResponseDecoder::new(id, true, &Limits::DEFAULT);
        let got = feed(&wire, &cuts, |b| decoder.decode(b)).unwrap();
        prop_assert_eq!(got, want);
        prop_assert!(decoder.is_reusable());
    }

    #[test]
    fn big_streams_round_trip(len in 0usize..300_000, cuts in prop::collection::vec(any::<usize>(), 0..8)) {
        let data: Vec<u8> = (0..len).map(|i| (i * 7) as u8).collect();
        let mut wire = BytesMut::new();
        encode_stdout(5, &data, &mut wire);
        encode_request_complete(5, 0, &mut wire);
        let mut decoder = ResponseDecoder::new(5, false, &Limits::DEFAULT);
        let events = feed(&wire, &cuts, |b| decoder.decode(b)).unwrap();
        let mut joined = Vec::new();
        for event in &events[..events.len() - 2] {
            let ResponseEvent::Stdout(chunk) = event else { panic!("{event:?}") };
            prop_assert!(chunk.len() <= MAX_CONTENT_LEN);
            joined.extend_from_slice(chunk);
        }
        prop_assert_eq!(joined, data);
        prop_assert!(decoder.is_ended() && !decoder.is_reusable());
    }

    #[test]
    fn arbitrary_bytes_never_panic_either_decoder(
        bytes in prop::collection::vec(any::<u8>(), 0..600),
        cuts in prop::collection::vec(any::<usize>(), 0..8),
    ) {
        let mut responder = RequestDecoder::new(&Limits::DEFAULT);
        let _ = feed_lenient(&bytes, &cuts, |b| responder.decode(b));
        let mut client = ResponseDecoder::new(1, true, &Limits::DEFAULT);
        let _ = feed_lenient(&bytes, &cuts, |b| client.decode(b));
    }
}

/// Like [`feed`] but leftover bytes are fine (random input may stop mid-record).
fn feed_lenient<T>(
    bytes: &[u8],
    cuts: &[usize],
    mut step: impl FnMut(&mut BytesMut) -> Result<Option<T>, FastCgiError>,
) -> Result<usize, FastCgiError> {
    let mut points: Vec<usize> = cuts.iter().map(|c| c % (bytes.len() + 1)).collect();
    points.extend([0, bytes.len()]);
    points.sort_unstable();
    let mut buf = BytesMut::new();
    let mut n = 0;
    for w in points.windows(2) {
        buf.extend_from_slice(&bytes[w[0]..w[1]]);
        while step(&mut buf)?.is_some() {
            n += 1;
        }
    }
    Ok(n)
}

/// The PARAMS stream made from pairs encoded once is byte for byte the one made pair by
/// pair: one record for a usual request, pairs kept whole across records for a large one,
/// and a pair longer than a record split as `encode_params` splits it.
#[test]
fn a_params_block_encodes_as_the_pairs_would() {
    let big = vec![b'v'; 70_000];
    let mid = vec![b'm'; 40_000];
    let cases: Vec<Vec<(&[u8], &[u8])>> = vec![
        vec![],
        vec![(b"SCRIPT_NAME", b"/i.php"), (b"QUERY_STRING", b"")],
        vec![(b"A", &mid), (b"B", &mid), (b"C", b"3")],
        vec![(b"A", b"1"), (b"BIG", &big), (b"Z", b"26")],
    ];
    for pairs in cases {
        let mut want = BytesMut::new();
        encode_params(3, &pairs, &mut want).unwrap();
        let block = corral_protocols::cgi::CgiParams::from_pairs(&pairs).unwrap();
        let mut got = BytesMut::new();
        corral_protocols::fastcgi::encode_params_block(3, &block, &mut got);
        assert_eq!(got, want, "{} pairs", pairs.len());
    }
}
