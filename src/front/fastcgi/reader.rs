//! The FastCGI front's reader loop for one connection: records decoded into request events,
//! the socket read (or, when the front server has sent all it will, not read again), and while
//! it waits the writer's end, the deadlines (head, idle, body), shutdown and eviction, and the
//! endings of the connection's requests, polled in a fixed order; then each ending's
//! FCGI_END_REQUEST.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::Poll;

use bytes::BytesMut;
use tokio::io::AsyncReadExt;
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::answer::{Done, Out};
use super::{poll_inline, Connection, Flow};
use crate::front::halves::ReadPart;
use crate::front::limits::Expired;
use crate::front::quiet::Quiet;
use crate::logs::{LineLimit, Verdict};
use crate::protocols::fastcgi::{FastCgiError, RequestEvent, Role};

/// Bytes the reader asks for at a time.
const READ_CHUNK: usize = crate::front::cgi::READ_CHUNK;

/// Which of the rare events came first.
#[derive(Debug, Clone, Copy)]
enum Side {
    Shutdown,
    Evicted,
}

impl Connection<'_> {
    /// Reads and handles events until the connection ends; true when corral closed it (the
    /// writer ended), so the caller lingers.
    pub(super) async fn run(
        &mut self,
        reader: &mut ReadPart<'_>,
        buf: &mut BytesMut,
        shutdown: CancellationToken,
    ) -> bool {
        let mut draining = false;
        let mut was_idle = true;
        let mut read_any = false;
        let mut done_rx: Option<mpsc::Receiver<Done>> = None;
        // The waits that outlive one turn of the loop are made once, not at every turn (each
        // would register with its token or the timer wheel anew).
        let state = Arc::clone(&self.state);
        let closed = self.closed;
        let closed_wait = closed.wait();
        // Made, and so registered with the timer wheel, only when the reader first has to
        // wait for bytes: a front server that writes its request as it connects (nginx's
        // plain `fastcgi_pass`) is answered without one. A timer registered earlier than the
        // thread's next wake-up makes tokio wake the thread (an eventfd write and one more
        // epoll_wait), even when it is running.
        let expiry: Option<tokio::time::Sleep> = None;
        // The eviction and the shutdown almost never come: watched together, polled only
        // when one of them woke the task (front::quiet), not at every turn. Once one has
        // come, the other is watched on its own. Both matter only while no request is
        // dispatched (an evicted or draining connection closes once it has none), so they
        // are watched only then, and made the first time the reader waits so: a front
        // server that opens a connection per request (nginx's plain `fastcgi_pass`) and
        // writes it as it connects never pays for them.
        let side_future = || {
            Quiet::new(Box::pin(async {
                tokio::select! {
                    () = shutdown.cancelled() => Side::Shutdown,
                    () = state.evicted().cancelled() => Side::Evicted,
                }
            }))
        };
        let mut side = None;
        let mut side_came = false;
        // Evicted: the connection closes once it has no request in progress (the table
        // picks idle connections only; one whose request was dispatched as it was picked is
        // closed once that request is done).
        let mut evicted = false;
        let evicted_wait = state.evicted().cancelled();
        let stopping = shutdown.cancelled();
        tokio::pin!(closed_wait, expiry, evicted_wait, stopping);
        loop {
            if let Some(done) = self.inline_done.take() {
                if let Flow::Stop = self.on_done(done).await {
                    return self.closed.is_set();
                }
            }
            loop {
                let event = match self.decoder.decode(buf) {
                    Ok(Some(event)) => event,
                    Ok(None) => break,
                    Err(e) => {
                        // The rest of what broke the rule (a record past a limit) may still
                        // be arriving: linger, or closing with it unread resets the socket.
                        broken(&e);
                        self.input_pending = true;
                        return true;
                    }
                };
                let flow = match event {
                    // A request without a body usually sends the end of its FCGI_STDIN with
                    // its parameters: taken with them, it needs no channel.
                    RequestEvent::Params { request_id, params } => {
                        let ended = self.decoder.take_stdin_end(buf, request_id);
                        self.start(request_id, params, ended).await
                    }
                    // The other usual events need no `await`: handled here, they do not
                    // make the state of the whole event handler at every request.
                    RequestEvent::Begin {
                        request_id,
                        role: Role::Responder,
                        keep_conn,
                    } => {
                        self.begin(request_id, keep_conn);
                        Flow::Continue
                    }
                    RequestEvent::StdinEnd { request_id } => {
                        self.stdin_end(request_id);
                        Flow::Continue
                    }
                    event => self.on_event(event).await,
                };
                if let Flow::Stop = flow {
                    return self.closed.is_set();
                }
            }
            if done_rx.is_none() {
                done_rx = self.done_rx.take();
            }
            if draining && self.requests.is_empty() {
                return false;
            }
            if evicted && self.state.is_idle() {
                tracing::debug!(reason = %Expired::Evicted, "closing a fastcgi front connection");
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
            buf.reserve(READ_CHUNK);
            // A connection nothing watches yet whose front server has sent all it will, or
            // whose closing answer is queued, is not read again: the read would register it
            // with the reactor (an `epoll_ctl` to add it, one to remove it) for bytes only a
            // broken front server would send. Its close is then seen when the answer is
            // written, as php-fpm sees it.
            let listen = reader.is_watched() || !(self.closing || self.heard_all(buf));
            // Bytes already there are read without waiting, so without a timer.
            let ready = if listen {
                let read = reader.read_buf(buf);
                tokio::pin!(read);
                std::future::poll_fn(|cx| Poll::Ready(read.as_mut().poll(cx))).await
            } else {
                Poll::Pending
            };
            let read = match ready {
                Poll::Ready(read) => read,
                Poll::Pending => {
                    let deadline = if self.closing { None } else { self.deadline() };
                    if let Some((at, _)) = deadline {
                        match expiry.as_mut().as_pin_mut() {
                            Some(sleep) if sleep.deadline() == at => {}
                            Some(sleep) => sleep.reset(at),
                            None => expiry.set(Some(tokio::time::sleep_until(at))),
                        }
                    }
                    let expired = std::future::poll_fn(|cx| match expiry.as_mut().as_pin_mut() {
                        Some(sleep) => sleep.poll(cx),
                        None => Poll::Pending,
                    });
                    let reported = async {
                        match done_rx.as_mut() {
                            Some(rx) => rx.recv().await,
                            None => std::future::pending().await,
                        }
                    };
                    tokio::pin!(expired);
                    // Shutdown and eviction wait for the dispatched requests to end.
                    let watch_side = !self.closing && self.state.is_idle();
                    if watch_side && !side_came && side.is_none() {
                        side = Some(side_future());
                    }
                    let side_poll = std::future::poll_fn(|cx| match side.as_mut() {
                        Some(s) => Pin::new(s).poll(cx),
                        None => Poll::Pending,
                    });
                    // Polled in this order (`biased`: no random start, which cost a random
                    // number per poll). Every branch before the read ends the connection or
                    // changes what enables it (a request's ending is taken once, a side event
                    // once), so none is ready for ever and the read is never starved; and a
                    // connection past its deadline is closed even while its peer keeps sending.
                    tokio::select! {
                        biased;
                        () = &mut closed_wait => return true,
                        () = &mut expired, if deadline.is_some() => {
                            let why = deadline.map(|(_, why)| why).unwrap_or(Expired::Idle);
                            tracing::debug!(reason = %why, requests = self.requests.len(), "closing a fastcgi front connection");
                            return false;
                        }
                        came = side_poll, if watch_side && !side_came => {
                            side_came = true;
                            match came {
                                Side::Shutdown => draining = true,
                                Side::Evicted => evicted = true,
                            }
                            continue;
                        }
                        () = &mut evicted_wait, if watch_side && side_came && !evicted => {
                            evicted = true;
                            continue;
                        }
                        () = &mut stopping, if watch_side && side_came && !draining => {
                            draining = true;
                            continue;
                        }
                        Some(done) = reported => {
                            if let Flow::Stop = self.on_done(done).await {
                                return self.closed.is_set();
                            }
                            continue;
                        }
                        done = std::future::poll_fn(|cx| poll_inline(&mut self.inline, &mut self.spare_answer, cx)), if self.inline.is_some() => {
                            if let Flow::Stop = self.on_done(done).await {
                                return self.closed.is_set();
                            }
                            continue;
                        }
                        read = reader.read_buf(buf), if listen => read,
                    }
                }
            };
            match read {
                Ok(0) => {
                    if !self.requests.is_empty() {
                        tracing::debug!(
                            "fastcgi front server closed the connection with requests in progress"
                        );
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
            }
        }
    }

    /// After corral closed the connection: whether the front server may still be sending,
    /// so that closing at once could reset the connection before it read the answer. Not so
    /// when every request it began was read to its end (how a front server that does not keep
    /// connections leaves one), which spares the lingering read at the end of each.
    pub(super) fn input_may_follow(&self, buf: &BytesMut) -> bool {
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
            cut: false,
            close: done.ending.close,
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
