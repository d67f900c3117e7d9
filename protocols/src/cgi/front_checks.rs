//! The byte checks and the duplicate class the front's index applies to each pair a front
//! server sends ([`FrontParams`](super::FrontParams)): what no environment can carry in a
//! name or a value, found with as little work per pair as the common cases allow.

use super::{snippet, CgiError};

/// The duplicate-scan class of a name: one of 64 bits, from its length and its first and
/// last two bytes, mixed (names sharing a prefix, as HTTP_* ones do, must still spread).
pub(super) fn class(name: &[u8]) -> u64 {
    let n = name.len();
    let byte = |i: Option<usize>| u64::from(i.and_then(|i| name.get(i)).copied().unwrap_or(0));
    let key = byte(Some(0))
        | byte(Some(1)) << 8
        | byte(n.checked_sub(2)) << 16
        | byte(n.checked_sub(1)) << 24
        | (n as u64) << 32;
    1u64 << (key.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 58)
}

/// Whether `b` holds NUL, CR, LF or `=`: what a variable name may not hold (`=` would end
/// it in an environment). Names are short: a table lookup per byte, folded without an early
/// exit, costs less than the word-at-a-time scan's four tests per word and its tail.
fn has_nul_cr_lf_eq(b: &[u8]) -> bool {
    b.iter().fold(0u8, |bad, &c| {
        bad | NAME_BAD.get(usize::from(c)).copied().unwrap_or(1)
    }) != 0
}

/// 1 for the bytes no variable name may hold: NUL, CR, LF and `=`.
#[allow(clippy::indexing_slicing)] // Four constant indexes below 256, the table's length.
const NAME_BAD: [u8; 256] = {
    let mut table = [0u8; 256];
    table[0] = 1;
    table[b'\r' as usize] = 1;
    table[b'\n' as usize] = 1;
    table[b'=' as usize] = 1;
    table
};

/// Whether no environment can carry `name`: empty, or holding NUL, CR, LF or `=`.
pub(super) fn bad_name(name: &[u8]) -> bool {
    name.is_empty() || has_nul_cr_lf_eq(name)
}

/// Whether the word `w` (eight bytes) holds NUL, CR or LF. A byte of `w ^ splat(c)` is zero
/// where `w` holds `c`; `(x - 0x01..) & !x & 0x80..` is non-zero exactly when some byte of
/// `x` is zero. NUL, LF and CR are all below 0x0e, and a word with no byte below 0x0e (most
/// words of text) is ruled out first by one test of the same kind: `(w - 0x0e..) & !w &
/// 0x80..` is non-zero exactly when some byte of `w` is below 0x0e (a borrow only starts at
/// such a byte). Only a word that has one is tested for the three bytes.
#[inline(always)]
fn word_has_nul_cr_lf(w: u64) -> bool {
    const ONES: u64 = 0x0101_0101_0101_0101;
    const HIGHS: u64 = 0x8080_8080_8080_8080;
    let zero_byte = |x: u64| x.wrapping_sub(ONES) & !x;
    w.wrapping_sub(ONES * 0x0e) & !w & HIGHS != 0
        && (zero_byte(w) | zero_byte(w ^ (ONES * u64::from(b'\r'))) | zero_byte(w ^ (ONES * 0x0a)))
            & HIGHS
            != 0
}

/// Whether the value of `pair` (its name, then its value: the last `len` bytes) holds NUL,
/// CR or LF, read a word at a time from its end: each word ends 8 bytes before the last, and
/// the last one read may reach back into the name. So a name byte that is NUL, CR or LF may
/// answer yes too, which changes nothing: such a name is refused first, whatever its value
/// (`bad_name`, [`bad_pair`]), and a name from the table holds none. Only a pair shorter than
/// a word, where a word would reach into the length bytes before the name, is read byte by
/// byte.
#[inline]
pub(super) fn pair_tail_has_nul_cr_lf(pair: &[u8], len: usize) -> bool {
    let n = pair.len();
    if len == 0 {
        return false;
    }
    if n < 8 {
        return pair
            .get(n.saturating_sub(len)..)
            .unwrap_or_default()
            .iter()
            .any(|&c| matches!(c, 0 | b'\r' | b'\n'));
    }
    let start = n.saturating_sub(len);
    let mut end = n;
    loop {
        // The word that ends at `end`, or the pair's first word once `end` is nearer its
        // start than a word.
        let from = end.saturating_sub(8);
        let word = pair
            .get(from..from + 8)
            .and_then(|w| w.first_chunk::<8>())
            .map_or(0, |w| u64::from_le_bytes(*w));
        if word_has_nul_cr_lf(word) {
            return true;
        }
        if from <= start {
            return false;
        }
        end = from;
    }
}

