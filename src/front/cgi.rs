//! The CGI fronts: what the FastCGI and SCGI listeners share. Both receive CGI parameters
//! from a front server (nginx `fastcgi_pass` or `scgi_pass`, Apache, lighttpd, Caddy) and
//! answer with a CGI response, so both run the same pipeline: `prepare` (route and
//! normalise the front server's parameters),
//! [`Gateway::dispatch`](crate::gateway::Gateway::dispatch), then `relay` into the front
//! protocol's `CgiSink` (FCGI_STDOUT records, or the raw SCGI connection). The CGI answer
//! for a request that got no backend response and the lingering close after answering
//! early live here too.

use std::borrow::Cow;
use std::future::Future;
use std::task::Poll;

use bytes::{Bytes, BytesMut};
use tokio::io::{AsyncRead, AsyncReadExt};

use crate::config::ListenAddress;
use crate::gateway::{Gateway, GatewayError, GatewayResponse, RouteKey, Routed};
use crate::protocols::cgi::{
    check_host, normalize_decoded_path, normalize_front_prepared, parse_request_path, CgiError,
    CgiParams, FrontParams, Known,
};
use crate::protocols::cgi_response::{encode_head, encoded_len, CgiResponseHead, CgiStatus};

/// Bytes a CGI front's connection reads at a time (and reads at a time while lingering).
pub(crate) const READ_CHUNK: usize = 16 * 1024;
/// How long a connection closed by corral keeps reading what the front server still sends.
const LINGER: std::time::Duration = std::time::Duration::from_secs(2);
/// Read buffers a serving thread keeps for its next connections ([`read_buffer`]).
const KEPT_BUFFERS: usize = 8;
/// A read buffer larger than this (one that grew for a large record) is not kept.
const KEPT_CAPACITY: usize = 4 * READ_CHUNK;

