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
        max_len in prop::sample::select(vec![100usize, 1024]),
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
