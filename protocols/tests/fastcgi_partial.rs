#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing,
    missing_docs
)]
//! `ResponseDecoder::partial_stdout`: STDOUT content handed out as reads bring it must give
//! the same body bytes, the same other events and the same errors as whole records (the
//! decoder with it off is the oracle), for any cuts of any sequence of records, well formed
//! or not; and it must leave no STDOUT content behind in the buffer.

use bytes::{Bytes, BytesMut};
use corral_protocols::fastcgi::*;
use corral_protocols::Limits;
use proptest::prelude::*;

/// One record's wire bytes: mostly STDOUT for request 1 with any padding, among STDERR,
/// END_REQUEST, other types, other request ids and now and then a bad version byte.
fn record() -> impl Strategy<Value = Vec<u8>> {
    (
        prop_oneof![8 => Just(6u8), 2 => Just(7u8), 1 => Just(3u8), 1 => 0u8..=12],
        prop_oneof![12 => Just(1u16), 1 => 0u16..4],
        prop_oneof![1 => Just(0usize), 1 => 1usize..16, 4 => 0usize..3000],
        any::<u8>(),
        any::<u8>(),
        prop_oneof![30 => Just(1u8), 1 => Just(2u8)],
    )
        .prop_map(|(kind, id, len, padding, fill, version)| {
            let len = if kind == 3 { 8 } else { len };
            let [id_hi, id_lo] = id.to_be_bytes();
            let [len_hi, len_lo] = (len as u16).to_be_bytes();
            let mut wire = vec![version, kind, id_hi, id_lo, len_hi, len_lo, padding, 0];
            wire.extend((0..len).map(|i| fill.wrapping_add(i as u8)));
            wire.extend(std::iter::repeat_n(0xee, usize::from(padding)));
            wire
        })
}

/// `bytes` fed to `dec` in pieces cut at `cuts` (positions taken modulo the length), with
/// `partial_stdout` turned on once `on_after` events have come (as a gateway does after
/// the CGI head): the events, runs of STDOUT bytes joined into one, and the error that
/// ended them, if any. After each piece's events, `check` sees what is left buffered and
/// whether partial STDOUT was on.
fn joined_events(
    dec: &mut ResponseDecoder,
    bytes: &[u8],
    cuts: &[usize],
    on_after: Option<usize>,
    check: impl Fn(&BytesMut, bool) -> Result<(), TestCaseError>,
) -> Result<(Vec<ResponseEvent>, Option<FastCgiError>), TestCaseError> {
    let mut points: Vec<usize> = cuts.iter().map(|c| c % (bytes.len() + 1)).collect();
    points.push(0);
    points.push(bytes.len());
    points.sort_unstable();
    let mut src = BytesMut::new();
    let mut out: Vec<ResponseEvent> = Vec::new();
    let mut seen = 0;
    let mut on = false;
    for pair in points.windows(2) {
        src.extend_from_slice(&bytes[pair[0]..pair[1]]);
        loop {
            if on_after.is_some_and(|n| seen >= n) && !on {
                dec.partial_stdout(true);
                on = true;
            }
            match dec.decode(&mut src) {
                Ok(Some(ResponseEvent::Stdout(part))) => {
                    prop_assert!(!part.is_empty(), "an empty STDOUT part");
                    seen += 1;
                    match out.last_mut() {
                        Some(ResponseEvent::Stdout(run)) => {
                            *run = Bytes::from([&run[..], &part[..]].concat());
                        }
                        _ => out.push(ResponseEvent::Stdout(part)),
                    }
                }
                Ok(Some(event)) => {
                    seen += 1;
                    out.push(event);
                }
                Ok(None) => break,
                Err(e) => return Ok((out, Some(e))),
            }
        }
        check(&src, on)?;
    }
    Ok((out, None))
}

/// What a gateway may find left in its buffer with partial STDOUT on: less than a header,
/// or a record other than STDOUT with content (nothing of a STDOUT record's content).
fn no_stdout_content_left(left: &BytesMut, on: bool) -> Result<(), TestCaseError> {
    if on && left.len() >= HEADER_LEN {
        let content_len = u16::from_be_bytes([left[4], left[5]]);
        prop_assert!(
            left[1] != 6 || content_len == 0,
            "STDOUT content left behind: {} bytes",
            left.len()
        );
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2000, ..ProptestConfig::default() })]

    #[test]
    fn partial_stdout_gives_the_same_bytes_events_and_errors(
        records in prop::collection::vec(record(), 0..12),
        cuts in prop::collection::vec(any::<usize>(), 0..24),
        on_after in prop_oneof![Just(Some(0usize)), Just(None), (0usize..6).prop_map(Some)],
        keep in any::<bool>(),
    ) {
        let bytes = records.concat();
        let mut whole = ResponseDecoder::new(1, keep, &Limits::DEFAULT);
        let want = joined_events(&mut whole, &bytes, &cuts, None, |_, _| Ok(()))?;
        let mut partial = ResponseDecoder::new(1, keep, &Limits::DEFAULT);
        let got = joined_events(&mut partial, &bytes, &cuts, on_after, no_stdout_content_left)?;
        prop_assert_eq!(&got, &want);
        if want.1.is_none() {
            prop_assert_eq!(partial.is_ended(), whole.is_ended());
            prop_assert_eq!(partial.is_reusable(), whole.is_reusable());
        }
    }

    #[test]
    fn partial_stdout_never_panics_on_garbage(
        bytes in prop::collection::vec(any::<u8>(), 0..300),
        cuts in prop::collection::vec(any::<usize>(), 0..24),
    ) {
        let mut dec = ResponseDecoder::new(1, true, &Limits::DEFAULT);
        let _ = joined_events(&mut dec, &bytes, &cuts, Some(0), no_stdout_content_left)?;
    }
}

