//! What the head of an HTTP request says before it is routed: the refusals decided by the
//! head alone, the host asked for, and what a trusted proxy says of the client (its address
//! and whether it came over HTTPS).

use http::header::{HeaderMap, HeaderValue};
use http::StatusCode;

use crate::config::{ForwardedHeader, ForwardedTrust};
use crate::front::listener::Peer;
use crate::protocols::ascii::eq_ignore_case;
use crate::protocols::cgi::{check_host, CgiError};

use super::ConnInfo;

/// The header fields the front itself reads, found in one pass over the head: looking each
/// up by name hashed the name every time, and five lookups per request cost more than
/// reading every field once.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct HeadFields<'a> {
    /// The first Host field, and how many there are.
    pub host: Option<&'a HeaderValue>,
    pub hosts: usize,
    /// The first Transfer-Encoding field, and how many there are.
    pub transfer_encoding: Option<&'a HeaderValue>,
    pub transfer_encodings: usize,
    /// The first Content-Length field.
    pub content_length: Option<&'a HeaderValue>,
    /// Whether a Connection field names `keep-alive` (what an HTTP/1.0 client asks with).
    pub keep_alive: bool,
}

impl<'a> HeadFields<'a> {
    pub(super) fn of(headers: &'a HeaderMap) -> HeadFields<'a> {
        let mut fields = HeadFields::default();
        for (name, value) in headers {
            if name == http::header::HOST {
                fields.host = fields.host.or(Some(value));
                fields.hosts += 1;
            } else if name == http::header::TRANSFER_ENCODING {
                fields.transfer_encoding = fields.transfer_encoding.or(Some(value));
                fields.transfer_encodings += 1;
            } else if name == http::header::CONTENT_LENGTH {
                fields.content_length = fields.content_length.or(Some(value));
            } else if name == http::header::CONNECTION {
                // The usual value, the token alone, before the list is split.
                let value = value.as_bytes();
                fields.keep_alive |= eq_ignore_case(value, b"keep-alive")
                    || value
                        .split(|&c| c == b',')
                        .any(|t| eq_ignore_case(t.trim_ascii(), b"keep-alive"));
            }
        }
        fields
    }
}

/// Refusals decided by the request head alone, before routing:
/// - CONNECT: corral is not a forward proxy (405);
/// - a Transfer-Encoding other than exactly `chunked` (501: no other coding is supported).
///   hyper itself answers 400 when `chunked` is not the last coding (RFC 9112 §6.3), and when
///   Transfer-Encoding and Content-Length come together it frames by the former, drops the
///   latter and closes the connection after the answer, so bytes smuggled after the chunked
///   body are never read as a request;
/// - more than one Host, none in an HTTP/1.1 request, one that is no host name
///   (`check_host`), or an absolute-form target whose authority is not the Host (400, RFC
///   9112 §3.2).
pub(super) fn check_head(
    parts: &http::request::Parts,
    fields: &HeadFields<'_>,
) -> Result<(), (StatusCode, &'static str)> {
    if parts.method == http::Method::CONNECT {
        return Err((StatusCode::METHOD_NOT_ALLOWED, "CONNECT is not served"));
    }
    if let Some(first) = fields.transfer_encoding {
        let chunked = first
            .as_bytes()
            .trim_ascii()
            .eq_ignore_ascii_case(b"chunked");
        if !chunked || fields.transfer_encodings > 1 {
            return Err((
                StatusCode::NOT_IMPLEMENTED,
                "only Transfer-Encoding: chunked is supported",
            ));
        }
    }
    let host = fields.host;
    if fields.hosts > 1 {
        return Err((StatusCode::BAD_REQUEST, "more than one Host header"));
    }
    // What names the host routes the request and may become SERVER_NAME: it must look like
    // a host name (no `/`, `\`, control, empty or `..` label), as nginx requires.
    let named = host
        .map(HeaderValue::as_bytes)
        .or_else(|| parts.uri.authority().map(|a| a.as_str().as_bytes()));
    if let Some(Err(CgiError::InvalidHost { reason, .. })) = named.map(check_host) {
        return Err((StatusCode::BAD_REQUEST, reason));
    }
    match (host, parts.uri.authority()) {
        (None, _) if parts.version == http::Version::HTTP_11 => {
            Err((StatusCode::BAD_REQUEST, "an HTTP/1.1 request without Host"))
        }
        (Some(h), Some(authority))
            if !h
                .as_bytes()
                .eq_ignore_ascii_case(authority.as_str().as_bytes()) =>
        {
            Err((
                StatusCode::BAD_REQUEST,
                "the Host header does not match the request target's authority",
            ))
        }
        _ => Ok(()),
    }
}

/// The host name the client asked for, lowercase and without its port.
pub(super) fn host_of<'a>(
    parts: &'a http::request::Parts,
    fields: &HeadFields<'a>,
) -> std::borrow::Cow<'a, str> {
    let raw = parts
        .uri
        .host()
        .or_else(|| fields.host?.to_str().ok())
        .unwrap_or("");
    let host = if raw.starts_with('[') {
        raw.split_inclusive(']').next().unwrap_or(raw)
    } else {
        // A byte search, not `split(':')`: the string searcher cost more than the rest of
        // this function.
        match raw.bytes().position(|c| c == b':') {
            Some(colon) => raw.get(..colon).unwrap_or(raw),
            None => raw,
        }
    };
    if host.bytes().any(|c| c.is_ascii_uppercase()) {
        std::borrow::Cow::Owned(host.to_ascii_lowercase())
    } else {
        std::borrow::Cow::Borrowed(host)
    }
}

