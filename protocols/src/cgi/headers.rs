//! HTTP request headers to CGI variables (RFC 3875 §4.1.18): CONTENT_TYPE, CONTENT_LENGTH
//! and `HTTP_NAME`, with the headers that must not reach a backend left out (and named by
//! [`dropped_headers`] for a log).
//!
//! Left out: `Proxy` (httpoxy: it would become HTTP_PROXY, which HTTP client libraries read as
//! their outbound proxy), hop-by-hop headers (corral terminated that connection; a forwarded
//! `Transfer-Encoding: chunked` next to a de-chunked body makes WSGI frameworks read nothing),
//! any name containing `_`, and any other name with a byte outside `[A-Za-z0-9-]` (PHP turns
//! `.` and space in variable names into `_`, so `X-Auth.User` would arrive as
//! HTTP_X_AUTH_USER too). Because such names never pass, `X-Auth-User` and
//! `X_Auth_User` can never both map to HTTP_X_AUTH_USER, so one header cannot impersonate
//! another that the front server vetted.

use bytes::Bytes;

use super::params::CgiParams;
use super::{snippet, CgiError, DropReason, Dropped};
use crate::ascii::eq_ignore_case;

/// What one request header becomes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Class {
    /// Left out, for this reason.
    Dropped(DropReason),
    /// CONTENT_TYPE.
    ContentType,
    /// CONTENT_LENGTH.
    ContentLength,
    /// An `HTTP_*` variable.
    Http,
}

/// What one pass over a header name finds: whether every byte is a token character, and
/// whether it holds `_` or another byte outside `[A-Za-z0-9-]`.
#[derive(Debug, Clone, Copy)]
struct NameScan {
    token: bool,
    underscore: bool,
    other: bool,
}

/// Per byte: [`TOKEN`] for a token character (RFC 9110 §5.6.2), [`PLAIN`] for
/// `[A-Za-z0-9-]`, [`UNDERSCORE`] for `_`. One table, so a header name is read once for all
/// three questions: this runs for every header of every request.
const TOKEN: u8 = 1;
const PLAIN: u8 = 2;
const UNDERSCORE: u8 = 4;
#[allow(clippy::indexing_slicing)] // `c` runs over 0..256, the table's own length.
const NAME_BYTES: [u8; 256] = {
    let mut table = [0u8; 256];
    let mut c = 0;
    while c < 256 {
        let b = c as u8;
        let mut flags = 0;
        if super::is_tchar_const(b) {
            flags |= TOKEN;
        }
        if b.is_ascii_alphanumeric() || b == b'-' {
            flags |= PLAIN;
        }
        if b == b'_' {
            flags |= UNDERSCORE;
        }
        table[c] = flags;
        c += 1;
    }
    table
};

fn scan_name(name: &[u8]) -> NameScan {
    let (mut all, mut any) = (TOKEN | PLAIN, 0u8);
    for &c in name {
        let f = NAME_BYTES.get(usize::from(c)).copied().unwrap_or(0);
        all &= f;
        any |= f;
    }
    NameScan {
        token: !name.is_empty() && all & TOKEN != 0,
        underscore: any & UNDERSCORE != 0,
        other: all & PLAIN == 0,
    }
}

/// Where a header goes, by its name alone (the name is a token: [`check_headers`] ran). The
/// names with a meaning of their own are told apart by length first.
fn class_of(name: &[u8]) -> Class {
    class_from(name, scan_name(name))
}

fn class_from(name: &[u8], scan: NameScan) -> Class {
    let is = |known: &[u8]| eq_ignore_case(name, known);
    let hop = Class::Dropped(DropReason::HopByHop);
    let special = match name.len() {
        2 if is(b"te") => Some(hop),
        5 if is(b"proxy") => Some(Class::Dropped(DropReason::Httpoxy)),
        7 if is(b"upgrade") => Some(hop),
        10 if is(b"connection") || is(b"keep-alive") => Some(hop),
        12 if is(b"content-type") => Some(Class::ContentType),
        14 if is(b"content-length") => Some(Class::ContentLength),
        16 if is(b"proxy-connection") => Some(hop),
        17 if is(b"transfer-encoding") => Some(hop),
        _ => None,
    };
    if let Some(class) = special {
        return class;
    }
    if scan.underscore {
        Class::Dropped(DropReason::Underscore)
    } else if scan.other {
        Class::Dropped(DropReason::NameChars)
    } else {
        Class::Http
    }
}

/// The headers that pass the checks of [`encode_cgi_vars`](super::encode_cgi_vars) (names
/// are tokens, values free of control bytes) but are left out of the variables, and why: for
/// a log, made only when one is wanted (a kept-alive client's `Connection` is one on every
/// request, and reporting it cost two allocations each time).
pub fn dropped_headers<'a>(
    headers: &'a [(&'a [u8], &'a [u8])],
) -> impl Iterator<Item = Dropped> + 'a {
    headers
        .iter()
        .filter_map(|&(name, _)| match class_of(name) {
            Class::Dropped(reason) => Some(Dropped {
                name: Bytes::copy_from_slice(name),
                reason,
            }),
            _ => None,
        })
}

