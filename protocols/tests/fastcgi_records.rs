#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing,
    missing_docs
)]
//! FastCGI 1.0 record framing, both roles: the header read from the specification's layout
//! (version, type, request id, content and padding lengths, reserved byte), a partial record
//! waited for, the encoders' padding and stream splitting, every discrete record's bytes as
//! the specification writes them, and arbitrary bytes in any chunking panicking neither
//! decoder. The records written by hand are in `support/fastcgi.rs`.

mod support;

use bytes::{Bytes, BytesMut};
use corral_protocols::fastcgi::*;
use corral_protocols::Limits;
use proptest::prelude::*;
use support::fastcgi::*;

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

proptest! {
    #![proptest_config(ProptestConfig { cases: 200, ..ProptestConfig::default() })]

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
