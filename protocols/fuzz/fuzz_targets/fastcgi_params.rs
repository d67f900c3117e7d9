#![no_main]
//! Fuzzes the FastCGI name-value decoder: a block fed as record contents cut anywhere must
//! decode to the same pairs as the block fed whole (pairs straddling records included), stay
//! within the limits, and survive re-encoding as a PARAMS stream. The first byte picks the cuts.

use bytes::{Bytes, BytesMut};
use corral_protocols::fastcgi::{encode_params, ParamsDecoder, RecordDecoder};
use corral_protocols::Limits;
use libfuzzer_sys::fuzz_target;

/// Cuts `data` into pieces of 0 to 63 bytes chosen by `seed` (seed 0: one piece). Empty
/// pieces are legal here: the decoder is fed contents, not records.
fn pieces(seed: u8, data: &[u8]) -> Vec<&[u8]> {
    corral_protocols_fuzz::pieces(seed, data, 64, 0)
}

fuzz_target!(|input: &[u8]| {
    let Some((&seed, data)) = input.split_first() else {
        return;
    };
    let limits = Limits {
        max_params_count: 64,
        max_name_len: 300,
        max_value_len: 2000,
        ..Limits::DEFAULT
    };
    let whole = ParamsDecoder::decode_block(Bytes::copy_from_slice(data), &limits);
    let mut decoder = ParamsDecoder::new(&limits);
    let chunked = pieces(seed, data)
        .into_iter()
        .try_for_each(|piece| decoder.push(Bytes::copy_from_slice(piece)))
        .and_then(|()| decoder.finish());
    assert_eq!(whole.is_ok(), chunked.is_ok(), "{whole:?} vs {chunked:?}");
    let (Ok(pairs), Ok(again)) = (whole, chunked) else {
        return;
    };
    assert_eq!(pairs, again);
    assert!(pairs.len() <= limits.max_params_count);
    for (name, value) in &pairs {
        assert!(name.len() <= limits.max_name_len && value.len() <= limits.max_value_len);
    }
    let mut wire = BytesMut::new();
    encode_params(9, &pairs, &mut wire).unwrap();
    let mut records = RecordDecoder::new();
    let mut decoder = ParamsDecoder::new(&limits);
    while let Some(record) = records.decode(&mut wire).unwrap() {
        assert_eq!(record.request_id, 9);
        decoder.push(record.content).unwrap();
    }
    assert_eq!(decoder.finish().unwrap(), pairs);
});
