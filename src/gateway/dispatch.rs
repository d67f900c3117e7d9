//! `Gateway::dispatch`: the request's admission checks, a slot, a backend connection (made
//! again on another worker when it cannot be made), the exchange, and the request's timer
//! and access-log record; a request that waited for its slot is dropped there if its front
//! connection closed meanwhile (`front_closed`).

use std::future::Future;
use std::os::fd::RawFd;
use std::sync::Arc;

use crate::access::Record;
use crate::backend::{self, ExchangeOptions, RequestBody, ResponseBody};
use crate::pool::requests::RequestTimer;
use crate::pool::slots::Slot;
use crate::protocols::cgi::CgiParams;
use crate::protocols::cgi_response::CgiResponseHead;
use crate::router::Context;

use super::body::Logged;
use super::{script, slow_stacks, Gateway, GatewayBody, GatewayError, GatewayResponse, Routed};

impl Gateway {
    /// Sends a request routed to `routed` to a worker of its pool: takes a slot (waiting in
    /// the queue if needed), takes an idle connection or makes one, and returns once the
    /// response head has arrived.
    ///
    /// `front`: the descriptor of the front connection the request came on, when its front
    /// does not otherwise notice the peer closing it while the request waits for a slot (the
    /// CGI fronts: a plain FastCGI or SCGI connection whose request is wholly in is not read
    /// again). A request that had to wait is dropped before anything is sent to a worker if
    /// that connection was closed meanwhile (decision 35). Only peeked at, never read or
    /// closed here; the front keeps it open for as long as the returned future lives.
    ///
    /// A plain function returning its future: an `async fn` keeps each argument twice in its
    /// state (the argument, and the binding its body moves it into), and this future is
    /// moved whole, nested in the front's, once per request.
    #[allow(clippy::manual_async_fn)] // On purpose: see above; an async fn is larger.
    pub fn dispatch<'a>(
        &'a self,
        routed: &'a Routed,
        params: CgiParams,
        body: RequestBody,
        request_id: u64,
        front: Option<RawFd>,
    ) -> impl Future<Output = Result<GatewayResponse, GatewayError>> + 'a {
        async move {
            let (context, pool) = (&*routed.context, &routed.pool);
            let mut timer = RequestTimer::start();
            let log =
                routed.logs.as_ref().map(|settings| {
                    let slow = settings.slow_threshold().zip(pool.stacks.as_ref()).map(
                        |(threshold, tail)| {
                            slow_stacks::SlowWatch::arm(
                                Arc::clone(tail),
                                tokio::time::Instant::now(),
                                threshold,
                            )
                        },
                    );
                    Box::new(Logged {
                        record: Record::from_params(
                            &params,
                            Arc::clone(&pool.name),
                            routed.generation,
                            request_id,
                        ),
                        settings: Arc::clone(settings),
                        writer: self.access.clone(),
                        slow,
                    })
                });
            // Written as aborted (499) if the front drops the request before its head came.
            let mut unanswered = Unanswered {
                log,
                pid: None,
                asked: timer.asked(),
            };
            // Before a slot is taken: a refused script or body never queues or touches a worker,
            // and the request ends before any await. (Matched where it is made, the result is a
            // temporary gone before the await, not a local kept in the future's state.)
            let body = match admitted(context, &params, body) {
                Ok(body) => body,
                Err(e) => return Err(failed(unanswered.log.take(), e, None, &timer)),
            };
            let watch = unanswered.log.as_ref().and_then(|l| l.slow.as_ref());
            let sent = self
                .exchange(
                    routed,
                    &params,
                    body,
                    request_id,
                    &mut timer,
                    (&mut unanswered.pid, watch),
                    front,
                )
                .await;
            let pid = unanswered.pid;
            match sent {
                Ok((head, body, slot)) => {
                    let log = unanswered.log.take().map(|mut l| {
                        l.record.status = head.status_code();
                        l.record.worker_pid = pid;
                        l
                    });
                    let mut body = GatewayBody {
                        body,
                        slot: Some(slot),
                        pool: Arc::clone(pool),
                        timer,
                        log,
                    };
                    if body.body.is_ended() {
                        // An empty body: no chunk will be asked for.
                        body.timer.end(&body.pool.requests);
                        if let Some(logged) = body.log.take() {
                            logged.finish(&body.timer);
                        }
                    }
                    Ok(GatewayResponse { head, body })
                }
                Err(e) => Err(failed(unanswered.log.take(), e, pid, &timer)),
            }
        }
    }

    /// The part of [`Gateway::dispatch`] between asking for a slot and the response head:
    /// `pid` learns the worker's process id when a request log wants it (and so does the
    /// request's slow-threshold watch, if it has one).
    #[allow(clippy::too_many_arguments)] // Each is one of dispatch's; a struct would be moved.
    async fn exchange(
        &self,
        routed: &Routed,
        params: &CgiParams,
        body: RequestBody,
        request_id: u64,
        timer: &mut RequestTimer,
        (pid, watch): (&mut Option<u32>, Option<&slow_stacks::SlowWatch>),
        front: Option<RawFd>,
    ) -> Result<(CgiResponseHead, ResponseBody, Slot), GatewayError> {
        let pool = &routed.pool;
        // The wait is timed from the timer's start: one clock reading fewer per request.
        let queued = Queued {
            pool,
            request_id,
            asked: timer.asked(),
        };
        let acquired = pool
            .requests
            .acquire_since(&pool.slots, routed.context.slot_context, timer.asked())
            .await;
        queued.ended();
        let (slot, had) = acquired.map_err(|source| GatewayError::Slot {
            pool: Arc::clone(&pool.name),
            source,
        })?;
        timer.slot_at(had);
        // `had` is the request's start exactly when the slot came at the first poll (the
        // fast path: no clock reading and no system call more); a later one means the
        // request waited in the queue, long enough for its front to give up.
        if had != timer.asked() {
            if let Some(fd) = front {
                if let Some(why) = front_closed(fd) {
                    return Err(front_gone(pool, slot, request_id, had - timer.asked(), why));
                }
            }
        }
        let backend_err = |source| {
            pool.requests.backend_error(&source);
            GatewayError::Backend {
                pool: Arc::clone(&pool.name),
                source,
            }
        };
        // A connection that cannot be made means nothing of the request reached the worker:
        // the request moves to another worker at once (a worker killed under load would
        // otherwise fail every request routed to it until its exit is noticed). Once a
        // byte may have been sent, it is sent again only in the one case below.
        // Only SCGI and LSAPI spool, and only a body of unknown length (a FastCGI or SCGI
        // front's request without CONTENT_LENGTH).
        let spools = pool.protocol != backend::Protocol::FastCgi && body.len().is_none();
        let mut slot = slot;
        let mut tries = 0;
        let mut body = body;
        // Whether the request was sent again after a kept connection failed; the next
        // connection is then a new one (`fresh`), unless the worker changed.
        let mut replayed = false;
        let mut fresh = false;
        let mut kept;
        loop {
            let conn = loop {
                let address = slot.address();
                // A kept connection is taken without awaiting; a connect's future is
                // boxed, as it would otherwise make this future (moved whole when it is
                // made, and nested in the front's) several times larger for a rare case.
                let idle = match pool.protocol {
                    // SCGI is one connection per request by definition.
                    backend::Protocol::Scgi => None,
                    _ if fresh => None,
                    _ => pool.connections.take_idle(address, slot.lane()),
                };
                kept = idle.is_some();
                let connected = match idle {
                    Some(conn) => Ok(conn),
                    None if pool.protocol == backend::Protocol::Scgi => {
                        Box::pin(backend::BackendConnection::connect(
                            address,
                            pool.timeouts.connect,
                        ))
                        .await
                    }
                    None => {
                        let lane = slot.lane();
                        Box::pin(pool.connections.fresh(address, pool.timeouts.connect, lane)).await
                    }
                };
                match connected {
                    Ok(conn) => break conn,
                    Err(e) => {
                        pool.fault(&slot, &e);
                        if tries >= pool.retries {
                            return Err(backend_err(e));
                        }
                        tries += 1;
                        fresh = false;
                        tracing::debug!(pool = %pool.name, request_id, error = %e, "request not sent; trying another worker");
                        slot = Box::pin(pool.slots.reroute(slot)).await.map_err(|source| {
                            GatewayError::Slot {
                                pool: Arc::clone(&pool.name),
                                source,
                            }
                        })?;
                    }
                }
            };
            // The request's send time, which its backend deadline counts from.
            let started = if replayed {
                tokio::time::Instant::now()
            } else {
                timer.connected(&pool.requests, kept)
            };
            if routed.logs.is_some() {
                *pid = slot.pid();
                if let Some(watch) = watch {
                    watch.serving(*pid);
                }
            }
            // A kept connection may have been closed by the worker while idle, just as the
            // request went out (a worker exiting after its last request): keep what it takes
            // to send the request once more. An in-memory body is shared, not copied.
            let replay = if replayed || conn.requests_served() == 0 {
                None
            } else {
                body.replayable()
            };
            // Made for each attempt (the first, nearly always) rather than kept from the
            // start: held only across the send, it shares the future's room with what the
            // slot's and the connection's waits hold.
            let options = ExchangeOptions {
                pool: Arc::clone(&pool.name),
                request_id,
                timeouts: pool.timeouts,
                limits: self.limits.clone(),
                spool: spools.then(|| self.spool_for(routed)),
                stderr: None,
            };
            let error =
                match backend::send_params(pool.protocol, conn, params, body, &options, started)
                    .await
                {
                    Ok(response) => {
                        pool.healthy(&slot);
                        timer.head(&pool.requests);
                        return Ok((response.head, response.body, slot));
                    }
                    Err(e) => e,
                };
            // The kept connection failed before one response byte (ARCHITECTURE.md invariant
            // 6, decision 8): the request goes out once more on a new connection when its
            // body is still in memory and either none of it was written (the first write met
            // a closed socket), or its method is GET, HEAD or OPTIONS (`idempotent`) and
            // the connection was closed or reset before any answer by a worker still alive:
            // one that closed it as the request went out, or an idle-close racing the reuse
            // over TCP. A POST in that case may have run, and a worker that died may have
            // died running it: a 502. `fault` asks whether the worker died and takes a dying
            // one out of rotation: a request none of which was written then goes to another.
            let out = pool.fault(&slot, &error);
            let again = replay.filter(|_| error.may_resend(idempotent(params), out));
            let Some(again) = again else {
                pool.report(&slot, &error);
                return Err(backend_err(error));
            };
            tracing::debug!(
                pool = %pool.name,
                request_id,
                method = %String::from_utf8_lossy(params.get(b"REQUEST_METHOD").unwrap_or_default()),
                unsent = error.request_left_unread(),
                error = %error,
                worker_gone = out,
                "kept connection lost before the answer; sending the request again"
            );
            pool.requests.resent();
            body = again;
            replayed = true;
            if out {
                fresh = false;
                slot = Box::pin(pool.slots.reroute(slot)).await.map_err(|source| {
                    GatewayError::Slot {
                        pool: Arc::clone(&pool.name),
                        source,
                    }
                })?;
            } else {
                fresh = true;
            }
        }
    }
}

