//! The FastCGI front's handling of one connection's request events: a request begun,
//! its parameters routed and dispatched (in the connection's task or a task of its own), its
//! FCGI_STDIN handed over within the budgets, an abort, the management records; and the
//! FCGI_END_REQUEST that ends each.

use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::Arc;

use bytes::{Bytes, BytesMut};
use tokio::sync::{mpsc, Semaphore};
use tokio::time::Instant;
use tokio_util::sync::ReusableBoxFuture;
use tokio_util::task::AbortOnDropHandle;

use super::answer::{AnswerFlag, Done, Ending, Out, Responder, ANSWER_NOT_STARTED, ANSWER_REFUSED};
use super::outbox::OutSender;
use super::stdin::{self, STDIN_BUDGET_PER_REQUEST};
use super::{
    poll_inline, Active, Connection, Dispatch, Flow, Inline, OVERLOADED_RETRY_AFTER, STDIN_BUDGET,
};
use crate::backend::RequestBody;
use crate::front::cgi::{content_length, error_answer, prepare};
use crate::gateway::GatewayError;
use crate::logs::{LineLimit, Verdict};
use crate::protocols::cgi::FrontParams;
use crate::protocols::fastcgi::{
    answer_get_values, encode_end_request, encode_stdout, encode_stdout_end, encode_unknown_type,
    ProtocolStatus, RequestEvent, Role,
};