thread_local! {
    /// This thread's read buffers of connections that ended, for the next ones.
    static READ_BUFFERS: std::cell::RefCell<Vec<BytesMut>> =
        const { std::cell::RefCell::new(Vec::new()) };
    /// The CGI front connections this thread is serving ([`Serving`]).
    static SERVING: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

/// Counts a CGI front connection as served by this thread while it lives.
pub(crate) struct Serving(());

impl Serving {
    /// Counts the caller's connection; `stream`, when the thread serves no other, has its
    /// first read leave the request on the socket until the answer is out
    /// (`crate::net::Stream::leave_first_read`): a front server that sent its whole request
    /// sleeps until the answer, and at one request at a time taking the request off would
    /// wake it once more for nothing. Under load another connection is almost always in
    /// service, and the front server rarely asleep, so the peek, a `recv` more, is skipped.
    pub(crate) fn start(stream: &mut crate::net::Stream) -> Serving {
        if SERVING.replace(SERVING.get() + 1) == 0 {
            stream.leave_first_read();
        }
        Serving(())
    }
}

impl Drop for Serving {
    fn drop(&mut self) {
        SERVING.set(SERVING.get().saturating_sub(1));
    }
}

/// A read buffer for a new CGI front connection: one a connection that ended on this thread
/// gave back, else a new one of [`READ_CHUNK`] bytes. A front server that opens a connection
/// per request (nginx's plain `fastcgi_pass` and `scgi_pass`) would otherwise have a buffer
/// allocated and freed for every request, and promoted to shared storage the first time a
/// record is split off it.
pub(crate) fn read_buffer() -> BytesMut {
    READ_BUFFERS
        .with_borrow_mut(Vec::pop)
        .unwrap_or_else(|| BytesMut::with_capacity(READ_CHUNK))
}

/// A buffer for a FastCGI answer's first frame of `capacity` bytes: one of the thread's
/// kept buffers when it is large enough, since the frame becomes the writer's batch, which
/// is given back when the connection ends. Without one, a new one, of [`READ_CHUNK`] bytes
/// when `keepable` (the connection's own request, one at a time: the buffer can then be
/// kept when the connection ends), else of `capacity` (a multiplexed request's, of which
/// there may be many at once). A connection per request would otherwise allocate a frame
/// per request.
pub(crate) fn frame_buffer(capacity: usize, keepable: bool) -> BytesMut {
    let kept = (capacity <= READ_CHUNK)
        .then(|| READ_BUFFERS.with_borrow_mut(Vec::pop))
        .flatten();
    kept.unwrap_or_else(|| match keepable {
        true => BytesMut::with_capacity(capacity.max(READ_CHUNK)),
        false => BytesMut::with_capacity(capacity),
    })
}

/// Gives back a connection's read buffer when it ends. Kept only when it is empty and
/// wholly reclaimable (no body chunk split off it is still alive somewhere), not over
/// [`KEPT_CAPACITY`], and while the thread keeps fewer than [`KEPT_BUFFERS`]: what a thread
/// holds this way is bounded, whatever its connections did.
pub(crate) fn give_back(mut buf: BytesMut) {
    buf.clear();
    if !buf.try_reclaim(READ_CHUNK) || buf.capacity() > KEPT_CAPACITY {
        return;
    }
    READ_BUFFERS.with_borrow_mut(|kept| {
        if kept.len() < KEPT_BUFFERS {
            kept.push(buf);
        }
    });
}

/// Routes a front server's request and normalises its parameters for the chosen context
/// (ARCHITECTURE.md decisions 11 and 12): the route and the clean parameters, encoded once.
/// What routing reads (HTTP_HOST, SERVER_NAME, DOCUMENT_URI, REQUEST_URI) was found as the
/// pairs were decoded; the first value of each is the one read, as a search would find it.
pub(crate) fn prepare(
    gateway: &Gateway,
    listener: &ListenAddress,
    params: FrontParams,
    request_id: u64,
) -> Result<(Routed, CgiParams), GatewayError> {
    let routed = {
        // The client's Host, as the front server passed it on, is checked as the HTTP front
        // checks it (nginx does too, but not every front server does); an empty one means
        // none.
        let client_host = params.first(Known::HttpHost).filter(|h| !h.is_empty());
        if let Some(h) = client_host {
            check_host(h)?;
        }
        let host = client_host
            .or_else(|| params.first(Known::ServerName))
            .map(host_name)
            .unwrap_or_default();
        // Routed on the decoded, normalised path, as the HTTP front routes: DOCUMENT_URI is
        // already decoded (nginx's $document_uri), REQUEST_URI is the raw target. A path that
        // cannot be normalised is refused here, before any context is chosen.
        let path = match params.first(Known::DocumentUri).filter(|u| !u.is_empty()) {
            Some(uri) => normalize_decoded_path(uri)?,
            None => {
                let uri = params.first(Known::RequestUri).unwrap_or(b"/");
                Cow::Owned(parse_request_path(uri)?.normalized)
            }
        };
        gateway.route(RouteKey {
            listener,
            host: &host,
            path: &path,
        })?
    };
    // The list of what was left out is made only for the debug line that shows it.
    let listed = tracing::enabled!(tracing::Level::DEBUG);
    let vars = normalize_front_prepared(params, &routed.context.cgi, listed)?;
    for d in &vars.dropped {
        tracing::debug!(request_id, param = %crate::logs::escaped(&d.name), reason = ?d.reason, "left a front server parameter out");
    }
    Ok((routed, vars.params))
}

/// Where a CGI front writes a response: FCGI_STDOUT records on a FastCGI connection, the
/// connection itself for SCGI.
pub(crate) trait CgiSink {
    /// Sends bytes of the CGI response; false when the peer is gone (or no longer wants
    /// this response).
    async fn send(&mut self, bytes: &[u8]) -> bool;

    /// A buffer for about `len` bytes of the response, with room for the sink's own framing
    /// around them: what the caller appends goes out through [`send_frame`](Self::send_frame)
    /// without another copy.
    fn frame(&mut self, len: usize) -> BytesMut;

    /// Sends the bytes appended to a buffer from [`frame`](Self::frame); as
    /// [`send`](Self::send) otherwise.
    async fn send_frame(&mut self, frame: BytesMut) -> bool;

    /// How long a first chunk of body may be to go into the head's frame (a copy); a longer
    /// one follows the head through [`send_data`](Self::send_data).
    const HEAD_TAKES: usize = usize::MAX;

    /// Sends a chunk of the backend's body, which the sink may keep until it is written
    /// instead of copying it; as [`send`](Self::send) otherwise.
    async fn send_data(&mut self, data: Bytes) -> bool {
        self.send(&data).await
    }
}

/// How a relayed response ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Relayed {
    /// Every byte went out (the backend's response, or corral's answer for a failure).
    Complete,
    /// The peer went away (dropping the backend body aborted the backend request).
    Gone,
    /// The backend's response broke off after its head went out: the front protocol's only
    /// way to say so is closing the connection.
    BrokeOff,
}

