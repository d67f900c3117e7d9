#![no_main]
//! Fuzzes the SCGI responder's request decoder: any bytes, fed in any chunking, must give the
//! same head, body and end (or the same error) as when fed whole, never panic, and a decoded
//! head must survive re-encoding and decoding unchanged. The first input byte picks the cuts.

use bytes::BytesMut;
use corral_protocols::scgi::{ScgiError, ScgiRequestDecoder, ScgiRequestEvent, ScgiRequestHead};
use corral_protocols::Limits;
use libfuzzer_sys::fuzz_target;

/// Small enough that the fuzzer reaches every limit.
const LIMITS: Limits = Limits {
    max_params_bytes: 2048,
    max_params_count: 16,
    max_name_len: 64,
    max_value_len: 256,
    ..Limits::DEFAULT
};

/// Cuts `data` into pieces of 1 to 32 bytes chosen by `seed` (seed 0: one piece).
fn pieces(seed: u8, data: &[u8]) -> Vec<&[u8]> {
    corral_protocols_fuzz::pieces(seed, data, 32, 1)
}

/// The head, the whole body, whether End came, and the error that stopped decoding.
type Outcome = (Option<ScgiRequestHead>, Vec<u8>, bool, Option<ScgiError>);

fn run(pieces: &[&[u8]]) -> Outcome {
    let mut decoder = ScgiRequestDecoder::new(&LIMITS);
    let mut buf = BytesMut::new();
    let (mut head, mut body, mut ended) = (None, Vec::new(), false);
    for piece in pieces {
        buf.extend_from_slice(piece);
        loop {
            match decoder.decode(&mut buf) {
                Ok(Some(ScgiRequestEvent::Head(h))) => {
                    assert!(
                        head.is_none() && body.is_empty() && !ended,
                        "Head comes first, once"
                    );
                    head = Some(h);
                }
                Ok(Some(ScgiRequestEvent::Body(chunk))) => {
                    assert!(!chunk.is_empty() && head.is_some() && !ended);
                    body.extend_from_slice(&chunk);
                }
                Ok(Some(ScgiRequestEvent::End)) => {
                    assert!(head.is_some() && !ended, "End comes after Head, once");
                    ended = true;
                }
                Ok(None) => break,
                Err(err) => return (head, body, ended, Some(err)),
            }
        }
    }
    (head, body, ended, None)
}

fuzz_target!(|data: &[u8]| {
    let Some((&seed, input)) = data.split_first() else {
        return;
    };
    let whole = run(&[input]);
    assert_eq!(
        run(&pieces(seed, input)),
        whole,
        "chunking changed the outcome"
    );
    let (head, body, ended, _) = whole;
    if let Some(head) = head {
        assert!(body.len() as u64 <= head.content_length);
        assert_eq!(ended, body.len() as u64 == head.content_length);
        let mut wire = BytesMut::new();
        head.encode(&LIMITS, &mut wire)
            .expect("a decoded head re-encodes");
        let mut decoder = ScgiRequestDecoder::new(&LIMITS);
        match decoder.decode(&mut wire) {
            Ok(Some(ScgiRequestEvent::Head(again))) => assert_eq!(again, head),
            other => panic!("re-encoded head did not decode: {other:?}"),
        }
        assert!(wire.is_empty());
    }
});