/// Whether the peer is one whose forwarded headers are believed: any peer of a Unix listener
/// (its file permissions restrict who connects), or a TCP peer in `trusted_proxies`.
fn trusted_peer(info: &ConnInfo) -> Option<&ForwardedTrust> {
    let trust = info.forwarded.as_ref()?;
    let trusted = match info.peer {
        Peer::Unix => true,
        Peer::Tcp(addr) => trust.trusted_proxies.iter().any(|c| c.contains(addr.ip())),
    };
    trusted.then_some(trust)
}

/// The client address a trusted proxy names: the last `X-Forwarded-For` entry, or the last
/// `Forwarded` element's `for=` (the one the trusted proxy itself added; earlier entries came
/// from farther away and are not believed). Only a well-formed IP address is taken.
pub(super) fn forwarded_client(
    info: &ConnInfo,
    headers: &http::HeaderMap,
) -> Option<std::net::IpAddr> {
    let trust = trusted_peer(info)?;
    let last = |name: http::header::HeaderName| {
        headers
            .get_all(name)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(','))
            .last()
            .map(str::trim)
    };
    match trust.header {
        ForwardedHeader::None => None,
        ForwardedHeader::XForwarded => {
            last(http::header::HeaderName::from_static("x-forwarded-for"))?
                .parse()
                .ok()
        }
        ForwardedHeader::Forwarded => {
            let element = last(http::header::FORWARDED)?;
            let value = element.split(';').find_map(|pair| {
                let (k, v) = pair.split_once('=')?;
                k.trim().eq_ignore_ascii_case("for").then(|| v.trim())
            })?;
            // `for=192.0.2.7`, `for="192.0.2.7:4711"`, `for="[2001:db8::1]:4711"`.
            let value = value.trim_matches('"');
            if let Some(v6) = value.strip_prefix('[') {
                return v6.split(']').next()?.parse().ok();
            }
            value
                .parse()
                .ok()
                .or_else(|| value.rsplit_once(':')?.0.parse().ok())
        }
    }
}

/// Whether a trusted proxy says the client came over HTTPS. Only the configured header is
/// read, and only from a peer in `trusted_proxies` (any peer of a Unix listener, which its
/// file permissions already restrict); everyone else's header is ignored.
pub(super) fn forwarded_https(info: &ConnInfo, headers: &http::HeaderMap) -> bool {
    let Some(trust) = trusted_peer(info) else {
        return false;
    };
    match trust.header {
        ForwardedHeader::None => false,
        // Each proxy appends its own value, so the last one is what the trusted proxy (the
        // peer) saw; earlier ones came from farther away and are not believed.
        ForwardedHeader::XForwarded => headers
            .get_all("x-forwarded-proto")
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(','))
            .last()
            .is_some_and(|proto| proto.trim().eq_ignore_ascii_case("https")),
        ForwardedHeader::Forwarded => headers
            .get_all(http::header::FORWARDED)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(','))
            .last()
            .is_some_and(|element| {
                element.split(';').any(|pair| {
                    pair.split_once('=').is_some_and(|(k, v)| {
                        k.trim().eq_ignore_ascii_case("proto")
                            && v.trim().trim_matches('"').eq_ignore_ascii_case("https")
                    })
                })
            }),
    }
}
