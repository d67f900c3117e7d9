//! The `scgi` front listener: corral as the SCGI server nginx `scgi_pass` (or any SCGI client)
//! connects to. One request per connection: the netstring head is routed and its parameters
//! normalised (nginx sends no SCRIPT_NAME or SCRIPT_FILENAME: they are derived), the body
//! streams from the connection to the backend while the response streams back as a raw CGI
//! response, and the connection closes.
//!
//! Timeouts: the head must be complete within `header_timeout` of accept (or the connection
//! is closed), and a body that stalls for `body_timeout` aborts the connection and its
//! backend request. `idle_timeout` does not apply: an SCGI connection is never kept alive.

use std::future::Future;
use std::sync::Arc;
use std::task::Poll;

use bytes::BytesMut;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_util::sync::CancellationToken;

use crate::backend::{BodySender, RequestBody};
use crate::config::{FrontTimeouts, ListenAddress};
use crate::front::cgi::{self, error_answer, give_back, linger, prepare, read_buffer, CgiSink};
use crate::front::halves::{halves, ReadPart, WritePart};
use crate::front::limits::Ticket;
use crate::gateway::{Gateway, GatewayError, Routed};
use crate::net::Stream;
use crate::protocols::cgi::CgiParams;
use crate::protocols::scgi::{ScgiError, ScgiFrontHead, ScgiRequestDecoder, ScgiRequestEvent};

/// Request-body chunks in flight between the connection and the backend exchange.
const BODY_CHUNKS: usize = 4;
/// Bytes read from the connection at a time.
const READ_CHUNK: usize = cgi::READ_CHUNK;

/// Why the request body stopped before its end.
#[derive(Debug, thiserror::Error)]
enum FeedError {
    /// The connection ended or failed.
    #[error("the SCGI client went away after {received} of {declared} body bytes")]
    Gone {
        /// Bytes received.
        received: u64,
        /// CONTENT_LENGTH.
        declared: u64,
    },
    /// The client broke the protocol.
    #[error("{0}")]
    Protocol(#[from] ScgiError),
}

/// How feeding the body ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fed {
    /// Nothing more is to be read (the whole body, or a failure passed to the exchange).
    All,
    /// The exchange stopped taking the body (it answered or failed).
    Stopped,
    /// The client sent nothing for `body_timeout`.
    Stalled,
    /// The waits for the client's body added up to `body_deadline`.
    Deadline,
}

/// Serves the one request of an SCGI connection; `ticket` counts it in the cap table;
/// `listener` is shared by the listener's connections.
pub async fn serve_connection(
    stream: Stream,
    listener: Arc<ListenAddress>,
    ticket: Ticket,
    timeouts: FrontTimeouts,
    gateway: Arc<Gateway>,
    shutdown: CancellationToken,
) {
    let mut stream = stream;
    let _serving = cgi::Serving::start(&mut stream);
    // Peeked at by the gateway if the request waits for a slot: the connection is not read
    // again once a request without a body is in, so its close would otherwise go unseen
    // until the answer is written (decision 35).
    let front = Some(stream.raw_fd());
    let (mut reader, mut writer) = halves(&mut stream);
    let mut decoder = ScgiRequestDecoder::<ScgiFrontHead>::decoding(&gateway.limits);
    let mut buf = read_buffer();
    let state = Arc::clone(ticket.state());
    let head_deadline = tokio::time::Instant::now() + timeouts.header;
    let head = loop {
        match decoder.decode(&mut buf) {
            Ok(Some(ScgiRequestEvent::Head(head))) => break head,
            Ok(Some(_)) => return,
            Ok(None) => {}
            Err(e) => {
                static BROKEN: crate::logs::LineLimit = crate::logs::LineLimit::per_second();
                let now = tokio::time::Instant::now();
                if let crate::logs::Verdict::Log { suppressed } = BROKEN.check(now, 0) {
                    tracing::warn!(rule = %crate::logs::clean(e), suppressed, "scgi client broke the protocol; closing the connection");
                }
                let _ = writer.write_all(&error_answer(400, None)).await;
                let _ = writer.shutdown().await;
                return;
            }
        }
        buf.reserve(READ_CHUNK);
        // Bytes already there (nginx writes its request as it connects) are read without
        // waiting, so without registering the head timer: a timer earlier than the
        // thread's next wake-up makes tokio wake the thread (an eventfd write).
        let ready = {
            let read = reader.read_buf(&mut buf);
            tokio::pin!(read);
            std::future::poll_fn(|cx| Poll::Ready(read.as_mut().poll(cx))).await
        };
        let read = match ready {
            Poll::Ready(read) => read,
            Poll::Pending => tokio::select! {
                read = reader.read_buf(&mut buf) => read,
                () = shutdown.cancelled() => return,
                () = tokio::time::sleep_until(head_deadline) => {
                    tracing::debug!(after = ?timeouts.header, "scgi head not complete within header_timeout; closing");
                    return;
                }
                // An incomplete head counts as idle: the cap table may close it for room.
                () = state.evicted().cancelled() => {
                    tracing::debug!("closing an scgi connection whose head is not complete, for room under the cap");
                    return;
                }
            },
        };
        match read {
            Ok(0) => return,
            Ok(_) => {}
            Err(e) => {
                tracing::debug!(error = %e, "scgi connection failed before its head");
                return;
            }
        }
    };
    let _busy = state.begin();
    let request_id = gateway.request_id();
    let declared = head.content_length;
    // The parameters hold CONTENT_LENGTH first (SCGI's own place for it), in a buffer of
    // their own: the read buffer is left reclaimable for the next connection (`give_back`).
    let params = head.params.map_err(GatewayError::from);
    let prepared = params.and_then(|params| prepare(&gateway, &listener, params, request_id));
    let (routed, params) = match prepared {
        Ok(prepared) => prepared,
        Err(e) => {
            cgi::refuse(&mut Conn(&mut writer), &e, request_id).await;
            if declared > 0 {
                let _ = writer.shutdown().await;
                linger(&mut reader, &mut buf).await;
            }
            give_back(buf);
            return;
        }
    };
    let fed = if declared == 0 {
        // No body to feed (the decoder has seen its end already): no channel either.
        let body = RequestBody::empty();
        respond(
            &gateway,
            &routed,
            (params, body, front),
            request_id,
            &mut writer,
        )
        .await;
        Some(Fed::All)
    } else {
        let (tx, body) = RequestBody::channel(Some(declared), BODY_CHUNKS);
        let respond = respond(
            &gateway,
            &routed,
            (params, body, front),
            request_id,
            &mut writer,
        );
        let feed = feed(&mut decoder, &mut buf, &mut reader, tx, declared, &timeouts);
        tokio::pin!(respond, feed);
        let mut fed = None;
        loop {
            tokio::select! {
                () = &mut respond => break,
                end = &mut feed, if fed.is_none() => {
                    fed = Some(end);
                    // Abort: dropping the exchange aborts the backend request; the
                    // backend did nothing wrong and is not blamed.
                    if end == Fed::Stalled {
                        tracing::info!(request_id, after = ?timeouts.body, "scgi client sent no body bytes within body_timeout; closing");
                        break;
                    }
                    if end == Fed::Deadline {
                        tracing::info!(request_id, after = ?timeouts.body_total, "scgi client did not send its body within body_deadline; closing");
                        break;
                    }
                }
            }
        }
        fed
    };
    if fed == Some(Fed::Stopped) || fed.is_none() {
        // The FIN first, so the client sees the answer end while corral reads on.
        let _ = writer.shutdown().await;
        linger(&mut reader, &mut buf).await;
    }
    // Otherwise dropping the stream closes the socket, which sends the FIN a shutdown
    // would have sent: one system call fewer per connection.
    give_back(buf);
}

