//! The I/O driver shared by the three protocols: writes the request (head, then body chunks
//! as the source yields them) while reading the response, hands bytes to the protocol's
//! codec, applies the first-byte and request deadlines, logs stderr, and owns the
//! [`ResponseBody`] the front pulls from.
//!
//! Reading and writing happen in one poll function over the one stream, so a backend that
//! answers before it has read the whole body (or one that reads it only after answering)
//! cannot deadlock the exchange. Memory stays bounded: one body chunk (plus framing) waits to
//! be written, and bytes are read only when the codec needs more to make progress, so the
//! input buffer never holds more than one record, packet or head plus one read.

use std::future::{poll_fn, Future};
use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::{Buf, Bytes, BytesMut};
use tokio::io::AsyncWrite;
use tokio::time::Instant;
use tokio_util::io::poll_read_buf;

use super::connection::BackendConnection;
use super::{fastcgi, lsapi, scgi};
use super::{BackendError, ExchangeOptions, Protocol, RequestBody, StderrSink};
use crate::logs::LineLimit;
use crate::protocols::cgi_response::CgiResponseHead;

mod body;
mod end;
mod spare;
mod stderr;

use body::BodyState;
pub use body::ResponseBody;

/// Bytes asked of the socket per read.
const READ_CHUNK: usize = 32 * 1024;
/// Request bytes gathered behind a queued write before it is made (bounds the send buffer of
/// one exchange at this plus one body chunk).
const WRITE_GATHER: usize = 64 * 1024;

/// What a codec made of the bytes it was given.
#[derive(Debug)]
pub(super) enum Step {
    /// The response head.
    Head(CgiResponseHead),
    /// Response body bytes.
    Data(Bytes),
    /// A piece of the backend's error log.
    Stderr(Bytes),
    /// Bytes consumed that mean nothing to the front (an acknowledgement, a stream end).
    Nothing,
    /// The response is complete; `reusable` if the protocol lets the connection carry
    /// another request.
    End {
        /// Whether the protocol keeps the connection open.
        reusable: bool,
    },
}

/// The protocol-specific half of an exchange.
#[derive(Debug)]
pub(super) enum Codec {
    FastCgi(fastcgi::Codec),
    Scgi(scgi::Codec),
    Lsapi(lsapi::Codec),
}

impl Codec {
    fn protocol(&self) -> Protocol {
        match self {
            Codec::FastCgi(_) => Protocol::FastCgi,
            Codec::Scgi(_) => Protocol::Scgi,
            Codec::Lsapi(_) => Protocol::Lsapi,
        }
    }

    fn decode(&mut self, src: &mut BytesMut) -> Result<Option<Step>, BackendError> {
        match self {
            Codec::FastCgi(c) => c.decode(src),
            Codec::Scgi(c) => c.decode(src),
            Codec::Lsapi(c) => c.decode(src),
        }
    }

    /// The backend closed the connection and `decode` needs more than `src` holds.
    fn eof(&mut self, src: &mut BytesMut) -> Result<Step, BackendError> {
        match self {
            Codec::FastCgi(c) => c.eof(src),
            Codec::Scgi(c) => c.eof(src),
            Codec::Lsapi(c) => c.eof(src),
        }
    }

    fn encode_body(&self, chunk: &[u8], dst: &mut BytesMut) {
        match self {
            Codec::FastCgi(c) => c.encode_body(chunk, dst),
            Codec::Scgi(_) | Codec::Lsapi(_) => dst.extend_from_slice(chunk),
        }
    }

    fn encode_body_end(&self, dst: &mut BytesMut) {
        if let Codec::FastCgi(c) = self {
            c.encode_body_end(dst);
        }
    }

    /// Bytes that tell the backend the client went away, where the protocol has them.
    fn abort_bytes(&self) -> Option<BytesMut> {
        match self {
            Codec::FastCgi(c) => Some(c.abort_bytes()),
            Codec::Scgi(_) | Codec::Lsapi(_) => None,
        }
    }
}

