//! The `fastcgi` front listener: corral as the FastCGI responder that nginx `fastcgi_pass`,
//! Apache mod_proxy_fcgi, lighttpd or Caddy connect to, where they would connect to php-fpm.
//!
//! One reader loop per connection turns records into request events; each request is routed
//! once its FCGI_PARAMS stream ends and dispatched. Requests answer with FCGI_STDOUT records
//! through the connection's one writer, which runs beside the reader in the connection's
//! task. One request at a time is served in that task too (a front server that does not
//! multiplex, as nginx, Apache and Caddy do not, never needs another task); a request
//! multiplexed beside it gets a task of its own.
//!
//! The reader never waits for one request while others share the connection: a request that
//! waits in its pool's queue, or whose backend reads slowly, must not hold up another
//! request's records or an FCGI_ABORT_REQUEST. FCGI_STDIN bytes are therefore handed over
//! without waiting, against a byte budget per request and per connection. FastCGI has no flow
//! control per request, so when a request runs past its budget: alone on its connection (how
//! nginx, Apache and Caddy use FastCGI), the reader waits for its backend to read, and a slow
//! backend slows the front server down; multiplexed with others, the request is refused with
//! a 503 and FCGI_END_REQUEST status FCGI_OVERLOADED, so the others go on. What one
//! connection can make corral hold is bounded by `Limits` (ids in flight, parameters per id)
//! and by the two budgets below. Multiplexed request ids,
//! FCGI_ABORT_REQUEST (the task is dropped, which aborts the backend request and frees its
//! slot), FCGI_KEEP_CONN, FCGI_GET_VALUES and unknown record types are handled here.
//!
//! Timeouts: a request's FCGI_PARAMS must be complete within `header_timeout` of its
//! FCGI_BEGIN_REQUEST (a new connection's first request within `header_timeout` of accept),
//! an FCGI_KEEP_CONN connection with no request waits at most `idle_timeout` for the next,
//! and while FCGI_STDIN is open the front server must send something within `body_timeout`.
//! A connection past any of them is closed, aborting its requests' backend exchanges.
//! `body_deadline` is per request (`stdin`): once its exchange has waited that long in all for
//! its FCGI_STDIN, the request alone is answered 408 and its backend exchange aborted.
//!
//! The part shared with the SCGI front (routing a front server's parameters, the CGI answer
//! for a request that got no backend response, the lingering close) is in `crate::front::cgi`.

use std::collections::HashMap;
use std::pin::Pin;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::{Bytes, BytesMut};
use tokio::io::{AsyncReadExt, AsyncWriteExt, ReadHalf, WriteHalf};
use tokio::sync::{mpsc, Semaphore};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::AbortOnDropHandle;

use crate::config::{FrontTimeouts, ListenAddress};
use crate::front::limits::{BusyGuard, ConnState, Expired, Ticket};
use crate::gateway::{Gateway, GatewayError, GatewayResponse};
use crate::logs::{LineLimit, Verdict};
use crate::net::Stream;
use crate::protocols::fastcgi::{
    answer_get_values, encode_end_request, encode_request_complete, encode_stdout,
    encode_stdout_end, encode_unknown_type, Capabilities, FastCgiError, FrontParamsDecoder,
    ProtocolStatus, RequestDecoder, RequestEvent, Role,
};
use crate::protocols::cgi::FrontParams;

use crate::front::cgi::{self, content_length, error_answer, linger, prepare, CgiSink, Relayed};

mod stdin;
use stdin::{StdinSender, STDIN_BUDGET_PER_REQUEST};