/// Dispatches the request and streams the answer; returns when it is written or the client
/// went away (dropping the backend body, which aborts the backend request).
async fn respond(
    gateway: &Gateway,
    routed: &Routed,
    (params, body, front): (CgiParams, RequestBody, Option<std::os::fd::RawFd>),
    request_id: u64,
    writer: &mut WritePart<'_>,
) {
    let response = gateway
        .dispatch(routed, params, body, request_id, front)
        .await;
    // Closing is all SCGI has to say a response was cut short; a complete one closes too
    // (the caller closes the connection, shutting it down first when it lingers).
    cgi::relay(&mut Conn(writer), response, request_id).await;
}

/// The SCGI connection as a CGI sink: the response goes out as it is.
struct Conn<'a, 'w>(&'a mut WritePart<'w>);

impl CgiSink for Conn<'_, '_> {
    fn frame(&mut self, len: usize) -> BytesMut {
        BytesMut::with_capacity(len)
    }

    async fn send_frame(&mut self, frame: BytesMut) -> bool {
        self.send(&frame).await
    }

    async fn send(&mut self, bytes: &[u8]) -> bool {
        match self.0.write_all(bytes).await {
            Ok(()) => true,
            Err(e) => {
                tracing::debug!(error = %e, "scgi client went away during the response");
                false
            }
        }
    }
}

/// Feeds the body from the connection to the exchange until CONTENT_LENGTH bytes have gone;
/// a connection that ends early or breaks the protocol fails the body (and so the exchange).
/// Each read may wait `body_timeout` for the client, and all of them together
/// `body_deadline`; time spent waiting for the exchange to take a chunk (a slow backend) does
/// not count.
async fn feed(
    decoder: &mut ScgiRequestDecoder<ScgiFrontHead>,
    buf: &mut BytesMut,
    reader: &mut ReadPart<'_>,
    tx: BodySender,
    declared: u64,
    timeouts: &FrontTimeouts,
) -> Fed {
    let mut received = 0u64;
    let mut waited = std::time::Duration::ZERO;
    let failure = loop {
        match decoder.decode(buf) {
            Ok(Some(ScgiRequestEvent::Body(data))) => {
                received += data.len() as u64;
                if tx.send(data).await.is_err() {
                    // The exchange no longer reads the body: it answered or failed.
                    return Fed::Stopped;
                }
                continue;
            }
            Ok(Some(ScgiRequestEvent::End)) => return Fed::All,
            Ok(Some(ScgiRequestEvent::Head(_))) | Ok(None) => {}
            Err(e) => break FeedError::from(e),
        }
        buf.reserve(READ_CHUNK);
        let left = timeouts.body_total.saturating_sub(waited);
        let since = tokio::time::Instant::now();
        let read = tokio::time::timeout(timeouts.body.min(left), reader.read_buf(buf)).await;
        waited += since.elapsed();
        match read {
            Ok(Ok(n)) if n > 0 => {}
            Ok(_) => break FeedError::Gone { received, declared },
            Err(_) if waited >= timeouts.body_total => return Fed::Deadline,
            Err(_) => return Fed::Stalled,
        }
    };
    tracing::debug!(error = %failure, "scgi request body ended early");
    let _ = tx.fail(Box::new(failure)).await;
    Fed::All
}
