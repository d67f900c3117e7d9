//! The byte checks and the duplicate class the front's index applies to each pair a front
//! server sends ([`FrontParams`](super::FrontParams)): what no environment can carry in a
//! name or a value, found with as little work per pair as the common cases allow.

use super::{snippet, CgiError};

/// The duplicate-scan class of a name: one of 128 bits, from its length and its first and
/// last two bytes, mixed (names sharing a prefix, as HTTP_* ones do, must still spread).
pub(super) fn class(name: &[u8]) -> u128 {
    let n = name.len();
    let byte = |i: Option<usize>| u64::from(i.and_then(|i| name.get(i)).copied().unwrap_or(0));
    let key = byte(Some(0))
        | byte(Some(1)) << 8
        | byte(n.checked_sub(2)) << 16
        | byte(n.checked_sub(1)) << 24
        | (n as u64) << 32;
    1u128 << (key.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 57)
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

/// Whether the last `len` bytes of `bytes` (a pair: its name, then its value) hold NUL, CR
/// or LF. A value shorter than a word, as most are, is read as the word that ends where it
/// ends, the bytes before it replaced by a harmless one, so that it takes no byte loop.
#[inline]
pub(super) fn tail_has_nul_cr_lf(bytes: &[u8], len: usize) -> bool {
    const ONES: u64 = 0x0101_0101_0101_0101;
    const HIGHS: u64 = 0x8080_8080_8080_8080;
    // A byte of `w ^ splat(c)` is zero where `w` holds `c`; `(x - 0x01..) & !x & 0x80..` is
    // non-zero exactly when some byte of `x` is zero.
    let zero_byte = |x: u64| x.wrapping_sub(ONES) & !x;
    let any = |w: u64| {
        (zero_byte(w) | zero_byte(w ^ (ONES * u64::from(b'\r'))) | zero_byte(w ^ (ONES * 0x0a)))
            & HIGHS
            != 0
    };
    let n = bytes.len();
    if len == 0 {
        return false;
    }
    if len < 8 {
        let Some(word) = n.checked_sub(8).and_then(|from| bytes.get(from..)) else {
            return bytes
                .get(n.saturating_sub(len)..)
                .unwrap_or_default()
                .iter()
                .any(|&c| matches!(c, 0 | b'\r' | b'\n'));
        };
        let w = word
            .first_chunk::<8>()
            .map_or(0, |w| u64::from_le_bytes(*w));
        // Little-endian: the value is the word's high `len` bytes.
        let keep = u64::MAX << (8 * (8 - len));
        return any((w & keep) | ((ONES * u64::from(b'A')) & !keep));
    }
    let value = bytes.get(n.saturating_sub(len)..).unwrap_or_default();
    let mut chunks = value.chunks_exact(8);
    if chunks.any(|c| {
        c.first_chunk::<8>()
            .is_some_and(|w| any(u64::from_le_bytes(*w)))
    }) {
        return true;
    }
    // The last eight bytes, overlapping the words already read, cover the rest.
    !chunks.remainder().is_empty()
        && value
            .get(len - 8..)
            .and_then(|t| t.first_chunk::<8>())
            .is_some_and(|w| any(u64::from_le_bytes(*w)))
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
    fn the_value_scan_finds_every_forbidden_byte_whatever_comes_before() {
        let naive = |b: &[u8]| b.iter().any(|&c| matches!(c, 0 | b'\r' | b'\n'));
        for before in 0..12 {
            for len in 0..40 {
                // What precedes the value (a name, length bytes) may hold anything.
                for fill in [0u8, b'\n', b'A'] {
                    let mut v: Vec<u8> = vec![fill; before];
                    v.extend((0..len).map(|i| b'a' + (i % 26) as u8));
                    assert!(!super::tail_has_nul_cr_lf(&v, len), "{before} {len}");
                    for at in before..before + len {
                        for bad in [0u8, b'\r', b'\n', 1, 0x0b, 0x8a, 0x80, 0xff, b'='] {
                            let mut w = v.clone();
                            w[at] = bad;
                            assert_eq!(
                                super::tail_has_nul_cr_lf(&w, len),
                                naive(&w[before..]),
                                "before {before} len {len} at {at} byte {bad:#x}"
                            );
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
