#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing,
    missing_docs
)]
//! LSAPI codec tests: byte vectors written by hand from protocols/LSAPI.md (sections 1-3 and
//! the worked example of section 7), every malformed case with its error variant, property
//! tests (round trip in both byte orders, any chunking), and decoding of real lsphp 8.2
//! responses captured under tests/data/lsapi/. This file holds the shared helpers; the cases
//! are in tests/lsapi/ (request, request_cgi, response, response_errors, props, captures), and
//! the BEGIN_REQUEST written by hand, which both `request` and `view_error` start from, in
//! tests/lsapi/hand_request.rs.

use bytes::{Bytes, BytesMut};
use corral_protocols::lsapi::*;
use corral_protocols::Limits;
use proptest::prelude::*;

// ---------------------------------------------------------------------------------------
// helpers

fn cat(parts: &[&[u8]]) -> Vec<u8> {
    parts.concat()
}

/// Decodes everything in `input`, fed in pieces cut at `cuts` (sorted, deduplicated).
fn response_events(
    dec: &mut ResponseDecoder,
    input: &[u8],
    cuts: &[usize],
) -> Result<Vec<ResponseEvent>, LsapiError> {
    let mut src = BytesMut::new();
    let mut out = Vec::new();
    let mut at = 0;
    for &cut in cuts.iter().chain(std::iter::once(&input.len())) {
        let cut = cut.clamp(at, input.len());
        src.extend_from_slice(&input[at..cut]);
        at = cut;
        while let Some(ev) = dec.decode(&mut src)? {
            out.push(ev);
        }
    }
    assert!(src.is_empty(), "{} bytes left undecoded", src.len());
    Ok(out)
}

fn decode_response(input: &[u8]) -> Result<Vec<ResponseEvent>, LsapiError> {
    let mut dec = ResponseDecoder::new(&Limits::DEFAULT).with_flag_rule(FlagRule::Literal);
    response_events(&mut dec, input, &[])
}

/// The first error `decode` gives for `input` (which must not decode cleanly).
fn response_error(input: &[u8], limits: &Limits) -> LsapiError {
    let mut dec = ResponseDecoder::new(limits).with_flag_rule(FlagRule::Literal);
    let mut src = BytesMut::from(input);
    loop {
        let before = src.len();
        match dec.decode(&mut src) {
            Ok(Some(_)) => continue,
            Ok(None) => panic!("no error, {} bytes pending", src.len()),
            Err(e) => {
                assert_eq!(src.len(), before, "an error must not consume bytes");
                return e;
            }
        }
    }
}

/// Request-side events with consecutive Body chunks merged (chunking decides their sizes).
fn request_events(
    limits: &Limits,
    input: &[u8],
    cuts: &[usize],
) -> Result<Vec<RequestEvent>, LsapiError> {
    let mut dec = RequestDecoder::new(limits).with_flag_rule(FlagRule::Literal);
    let mut src = BytesMut::new();
    let mut out: Vec<RequestEvent> = Vec::new();
    let mut at = 0;
    for &cut in cuts.iter().chain(std::iter::once(&input.len())) {
        let cut = cut.clamp(at, input.len());
        src.extend_from_slice(&input[at..cut]);
        at = cut;
        while let Some(ev) = dec.decode(&mut src)? {
            match (out.last_mut(), ev) {
                (Some(RequestEvent::Body(prev)), RequestEvent::Body(more)) => {
                    *prev = Bytes::from([&prev[..], &more[..]].concat());
                }
                (_, ev) => out.push(ev),
            }
        }
    }
    assert!(src.is_empty(), "{} bytes left undecoded", src.len());
    assert_eq!(view_events(limits, input, cuts), Ok(out.clone()));
    Ok(out)
}

