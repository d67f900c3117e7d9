#![no_main]
//! Fuzzes the backend-role LSAPI decoder (BEGIN_REQUEST, raw body, ABORT_REQUEST):
//! arbitrary bytes, fed whole and in pieces cut at points chosen by the first two input
//! bytes, must never panic and must give the same events (body chunks joined) and the same
//! error either way. A request that parses is rebuilt with the client-role builder when it
//! can be, and must parse back to the same env, special env and header values.

use bytes::{Bytes, BytesMut};
use corral_protocols::lsapi::{
    ByteOrder, FlagRule, LsapiError, RequestBuilder, RequestDecoder, RequestEvent, POINTED_ENV,
};
use corral_protocols::Limits;

fn run(
    input: &[u8],
    cuts: &[usize],
    rule: FlagRule,
    limits: &Limits,
) -> (Vec<RequestEvent>, Option<LsapiError>) {
    let mut dec = RequestDecoder::new(limits).with_flag_rule(rule);
    let mut src = BytesMut::new();
    let mut events: Vec<RequestEvent> = Vec::new();
    let mut at = 0;
    for &cut in cuts.iter().chain(std::iter::once(&input.len())) {
        let cut = cut.clamp(at, input.len());
        src.extend_from_slice(&input[at..cut]);
        at = cut;
        loop {
            let before = src.len();
            match dec.decode(&mut src) {
                Ok(Some(ev)) => match (events.last_mut(), ev) {
                    (Some(RequestEvent::Body(prev)), RequestEvent::Body(more)) => {
                        *prev = Bytes::from([&prev[..], &more[..]].concat());
                    }
                    (_, ev) => events.push(ev),
                },
                Ok(None) => break,
                Err(e) => {
                    assert_eq!(src.len(), before, "an error consumed bytes");
                    return (events, Some(e));
                }
            }
        }
    }
    (events, None)
}

/// Rebuilds a parsed request when every part of it is something the builder accepts.
fn rebuild(ev: &RequestEvent, order: ByteOrder, rule: FlagRule) {
    let RequestEvent::Begin(req) = ev else { return };
    // The builder needs the four pointed variables in the env, with the same values the
    // offsets point at; and it writes the request line from the head's first line.
    let Some(line_end) = req.head.windows(2).position(|w| w == b"\r\n") else {
        return;
    };
    let Ok(mut rb) = RequestBuilder::new(&Limits::DEFAULT, &req.head[..line_end]) else {
        return;
    };
    rb = rb.with_byte_order(order, rule);
    for (n, v) in &req.env {
        if rb.env(n, v).is_err() {
            return;
        }
    }
    for (n, v) in &req.special_env {
        if rb.special_env(n, v).is_err() {
            return;
        }
    }
    for (n, v) in &req.headers {
        if rb.header(n, v).is_err() {
            return;
        }
    }
    let pointed = [
        &req.script_filename,
        &req.script_name,
        &req.query_string,
        &req.request_method,
    ];
    for (name, value) in POINTED_ENV.iter().zip(pointed) {
        let last = req
            .env
            .iter()
            .rev()
            .find(|(n, _)| n.as_ref() == name.as_bytes());
        match (last, value) {
            (Some((_, v)), Some(p)) if v == p => {}
            _ => return,
        }
    }
    rb.body_len(req.body_len);
    let mut out = BytesMut::new();
    if rb.encode(&mut out).is_err() {
        return;
    }
    let mut dec = RequestDecoder::new(&Limits::DEFAULT).with_flag_rule(rule);
    let again = match dec.decode(&mut out) {
        Ok(Some(RequestEvent::Begin(r))) => r,
        other => panic!("rebuilt request does not parse: {other:?}"),
    };
    assert_eq!(again.env, req.env);
    assert_eq!(again.special_env, req.special_env);
    assert_eq!(again.body_len, req.body_len);
    let values = |h: &[(Bytes, Bytes)]| h.iter().map(|(_, v)| v.clone()).collect::<Vec<_>>();
    assert_eq!(values(&again.headers), values(&req.headers));
}

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let Some((&[a, b], input)) = data.split_first_chunk::<2>() else {
        return;
    };
    let rule = if a & 1 == 0 {
        FlagRule::Literal
    } else {
        FlagRule::Inverted
    };
    let limits = if a & 2 == 0 {
        Limits::DEFAULT
    } else {
        Limits {
            max_params_bytes: 600,
            max_params_count: 6,
            max_name_len: 20,
            max_value_len: 40,
            ..Limits::DEFAULT
        }
    };
    let mut seed = u32::from(u16::from_le_bytes([a, b])) | 1;
    let mut cuts: Vec<usize> = (0..(b % 9))
        .map(|_| {
            seed = seed.wrapping_mul(1_103_515_245).wrapping_add(12_345);
            (seed >> 8) as usize % (input.len() + 1)
        })
        .collect();
    cuts.sort_unstable();
    let whole = run(input, &[], rule, &limits);
    let pieces = run(input, &cuts, rule, &limits);
    assert_eq!(whole, pieces);
    if let Some(first) = whole.0.first() {
        let order = match first {
            RequestEvent::Begin(r) => r.order,
            _ => ByteOrder::Little,
        };
        rebuild(first, order, rule);
    }
});
