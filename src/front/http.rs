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

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::header::{HeaderName, HeaderValue};
use http::{Request, Response, StatusCode};
use http_body::{Body, Frame, SizeHint};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use tokio::time::{Instant, Sleep};
use tokio_util::sync::CancellationToken;

use crate::backend::{
    buffer_body, spool_body, BackendError, BodyDeadline, BodyError, BodySource, BodyTimeout,
    RequestBody,
};
use crate::config::{ForwardedHeader, ForwardedTrust, FrontTimeouts, ListenAddress};
use crate::front::file::FileBody;
use crate::front::http10;
use crate::front::limits::{BusyGuard, Ticket, Watched};
use crate::front::listener::Peer;
use crate::front::quiet::Quiet;
use crate::front::sendfile;
use crate::front::static_files::{add_slash, static_file, try_files, TryFiles};
use crate::gateway::{Gateway, GatewayBody, GatewayError, RouteKey, Routed};
use crate::net::Stream;
use crate::protocols::cgi::{
    check_host, dropped_headers, encode_prepared, parse_request_path, CgiError, CgiParams,
    CgiRequest, RemoteVars, RequestPath, ServerVars,
};
use crate::protocols::cgi_response::ResponseKind;

/// Largest request head hyper buffers (request line and headers).
const MAX_HEAD_BYTES: usize = 64 * 1024;
/// Local redirects followed for one request before giving up with 502 (a loop).
const MAX_LOCAL_REDIRECTS: usize = 5;

