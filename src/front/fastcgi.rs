//! The `fastcgi` front listener: corral as the FastCGI responder that nginx `fastcgi_pass`,
//! Apache mod_proxy_fcgi, lighttpd or Caddy connect to, where they would connect to php-fpm.
//!
//! One reader loop per connection turns records into request events; each request is routed
//! once its FCGI_PARAMS stream ends, and dispatched in its own task with FCGI_STDIN fed through
//! a bounded channel (a slow backend slows the front server down). The tasks answer with
//! FCGI_STDOUT records through the connection's one writer task. Multiplexed request ids,
//! FCGI_ABORT_REQUEST (the task is dropped, which aborts the backend request and frees its
//! slot), FCGI_KEEP_CONN, FCGI_GET_VALUES and unknown record types are handled here.
//!
//! Timeouts: a request's FCGI_PARAMS must be complete within `header_timeout` of its
//! FCGI_BEGIN_REQUEST (a new connection's first request within `header_timeout` of accept),
//! an FCGI_KEEP_CONN connection with no request waits at most `idle_timeout` for the next,
//! and while FCGI_STDIN is open the front server must send something within `body_timeout`.
//! A connection past any of them is closed, aborting its requests' backend exchanges.
//!
//! The part shared with the SCGI front (routing a front server's parameters, the CGI answer
//! for a request that got no backend response, the lingering close) is in `common`.

use std::collections::HashMap;
use std::sync::Arc;

use bytes::{Bytes, BytesMut};
use tokio::io::{AsyncReadExt, AsyncWriteExt, ReadHalf, WriteHalf};
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::AbortOnDropHandle;

use crate::backend::{BodySender, RequestBody};
use crate::config::{FrontTimeouts, ListenAddress};
use crate::front::limits::{BusyGuard, ConnState, Expired, Ticket};
use crate::gateway::{Gateway, GatewayError, GatewayResponse};
use crate::net::Stream;
use crate::protocols::cgi_response::encode_head;
use crate::protocols::fastcgi::{
    answer_get_values, encode_end_request, encode_request_complete, encode_stdout,
    encode_unknown_type, Capabilities, FastCgiError, ProtocolStatus, RequestDecoder, RequestEvent,
    Role,
};

pub(crate) mod common;

use common::{content_length, error_answer, linger, log_failure, prepare};

/// Frames queued for the writer of one connection; with the body channel below, this bounds
/// what one connection holds in memory.
const OUT_FRAMES: usize = 16;
/// Request-body chunks in flight between the reader and one request's backend exchange.
const BODY_CHUNKS: usize = 4;
/// Bytes the reader asks for at a time.
const READ_CHUNK: usize = 16 * 1024;

/// Serves one FastCGI connection from a front server until it closes, breaks a rule, runs
/// past a timeout, is closed for room under the cap, or `shutdown` fires and its requests in
/// progress have been answered. `ticket` counts it in the cap table.
pub async fn serve_connection(
    stream: Stream,
    listener: ListenAddress,
    ticket: Ticket,
    timeouts: FrontTimeouts,
    gateway: Arc<Gateway>,
    shutdown: CancellationToken,
) {
    let (mut reader, writer) = tokio::io::split(stream);
    let (out, out_rx) = mpsc::channel(OUT_FRAMES);
    let closed = CancellationToken::new();
    let writer = tokio::spawn(write_loop(writer, out_rx, closed.clone()));
    let max = gateway.limits.max_concurrent_requests.max(1);
    let (done, done_rx) = mpsc::channel(max);
    let now = Instant::now();
    let mut conn = Connection {
        state: Arc::clone(ticket.state()),
        timeouts,
        idle_since: now,
        head_from: Some(now),
        last_read: now,
        decoder: RequestDecoder::new(&gateway.limits),
        caps: capabilities(&gateway),
        gateway,
        listener,
        requests: HashMap::new(),
        next_seq: 1,
        out,
        done,
        closed,
    };
    let closed_by_us = conn.run(&mut reader, done_rx, shutdown).await;
    // Whatever is still in progress has lost its client: dropping the tasks aborts their
    // backend requests and gives their slots back.
    conn.requests.clear();
    drop(conn);
    if let Err(e) = writer.await {
        tracing::error!(error = %e, "fastcgi front writer task failed");
    }
    if closed_by_us {
        linger(&mut reader).await;
    }
}

