//! What the http front sends back: the backend's response headers filtered for the client,
//! corral's own short answers (errors, refusals), and which backend bodies are not sent.

use bytes::Bytes;
use http::header::{HeaderName, HeaderValue};
use http::{Response, StatusCode};

use crate::front::sendfile;
use crate::gateway::{GatewayBody, GatewayError};
use crate::protocols::ascii::eq_ignore_case;

use super::{FrontBody, HttpBody};

/// Lets go of a backend body that is not sent (a file replaces it): its rest is read and
/// thrown away after the answer, within bounds, so that its connection can be kept
/// (`GatewayBody::discard_unsent`).
pub(super) fn discard(mut body: GatewayBody) {
    body.discard_unsent();
}

/// Whether hyper sends the body of an answer with `status` to a `method` request: never for
/// HEAD, 204 or 304 (RFC 9110 §§9.3.2, 15.3.5, 15.4.5), whose body it drops unread. The
/// 1xx statuses, which carry none either, never reach it from a backend.
pub(super) fn sends_body(method: &http::Method, status: StatusCode) -> bool {
    !(method == http::Method::HEAD
        || status == StatusCode::NO_CONTENT
        || status == StatusCode::NOT_MODIFIED)
}

/// The backend's response headers that may reach the client: without `Status:`, the
/// hop-by-hop ones, those its `Connection` names, and the instructions meant for a proxy
/// (X-Sendfile, X-Accel-*). With `for_file`, also without the ones that described the
/// backend's body, which a file corral sends replaces. They are written into `into`, emptied
/// first, so that a map already allocated serves again.
///
/// One pass: each name is told apart once ([`classify`]); the rare headers a `Connection`
/// header names are taken out of the map afterwards.
pub(super) fn client_headers(
    backend: &[(Bytes, Bytes)],
    request_id: u64,
    for_file: bool,
    into: http::HeaderMap,
) -> http::HeaderMap {
    let mut out = into;
    out.clear();
    let mut connection = false;
    for (name, value) in backend {
        let known = match classify(name) {
            Class::Never => continue,
            Class::Hop { connection: named } => {
                // It described the backend's hop, which corral terminated; hyper frames the
                // client's side itself.
                connection |= named;
                dropped_hop(request_id, name);
                continue;
            }
            Class::Body(_) if for_file => continue,
            Class::Body(known) => Some(known),
            Class::Pass(known) => known,
        };
        let name_ok = match known {
            Some(known) => Ok(known),
            None => HeaderName::from_bytes(name),
        };
        match (name_ok, HeaderValue::from_maybe_shared(value.clone())) {
            (Ok(n), Ok(v)) => {
                out.append(n, v);
            }
            _ => {
                tracing::warn!(
                    request_id,
                    header = %crate::logs::escaped(name),
                    "dropped a backend response header that is not valid HTTP"
                );
            }
        }
    }
    if connection {
        drop_named_by_connection(backend, request_id, &mut out);
    }
    out
}

fn dropped_hop(request_id: u64, name: &[u8]) {
    tracing::debug!(
        request_id,
        header = %String::from_utf8_lossy(name),
        "dropped a hop-by-hop header from the backend response"
    );
}

/// Takes out of `out` every header a `Connection` header of the backend names (hop-by-hop
/// too, RFC 9110 §7.6.1).
fn drop_named_by_connection(
    backend: &[(Bytes, Bytes)],
    request_id: u64,
    out: &mut http::HeaderMap,
) {
    let tokens = backend
        .iter()
        .filter(|(n, _)| n.eq_ignore_ascii_case(b"connection"))
        .flat_map(|(_, v)| v.split(|&c| c == b','))
        .map(<[u8]>::trim_ascii);
    for token in tokens {
        if let Ok(name) = HeaderName::from_bytes(token) {
            if out.remove(&name).is_some() {
                dropped_hop(request_id, token);
            }
        }
    }
}

/// What the http front does with a backend response header of this name.
#[derive(Debug, PartialEq, Eq)]
enum Class {
    /// `Status:` or an instruction meant for a proxy: never sent on.
    Never,
    /// Hop-by-hop (RFC 9110 §7.6.1): dropped; `connection` when it is `Connection`, which
    /// names more of them.
    Hop { connection: bool },
    /// It describes the backend's body: sent, but not with a file that replaces the body.
    Body(HeaderName),
    /// Sent on; the names nearly every response carries are given as http's constants
    /// (`HeaderName::from_bytes` parsed each through its table on every response).
    Pass(Option<HeaderName>),
}