/// Streams a dispatch result into `sink`: the backend's head and body, or (already logged by
/// `relay`) corral's CGI answer for the failure.
///
/// A plain function returning its future (an `async fn` would keep `response` twice in its
/// state: the argument, and the binding its body moves it into), and the rare refusal's
/// future boxed: the future is moved whole, nested in each caller's, once per request.
#[allow(clippy::manual_async_fn)] // On purpose: see above; an async fn is larger.
pub(crate) fn relay<'s, S: CgiSink>(
    sink: &'s mut S,
    mut response: Result<GatewayResponse, GatewayError>,
    request_id: u64,
) -> impl Future<Output = Relayed> + 's {
    async move {
        let response = match &mut response {
            Ok(r) => r,
            Err(e) => return Box::pin(refuse(sink, e, request_id)).await,
        };
        // The body's first bytes, when they came with the head (a short answer), go out with it:
        // one frame, one write. The head is encoded straight into the sink's frame, sized for
        // both.
        let first = std::future::poll_fn(|cx| Poll::Ready(response.body.poll_chunk(cx))).await;
        let mut broke = None;
        let mut ended = false;
        let mut data = None;
        match first {
            Poll::Ready(Some(Ok(d))) => data = Some(d),
            Poll::Ready(Some(Err(e))) => broke = Some(e),
            Poll::Ready(None) => ended = true,
            Poll::Pending => {}
        }
        // A long first chunk follows the head out of its own buffer.
        let after = data.take_if(|d| d.len() > S::HEAD_TAKES);
        let len = encoded_len(&response.head) + data.as_ref().map_or(0, |d| d.len());
        let mut head = sink.frame(len);
        let framing = head.len();
        if let Err(e) = encode_head(&response.head, &mut head) {
            tracing::warn!(request_id, error = %e, "backend response head cannot be passed on");
            head.truncate(framing);
            head.extend_from_slice(&error_answer(502, None));
            return if sink.send_frame(head).await {
                Relayed::Complete
            } else {
                Relayed::Gone
            };
        }
        if let Some(d) = data {
            head.extend_from_slice(&d);
        }
        if !sink.send_frame(head).await {
            return Relayed::Gone;
        }
        if let Some(d) = after {
            if !sink.send_data(d).await {
                return Relayed::Gone;
            }
        }
        if let Some(e) = broke {
            tracing::warn!(request_id, error = %e, "backend response broke off");
            return Relayed::BrokeOff;
        }
        if ended {
            return Relayed::Complete;
        }
        while let Some(chunk) = response.body.next_chunk().await {
            match chunk {
                Ok(data) => {
                    if !sink.send_data(data).await {
                        return Relayed::Gone;
                    }
                }
                Err(e) => {
                    tracing::warn!(request_id, error = %e, "backend response broke off");
                    return Relayed::BrokeOff;
                }
            }
        }
        Relayed::Complete
    }
}