/// Frames queued for the writer of one connection; with the body channel below, this bounds
/// what one connection holds in memory.
const OUT_FRAMES: usize = 16;
/// FCGI_STDIN bytes one connection holds for backends that have not read them yet.
const STDIN_BUDGET: usize = 1024 * 1024;
/// Retry-After of the 503 that refuses a request whose body outran its budget.
const OVERLOADED_RETRY_AFTER: u32 = 1;
/// Bytes the reader asks for at a time.
const READ_CHUNK: usize = 16 * 1024;
/// Queued frames are gathered into one write up to about this many bytes.
const WRITE_BATCH: usize = 64 * 1024;

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
    // The writer runs beside the reader in this connection's task (joined below), not in a
    // task of its own: a front server that opens a connection per request would otherwise
    // pay a task per connection, and every frame a wake-up of another task.
    let writer = write_loop(writer, out_rx, closed.clone());
    let max = gateway.limits.max_concurrent_requests.max(1);
    let (done, done_rx) = mpsc::channel(max);
    let now = Instant::now();
    let mut conn = Connection {
        state: Arc::clone(ticket.state()),
        timeouts,
        idle_since: now,
        head_from: Some(now),
        last_read: now,
        decoder: RequestDecoder::collecting(&gateway.limits),
        caps: capabilities(&gateway),
        gateway,
        listener,
        requests: HashMap::new(),
        next_seq: 1,
        stdin_budget: Arc::new(Semaphore::new(STDIN_BUDGET)),
        out,
        done,
        closed,
        input_pending: false,
        inline: None,
        inline_done: None,
    };
    let mut buf = BytesMut::with_capacity(READ_CHUNK);
    let reading = async {
        let closed_by_us = conn.run(&mut reader, &mut buf, done_rx, shutdown).await;
        let linger_needed = closed_by_us && conn.input_may_follow(&buf);
        // Whatever is still in progress has lost its client: dropping the tasks aborts their
        // backend requests and gives their slots back. Dropping the connection drops its
        // sender of frames, which ends the writer once the requests' senders are gone too.
        conn.requests.clear();
        drop(conn);
        linger_needed
    };
    let (linger_needed, ()) = tokio::join!(reading, writer);
    if linger_needed {
        linger(&mut reader, buf).await;
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
    // The frames queued by the time the writer runs go out in one write: a response's head,
    // body and FCGI_END_REQUEST are one system call, not three.
    let mut batch = BytesMut::new();
    'frames: while let Some(first) = frames.recv().await {
        let mut next = Some(first);
        let mut close = false;
        while let Some(frame) = next.take() {
            let stale = frame.seq != 0 && ended.get(&frame.id).is_some_and(|&s| frame.seq <= s);
            if !stale && !frame.bytes.is_empty() {
                if batch.is_empty() {
                    batch = frame.bytes;
                } else {
                    batch.extend_from_slice(&frame.bytes);
                }
            }
            if frame.last {
                ended.insert(frame.id, frame.seq);
            }
            if frame.close {
                close = true;
                break;
            }
            if batch.len() < WRITE_BATCH {
                next = frames.try_recv().ok();
            }
        }
        if !batch.is_empty() {
            if let Err(e) = writer.write_all(&batch).await {
                tracing::debug!(error = %e, "fastcgi front server went away while answered");
                break 'frames;
            }
            batch.clear();
        }
        if close {
            break;
        }
    }
    closed.cancel();
    let _ = writer.shutdown().await;
}

/// Where a request's answer stands, shared by the reader and the request's task so that
/// exactly one of them writes the response head.
const ANSWER_NOT_STARTED: u8 = 0;
const ANSWER_STARTED: u8 = 1;
const ANSWER_REFUSED: u8 = 2;

/// One request id in progress.
#[derive(Debug)]
struct Active {
    seq: u64,
    keep_conn: bool,
    body: Option<StdinSender>,
    /// FCGI_STDIN's empty record arrived.
    stdin_ended: bool,
    /// `ANSWER_*`.
    answer: Arc<AtomicU8>,
    /// How the request is dispatched, from the end of FCGI_PARAMS.
    task: Option<Dispatch>,
    /// When FCGI_BEGIN_REQUEST arrived (FCGI_PARAMS must end within `header_timeout`).
    begun: Instant,
    /// Counts the connection busy from the end of FCGI_PARAMS.
    busy: Option<BusyGuard>,
}