/// How an exchange gets its codec: a codec made beforehand, moved in, or (the FastCGI
/// codec, about 500 bytes with its head decoder's field table) one written where it lies, so
/// that a renewed exchange whose last codec was of the same protocol resets it in place
/// instead of copying a fresh one through `begin` and `renew`.
pub(super) trait CodecSource {
    /// The codec of a new exchange.
    fn make(self) -> Codec;
    /// Makes `slot`, a spent exchange's codec, the codec [`make`](Self::make) would return.
    fn write_over(self, slot: &mut Codec);
}

impl CodecSource for Codec {
    #[inline]
    fn make(self) -> Codec {
        self
    }

    #[inline]
    fn write_over(self, slot: &mut Codec) {
        *slot = self;
    }
}

/// An exchange whose request head is encoded in `head`, ready to run: the part every
/// protocol's request shares. On the heap once: the exchange (codec, buffers, options) then
/// travels inside the response body through the gateway and the front as a pointer, not as
/// a kilobyte copied at every move. The allocation is the serving thread's spare when it has
/// one (`spare`): a response body that ended gave it back, and it is written over in place.
#[inline]
pub(super) fn begin(
    conn: BackendConnection,
    codec: impl CodecSource,
    head: BytesMut,
    body: RequestBody,
    declared: Option<u64>,
    options: &ExchangeOptions,
    started: Instant,
) -> Box<Exchange> {
    match spare::take() {
        Some(mut exchange) => {
            exchange.renew(conn, codec, head, body, declared, options, started);
            exchange
        }
        None => Box::new(Exchange::new(
            conn,
            codec.make(),
            head,
            body,
            declared,
            options,
            started,
        )),
    }
}

/// Runs `exchange` until the response head has arrived. The future holds the box and little
/// else: the request's encoding was done before it was made (`begin`), so the future the
/// gateway awaits, and moves at each `.await` above it, stays a few words long.
pub(super) async fn read_response(
    mut exchange: Box<Exchange>,
) -> Result<super::BackendResponse, BackendError> {
    let head = exchange.read_head().await?;
    Ok(super::BackendResponse {
        head,
        body: ResponseBody::new(exchange),
    })
}

/// A body of known length: `body` itself, or its bytes spooled to learn the length (SCGI
/// and LSAPI announce it up front), within what is left of the request timeout.
pub(super) async fn known_length(
    body: RequestBody,
    options: &ExchangeOptions,
    started: Instant,
) -> Result<RequestBody, BackendError> {
    let deadline = started + options.timeouts.request;
    let default;
    let spool = match &options.spool {
        Some(spool) => spool,
        None => {
            default = super::SpoolConfig::default();
            &default
        }
    };
    tokio::time::timeout_at(deadline, super::spool_body(body, spool))
        .await
        .map_err(|_| BackendError::RequestTimeout {
            after: options.timeouts.request,
        })?
}

/// Whether a socket error says the peer's end was closed (a broken pipe, a reset, an abort)
/// rather than some other failure.
fn is_reset(error: &io::Error) -> bool {
    matches!(
        error.kind(),
        io::ErrorKind::ConnectionReset
            | io::ErrorKind::ConnectionAborted
            | io::ErrorKind::BrokenPipe
    )
}

/// What one round of I/O achieved.
enum Progress {
    /// Bytes were read, or the backend closed its side.
    Read,
    /// The last request byte was just written (or writing stopped for good).
    RequestSent,
}

