#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing,
    missing_docs
)]
//! The front's FCGI_PARAMS collector ([`FrontParamsDecoder`], one buffer indexed once)
//! against the pair decoder ([`ParamsDecoder`], the default): over generated streams (pairs
//! in either length form, cut into records anywhere, fed in any chunking, under limits tight
//! enough to be hit), a request decoder with either accepts the same streams with the same
//! pairs in the same order and refuses the others with the same error.

use bytes::{Bytes, BytesMut};
use corral_protocols::cgi::FrontParams;
use corral_protocols::fastcgi::*;
use corral_protocols::Limits;
use proptest::prelude::*;

/// FCGI_BEGIN_REQUEST for id 1, responder, FCGI_KEEP_CONN.
const BEGIN: &[u8] = &[1, 1, 0, 1, 0, 8, 0, 0, 0, 1, 1, 0, 0, 0, 0, 0];

fn put_len(len: usize, long: bool, out: &mut Vec<u8>) {
    if len < 0x80 && !long {
        out.push(len as u8);
    } else {
        out.extend_from_slice(&(len as u32 | 0x8000_0000).to_be_bytes());
    }
}

/// Every event of `wire` fed in pieces cut at `cuts`, up to the first error; with `peek`,
/// the end of FCGI_STDIN right after the parameters is taken with `take_stdin_end` (and
/// counted as the event `decode` would have returned), as the front takes it.
fn events<C: ParamsCollector>(
    wire: &[u8],
    cuts: &[usize],
    limits: &Limits,
) -> Result<Vec<RequestEvent<C::Block>>, FastCgiError> {
    events_peeking::<C>(wire, cuts, limits, false)
}

fn events_peeking<C: ParamsCollector>(
    wire: &[u8],
    cuts: &[usize],
    limits: &Limits,
    peek: bool,
) -> Result<Vec<RequestEvent<C::Block>>, FastCgiError> {
    let mut decoder = RequestDecoder::<C>::collecting(limits);
    let mut points: Vec<usize> = cuts.iter().map(|c| c % (wire.len() + 1)).collect();
    points.extend([0, wire.len()]);
    points.sort_unstable();
    let mut buf = BytesMut::new();
    let mut out = Vec::new();
    for w in points.windows(2) {
        buf.extend_from_slice(&wire[w[0]..w[1]]);
        while let Some(event) = decoder.decode(&mut buf)? {
            let params_of = match &event {
                RequestEvent::Params { request_id, .. } => Some(*request_id),
                _ => None,
            };
            out.push(event);
            if let Some(request_id) = params_of.filter(|_| peek) {
                if decoder.take_stdin_end(&mut buf, request_id) {
                    out.push(RequestEvent::StdinEnd { request_id });
                }
            }
        }
    }
    Ok(out)
}

/// The pairs of a front-collected Params event, as owned pairs.
fn as_pairs(params: &FrontParams) -> Vec<(Bytes, Bytes)> {
    params
        .iter()
        .map(|(n, v)| (Bytes::copy_from_slice(n), Bytes::copy_from_slice(v)))
        .collect()
}