/// A request's log record until its head came or it failed: the front that drops the
/// request first (its client or front server went away, or sent FCGI_ABORT_REQUEST) still
/// gets its access-log line, as aborted with 499, nginx's code for a client that closed.
struct Unanswered {
    log: Option<Box<Logged>>,
    /// The worker the request reached, once it has one and a log wants it.
    pid: Option<u32>,
    asked: tokio::time::Instant,
}

impl Drop for Unanswered {
    fn drop(&mut self) {
        if let Some(mut logged) = self.log.take() {
            logged.record.status = 499;
            logged.record.aborted = true;
            logged.record.worker_pid = self.pid;
            logged.record.total = self.asked.elapsed();
            logged.send();
        }
    }
}

/// A request waiting in its pool's queue: dropped there (its front gave it up first), it
/// is counted and logged as one the peek in `exchange` finds gone is.
struct Queued<'a> {
    pool: &'a crate::gateway::registry::Pool,
    request_id: u64,
    asked: tokio::time::Instant,
}

impl Queued<'_> {
    /// The wait ended (a slot, or an error): nothing to count.
    fn ended(self) {
        std::mem::forget(self);
    }
}

impl Drop for Queued<'_> {
    #[cold]
    fn drop(&mut self) {
        // Dropped only while the queue is awaited: the first poll, which serves a request
        // at once, is made within the poll that made this, so the request had queued.
        self.pool.requests.front_gone();
        log_gone(
            self.pool,
            self.request_id,
            self.asked.elapsed(),
            "dropped by its front",
        );
    }
}

