//! What the FastCGI and SCGI fronts share: both receive CGI parameters from a front server
//! (nginx `fastcgi_pass` or `scgi_pass`, Apache, lighttpd, Caddy) and answer with a CGI
//! response. Routing and normalising those parameters, the CGI answer for a request that got
//! no backend response, and the lingering close after answering early live here.

use bytes::{Bytes, BytesMut};
use tokio::io::{AsyncRead, AsyncReadExt};

use crate::config::ListenAddress;
use crate::gateway::{Gateway, GatewayError, RouteKey};
use crate::protocols::cgi::{normalize_decoded_path, normalize_front_params, parse_request_path};
use crate::protocols::cgi_response::{encode_head, CgiResponseHead, CgiStatus};

/// Bytes read at a time while lingering.
const LINGER_CHUNK: usize = 16 * 1024;
/// How long a connection closed by corral keeps reading what the front server still sends.
const LINGER: std::time::Duration = std::time::Duration::from_secs(2);

/// Routes a front server's request and normalises its parameters for the chosen context
/// (ARCHITECTURE.md decisions 11 and 12): the context index and the clean parameters.
pub(crate) fn prepare(
    gateway: &Gateway,
    listener: &ListenAddress,
    params: Vec<(Bytes, Bytes)>,
    request_id: u64,
) -> Result<(usize, Vec<(Bytes, Bytes)>), GatewayError> {
    let get = |name: &[u8]| params.iter().find(|(n, _)| n == name).map(|(_, v)| v);
    let host = get(b"HTTP_HOST")
        .filter(|h| !h.is_empty())
        .or_else(|| get(b"SERVER_NAME"))
        .map(|h| host_name(h))
        .unwrap_or_default();
    // Routed on the decoded, normalised path, as the HTTP front routes: DOCUMENT_URI is
    // already decoded (nginx's $document_uri), REQUEST_URI is the raw target. A path that
    // cannot be normalised is refused here, before any context is chosen.
    let path = match get(b"DOCUMENT_URI").filter(|u| !u.is_empty()) {
        Some(uri) => normalize_decoded_path(uri)?,
        None => {
            let uri = get(b"REQUEST_URI").map(|u| &u[..]).unwrap_or(b"/");
            parse_request_path(uri)?.normalized
        }
    };
    let path = String::from_utf8_lossy(&path).into_owned();
    let Some(ctx) = gateway.route(RouteKey {
        listener,
        host: &host,
        path: &path,
    }) else {
        return Err(GatewayError::NoContext { host, path });
    };
    let Some(context) = gateway.contexts.get(ctx) else {
        return Err(GatewayError::NoContext { host, path });
    };
    let vars = normalize_front_params(params, &context.cgi)?;
    for d in &vars.dropped {
        tracing::debug!(request_id, param = %crate::logs::escaped(&d.name), reason = ?d.reason, "left a front server parameter out");
    }
    Ok((ctx, vars.vars))
}

/// A Host value lowercased, without its port.
fn host_name(raw: &[u8]) -> String {
    let raw = String::from_utf8_lossy(raw);
    let host = if raw.starts_with('[') {
        raw.split_inclusive(']').next().unwrap_or(&raw)
    } else {
        raw.split(':').next().unwrap_or(&raw)
    };
    host.to_ascii_lowercase()
}

/// The body length a front server declared in CONTENT_LENGTH; `None` when it sent none (or
/// an empty one, as nginx does for a body it streams without knowing its length).
pub(crate) fn content_length(params: &[(Bytes, Bytes)]) -> Option<u64> {
    let (_, value) = params.iter().find(|(n, _)| n == &b"CONTENT_LENGTH"[..])?;
    std::str::from_utf8(value).ok()?.trim().parse().ok()
}

/// Logs a request that got no backend response: server-side failures at warn, refusals at
/// info.
pub(crate) fn log_failure(request_id: u64, e: &GatewayError) {
    let status = e.status();
    if status >= 500 {
        tracing::warn!(request_id, status, error = %crate::logs::clean(e), "request failed");
    } else {
        tracing::info!(request_id, status, error = %crate::logs::clean(e), "request refused");
    }
}

/// A whole CGI response (head and short body) with `status`, and Retry-After when given.
pub(crate) fn error_answer(status: u16, retry_after: Option<u32>) -> BytesMut {
    let reason = http::StatusCode::from_u16(status)
        .ok()
        .and_then(|s| s.canonical_reason())
        .unwrap_or("Error");
    let mut headers = vec![(
        Bytes::from_static(b"Content-Type"),
        Bytes::from_static(b"text/plain; charset=utf-8"),
    )];
    if let Some(secs) = retry_after {
        headers.push((
            Bytes::from_static(b"Retry-After"),
            Bytes::from(secs.to_string()),
        ));
    }
    let head = CgiResponseHead {
        status: Some(CgiStatus {
            code: status,
            reason: Bytes::from_static(reason.as_bytes()),
        }),
        headers,
    };
    let mut bytes = BytesMut::new();
    if encode_head(&head, &mut bytes).is_err() {
        // Only a code outside 100-999 could be refused; GatewayError never gives one.
        bytes.clear();
        bytes.extend_from_slice(b"Status: 502 Bad Gateway\r\n\r\n");
    }
    bytes.extend_from_slice(format!("{status} {reason}\n").as_bytes());
    bytes
}

/// After corral closed its side, reads and drops what the peer still sends (a request body
/// answered early), for at most [`LINGER`]: closing a socket with unread bytes resets the
/// connection, and a reset can destroy the answer before the peer has read it.
pub(crate) async fn linger(reader: &mut (impl AsyncRead + Unpin)) {
    let mut scratch = vec![0u8; LINGER_CHUNK];
    let drain = async {
        while let Ok(n) = reader.read(&mut scratch).await {
            if n == 0 {
                break;
            }
        }
    };
    let _ = tokio::time::timeout(LINGER, drain).await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hosts_lose_their_port_and_case() {
        assert_eq!(host_name(b"Example.COM:8080"), "example.com");
        assert_eq!(host_name(b"[::1]:80"), "[::1]");
        assert_eq!(host_name(b"localhost"), "localhost");
    }

    #[test]
    fn content_length_is_unknown_when_empty() {
        let p = |v: &'static str| vec![(Bytes::from_static(b"CONTENT_LENGTH"), Bytes::from(v))];
        assert_eq!(content_length(&p("12")), Some(12));
        assert_eq!(content_length(&p("")), None);
        assert_eq!(content_length(&[]), None);
    }

    #[test]
    fn error_answers_are_cgi_responses() {
        let text = error_answer(503, Some(1));
        assert_eq!(
            &text[..],
            b"Status: 503 Service Unavailable\r\nContent-Type: text/plain; charset=utf-8\r\n\
              Retry-After: 1\r\n\r\n503 Service Unavailable\n"
        );
    }
}
