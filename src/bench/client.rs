//! One connection of the load generator, per protocol: the request encoded once, then sent
//! and its answer read back as often as the load loop asks.
//!
//! FastCGI, SCGI and LSAPI are driven straight through the `corral-protocols` codecs with a
//! read buffer per connection (no per-request task, no copy of the answer); HTTP goes through
//! hyper's HTTP/1 client connection.

use std::future::poll_fn;
use std::io;
use std::pin::Pin;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use http_body::Body;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use super::body::FixedBody;
use super::{BenchArgs, Protocol, Switch};
use crate::config::BackendAddress;
use crate::error::Error;
use crate::net::Stream;
use crate::protocols::fastcgi::{self, ResponseEvent, Role};
use crate::protocols::{lsapi, scgi, Limits};

/// The FastCGI request id of every request (one request per connection at a time).
const REQUEST_ID: u16 = 1;
/// Bytes asked of each read.
const READ_CHUNK: usize = 16 * 1024;
/// Requests up to this size fit the socket buffer and are written in one go.
const SMALL_REQUEST: usize = 64 * 1024;
/// A CGI response head longer than this is a protocol error.
const MAX_HEAD: usize = 64 * 1024;

/// Why a request failed (non-2xx answers are not failures here: they are counted apart).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Failure {
    /// The connection could not be made.
    Connect,
    /// The peer broke the protocol or closed the connection mid-answer.
    Protocol,
}

/// What one answer was.
#[derive(Debug, Clone, Copy)]
pub(super) struct Reply {
    /// The HTTP status.
    pub status: u16,
    /// Bytes of response body (after the head).
    pub body_bytes: u64,
}

/// Everything fixed about the requests of a run.
#[derive(Debug)]
pub(super) struct Plan {
    protocol: Protocol,
    keepalive: bool,
    /// The encoded request, body included (FastCGI, SCGI, LSAPI).
    wire: Bytes,
    method: http::Method,
    uri: http::Uri,
    body: Bytes,
    /// How long a connect may take.
    pub timeout: Duration,
}

impl Plan {
    /// Encodes the request `args` describe.
    pub fn new(args: &BenchArgs) -> Result<Plan, Error> {
        let bad = |what: String| Error::Serve(format!("cannot build the request: {what}"));
        let keepalive = args.keepalive == Switch::On && args.protocol != Protocol::Scgi;
        let body: Bytes = std::iter::repeat_n(b'x', args.body_size).collect();
        let limits = Limits::DEFAULT;
        let mut wire = BytesMut::new();
        let params = cgi_params(args);
        match args.protocol {
            Protocol::Http => {}
            Protocol::Fastcgi => {
                let mut pairs = params.clone();
                pairs.push(("CONTENT_LENGTH".to_owned(), body.len().to_string()));
                fastcgi::encode_begin_request(REQUEST_ID, Role::Responder, keepalive, &mut wire);
                fastcgi::encode_params(REQUEST_ID, &pairs, &mut wire)
                    .map_err(|e| bad(e.to_string()))?;
                fastcgi::encode_stdin(REQUEST_ID, &body, &mut wire);
                fastcgi::encode_stdin_end(REQUEST_ID, &mut wire);
            }
            Protocol::Scgi => {
                scgi::encode_request_head(body.len() as u64, &params, &limits, &mut wire)
                    .map_err(|e| bad(e.to_string()))?;
                wire.extend_from_slice(&body);
            }
            Protocol::Lsapi => {
                let line = format!("{} {} HTTP/1.1", args.method, args.path);
                let mut b = lsapi::RequestBuilder::new(&limits, line.as_bytes())
                    .map_err(|e| bad(e.to_string()))?;
                for (name, value) in &params {
                    b.env(name.as_bytes(), value.as_bytes())
                        .map_err(|e| bad(e.to_string()))?;
                }
                b.header(b"Host", b"localhost")
                    .map_err(|e| bad(e.to_string()))?;
                if !body.is_empty() {
                    b.header(b"Content-Length", body.len().to_string().as_bytes())
                        .map_err(|e| bad(e.to_string()))?;
                }
                b.body_len(body.len() as u64);
                b.encode(&mut wire).map_err(|e| bad(e.to_string()))?;
                wire.extend_from_slice(&body);
            }
        }
        let method = http::Method::from_bytes(args.method.as_bytes())
            .map_err(|e| bad(format!("method \"{}\": {e}", args.method)))?;
        let uri = args
            .path
            .parse::<http::Uri>()
            .map_err(|e| bad(format!("path \"{}\": {e}", args.path)))?;
        Ok(Plan {
            protocol: args.protocol,
            keepalive,
            wire: wire.freeze(),
            method,
            uri,
            body,
            timeout: args.timeout,
        })
    }