/// How a request whose FCGI_PARAMS ended is being served; dropping it aborts the request.
#[derive(Debug)]
enum Dispatch {
    /// In a task of its own (a request multiplexed beside the inline one).
    Spawned(#[allow(dead_code)] AbortOnDropHandle<()>),
    /// In the connection's own task: [`Connection::inline`].
    Inline,
}

/// The request a connection serves in its own task, as nginx, Apache and Caddy use FastCGI
/// (one request at a time): no task to spawn and no channel to report back through. Further
/// requests multiplexed beside it get tasks of their own.
struct Inline {
    id: u16,
    seq: u64,
    answer: Pin<Box<dyn std::future::Future<Output = Ending> + Send>>,
}

/// Polls the inline request, if any, to its ending.
fn poll_inline(inline: &mut Option<Inline>, cx: &mut Context<'_>) -> Poll<Done> {
    let Some(i) = inline.as_mut() else {
        return Poll::Pending;
    };
    let ending = std::task::ready!(i.answer.as_mut().poll(cx));
    let (id, seq) = (i.id, i.seq);
    *inline = None;
    Poll::Ready(Done { id, seq, ending })
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
    decoder: RequestDecoder<FrontParamsDecoder>,
    caps: Capabilities,
    gateway: Arc<Gateway>,
    listener: ListenAddress,
    requests: HashMap<u16, Active>,
    next_seq: u64,
    /// `STDIN_BUDGET` bytes, one permit per byte held.
    stdin_budget: Arc<Semaphore>,
    out: mpsc::Sender<Out>,
    done: mpsc::Sender<Done>,
    closed: CancellationToken,
    /// A request was ended before the front server had sent all of its records (answered
    /// without a backend, answered before its FCGI_STDIN ended, or refused): more bytes may
    /// follow, so closing must linger.
    input_pending: bool,
    /// The request served in this task, if any.
    inline: Option<Inline>,
    /// The inline request's ending, when it came while the reader waited on something else
    /// (body budget): handled at the top of the next turn of the loop.
    inline_done: Option<Done>,
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
        buf: &mut BytesMut,
        mut done_rx: mpsc::Receiver<Done>,
        shutdown: CancellationToken,
    ) -> bool {
        let mut draining = false;
        let mut was_idle = true;
        let mut read_any = false;
        loop {
            if let Some(done) = self.inline_done.take() {
                if let Flow::Stop = self.on_done(done).await {
                    return self.closed.is_cancelled();
                }
            }
            loop {
                let event = match self.decoder.decode(buf) {
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
                read = reader.read_buf(buf) => match read {
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
                done = std::future::poll_fn(|cx| poll_inline(&mut self.inline, cx)), if self.inline.is_some() => {
                    if let Flow::Stop = self.on_done(done).await {
                        return self.closed.is_cancelled();
                    }
                }
                () = self.closed.cancelled() => return true,
                () = shutdown.cancelled(), if !draining => draining = true,
            }
        }
    }

    /// After corral closed the connection: whether the front server may still be sending,
    /// so that closing at once could reset the connection before it read the answer. Not so
    /// when every request it began was read to its end (how a front server that does not keep
    /// connections leaves one), which spares the lingering read at the end of each.
    fn input_may_follow(&self, buf: &BytesMut) -> bool {
        self.input_pending || !self.requests.is_empty() || !buf.is_empty()
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
        if let Some(r) = self.requests.remove(&done.id) {
            self.input_pending |= !r.stdin_ended;
        }
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

    async fn on_event(&mut self, event: RequestEvent<FrontParams>) -> Flow {
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
                        stdin_ended: false,
                        answer: Arc::new(AtomicU8::new(ANSWER_NOT_STARTED)),
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
                static OVER_LIMIT: LineLimit = LineLimit::per_second();
                let verdict = OVER_LIMIT.check(tokio::time::Instant::now(), 0);
                if let (true, Verdict::Log { suppressed }) =
                    (status != ProtocolStatus::UnknownRole, verdict)
                {
                    tracing::warn!(
                        fcgi_request_id = request_id,
                        suppressed,
                        limit = self.gateway.limits.max_concurrent_requests,
                        %status,
                        "fastcgi front server began more requests than one connection may carry; refused"
                    );
                }
                let seq = self.seq();
                self.end(request_id, seq, status, keep_conn).await
            }
            RequestEvent::Params { request_id, params } => self.start(request_id, params).await,
            RequestEvent::Stdin { request_id, data } => self.stdin(request_id, data).await,
            RequestEvent::StdinEnd { request_id } => {
                // Dropping the sender ends the body.
                if let Some(r) = self.requests.get_mut(&request_id) {
                    r.body = None;
                    r.stdin_ended = true;
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
                self.drop_dispatch(request_id, r.seq, r.task);
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

    /// Drops how request `id` (`seq`) is dispatched, which aborts its backend exchange.
    fn drop_dispatch(&mut self, id: u16, seq: u64, task: Option<Dispatch>) {
        if let Some(Dispatch::Inline) = task {
            if self
                .inline
                .as_ref()
                .is_some_and(|i| i.id == id && i.seq == seq)
            {
                self.inline = None;
            }
        }
        drop(task);
    }

    fn seq(&mut self) -> u64 {
        let seq = self.next_seq;
        self.next_seq += 1;
        seq
    }

    /// Answers FCGI_END_REQUEST with `status` and no output.
    async fn end(&mut self, id: u16, seq: u64, status: ProtocolStatus, keep_conn: bool) -> Flow {
        self.input_pending = true;
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

    /// Ends request `id`, answered without a backend: forgets it and queues the rest of its
    /// answer (FCGI_END_REQUEST).
    async fn answered(&mut self, id: u16, seq: u64, ending: Ending) -> Flow {
        self.input_pending = true;
        self.requests.remove(&id);
        self.decoder.finish(id);
        self.send(Out {
            id,
            seq,
            bytes: ending.bytes,
            last: true,
            close: ending.close,
        })
        .await
    }

    /// FCGI_PARAMS ended: route, normalise, and dispatch in a task of its own.
    async fn start(&mut self, id: u16, params: FrontParams) -> Flow {
        let Some(r) = self.requests.get(&id) else {
            return Flow::Continue;
        };
        let request_id = self.gateway.request_id();
        let mut responder = Responder {
            id,
            seq: r.seq,
            keep_conn: r.keep_conn,
            request_id,
            answer: Arc::clone(&r.answer),
            out: self.out.clone(),
        };
        if let Some(cgi) = self.gateway.fpm_answer(&self.listener, &params) {
            // php-fpm's status or ping path: answered by corral, never by a worker.
            let ending = responder.send_cgi(&cgi).await;
            return self.answered(id, responder.seq, ending).await;
        }
        let len = match content_length(&params) {
            Ok(len) => len,
            Err(e) => {
                let ending = responder.error(&GatewayError::from(e)).await;
                return self.answered(id, responder.seq, ending).await;
            }
        };
        let prepared = prepare(&self.gateway, &self.listener, params, request_id);
        let (routed, params) = match prepared {
            Ok(prepared) => prepared,
            Err(e) => {
                let ending = responder.error(&e).await;
                return self.answered(id, responder.seq, ending).await;
            }
        };
        let (tx, body) = stdin::channel(len, self.timeouts.body_total);
        let gateway = Arc::clone(&self.gateway);
        let seq = responder.seq;
        let answer = async move {
            let response = gateway.dispatch(&routed, params, body, request_id).await;
            responder.answer(response).await
        };
        let dispatch = if self.inline.is_none() {
            self.inline = Some(Inline {
                id,
                seq,
                answer: Box::pin(answer),
            });
            Dispatch::Inline
        } else {
            let done = self.done.clone();
            let task = tokio::spawn(async move {
                let ending = answer.await;
                let _ = done.send(Done { id, seq, ending }).await;
            });
            Dispatch::Spawned(AbortOnDropHandle::new(task))
        };
        if let Some(r) = self.requests.get_mut(&id) {
            r.body = Some(tx);
            r.task = Some(dispatch);
            r.busy = Some(self.state.begin());
        }
        Flow::Continue
    }

    /// Hands FCGI_STDIN bytes to the request's body within the budgets; see the module
    /// documentation for what happens past them.
    async fn stdin(&mut self, id: u16, data: Bytes) -> Flow {
        let Some(body) = self.requests.get(&id).and_then(|r| r.body.clone()) else {
            return Flow::Continue;
        };
        // One record carries at most 65535 bytes, far below both budgets.
        let n = u32::try_from(data.len()).unwrap_or(u32::MAX);
        let permits = match body.try_reserve(&self.stdin_budget, n) {
            Some(permits) => permits,
            None if self.requests.len() == 1 => {
                // The backend that takes the bytes may be the inline request's, which runs
                // only while this task polls it: it is polled meanwhile, and should it end, its
                // ending is kept for the loop (its body is dropped, which gives the permits
                // back).
                let reserve = body.reserve(&self.stdin_budget, n);
                tokio::pin!(reserve);
                loop {
                    tokio::select! {
                        permits = &mut reserve => match permits {
                            Some(permits) => break permits,
                            // The semaphores are never closed; were they, the body is dropped.
                            None => return Flow::Continue,
                        },
                        () = self.closed.cancelled() => return Flow::Stop,
                        done = std::future::poll_fn(|cx| poll_inline(&mut self.inline, cx)), if self.inline.is_some() => {
                            self.inline_done = Some(done);
                        }
                    }
                }
            }
            None => return self.overflow(id).await,
        };
        if !body.send(data, permits) {
            // The exchange no longer reads the body (it failed or answered early): the rest
            // of FCGI_STDIN is read and dropped.
            if let Some(r) = self.requests.get_mut(&id) {
                r.body = None;
            }
        }
        Flow::Continue
    }

    /// A multiplexed request's body outran its budget: the request is dropped (which aborts
    /// its backend exchange) and refused with a 503, unless its response has begun, and with
    /// FCGI_END_REQUEST status FCGI_OVERLOADED; the connection and its other requests go on.
    async fn overflow(&mut self, id: u16) -> Flow {
        let Some(r) = self.requests.remove(&id) else {
            return Flow::Continue;
        };
        self.input_pending = true;
        self.decoder.finish(id);
        self.drop_dispatch(id, r.seq, r.task);
        static OVERFLOW: LineLimit = LineLimit::per_second();
        if let Verdict::Log { suppressed } = OVERFLOW.check(tokio::time::Instant::now(), 0) {
            tracing::warn!(
                fcgi_request_id = id,
                suppressed,
                per_request = STDIN_BUDGET_PER_REQUEST,
                per_connection = STDIN_BUDGET,
                "fastcgi front server sends a request body faster than the backend reads it, on a \
             connection with other requests in progress; refused the request (FCGI_OVERLOADED)"
            );
        }
        let mut bytes = BytesMut::new();
        let head_is_ours = r
            .answer
            .compare_exchange(
                ANSWER_NOT_STARTED,
                ANSWER_REFUSED,
                Ordering::AcqRel,
                Ordering::Acquire,
            )
            .is_ok();
        if head_is_ours {
            encode_stdout(
                id,
                &error_answer(503, Some(OVERLOADED_RETRY_AFTER)),
                &mut bytes,
            );
            encode_stdout_end(id, &mut bytes);
        }
        encode_end_request(id, 0, ProtocolStatus::Overloaded, &mut bytes);
        self.send(Out {
            id,
            seq: r.seq,
            bytes,
            last: true,
            close: !r.keep_conn,
        })
        .await
    }
}

/// Logs a connection that broke the FastCGI protocol; the caller closes it.
fn broken(e: &FastCgiError) {
    static BROKEN: LineLimit = LineLimit::per_second();
    let Verdict::Log { suppressed } = BROKEN.check(tokio::time::Instant::now(), 0) else {
        return;
    };
    tracing::warn!(rule = %crate::logs::clean(e), suppressed, "fastcgi front server broke the protocol; closing the connection");
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
    /// `ANSWER_*`, shared with the reader.
    answer: Arc<AtomicU8>,
    out: mpsc::Sender<Out>,
}

impl Responder {
    /// Queues FCGI_STDOUT bytes; false if the connection is gone or the reader has refused
    /// the request meanwhile.
    async fn queue(&self, bytes: BytesMut) -> bool {
        let state = self.answer.compare_exchange(
            ANSWER_NOT_STARTED,
            ANSWER_STARTED,
            Ordering::AcqRel,
            Ordering::Acquire,
        );
        if state == Err(ANSWER_REFUSED) {
            return false;
        }
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
    async fn answer(&mut self, response: Result<GatewayResponse, GatewayError>) -> Ending {
        match cgi::relay(self, response, self.request_id).await {
            Relayed::Complete | Relayed::Gone => self.complete(),
            // The status has gone out: closing without FCGI_END_REQUEST is the only way to
            // tell the front server the response is cut short.
            Relayed::BrokeOff => Ending {
                bytes: BytesMut::new(),
                close: true,
            },
        }
    }

    /// Sends the CGI answer for a request that got no backend response; returns the ending.
    async fn error(&mut self, e: &GatewayError) -> Ending {
        cgi::refuse(self, e, self.request_id).await;
        self.complete()
    }

    async fn send_cgi(&mut self, cgi: &[u8]) -> Ending {
        cgi::answer(self, cgi).await;
        self.complete()
    }
}

impl CgiSink for Responder {
    async fn send(&mut self, bytes: &[u8]) -> bool {
        let mut frame = BytesMut::with_capacity(bytes.len() + 16);
        encode_stdout(self.id, bytes, &mut frame);
        self.queue(frame).await
    }
}
