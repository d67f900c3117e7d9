#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing,
    missing_docs
)]
//! FastCGI 1.0 name-value pairs (specification §3.4) and the PARAMS stream: the 1-byte and
//! 4-byte length forms, a pair split across PARAMS records, the encoder keeping pairs whole
//! within a record, overruns and limits refused with their errors, a PARAMS block encoded
//! once matching the pairs encoded one by one, and any split of the stream decoding the same.

mod support;

use bytes::{Bytes, BytesMut};
use corral_protocols::fastcgi::*;
use corral_protocols::Limits;
use proptest::prelude::*;
use support::fastcgi::*;

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

proptest! {
    #![proptest_config(ProptestConfig { cases: 200, ..ProptestConfig::default() })]

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
}
