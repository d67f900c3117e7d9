//! The status listener: a small HTTP/1.1 server answered by corral itself, never by a worker.
//!
//! Routes: `/ping` answers `pong` (php-fpm's `ping.path`) for as long as corral runs;
//! `/ready` answers `ready`, and 503 `stopping` from the moment a graceful stop begins
//! (through `shutdown_delay` and the drain), for a load balancer's readiness check; `/status` the status page, as text,
//! `?json`, or `?openmetrics`, with `?full` adding a row per worker and `?pool=NAME` keeping
//! one pool, `?html` the page for people and `?history` the samples its sparklines draw;
//! `/metrics` the OpenMetrics exposition (also with `?pool=NAME`). Each answer reads
//! counters and the drivers' last published status, so it never waits for a worker.
//!
//! It counts its connections in a table of its own (`front::limits::STATUS_MAX_CONNECTIONS`,
//! closing the connection idle longest when full) with short fixed timeouts, so neither a
//! front-listener flood nor idle scrapers can keep `/ping` from answering.

use std::convert::Infallible;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::SystemTime;

use bytes::Bytes;
use http::{header, Method, Request, Response, StatusCode};
use http_body::{Body, Frame, SizeHint};
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio_util::sync::CancellationToken;

use crate::front::limits::{Admission, Client, Watched, STATUS_TIMEOUTS};
use crate::front::listener::{Listener, Peer};
use crate::gateway::Gateway;
use crate::logs::{escaped, LineLimit, Verdict};
use crate::status::collect::{collect, StatusSource};
use crate::status::{history, host, html, metrics, render};

/// A whole response body in one piece.
#[derive(Debug)]
pub struct Whole(Option<Bytes>);

impl Whole {
    /// The bytes of the body.
    pub fn into_bytes(self) -> Bytes {
        self.0.unwrap_or_default()
    }
}

impl Body for Whole {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        Poll::Ready(self.0.take().map(|b| Ok(Frame::data(b))))
    }

    fn is_end_stream(&self) -> bool {
        self.0.is_none()
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::with_exact(self.0.as_ref().map_or(0, |b| b.len() as u64))
    }
}

/// What a status request asked for.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Query {
    /// `?json`.
    pub json: bool,
    /// `?openmetrics`.
    pub openmetrics: bool,
    /// `?full`.
    pub full: bool,
    /// `?html`.
    pub html: bool,
    /// `?history`.
    pub history: bool,
    /// `?pool=NAME`.
    pub pool: Option<String>,
}

impl Query {
    /// Parses a query string; unknown keys are ignored, as php-fpm does.
    pub fn parse(q: &str) -> Query {
        let mut out = Query::default();
        for pair in q.split('&').filter(|p| !p.is_empty()) {
            let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
            match k {
                "json" => out.json = true,
                "openmetrics" => out.openmetrics = true,
                "full" => out.full = true,
                "html" => out.html = true,
                "history" => out.history = true,
                // Pool names are ASCII letters, digits, `_` and `-`: nothing to decode.
                "pool" => out.pool = Some(v.to_owned()),
                _ => {}
            }
        }
        out
    }
}

