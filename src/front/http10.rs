//! HTTP/1.0 answers of the `http` front listener. HTTP/1.0 has no chunked coding, so a
//! response without a Content-Length can only end with the connection; hyper still says
//! `Connection: keep-alive` to an HTTP/1.0 client that asked for it, which then waits for a
//! length that never comes (`ab -k` failed 193 of 200 requests). A small backend body is
//! therefore read whole and sent with its length, a long or slow one streamed with
//! `Connection: close`. HTTP/1.1 requests never come here.

use bytes::BytesMut;
use http::header::HeaderValue;
use http::{Response, StatusCode};
use tokio::time::Instant;

use crate::front::http::{error_response, FrontBody, HttpBody};
use crate::gateway::{GatewayBody, Routed};

/// Most of a backend body read into memory to give an HTTP/1.0 keep-alive client a
/// Content-Length; a longer body goes out as it comes, and the connection closes after it.
const HTTP10_BUFFER_MAX: usize = 64 * 1024;
/// How long the backend body may take to end while it is buffered for an HTTP/1.0 client;
/// past this (a streamed answer), what came so far goes out and the rest follows.
const HTTP10_BUFFER_FOR: std::time::Duration = std::time::Duration::from_secs(1);

/// Whether the request is an HTTP/1.0 one, other than HEAD, that asked to keep the
/// connection (`keep_alive`: a Connection field of its head names `keep-alive`): the
/// request's half of [`needs_length`], decided before the request's header map is handed on
/// to carry the response's headers.
pub(super) fn asks_keep_alive(parts: &http::request::Parts, keep_alive: bool) -> bool {
    keep_alive && parts.version == http::Version::HTTP_10 && parts.method != http::Method::HEAD
}

/// Whether the answer to a request must be given a length before its head goes out:
/// HTTP/1.0 has no chunked coding, so without a Content-Length the body can only end with
/// the connection, and a client that asked to keep it (`ab -k`; `asks_keep_alive` says
/// whether it did) would wait for a length that never comes. HTTP/1.1 requests never take
/// this path.
pub(super) fn needs_length(
    asks_keep_alive: bool,
    status: StatusCode,
    headers: &http::HeaderMap,
) -> bool {
    asks_keep_alive
        && status != StatusCode::NO_CONTENT
        && status != StatusCode::NOT_MODIFIED
        && !headers.contains_key(http::header::CONTENT_LENGTH)
}

/// The answer to an HTTP/1.0 keep-alive request whose backend gave no length: the body is
/// read into memory, up to [`HTTP10_BUFFER_MAX`] within [`HTTP10_BUFFER_FOR`], and sent
/// with its Content-Length (the connection is kept). A longer or slower body is sent as it
/// comes after what was read, with `Connection: close`, since only the close can end it.
pub(super) async fn answer(
    routed: &Routed,
    status: StatusCode,
    mut headers: http::HeaderMap,
    mut body: GatewayBody,
    request_id: u64,
) -> Response<HttpBody> {
    let deadline = Instant::now() + HTTP10_BUFFER_FOR;
    let mut read = BytesMut::new();
    let (kind, complete) = loop {
        // The body's poll is cancel-safe: a read cut by the deadline goes on from the same
        // state when the front body polls it.
        let next = std::future::poll_fn(|cx| body.poll_chunk(cx));
        let Ok(chunk) = tokio::time::timeout_at(deadline, next).await else {
            break (
                FrontBody::backend_after(read.freeze(), body, request_id),
                false,
            );
        };
        match chunk {
            Some(Ok(data)) => {
                read.extend_from_slice(&data);
                if read.len() > HTTP10_BUFFER_MAX {
                    break (
                        FrontBody::backend_after(read.freeze(), body, request_id),
                        false,
                    );
                }
            }
            None => break (FrontBody::full(read.freeze()), true),
            Some(Err(e)) => {
                // Nothing of the answer has gone out yet: a clean 502.
                return error_response(request_id, &routed.backend_error(e));
            }
        }
    };
    let mut resp = Response::new(kind);
    *resp.status_mut() = status;
    if !complete {
        // hyper would add `keep-alive` to an HTTP/1.1-versioned head; an HTTP/1.0 one
        // without it is closed after the body, which the header says.
        *resp.version_mut() = http::Version::HTTP_10;
        headers.insert(http::header::CONNECTION, HeaderValue::from_static("close"));
    }
    *resp.headers_mut() = headers;
    resp
}
