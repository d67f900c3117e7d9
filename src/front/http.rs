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
use std::os::unix::ffi::OsStringExt;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::{Bytes, BytesMut};
use http::header::{HeaderName, HeaderValue};
use http::{Request, Response, StatusCode};
use http_body::{Body, Frame, SizeHint};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::time::{Instant, Sleep};
use tokio_util::sync::CancellationToken;

use crate::backend::{spool_body, BackendError, BodyError, BodySource, BodyTimeout, RequestBody};
use crate::config::{ForwardedHeader, ForwardedTrust, FrontTimeouts, ListenAddress};
use crate::front::limits::{BusyGuard, Ticket, Watched};
use crate::front::listener::Peer;
use crate::gateway::{Gateway, GatewayBody, GatewayError, RouteKey};
use crate::net::Stream;
use crate::protocols::cgi::{build_cgi_vars, static_file_path, CgiRequest, ScriptMode};
use crate::protocols::cgi_response::ResponseKind;

/// Largest request head hyper buffers (request line and headers).
const MAX_HEAD_BYTES: usize = 64 * 1024;
/// Most header fields in one request head.
const MAX_HEADERS: usize = 100;
/// Bytes read from a static file at a time.
const FILE_CHUNK: usize = 64 * 1024;
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
    let info = Arc::new(info);
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
        .max_headers(MAX_HEADERS)
        // hyper's own header timer is only a backstop. In hyper 1.12 it is armed whenever
        // hyper waits for a head, and that includes a kept-alive connection waiting for its
        // next request (`State::idle` sets `notify_read`, and the next `poll_read_head`
        // arms the timer): one value would be both the head limit and the keep-alive limit,
        // and a 10 s head limit would end every keep-alive connection after 10 s. The watch
        // below times the two phases apart; hyper's timer, at their sum, can never fire
        // earlier. Setting a timer at all also matters: without one hyper silently skips
        // its default 30 s header timeout, with one that default would apply.
        .timer(TokioTimer::new())
        .header_read_timeout(timeouts.header + timeouts.idle)
        // Not `pipeline_flush`: it lets hyper buffer response bodies without bound (its
        // write buffer then always accepts more), which a 1 GiB download turned into
        // hundreds of MiB. Pipelined requests are still answered in order without it.
        .serve_connection(
            TokioIo::new(Watched::new(stream, Arc::clone(&state))),
            service,
        );
    tokio::pin!(conn);
    tokio::select! {
        result = conn.as_mut() => {
            if let Err(e) = result {
                tracing::debug!(error = %e, "http connection ended with an error");
            }
        }
        why = state.watch(timeouts) => {
            // Dropping the connection closes the socket; no request is in progress (the
            // watch only ends on an idle connection).
            tracing::debug!(reason = %why, "closing an http connection");
        }
        () = shutdown.cancelled() => {
            conn.as_mut().graceful_shutdown();
            if let Err(e) = conn.await {
                tracing::debug!(error = %e, "http connection ended with an error while draining");
            }
        }
    }
}

/// The response body type of the http front.
pub type HttpBody = FrontBody;

