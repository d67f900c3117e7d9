#![no_main]
//! Fuzzes the CGI response head parser: any bytes, fed in any chunking, must give the same
//! head and leftover body (or the same error) as when fed whole, never panic, and a parsed
//! head must survive re-encoding (with the encoder's checks, and without them: the same
//! bytes) and parsing unchanged. The first input byte picks the cuts.

use bytes::BytesMut;
use corral_protocols::cgi_response::{
    encode_head, CgiResponseDecoder, CgiResponseError, CgiResponseHead,
};
use corral_protocols::Limits;
use libfuzzer_sys::fuzz_target;

/// Small enough that the fuzzer reaches both limits.
const LIMITS: Limits = Limits {
    max_response_head_bytes: 1024,
    max_response_headers: 16,
    ..Limits::DEFAULT
};

/// Cuts `data` into pieces of 1 to 32 bytes chosen by `seed` (seed 0: one piece).
fn pieces(seed: u8, data: &[u8]) -> Vec<&[u8]> {
    corral_protocols_fuzz::pieces(seed, data, 32, 1)
}

fn run(pieces: &[&[u8]]) -> Result<Option<(CgiResponseHead, Vec<u8>)>, CgiResponseError> {
    let mut decoder = CgiResponseDecoder::new(&LIMITS);
    let mut buf = BytesMut::new();
    let mut head = None;
    for piece in pieces {
        buf.extend_from_slice(piece);
        if head.is_none() {
            head = decoder.decode(&mut buf)?;
        }
    }
    Ok(head.map(|h| (h, buf.to_vec())))
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
    if let Ok(Some((head, _))) = whole {
        let _ = (head.kind(), head.status_code());
        // The decoded head is written without the encoder's checks; the same head built
        // anew is checked. The checks must pass (the decoder refused all they refuse) and
        // both must write the same bytes.
        assert!(head.is_decoded());
        let built = CgiResponseHead::new(head.status().cloned(), head.headers().to_vec());
        let mut wire = BytesMut::new();
        encode_head(&built, &mut wire).expect("a parsed head re-encodes");
        let mut unchecked = BytesMut::new();
        encode_head(&head, &mut unchecked).expect("a decoded head is written");
        assert_eq!(
            unchecked, wire,
            "the decoded head's bytes differ from the checked ones"
        );
        let again = CgiResponseDecoder::new(&Limits::DEFAULT).decode(&mut wire);
        assert_eq!(again, Ok(Some(head)));
        assert!(wire.is_empty());
    }
});
