#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing,
    missing_docs
)]
//! The FastCGI 1.0 response decoder (the web server's side, corral's FastCGI backends): a
//! backend's answer and every protocol status, padding of the records read in place,
//! management records, connection reuse by FCGI_KEEP_CONN, everything a responder must not
//! send refused with its error, and answers round-tripping in any chunking.

mod support;

use bytes::BytesMut;
use corral_protocols::fastcgi::*;
use corral_protocols::Limits;
use proptest::prelude::*;
use support::fastcgi::*;

fn answer(bytes: &[u8], id: u16, keep: bool) -> Result<Vec<ResponseEvent>, FastCgiError> {
    let mut decoder = ResponseDecoder::new(id, keep, &Limits::DEFAULT);
    let whole = feed(bytes, &[], |b| decoder.decode(b));
    let mut decoder = ResponseDecoder::new(id, keep, &Limits::DEFAULT);
    let cuts: Vec<usize> = (0..bytes.len()).collect();
    assert_eq!(whole, feed(bytes, &cuts, |b| decoder.decode(b)));
    whole
}

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

proptest! {
    #![proptest_config(ProptestConfig { cases: 200, ..ProptestConfig::default() })]

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
}