/// What [`Connection::answer_here`] sends.
enum Answer<'a> {
    /// A whole CGI response made by corral (php-fpm's status and ping pages).
    Cgi(&'a [u8]),
    /// The answer for a request refused before dispatch.
    Error(&'a GatewayError),
}

impl Connection<'_> {
    /// The sender through which tasks of their own report their requests' endings, made
    /// with the first such task (most connections never multiplex).
    fn done_sender(&mut self) -> mpsc::Sender<Done> {
        if let Some(tx) = &self.done {
            return tx.clone();
        }
        let (tx, rx) = mpsc::channel(self.gateway.limits.max_concurrent_requests.max(1));
        self.done = Some(tx.clone());
        self.done_rx = Some(rx);
        tx
    }

    pub(super) async fn on_event(&mut self, event: RequestEvent<FrontParams>) -> Flow {
        match event {
            RequestEvent::Begin {
                request_id,
                role,
                keep_conn,
            } => {
                if role == Role::Responder {
                    self.begin(request_id, keep_conn);
                    return Flow::Continue;
                }
                let seq = self.seq();
                self.decoder.finish(request_id);
                self.end(
                    request_id,
                    seq,
                    ProtocolStatus::UnknownRole,
                    keep_conn,
                    false,
                )
                .await
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
                self.end(request_id, seq, status, keep_conn, false).await
            }
            RequestEvent::Params { request_id, params } => {
                self.start(request_id, params, false).await
            }
            RequestEvent::Stdin { request_id, data } => self.stdin(request_id, data).await,
            RequestEvent::StdinEnd { request_id } => {
                self.stdin_end(request_id);
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
                    true,
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
                    bytes: bytes.into(),
                    last: false,
                    cut: false,
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
                    bytes: bytes.into(),
                    last: false,
                    cut: false,
                    close: false,
                })
                .await
            }
        }
    }

    /// Whether the front server has sent everything it will on this connection: its one
    /// request, dispatched, has all its records in (FCGI_STDIN ended, nothing left unread)
    /// and did not ask to keep the connection, which closes after its answer.
    pub(super) fn heard_all(&self, buf: &BytesMut) -> bool {
        buf.is_empty()
            && self.requests.len() == 1
            && self
                .requests
                .values()
                .all(|r| !r.keep_conn && r.stdin_ended && r.task.is_some())
    }

    /// FCGI_BEGIN_REQUEST for the responder role: the request is remembered until its
    /// parameters end. Synchronous, so the reader's loop calls it without the state of the
    /// whole event handler (the usual events are handled there without an `await`).
    pub(super) fn begin(&mut self, request_id: u16, keep_conn: bool) {
        let seq = self.seq();
        self.head_from = None;
        self.requests.insert(
            request_id,
            Active {
                seq,
                keep_conn,
                body: None,
                stdin_ended: false,
                answer: None,
                task: None,
                begun: Instant::now(),
                busy: None,
            },
        );
    }

    /// FCGI_STDIN's empty record: dropping the sender ends the body.
    pub(super) fn stdin_end(&mut self, request_id: u16) {
        if let Some(r) = self.requests.get_mut(&request_id) {
            r.body = None;
            r.stdin_ended = true;
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
    /// `cut`: the request's task may still have frames on their way, which the writer then
    /// drops (an abort).
    async fn end(
        &mut self,
        id: u16,
        seq: u64,
        status: ProtocolStatus,
        keep_conn: bool,
        cut: bool,
    ) -> Flow {
        self.input_pending = true;
        let mut bytes = BytesMut::new();
        encode_end_request(id, 0, status, &mut bytes);
        self.send(Out {
            id,
            seq,
            bytes: bytes.into(),
            last: true,
            cut,
            close: !keep_conn,
        })
        .await
    }

    pub(super) async fn send(&mut self, out: Out) -> Flow {
        self.closing |= out.close;
        if self.outbox.push(out).await {
            Flow::Continue
        } else {
            Flow::Stop
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
            cut: false,
            close: ending.close,
        })
        .await
    }

    /// FCGI_PARAMS ended: route, normalise, and dispatch in a task of its own.
    ///
    /// `stdin_ended`: the end of its FCGI_STDIN came with the parameters (taken by
    /// `RequestDecoder::take_stdin_end`); a request that declared no body then gets an empty
    /// one, with no channel to feed it.
    pub(super) async fn start(&mut self, id: u16, params: FrontParams, stdin_ended: bool) -> Flow {
        let Some(r) = self.requests.get(&id) else {
            return Flow::Continue;
        };
        let request_id = self.gateway.request_id();
        // Answered here without a backend: the flag is the responder's own until the request
        // is dispatched.
        let mut responder = Responder {
            id,
            seq: r.seq,
            keep_conn: r.keep_conn,
            request_id,
            answer: AnswerFlag::Own(AtomicU8::new(ANSWER_NOT_STARTED)),
            out: OutSender::Local(self.outbox),
        };
        // The answers given here without a backend are boxed: awaited in place, their state
        // (a whole relay) would make this future, and every future that awaits it, larger,
        // and each is moved (copied whole) at every request, answered so or not.
        if let Some(cgi) = self.gateway.fpm_answer(&self.listener, &params) {
            // php-fpm's status or ping path: answered by corral, never by a worker.
            return Box::pin(self.answer_here(responder, Answer::Cgi(&cgi))).await;
        }
        let len = match content_length(&params) {
            Ok(len) => len,
            Err(e) => {
                let e = GatewayError::from(e);
                return Box::pin(self.answer_here(responder, Answer::Error(&e))).await;
            }
        };
        let prepared = prepare(&self.gateway, &self.listener, params, request_id);
        let (routed, params) = match prepared {
            Ok(prepared) => prepared,
            Err(e) => return Box::pin(self.answer_here(responder, Answer::Error(&e))).await,
        };
        let (tx, body) = match len {
            None | Some(0) if stdin_ended => (None, RequestBody::empty()),
            _ => {
                let (tx, body) = stdin::channel(len, self.timeouts.body_total);
                // A body that ended at once: its sender is dropped, which ends it.
                (Some(tx).filter(|_| !stdin_ended), body)
            }
        };
        let gateway = Arc::clone(&self.gateway);
        let front = Some(self.front_fd);
        let seq = responder.seq;
        // While the last inline request's ending waits to be handled, its entry still reads
        // the connection's flag: a request begun meanwhile gets a task of its own.
        let mut shared = None;
        let dispatch = if self.inline.is_none() && self.inline_done.is_none() {
            self.inline_answer
                .store(ANSWER_NOT_STARTED, Ordering::Release);
            responder.answer = AnswerFlag::Inline(self.inline_answer);
            let answer = async move {
                let response = gateway
                    .dispatch(&routed, params, body, request_id, front)
                    .await;
                responder.answer(response).await
            };
            let answer = match self.spare_answer.take() {
                Some(mut spare) => {
                    spare.set(answer);
                    spare
                }
                None => ReusableBoxFuture::new(answer),
            };
            self.inline = Some(Inline { id, seq, answer });
            Dispatch::Inline
        } else {
            let done = self.done_sender();
            let flag = Arc::new(AtomicU8::new(ANSWER_NOT_STARTED));
            shared = Some(Arc::clone(&flag));
            let mut responder = Responder {
                id,
                seq,
                keep_conn: responder.keep_conn,
                request_id,
                answer: AnswerFlag::Shared(flag),
                out: OutSender::Mux(self.outbox.mux_sender(&mut self.mux)),
            };
            let task = tokio::spawn(async move {
                let response = gateway
                    .dispatch(&routed, params, body, request_id, front)
                    .await;
                let ending = responder.answer(response).await;
                let _ = done.send(Done { id, seq, ending }).await;
            });
            Dispatch::Spawned(AbortOnDropHandle::new(task))
        };
        if let Some(r) = self.requests.get_mut(&id) {
            r.body = tx;
            r.stdin_ended |= stdin_ended;
            r.task = Some(dispatch);
            r.answer = shared;
            r.busy = Some(self.state.begin());
        }
        Flow::Continue
    }

    /// Answers a request without a backend (corral's own answer, or a refusal) and ends it.
    async fn answer_here(&mut self, mut responder: Responder<'_>, what: Answer<'_>) -> Flow {
        let ending = match what {
            Answer::Cgi(cgi) => responder.send_cgi(cgi).await,
            Answer::Error(e) => responder.error(e).await,
        };
        let (id, seq) = (responder.id, responder.seq);
        drop(responder);
        self.answered(id, seq, ending).await
    }

    /// Hands FCGI_STDIN bytes to the request's body within the budgets; see the module
    /// documentation for what happens past them.
    async fn stdin(&mut self, id: u16, data: Bytes) -> Flow {
        let Some(body) = self.requests.get(&id).and_then(|r| r.body.clone()) else {
            return Flow::Continue;
        };
        // One record carries at most 65535 bytes, far below both budgets.
        let n = u32::try_from(data.len()).unwrap_or(u32::MAX);
        let budget = Arc::clone(
            self.stdin_budget
                .get_or_insert_with(|| Arc::new(Semaphore::new(STDIN_BUDGET))),
        );
        let permits = match body.try_reserve(&budget, n) {
            Some(permits) => permits,
            None if self.requests.len() == 1 => {
                // The backend that takes the bytes may be the inline request's, which runs
                // only while this task polls it: it is polled meanwhile, and should it end, its
                // ending is kept for the loop (its body is dropped, which gives the permits
                // back).
                let reserve = body.reserve(&budget, n);
                tokio::pin!(reserve);
                loop {
                    tokio::select! {
                        permits = &mut reserve => match permits {
                            Some(permits) => break permits,
                            // The semaphores are never closed; were they, the body is dropped.
                            None => return Flow::Continue,
                        },
                        () = self.closed.wait() => return Flow::Stop,
                        done = std::future::poll_fn(|cx| poll_inline(&mut self.inline, &mut self.spare_answer, cx)), if self.inline.is_some() => {
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
        let inline = matches!(r.task, Some(Dispatch::Inline));
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
        // The inline request's flag is the connection's (its future was dropped above, so
        // nothing else touches it now); a request in a task of its own shares one; a request
        // not dispatched has written nothing.
        let flag = match &r.answer {
            Some(shared) => Some(&**shared),
            None if inline => Some(self.inline_answer),
            None => None,
        };
        let head_is_ours = flag.is_none_or(|flag| {
            flag.compare_exchange(
                ANSWER_NOT_STARTED,
                ANSWER_REFUSED,
                Ordering::AcqRel,
                Ordering::Acquire,
            )
            .is_ok()
        });
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
            bytes: bytes.into(),
            last: true,
            cut: true,
            close: !r.keep_conn,
        })
        .await
    }
}