/// What this front answers to FCGI_GET_VALUES: it multiplexes, and one connection carries at
/// most `Limits::max_concurrent_requests` requests at once. The gateway does not expose the
/// pools' slot caps yet, so FCGI_MAX_CONNS (unbounded here) is left out, as the specification
/// allows for a value the application does not know.
fn capabilities(gateway: &Gateway) -> Capabilities {
    Capabilities {
        max_conns: None,
        max_reqs: u32::try_from(gateway.limits.max_concurrent_requests).ok(),
        mpxs_conns: Some(true),
    }
}

/// One frame for the writer: bytes of request `id`'s answer (`seq` tells apart requests that
/// reuse an id). `last` marks the frame that ends the request: later frames of the same
/// request are dropped, so an aborted request never gets a second FCGI_END_REQUEST. `close`
/// closes the connection after the frame.
#[derive(Debug)]
struct Out {
    id: u16,
    seq: u64,
    bytes: BytesMut,
    last: bool,
    close: bool,
}

/// Writes frames in order until the channel ends, a write fails, or a frame says close; then
/// tells the reader through `closed`.
async fn write_loop(
    mut writer: WriteHalf<Stream>,
    mut frames: mpsc::Receiver<Out>,
    closed: CancellationToken,
) {
    // Last ended request per id; sequence numbers only grow, so one entry per id suffices.
    let mut ended: HashMap<u16, u64> = HashMap::new();
    while let Some(frame) = frames.recv().await {
        let stale = frame.seq != 0 && ended.get(&frame.id).is_some_and(|&s| frame.seq <= s);
        if !stale && !frame.bytes.is_empty() {
            if let Err(e) = writer.write_all(&frame.bytes).await {
                tracing::debug!(error = %e, "fastcgi front server went away while answered");
                break;
            }
        }
        if frame.last {
            ended.insert(frame.id, frame.seq);
        }
        if frame.close {
            break;
        }
    }
    closed.cancel();
    let _ = writer.shutdown().await;
}

/// One request id in progress.
#[derive(Debug)]
struct Active {
    seq: u64,
    keep_conn: bool,
    body: Option<BodySender>,
    /// The dispatching task, from the end of FCGI_PARAMS; dropping it aborts the request.
    task: Option<AbortOnDropHandle<()>>,
    /// When FCGI_BEGIN_REQUEST arrived (FCGI_PARAMS must end within `header_timeout`).
    begun: Instant,
    /// Counts the connection busy from the end of FCGI_PARAMS.
    busy: Option<BusyGuard>,
}

/// The reader side of one connection.
struct Connection {
    state: Arc<ConnState>,
    timeouts: FrontTimeouts,
    /// When the connection last had no request (accept, or its last request's end).
    idle_since: Instant,
    /// With no request in progress: when the bytes of the next began to arrive (accept, on
    /// a new connection); `None` while nothing has.
    head_from: Option<Instant>,
    /// The last time the reader got bytes or finished handling them (time spent blocked on
    /// a full body channel is the backend's, not the front server's).
    last_read: Instant,
    decoder: RequestDecoder,
    caps: Capabilities,
    gateway: Arc<Gateway>,
    listener: ListenAddress,
    requests: HashMap<u16, Active>,
    next_seq: u64,
    out: mpsc::Sender<Out>,
    done: mpsc::Sender<Done>,
    closed: CancellationToken,
}

/// Whether the reader goes on.
enum Flow {
    Continue,
    Stop,
}

