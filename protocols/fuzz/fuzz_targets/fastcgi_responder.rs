#![no_main]
//! Fuzzes the FastCGI responder role (front server to corral): any bytes, fed in any chunking,
//! must give the same events (or the same error) as when fed whole, never panic, and never
//! track more active request ids than the limit. Requests are finished as a daemon would, when
//! their stdin ends or they are aborted. The first input byte picks the cuts.

use bytes::BytesMut;
use corral_protocols::fastcgi::{FastCgiError, RequestDecoder, RequestEvent};
use corral_protocols::Limits;
use libfuzzer_sys::fuzz_target;

/// Cuts `data` into pieces of 1 to 64 bytes chosen by `seed` (seed 0: one piece).
fn pieces(seed: u8, data: &[u8]) -> Vec<&[u8]> {
    corral_protocols_fuzz::pieces(seed, data, 64, 1)
}

const LIMITS: Limits = Limits {
    max_params_bytes: 4096,
    max_params_count: 32,
    max_name_len: 256,
    max_value_len: 1024,
    max_concurrent_requests: 3,
    ..Limits::DEFAULT
};

fn run(pieces: &[&[u8]]) -> (Vec<RequestEvent>, Option<FastCgiError>) {
    let mut decoder = RequestDecoder::new(&LIMITS);
    let mut buf = BytesMut::new();
    let mut events = Vec::new();
    for piece in pieces {
        buf.extend_from_slice(piece);
        loop {
            match decoder.decode(&mut buf) {
                Ok(Some(event)) => {
                    match &event {
                        RequestEvent::StdinEnd { request_id }
                        | RequestEvent::Abort { request_id } => {
                            assert!(decoder.finish(*request_id));
                        }
                        RequestEvent::Begin { request_id, .. } => {
                            assert!(decoder.is_active(*request_id));
                        }
                        _ => {}
                    }
                    assert!(decoder.active_count() <= LIMITS.max_concurrent_requests);
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
    assert_eq!(run(&[data]), run(&pieces(seed, data)));
});
