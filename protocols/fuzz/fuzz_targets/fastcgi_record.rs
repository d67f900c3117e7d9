#![no_main]
//! Fuzzes the FastCGI record layer: any bytes, fed in any chunking, must give the same records
//! (or the same error) as when fed whole, never panic, and every record must survive
//! re-encoding (padded to 8 bytes) and decoding unchanged. The first input byte picks the cuts.

use bytes::BytesMut;
use corral_protocols::fastcgi::{encode_record, FastCgiError, Record, RecordDecoder};
use libfuzzer_sys::fuzz_target;

/// Cuts `data` into pieces of 1 to 64 bytes chosen by `seed` (seed 0: one piece).
fn pieces(seed: u8, data: &[u8]) -> Vec<&[u8]> {
    corral_protocols_fuzz::pieces(seed, data, 64, 1)
}

fn run(pieces: &[&[u8]]) -> (Vec<Record>, Option<FastCgiError>) {
    let mut decoder = RecordDecoder::new();
    let mut buf = BytesMut::new();
    let mut records = Vec::new();
    for piece in pieces {
        buf.extend_from_slice(piece);
        loop {
            match decoder.decode(&mut buf) {
                Ok(Some(record)) => records.push(record),
                Ok(None) => break,
                Err(err) => return (records, Some(err)),
            }
        }
    }
    (records, None)
}

fuzz_target!(|input: &[u8]| {
    let Some((&seed, data)) = input.split_first() else {
        return;
    };
    let whole = run(&[data]);
    assert_eq!(whole, run(&pieces(seed, data)));
    for record in &whole.0 {
        let mut dst = BytesMut::new();
        encode_record(record.kind, record.request_id, &record.content, &mut dst).unwrap();
        assert_eq!(dst.len() % 8, 0);
        let back = RecordDecoder::new().decode(&mut dst).unwrap().unwrap();
        assert_eq!(&back, record);
        assert!(dst.is_empty());
    }
});