/// How a front connection was found gone.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Closed {
    /// The peer closed it (end of stream).
    Eof,
    /// Peeking at it failed (a reset, most often).
    Error(nix::errno::Errno),
}

impl std::fmt::Display for Closed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Closed::Eof => f.write_str("end of stream"),
            Closed::Error(e) => write!(f, "{}", e.desc()),
        }
    }
}

/// Whether the front connection `fd` is gone: one non-blocking peek at one byte. Nothing to
/// read (EAGAIN) means it is there; an end of stream or an error, that it is not. The front
/// servers corral is behind never half-close a connection whose answer they wait for, so an
/// end of stream is the front giving up (nginx's own rule for `fastcgi_ignore_client_abort
/// off`). Bytes waiting may be new ones (which the front's own reader handles: for FastCGI
/// an FCGI_ABORT_REQUEST, say) or the request itself, which an idle thread's first read
/// left on the socket (`crate::front::cgi::Serving`) and which would hide the close from
/// the peek: `poll` tells the peer's close apart from them. Made only for a request that
/// waited for its slot.
#[cold]
fn front_closed(fd: RawFd) -> Option<Closed> {
    use nix::errno::Errno;
    use nix::sys::socket::MsgFlags;
    let mut byte = [0u8; 1];
    loop {
        return match nix::sys::socket::recv(
            fd,
            &mut byte,
            MsgFlags::MSG_PEEK | MsgFlags::MSG_DONTWAIT,
        ) {
            Ok(0) => Some(Closed::Eof),
            Ok(_) => crate::net::peer_closed(fd)
                .unwrap_or(false)
                .then_some(Closed::Eof),
            Err(Errno::EAGAIN) => None,
            Err(Errno::EINTR) => continue,
            Err(e) => Some(Closed::Error(e)),
        };
    }
}