/// What the headers say about the body, found before any variable is written.
pub(super) struct BodyHeaders<'a> {
    /// CONTENT_TYPE, when given.
    pub content_type: Option<&'a [u8]>,
    /// CONTENT_LENGTH: `body_length` when known, else the Content-Length header's.
    pub content_length: Option<u64>,
}

/// What [`check_headers`] found: the body's headers, and which headers become `HTTP_*`
/// variables (so that [`push_http_vars`] does not classify them again).
pub(super) struct CheckedHeaders<'a> {
    /// CONTENT_TYPE and CONTENT_LENGTH.
    pub body: BodyHeaders<'a>,
    /// Bit `i` set: header `i` becomes an `HTTP_*` variable. Headers past the 64th are
    /// classified again when pushed.
    http: u64,
    /// Whether two headers may have the same name (in any letter case). When not, no header
    /// is looked for again among the others to merge repeats.
    may_repeat: bool,
}

/// A bit for a header name such that two names equal but for case get the same one: from
/// its length and its first letter.
fn name_bit(name: &[u8]) -> u64 {
    let first = name.first().map_or(0, u8::to_ascii_lowercase);
    1 << ((name.len().wrapping_mul(7) ^ usize::from(first)) % 64)
}

/// Headers whose class [`CheckedHeaders`] remembers.
const REMEMBERED: usize = 64;

/// Checks every header (names are tokens, values free of control bytes, one Content-Type,
/// agreeing Content-Lengths) and finds CONTENT_TYPE and CONTENT_LENGTH. `body_length`, when
/// known, is CONTENT_LENGTH and the Content-Length header is ignored. Allocates nothing: the
/// headers left out are named by [`dropped_headers`] when a log wants them.
pub(super) fn check_headers<'a>(
    headers: &[(&'a [u8], &'a [u8])],
    body_length: Option<u64>,
) -> Result<CheckedHeaders<'a>, CgiError> {
    let mut content_type: Option<&[u8]> = None;
    let mut content_length: Option<u64> = None;
    let mut http = 0u64;
    let (mut names, mut may_repeat) = (0u64, false);
    for (i, &(name, value)) in headers.iter().enumerate() {
        let bit = name_bit(name);
        may_repeat |= names & bit != 0;
        names |= bit;
        let scan = scan_name(name);
        if !scan.token {
            return Err(CgiError::InvalidHeaderName {
                name: snippet(name),
            });
        }
        if has_control(value) {
            return Err(CgiError::InvalidHeaderValue {
                name: snippet(name),
            });
        }
        match class_from(name, scan) {
            Class::Dropped(_) => {}
            Class::Http => {
                if i < REMEMBERED {
                    http |= 1 << i;
                }
            }
            Class::ContentType => {
                if content_type.replace(value).is_some() {
                    return Err(CgiError::RepeatedContentType);
                }
            }
            Class::ContentLength => {
                if body_length.is_none() {
                    let n = parse_content_length(value)?;
                    if content_length.replace(n).is_some_and(|prev| prev != n) {
                        return Err(CgiError::ConflictingContentLength);
                    }
                }
            }
        }
    }
    Ok(CheckedHeaders {
        body: BodyHeaders {
            content_type,
            content_length: body_length.or(content_length),
        },
        http,
        may_repeat,
    })
}

impl CheckedHeaders<'_> {
    /// Whether header `i` of `name` becomes an `HTTP_*` variable.
    fn is_http(&self, i: usize, name: &[u8]) -> bool {
        if i < REMEMBERED {
            self.http & (1 << i) != 0
        } else {
            class_of(name) == Class::Http
        }
    }
}

/// Appends the `HTTP_*` variables of `headers` (already passed by [`check_headers`]) in
/// first-arrival order: `HTTP_` and the name upper-cased with `-` as `_`, repeats merged into
/// the first (`; ` between cookies, `, ` otherwise). The names left are `[A-Za-z0-9-]`, so
/// two map to one variable only if equal but for case. Nothing is allocated unless a header
/// repeats.
pub(super) fn push_http_vars(
    headers: &[(&[u8], &[u8])],
    checked: &CheckedHeaders<'_>,
    out: &mut CgiParams,
) -> Result<(), CgiError> {
    let upper = |c: u8| {
        if c == b'-' {
            b'_'
        } else {
            c.to_ascii_uppercase()
        }
    };
    for (i, &(name, value)) in headers.iter().enumerate() {
        if !checked.is_http(i, name) {
            continue;
        }
        if !checked.may_repeat {
            out.push_mapped_name(b"HTTP_", name, upper, value)?;
            continue;
        }
        let same = |other: &(&[u8], &[u8])| other.0.eq_ignore_ascii_case(name);
        if headers.get(..i).unwrap_or_default().iter().any(same) {
            // Merged into its first occurrence.
            continue;
        }
        let later = headers.get(i + 1..).unwrap_or_default();
        if !later.iter().any(same) {
            out.push_mapped_name(b"HTTP_", name, upper, value)?;
            continue;
        }
        let mut joined = Vec::new();
        joined.extend_from_slice(value);
        let sep: &[u8] = if name.eq_ignore_ascii_case(b"cookie") {
            b"; "
        } else {
            b", "
        };
        for &(_, v) in later.iter().filter(|h| same(h)) {
            joined.extend_from_slice(sep);
            joined.extend_from_slice(v);
        }
        out.push_mapped_name(b"HTTP_", name, upper, &joined)?;
    }
    Ok(())
}

