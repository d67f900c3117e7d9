//! The one-pass checks of a header line against the rule-by-rule ones they stand in for.

use proptest::prelude::*;

use super::lines::{first_control, is_control};
use super::{clean_line, well_formed, CgiResponseDecoder};
use crate::Limits;

/// What the rule-by-rule path makes of `line`.
fn slow(line: &[u8]) -> Option<(usize, std::ops::Range<usize>)> {
    CgiResponseDecoder::new(&Limits::DEFAULT)
        .line_error(line)
        .ok()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(20_000))]

    /// Over the bytes that matter (token and separator characters, spaces, tabs, CR,
    /// controls, DEL, high bytes), both agree on every line: the same parts when it is well
    /// formed, a refusal when it is not.
    #[test]
    fn the_one_pass_check_agrees_with_the_rules(
        line in proptest::collection::vec(
            prop::sample::select(b"aZ-_:: \t\r\x01\x7f\x80\xff\"(@;o".to_vec()), 0..12)
    ) {
        prop_assert_eq!(well_formed(&line), slow(&line));
    }

    /// The scanner's one pass over a line and its ending, on whatever follows (other lines,
    /// a partial line, nothing), finds what the steps find: the first LF, the CR before it
    /// taken off, then the line's parts; and declines whatever the steps would refuse or
    /// cannot decide yet (no LF).
    #[test]
    fn the_scanner_s_one_pass_agrees_with_its_steps(
        rest in proptest::collection::vec(
            prop::sample::select(b"aZ-_:: \t\r\n\n\x01\x7f\x80\xff\"(@;o".to_vec()), 0..40)
    ) {
        let steps = rest.iter().position(|&c| c == b'\n').and_then(|lf| {
            let end = if lf > 0 && rest[lf - 1] == b'\r' { lf - 1 } else { lf };
            let line = &rest[..end];
            (!line.is_empty()).then_some(())?;
            well_formed(line).map(|(colon, value)| (colon, value, end, lf + 1))
        });
        let one_pass = clean_line(&rest).map(|l| (l.colon, l.value, l.end, l.next));
        prop_assert_eq!(one_pass, steps);
    }
}

proptest! {
    /// Eight bytes at a time, the search for a value's end finds the byte a byte-at-a-time
    /// search finds, at every offset in and across words: the bounds of the refused range
    /// (NUL, 0x1f, DEL), the allowed ones beside them (0x20, 0x7e, tab, high bytes), and
    /// mostly clean runs longer than a word.
    #[test]
    fn the_word_search_finds_the_first_control_byte(
        bytes in proptest::collection::vec(
            prop::sample::select(b"aaaaaaaa \t\r\n\x00\x01\x1f\x20\x7e\x7f\x80\xff".to_vec()), 0..48)
    ) {
        prop_assert_eq!(first_control(&bytes), bytes.iter().position(|&c| is_control(c)));
    }
}

#[test]
fn the_usual_lines_pass_in_one_pass() {
    assert_eq!(well_formed(b"Content-Type: text/html"), Some((12, 1..10)));
    assert_eq!(well_formed(b"X-Empty:"), Some((7, 0..0)));
    assert_eq!(well_formed(b"X-Blank: \t "), Some((7, 3..3)));
    assert_eq!(well_formed(b"X-A:b c "), Some((3, 0..3)));
    assert_eq!(well_formed(b": v"), None);
    assert_eq!(well_formed(b" X: v"), None);
    assert_eq!(well_formed(b"X: a\rb"), None);
}

/// A decoder restarted part-way through a head forgets it and takes the new limits: the next
/// head is read from its first byte, and a limit lowered by the restart is enforced.
#[test]
fn a_restarted_decoder_starts_over_under_its_new_limits() {
    let mut decoder = CgiResponseDecoder::new(&Limits::DEFAULT);
    let mut partial = bytes::BytesMut::from(&b"Status: 404 Gone\r\nX-A: 1\r\n"[..]);
    assert!(decoder.decode(&mut partial).unwrap().is_none());

    decoder.restart(&Limits::DEFAULT);
    let mut whole = bytes::BytesMut::from(&b"Content-Type: text/plain\r\n\r\nbody"[..]);
    let head = decoder.decode(&mut whole).unwrap().unwrap();
    assert!(head.status().is_none());
    assert_eq!(head.headers().len(), 1);
    assert_eq!(&whole[..], b"body");

    let tight = Limits {
        max_response_headers: 1,
        ..Limits::DEFAULT
    };
    decoder.restart(&tight);
    let mut two = bytes::BytesMut::from(&b"X-A: 1\r\nX-B: 2\r\n\r\n"[..]);
    assert!(decoder.decode(&mut two).is_err());
}