/// Answers one status request.
pub fn answer(
    gateway: &Gateway,
    source: &StatusSource,
    method: &Method,
    path: &str,
    query: &str,
) -> Response<Whole> {
    if method != Method::GET && method != Method::HEAD {
        let mut r = reply(
            StatusCode::METHOD_NOT_ALLOWED,
            "text/plain; charset=utf-8",
            "only GET and HEAD\n".to_owned(),
        );
        r.headers_mut()
            .insert(header::ALLOW, header::HeaderValue::from_static("GET, HEAD"));
        return r;
    }
    let q = Query::parse(query);
    if path == "/ping" {
        return reply(
            StatusCode::OK,
            "text/plain; charset=utf-8",
            "pong\n".to_owned(),
        );
    }
    if path == "/ready" {
        return if source.stopping.is_cancelled() {
            reply(
                StatusCode::SERVICE_UNAVAILABLE,
                "text/plain; charset=utf-8",
                "stopping\n".to_owned(),
            )
        } else {
            reply(
                StatusCode::OK,
                "text/plain; charset=utf-8",
                "ready\n".to_owned(),
            )
        };
    }
    if path == "/status" && q.html {
        // The page holds no numbers: its script asks for them.
        return reply(StatusCode::OK, html::CONTENT_TYPE, html::PAGE.to_owned());
    }
    if path != "/status" && path != "/metrics" {
        return reply(
            StatusCode::NOT_FOUND,
            "text/plain; charset=utf-8",
            "not found: try /status, /metrics, /ping or /ready\n".to_owned(),
        );
    }
    let pools = collect(
        gateway,
        source,
        q.pool.as_deref(),
        q.full && !q.history && path == "/status",
    );
    if let (Some(name), true) = (&q.pool, pools.is_empty()) {
        return reply(
            StatusCode::NOT_FOUND,
            "text/plain; charset=utf-8",
            format!("no pool named {name:?}\n"),
        );
    }
    let now = SystemTime::now();
    // The front listeners' accept queues, on pages about every pool.
    let listeners = if q.pool.is_none() && !q.history {
        source.backlogs.read()
    } else {
        Vec::new()
    };
    if path == "/metrics" || q.openmetrics {
        return reply(
            StatusCode::OK,
            metrics::CONTENT_TYPE,
            metrics::render(
                &pools,
                source.started,
                &source
                    .connections
                    .iter()
                    .map(|a| a.snapshot())
                    .collect::<Vec<_>>(),
                &listeners,
            ),
        );
    }
    if q.history {
        let body = history::json(&source.history, &pools, now);
        return reply(StatusCode::OK, "application/json", body);
    }
    if q.json {
        let mut body = render::json(
            &pools,
            &listeners,
            source.started,
            now,
            q.full,
            q.pool.is_some(),
        );
        if let (None, Some(last)) = (&q.pool, gateway.reloads.get()) {
            body = super::reload::with_json_member(body, &last);
        }
        return reply(StatusCode::OK, "application/json", body);
    }
    let mut body = render::text(&pools, source.started, now, q.full);
    body.push_str(&render::listeners_text(&listeners));
    if let (None, Some(last)) = (&q.pool, gateway.reloads.get()) {
        body.push_str(&super::reload::text(&last));
    }
    reply(StatusCode::OK, "text/plain; charset=utf-8", body)
}

fn reply(status: StatusCode, content_type: &'static str, body: String) -> Response<Whole> {
    let mut r = Response::new(Whole(Some(Bytes::from(body))));
    *r.status_mut() = status;
    let h = r.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static(content_type),
    );
    // php-fpm's status page says the same: numbers are live, never cache them.
    h.insert(
        header::CACHE_CONTROL,
        header::HeaderValue::from_static("no-cache, no-store, must-revalidate"),
    );
    for (name, value) in html::SECURITY_HEADERS {
        h.insert(name, header::HeaderValue::from_static(value));
    }
    r
}

/// The answer to a request whose Host the listener does not answer (`status::host`).
fn misdirected(host: &[u8]) -> Response<Whole> {
    static REFUSED: LineLimit = LineLimit::per_second();
    if let Verdict::Log { suppressed } = REFUSED.check(tokio::time::Instant::now(), 0) {
        tracing::warn!(
            host = %escaped(host),
            suppressed,
            "status listener: refused a request for a Host it does not answer (a browser \
             led there by DNS rebinding, or a name missing from [status] allowed_hosts)"
        );
    }
    reply(
        StatusCode::MISDIRECTED_REQUEST,
        "text/plain; charset=utf-8",
        "this status listener does not answer this Host: use localhost or its address, or \
         add the name to [status] allowed_hosts\n"
            .to_owned(),
    )
}

/// `response` as the whole CGI answer of a FastCGI request (a listener's php-fpm
/// `status_path` or `ping_path`): its status, every header it has (so the security headers
/// are the status listener's), and its body unless the request was a HEAD.
pub fn cgi_answer(response: Response<Whole>, method: &Method) -> bytes::BytesMut {
    let code = response.status();
    let (parts, body) = response.into_parts();
    let body = body.into_bytes();
    let mut out = bytes::BytesMut::with_capacity(body.len() + 512);
    out.extend_from_slice(
        format!(
            "Status: {} {}\r\n",
            code.as_u16(),
            code.canonical_reason().unwrap_or("")
        )
        .as_bytes(),
    );
    for (name, value) in &parts.headers {
        out.extend_from_slice(name.as_str().as_bytes());
        out.extend_from_slice(b": ");
        out.extend_from_slice(value.as_bytes());
        out.extend_from_slice(b"\r\n");
    }
    out.extend_from_slice(b"\r\n");
    if method != Method::HEAD {
        out.extend_from_slice(&body);
    }
    out
}