/// A STDOUT record's header alone (read cut after it) is consumed, its content then comes
/// in pieces as bytes come, and its padding is skipped: nothing of it stays buffered.
#[test]
fn a_record_cut_by_reads_goes_out_in_pieces() {
    let mut wire = BytesMut::new();
    encode_stdout(1, &[b'a'; 13], &mut wire);
    assert_eq!(wire.len(), 8 + 13 + 3);
    let mut dec = ResponseDecoder::new(1, true, &Limits::DEFAULT);
    dec.partial_stdout(true);
    let mut src = BytesMut::from(&wire[..8]);
    assert_eq!(dec.decode(&mut src), Ok(None));
    assert!(src.is_empty());
    src.extend_from_slice(&wire[8..15]);
    assert_eq!(
        dec.decode(&mut src),
        Ok(Some(ResponseEvent::Stdout(Bytes::from_static(b"aaaaaaa"))))
    );
    assert_eq!(dec.decode(&mut src), Ok(None));
    src.extend_from_slice(&wire[15..22]);
    assert_eq!(
        dec.decode(&mut src),
        Ok(Some(ResponseEvent::Stdout(Bytes::from_static(b"aaaaaa"))))
    );
    assert_eq!(dec.decode(&mut src), Ok(None));
    assert!(
        src.is_empty(),
        "the first padding byte is skipped as it comes"
    );
    src.extend_from_slice(&wire[22..]);
    encode_end_request(1, 0, ProtocolStatus::RequestComplete, &mut src);
    let end = ResponseEvent::End {
        app_status: 0,
        protocol_status: ProtocolStatus::RequestComplete,
    };
    assert_eq!(dec.decode(&mut src), Ok(Some(end)));
    assert!(src.is_empty());
    assert!(dec.is_reusable());
}

/// Each refusal comes when the header arrives, before any of the record's content is
/// handed out: the checks the whole record would get.
#[test]
fn a_cut_record_is_refused_before_its_content_goes_out() {
    let cases: [(&[u8], FastCgiError); 4] = [
        (
            &[1, 6, 0, 2, 0, 100, 4, 0, b'x'],
            FastCgiError::WrongRequestId {
                kind: RecordType::Stdout,
                expected: 1,
                got: 2,
            },
        ),
        (
            &[1, 6, 0, 0, 0, 100, 4, 0, b'x'],
            FastCgiError::NullRequestId {
                kind: RecordType::Stdout,
            },
        ),
        (
            &[1, 6, 0, 1, 0, 100, 4, 1, b'x'],
            FastCgiError::ReservedNotZero { value: 1 },
        ),
        (
            &[2, 6, 0, 1, 0, 100, 4, 0, b'x'],
            FastCgiError::UnsupportedVersion { version: 2 },
        ),
    ];
    for (bytes, want) in cases {
        let mut dec = ResponseDecoder::new(1, true, &Limits::DEFAULT);
        dec.partial_stdout(true);
        let mut src = BytesMut::from(bytes);
        assert_eq!(dec.decode(&mut src), Err(want));
    }
    // STDOUT after its stream ended, and after END_REQUEST.
    let mut closed = BytesMut::new();
    encode_stdout_end(1, &mut closed);
    let mut ended = BytesMut::new();
    encode_end_request(1, 0, ProtocolStatus::RequestComplete, &mut ended);
    for (before, want) in [
        (
            closed,
            FastCgiError::StreamAfterEnd {
                kind: RecordType::Stdout,
                request_id: 1,
            },
        ),
        (
            ended,
            FastCgiError::RecordAfterEnd {
                kind: RecordType::Stdout,
                request_id: 1,
            },
        ),
    ] {
        let mut dec = ResponseDecoder::new(1, true, &Limits::DEFAULT);
        dec.partial_stdout(true);
        let mut src = before;
        assert!(dec.decode(&mut src).unwrap().is_some());
        src.extend_from_slice(&[1, 6, 0, 1, 0, 100, 4, 0, b'x']);
        assert_eq!(dec.decode(&mut src), Err(want));
    }
}