fn field() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        6 => prop::collection::vec(any::<u8>(), 0..12),
        1 => prop::collection::vec(any::<u8>(), 120..300),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn the_front_collector_accepts_and_refuses_what_the_pair_decoder_does(
        pairs in prop::collection::vec((field(), field(), any::<bool>(), any::<bool>()), 0..12),
        splits in prop::collection::vec(any::<usize>(), 0..8),
        cuts in prop::collection::vec(any::<usize>(), 0..8),
        truncate in prop::option::of(any::<usize>()),
        max_bytes in prop::sample::select(vec![64usize, 600, 4096]),
        max_count in prop::sample::select(vec![3usize, 1000]),
        max_len in prop::sample::select(vec![100usize, 126, 127, 1024]),
        stdin in prop::option::of(prop::collection::vec(any::<u8>(), 1..20)),
        padded_end in any::<bool>(),
        peek in any::<bool>(),
    ) {
        let mut body = Vec::new();
        for (name, value, long_name, long_value) in &pairs {
            put_len(name.len(), *long_name, &mut body);
            put_len(value.len(), *long_value, &mut body);
            body.extend_from_slice(name);
            body.extend_from_slice(value);
        }
        if let Some(t) = truncate {
            body.truncate(t % (body.len() + 1));
        }
        let mut points: Vec<usize> = splits.iter().map(|s| s % (body.len() + 1)).collect();
        points.extend([0, body.len()]);
        points.sort_unstable();
        points.dedup();
        let mut wire = BytesMut::from(BEGIN);
        for w in points.windows(2) {
            encode_record(RecordType::Params, 1, &body[w[0]..w[1]], &mut wire).unwrap();
        }
        encode_stream_end(RecordType::Params, 1, &mut wire);
        if let Some(data) = &stdin {
            encode_record(RecordType::Stdin, 1, data, &mut wire).unwrap();
        }
        if padded_end {
            // The end of FCGI_STDIN with padding, which a sender may add.
            wire.extend_from_slice(&[1, 5, 0, 1, 0, 0, 3, 0, 0, 0, 0]);
        } else {
            encode_stream_end(RecordType::Stdin, 1, &mut wire);
        }
        let limits = Limits {
            max_params_bytes: max_bytes,
            max_params_count: max_count,
            max_name_len: max_len,
            max_value_len: max_len,
            ..Limits::DEFAULT
        };
        let old = events::<ParamsDecoder>(&wire, &cuts, &limits);
        let new = events_peeking::<FrontParamsDecoder>(&wire, &cuts, &limits, peek);
        match (old, new) {
            (Ok(old), Ok(new)) => {
                prop_assert_eq!(old.len(), new.len());
                for (o, n) in old.iter().zip(&new) {
                    match (o, n) {
                        (
                            RequestEvent::Params { request_id: a, params: p },
                            RequestEvent::Params { request_id: b, params: q },
                        ) => {
                            prop_assert_eq!(a, b);
                            prop_assert_eq!(p, &as_pairs(q));
                        }
                        (RequestEvent::Begin { .. }, RequestEvent::Begin { .. }) => {}
                        (RequestEvent::StdinEnd { request_id: a }, RequestEvent::StdinEnd { request_id: b }) => {
                            prop_assert_eq!(a, b);
                        }
                        (RequestEvent::Stdin { request_id: a, data: p }, RequestEvent::Stdin { request_id: b, data: q }) => {
                            prop_assert_eq!((a, p), (b, q));
                        }
                        _ => prop_assert!(false, "{:?} against {:?}", o, n),
                    }
                }
            }
            (Err(a), Err(b)) => prop_assert_eq!(a, b),
            (a, b) => prop_assert!(false, "{:?} against {:?}", a.map(|e| e.len()), b.map(|e| e.len())),
        }
    }
}

#[test]
fn a_long_length_form_is_read_and_passed_on_in_the_short_one() {
    // "A" = "b" with both lengths in the four-byte form.
    let body = [0x80, 0, 0, 1, 0x80, 0, 0, 1, b'A', b'b'];
    let mut wire = BytesMut::from(BEGIN);
    encode_record(RecordType::Params, 1, &body, &mut wire).unwrap();
    encode_stream_end(RecordType::Params, 1, &mut wire);
    let events = events::<FrontParamsDecoder>(&wire, &[], &Limits::DEFAULT).unwrap();
    let RequestEvent::Params { params, .. } = &events[1] else {
        panic!("{events:?}");
    };
    assert_eq!(params.get(b"A"), Some(&b"b"[..]));
    let ctx = corral_protocols::cgi::CgiContext {
        document_root: b"/srv".to_vec(),
        mode: corral_protocols::cgi::ScriptMode::App { mount: Vec::new() },
        server_software: Bytes::from_static(b"t"),
        extra_env: Vec::new(),
        allow_php_ini_params: false,
    };
    let mut front = FrontParams::new();
    front.push(b"A", b"b").unwrap();
    front.push(b"SCRIPT_NAME", b"").unwrap();
    front.push(b"DOCUMENT_ROOT", b"/srv").unwrap();
    // Nothing to change: the block would be the buffer as sent, were its lengths short.
    let mut sent = params.clone();
    sent.push(b"SCRIPT_NAME", b"").unwrap();
    sent.push(b"DOCUMENT_ROOT", b"/srv").unwrap();
    let want = corral_protocols::cgi::normalize_front(front, &ctx).unwrap();
    let got = corral_protocols::cgi::normalize_front(sent, &ctx).unwrap();
    assert_eq!(got.params.encoded(), want.params.encoded());
    assert_eq!(&got.params.encoded()[..4], &[1, 1, b'A', b'b']);
}