async fn handle(gateway: &Gateway, info: &ConnInfo, req: Request<Incoming>) -> Response<HttpBody> {
    let request_id = gateway.request_id();
    let (parts, incoming) = req.into_parts();
    let host = host_of(&parts);
    let target: Bytes = match parts.uri.path_and_query() {
        Some(pq) => Bytes::copy_from_slice(pq.as_str().as_bytes()),
        None => Bytes::from_static(b"/"),
    };
    let mut method = parts.method.as_str().as_bytes().to_vec();
    let mut target = target;
    let mut body = Some(request_body(&parts, incoming, info.timeouts.body));
    for _ in 0..=MAX_LOCAL_REDIRECTS {
        let path = path_of(&target);
        let Some(ctx) = gateway.route(RouteKey {
            listener: &info.listener,
            host: &host,
            path,
        }) else {
            let e = GatewayError::NoContext {
                host: host.clone(),
                path: path.to_owned(),
            };
            return error_response(request_id, &e);
        };
        if let Some(resp) = static_file(gateway, ctx, &parts.method, &target).await {
            return resp;
        }
        let mut body_now = body.take().unwrap_or_else(RequestBody::empty);
        if body_now.len().is_none() {
            // A chunked body: learn its length first (bounded spool), so every backend sees
            // CONTENT_LENGTH; php-cgi reads no body without one.
            body_now = match spool_body(body_now, &gateway.spool).await {
                Ok(b) => b,
                Err(source) => return error_response(request_id, &GatewayError::Body(source)),
            };
        }
        let params = match cgi_params(
            gateway, ctx, info, &parts, &method, &target, &host, &body_now,
        ) {
            Ok(p) => p,
            Err(e) => return error_response(request_id, &e),
        };
        let response = match gateway.dispatch(ctx, params, body_now, request_id).await {
            Ok(r) => r,
            Err(e) => return error_response(request_id, &e),
        };
        if let ResponseKind::LocalRedirect { location } = response.head.kind() {
            // RFC 3875 §6.2.2: serve the new path as a GET, send nothing of this response.
            target = Bytes::copy_from_slice(location);
            method = b"GET".to_vec();
            continue;
        }
        let mut builder = Response::builder().status(
            StatusCode::from_u16(response.head.status_code()).unwrap_or(StatusCode::BAD_GATEWAY),
        );
        for (name, value) in &response.head.headers {
            if name.eq_ignore_ascii_case(b"status") {
                continue;
            }
            match (
                HeaderName::from_bytes(name),
                HeaderValue::from_maybe_shared(value.clone()),
            ) {
                (Ok(n), Ok(v)) => builder = builder.header(n, v),
                _ => {
                    tracing::warn!(
                        request_id,
                        header = %String::from_utf8_lossy(name),
                        "dropped a backend response header that is not valid HTTP"
                    );
                }
            }
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

/// Serves an existing non-script file under the context's root when the context asks for
/// static files (`static_files = true`); `None` sends the request on to the backend.
async fn static_file(
    gateway: &Gateway,
    ctx: usize,
    method: &http::Method,
    target: &[u8],
) -> Option<Response<HttpBody>> {
    let context = gateway.contexts.get(ctx)?;
    let root = context.config.root.as_ref()?;
    if !context.config.static_files {
        return None;
    }
    let raw_path = target.split(|&b| b == b'?').next()?;
    if let ScriptMode::Files { extensions, .. } = &context.cgi.mode {
        let path = path_of(target);
        let is_script = path.split('/').any(|segment| {
            extensions.iter().any(|ext| {
                let ext = std::str::from_utf8(ext).unwrap_or("");
                segment.len() > ext.len() + 1
                    && segment.ends_with(ext)
                    && segment.as_bytes().get(segment.len() - ext.len() - 1) == Some(&b'.')
            })
        });
        if is_script {
            return None;
        }
    }
    let lexical = static_file_path(raw_path, root.as_os_str().as_encoded_bytes()).ok()?;
    let lexical = std::path::PathBuf::from(std::ffi::OsString::from_vec(lexical));
    // The real file must be a regular file still under the real root (no symlink out).
    let real = tokio::fs::canonicalize(&lexical).await.ok()?;
    let real_root = tokio::fs::canonicalize(root).await.ok()?;
    if !real.starts_with(&real_root) {
        return None;
    }
    let file = tokio::fs::File::open(&real).await.ok()?;
    let meta = file.metadata().await.ok()?;
    if !meta.is_file() {
        return None;
    }
    if method != http::Method::GET && method != http::Method::HEAD {
        let mut resp = plain(StatusCode::METHOD_NOT_ALLOWED, "405 Method Not Allowed\n");
        resp.headers_mut()
            .insert(http::header::ALLOW, HeaderValue::from_static("GET, HEAD"));
        return Some(resp);
    }
    let mut resp = Response::new(FrontBody::file(file, meta.len()));
    resp.headers_mut().insert(
        http::header::CONTENT_TYPE,
        HeaderValue::from_static(content_type(&real)),
    );
    resp.headers_mut()
        .insert(http::header::CONTENT_LENGTH, HeaderValue::from(meta.len()));
    Some(resp)
}

/// The media type of a static file, from its extension.
fn content_type(path: &std::path::Path) -> &'static str {
    let ext = path
        .extension()
        .and_then(|e| e.to_str())
        .unwrap_or("")
        .to_ascii_lowercase();
    match ext.as_str() {
        "html" | "htm" => "text/html; charset=utf-8",
        "css" => "text/css; charset=utf-8",
        "js" | "mjs" => "text/javascript; charset=utf-8",
        "json" => "application/json",
        "txt" => "text/plain; charset=utf-8",
        "svg" => "image/svg+xml",
        "png" => "image/png",
        "jpg" | "jpeg" => "image/jpeg",
        "gif" => "image/gif",
        "webp" => "image/webp",
        "ico" => "image/x-icon",
        "woff2" => "font/woff2",
        "pdf" => "application/pdf",
        _ => "application/octet-stream",
    }
}

/// The CGI variables of one request for context `ctx`.
#[allow(clippy::too_many_arguments)]
fn cgi_params(
    gateway: &Gateway,
    ctx: usize,
    info: &ConnInfo,
    parts: &http::request::Parts,
    method: &[u8],
    target: &[u8],
    host: &str,
    body: &RequestBody,
) -> Result<Vec<(Bytes, Bytes)>, GatewayError> {
    let headers: Vec<(&[u8], &[u8])> = parts
        .headers
        .iter()
        .map(|(n, v)| (n.as_str().as_bytes(), v.as_bytes()))
        .collect();
    let (remote_addr, remote_port) = match info.peer {
        Peer::Tcp(a) => (a.ip().to_string(), Some(a.port())),
        Peer::Unix => ("127.0.0.1".to_owned(), None),
    };
    let (server_addr, server_port) = match info.local {
        Some(a) => (a.ip().to_string(), Some(a.port())),
        None => ("127.0.0.1".to_owned(), None),
    };
    let protocol = match parts.version {
        http::Version::HTTP_10 => &b"HTTP/1.0"[..],
        _ => b"HTTP/1.1",
    };
    let req = CgiRequest {
        method,
        target,
        protocol,
        headers: &headers,
        body_length: body.len(),
        remote_addr: remote_addr.as_bytes(),
        remote_port,
        server_addr: server_addr.as_bytes(),
        server_port,
        server_name: host.as_bytes(),
        https: forwarded_https(info, &parts.headers),
    };
    let Some(context) = gateway.contexts.get(ctx) else {
        return Err(GatewayError::NoContext {
            host: host.to_owned(),
            path: String::new(),
        });
    };
    let vars = build_cgi_vars(&req, &context.cgi, &gateway.limits)?;
    for d in &vars.dropped {
        tracing::debug!(header = %String::from_utf8_lossy(&d.name), reason = ?d.reason, "left a header out of the CGI variables");
    }
    Ok(vars.vars)
}

/// Whether a trusted proxy says the client came over HTTPS. Only the configured header is
/// read, and only from a peer in `trusted_proxies` (any peer of a Unix listener, which its
/// file permissions already restrict); everyone else's header is ignored.
fn forwarded_https(info: &ConnInfo, headers: &http::HeaderMap) -> bool {
    let Some(trust) = &info.forwarded else {
        return false;
    };
    let trusted = match info.peer {
        Peer::Unix => true,
        Peer::Tcp(addr) => trust.trusted_proxies.iter().any(|c| c.contains(addr.ip())),
    };
    if !trusted {
        return false;
    }
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
fn host_of(parts: &http::request::Parts) -> String {
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
    host.to_ascii_lowercase()
}

/// The path part of a request target (before `?`).
fn path_of(target: &[u8]) -> &str {
    let path = target.split(|&b| b == b'?').next().unwrap_or(target);
    std::str::from_utf8(path).unwrap_or("/")
}

/// The request body as a backend body source; its length when the client declared one.
fn request_body(
    parts: &http::request::Parts,
    incoming: Incoming,
    timeout: std::time::Duration,
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
    RequestBody::from_source(IncomingSource::new(incoming, timeout), len)
}

/// hyper's request body as a backend body source, failing with [`BodyTimeout`] when the
/// client sends nothing for `timeout` while the body is being read.
struct IncomingSource {
    body: Incoming,
    timeout: std::time::Duration,
    /// Armed while a poll is waiting for the client. Only that time counts: while the
    /// exchange is busy writing to a slow backend it does not poll, and the client is not
    /// to blame for that.
    timer: Pin<Box<Sleep>>,
    waiting: bool,
}

impl IncomingSource {
    fn new(body: Incoming, timeout: std::time::Duration) -> IncomingSource {
        IncomingSource {
            body,
            timeout,
            timer: Box::pin(tokio::time::sleep(timeout)),
            waiting: false,
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
                this.waiting = false;
                return ready;
            }
            if !this.waiting {
                this.waiting = true;
                this.timer.as_mut().reset(Instant::now() + this.timeout);
            }
            if this.timer.as_mut().poll(cx).is_ready() {
                // Logged once, with the request, where the 408 is answered.
                return Poll::Ready(Some(Err(Box::new(BodyTimeout {
                    after: this.timeout,
                }))));
            }
            return Poll::Pending;
        }
    }
}

fn error_response(request_id: u64, e: &GatewayError) -> Response<HttpBody> {
    let status = e.status();
    if status >= 500 {
        tracing::warn!(request_id, status, error = %e, "request failed");
    } else {
        tracing::info!(request_id, status, error = %e, "request refused");
    }
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

fn plain(code: StatusCode, text: &str) -> Response<HttpBody> {
    let mut resp = Response::new(FrontBody::full(Bytes::copy_from_slice(text.as_bytes())));
    *resp.status_mut() = code;
    resp.headers_mut().insert(
        http::header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    resp
}

type ChunkFuture =
    Pin<Box<dyn Future<Output = (GatewayBody, Option<Result<Bytes, BackendError>>)> + Send>>;

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
    File {
        file: tokio::fs::File,
        remaining: u64,
    },
    Backend {
        idle: Option<GatewayBody>,
        pending: Option<ChunkFuture>,
        request_id: u64,
    },
}

impl FrontBody {
    fn full(bytes: Bytes) -> FrontBody {
        FrontBody {
            kind: BodyKind::Full(Some(bytes)),
            busy: None,
        }
    }

    fn file(file: tokio::fs::File, len: u64) -> FrontBody {
        FrontBody {
            kind: BodyKind::File {
                file,
                remaining: len,
            },
            busy: None,
        }
    }

    fn backend(body: GatewayBody, request_id: u64) -> FrontBody {
        FrontBody {
            kind: BodyKind::Backend {
                idle: Some(body),
                pending: None,
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
            BodyKind::File { file, remaining } => {
                if *remaining == 0 {
                    return Poll::Ready(None);
                }
                let want = usize::try_from(*remaining)
                    .unwrap_or(FILE_CHUNK)
                    .min(FILE_CHUNK);
                let mut buf = BytesMut::with_capacity(want);
                match tokio_util::io::poll_read_buf(Pin::new(file), cx, &mut buf) {
                    Poll::Pending => Poll::Pending,
                    Poll::Ready(Ok(n)) => {
                        if n == 0 {
                            // The file shrank under us: end early rather than hang.
                            *remaining = 0;
                            return Poll::Ready(Some(Err(
                                "static file shrank while it was sent".into()
                            )));
                        }
                        *remaining = remaining.saturating_sub(n as u64);
                        Poll::Ready(Some(Ok(Frame::data(buf.freeze()))))
                    }
                    Poll::Ready(Err(e)) => {
                        *remaining = 0;
                        Poll::Ready(Some(Err(e.into())))
                    }
                }
            }
            BodyKind::Backend {
                idle,
                pending,
                request_id,
            } => {
                if pending.is_none() {
                    let Some(mut body) = idle.take() else {
                        return Poll::Ready(None);
                    };
                    *pending = Some(Box::pin(async move {
                        let chunk = body.next_chunk().await;
                        (body, chunk)
                    }));
                }
                let Some(fut) = pending.as_mut() else {
                    return Poll::Ready(None);
                };
                let (body, chunk) = match fut.as_mut().poll(cx) {
                    Poll::Pending => return Poll::Pending,
                    Poll::Ready(done) => done,
                };
                *pending = None;
                match chunk {
                    Some(Ok(data)) => {
                        *idle = Some(body);
                        Poll::Ready(Some(Ok(Frame::data(data))))
                    }
                    Some(Err(e)) => {
                        tracing::warn!(request_id = *request_id, error = %e, "backend response broke off");
                        Poll::Ready(Some(Err(e.into())))
                    }
                    // The end: dropping `body` gives the slot back now, not when hyper drops
                    // this body.
                    None => Poll::Ready(None),
                }
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        match &self.kind {
            BodyKind::Full(bytes) => bytes.is_none(),
            BodyKind::File { remaining, .. } => *remaining == 0,
            BodyKind::Backend { idle, pending, .. } => {
                pending.is_none() && idle.as_ref().is_none_or(GatewayBody::is_ended)
            }
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.kind {
            BodyKind::Full(Some(b)) => SizeHint::with_exact(b.len() as u64),
            BodyKind::Full(None) => SizeHint::with_exact(0),
            BodyKind::File { remaining, .. } => SizeHint::with_exact(*remaining),
            BodyKind::Backend { .. } => SizeHint::default(),
        }
    }
}