/// Ends a request whose front connection closed while it waited for `slot`: the slot goes
/// back untouched (no worker saw the request), and the pool counts and logs it.
#[cold]
fn front_gone(
    pool: &crate::gateway::registry::Pool,
    slot: Slot,
    request_id: u64,
    waited: std::time::Duration,
    why: Closed,
) -> GatewayError {
    drop(slot);
    pool.requests.front_gone();
    log_gone(pool, request_id, waited, why);
    GatewayError::FrontGone {
        pool: Arc::clone(&pool.name),
        waited,
    }
}

/// The log line of a request whose front went away while it waited for its slot.
#[cold]
fn log_gone(
    pool: &crate::gateway::registry::Pool,
    request_id: u64,
    waited: std::time::Duration,
    how: impl std::fmt::Display,
) {
    tracing::info!(
        pool = %pool.name,
        request_id,
        waited = ?waited,
        how = %how,
        "the front closed while the request waited for a slot; not sent to a worker"
    );
}

/// Whether the request's method is one corral sends twice: the methods safe by RFC 9110
/// §9.2.1 that a front passes on. Narrower than nginx, which since 1.9.13 holds back only
/// POST, LOCK and PATCH once a request was sent (`proxy_next_upstream non_idempotent`): PUT
/// and DELETE are idempotent by RFC 9110 §9.2.2, but an application's PUT or DELETE handler
/// is seldom written to run twice, and a 502 is the safer answer.
fn idempotent(params: &CgiParams) -> bool {
    matches!(
        params.get(b"REQUEST_METHOD"),
        Some(b"GET" | b"HEAD" | b"OPTIONS")
    )
}

