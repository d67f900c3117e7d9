//! The one-pass check of a header line against the rule-by-rule one it stands in for.

use proptest::prelude::*;

use super::{well_formed, CgiResponseDecoder};
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