/// Logs a request that got no backend response and sends corral's CGI answer for it.
pub(crate) async fn refuse(sink: &mut impl CgiSink, e: &GatewayError, request_id: u64) -> Relayed {
    e.log(request_id);
    answer(sink, &error_answer(e.status(), e.retry_after())).await
}

/// Sends a whole CGI answer made by corral.
pub(crate) async fn answer(sink: &mut impl CgiSink, cgi: &[u8]) -> Relayed {
    if sink.send(cgi).await {
        Relayed::Complete
    } else {
        Relayed::Gone
    }
}

/// A Host value lowercased, without its port; borrowed when it is lowercase already. Kept
/// as bytes: routing compares it byte for byte with the contexts' host names, so it is never
/// checked as UTF-8 (a byte that is not UTF-8 matches no configured name, and is left as it
/// is rather than replaced, so two such hosts never become one).
fn host_name(raw: &[u8]) -> Cow<'_, [u8]> {
    let end = if raw.first() == Some(&b'[') {
        raw.iter()
            .position(|&c| c == b']')
            .map_or(raw.len(), |i| i + 1)
    } else {
        raw.iter().position(|&c| c == b':').unwrap_or(raw.len())
    };
    let host = raw.get(..end).unwrap_or(raw);
    if host.iter().any(u8::is_ascii_uppercase) {
        Cow::Owned(host.to_ascii_lowercase())
    } else {
        Cow::Borrowed(host)
    }
}

/// The body length a front server declared in CONTENT_LENGTH; `None` when it sent none (or
/// an empty one, as nginx does for a body it streams without knowing its length). Anything
/// but decimal digits that fit in a `u64` (`-1`, `+5`, `0x10`, `1e3`, 2^64) is refused:
/// taken for "unknown" it would reach the backend as it was, and a backend reads a body of
/// `-1` bytes in its own way.
pub(crate) fn content_length(params: &FrontParams) -> Result<Option<u64>, CgiError> {
    let Some(value) = params.first(Known::ContentLength) else {
        return Ok(None);
    };
    let digits = value.trim_ascii();
    if digits.is_empty() {
        return Ok(None);
    }
    let invalid = || CgiError::InvalidContentLength {
        value: value.get(..64).unwrap_or(value).to_vec(),
    };
    if !digits.iter().all(u8::is_ascii_digit) {
        return Err(invalid());
    }
    std::str::from_utf8(digits)
        .ok()
        .and_then(|d| d.parse().ok())
        .map(Some)
        .ok_or_else(invalid)
}

/// A whole CGI response (head and short body) with `status`, and Retry-After when given.
pub(crate) fn error_answer(status: u16, retry_after: Option<u32>) -> BytesMut {
    let reason = http::StatusCode::from_u16(status)
        .ok()
        .and_then(|s| s.canonical_reason())
        .unwrap_or("Error");
    let mut headers = vec![(
        Bytes::from_static(b"Content-Type"),
        Bytes::from_static(b"text/plain; charset=utf-8"),
    )];
    if let Some(secs) = retry_after {
        headers.push((
            Bytes::from_static(b"Retry-After"),
            Bytes::from(secs.to_string()),
        ));
    }
    let head = CgiResponseHead::new(
        Some(CgiStatus {
            code: status,
            reason: Bytes::from_static(reason.as_bytes()),
        }),
        headers,
    );
    let mut bytes = BytesMut::new();
    if encode_head(&head, &mut bytes).is_err() {
        // Only a code outside 100-999 could be refused; GatewayError never gives one.
        bytes.clear();
        bytes.extend_from_slice(b"Status: 502 Bad Gateway\r\n\r\n");
    }
    bytes.extend_from_slice(format!("{status} {reason}\n").as_bytes());
    bytes
}

