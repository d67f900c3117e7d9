#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing,
    missing_docs
)]
//! The FastCGI 1.0 request decoder (the responder's side, corral's FastCGI front): a simple
//! request, the authorizer and filter roles, ABORT_REQUEST and management records, ids never
//! begun or finished, the concurrency limit and unknown roles, every broken stream refused
//! with its error, and requests multiplexed on one connection round-tripping in any chunking.

mod support;

use bytes::BytesMut;
use corral_protocols::fastcgi::*;
use corral_protocols::Limits;
use proptest::prelude::*;
use support::fastcgi::*;

fn simple_request() -> Vec<u8> {
    cat(&[
        BEGIN_1_RESPONDER_KEEP,
        &params_1_script_name(),
        PARAMS_1_END,
        STDIN_1_HELLO,
        STDIN_1_END,
    ])
}

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
}