impl Connection {
    /// Reads and handles events until the connection ends; true when corral closed it (the
    /// writer ended), so the caller lingers.
    async fn run(
        &mut self,
        reader: &mut ReadHalf<Stream>,
        mut done_rx: mpsc::Receiver<Done>,
        shutdown: CancellationToken,
    ) -> bool {
        let mut buf = BytesMut::with_capacity(READ_CHUNK);
        let mut draining = false;
        let mut was_idle = true;
        let mut read_any = false;
        loop {
            loop {
                let event = match self.decoder.decode(&mut buf) {
                    Ok(Some(event)) => event,
                    Ok(None) => break,
                    Err(e) => {
                        broken(&e);
                        return false;
                    }
                };
                if let Flow::Stop = self.on_event(event).await {
                    return self.closed.is_cancelled();
                }
            }
            if draining && self.requests.is_empty() {
                return false;
            }
            let now = Instant::now();
            self.last_read = now;
            let idle = self.requests.is_empty();
            // Idle again: after the last request ended, or after records that were no
            // request (FCGI_GET_VALUES, unknown types) left nothing half-read. A new
            // connection keeps counting its head from accept until something arrives.
            let answered_all = read_any && buf.is_empty() && self.head_from.is_some();
            if idle && (!was_idle || answered_all) {
                self.idle_since = now;
                self.head_from = (!buf.is_empty()).then_some(now);
            }
            was_idle = idle;
            let deadline = self.deadline();
            let expiry = async {
                match deadline {
                    Some((at, why)) => {
                        tokio::time::sleep_until(at).await;
                        why
                    }
                    None => std::future::pending().await,
                }
            };
            buf.reserve(READ_CHUNK);
            tokio::select! {
                read = reader.read_buf(&mut buf) => match read {
                    Ok(0) => {
                        if !self.requests.is_empty() {
                            tracing::debug!("fastcgi front server closed the connection with requests in progress");
                        }
                        return false;
                    }
                    Ok(_) => {
                        read_any = true;
                        if self.requests.is_empty() && self.head_from.is_none() {
                            self.head_from = Some(Instant::now());
                        }
                    }
                    Err(e) => {
                        tracing::debug!(error = %e, "fastcgi front connection failed");
                        return false;
                    }
                },
                why = expiry => {
                    tracing::debug!(reason = %why, requests = self.requests.len(), "closing a fastcgi front connection");
                    return false;
                }
                // The table picks idle connections only; one whose request was dispatched
                // as it was picked is closed once that request is done.
                () = self.state.evicted().cancelled(), if self.state.is_idle() => {
                    tracing::debug!(reason = %Expired::Evicted, "closing a fastcgi front connection");
                    return false;
                }
                Some(done) = done_rx.recv() => {
                    if let Flow::Stop = self.on_done(done).await {
                        return self.closed.is_cancelled();
                    }
                }
                () = self.closed.cancelled() => return true,
                () = shutdown.cancelled(), if !draining => draining = true,
            }
        }
    }

    /// When the connection is closed if nothing arrives: the earliest of the head deadlines
    /// of requests whose FCGI_PARAMS has not ended, the body deadline while some FCGI_STDIN is
    /// open, and, with no request, the head or idle deadline. `None` while every request
    /// waits only on its backend (the pool's timeouts bound that).
    fn deadline(&self) -> Option<(Instant, Expired)> {
        let t = &self.timeouts;
        if self.requests.is_empty() {
            return Some(match self.head_from {
                Some(from) => (from + t.header, Expired::Head),
                None => (self.idle_since + t.idle, Expired::Idle),
            });
        }
        self.requests
            .values()
            .filter_map(|r| {
                if r.task.is_none() {
                    Some((r.begun + t.header, Expired::Head))
                } else if r.body.is_some() {
                    Some((self.last_read + t.body, Expired::Body))
                } else {
                    None
                }
            })
            .min_by_key(|(at, _)| *at)
    }

    /// A request's task has sent its answer: forget the id, then send the end. In this order
    /// a front server that reuses the id as soon as it sees FCGI_END_REQUEST finds it free.
    async fn on_done(&mut self, done: Done) -> Flow {
        if self
            .requests
            .get(&done.id)
            .is_none_or(|r| r.seq != done.seq)
        {
            // Aborted meanwhile: the abort has been answered.
            return Flow::Continue;
        }
        self.requests.remove(&done.id);
        self.decoder.finish(done.id);
        self.send(Out {
            id: done.id,
            seq: done.seq,
            bytes: done.ending.bytes,
            last: true,
            close: done.ending.close,
        })
        .await
    }

