//! Header names compared without regard to ASCII case, in one shared body.
//!
//! `<[u8]>::eq_ignore_ascii_case` is inlined wherever it is called: a request compares names
//! from a dozen call sites on its path, each with its own copy of the loop, which is code to
//! fetch on every request (`FOOTPRINT=1 bash benches/callgrind.sh http` counts the code lines
//! a request touches). This one is called, not inlined, and folds eight bytes at a time:
//! callgrind's caller tree on the http path counts 64 to 105 instructions per call, the call
//! and the length test included (`OUT_DIR=... bash benches/callgrind.sh http`, then
//! `callgrind_annotate --tree=caller`).

/// Whether `a` and `b` are equal when ASCII letters are compared without case. The lengths
/// are compared in line (most names are told apart by length alone), the bytes out of line.
#[inline]
pub fn eq_ignore_case(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && same_ignoring_case(a, b)
}

/// [`eq_ignore_case`] for two slices of the same length.
#[inline(never)]
fn same_ignoring_case(a: &[u8], b: &[u8]) -> bool {
    let n = a.len();
    if n < 8 {
        return a.iter().zip(b).all(|(x, y)| x.eq_ignore_ascii_case(y));
    }
    // Whole words, then the last eight bytes (overlapping the last word when n is not a
    // multiple of 8).
    let mut at = 0;
    while at + 8 < n {
        if folded(a, at) != folded(b, at) {
            return false;
        }
        at += 8;
    }
    folded(a, n - 8) == folded(b, n - 8)
}

/// The eight bytes of `s` from `at` (0 past its end, never reached: callers stay within it),
/// each ASCII capital letter made small.
#[inline(always)]
fn folded(s: &[u8], at: usize) -> u64 {
    const ONES: u64 = 0x0101_0101_0101_0101;
    let word = s
        .get(at..at + 8)
        .and_then(|w| <[u8; 8]>::try_from(w).ok())
        .map_or(0, u64::from_le_bytes);
    // Per byte, without carries between bytes: the low seven bits plus 0x3f reach 0x80 from
    // 'A' (0x41) up, plus 0x25 from past 'Z' (0x5b) up; a capital letter is a byte with the
    // first and not the second, and its own top bit clear. Its 0x20 bit is then set.
    let low = word & (0x7f * ONES);
    let from_a = low + (0x80 - u64::from(b'A')) * ONES;
    let past_z = low + (0x80 - u64::from(b'Z') - 1) * ONES;
    let capital = from_a & !past_z & !word & (0x80 * ONES);
    word | (capital >> 2)
}

#[cfg(test)]
mod tests {
    use super::eq_ignore_case;
    use proptest::prelude::*;

    #[test]
    fn agrees_with_the_standard_library_on_names_and_edges() {
        let names: [&[u8]; 14] = [
            b"",
            b"a",
            b"A",
            b"te",
            b"TE",
            b"Content-",
            b"content-",
            b"connection",
            b"Connection",
            b"connectioN ",
            b"CONTENT-LENGTH",
            b"content-length",
            b"content-lengtH",
            b"\xc3\xa9\xc3\x89-\xc3\x89\xc3\xa9-",
        ];
        for a in names {
            for b in names {
                assert_eq!(
                    eq_ignore_case(a, b),
                    a.eq_ignore_ascii_case(b),
                    "{a:?} {b:?}"
                );
            }
        }
    }

    #[test]
    fn only_letters_fold() {
        // Every byte beside every byte, at each position of a word and of the tail.
        for x in 0..=255u8 {
            for y in 0..=255u8 {
                let same = x.eq_ignore_ascii_case(&y);
                for len in [1usize, 8, 11] {
                    for at in [0, len - 1] {
                        let mut a = vec![b'k'; len];
                        let mut b = a.clone();
                        a[at] = x;
                        b[at] = y;
                        assert_eq!(
                            eq_ignore_case(&a, &b),
                            same,
                            "{x:#x} {y:#x} len {len} at {at}"
                        );
                    }
                }
            }
        }
    }

    proptest! {
        #[test]
        fn agrees_with_the_standard_library(
            a in proptest::collection::vec(any::<u8>(), 0..40),
            flips in proptest::collection::vec(any::<bool>(), 0..40),
        ) {
            // `b`: `a` with some letters' case flipped, so that equal pairs come up often.
            let b: Vec<u8> = a
                .iter()
                .zip(flips.iter().chain(std::iter::repeat(&false)))
                .map(|(&c, &flip)| if flip && c.is_ascii_alphabetic() { c ^ 0x20 } else { c })
                .collect();
            prop_assert_eq!(eq_ignore_case(&a, &b), a.eq_ignore_ascii_case(&b));
            let mut c = b.clone();
            if let Some(last) = c.last_mut() {
                *last = last.wrapping_add(1);
            }
            prop_assert_eq!(eq_ignore_case(&a, &c), a.eq_ignore_ascii_case(&c));
        }
    }
}