/// What `request_events` gives, read with `decode_into` into one reused view (every
/// BEGIN_REQUEST turned back into the owned form to compare); errors as their Debug text.
fn view_events(limits: &Limits, input: &[u8], cuts: &[usize]) -> Result<Vec<RequestEvent>, String> {
    let mut dec = RequestDecoder::new(limits).with_flag_rule(FlagRule::Literal);
    let mut view = RequestView::new();
    let mut src = BytesMut::new();
    let mut out: Vec<RequestEvent> = Vec::new();
    let mut at = 0;
    for &cut in cuts.iter().chain(std::iter::once(&input.len())) {
        let cut = cut.clamp(at, input.len());
        src.extend_from_slice(&input[at..cut]);
        at = cut;
        loop {
            let ev = match dec.decode_into(&mut src, &mut view) {
                Ok(None) => break,
                Ok(Some(ViewEvent::Begin)) => RequestEvent::Begin(Box::new(view.to_request())),
                Ok(Some(ViewEvent::Body(b))) => RequestEvent::Body(b),
                Ok(Some(ViewEvent::Abort)) => RequestEvent::Abort,
                Err(e) => return Err(format!("{e:?}")),
            };
            match (out.last_mut(), ev) {
                (Some(RequestEvent::Body(prev)), RequestEvent::Body(more)) => {
                    *prev = Bytes::from([&prev[..], &more[..]].concat());
                }
                (_, ev) => out.push(ev),
            }
        }
    }
    Ok(out)
}

fn request_error(input: &[u8], limits: &Limits) -> LsapiError {
    let mut dec = RequestDecoder::new(limits).with_flag_rule(FlagRule::Literal);
    let mut src = BytesMut::from(input);
    loop {
        let before = src.len();
        match dec.decode(&mut src) {
            Ok(Some(_)) => continue,
            Ok(None) => panic!("no error, {} bytes pending", src.len()),
            Err(e) => {
                assert_eq!(src.len(), before, "an error must not consume bytes");
                assert_eq!(view_error(input, limits), format!("{e:?}"));
                return e;
            }
        }
    }
}

/// `request_error` through `decode_into`, into a view that already held a request (its old
/// content must not leak into the verdict); the error as its Debug text.
fn view_error(input: &[u8], limits: &Limits) -> String {
    let mut dec = RequestDecoder::new(limits).with_flag_rule(FlagRule::Literal);
    let mut view = RequestView::new();
    let mut warm = BytesMut::from(&hand_request::hand_request_le()[..]);
    let mut warm_dec = RequestDecoder::new(&Limits::DEFAULT).with_flag_rule(FlagRule::Literal);
    assert_eq!(
        warm_dec.decode_into(&mut warm, &mut view),
        Ok(Some(ViewEvent::Begin))
    );
    let mut src = BytesMut::from(input);
    loop {
        let before = src.len();
        match dec.decode_into(&mut src, &mut view) {
            Ok(Some(_)) => continue,
            Ok(None) => panic!("decode_into: no error, {} bytes pending", src.len()),
            Err(e) => {
                assert_eq!(
                    src.len(),
                    before,
                    "decode_into: an error must not consume bytes"
                );
                return format!("{e:?}");
            }
        }
    }
}

fn begin(ev: &RequestEvent) -> &BeginRequest {
    match ev {
        RequestEvent::Begin(b) => b,
        other => panic!("expected Begin, got {other:?}"),
    }
}

fn head(ev: &ResponseEvent) -> &ResponseHead {
    match ev {
        ResponseEvent::Header(h) => h,
        other => panic!("expected Header, got {other:?}"),
    }
}

fn b(s: &str) -> Bytes {
    Bytes::copy_from_slice(s.as_bytes())
}

// Further cases live beside this file (the crate root looks up modules in tests/, so the
// paths are explicit; cargo does not build tests/lsapi/ as tests of its own).
#[path = "lsapi/captures.rs"]
mod captures;
#[path = "lsapi/hand_request.rs"]
mod hand_request;
#[path = "lsapi/props.rs"]
mod props;
#[path = "lsapi/request.rs"]
mod request;
#[path = "lsapi/request_cgi.rs"]
mod request_cgi;
#[path = "lsapi/response.rs"]
mod response;
#[path = "lsapi/response_errors.rs"]
mod response_errors;