/// Serves the status listener until `shutdown` is cancelled, counting its connections in
/// `admission`, and answering only the Hosts `status::host` allows (`allowed_hosts` being
/// the configured ones).
pub async fn serve(
    listener: Listener,
    admission: Arc<Admission>,
    gateway: Arc<Gateway>,
    source: Arc<StatusSource>,
    allowed_hosts: Arc<[String]>,
    shutdown: CancellationToken,
) {
    let address = listener
        .local_address()
        .map_or_else(|e| format!("<unknown: {e}>"), |a| a.to_string());
    // Not the front listeners' "listening" message: tools and tests that wait for the
    // front listeners count those lines, and the status listener is not one of them.
    tracing::info!(listener = %address, "status listener ready");
    loop {
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            () = shutdown.cancelled() => return,
        };
        let (stream, peer) = match accepted {
            Ok(Some(client)) => client,
            Ok(None) => continue,
            Err(e) => {
                tracing::warn!(listener = %address, error = %e, "status accept failed");
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                continue;
            }
        };
        // One table for the whole listener, no per-client cap: its few clients often
        // share an address (a local scraper and health check).
        let client = Client {
            listener: 0,
            addr: match peer {
                Peer::Tcp(a) => Some(a.ip()),
                Peer::Unix => None,
            },
            cap: None,
        };
        let Some(ticket) = admission.admit(client) else {
            continue;
        };
        // The address the client reached: a Host naming it is no rebinding.
        let local = match &stream {
            crate::net::Stream::Tcp(s) => s.local_addr().ok().map(|a| a.ip()),
            crate::net::Stream::Unix(_) => None,
        };
        let gateway = Arc::clone(&gateway);
        let source = Arc::clone(&source);
        let allowed_hosts = Arc::clone(&allowed_hosts);
        let shutdown = shutdown.clone();
        tokio::spawn(async move {
            let state = Arc::clone(ticket.state());
            let busy = Arc::clone(&state);
            let service = service_fn(move |req: Request<hyper::body::Incoming>| {
                // Answers are built at once and written whole; busy only while building.
                let _busy = busy.begin();
                let host = req.headers().get(header::HOST).map(|h| h.as_bytes());
                // `/ping` and `/ready` tell nothing, and load balancers check them under
                // any name.
                let probe = matches!(req.uri().path(), "/ping" | "/ready");
                let r = if probe || host::allowed(host, local, &allowed_hosts) {
                    answer(
                        &gateway,
                        &source,
                        req.method(),
                        req.uri().path(),
                        req.uri().query().unwrap_or(""),
                    )
                } else {
                    misdirected(host.unwrap_or_default())
                };
                async move { Ok::<_, Infallible>(r) }
            });
            // The same timing as the http front (see `front::http`): the watch times the
            // head and the keep-alive wait apart, hyper's header timer is a backstop.
            let conn = hyper::server::conn::http1::Builder::new()
                .max_buf_size(16 * 1024)
                .timer(TokioTimer::new())
                .header_read_timeout(STATUS_TIMEOUTS.header + STATUS_TIMEOUTS.idle)
                .serve_connection(
                    TokioIo::new(
                        Watched::new(stream, Arc::clone(&state))
                            .with_send_timeout(STATUS_TIMEOUTS.send),
                    ),
                    service,
                );
            // Status answers are immediate; on shutdown an idle keep-alive connection is
            // simply closed.
            tokio::select! {
                result = conn => {
                    if let Err(e) = result {
                        tracing::debug!(error = %e, "status connection ended with an error");
                    }
                }
                why = state.watch(STATUS_TIMEOUTS) => {
                    tracing::debug!(reason = %why, "closing a status connection");
                }
                () = shutdown.cancelled() => {}
            }
            drop(ticket);
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_answer_and_its_cgi_form_carry_the_security_headers() {
        let r = reply(StatusCode::OK, html::CONTENT_TYPE, "page".to_owned());
        for (name, value) in html::SECURITY_HEADERS {
            assert_eq!(r.headers().get(name).unwrap(), value, "{name}");
        }
        let cgi = cgi_answer(r, &Method::GET);
        let text = std::str::from_utf8(&cgi).unwrap();
        assert!(text.starts_with("Status: 200 OK\r\n"), "{text}");
        for (name, value) in html::SECURITY_HEADERS {
            assert!(text.contains(&format!("\r\n{name}: {value}\r\n")), "{text}");
        }
        assert!(text.ends_with("\r\n\r\npage"), "{text}");
        let head = cgi_answer(
            reply(StatusCode::OK, "text/plain", "x".into()),
            &Method::HEAD,
        );
        assert!(head.ends_with(b"\r\n\r\n"));
    }

    #[test]
    fn queries_are_read_like_php_fpm() {
        let q = Query::parse("json&full&pool=www");
        assert!(q.json && q.full && !q.openmetrics);
        assert_eq!(q.pool.as_deref(), Some("www"));
        assert_eq!(Query::parse(""), Query::default());
        assert!(Query::parse("openmetrics=1&x=y").openmetrics);
        let q = Query::parse("html&pool=www");
        assert!(q.html && !q.history && !q.json);
        assert!(Query::parse("history").history);
    }
}