    /// Opens a connection to `addr`.
    pub async fn connect(&self, addr: &BackendAddress) -> Result<Conn, Failure> {
        let stream = Stream::connect(addr, self.timeout)
            .await
            .map_err(|_| Failure::Connect)?;
        if self.protocol == Protocol::Http {
            let io = hyper_util::rt::TokioIo::new(stream);
            let (sender, connection) = hyper::client::conn::http1::handshake(io)
                .await
                .map_err(|_| Failure::Connect)?;
            tokio::spawn(async move {
                let _ = connection.await;
            });
            return Ok(Conn::Http(sender));
        }
        Ok(Conn::Raw(Box::new(Raw {
            stream,
            input: BytesMut::with_capacity(READ_CHUNK),
            head: HeadScan::default(),
            fastcgi: fastcgi::ResponseDecoder::new(REQUEST_ID, self.keepalive, &Limits::DEFAULT),
            fastcgi_used: false,
            lsapi: lsapi::ResponseDecoder::new(&Limits::DEFAULT),
        })))
    }
}

/// The CGI variables every request carries (CONTENT_LENGTH is added per protocol).
fn cgi_params(args: &BenchArgs) -> Vec<(String, String)> {
    let (path, query) = args.path.split_once('?').unwrap_or((&args.path, ""));
    let script = args
        .script_filename
        .clone()
        .unwrap_or_else(|| path.to_owned());
    let mut params: Vec<(String, String)> = [
        ("GATEWAY_INTERFACE", "CGI/1.1"),
        ("SERVER_SOFTWARE", "corral-bench"),
        ("SERVER_PROTOCOL", "HTTP/1.1"),
        ("SERVER_NAME", "localhost"),
        ("SERVER_ADDR", "127.0.0.1"),
        ("SERVER_PORT", "80"),
        ("REMOTE_ADDR", "127.0.0.1"),
        ("REMOTE_PORT", "50000"),
        ("REQUEST_METHOD", args.method.as_str()),
        ("REQUEST_URI", args.path.as_str()),
        ("SCRIPT_NAME", path),
        ("SCRIPT_FILENAME", script.as_str()),
        ("QUERY_STRING", query),
        ("DOCUMENT_ROOT", "/"),
        // php-cgi refuses requests without it unless cgi.force_redirect is off.
        ("REDIRECT_STATUS", "200"),
        ("HTTP_HOST", "localhost"),
    ]
    .iter()
    .map(|(n, v)| ((*n).to_owned(), (*v).to_owned()))
    .collect();
    if args.body_size > 0 {
        params.push((
            "CONTENT_TYPE".to_owned(),
            "application/octet-stream".to_owned(),
        ));
    }
    params
}

/// An open connection.
pub(super) enum Conn {
    /// FastCGI, SCGI or LSAPI over the codecs.
    Raw(Box<Raw>),
    /// HTTP/1.1 through hyper.
    Http(hyper::client::conn::http1::SendRequest<FixedBody>),
}

/// The state of a codec-driven connection.
pub(super) struct Raw {
    stream: Stream,
    input: BytesMut,
    head: HeadScan,
    fastcgi: fastcgi::ResponseDecoder,
    fastcgi_used: bool,
    lsapi: lsapi::ResponseDecoder,
}

impl Conn {
    /// Sends one request and reads its answer; true with it when the connection may carry
    /// the next request.
    pub async fn exchange(&mut self, plan: &Plan) -> Result<(Reply, bool), Failure> {
        match self {
            Conn::Http(sender) => http_exchange(sender, plan).await,
            Conn::Raw(raw) => {
                send(&mut raw.stream, &plan.wire, &mut raw.input)
                    .await
                    .map_err(|_| Failure::Protocol)?;
                raw.head.reset();
                match plan.protocol {
                    Protocol::Fastcgi => raw.fastcgi(plan).await,
                    Protocol::Lsapi => raw.lsapi(plan).await,
                    Protocol::Scgi | Protocol::Http => raw.until_eof().await,
                }
            }
        }
    }
}

impl Raw {
    /// Reads more bytes; a closed connection is a protocol error mid-answer.
    async fn fill(&mut self) -> Result<(), Failure> {
        self.input.reserve(READ_CHUNK);
        match self.stream.read_buf(&mut self.input).await {
            Ok(0) | Err(_) => Err(Failure::Protocol),
            Ok(_) => Ok(()),
        }
    }

