//! HTTP request headers to CGI variables (RFC 3875 §4.1.18): CONTENT_TYPE, CONTENT_LENGTH
//! and `HTTP_NAME`, with the headers that must not reach a backend left out and reported.
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

use super::{is_token, snippet, CgiError, DropReason, Dropped};

/// Hop-by-hop headers (RFC 9110 §7.6.1), lower case.
const HOP_BY_HOP: [&[u8]; 6] = [
    b"connection",
    b"keep-alive",
    b"proxy-connection",
    b"te",
    b"transfer-encoding",
    b"upgrade",
];

/// Headers turned into CGI variables.
pub(super) struct MappedHeaders {
    /// CONTENT_TYPE, empty when absent.
    pub content_type: Bytes,
    /// CONTENT_LENGTH, empty when there is no body length.
    pub content_length: Bytes,
    /// HTTP_* variables in first-arrival order, repeats merged.
    pub http: Vec<(Bytes, Bytes)>,
    /// Headers left out.
    pub dropped: Vec<Dropped>,
}

/// Maps `headers` to CGI variables. `body_length`, when known, is CONTENT_LENGTH and the
/// Content-Length header is ignored.
pub(super) fn map_headers(
    headers: &[(&[u8], &[u8])],
    body_length: Option<u64>,
) -> Result<MappedHeaders, CgiError> {
    // Every request of the HTTP front comes through here, so nothing is allocated per header
    // but the variable itself: names are compared without case instead of lowered first, and
    // a repeat (rare) is found by a scan of the few variables made so far.
    let mut http: Vec<(Vec<u8>, Vec<u8>)> = Vec::with_capacity(headers.len());
    let mut dropped = Vec::new();
    let mut content_type: Option<&[u8]> = None;
    let mut content_length: Option<u64> = None;
    for &(name, value) in headers {
        if !is_token(name) {
            return Err(CgiError::InvalidHeaderName {
                name: snippet(name),
            });
        }
        if value.iter().any(|&c| (c < b' ' && c != b'\t') || c == 0x7f) {
            return Err(CgiError::InvalidHeaderValue {
                name: snippet(name),
            });
        }
        let is = |known: &[u8]| name.eq_ignore_ascii_case(known);
        let reason = if is(b"proxy") {
            Some(DropReason::Httpoxy)
        } else if HOP_BY_HOP.iter().any(|h| is(h)) {
            Some(DropReason::HopByHop)
        } else if name.contains(&b'_') {
            Some(DropReason::Underscore)
        } else if !name.iter().all(|&c| c.is_ascii_alphanumeric() || c == b'-') {
            Some(DropReason::NameChars)
        } else {
            None
        };
        if let Some(reason) = reason {
            dropped.push(Dropped {
                name: Bytes::copy_from_slice(name),
                reason,
            });
            continue;
        }
        if is(b"content-type") {
            if content_type.replace(value).is_some() {
                return Err(CgiError::RepeatedContentType);
            }
        } else if is(b"content-length") {
            if body_length.is_none() {
                let n = parse_content_length(value)?;
                if content_length.replace(n).is_some_and(|prev| prev != n) {
                    return Err(CgiError::ConflictingContentLength);
                }
            }
        } else {
            // HTTP_ + the name upper-cased with '-' as '_'; the checks above leave only
            // [A-Za-z0-9-] in it, so two names map to one variable only if equal but for case.
            let existing = http
                .iter_mut()
                .find(|(n, _)| variable_of(n.get(5..).unwrap_or_default(), name));
            match existing {
                Some((_, merged)) => {
                    merged.extend_from_slice(if is(b"cookie") { b"; " } else { b", " });
                    merged.extend_from_slice(value);
                }
                None => {
                    let mut cgi_name = Vec::with_capacity(name.len() + 5);
                    cgi_name.extend_from_slice(b"HTTP_");
                    cgi_name.extend(name.iter().map(|&c| {
                        if c == b'-' {
                            b'_'
                        } else {
                            c.to_ascii_uppercase()
                        }
                    }));
                    http.push((cgi_name, value.to_vec()));
                }
            }
        }
    }
    let content_length = body_length
        .or(content_length)
        .map(|n| Bytes::from(n.to_string()))
        .unwrap_or_default();
    Ok(MappedHeaders {
        content_type: content_type.map(Bytes::copy_from_slice).unwrap_or_default(),
        content_length,
        http: http
            .into_iter()
            .map(|(n, v)| (Bytes::from(n), Bytes::from(v)))
            .collect(),
        dropped,
    })
}

/// Whether the tail of a CGI variable name (`X_FORWARDED_FOR`) is what header `name`
/// (`x-forwarded-for`) maps to.
fn variable_of(tail: &[u8], name: &[u8]) -> bool {
    tail.len() == name.len()
        && tail.iter().zip(name).all(|(&v, &h)| {
            v == if h == b'-' {
                b'_'
            } else {
                h.to_ascii_uppercase()
            }
        })
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
