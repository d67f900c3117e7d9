#![no_main]
//! Fuzzes the client-role LSAPI decoder (backend → server packets): arbitrary bytes, fed
//! whole and in pieces cut at points chosen by the first two input bytes, must never panic
//! and must give the same events and the same error either way.

use bytes::BytesMut;
use corral_protocols::lsapi::{FlagRule, LsapiError, ResponseDecoder, ResponseEvent};
use corral_protocols::Limits;

fn run(
    input: &[u8],
    cuts: &[usize],
    rule: FlagRule,
    limits: &Limits,
) -> (Vec<ResponseEvent>, Option<LsapiError>) {
    let mut dec = ResponseDecoder::new(limits).with_flag_rule(rule);
    let mut src = BytesMut::new();
    let mut events = Vec::new();
    let mut at = 0;
    for &cut in cuts.iter().chain(std::iter::once(&input.len())) {
        let cut = cut.clamp(at, input.len());
        src.extend_from_slice(&input[at..cut]);
        at = cut;
        loop {
            let before = src.len();
            match dec.decode(&mut src) {
                Ok(Some(ev)) => events.push(ev),
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
            max_packet_len: 64,
            max_response_headers: 3,
            max_name_len: 8,
            max_value_len: 16,
            ..Limits::DEFAULT
        }
    };
    // Up to 8 cut points from a small linear congruential sequence seeded by the two bytes.
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
});