    async fn fastcgi(&mut self, plan: &Plan) -> Result<(Reply, bool), Failure> {
        if self.fastcgi_used {
            self.fastcgi
                .reuse(REQUEST_ID, plan.keepalive)
                .map_err(|_| Failure::Protocol)?;
        }
        self.fastcgi_used = true;
        loop {
            while let Some(event) = self
                .fastcgi
                .decode(&mut self.input)
                .map_err(|_| Failure::Protocol)?
            {
                match event {
                    ResponseEvent::Stdout(data) => self.head.feed(&data)?,
                    ResponseEvent::End { .. } => {
                        let reusable = self.fastcgi.is_reusable() && self.input.is_empty();
                        return Ok((self.head.reply()?, reusable));
                    }
                    _ => {}
                }
            }
            self.fill().await?;
        }
    }

    async fn lsapi(&mut self, plan: &Plan) -> Result<(Reply, bool), Failure> {
        let mut status = 0;
        let mut body = 0u64;
        loop {
            while let Some(event) = self
                .lsapi
                .decode(&mut self.input)
                .map_err(|_| Failure::Protocol)?
            {
                match event {
                    lsapi::ResponseEvent::Header(head) => {
                        status = match head.status {
                            0 => head
                                .fields()
                                .find(|(n, _)| n.eq_ignore_ascii_case(b"status"))
                                .and_then(|(_, v)| status_code(&v))
                                .unwrap_or(200),
                            s => s,
                        };
                    }
                    lsapi::ResponseEvent::Stream(data) => body += data.len() as u64,
                    lsapi::ResponseEvent::End | lsapi::ResponseEvent::ConnClose => {
                        let reusable = plan.keepalive && !self.lsapi.is_closed();
                        let reply = Reply {
                            status,
                            body_bytes: body,
                        };
                        return Ok((reply, reusable && self.input.is_empty()));
                    }
                    _ => {}
                }
            }
            self.fill().await?;
        }
    }

    /// SCGI: the answer is everything until the backend closes.
    async fn until_eof(&mut self) -> Result<(Reply, bool), Failure> {
        loop {
            if !self.input.is_empty() {
                let data = self.input.split();
                self.head.feed(&data)?;
            }
            self.input.reserve(READ_CHUNK);
            match self.stream.read_buf(&mut self.input).await {
                Ok(0) => return Ok((self.head.reply()?, false)),
                Ok(_) => {}
                Err(_) => return Err(Failure::Protocol),
            }
        }
    }
}

/// Writes `wire`. A large request is written while whatever the peer answers meanwhile is
/// read into `input`, so a backend that answers before reading the whole body cannot leave
/// both sides blocked on full socket buffers.
async fn send(stream: &mut Stream, wire: &[u8], input: &mut BytesMut) -> io::Result<()> {
    if wire.len() <= SMALL_REQUEST {
        return stream.write_all(wire).await;
    }
    match stream {
        Stream::Tcp(s) => {
            let (r, w) = s.split();
            pump(r, w, wire, input).await
        }
        Stream::Unix(s) => {
            let (r, w) = s.split();
            pump(r, w, wire, input).await
        }
    }
}

async fn pump(
    mut r: impl AsyncRead + Unpin,
    mut w: impl AsyncWrite + Unpin,
    wire: &[u8],
    input: &mut BytesMut,
) -> io::Result<()> {
    let mut rest = wire;
    while !rest.is_empty() {
        input.reserve(READ_CHUNK);
        tokio::select! {
            biased;
            n = w.write(rest) => match n? {
                0 => return Err(io::ErrorKind::WriteZero.into()),
                n => rest = rest.get(n..).unwrap_or_default(),
            },
            n = r.read_buf(input) => if n? == 0 {
                return Err(io::ErrorKind::UnexpectedEof.into());
            },
        }
    }
    Ok(())
}

