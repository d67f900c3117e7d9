#![no_main]
//! Fuzzes the FastCGI client role (backend to corral): any bytes, fed in any chunking, must
//! give the same events (or the same error) as when fed whole and never panic; whenever a
//! request ends on a kept connection the next one is started, as a daemon would. The first
//! input byte picks the cuts and whether FCGI_KEEP_CONN is set.

use bytes::BytesMut;
use corral_protocols::fastcgi::{FastCgiError, ResponseDecoder, ResponseEvent};
use corral_protocols::Limits;
use libfuzzer_sys::fuzz_target;

/// Cuts `data` into pieces of 1 to 64 bytes chosen by `seed` (seed 0: one piece).
fn pieces(seed: u8, data: &[u8]) -> Vec<&[u8]> {
    corral_protocols_fuzz::pieces(seed, data, 64, 1)
}

fn run(keep: bool, pieces: &[&[u8]]) -> (Vec<ResponseEvent>, Option<FastCgiError>) {
    let mut decoder = ResponseDecoder::new(1, keep, &Limits::DEFAULT);
    let mut buf = BytesMut::new();
    let mut events = Vec::new();
    for piece in pieces {
        buf.extend_from_slice(piece);
        loop {
            match decoder.decode(&mut buf) {
                Ok(Some(event)) => {
                    if let ResponseEvent::End { .. } = event {
                        assert!(decoder.is_ended());
                        assert_eq!(decoder.is_reusable(), keep);
                        if keep {
                            decoder.reuse(1, keep).unwrap();
                        }
                    }
                    events.push(event);
                }
                Ok(None) => break,
                Err(err) => return (events, Some(err)),
            }
        }
    }
    (events, None)
}

fuzz_target!(|input: &[u8]| {
    let Some((&seed, data)) = input.split_first() else {
        return;
    };
    let keep = seed & 1 == 1;
    assert_eq!(run(keep, &[data]), run(keep, &pieces(seed, data)));
});