/// One exchange in flight over one connection.
pub(super) struct Exchange {
    conn: Option<BackendConnection>,
    codec: Codec,
    inbuf: BytesMut,
    outbuf: BytesMut,
    /// The body still to read from the client; `None` once it ended.
    body: Option<RequestBody>,
    declared: Option<u64>,
    sent: u64,
    /// Request bytes the socket accepted.
    written: u64,
    eof: bool,
    /// Writing failed; reading goes on, as the backend may have answered already.
    write_error: Option<io::Error>,
    /// What the exchange itself reads of its [`ExchangeOptions`] (the limits and the spool
    /// served the codec and the caller before it began, and are not copied in).
    pool: std::sync::Arc<str>,
    request_id: u64,
    timeouts: super::Timeouts,
    stderr: Option<StderrSink>,
    request_deadline: Instant,
    first_byte_deadline: Option<Instant>,
    got_byte: bool,
    /// The connection carried earlier requests.
    reused: bool,
    /// The exchange ended cleanly (no abort on drop).
    clean: bool,
    /// Bounds the backend stderr this exchange logs.
    stderr_limit: LineLimit,
    /// Where the response body stands, for [`ResponseBody`]. Kept here, in the box, so
    /// that the body the gateway and the front move about is one pointer.
    state: BodyState,
    /// The connection, after a clean end, when it has no idle stack to go back to.
    kept: Option<BackendConnection>,
    /// A chunk (or the error) decoded while looking ahead, handed out next.
    ahead: Option<Result<Bytes, BackendError>>,
    /// The body length the response head announced (Content-Length), if it did.
    announced: Option<u64>,
    /// Body bytes handed out so far.
    handed: u64,
    /// What the connection holds while its end record is awaited after the body (the
    /// request's slot: `ResponseBody::hold_until_end`).
    held: Option<Box<dyn Send>>,
    /// Body bytes still to be read and thrown away once the front lets go of a body it
    /// never sends (an answer to HEAD, a 204 or a 304: `ResponseBody::discard_unsent`), so
    /// that the connection ends cleanly; 0 for a body the front sends.
    discard: u64,
}

impl Exchange {
    /// Starts an exchange whose request head is already encoded in `head`. `declared` is the
    /// body length the head announced, checked against what the body yields.
    #[inline]
    pub(super) fn new(
        conn: BackendConnection,
        codec: Codec,
        head: BytesMut,
        body: RequestBody,
        declared: Option<u64>,
        options: &ExchangeOptions,
        started: Instant,
    ) -> Exchange {
        let mut conn = conn;
        Exchange {
            reused: conn.requests_served() > 0,
            inbuf: std::mem::take(&mut conn.inbuf),
            conn: Some(conn),
            codec,
            outbuf: head,
            body: Some(body),
            declared,
            sent: 0,
            written: 0,
            eof: false,
            write_error: None,
            pool: options.pool.clone(),
            request_id: options.request_id,
            timeouts: options.timeouts,
            stderr: options.stderr.clone(),
            request_deadline: started + options.timeouts.request,
            first_byte_deadline: None,
            got_byte: false,
            clean: false,
            stderr_limit: stderr::limit(),
            state: BodyState::Streaming,
            kept: None,
            ahead: None,
            announced: None,
            handed: 0,
            held: None,
            discard: 0,
        }
    }

    fn protocol(&self) -> Protocol {
        self.codec.protocol()
    }

    /// Reads until the response head has arrived.
    pub(super) async fn read_head(&mut self) -> Result<CgiResponseHead, BackendError> {
        loop {
            match poll_fn(|cx| self.poll_step(cx)).await? {
                Step::Head(head) => {
                    self.announced = end::announced_length(&head);
                    return Ok(head);
                }
                Step::Data(_) | Step::End { .. } => {
                    return Err(BackendError::Protocol {
                        protocol: self.protocol(),
                        rule: "the response ended or carried body bytes before its head".into(),
                    })
                }
                Step::Stderr(_) | Step::Nothing => {}
            }
        }
    }

    /// The next step already decodable from the bytes read so far, without any I/O; stderr
    /// is logged here. `Ok(None)`: more bytes are needed. Always inlined: it is the look
    /// ahead after every body chunk (`look_ahead`), and a second caller (`end_buffered`,
    /// which is not on that path) made it a call (about 100 instructions per request).
    #[inline(always)]
    fn buffered_step(&mut self) -> Result<Option<Step>, BackendError> {
        loop {
            match self.codec.decode(&mut self.inbuf)? {
                Some(Step::Stderr(text)) => self.log_stderr(&text),
                Some(Step::Nothing) => {}
                other => return Ok(other),
            }
        }
    }