/// What an HTTP connection knows about where it was accepted.
#[derive(Debug, Clone)]
pub struct ConnInfo {
    /// The listener's configured address (contexts name it).
    pub listener: ListenAddress,
    /// The local socket address, for SERVER_ADDR and SERVER_PORT (`None` on Unix sockets).
    pub local: Option<SocketAddr>,
    /// The client.
    pub peer: Peer,
    /// Which forwarded header is believed, and from which peers.
    pub forwarded: Option<ForwardedTrust>,
    /// The listener's phase timeouts.
    pub timeouts: FrontTimeouts,
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
    let info = Arc::new(Served {
        addrs: AddrText::of(&info),
        info,
    });
    let busy = Arc::clone(&state);
    let service = service_fn(move |req| {
        let gateway = Arc::clone(&gateway);
        let info = Arc::clone(&info);
        // The head is complete: the connection is busy until hyper drops the response
        // body (after its last byte, or when the connection ends).
        let guard = busy.begin();
        async move {
            let resp = handle(&gateway, &info, req).await;
            Ok::<_, Infallible>(resp.map(|body| body.holding(guard)))
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
    let mut side = Quiet::new(async {
        tokio::select! {
            why = state.watch(timeouts) => Some(why),
            () = shutdown.cancelled() => None,
        }
    });
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

/// A connection's [`ConnInfo`] with what every request of it needs in text.
struct Served {
    info: ConnInfo,
    addrs: AddrText,
}

/// The peer's and the local address as CGI variables, encoded once per connection
/// (formatting an address costs more than the rest of REMOTE_ADDR's handling).
struct AddrText {
    /// REMOTE_ADDR (the TCP peer's IP, left out on a Unix listener) and REMOTE_PORT, used
    /// unless a trusted proxy names the client.
    peer: RemoteVars,
    /// SERVER_ADDR (the local IP; `127.0.0.1` on a Unix listener) and SERVER_PORT.
    local: ServerVars,
}

impl AddrText {
    fn of(info: &ConnInfo) -> AddrText {
        let peer = match info.peer {
            Peer::Tcp(a) => with_ip_text(a.ip(), |ip| RemoteVars::new(ip, Some(a.port()))),
            Peer::Unix => RemoteVars::new(b"", None),
        };
        let local_port = info.local.map(|a| a.port());
        let local = match info.local {
            Some(a) => with_ip_text(a.ip(), |ip| ServerVars::new(ip, local_port)),
            None => ServerVars::new(b"127.0.0.1", local_port),
        };
        AddrText { peer, local }
    }
}

/// Calls `f` with `ip` as text, written on the stack.
fn with_ip_text<R>(ip: std::net::IpAddr, f: impl FnOnce(&[u8]) -> R) -> R {
    use std::io::Write;
    // The longest IPv6 text (an IPv4-mapped one in full) is 45 bytes.
    let mut buf = [0u8; 64];
    let mut cursor = std::io::Cursor::new(&mut buf[..]);
    let written = write!(cursor, "{ip}").map(|()| cursor.position() as usize);
    match written {
        Ok(n) => f(buf.get(..n).unwrap_or_default()),
        Err(_) => f(ip.to_string().as_bytes()),
    }
}

async fn handle(gateway: &Gateway, served: &Served, req: Request<Incoming>) -> Response<HttpBody> {
    let info = &served.info;
    let request_id = gateway.request_id();
    let (parts, incoming) = req.into_parts();
    if let Err((status, why)) = check_head(&parts) {
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
    let host = host_of(&parts);
    // Borrowed from the head; a local redirect (rare) owns its new target.
    let original: &[u8] = parts
        .uri
        .path_and_query()
        .map_or(b"/", |pq| pq.as_str().as_bytes());
    let mut redirected: Option<Bytes> = None;
    let mut body = Some(request_body(&parts, incoming, &info.timeouts));
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
        let route_path = String::from_utf8_lossy(&path.normalized);
        let routed = match gateway.route(RouteKey {
            listener: &info.listener,
            host: &host,
            path: &route_path,
        }) {
            Ok(r) => r,
            Err(e) => return error_response(request_id, &e),
        };
        let mut seen = None;
        if let Some(resp) =
            static_file(&routed, &parts.method, &parts.headers, &path, &mut seen).await
        {
            return resp;
        }
        let controller_path;
        let path = match try_files(&routed, &path, seen).await {
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
            &served.addrs,
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
        let response = match gateway
            .dispatch(&routed, params, body_now, request_id)
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
        match sendfile::asked(&response.head.headers) {
            Ok(None) => {}
            Ok(Some(ask)) => {
                let headers = client_headers(&response.head.headers, request_id, true);
                drain(response.body).await;
                let context = &routed.context.config;
                return sendfile::answer(context, ask, status, &parts.headers, headers, request_id)
                    .await;
            }
            Err(e) => {
                drain(response.body).await;
                return sendfile::refused(request_id, &e);
            }
        }
        let headers = client_headers(&response.head.headers, request_id, false);
        if http10::needs_length(&parts, status, &headers) {
            return http10::answer(&routed, status, headers, response.body, request_id).await;
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

/// Response bytes of a backend body that corral reads and drops, so that its connection can
/// be kept; past this the body is dropped (the exchange is aborted, as for a client gone).
const DRAIN_MAX: usize = 64 * 1024;

/// Reads a backend body that will not be sent to its end, within [`DRAIN_MAX`].
async fn drain(mut body: GatewayBody) {
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
/// backend's body, which a file corral sends replaces.
fn client_headers(backend: &[(Bytes, Bytes)], request_id: u64, for_file: bool) -> http::HeaderMap {
    let mut out = http::HeaderMap::new();
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
            HeaderName::from_bytes(name),
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
fn check_head(parts: &http::request::Parts) -> Result<(), (StatusCode, &'static str)> {
    if parts.method == http::Method::CONNECT {
        return Err((StatusCode::METHOD_NOT_ALLOWED, "CONNECT is not served"));
    }
    let mut codings = parts
        .headers
        .get_all(http::header::TRANSFER_ENCODING)
        .iter();
    if let Some(first) = codings.next() {
        let chunked = first
            .as_bytes()
            .trim_ascii()
            .eq_ignore_ascii_case(b"chunked");
        if !chunked || codings.next().is_some() {
            return Err((
                StatusCode::NOT_IMPLEMENTED,
                "only Transfer-Encoding: chunked is supported",
            ));
        }
    }
    let mut hosts = parts.headers.get_all(http::header::HOST).iter();
    let host = hosts.next();
    if hosts.next().is_some() {
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

/// The CGI variables of one request for the context it was routed to.
#[allow(clippy::too_many_arguments)]
fn cgi_params(
    gateway: &Gateway,
    routed: &Routed,
    info: &ConnInfo,
    addrs: &AddrText,
    parts: &http::request::Parts,
    method: &[u8],
    target: &[u8],
    path: &RequestPath<'_>,
    host: &str,
    body: &RequestBody,
) -> Result<CgiParams, GatewayError> {
    // A client's X-Sendfile-Type and X-Accel-Mapping are the proxy's word, not the
    // client's: corral sends its own (front::sendfile).
    // On the stack for the usual request; more fields than that (up to hyper's 100)
    // in a vector.
    const ON_STACK: usize = 32;
    let mut fields: [(&[u8], &[u8]); ON_STACK] = [(&[], &[]); ON_STACK];
    let many: Vec<(&[u8], &[u8])>;
    let client_fields = parts
        .headers
        .iter()
        .map(|(n, v)| (n.as_str().as_bytes(), v.as_bytes()))
        .filter(|(n, _)| !sendfile::is_proxy_request_header(n));
    let headers: &[(&[u8], &[u8])] = if parts.headers.len() <= ON_STACK {
        let mut count = 0;
        for (slot, field) in fields.iter_mut().zip(client_fields) {
            *slot = field;
            count += 1;
        }
        fields.get(..count).unwrap_or_default()
    } else {
        many = client_fields.collect();
        &many
    };
    // The client is the one a trusted proxy names, else the TCP peer; a Unix peer with no
    // trusted header is a front server whose client is unknown, and REMOTE_ADDR is then left
    // out rather than filled with a loopback placeholder that an app would trust.
    // The connection's own addresses were encoded when it was accepted (`AddrText`).
    let forwarded = forwarded_client(info, &parts.headers).map(|ip| ip.to_string());
    let (remote_addr, remote) = match &forwarded {
        Some(ip) => (ip.as_str(), None),
        None => ("", Some(&addrs.peer)),
    };
    let protocol = match parts.version {
        http::Version::HTTP_10 => &b"HTTP/1.0"[..],
        _ => b"HTTP/1.1",
    };
    let req = CgiRequest {
        method,
        target,
        protocol,
        headers,
        body_length: body.len(),
        remote_addr: remote_addr.as_bytes(),
        remote_port: None,
        server_addr: b"",
        server_port: None,
        server_name: host.as_bytes(),
        https: forwarded_https(info, &parts.headers),
    };
    let mut vars = encode_prepared(
        &req,
        path,
        &routed.context.cgi,
        remote,
        Some(&addrs.local),
        &gateway.limits,
    )?;
    if tracing::enabled!(tracing::Level::DEBUG) {
        for d in dropped_headers(headers) {
            tracing::debug!(header = %crate::logs::escaped(&d.name), reason = ?d.reason, "left a header out of the CGI variables");
        }
    }
    for (name, value) in sendfile::backend_vars(&routed.context.config) {
        vars.push(&name, &value)?;
    }
    Ok(vars)
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
fn forwarded_client(info: &ConnInfo, headers: &http::HeaderMap) -> Option<std::net::IpAddr> {
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
fn forwarded_https(info: &ConnInfo, headers: &http::HeaderMap) -> bool {
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

/// The host name the client asked for, lowercase and without its port.
fn host_of(parts: &http::request::Parts) -> std::borrow::Cow<'_, str> {
    let raw = parts
        .uri
        .host()
        .or_else(|| parts.headers.get(http::header::HOST)?.to_str().ok())
        .unwrap_or("");
    let host = if raw.starts_with('[') {
        raw.split_inclusive(']').next().unwrap_or(raw)
    } else {
        raw.split(':').next().unwrap_or(raw)
    };
    if host.bytes().any(|c| c.is_ascii_uppercase()) {
        std::borrow::Cow::Owned(host.to_ascii_lowercase())
    } else {
        std::borrow::Cow::Borrowed(host)
    }
}

/// The request body as a backend body source; its length when the client declared one.
fn request_body(
    parts: &http::request::Parts,
    incoming: Incoming,
    timeouts: &FrontTimeouts,
) -> RequestBody {
    let chunked = parts.headers.get(http::header::TRANSFER_ENCODING).is_some();
    let len = if chunked {
        None
    } else {
        parts
            .headers
            .get(http::header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok()?.parse::<u64>().ok())
            .or(Some(0))
    };
    if len == Some(0) {
        return RequestBody::empty();
    }
    RequestBody::from_source(IncomingSource::new(incoming, timeouts), len)
}

/// hyper's request body as a backend body source, failing with [`BodyTimeout`] when the
/// client sends nothing for `timeout` while the body is being read, and with
/// [`BodyDeadline`] once the waits for it add up to `total` (`body_deadline`).
struct IncomingSource {
    body: Incoming,
    timeout: std::time::Duration,
    total: std::time::Duration,
    /// Armed while a poll is waiting for the client. Only that time counts: while the
    /// exchange is busy writing to a slow backend it does not poll, and the client is not
    /// to blame for that.
    timer: Pin<Box<Sleep>>,
    /// When the current wait began, while a poll is waiting for the client.
    waiting: Option<Instant>,
    /// The earlier waits for the client, added up.
    waited: std::time::Duration,
}

impl IncomingSource {
    fn new(body: Incoming, timeouts: &FrontTimeouts) -> IncomingSource {
        IncomingSource {
            body,
            timeout: timeouts.body,
            total: timeouts.body_total,
            timer: Box::pin(tokio::time::sleep(timeouts.body)),
            waiting: None,
            waited: std::time::Duration::ZERO,
        }
    }
}

impl BodySource for IncomingSource {
    fn poll_chunk(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Bytes, BodyError>>> {
        let this = self.get_mut();
        loop {
            let polled = match Pin::new(&mut this.body).poll_frame(cx) {
                Poll::Pending => None,
                Poll::Ready(None) => Some(Poll::Ready(None)),
                Poll::Ready(Some(Ok(frame))) => match frame.into_data() {
                    Ok(data) => Some(Poll::Ready(Some(Ok(data)))),
                    // Trailers carry nothing CGI can pass on.
                    Err(_) => continue,
                },
                Poll::Ready(Some(Err(e))) => Some(Poll::Ready(Some(Err(BodyError::from(e))))),
            };
            if let Some(ready) = polled {
                if let Some(since) = this.waiting.take() {
                    this.waited += since.elapsed();
                }
                return ready;
            }
            let since = match this.waiting {
                Some(since) => since,
                None => {
                    let now = Instant::now();
                    this.waiting = Some(now);
                    // Whichever comes first: this wait's body_timeout, or what is left of
                    // body_deadline.
                    let left = this.total.saturating_sub(this.waited);
                    this.timer.as_mut().reset(now + this.timeout.min(left));
                    now
                }
            };
            if this.timer.as_mut().poll(cx).is_ready() {
                // Logged once, with the request, where the 408 is answered.
                if this.waited + since.elapsed() >= this.total {
                    return Poll::Ready(Some(Err(Box::new(BodyDeadline { after: this.total }))));
                }
                return Poll::Ready(Some(Err(Box::new(BodyTimeout {
                    after: this.timeout,
                }))));
            }
            return Poll::Pending;
        }
    }
}

pub(super) fn error_response(request_id: u64, e: &GatewayError) -> Response<HttpBody> {
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

pub(super) fn plain(code: StatusCode, text: &str) -> Response<HttpBody> {
    let mut resp = Response::new(FrontBody::full(Bytes::copy_from_slice(text.as_bytes())));
    *resp.status_mut() = code;
    resp.headers_mut().insert(
        http::header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    resp
}

/// A response body for hyper: fixed bytes (corral's own answers) or a backend body pulled
/// chunk by chunk. Dropping it mid-way (the client went away) drops the backend body, which
/// aborts the backend request and gives the slot back.
pub struct FrontBody {
    kind: BodyKind,
    /// Keeps the connection counted busy until hyper drops the body.
    busy: Option<BusyGuard>,
}

// One body per response, moved once: boxing the larger variant would cost an allocation per
// response to save a few bytes that are never copied.
#[allow(clippy::large_enum_variant)]
enum BodyKind {
    Full(Option<Bytes>),
    File(FileBody),
    Backend {
        /// Bytes already read from the backend, sent first (an HTTP/1.0 answer).
        first: Option<Bytes>,
        /// The rest, pulled from hyper's poll (no future per chunk); `None` once it ended.
        body: Option<GatewayBody>,
        request_id: u64,
    },
}

impl FrontBody {
    pub(super) fn full(bytes: Bytes) -> FrontBody {
        FrontBody {
            kind: BodyKind::Full(Some(bytes)),
            busy: None,
        }
    }

    pub(super) fn file(file: FileBody) -> FrontBody {
        FrontBody {
            kind: BodyKind::File(file),
            busy: None,
        }
    }

    fn backend(body: GatewayBody, request_id: u64) -> FrontBody {
        FrontBody::backend_after(Bytes::new(), body, request_id)
    }

    /// `first`, then the rest of the backend body.
    pub(super) fn backend_after(first: Bytes, body: GatewayBody, request_id: u64) -> FrontBody {
        FrontBody {
            kind: BodyKind::Backend {
                first: (!first.is_empty()).then_some(first),
                body: Some(body),
                request_id,
            },
            busy: None,
        }
    }

    /// The same body, keeping `guard` until it is dropped.
    fn holding(mut self, guard: BusyGuard) -> FrontBody {
        self.busy = Some(guard);
        self
    }
}

impl Body for FrontBody {
    type Data = Bytes;
    type Error = BodyError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BodyError>>> {
        match &mut self.get_mut().kind {
            BodyKind::Full(bytes) => Poll::Ready(bytes.take().map(|b| Ok(Frame::data(b)))),
            BodyKind::File(file) => file.poll_chunk(cx),
            BodyKind::Backend {
                first,
                body,
                request_id,
            } => {
                if let Some(data) = first.take() {
                    return Poll::Ready(Some(Ok(Frame::data(data))));
                }
                let Some(backend) = body.as_mut() else {
                    return Poll::Ready(None);
                };
                match backend.poll_chunk(cx) {
                    Poll::Pending => Poll::Pending,
                    Poll::Ready(Some(Ok(data))) => Poll::Ready(Some(Ok(Frame::data(data)))),
                    Poll::Ready(Some(Err(e))) => {
                        *body = None;
                        tracing::warn!(request_id = *request_id, error = %e, "backend response broke off");
                        Poll::Ready(Some(Err(e.into())))
                    }
                    // The end: dropping the body gives the slot back now, not when hyper
                    // drops this one.
                    Poll::Ready(None) => {
                        *body = None;
                        Poll::Ready(None)
                    }
                }
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        match &self.kind {
            BodyKind::Full(bytes) => bytes.is_none(),
            BodyKind::File(file) => file.remaining() == 0,
            BodyKind::Backend { first, body, .. } => {
                first.is_none() && body.as_ref().is_none_or(GatewayBody::is_ended)
            }
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.kind {
            BodyKind::Full(Some(b)) => SizeHint::with_exact(b.len() as u64),
            BodyKind::Full(None) => SizeHint::with_exact(0),
            BodyKind::File(file) => SizeHint::with_exact(file.remaining()),
            BodyKind::Backend { .. } => SizeHint::default(),
        }
    }
}
