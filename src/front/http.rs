//! The `http` front listener: HTTP/1.1 from a reverse proxy or a client, turned into CGI
//! variables for the context's pool, and the backend's CGI response turned back into HTTP.
//!
//! hyper does the HTTP/1.1 framing: keep-alive, pipelining, chunked request bodies, HEAD,
//! `Expect: 100-continue` (sent when the body is first read, so a refused request never pulls
//! its upload), and the bound on the request head. Everything else is corral's: routing, the
//! CGI variables with their security defaults, local redirects (RFC 3875 §6.2.2), and a clear
//! status with one log line for every failure.
//!
//! Timeouts are corral's too (see `front::limits`): a watch per connection closes it when a
//! request head takes longer than `header_timeout` from its first byte (from accept on a new
//! connection) or when a kept-alive connection waits longer than `idle_timeout` for its next
//! request, and the request body source fails with 408 when the client sends nothing for
//! `body_timeout` while the body is read.

mod answer;
mod body;
mod head;
mod vars;

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::Poll;

use bytes::Bytes;
use http::header::HeaderValue;
use http::{Request, Response, StatusCode};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use tokio_util::sync::CancellationToken;

use crate::backend::{buffer_body, spool_body, BackendError, RequestBody};
use crate::config::{ForwardedTrust, FrontTimeouts, ListenAddress};
use crate::front::http10;
use crate::front::limits::{Ticket, Watched};
use crate::front::listener::Peer;
use crate::front::quiet::Quiet;
use crate::front::sendfile;
use crate::front::static_files::{add_slash, static_file, try_files, TryFiles};
use crate::gateway::{Gateway, GatewayError, RouteKey};
use crate::net::Stream;
use crate::protocols::cgi::{parse_request_path, RemoteVars, RequestPath, ServerVars};
use crate::protocols::cgi_response::ResponseKind;

pub(in crate::front) use answer::{error_response, plain};
pub use body::FrontBody;
pub use vars::server_vars;

use answer::{client_headers, discard, sends_body};
use body::request_body;
use head::{check_head, host_of, HeadFields};
use vars::{cgi_params, remote_vars};

/// Largest request head hyper buffers (request line and headers).
const MAX_HEAD_BYTES: usize = 64 * 1024;
/// Local redirects followed for one request before giving up with 502 (a loop).
const MAX_LOCAL_REDIRECTS: usize = 5;

/// What an HTTP connection knows about where it was accepted.
#[derive(Debug, Clone)]
pub struct ConnInfo {
    /// The listener's configured address (contexts name it).
    pub listener: ListenAddress,
    /// The client.
    pub peer: Peer,
    /// Which forwarded header is believed, and from which peers.
    pub forwarded: Option<ForwardedTrust>,
    /// The listener's phase timeouts.
    pub timeouts: FrontTimeouts,
    /// SERVER_ADDR and SERVER_PORT ([`server_vars`] of the local address the client
    /// reached), encoded by the accept loop once per address, not per connection.
    pub server_vars: Arc<ServerVars>,
}

/// Serves one HTTP connection until the client closes it, a timeout or the connection cap
/// closes it, or `shutdown` fires (then the request in progress finishes and the connection
/// closes). `ticket` counts the connection in the cap table until it ends.
pub async fn serve_connection(
    stream: Stream,
    info: ConnInfo,
    ticket: Ticket,
    gateway: Arc<Gateway>,
    shutdown: CancellationToken,
) {
    let state = Arc::clone(ticket.state());
    let timeouts = info.timeouts;
    let info = Served {
        remote_vars: remote_vars(&info),
        info,
    };
    let busy = Arc::clone(&state);
    // Borrowed by each request's future, not cloned into it: the connection's future owns
    // both, and an `Arc` clone of the gateway per request was a read-modify-write on a
    // count every serving thread shares.
    let (gateway, info) = (&*gateway, &info);
    let service = service_fn(move |req| {
        // The head is complete: the connection is busy until hyper drops the response
        // body (after its last byte, or when the connection ends).
        let guard = busy.begin();
        async move {
            let mut resp = handle(gateway, info, req).await;
            // Set in place: `Response::map` moved the whole response (its body holds the
            // backend's) three times over.
            resp.body_mut().hold(guard);
            Ok::<_, Infallible>(resp)
        }
    });
    let conn = hyper::server::conn::http1::Builder::new()
        .keep_alive(true)
        .max_buf_size(MAX_HEAD_BYTES)
        // At most 100 header fields, hyper's default (more are answered 431). Not set with
        // `max_headers`: setting it, even to the same 100, makes hyper fill its two header
        // arrays element by element for every head (1.7k instructions per request under
        // callgrind) instead of leaving them uninitialised.
        // No hyper header timer: the watch below times the head and the keep-alive wait
        // apart (one hyper value would be both: in hyper 1.12 it is armed whenever hyper
        // waits for a head, kept-alive waits included), and hyper's timer, dropped after
        // every head, cost a boxed `Sleep` and a timer-wheel entry per request. Configured
        // as `None`, not left unset: without a timer hyper's 30 s default is skipped with a
        // warning, and `None` says it on purpose.
        .header_read_timeout(None)
        // Not `pipeline_flush`: it lets hyper buffer response bodies without bound (its
        // write buffer then always accepts more), which a 1 GiB download turned into
        // hundreds of MiB. Pipelined requests are still answered in order without it.
        .serve_connection(
            TokioIo::new(Watched::new(stream, Arc::clone(&state)).with_send_timeout(timeouts.send)),
            service,
        );
    tokio::pin!(conn);
    // The deadlines, an eviction and the shutdown, polled only when one of them woke the
    // task, not at every wake of the connection (front::quiet).
    // Pinned here, in the connection's own future, not boxed: a box was an allocation and
    // a copy of the whole wait per connection.
    let side = async {
        tokio::select! {
            why = state.watch(timeouts) => Some(why),
            () = shutdown.cancelled() => None,
        }
    };
    tokio::pin!(side);
    let mut side = Quiet::new(side);
    let ended = std::future::poll_fn(|cx| {
        if let Poll::Ready(result) = conn.as_mut().poll(cx) {
            return Poll::Ready(Ok(result));
        }
        Pin::new(&mut side).poll(cx).map(Err)
    })
    .await;
    match ended {
        Ok(result) => {
            if let Err(e) = result {
                tracing::debug!(error = %e, "http connection ended with an error");
            }
        }
        Err(Some(why)) => {
            // Dropping the connection closes the socket; no request is in progress (the
            // watch only ends on an idle connection).
            tracing::debug!(reason = %why, "closing an http connection");
        }
        Err(None) => {
            conn.as_mut().graceful_shutdown();
            if let Err(e) = conn.await {
                tracing::debug!(error = %e, "http connection ended with an error while draining");
            }
        }
    }
}