    /// The next step that matters to the front; stderr is logged here. Every state lives in
    /// the exchange, so a caller may stop polling and come back (cancel-safe).
    fn poll_step(&mut self, cx: &mut Context<'_>) -> Poll<Result<Step, BackendError>> {
        loop {
            let step = match self.codec.decode(&mut self.inbuf)? {
                Some(step) => step,
                None if self.eof => match self.codec.eof(&mut self.inbuf) {
                    Ok(step) => step,
                    Err(e @ BackendError::ClosedEarly { .. }) => {
                        return Poll::Ready(Err(self.closed_error(e)))
                    }
                    Err(e) => return Poll::Ready(Err(e)),
                },
                None => match self.poll_fill(cx) {
                    Poll::Ready(Ok(())) => continue,
                    Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                    Poll::Pending => return Poll::Pending,
                },
            };
            match step {
                Step::Stderr(text) => self.log_stderr(&text),
                Step::Nothing => {}
                step => return Poll::Ready(Ok(step)),
            }
        }
    }

    /// Does I/O until some bytes (or the end of the stream) have been read, within the
    /// first-byte and request deadlines. As `tokio::time::timeout` would, the I/O is polled
    /// before the deadline, so bytes that are there win over a deadline that just passed.
    fn poll_fill(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BackendError>> {
        loop {
            match self.poll_io(cx) {
                Poll::Ready(Ok(Progress::Read)) => return Poll::Ready(Ok(())),
                Poll::Ready(Ok(Progress::RequestSent)) => {
                    self.first_byte_deadline = Some(Instant::now() + self.timeouts.first_byte);
                    continue;
                }
                Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                Poll::Pending => {}
            }
            let first_byte = self.first_byte_deadline.filter(|_| !self.got_byte);
            let deadline = match first_byte {
                Some(fb) if fb < self.request_deadline => fb,
                _ => self.request_deadline,
            };
            // `poll_io` answered Pending, so the connection is there.
            let Some(conn) = self.conn.as_mut() else {
                return Poll::Pending;
            };
            let timer = conn
                .timer
                .get_or_insert_with(|| Box::pin(tokio::time::sleep_until(deadline)));
            // The timer is moved only to an earlier time. Each request's deadline is later
            // than the one before, so a kept connection's timer stays where an earlier
            // request set it, and when it fires before this deadline it is set again then:
            // one timer-wheel update per deadline period instead of one per request.
            if timer.deadline() > deadline {
                timer.as_mut().reset(deadline);
            }
            loop {
                if timer.as_mut().poll(cx).is_pending() {
                    return Poll::Pending;
                }
                if timer.deadline() >= deadline || Instant::now() >= deadline {
                    break;
                }
                timer.as_mut().reset(deadline);
            }
            return Poll::Ready(Err(if deadline < self.request_deadline {
                BackendError::FirstByteTimeout {
                    after: self.timeouts.first_byte,
                }
            } else {
                BackendError::RequestTimeout {
                    after: self.timeouts.request,
                }
            }));
        }
    }

    /// Whether every request byte has been written (or writing has stopped for good).
    fn request_sent(&self) -> bool {
        self.body.is_none() && self.outbuf.is_empty()
    }

    fn poll_io(&mut self, cx: &mut Context<'_>) -> Poll<Result<Progress, BackendError>> {
        let Some(conn) = self.conn.as_mut() else {
            return Poll::Ready(Err(BackendError::ClosedEarly {
                protocol: self.codec.protocol(),
                stage: "after the exchange ended",
                stale: false,
            }));
        };
        let was_sent = self.body.is_none() && self.outbuf.is_empty();
        loop {
            if self.write_error.is_some() {
                self.outbuf.clear();
                self.body = None;
                break;
            }
            // What the body has ready is encoded behind what is queued before writing, so a
            // request's head and its body (often just the end of an empty one) go out in one
            // write rather than one each.
            while self.outbuf.len() < WRITE_GATHER {
                let Some(body) = self.body.as_mut() else {
                    break;
                };
                match body.poll_chunk(cx) {
                    Poll::Ready(Some(Ok(chunk))) => {
                        self.sent += chunk.len() as u64;
                        if let Some(declared) = self.declared.filter(|&d| self.sent > d) {
                            return Poll::Ready(Err(BackendError::BodyLength {
                                declared,
                                actual: self.sent,
                            }));
                        }
                        self.codec.encode_body(&chunk, &mut self.outbuf);
                    }
                    Poll::Ready(Some(Err(source))) => {
                        return Poll::Ready(Err(BackendError::ClientBody { source }));
                    }
                    Poll::Ready(None) => {
                        if let Some(declared) = self.declared.filter(|&d| self.sent != d) {
                            return Poll::Ready(Err(BackendError::BodyLength {
                                declared,
                                actual: self.sent,
                            }));
                        }
                        self.codec.encode_body_end(&mut self.outbuf);
                        self.body = None;
                    }
                    Poll::Pending => break,
                }
            }
            if self.outbuf.is_empty() {
                break;
            }
            match Pin::new(&mut conn.stream).poll_write(cx, &self.outbuf) {
                Poll::Ready(Ok(0)) => {
                    self.write_error = Some(io::ErrorKind::WriteZero.into());
                }
                Poll::Ready(Ok(n)) => {
                    self.written += n as u64;
                    self.outbuf.advance(n);
                }
                // A kept connection whose backend end was gone before the first byte of this
                // request (a worker that closed it while idle, as the request went out): the
                // backend has none of it, so there is nothing to wait for, and the request
                // may be sent again.
                Poll::Ready(Err(source))
                    if self.reused && self.written == 0 && is_reset(&source) =>
                {
                    return Poll::Ready(Err(BackendError::StaleReset {
                        protocol: self.codec.protocol(),
                        source,
                    }));
                }
                Poll::Ready(Err(e)) => self.write_error = Some(e),
                Poll::Pending => break,
            }
        }
        if !was_sent && self.body.is_none() && self.outbuf.is_empty() {
            return Poll::Ready(Ok(Progress::RequestSent));
        }
        // Read into the buffer's spare capacity as it is: zero-filling 32 KiB before every
        // read was half of corral's instructions per request (callgrind).
        if self.inbuf.capacity() - self.inbuf.len() < READ_CHUNK {
            self.inbuf.reserve(READ_CHUNK);
        }
        match poll_read_buf(Pin::new(&mut conn.stream), cx, &mut self.inbuf) {
            Poll::Ready(Ok(n)) => {
                if n == 0 {
                    self.eof = true;
                } else {
                    self.got_byte = true;
                }
                Poll::Ready(Ok(Progress::Read))
            }
            // A kept connection reset before any answer: told apart, as a close is
            // (`closed_error`), for `Gateway::dispatch` to decide on a resend.
            Poll::Ready(Err(source)) if self.reused && !self.got_byte && is_reset(&source) => {
                Poll::Ready(Err(BackendError::StaleRead {
                    protocol: self.codec.protocol(),
                    source,
                }))
            }
            Poll::Ready(Err(source)) => Poll::Ready(Err(BackendError::Read {
                protocol: self.codec.protocol(),
                source,
            })),
            Poll::Pending => Poll::Pending,
        }
    }

    /// Turns a close of the connection into the error that explains it best: a failed write
    /// if there was one, else `closed`.
    fn closed_error(&mut self, closed: BackendError) -> BackendError {
        if let BackendError::ClosedEarly {
            protocol, stage, ..
        } = closed
        {
            if self.reused && !self.got_byte {
                return BackendError::ClosedEarly {
                    protocol,
                    stage,
                    stale: true,
                };
            }
        }
        match self.write_error.take() {
            Some(source) => BackendError::Write {
                protocol: self.protocol(),
                source,
            },
            None => closed,
        }
    }
}
