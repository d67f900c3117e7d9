//! Replays every input kept under protocols/fuzz/corpus (seeds, minimised inputs and every
//! crash ever found) through every decoder on stable Rust, so a fixed crash stays fixed
//! without nightly or libFuzzer. Each input is fed whole and one byte at a time; the framed
//! decoders must give the same events either way, the others the same verdict.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing,
    missing_docs
)]

use std::fmt::Debug;

use bytes::{Bytes, BytesMut};
use corral_protocols::cgi::{split_script_path, CgiContext, ScriptMode};
use corral_protocols::cgi_response::CgiResponseDecoder;
use corral_protocols::fastcgi::{ParamsDecoder, RecordDecoder, RequestDecoder, ResponseDecoder};
use corral_protocols::lsapi;
use corral_protocols::scgi::ScgiRequestDecoder;
use corral_protocols::Limits;

/// Runs `step` over `input` delivered in pieces of `chunk` bytes; returns what it yielded
/// and how it stopped (`None` = ran out of input, `Some(error)` = refused).
fn run<T: Debug, E: Debug>(
    input: &[u8],
    chunk: usize,
    mut step: impl FnMut(&mut BytesMut) -> Result<Option<T>, E>,
) -> (Vec<String>, Option<String>) {
    let mut buf = BytesMut::new();
    let mut events = Vec::new();
    for piece in input.chunks(chunk.max(1)) {
        buf.extend_from_slice(piece);
        loop {
            match step(&mut buf) {
                Ok(Some(ev)) => events.push(format!("{ev:?}")),
                Ok(None) => break,
                Err(e) => return (events, Some(format!("{e:?}"))),
            }
        }
    }
    (events, None)
}

/// Feeds `input` whole and byte by byte to a fresh decoder made by `make`.
fn replay<D, T: Debug, E: Debug>(
    name: &str,
    input: &[u8],
    framed: bool,
    make: impl Fn() -> D,
    step: impl Fn(&mut D, &mut BytesMut) -> Result<Option<T>, E>,
) {
    let mut whole_dec = make();
    let whole = run(input, input.len(), |b| step(&mut whole_dec, b));
    let mut byte_dec = make();
    let bytewise = run(input, 1, |b| step(&mut byte_dec, b));
    if framed {
        assert_eq!(whole, bytewise, "{name}: whole and byte-wise disagree");
    } else {
        assert_eq!(
            whole.1.is_some(),
            bytewise.1.is_some(),
            "{name}: whole and byte-wise verdicts disagree"
        );
    }
}

/// The LSAPI request decoder's in-place form (`decode_into`, one view reused for the whole
/// input) yields the same events and the same error as `decode`, whole and byte by byte.
fn lsapi_view_agrees(name: &str, input: &[u8], limits: &Limits) {
    for chunk in [input.len(), 1] {
        let mut owned = lsapi::RequestDecoder::new(limits);
        let want = run(input, chunk, |b| owned.decode(b));
        let mut viewed = lsapi::RequestDecoder::new(limits);
        let mut view = lsapi::RequestView::new();
        let got = run(input, chunk, |b| {
            Ok::<_, lsapi::LsapiError>(match viewed.decode_into(b, &mut view)? {
                None => None,
                Some(lsapi::ViewEvent::Begin) => {
                    Some(lsapi::RequestEvent::Begin(Box::new(view.to_request())))
                }
                Some(lsapi::ViewEvent::Body(b)) => Some(lsapi::RequestEvent::Body(b)),
                Some(lsapi::ViewEvent::Abort) => Some(lsapi::RequestEvent::Abort),
            })
        });
        assert_eq!(want, got, "{name}: decode_into and decode disagree");
    }
}

fn decoders(name: &str, input: &[u8]) {
    let limits = Limits::DEFAULT;
    replay(name, input, true, RecordDecoder::default, |d, b| {
        d.decode(b)
    });
    replay(
        name,
        input,
        true,
        || RequestDecoder::new(&limits),
        |d, b| d.decode(b),
    );
    replay(
        name,
        input,
        true,
        || ResponseDecoder::new(1, true, &limits),
        |d, b| d.decode(b),
    );
    replay(
        name,
        input,
        false,
        || ScgiRequestDecoder::new(&limits),
        |d, b| d.decode(b),
    );
    replay(
        name,
        input,
        true,
        || lsapi::RequestDecoder::new(&limits),
        |d, b| d.decode(b),
    );
    lsapi_view_agrees(name, input, &limits);
    replay(
        name,
        input,
        true,
        || lsapi::ResponseDecoder::new(&limits),
        |d, b| d.decode(b),
    );
    replay(
        name,
        input,
        true,
        || CgiResponseDecoder::new(&limits),
        |d, b| d.decode(b),
    );
    // The decoders that take a whole block or string at once.
    let _ = ParamsDecoder::decode_block(Bytes::copy_from_slice(input), &limits);
    let ctx = CgiContext {
        document_root: b"/srv/www".to_vec(),
        mode: ScriptMode::Files {
            extensions: vec![b"php".to_vec()],
            index: vec![b"index.php".to_vec()],
        },
        server_software: Bytes::from_static(b"corral/test"),
        extra_env: Vec::new(),
        allow_php_ini_params: false,
    };
    if let Ok(split) = split_script_path(input, &ctx) {
        assert!(
            split
                .script_filename
                .is_none_or(|f| f.starts_with(b"/srv/www/")),
            "{name}: script outside the root"
        );
    }
}

#[test]
fn every_kept_fuzz_input_is_handled_by_every_decoder() {
    let root = format!("{}/fuzz/corpus", env!("CARGO_MANIFEST_DIR"));
    let mut files = 0;
    for target in std::fs::read_dir(&root).unwrap() {
        let target = target.unwrap().path();
        for file in std::fs::read_dir(&target).unwrap() {
            let path = file.unwrap().path();
            if path.file_name().is_some_and(|n| n == ".keep") {
                continue;
            }
            let input = std::fs::read(&path).unwrap();
            decoders(&path.display().to_string(), &input);
            files += 1;
        }
    }
    assert!(files > 100, "only {files} corpus files found under {root}");
}