/// [`pair_tail_has_nul_cr_lf`] in the form the short-pair run (`FrontParams::index_short_run`)
/// compiles best: the same words (the last one ending at the pair's end, each one before
/// ending where the last began, the pair's first word last), with no saturating step in the
/// loop. The same answer for every pair (the unit test below holds both to a byte search).
#[inline(always)]
pub(super) fn value_has_nul_cr_lf(pair: &[u8], len: usize) -> bool {
    let n = pair.len();
    if len == 0 {
        return false;
    }
    // The value starts at `n - len`; a word ending at `end` covers it once `end - 8` is
    // at most that.
    let covered = n.saturating_sub(len).saturating_add(8);
    let mut end = n;
    loop {
        let Some(word) = end
            .checked_sub(8)
            .and_then(|from| pair.get(from..end))
            .and_then(<[u8]>::first_chunk::<8>)
        else {
            // A pair shorter than a word: its value byte by byte.
            return pair
                .get(n.saturating_sub(len)..)
                .unwrap_or_default()
                .iter()
                .any(|&c| matches!(c, 0 | b'\r' | b'\n'));
        };
        if word_has_nul_cr_lf(u64::from_le_bytes(*word)) {
            return true;
        }
        if end <= covered {
            return false;
        }
        end = (end - 8).max(8);
    }
}

/// The error the first pair no environment can carry is reported as.
#[cold]
#[inline(never)]
pub(super) fn bad_pair(bad_name: bool, name: &[u8], value: &[u8]) -> CgiError {
    if bad_name {
        CgiError::InvalidParamName {
            name: snippet(name),
        }
    } else {
        CgiError::ForbiddenByte {
            field: String::from_utf8_lossy(name).into_owned(),
            value: snippet(value),
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_value_scan_finds_every_forbidden_byte_of_the_value_and_none_of_a_clean_name() {
        let naive = |b: &[u8]| b.iter().any(|&c| matches!(c, 0 | b'\r' | b'\n'));
        for name_len in 0..12 {
            for len in 0..40 {
                // A clean name before the value; in a pair shorter than a word, no byte
                // before the pair is read.
                let mut v: Vec<u8> = vec![b'N'; name_len];
                v.extend((0..len).map(|i| b'a' + (i % 26) as u8));
                assert!(!super::pair_tail_has_nul_cr_lf(&v, len), "{name_len} {len}");
                assert!(!super::value_has_nul_cr_lf(&v, len), "{name_len} {len}");
                for at in name_len..name_len + len {
                    for bad in [
                        0u8, b'\r', b'\n', 1, 9, 0x0b, 0x0e, 0x8a, 0x8d, 0x80, 0xff, b'=',
                    ] {
                        let mut w = v.clone();
                        w[at] = bad;
                        assert_eq!(
                            super::pair_tail_has_nul_cr_lf(&w, len),
                            naive(&w[name_len..]),
                            "name {name_len} len {len} at {at} byte {bad:#x}"
                        );
                        assert_eq!(
                            super::value_has_nul_cr_lf(&w, len),
                            naive(&w[name_len..]),
                            "run's scan: name {name_len} len {len} at {at} byte {bad:#x}"
                        );
                    }
                }
                // A forbidden byte in the name may be found too, but only with one in a name
                // `bad_name` refuses anyway.
                for at in 0..name_len {
                    for bad in [0u8, b'\r', b'\n'] {
                        let mut w = v.clone();
                        w[at] = bad;
                        if super::pair_tail_has_nul_cr_lf(&w, len) {
                            assert!(super::bad_name(&w[..name_len]));
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn the_name_scan_finds_every_forbidden_byte_anywhere() {
        let naive = |b: &[u8]| b.iter().any(|&c| matches!(c, 0 | b'\r' | b'\n' | b'='));
        for len in 0..40 {
            let clean: Vec<u8> = (0..len).map(|i| b'A' + (i % 26) as u8).collect();
            assert!(!super::has_nul_cr_lf_eq(&clean), "len {len}");
            for at in 0..len {
                for bad in [0u8, b'\r', b'\n', b'=', 1, 0x3c, 0x3e, 0xbd, 0x80, 0xff] {
                    let mut v = clean.clone();
                    v[at] = bad;
                    assert_eq!(
                        super::has_nul_cr_lf_eq(&v),
                        naive(&v),
                        "len {len} at {at} byte {bad:#x}"
                    );
                }
            }
        }
    }
}