/// Ends the log record of a request that got no response (`pid`: the worker it reached, if
/// any) and gives back its error.
fn failed(
    log: Option<Box<Logged>>,
    e: GatewayError,
    pid: Option<u32>,
    timer: &RequestTimer,
) -> GatewayError {
    if let Some(mut logged) = log {
        logged.record.status = e.status();
        // No answer reaches a front that went away: logged as a client abort is.
        logged.record.aborted = matches!(e, GatewayError::FrontGone { .. });
        logged.record.worker_pid = pid;
        logged.finish(timer);
    }
    e
}

/// The request's body, held to the context's `max_body`, unless its script or its declared
/// length is refused.
fn admitted(
    context: &Context,
    params: &CgiParams,
    body: RequestBody,
) -> Result<RequestBody, GatewayError> {
    script::check(&context.cgi, params)?;
    let limit = context.config.max_body;
    match body.len() {
        Some(length) if length > limit => Err(GatewayError::BodyTooLarge {
            length: Some(length),
            limit,
        }),
        // A body of unknown length (a FastCGI or SCGI front that sent no CONTENT_LENGTH) is
        // held to max_body as it streams.
        _ => Ok(body.limited(limit)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::os::fd::AsRawFd;
    use std::os::unix::net::UnixStream;

    /// The peek tells a connection with nothing to read, or bytes waiting, from one its peer
    /// closed, and takes nothing off it.
    #[test]
    fn a_peek_tells_a_closed_front_from_a_quiet_or_talking_one() {
        let (ours, mut theirs) = UnixStream::pair().unwrap();
        assert_eq!(front_closed(ours.as_raw_fd()), None, "nothing to read");
        theirs.write_all(b"x").unwrap();
        assert_eq!(front_closed(ours.as_raw_fd()), None, "a byte waiting");
        let mut byte = [0u8; 1];
        std::io::Read::read_exact(&mut &ours, &mut byte).unwrap();
        assert_eq!(&byte, b"x", "peeked at, not taken");
        let (ours, theirs) = UnixStream::pair().unwrap();
        drop(theirs);
        assert_eq!(front_closed(ours.as_raw_fd()), Some(Closed::Eof));
    }

    /// A front server that closed behind its own request, which a first read left on the
    /// socket unread, is gone: the bytes in front do not hide its close.
    #[test]
    fn a_close_behind_a_request_left_unread_is_seen() {
        let (ours, mut theirs) = UnixStream::pair().unwrap();
        theirs.write_all(b"the request, peeked and left").unwrap();
        assert_eq!(front_closed(ours.as_raw_fd()), None, "still there");
        drop(theirs);
        assert_eq!(front_closed(ours.as_raw_fd()), Some(Closed::Eof));
    }

    /// A reset (the peer closed with bytes of ours unread) is gone too.
    #[test]
    fn a_reset_front_is_gone() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let mut theirs = std::net::TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (mut ours, _) = listener.accept().unwrap();
        ours.write_all(b"unread").unwrap();
        theirs.write_all(b"x").unwrap();
        std::thread::sleep(std::time::Duration::from_millis(50));
        // Closed with our byte unread: the kernel sends a reset.
        drop(theirs);
        std::thread::sleep(std::time::Duration::from_millis(50));
        let mut sink = [0u8; 1];
        // Take their byte, so that only the reset is left to see.
        assert_eq!(std::io::Read::read(&mut ours, &mut sink).ok(), Some(1));
        assert_eq!(
            front_closed(ours.as_raw_fd()),
            Some(Closed::Error(nix::errno::Errno::ECONNRESET))
        );
    }
}