/// The response body type of the http front.
pub type HttpBody = FrontBody;

/// A connection's [`ConnInfo`] with its peer's address as CGI variables, for every request.
struct Served {
    info: ConnInfo,
    remote_vars: RemoteVars,
}

async fn handle(gateway: &Gateway, served: &Served, req: Request<Incoming>) -> Response<HttpBody> {
    let info = &served.info;
    let request_id = gateway.request_id();
    let (mut parts, incoming) = req.into_parts();
    let fields = HeadFields::of(&parts.headers);
    if let Err((status, why)) = check_head(&parts, &fields) {
        tracing::info!(
            request_id,
            status = status.as_u16(),
            reason = why,
            "request refused"
        );
        let mut resp = plain(status, &format!("{} {why}\n", status.as_u16()));
        if status == StatusCode::METHOD_NOT_ALLOWED {
            resp.headers_mut().insert(
                http::header::ALLOW,
                HeaderValue::from_static("GET, HEAD, POST, PUT, PATCH, DELETE, OPTIONS"),
            );
        }
        // The body, if any, is not read: close rather than guess where the next request
        // starts (that guess is what request smuggling exploits).
        resp.headers_mut()
            .insert(http::header::CONNECTION, HeaderValue::from_static("close"));
        return resp;
    }
    let host = host_of(&parts, &fields);
    // Borrowed from the head; a local redirect (rare) owns its new target.
    let original: &[u8] = parts
        .uri
        .path_and_query()
        .map_or(b"/", |pq| pq.as_str().as_bytes());
    let mut redirected: Option<Bytes> = None;
    let mut body = Some(request_body(&fields, incoming, &info.timeouts));
    for _ in 0..=MAX_LOCAL_REDIRECTS {
        let (method, target): (&[u8], &[u8]) = match &redirected {
            None => (parts.method.as_str().as_bytes(), original),
            Some(location) => (b"GET", location),
        };
        // The target is decoded and normalised once; routing, the static-file test and every
        // CGI variable come from this one result (a second spelling is how `/index.ph%70`
        // got served as text).
        let path = match parse_request_path(target) {
            Ok(p) => p,
            Err(e) => return error_response(request_id, &GatewayError::Cgi(e)),
        };
        let routed = match gateway.route(RouteKey {
            listener: &info.listener,
            host: host.as_bytes(),
            path: &path.normalized,
        }) {
            Ok(r) => r,
            Err(e) => return error_response(request_id, &e),
        };
        let mut seen = None;
        // Each look is asked only of a context that has it configured: for any other the
        // call answered at once, but its future was still built and moved into this one.
        let config = &routed.context.config;
        if config.static_files {
            if let Some(resp) =
                static_file(&routed, &parts.method, &parts.headers, &path, &mut seen).await
            {
                return resp;
            }
        }
        let controller_path;
        let tried = if config.front_controller.is_some() {
            try_files(&routed, &path, seen)
        } else {
            TryFiles::Keep
        };
        let path = match tried {
            TryFiles::Keep => path,
            TryFiles::Controller(script) => {
                tracing::debug!(
                    request_id,
                    path = %crate::logs::escaped(&path.normalized),
                    "no such file or directory: the front controller serves it"
                );
                controller_path = RequestPath {
                    normalized: script,
                    ..path
                };
                controller_path
            }
            TryFiles::AddSlash(location) => return add_slash(location),
        };
        let mut body_now = body.take().unwrap_or_else(RequestBody::empty);
        let mut params = match cgi_params(
            gateway,
            &routed,
            info,
            &served.remote_vars,
            &parts,
            method,
            target,
            &path,
            &host,
            &body_now,
        ) {
            Ok(p) => p,
            Err(e) => return error_response(request_id, &e),
        };
        let chunked = body_now.len().is_none();
        let buffer = routed.buffers_requests() && !body_now.is_empty();
        if chunked || buffer {
            // Read the body before a worker is asked: a chunked one to learn its length, so
            // every backend sees CONTENT_LENGTH (php-cgi reads no body without one), and any
            // one when the context buffers requests, so that a slow upload holds a spool
            // file, not a worker. Bounded by the context's max_body and the spool budget,
            // and only once the request is known to go somewhere: no spool for a 404.
            if let Err(e) = routed.precheck(&params, body_now.len()) {
                return error_response(request_id, &e);
            }
            let spool = gateway.spool_for(&routed);
            let read = if buffer {
                buffer_body(body_now, &spool).await
            } else {
                spool_body(body_now, &spool).await
            };
            body_now = match read {
                Ok(b) => b,
                Err(BackendError::BodyTooLarge { limit }) => {
                    let e = GatewayError::BodyTooLarge {
                        length: None,
                        limit,
                    };
                    return error_response(request_id, &e);
                }
                Err(source) => return error_response(request_id, &GatewayError::Body(source)),
            };
            if chunked {
                let length = body_now.len().unwrap_or(0).to_string();
                if let Err(e) = params.set(b"CONTENT_LENGTH", length.as_bytes()) {
                    return error_response(request_id, &GatewayError::Cgi(e));
                }
            }
        }
        let mut response = match gateway
            // No descriptor to peek at: hyper already reads a busy connection for its end
            // (`half_close` is off), so a client that closes it while its request waits
            // drops the request's future, which leaves the queue.
            .dispatch(&routed, params, body_now, request_id, None)
            .await
        {
            Ok(r) => r,
            Err(e) => return error_response(request_id, &e),
        };
        if let ResponseKind::LocalRedirect { location } = response.head.kind() {
            // RFC 3875 §6.2.2: serve the new path as a GET, send nothing of this response.
            redirected = Some(Bytes::copy_from_slice(location));
            continue;
        }
        let code = response.head.status_code();
        if !(200..=999).contains(&code) {
            // A 1xx final answer (101 would switch protocols under corral's feet) is not a
            // response a CGI backend may give.
            let e = routed.backend_error(BackendError::Protocol {
                protocol: routed.pool.protocol,
                rule: format!(
                    "the backend answered with status {code}, which is not a final status"
                ),
            });
            return error_response(request_id, &e);
        }
        let status = StatusCode::from_u16(code).unwrap_or(StatusCode::BAD_GATEWAY);
        match sendfile::asked(response.head.headers()) {
            Ok(None) => {}
            Ok(Some(ask)) => {
                let headers = client_headers(
                    response.head.headers(),
                    request_id,
                    true,
                    http::HeaderMap::new(),
                );
                discard(response.body);
                let context = &routed.context.config;
                return sendfile::answer(context, ask, status, &parts.headers, headers, request_id)
                    .await;
            }
            Err(e) => {
                discard(response.body);
                return sendfile::refused(request_id, &e);
            }
        }
        // The request's own header map, emptied, carries the response's headers: hyper
        // keeps the map of each response it sends and parses the connection's next request
        // into it, so a kept-alive connection makes no header map per request.
        let keep_alive_10 = http10::asks_keep_alive(&parts, fields.keep_alive);
        let into = std::mem::take(&mut parts.headers);
        let headers = client_headers(response.head.headers(), request_id, false, into);
        if http10::needs_length(keep_alive_10, status, &headers) {
            return http10::answer(&routed, status, headers, response.body, request_id).await;
        }
        if !sends_body(&parts.method, status) {
            // hyper drops this body unread once the head is out: its rest is read and thrown
            // away so that the backend connection is kept, not aborted. Marked where it lies
            // (a move out of the response would be a copy of it per request).
            response.body.discard_unsent();
        }
        let mut builder = Response::builder().status(status);
        if let Some(h) = builder.headers_mut() {
            *h = headers;
        }
        return builder
            .body(FrontBody::backend(response.body, request_id))
            .unwrap_or_else(|_| plain(StatusCode::BAD_GATEWAY, "bad response head\n"));
    }
    let e = GatewayError::Backend {
        pool: Arc::from("?"),
        source: BackendError::Protocol {
            protocol: crate::backend::Protocol::FastCgi,
            rule: format!("more than {MAX_LOCAL_REDIRECTS} local redirects"),
        },
    };
    error_response(request_id, &e)
}