/// Whether `value` holds a control byte other than HTAB, or DEL. Eight bytes at a time: a
/// word with no byte under 0x20 and none equal to 0x7f is passed whole (the two tests are
/// exact, not estimates); a word that has one is looked at byte by byte, since HTAB is
/// allowed. This runs over every header value of every request.
fn has_control(value: &[u8]) -> bool {
    const ONES: u64 = 0x0101_0101_0101_0101;
    const HIGH: u64 = 0x8080_8080_8080_8080;
    let is_control = |c: u8| (c < b' ' && c != b'\t') || c == 0x7f;
    let mut words = value.chunks_exact(8);
    for word in words.by_ref() {
        let mut bytes = [0u8; 8];
        bytes.copy_from_slice(word);
        let w = u64::from_le_bytes(bytes);
        // A byte under 0x20: borrows through its high bit when 0x20 is taken from it.
        let low = w.wrapping_sub(ONES * 0x20) & !w & HIGH;
        // A byte equal to 0x7f: zero once xored with 0x7f.
        let x = w ^ (ONES * 0x7f);
        let del = x.wrapping_sub(ONES) & !x & HIGH;
        if (low | del) != 0 && word.iter().any(|&c| is_control(c)) {
            return true;
        }
    }
    words.remainder().iter().any(|&c| is_control(c))
}

/// A Content-Length value: one or more ASCII digits that fit in a u64.
fn parse_content_length(value: &[u8]) -> Result<u64, CgiError> {
    let bad = || CgiError::InvalidContentLength {
        value: snippet(value),
    };
    if value.is_empty() {
        return Err(bad());
    }
    value.iter().try_fold(0u64, |n, &c| {
        if !c.is_ascii_digit() {
            return Err(bad());
        }
        n.checked_mul(10)
            .and_then(|n| n.checked_add(u64::from(c - b'0')))
            .ok_or_else(bad)
    })
}

/// [`scan_name`]'s answers (token, holds `_`, holds a byte outside `[A-Za-z0-9-]`), for the
/// property test that holds them to the separate questions.
#[cfg(test)]
pub(super) fn scan_name_for_tests(name: &[u8]) -> (bool, bool, bool) {
    let s = scan_name(name);
    (s.token, s.underscore, s.other)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use proptest::prelude::*;

    use super::*;

    proptest! {
        /// Names equal but for case share their bit, so a repeat is never missed.
        #[test]
        fn a_name_in_any_case_has_one_bit(name in "[A-Za-z0-9-]{0,20}") {
            let bit = name_bit(name.as_bytes());
            prop_assert_eq!(bit, name_bit(name.to_ascii_lowercase().as_bytes()));
            prop_assert_eq!(bit, name_bit(name.to_ascii_uppercase().as_bytes()));
        }
    }

    proptest! {
        /// The word-at-a-time test answers as a look at every byte.
        #[test]
        fn control_bytes_are_found_in_any_word(
            value in prop::collection::vec(
                prop::sample::select(&b"aZ \t\x00\x1f\x7f\x80\xff~"[..]),
                0..40,
            )
        ) {
            let bytewise = value.iter().any(|&c| (c < b' ' && c != b'\t') || c == 0x7f);
            prop_assert_eq!(has_control(&value), bytewise);
        }
    }

    #[test]
    fn repeats_in_another_case_are_merged() {
        let headers: &[(&[u8], &[u8])] = &[
            (b"Cookie", b"a=1"),
            (b"Accept", b"*/*"),
            (b"COOKIE", b"b=2"),
        ];
        let checked = check_headers(headers, None).unwrap();
        assert!(checked.may_repeat);
        let mut out = CgiParams::default();
        push_http_vars(headers, &checked, &mut out).unwrap();
        let pairs: Vec<_> = out.iter().collect();
        assert_eq!(
            pairs,
            [
                (&b"HTTP_COOKIE"[..], &b"a=1; b=2"[..]),
                (b"HTTP_ACCEPT", b"*/*")
            ]
        );
        let distinct: &[(&[u8], &[u8])] = &[(b"Cookie", b"a=1"), (b"Accept", b"*/*")];
        assert!(!check_headers(distinct, None).unwrap().may_repeat);
    }
}