/// The outcome of `wire` for a decoder collecting with `C`: the kinds of its events, or its
/// error.
fn outcome<C: ParamsCollector>(wire: &[u8], cuts: &[usize]) -> Result<Vec<String>, FastCgiError> {
    events::<C>(wire, cuts, &Limits::DEFAULT).map(|events| {
        events
            .iter()
            .map(|e| {
                format!("{e:?}")
                    .split([' ', '{'])
                    .next()
                    .unwrap_or_default()
                    .to_owned()
            })
            .collect()
    })
}

#[test]
fn the_records_taken_in_place_are_refused_as_the_general_path_refuses_them() {
    // The front's collector takes FCGI_BEGIN_REQUEST and FCGI_PARAMS where they lie in the
    // input (RequestDecoder::in_place); every rule about them must hold there as it does for
    // the default collector, whatever the chunking.
    let params = |id: u16, body: &[u8]| {
        let mut w = BytesMut::new();
        encode_record(RecordType::Params, id, body, &mut w).unwrap();
        w.to_vec()
    };
    let pair = [1u8, 1, b'A', b'b'];
    let end = |id: u16| params(id, &[]);
    let begin = |id: u16| {
        let mut b = BEGIN.to_vec();
        b[2..4].copy_from_slice(&id.to_be_bytes());
        b
    };
    let mut bad_version = begin(1);
    bad_version[0] = 2;
    let mut bad_reserved = params(1, &pair);
    bad_reserved[7] = 1;
    let mut bad_role = begin(1);
    bad_role[9] = 9;
    let cases: Vec<(&str, Vec<u8>)> = vec![
        (
            "the usual start",
            [begin(1), params(1, &pair), end(1)].concat(),
        ),
        (
            "parameters after their end",
            [begin(1), end(1), params(1, &pair)].concat(),
        ),
        ("a second end", [begin(1), end(1), end(1)].concat()),
        ("a request begun twice", [begin(1), begin(1)].concat()),
        ("a request id of 0", [begin(0)].concat()),
        ("parameters for id 0", [begin(1), params(0, &pair)].concat()),
        (
            "parameters of no request",
            [params(2, &pair), end(2)].concat(),
        ),
        ("another version", bad_version),
        ("a reserved byte set", [begin(1), bad_reserved].concat()),
        ("an unknown role", bad_role),
        (
            "a short begin body",
            [1, 1, 0, 1, 0, 4, 0, 0, 0, 1, 0, 0].to_vec(),
        ),
        (
            "a pair cut by the end",
            [begin(1), params(1, &pair[..3]), end(1)].concat(),
        ),
        (
            "a name too long",
            [begin(1), params(1, &[0x80, 1, 0, 0, 0]), end(1)].concat(),
        ),
    ];
    for (what, wire) in &cases {
        for cuts in [&[][..], &[1, 9, 17, 21][..], &[3, 4, 5, 6, 7, 8, 30][..]] {
            assert_eq!(
                outcome::<FrontParamsDecoder>(wire, cuts),
                outcome::<ParamsDecoder>(wire, cuts),
                "{what}, cut at {cuts:?}"
            );
        }
    }
    // The cases do reach the refusals they name.
    assert!(outcome::<FrontParamsDecoder>(&cases[1].1, &[]).is_err());
    assert!(outcome::<FrontParamsDecoder>(&cases[3].1, &[]).is_err());
}

/// Pairs with one-byte lengths are indexed in one run over the record's content: the pair
/// past the count limit is refused there as the pair decoder refuses it, wherever the record
/// ends, and a run that stays within the limit is accepted.
#[test]
fn the_pair_past_the_count_limit_is_refused_inside_a_run() {
    let limits = Limits {
        max_params_count: 3,
        ..Limits::DEFAULT
    };
    let pair = |name: u8| [1, 1, name, b'v'];
    for pairs in 3..6u8 {
        let body: Vec<u8> = (0..pairs).flat_map(|i| pair(b'A' + i)).collect();
        let mut front = FrontParamsDecoder::new(&limits);
        let mut plain = ParamsDecoder::new(&limits);
        let got = front.push(&body);
        let want = plain.push(Bytes::copy_from_slice(&body));
        assert_eq!(got, want, "{pairs} pairs");
        if pairs > 3 {
            assert_eq!(got, Err(FastCgiError::TooManyParams { limit: 3 }));
        } else {
            assert_eq!(front.finish().unwrap().len(), 3);
        }
    }
}