async fn http_exchange(
    sender: &mut hyper::client::conn::http1::SendRequest<FixedBody>,
    plan: &Plan,
) -> Result<(Reply, bool), Failure> {
    sender.ready().await.map_err(|_| Failure::Protocol)?;
    let mut request = http::Request::new(FixedBody::new(plan.body.clone()));
    *request.method_mut() = plan.method.clone();
    *request.uri_mut() = plan.uri.clone();
    let headers = request.headers_mut();
    headers.insert(
        http::header::HOST,
        http::HeaderValue::from_static("localhost"),
    );
    if !plan.keepalive {
        headers.insert(
            http::header::CONNECTION,
            http::HeaderValue::from_static("close"),
        );
    }
    let response = sender
        .send_request(request)
        .await
        .map_err(|_| Failure::Protocol)?;
    let status = response.status().as_u16();
    // A server that says it closes (or speaks HTTP/1.0 without keep-alive) is not sent the
    // next request, which would fail before hyper notices the close.
    let connection = response.headers().get(http::header::CONNECTION);
    let has = |token: &str| {
        connection.is_some_and(|v| {
            v.as_bytes()
                .split(|&b| b == b',')
                .any(|t| t.trim_ascii().eq_ignore_ascii_case(token.as_bytes()))
        })
    };
    let closes =
        has("close") || (response.version() == http::Version::HTTP_10 && !has("keep-alive"));
    let mut body = response.into_body();
    let mut body_bytes = 0u64;
    while let Some(frame) = poll_fn(|cx| Pin::new(&mut body).poll_frame(cx)).await {
        let frame = frame.map_err(|_| Failure::Protocol)?;
        if let Some(data) = frame.data_ref() {
            body_bytes += data.len() as u64;
        }
    }
    Ok((
        Reply { status, body_bytes },
        plan.keepalive && !closes && !sender.is_closed(),
    ))
}

/// Finds the end of a CGI response head and its status, counting the body after it.
#[derive(Debug, Default)]
struct HeadScan {
    /// The head so far (kept only until its end is found).
    head: Vec<u8>,
    /// Status once the head is complete.
    status: Option<u16>,
    body: u64,
}

impl HeadScan {
    fn reset(&mut self) {
        self.head.clear();
        self.status = None;
        self.body = 0;
    }

    fn feed(&mut self, data: &[u8]) -> Result<(), Failure> {
        if self.status.is_some() {
            self.body += data.len() as u64;
            return Ok(());
        }
        self.head.extend_from_slice(data);
        let Some(end) = head_end(&self.head) else {
            return if self.head.len() > MAX_HEAD {
                Err(Failure::Protocol)
            } else {
                Ok(())
            };
        };
        let head = self.head.get(..end).unwrap_or_default();
        self.status = Some(head_status(head).ok_or(Failure::Protocol)?);
        self.body = (self.head.len() - end) as u64;
        Ok(())
    }

    fn reply(&self) -> Result<Reply, Failure> {
        Ok(Reply {
            status: self.status.ok_or(Failure::Protocol)?,
            body_bytes: self.body,
        })
    }
}

/// Index just past the blank line ending a head (CRLF or bare LF lines).
fn head_end(buf: &[u8]) -> Option<usize> {
    let mut line_start = 0;
    for (i, &b) in buf.iter().enumerate() {
        if b == b'\n' {
            let line = buf.get(line_start..i).unwrap_or_default();
            if line.is_empty() || line == b"\r" {
                return Some(i + 1);
            }
            line_start = i + 1;
        }
    }
    None
}

/// The status of a complete head: a `Status:` line, an `HTTP/1.x NNN` first line (some SCGI
/// apps answer that way), else 200; `None` when the status given is not a number.
fn head_status(head: &[u8]) -> Option<u16> {
    for line in head.split(|&b| b == b'\n') {
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        if line.starts_with(b"HTTP/") {
            let code = line.split(|&b| b == b' ').nth(1)?;
            return status_code(code);
        }
        if let Some((name, value)) = line.split_once_byte(b':') {
            if name.eq_ignore_ascii_case(b"status") {
                return status_code(value);
            }
        }
    }
    Some(200)
}

/// The three-digit code at the start of `text` (after spaces).
fn status_code(text: &[u8]) -> Option<u16> {
    let text = text.trim_ascii_start();
    let digits = text.get(..3)?;
    std::str::from_utf8(digits).ok()?.parse().ok()
}

trait SplitOnce {
    fn split_once_byte(&self, sep: u8) -> Option<(&[u8], &[u8])>;
}

impl SplitOnce for [u8] {
    fn split_once_byte(&self, sep: u8) -> Option<(&[u8], &[u8])> {
        let at = self.iter().position(|&b| b == sep)?;
        Some((self.get(..at)?, self.get(at + 1..)?))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_the_head_and_its_status() {
        let mut scan = HeadScan::default();
        scan.feed(b"Status: 404 Not Found\r\nContent-Type: text/plain\r")
            .unwrap();
        assert!(scan.reply().is_err());
        scan.feed(b"\n\r\nabc").unwrap();
        scan.feed(b"de").unwrap();
        let reply = scan.reply().unwrap();
        assert_eq!((reply.status, reply.body_bytes), (404, 5));
        assert_eq!(head_status(b"Content-Type: x\n\n"), Some(200));
        assert_eq!(head_status(b"HTTP/1.1 503 Busy\r\n\r\n"), Some(503));
        assert_eq!(head_end(b"A: b\n\nbody"), Some(6));
    }
}