/// After corral closed its side, reads and drops what the peer still sends (a request body
/// answered early), for at most [`LINGER`]: closing a socket with unread bytes resets the
/// connection, and a reset can destroy the answer before the peer has read it.
/// `scratch` is reused for the bytes thrown away (nothing is zeroed).
pub(crate) async fn linger(reader: &mut (impl AsyncRead + Unpin), scratch: &mut BytesMut) {
    let drain = async {
        loop {
            scratch.clear();
            scratch.reserve(READ_CHUNK);
            match reader.read_buf(scratch).await {
                Ok(0) | Err(_) => break,
                Ok(_) => {}
            }
        }
    };
    let _ = tokio::time::timeout(LINGER, drain).await;
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Whether a front connection's first read, made after `Serving::start`, left the
    /// request on the socket.
    async fn first_read_left(stream: &mut crate::net::Stream) -> bool {
        let mut got = [0u8; 16];
        let n = stream.read(&mut got).await.unwrap();
        assert_eq!(&got[..n], b"request");
        match stream {
            crate::net::Stream::Unix(s) => s.owed() == n,
            crate::net::Stream::Tcp(_) => unreachable!("a Unix pair"),
        }
    }

    fn front_pair() -> (crate::net::Stream, std::os::unix::net::UnixStream) {
        let (ours, mut theirs) = std::os::unix::net::UnixStream::pair().unwrap();
        std::io::Write::write_all(&mut theirs, b"request").unwrap();
        let ours = crate::net::QuietUnix::new(ours).unwrap();
        (crate::net::Stream::Unix(ours), theirs)
    }

    /// Only a connection the thread serves alone leaves its first read: beside another, the
    /// front server is likely awake and the peek would be a system call for nothing.
    #[tokio::test]
    async fn only_a_lone_connection_leaves_its_request_on_the_socket() {
        let (mut one, _peer_one) = front_pair();
        let serving_one = Serving::start(&mut one);
        let (mut two, _peer_two) = front_pair();
        let serving_two = Serving::start(&mut two);
        assert!(first_read_left(&mut one).await, "alone on the thread");
        assert!(!first_read_left(&mut two).await, "beside another");
        drop((serving_one, serving_two));
        let (mut three, _peer_three) = front_pair();
        let _serving = Serving::start(&mut three);
        assert!(first_read_left(&mut three).await, "alone again");
    }

    #[test]
    fn hosts_lose_their_port_and_case() {
        assert_eq!(&*host_name(b"Example.COM:8080"), b"example.com");
        assert_eq!(&*host_name(b"[::1]:80"), b"[::1]");
        assert_eq!(&*host_name(b"localhost"), b"localhost");
        assert_eq!(&*host_name(b"[::1"), b"[::1");
        assert_eq!(&*host_name(b""), b"");
        // Bytes that are not UTF-8 are kept as they are (so two such hosts stay apart); the
        // cut and the case are as for text.
        assert_eq!(&*host_name(b"Ex\xffAMPLE:80"), b"ex\xffample");
        assert_eq!(&*host_name(b"\xe2:80"), b"\xe2");
        assert_eq!(&*host_name(b"[\xff::1]:80"), b"[\xff::1]");
        assert_eq!(
            &*host_name("B\u{dc}CHER.example".as_bytes()),
            "b\u{dc}cher.example".as_bytes()
        );
        // Borrowed when nothing changes.
        assert!(matches!(
            host_name(b"example.com:80"),
            Cow::Borrowed(b"example.com")
        ));
    }

    fn p(v: &str) -> FrontParams {
        let mut params = FrontParams::new();
        params.push(b"CONTENT_LENGTH", v.as_bytes()).unwrap();
        params
    }

    #[test]
    fn content_length_is_unknown_when_empty() {
        assert_eq!(content_length(&p("12")), Ok(Some(12)));
        assert_eq!(content_length(&p("")), Ok(None));
        assert_eq!(content_length(&FrontParams::new()), Ok(None));
    }

    #[test]
    fn content_length_that_is_no_length_is_refused() {
        for bad in [
            "-1",
            "+5",
            "0x10",
            "1e3",
            "1 2",
            "18446744073709551616",
            "١٢",
        ] {
            assert!(
                matches!(
                    content_length(&p(bad)),
                    Err(CgiError::InvalidContentLength { .. })
                ),
                "{bad}"
            );
        }
        assert_eq!(
            content_length(&p("18446744073709551615")),
            Ok(Some(u64::MAX))
        );
    }

    fn kept() -> usize {
        READ_BUFFERS.with_borrow(Vec::len)
    }

    #[test]
    fn read_buffers_come_back_empty_and_bounded() {
        // Each test runs on a thread of its own: nothing is kept yet.
        assert_eq!(kept(), 0);
        let mut buf = read_buffer();
        assert!(buf.is_empty() && buf.capacity() >= READ_CHUNK);
        buf.extend_from_slice(b"a request from the previous connection");
        let at = buf.as_ptr();
        give_back(buf);
        assert_eq!(kept(), 1);
        // The same memory, and none of the previous connection's bytes.
        let again = read_buffer();
        assert_eq!(again.as_ptr(), at);
        assert!(again.is_empty());
        assert_eq!(kept(), 0);

        // A buffer a chunk still shares (a body chunk a backend has not dropped) is not kept.
        let mut shared = read_buffer();
        shared.extend_from_slice(b"body bytes");
        let chunk = shared.split_to(4).freeze();
        give_back(shared);
        assert_eq!(kept(), 0);
        drop(chunk);

        // A buffer that grew past the bound for a large record is not kept.
        let mut grown = read_buffer();
        grown.reserve(KEPT_CAPACITY + 1);
        give_back(grown);
        assert_eq!(kept(), 0);

        // At most KEPT_BUFFERS are kept, however many connections end at once.
        let many: Vec<BytesMut> = (0..KEPT_BUFFERS + 3).map(|_| read_buffer()).collect();
        for buf in many {
            give_back(buf);
        }
        assert_eq!(kept(), KEPT_BUFFERS);
    }

    #[test]
    fn an_answer_frame_takes_a_kept_buffer_and_comes_back_to_the_thread() {
        assert_eq!(kept(), 0);
        // None kept: a multiplexed request's frame of its own size.
        let own = frame_buffer(100, false);
        assert!(own.capacity() >= 100 && own.capacity() < READ_CHUNK);
        // Too small to serve as a read buffer: not kept.
        give_back(own);
        assert_eq!(kept(), 0);
        // The connection's own request's frame is made to be kept.
        let keepable = frame_buffer(100, true);
        assert!(keepable.capacity() >= READ_CHUNK);
        give_back(keepable);
        assert_eq!(kept(), 1);
        drop(read_buffer());
        assert_eq!(kept(), 0);
        let mut buf = read_buffer();
        buf.extend_from_slice(b"the previous connection's record");
        let at = buf.as_ptr();
        give_back(buf);
        // A frame larger than a kept buffer leaves it kept.
        let large = frame_buffer(READ_CHUNK + 1, true);
        assert!(large.capacity() > READ_CHUNK);
        assert_eq!(kept(), 1);
        // A frame that fits takes it, empty.
        let mut frame = frame_buffer(100, false);
        assert_eq!(frame.as_ptr(), at);
        assert!(frame.is_empty());
        assert_eq!(kept(), 0);
        frame.extend_from_slice(b"an answer written out");
        give_back(frame);
        assert_eq!(kept(), 1);
        assert!(read_buffer().is_empty());
    }

    #[test]
    fn error_answers_are_cgi_responses() {
        let text = error_answer(503, Some(1));
        assert_eq!(
            &text[..],
            b"Status: 503 Service Unavailable\r\nContent-Type: text/plain; charset=utf-8\r\n\
              Retry-After: 1\r\n\r\n503 Service Unavailable\n"
        );
    }
}