    async fn on_event(&mut self, event: RequestEvent) -> Flow {
        match event {
            RequestEvent::Begin {
                request_id,
                role,
                keep_conn,
            } => {
                let seq = self.seq();
                if role != Role::Responder {
                    self.decoder.finish(request_id);
                    return self
                        .end(request_id, seq, ProtocolStatus::UnknownRole, keep_conn)
                        .await;
                }
                self.head_from = None;
                self.requests.insert(
                    request_id,
                    Active {
                        seq,
                        keep_conn,
                        body: None,
                        task: None,
                        begun: Instant::now(),
                        busy: None,
                    },
                );
                Flow::Continue
            }
            RequestEvent::Rejected {
                request_id,
                keep_conn,
                status,
            } => {
                let seq = self.seq();
                self.end(request_id, seq, status, keep_conn).await
            }
            RequestEvent::Params { request_id, params } => self.start(request_id, params).await,
            RequestEvent::Stdin { request_id, data } => self.stdin(request_id, data).await,
            RequestEvent::StdinEnd { request_id } => {
                // Dropping the sender ends the body.
                if let Some(r) = self.requests.get_mut(&request_id) {
                    r.body = None;
                }
                Flow::Continue
            }
            // Only the FILTER role has a data stream, and it is refused at FCGI_BEGIN_REQUEST.
            RequestEvent::Data { .. } | RequestEvent::DataEnd { .. } => Flow::Continue,
            RequestEvent::Abort { request_id } => {
                let Some(r) = self.requests.remove(&request_id) else {
                    return Flow::Continue;
                };
                tracing::debug!(
                    fcgi_request_id = request_id,
                    "fastcgi front server aborted a request"
                );
                self.decoder.finish(request_id);
                // Dropping the task aborts the backend exchange and frees its slot.
                drop(r.task);
                self.end(
                    request_id,
                    r.seq,
                    ProtocolStatus::RequestComplete,
                    r.keep_conn,
                )
                .await
            }
            RequestEvent::GetValues { names } => {
                let mut bytes = BytesMut::new();
                if let Err(e) = answer_get_values(&names, &self.caps, &mut bytes) {
                    tracing::warn!(error = %e, "cannot answer FCGI_GET_VALUES");
                    return Flow::Continue;
                }
                self.send(Out {
                    id: 0,
                    seq: 0,
                    bytes,
                    last: false,
                    close: false,
                })
                .await
            }
            RequestEvent::UnknownType { kind } => {
                tracing::debug!(kind, "fastcgi front server sent an unknown record type");
                let mut bytes = BytesMut::new();
                encode_unknown_type(kind, &mut bytes);
                self.send(Out {
                    id: 0,
                    seq: 0,
                    bytes,
                    last: false,
                    close: false,
                })
                .await
            }
        }
    }

    fn seq(&mut self) -> u64 {
        let seq = self.next_seq;
        self.next_seq += 1;
        seq
    }

    /// Answers FCGI_END_REQUEST with `status` and no output.
    async fn end(&mut self, id: u16, seq: u64, status: ProtocolStatus, keep_conn: bool) -> Flow {
        let mut bytes = BytesMut::new();
        encode_end_request(id, 0, status, &mut bytes);
        self.send(Out {
            id,
            seq,
            bytes,
            last: true,
            close: !keep_conn,
        })
        .await
    }

    async fn send(&mut self, out: Out) -> Flow {
        match self.out.send(out).await {
            Ok(()) => Flow::Continue,
            Err(_) => Flow::Stop,
        }
    }

    /// FCGI_PARAMS ended: route, normalise, and dispatch in a task of its own.
    async fn start(&mut self, id: u16, params: Vec<(Bytes, Bytes)>) -> Flow {
        let Some(r) = self.requests.get(&id) else {
            return Flow::Continue;
        };
        let request_id = self.gateway.request_id();
        let responder = Responder {
            id,
            seq: r.seq,
            keep_conn: r.keep_conn,
            request_id,
            out: self.out.clone(),
        };
        let len = content_length(&params);
        let ctx = prepare(&self.gateway, &self.listener, params, request_id);
        let (ctx, params) = match ctx {
            Ok(prepared) => prepared,
            Err(e) => {
                self.requests.remove(&id);
                self.decoder.finish(id);
                let ending = responder.error(&e).await;
                return self
                    .send(Out {
                        id,
                        seq: responder.seq,
                        bytes: ending.bytes,
                        last: true,
                        close: ending.close,
                    })
                    .await;
            }
        };
        let (tx, body) = RequestBody::channel(len, BODY_CHUNKS);
        let gateway = Arc::clone(&self.gateway);
        let done = self.done.clone();
        let task = tokio::spawn(async move {
            let (id, seq) = (responder.id, responder.seq);
            let response = gateway.dispatch(ctx, params, body, request_id).await;
            let ending = responder.answer(response).await;
            let _ = done.send(Done { id, seq, ending }).await;
        });
        if let Some(r) = self.requests.get_mut(&id) {
            r.body = Some(tx);
            r.task = Some(AbortOnDropHandle::new(task));
            r.busy = Some(self.state.begin());
        }
        Flow::Continue
    }

