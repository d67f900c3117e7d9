//! Percent-decoding and dot-segment normalisation of a request path, the steps
//! `super::path` takes before it splits SCRIPT_NAME from PATH_INFO: `%XX` escapes decoded
//! (an encoded `/` refused), NUL, CR, LF and `\` refused, and `.`, `..` and empty segments
//! resolved without ever climbing above the root.

use super::{snippet, CgiError};

/// Decodes `%XX` escapes; refuses bad escapes and an encoded `/`.
pub(super) fn percent_decode(raw: &[u8]) -> Result<Vec<u8>, CgiError> {
    if !raw.contains(&b'%') {
        return Ok(raw.to_vec());
    }
    let mut out = Vec::with_capacity(raw.len());
    let mut rest = raw;
    while let Some((&c, tail)) = rest.split_first() {
        if c != b'%' {
            out.push(c);
            rest = tail;
            continue;
        }
        let byte = match (
            tail.first().and_then(|&h| hex(h)),
            tail.get(1).and_then(|&l| hex(l)),
        ) {
            (Some(h), Some(l)) => h << 4 | l,
            _ => return Err(CgiError::BadPercentEscape { path: snippet(raw) }),
        };
        if byte == b'/' {
            return Err(CgiError::EncodedSlash { path: snippet(raw) });
        }
        out.push(byte);
        rest = tail.get(2..).unwrap_or_default();
    }
    Ok(out)
}

fn hex(c: u8) -> Option<u8> {
    match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        b'A'..=b'F' => Some(c - b'A' + 10),
        _ => None,
    }
}

/// Refuses NUL, CR, LF and `\` in a decoded path.
pub(super) fn check_decoded(decoded: &[u8]) -> Result<(), CgiError> {
    if let Some(&byte) = decoded.iter().find(|&&c| matches!(c, 0 | b'\r' | b'\n')) {
        return Err(CgiError::ForbiddenPathByte { byte });
    }
    if decoded.contains(&b'\\') {
        return Err(CgiError::Backslash {
            path: snippet(decoded),
        });
    }
    Ok(())
}

/// Removes empty and `.` segments and resolves `..` (RFC 3986 §5.2.4). A `..` with nothing
/// left to remove is [`CgiError::EscapesRoot`]; with `allow_dotdot == false` every `..` is.
/// The result starts with `/` and keeps a trailing `/` (a path ending in `.` or `..` names
/// a directory too).
pub(super) fn normalize(path: &[u8], allow_dotdot: bool) -> Result<Vec<u8>, CgiError> {
    let mut out = Vec::with_capacity(path.len() + 2);
    if path.first() != Some(&b'/') {
        out.push(b'/');
    }
    out.extend_from_slice(path);
    normalize_in_place(&mut out, allow_dotdot).map_err(|()| CgiError::EscapesRoot {
        path: snippet(path),
    })?;
    Ok(out)
}

/// [`normalize`] of a path that starts with `/`, rewritten where it lies; `Err` when a `..`
/// would climb above the root (or any `..` with `allow_dotdot == false`).
///
/// Segments are read at `r` and written back at `w`, each after one `/`. The `/` before the
/// segment at `r` lies at `r - 1`, and `w` never passes it (what is written is never longer
/// than what was read), so nothing is overwritten before it is read.
pub(super) fn normalize_in_place(buf: &mut Vec<u8>, allow_dotdot: bool) -> Result<(), ()> {
    debug_assert_eq!(buf.first(), Some(&b'/'));
    let len = buf.len();
    let (mut r, mut w) = (1, 0);
    let mut dir = true;
    while r <= len {
        let end = buf
            .get(r..)
            .and_then(|rest| rest.iter().position(|&c| c == b'/'))
            .map_or(len, |i| r + i);
        match buf.get(r..end).unwrap_or_default() {
            b"" | b"." => dir = true,
            b".." if allow_dotdot => {
                w = buf
                    .get(..w)
                    .and_then(|kept| kept.iter().rposition(|&c| c == b'/'))
                    .ok_or(())?;
                dir = true;
            }
            b".." => return Err(()),
            _ => {
                if let Some(slash) = buf.get_mut(w) {
                    *slash = b'/';
                }
                buf.copy_within(r..end, w + 1);
                w += 1 + (end - r);
                dir = false;
            }
        }
        r = end + 1;
    }
    buf.truncate(w);
    if dir || buf.is_empty() {
        buf.push(b'/');
    }
    Ok(())
}

/// [`check_decoded`], then [`is_normal`], in one pass: each byte classed by one table load,
/// the first NUL, CR or LF refused at once, a `\` refused once no such byte follows it (as
/// `check_decoded` orders them), and the segments judged as they end.
pub(super) fn checked_is_normal(path: &[u8]) -> Result<bool, CgiError> {
    let first = path.first().copied();
    if let Some(byte) = first.filter(|&b| path_class(b) == FORBIDDEN) {
        return Err(CgiError::ForbiddenPathByte { byte });
    }
    let mut normal = first == Some(b'/');
    let mut backslash = first == Some(b'\\');
    // The segment being read: its length and how many of its bytes are dots.
    let (mut len, mut dots) = (0usize, 0usize);
    for &byte in path.get(1..).unwrap_or_default() {
        match path_class(byte) {
            PLAIN => len += 1,
            DOT => {
                len += 1;
                dots += 1;
            }
            SLASH => {
                // An empty, `.` or `..` segment before another is not normal form.
                normal &= len != 0 && (len != dots || dots > 2);
                (len, dots) = (0, 0);
            }
            BACKSLASH => {
                backslash = true;
                len += 1;
            }
            _ => return Err(CgiError::ForbiddenPathByte { byte }),
        }
    }
    // The last segment may be empty (a trailing `/`), not `.` or `..`.
    normal &= len == 0 || len != dots || dots > 2;
    if backslash {
        return Err(CgiError::Backslash {
            path: snippet(path),
        });
    }
    Ok(normal)
}

/// A path byte, by what [`checked_is_normal`] makes of it.
const PLAIN: u8 = 0;
const DOT: u8 = 1;
const SLASH: u8 = 2;
const BACKSLASH: u8 = 3;
const FORBIDDEN: u8 = 4;

/// A byte's class (a `u8` indexes the 256 entries: no bound to check).
#[inline(always)]
fn path_class(byte: u8) -> u8 {
    PATH_CLASS
        .get(usize::from(byte))
        .copied()
        .unwrap_or(FORBIDDEN)
}

#[allow(clippy::indexing_slicing)] // Constant indexes below 256, the table's length.
static PATH_CLASS: [u8; 256] = {
    let mut table = [PLAIN; 256];
    table[0] = FORBIDDEN;
    table[b'\r' as usize] = FORBIDDEN;
    table[b'\n' as usize] = FORBIDDEN;
    table[b'.' as usize] = DOT;
    table[b'/' as usize] = SLASH;
    table[b'\\' as usize] = BACKSLASH;
    table
};

/// Whether `path` is what [`normalize`] would make of it: it starts with `/`, and no segment
/// is empty, `.` or `..` (the last may be empty: a trailing `/`).
pub(super) fn is_normal(path: &[u8]) -> bool {
    let Some(rest) = path.strip_prefix(b"/") else {
        return false;
    };
    let mut segments = rest.split(|&c| c == b'/').peekable();
    while let Some(segment) = segments.next() {
        let last = segments.peek().is_none();
        match segment {
            b"" if last => {}
            b"" | b"." | b".." => return false,
            _ => {}
        }
    }
    true
}

#[cfg(test)]
#[path = "normal_tests.rs"]
mod tests;
