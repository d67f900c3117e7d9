//! What the http front sends back: the backend's response headers filtered for the client,
//! corral's own short answers (errors, refusals), and the drain of a backend body that is not
//! sent.

use bytes::Bytes;
use http::header::{HeaderName, HeaderValue};
use http::{Response, StatusCode};

use crate::front::sendfile;
use crate::gateway::{GatewayBody, GatewayError};

use super::{FrontBody, HttpBody};

/// Response bytes of a backend body that corral reads and drops, so that its connection can
/// be kept; past this the body is dropped (the exchange is aborted, as for a client gone).
const DRAIN_MAX: usize = 64 * 1024;

/// Reads a backend body that will not be sent to its end, within [`DRAIN_MAX`].
pub(super) async fn drain(mut body: GatewayBody) {
    let mut read = 0usize;
    while let Some(Ok(chunk)) = body.next_chunk().await {
        read = read.saturating_add(chunk.len());
        if read > DRAIN_MAX {
            break;
        }
    }
}

/// The backend's response headers that may reach the client: without `Status:`, the
/// hop-by-hop ones, those its `Connection` names, and the instructions meant for a proxy
/// (X-Sendfile, X-Accel-*). With `for_file`, also without the ones that described the
/// backend's body, which a file corral sends replaces. They are written into `into`, emptied
/// first, so that a map already allocated serves again.
pub(super) fn client_headers(
    backend: &[(Bytes, Bytes)],
    request_id: u64,
    for_file: bool,
    into: http::HeaderMap,
) -> http::HeaderMap {
    let mut out = into;
    out.clear();
    let has_connection = backend
        .iter()
        .any(|(n, _)| n.eq_ignore_ascii_case(b"connection"));
    for (name, value) in backend {
        if name.eq_ignore_ascii_case(b"status") || sendfile::is_proxy_instruction(name) {
            continue;
        }
        if for_file
            && [
                &b"content-length"[..],
                b"content-range",
                b"content-encoding",
            ]
            .iter()
            .any(|h| name.eq_ignore_ascii_case(h))
        {
            continue;
        }
        if is_hop_by_hop(name) || (has_connection && named_by_connection(backend, name)) {
            // They described the backend's hop, which corral terminated; hyper frames
            // the client's side itself.
            tracing::debug!(
                request_id,
                header = %String::from_utf8_lossy(name),
                "dropped a hop-by-hop header from the backend response"
            );
            continue;
        }
        match (
            header_name(name),
            HeaderValue::from_maybe_shared(value.clone()),
        ) {
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
    out
}

/// A backend header's name as hyper takes it. The names nearly every response carries are
/// told by their length and letters and given as http's constants; `from_bytes` parsed each
/// of them through its table on every response.
fn header_name(name: &[u8]) -> Result<HeaderName, http::header::InvalidHeaderName> {
    use http::header;
    let is = |known: &[u8]| name.eq_ignore_ascii_case(known);
    let known = match name.len() {
        12 if is(b"content-type") => Some(header::CONTENT_TYPE),
        14 if is(b"content-length") => Some(header::CONTENT_LENGTH),
        10 if is(b"set-cookie") => Some(header::SET_COOKIE),
        13 if is(b"cache-control") => Some(header::CACHE_CONTROL),
        8 if is(b"location") => Some(header::LOCATION),
        7 if is(b"expires") => Some(header::EXPIRES),
        _ => None,
    };
    match known {
        Some(known) => Ok(known),
        None => HeaderName::from_bytes(name),
    }
}

/// Hop-by-hop response headers (RFC 9110 §7.6.1), which describe one connection only.
fn is_hop_by_hop(name: &[u8]) -> bool {
    [
        &b"connection"[..],
        b"keep-alive",
        b"proxy-connection",
        b"te",
        b"trailer",
        b"transfer-encoding",
        b"upgrade",
    ]
    .iter()
    .any(|h| name.eq_ignore_ascii_case(h))
}

/// Whether a `Connection` header of the backend lists `name` (which is then hop-by-hop too).
fn named_by_connection(headers: &[(Bytes, Bytes)], name: &[u8]) -> bool {
    headers
        .iter()
        .filter(|(n, _)| n.eq_ignore_ascii_case(b"connection"))
        .flat_map(|(_, v)| v.split(|&c| c == b','))
        .any(|t| t.trim_ascii().eq_ignore_ascii_case(name))
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

    #[test]
    fn a_known_name_is_the_one_from_bytes_parses() {
        for name in [
            &b"Content-Type"[..],
            b"content-length",
            b"SET-COOKIE",
            b"Cache-Control",
            b"location",
            b"Expires",
            b"X-Powered-By",
            b"Content-Typo",
        ] {
            assert_eq!(header_name(name).ok(), HeaderName::from_bytes(name).ok());
        }
        assert!(header_name(b"bad name").is_err());
    }
}
