//! The line-level checks of the CGI response head's parser (`super`): a header line's
//! shape, its name's token bytes, control bytes in a value, and the `Status:` and
//! `Location:` values.

use std::ops::Range;

use super::{snippet, CgiResponseError};

/// The range of `value` (relative to `value`) without leading and trailing spaces and tabs.
#[inline]
pub(super) fn trim_ows(value: &[u8]) -> Range<usize> {
    let start = value
        .iter()
        .position(|&c| c != b' ' && c != b'\t')
        .unwrap_or(value.len());
    let end = value
        .iter()
        .rposition(|&c| c != b' ' && c != b'\t')
        .map_or(start, |i| i + 1);
    start..end
}

#[inline]
pub(super) fn is_token(b: &[u8]) -> bool {
    crate::cgi::is_token(b)
}

/// A header line in one pass, for the usual line that breaks no rule: a non-empty token,
/// `:`, then field-value bytes. The colon's offset and the value's range (relative to what
/// follows the colon, without surrounding spaces and tabs, as [`trim_ows`] gives it);
/// `None` when any rule is broken, and [`CgiResponseDecoder::line_error`] says which.
#[inline]
pub(super) fn well_formed(line: &[u8]) -> Option<(usize, Range<usize>)> {
    let colon = line.iter().position(|&c| !crate::cgi::is_tchar(c))?;
    if colon == 0 || line.get(colon) != Some(&b':') {
        return None;
    }
    let raw_value = line.get(colon + 1..)?;
    let (mut start, mut end) = (raw_value.len(), 0);
    for (i, &c) in raw_value.iter().enumerate() {
        if c == b' ' || c == b'\t' {
            continue;
        }
        if c < b' ' || c == 0x7f {
            return None;
        }
        start = start.min(i);
        end = i + 1;
    }
    Some((colon, start..end.max(start)))
}

/// A header line found by [`clean_line`]: offsets relative to the line's start.
pub(super) struct CleanLine {
    /// The colon after the name.
    pub(super) colon: usize,
    /// The value, relative to what follows the colon, without surrounding spaces and tabs.
    pub(super) value: Range<usize>,
    /// The end of the line's content (its CR, or its LF when there is no CR).
    pub(super) end: usize,
    /// Past its LF.
    pub(super) next: usize,
}

/// The header line at the start of `rest` in one pass, when it is whole (its LF is there)
/// and breaks no rule: a non-empty token, `:`, field-value bytes, then LF or CRLF. `None`
/// for anything else (no LF yet, the blank line, a bare CR, a control byte, no colon), which
/// the caller then examines step by step. Finds the same LF, colon and value as those steps.
#[inline]
pub(super) fn clean_line(rest: &[u8]) -> Option<CleanLine> {
    let colon = token_len(rest);
    if colon == 0 || rest.get(colon) != Some(&b':') {
        return None;
    }
    let after = colon + 1;
    let raw_value = rest.get(after..)?;
    // The value runs to its first control byte, which must be the line's end; the spaces
    // around the value are trimmed once it is found.
    let stop = first_control(raw_value)?;
    let lf = match raw_value.get(stop) {
        Some(b'\n') => after + stop,
        Some(b'\r') if raw_value.get(stop + 1) == Some(&b'\n') => after + stop + 1,
        _ => return None,
    };
    Some(CleanLine {
        colon,
        value: trim_ows(raw_value.get(..stop)?),
        end: after + stop,
        next: lf + 1,
    })
}

/// The length of the run of token bytes at the start of `b`.
#[inline]
fn token_len(b: &[u8]) -> usize {
    crate::cgi::token_run(b)
}

/// The offset of the first byte of `b` that [`is_control`] refuses, eight bytes at a time.
/// In a word read little-endian, `(x - splat(0x20)) & !x & splat(0x80)` flags the bytes
/// below 0x20 and `x ^ splat(0x7f)` put through the same test (less 0x01) flags DEL; a
/// borrow only carries upwards, so the lowest flag of either is the first such byte. A tab
/// found that way is allowed, and the rest is then looked at a byte at a time.
#[inline]
pub(super) fn first_control(b: &[u8]) -> Option<usize> {
    const ONES: u64 = 0x0101_0101_0101_0101;
    const HIGHS: u64 = 0x8080_8080_8080_8080;
    let mut at = 0;
    while let Some(word) = b.get(at..).and_then(<[u8]>::first_chunk::<8>) {
        let x = u64::from_le_bytes(*word);
        let low = x.wrapping_sub(ONES * 0x20) & !x & HIGHS;
        let del = x ^ (ONES * 0x7f);
        let del = del.wrapping_sub(ONES) & !del & HIGHS;
        let hits = low | del;
        if hits != 0 {
            at += (hits.trailing_zeros() / 8) as usize;
            break;
        }
        at += 8;
    }
    let rest = b.get(at..)?;
    rest.iter().position(|&c| is_control(c)).map(|p| at + p)
}

/// Whether `c` may not stand in a field value: a control byte other than HTAB, or DEL.
#[inline]
pub(super) fn is_control(c: u8) -> bool {
    CONTROL.get(usize::from(c)).copied().unwrap_or(true)
}

/// [`is_control`] per byte.
#[allow(clippy::indexing_slicing)] // `c` runs over 0..256, the table's own length.
pub(super) const CONTROL: [bool; 256] = {
    let mut table = [false; 256];
    let mut c = 0;
    while c < 256 {
        table[c] = (c < 0x20 && c != 0x09) || c == 0x7f;
        c += 1;
    }
    table
};

/// Whether every byte is allowed in a field value (RFC 9110 §5.5: no controls but HTAB).
#[inline]
pub(super) fn is_field_value(mut bytes: impl Iterator<Item = u8>) -> bool {
    bytes.all(|c| (c >= b' ' || c == b'\t') && c != 0x7f)
}

/// `404 Not Found` → (404, range of `Not Found`); `204` → (204, empty range). Inlined into
/// its one caller, the parser's field step.
#[inline]
pub(super) fn parse_status(value: &[u8]) -> Result<(u16, Range<usize>), CgiResponseError> {
    let bad = || CgiResponseError::InvalidStatus {
        value: snippet(value),
    };
    let digits = value.get(..3).ok_or_else(bad)?;
    if !digits.iter().all(u8::is_ascii_digit) || digits.first() == Some(&b'0') {
        return Err(bad());
    }
    let code = digits
        .iter()
        .fold(0u16, |n, &d| n * 10 + u16::from(d - b'0'));
    let rest = value.get(3..).unwrap_or_default();
    if !rest.is_empty() && !matches!(rest.first(), Some(b' ' | b'\t')) {
        return Err(bad());
    }
    let reason = trim_ows(rest);
    Ok((code, reason.start + 3..reason.end + 3))
}

pub(super) fn check_location(value: &[u8]) -> Result<(), CgiResponseError> {
    if value.is_empty() || value.iter().any(|&c| c == b' ' || c == b'\t') {
        return Err(CgiResponseError::InvalidLocation {
            value: snippet(value),
        });
    }
    Ok(())
}