/// Tells a name apart by its length and first letter, then one comparison: the usual header
/// is compared once, not against every list it is not in.
fn classify(name: &[u8]) -> Class {
    use http::header;
    let is = |known: &[u8]| eq_ignore_case(name, known);
    let hop = Class::Hop { connection: false };
    match (name.len(), name.first().map_or(0, u8::to_ascii_lowercase)) {
        (12, b'c') if is(b"content-type") => Class::Pass(Some(header::CONTENT_TYPE)),
        (14, b'c') if is(b"content-length") => Class::Body(header::CONTENT_LENGTH),
        (13, b'c') if is(b"content-range") => Class::Body(header::CONTENT_RANGE),
        (16, b'c') if is(b"content-encoding") => Class::Body(header::CONTENT_ENCODING),
        (13, b'c') if is(b"cache-control") => Class::Pass(Some(header::CACHE_CONTROL)),
        (10, b'c') if is(b"connection") => Class::Hop { connection: true },
        (10, b's') if is(b"set-cookie") => Class::Pass(Some(header::SET_COOKIE)),
        (6, b's') if is(b"status") => Class::Never,
        (8, b'l') if is(b"location") => Class::Pass(Some(header::LOCATION)),
        (7, b'e') if is(b"expires") => Class::Pass(Some(header::EXPIRES)),
        (10, b'k') if is(b"keep-alive") => hop,
        (16, b'p') if is(b"proxy-connection") => hop,
        (2, b't') if is(b"te") => hop,
        (7, b't') if is(b"trailer") => hop,
        (17, b't') if is(b"transfer-encoding") => hop,
        (7, b'u') if is(b"upgrade") => hop,
        (_, b'x') if sendfile::is_proxy_instruction(name) => Class::Never,
        _ => Class::Pass(None),
    }
}

pub(in crate::front) fn error_response(request_id: u64, e: &GatewayError) -> Response<HttpBody> {
    e.log(request_id);
    let status = e.status();
    let code = StatusCode::from_u16(status).unwrap_or(StatusCode::BAD_GATEWAY);
    let reason = code.canonical_reason().unwrap_or("Error");
    let mut resp = plain(code, &format!("{status} {reason}\n"));
    if let Some(secs) = e.retry_after() {
        resp.headers_mut()
            .insert(http::header::RETRY_AFTER, HeaderValue::from(secs));
    }
    if code == StatusCode::REQUEST_TIMEOUT {
        // The rest of the body may still come, slowly: do not wait for it.
        resp.headers_mut()
            .insert(http::header::CONNECTION, HeaderValue::from_static("close"));
    }
    resp
}

pub(in crate::front) fn plain(code: StatusCode, text: &str) -> Response<HttpBody> {
    let mut resp = Response::new(FrontBody::full(Bytes::copy_from_slice(text.as_bytes())));
    *resp.status_mut() = code;
    resp.headers_mut().insert(
        http::header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    resp
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The lists `classify` stands for, spelled out as they read in the RFCs.
    fn by_lists(name: &[u8]) -> Class {
        let any = |list: &[&[u8]]| list.iter().any(|h| name.eq_ignore_ascii_case(h));
        if name.eq_ignore_ascii_case(b"status") || sendfile::is_proxy_instruction(name) {
            return Class::Never;
        }
        if any(&[
            b"connection",
            b"keep-alive",
            b"proxy-connection",
            b"te",
            b"trailer",
            b"transfer-encoding",
            b"upgrade",
        ]) {
            return Class::Hop {
                connection: name.eq_ignore_ascii_case(b"connection"),
            };
        }
        if any(&[b"content-length", b"content-range", b"content-encoding"]) {
            return Class::Body(HeaderName::from_bytes(name).unwrap_or(http::header::AGE));
        }
        Class::Pass(None)
    }

    #[test]
    fn a_name_is_classed_as_the_lists_say_and_a_known_one_is_the_one_from_bytes_parses() {
        for name in [
            &b"Content-Type"[..],
            b"content-length",
            b"Content-Range",
            b"CONTENT-ENCODING",
            b"SET-COOKIE",
            b"Cache-Control",
            b"location",
            b"Expires",
            b"X-Powered-By",
            b"Content-Typo",
            b"Status",
            b"statuses",
            b"X-Sendfile",
            b"x-accel-redirect",
            b"X-Accel",
            b"Connection",
            b"Keep-Alive",
            b"Proxy-Connection",
            b"TE",
            b"tE",
            b"Trailer",
            b"Transfer-Encoding",
            b"Upgrade",
            b"Upgrades",
            b"",
            b"x",
        ] {
            let class = classify(name);
            match (&class, by_lists(name)) {
                (Class::Pass(known), Class::Pass(None)) => {
                    if let Some(known) = known {
                        assert_eq!(Some(known), HeaderName::from_bytes(name).ok().as_ref());
                    }
                }
                (class, listed) => assert_eq!(*class, listed, "{}", name.escape_ascii()),
            }
        }
    }

    #[test]
    fn headers_a_connection_header_names_stay_behind() {
        let h = |n: &'static str, v: &'static str| (Bytes::from(n), Bytes::from(v));
        let backend = [
            h("Status", "200 OK"),
            h("Content-Type", "text/plain"),
            h("X-Private", "1"),
            h("Connection", "close, X-Private"),
            h("x-private", "2"),
            h("Keep-Alive", "timeout=5"),
            h("X-Accel-Buffering", "no"),
            h("X-Kept", "yes"),
            h("Content-Length", "3"),
        ];
        let out = client_headers(&backend, 1, false, http::HeaderMap::new());
        // Sorted: a removal may move the map's last entry into its place.
        let sorted = |map: &http::HeaderMap| {
            let mut names: Vec<String> = map.keys().map(|n| n.as_str().to_owned()).collect();
            names.sort();
            names
        };
        assert_eq!(sorted(&out), ["content-length", "content-type", "x-kept"]);
        let file = client_headers(&backend, 1, true, out);
        assert_eq!(sorted(&file), ["content-type", "x-kept"]);
    }
}