    /// Hands FCGI_STDIN bytes to the request's body, waiting while its channel is full.
    async fn stdin(&mut self, id: u16, data: Bytes) -> Flow {
        let Some(tx) = self.requests.get(&id).and_then(|r| r.body.clone()) else {
            return Flow::Continue;
        };
        tokio::select! {
            sent = tx.send(data) => {
                if sent.is_err() {
                    // The exchange no longer reads the body (it failed or answered early):
                    // the rest of FCGI_STDIN is read and dropped.
                    if let Some(r) = self.requests.get_mut(&id) {
                        r.body = None;
                    }
                }
                Flow::Continue
            }
            () = self.closed.cancelled() => Flow::Stop,
        }
    }
}

/// Logs a connection that broke the FastCGI protocol; the caller closes it.
fn broken(e: &FastCgiError) {
    tracing::warn!(rule = %e, "fastcgi front server broke the protocol; closing the connection");
}

/// A request's task has answered: `ending` goes out once the reader has forgotten the id.
#[derive(Debug)]
struct Done {
    id: u16,
    seq: u64,
    ending: Ending,
}

/// The frame that ends a request (the end of FCGI_STDOUT and FCGI_END_REQUEST, or nothing to
/// cut the response short) and whether the connection closes after it.
#[derive(Debug)]
struct Ending {
    bytes: BytesMut,
    close: bool,
}

/// Writes one request's answer as FCGI_STDOUT records.
struct Responder {
    id: u16,
    seq: u64,
    keep_conn: bool,
    request_id: u64,
    out: mpsc::Sender<Out>,
}

impl Responder {
    /// Queues FCGI_STDOUT bytes; false if the connection is gone.
    async fn send(&self, bytes: BytesMut) -> bool {
        let out = Out {
            id: self.id,
            seq: self.seq,
            bytes,
            last: false,
            close: false,
        };
        self.out.send(out).await.is_ok()
    }

    /// The usual end: FCGI_STDOUT's end and FCGI_END_REQUEST with REQUEST_COMPLETE.
    fn complete(&self) -> Ending {
        let mut bytes = BytesMut::new();
        encode_request_complete(self.id, 0, &mut bytes);
        Ending {
            bytes,
            close: !self.keep_conn,
        }
    }

    /// Streams the backend's answer, or the CGI answer for the error; returns the ending.
    async fn answer(&self, response: Result<GatewayResponse, GatewayError>) -> Ending {
        let mut response = match response {
            Ok(r) => r,
            Err(e) => return self.error(&e).await,
        };
        let mut head = BytesMut::new();
        if let Err(e) = encode_head(&response.head, &mut head) {
            tracing::warn!(request_id = self.request_id, error = %e, "backend response head cannot be passed on");
            return self.send_cgi(&error_answer(502, None)).await;
        }
        let mut frame = BytesMut::with_capacity(head.len() + 16);
        encode_stdout(self.id, &head, &mut frame);
        if !self.send(frame).await {
            return self.complete();
        }
        while let Some(chunk) = response.body.next_chunk().await {
            match chunk {
                Ok(data) => {
                    let mut frame = BytesMut::with_capacity(data.len() + 16);
                    encode_stdout(self.id, &data, &mut frame);
                    if !self.send(frame).await {
                        return self.complete();
                    }
                }
                Err(e) => {
                    // The status has gone out: closing without FCGI_END_REQUEST is the only
                    // way to tell the front server the response is cut short.
                    tracing::warn!(request_id = self.request_id, error = %e, "backend response broke off; closing the fastcgi connection");
                    return Ending {
                        bytes: BytesMut::new(),
                        close: true,
                    };
                }
            }
        }
        self.complete()
    }

    /// Sends the CGI answer for a request that got no backend response; returns the ending.
    async fn error(&self, e: &GatewayError) -> Ending {
        log_failure(self.request_id, e);
        self.send_cgi(&error_answer(e.status(), e.retry_after()))
            .await
    }

    async fn send_cgi(&self, cgi: &[u8]) -> Ending {
        let mut bytes = BytesMut::with_capacity(cgi.len() + 16);
        encode_stdout(self.id, cgi, &mut bytes);
        self.send(bytes).await;
        self.complete()
    }
}
