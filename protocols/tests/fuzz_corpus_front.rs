//! Replays every input kept under protocols/fuzz/corpus through the request decoder twice,
//! collecting FCGI_PARAMS with the front's `FrontParamsDecoder` and with the default
//! `ParamsDecoder`: both must refuse the same inputs with the same error after the same
//! events, and give the same pairs, whole and one byte at a time.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing,
    missing_docs
)]

use bytes::{Bytes, BytesMut};
use corral_protocols::fastcgi::{
    FastCgiError, FrontParamsDecoder, ParamsCollector, RequestDecoder, RequestEvent,
};
use corral_protocols::Limits;

/// The events of `input` fed in pieces of `chunk` bytes, Params as owned pairs, and the
/// error that stopped it.
fn run<C: ParamsCollector>(
    input: &[u8],
    chunk: usize,
    pairs: impl Fn(&C::Block) -> Vec<(Bytes, Bytes)>,
) -> (Vec<String>, Option<FastCgiError>) {
    let mut decoder = RequestDecoder::<C>::collecting(&Limits::DEFAULT);
    let mut buf = BytesMut::new();
    let mut events = Vec::new();
    for piece in input.chunks(chunk.max(1)) {
        buf.extend_from_slice(piece);
        loop {
            match decoder.decode(&mut buf) {
                Ok(Some(RequestEvent::Params { request_id, params })) => {
                    events.push(format!("params {request_id} {:?}", pairs(&params)));
                }
                Ok(Some(other)) => {
                    // Every other event carries no parameters: its variant and fields.
                    let text = format!("{other:?}");
                    events.push(text);
                }
                Ok(None) => break,
                Err(e) => return (events, Some(e)),
            }
        }
    }
    (events, None)
}

#[test]
fn every_kept_fuzz_input_is_collected_by_the_front_as_by_the_pair_decoder() {
    let root = format!("{}/fuzz/corpus", env!("CARGO_MANIFEST_DIR"));
    let mut files = 0;
    for target in std::fs::read_dir(&root).unwrap() {
        for file in std::fs::read_dir(target.unwrap().path()).unwrap() {
            let path = file.unwrap().path();
            if path.file_name().is_some_and(|n| n == ".keep") {
                continue;
            }
            let input = std::fs::read(&path).unwrap();
            for chunk in [input.len(), 1] {
                let old =
                    run::<corral_protocols::fastcgi::ParamsDecoder>(&input, chunk, |p| p.clone());
                let new = run::<FrontParamsDecoder>(&input, chunk, |p| {
                    p.iter()
                        .map(|(n, v)| (Bytes::copy_from_slice(n), Bytes::copy_from_slice(v)))
                        .collect()
                });
                assert_eq!(old, new, "{}, pieces of {chunk}", path.display());
            }
            files += 1;
        }
    }
    assert!(files > 100, "only {files} corpus files found under {root}");
}
