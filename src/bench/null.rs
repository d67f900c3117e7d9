//! The null backends: the smallest correct responder for each protocol, answering every
//! request with the same CGI response, so a benchmark measures the interface and nothing else.
//!
//! One task per connection, one read buffer and one write buffer per connection, and the
//! answer encoded once: a request allocates nothing beyond what the decoders return (the
//! FastCGI params vector, the LSAPI request box). FastCGI honours FCGI_KEEP_CONN, LSAPI keeps
//! connections until the server closes them, SCGI answers one request and closes.

use std::future::poll_fn;
use std::io;
use std::os::fd::AsFd;
use std::pin::Pin;
use std::sync::Arc;

use bytes::{Bytes, BytesMut};
use http_body::Body;
use hyper::body::Incoming;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

use super::body::FixedBody;
use super::{NullArgs, Protocol};
use crate::error::Error;
use crate::net::{QuietListener, Stream};
use crate::protocols::fastcgi::{self, RequestEvent};
use crate::protocols::lsapi;
use crate::protocols::scgi::{ScgiRequestDecoder, ScgiRequestEvent};
use crate::protocols::Limits;

/// The body pattern, repeated and cut to `--body-size`.
const HELLO: &[u8] = b"Hello, world\n";
/// Bytes asked of each read.
const READ_CHUNK: usize = 16 * 1024;
/// The FastCGI request id every front server we know uses on unmultiplexed connections; its
/// answer is encoded once.
const USUAL_ID: u16 = 1;

/// What every connection shares: the answer in each form.
#[derive(Debug)]
struct Answer {
    /// The body alone (HTTP).
    body: Bytes,
    /// The CGI response: head and body (FastCGI STDOUT content, SCGI).
    cgi: Bytes,
    /// FastCGI STDOUT, empty STDOUT and END_REQUEST for request id 1.
    fastcgi_usual: Bytes,
    /// LSAPI RESP_HEADER, RESP_STREAM and RESP_END.
    lsapi: Bytes,
}

impl Answer {
    fn new(body_size: usize) -> Result<Answer, Error> {
        let body: Bytes = HELLO.iter().copied().cycle().take(body_size).collect();
        let len = body.len().to_string();
        let mut cgi = BytesMut::new();
        cgi.extend_from_slice(b"Status: 200 OK\r\nContent-Type: text/plain\r\nContent-Length: ");
        cgi.extend_from_slice(len.as_bytes());
        cgi.extend_from_slice(b"\r\n\r\n");
        cgi.extend_from_slice(&body);
        let cgi = cgi.freeze();
        let mut usual = BytesMut::new();
        fastcgi_answer(USUAL_ID, &cgi, &mut usual);
        let mut ls = BytesMut::new();
        let encoder = lsapi::ResponseEncoder::default();
        encoder
            .header(
                200,
                &[
                    ("Content-Type", "text/plain"),
                    ("Content-Length", len.as_str()),
                ],
                &mut ls,
            )
            .map_err(|e| Error::Internal(format!("the null LSAPI answer: {e}")))?;
        encoder.stream(&body, &mut ls);
        encoder.end(&mut ls);
        Ok(Answer {
            body,
            cgi,
            fastcgi_usual: usual.freeze(),
            lsapi: ls.freeze(),
        })
    }
}

fn fastcgi_answer(request_id: u16, cgi: &[u8], dst: &mut BytesMut) {
    fastcgi::encode_stdout(request_id, cgi, dst);
    fastcgi::encode_request_complete(request_id, 0, dst);
}

/// A bound listening socket of either kind.
enum Listener {
    Tcp(TcpListener),
    Unix(QuietListener, Option<std::path::PathBuf>),
}

impl Drop for Listener {
    fn drop(&mut self) {
        if let Listener::Unix(_, Some(path)) = self {
            let _ = std::fs::remove_file(path);
        }
    }
}

impl Listener {
    fn bind(addr: &str) -> io::Result<Listener> {
        if addr == "fd0" {
            return Listener::inherit();
        }
        if let Some(path) = addr.strip_prefix("unix:") {
            // A socket file left by a killed null backend is reused; a live one is not.
            let stale = std::os::unix::net::UnixStream::connect(path).is_err();
            if stale && std::path::Path::new(path).exists() {
                std::fs::remove_file(path)?;
            }
            let listener = QuietListener::bind(std::path::Path::new(path))?;
            return Ok(Listener::Unix(listener, Some(path.into())));
        }
        let addr: std::net::SocketAddr = addr.parse().map_err(|_| {
            io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("\"{addr}\" is not unix:/path, IP:PORT or fd0"),
            )
        })?;
        let std = std::net::TcpListener::bind(addr)?;
        std.set_nonblocking(true)?;
        Ok(Listener::Tcp(TcpListener::from_std(std)?))
    }

    /// Takes the listening socket on fd 0 (a duplicate of it; fd 0 stays open). A TCP socket
    /// has an IP address; anything else is taken as a Unix socket.
    fn inherit() -> io::Result<Listener> {
        let fd = io::stdin().as_fd().try_clone_to_owned()?;
        let tcp = std::net::TcpListener::from(fd.try_clone()?);
        if tcp.local_addr().is_ok() {
            tcp.set_nonblocking(true)?;
            return Ok(Listener::Tcp(TcpListener::from_std(tcp)?));
        }
        let unix = std::os::unix::net::UnixListener::from(fd);
        Ok(Listener::Unix(QuietListener::from_std(unix)?, None))
    }

    async fn accept(&self) -> io::Result<Stream> {
        match self {
            Listener::Tcp(l) => {
                let (s, _) = l.accept().await?;
                s.set_nodelay(true)?;
                Ok(Stream::Tcp(s))
            }
            Listener::Unix(l, _) => Ok(Stream::Unix(l.accept().await?)),
        }
    }
}

/// Binds `args.listen` and answers connections until the process is killed.
pub(super) async fn serve(args: &NullArgs) -> Result<(), Error> {
    let answer = Arc::new(Answer::new(args.body_size)?);
    let listener = Listener::bind(&args.listen).map_err(|source| Error::Unavailable {
        what: format!("null-backend listener {}", args.listen),
        source,
    })?;
    let protocol = args.protocol;
    loop {
        let stream = match listener.accept().await {
            Ok(s) => s,
            Err(e) => {
                // Out of descriptors and the like: wait a moment instead of spinning.
                tracing::debug!(error = %e, "accept failed");
                tokio::time::sleep(std::time::Duration::from_millis(10)).await;
                continue;
            }
        };
        let answer = Arc::clone(&answer);
        tokio::spawn(async move {
            let result = match protocol {
                Protocol::Fastcgi => fastcgi_connection(stream, &answer).await,
                Protocol::Scgi => scgi_connection(stream, &answer).await,
                Protocol::Lsapi => lsapi_connection(stream, &answer).await,
                Protocol::Http => http_connection(stream, &answer).await,
            };
            if let Err(e) = result {
                tracing::debug!(error = %e, "null-backend connection ended");
            }
        });
    }
}

fn broken(e: impl std::fmt::Display) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, e.to_string())
}

/// Reads more bytes into `buf`; false at end of stream.
async fn fill(stream: &mut Stream, buf: &mut BytesMut) -> io::Result<bool> {
    buf.reserve(READ_CHUNK);
    Ok(stream.read_buf(buf).await? > 0)
}

async fn fastcgi_connection(mut stream: Stream, answer: &Answer) -> io::Result<()> {
    let mut decoder = fastcgi::RequestDecoder::new(&Limits::DEFAULT);
    let mut input = BytesMut::with_capacity(READ_CHUNK);
    let mut output = BytesMut::with_capacity(READ_CHUNK);
    // (request id, FCGI_KEEP_CONN) of the active requests; usually one.
    let mut active: Vec<(u16, bool)> = Vec::with_capacity(1);
    let caps = fastcgi::Capabilities {
        max_conns: None,
        max_reqs: None,
        mpxs_conns: Some(true),
    };
    loop {
        let mut close = false;
        while let Some(event) = decoder.decode(&mut input).map_err(broken)? {
            match event {
                RequestEvent::Begin {
                    request_id,
                    keep_conn,
                    ..
                } => active.push((request_id, keep_conn)),
                RequestEvent::Rejected {
                    request_id,
                    keep_conn,
                    status,
                } => {
                    fastcgi::encode_end_request(request_id, 0, status, &mut output);
                    close |= !keep_conn;
                }
                RequestEvent::StdinEnd { request_id } | RequestEvent::Abort { request_id } => {
                    if request_id == USUAL_ID {
                        output.extend_from_slice(&answer.fastcgi_usual);
                    } else {
                        fastcgi_answer(request_id, &answer.cgi, &mut output);
                    }
                    decoder.finish(request_id);
                    if let Some(at) = active.iter().position(|(id, _)| *id == request_id) {
                        close |= !active.swap_remove(at).1;
                    }
                }
                RequestEvent::GetValues { names } => {
                    fastcgi::answer_get_values(&names, &caps, &mut output).map_err(broken)?;
                }
                RequestEvent::UnknownType { kind } => {
                    fastcgi::encode_unknown_type(kind, &mut output);
                }
                RequestEvent::Params { .. }
                | RequestEvent::Stdin { .. }
                | RequestEvent::Data { .. }
                | RequestEvent::DataEnd { .. } => {}
            }
        }
        if !output.is_empty() {
            stream.write_all(&output).await?;
            output.clear();
        }
        if close {
            return stream.shutdown().await;
        }
        if !fill(&mut stream, &mut input).await? {
            return Ok(());
        }
    }
}

async fn scgi_connection(mut stream: Stream, answer: &Answer) -> io::Result<()> {
    let mut decoder = ScgiRequestDecoder::new(&Limits::DEFAULT);
    let mut input = BytesMut::with_capacity(READ_CHUNK);
    loop {
        while let Some(event) = decoder.decode(&mut input).map_err(broken)? {
            if event == ScgiRequestEvent::End {
                stream.write_all(&answer.cgi).await?;
                return stream.shutdown().await;
            }
        }
        if !fill(&mut stream, &mut input).await? {
            return Ok(());
        }
    }
}

async fn lsapi_connection(mut stream: Stream, answer: &Answer) -> io::Result<()> {
    let mut decoder = lsapi::RequestDecoder::new(&Limits::DEFAULT);
    let mut input = BytesMut::with_capacity(READ_CHUNK);
    let mut in_request = false;
    loop {
        while let Some(event) = decoder.decode(&mut input).map_err(broken)? {
            match event {
                lsapi::RequestEvent::Begin(_) => in_request = true,
                lsapi::RequestEvent::Body(_) => {}
                // The server gave up on the request: it will close the connection.
                lsapi::RequestEvent::Abort => return Ok(()),
            }
            if in_request && decoder.body_remaining() == 0 {
                stream.write_all(&answer.lsapi).await?;
                in_request = false;
            }
        }
        if !fill(&mut stream, &mut input).await? {
            return Ok(());
        }
    }
}

async fn http_connection(stream: Stream, answer: &Answer) -> io::Result<()> {
    let body = answer.body.clone();
    let service = hyper::service::service_fn(move |req: http::Request<Incoming>| {
        let body = body.clone();
        async move {
            // Read the request body, as a real application would, so the connection stays
            // usable after a POST.
            let mut incoming = req.into_body();
            while let Some(frame) = poll_fn(|cx| Pin::new(&mut incoming).poll_frame(cx)).await {
                frame.map_err(broken)?;
            }
            let mut response = http::Response::new(FixedBody::new(body));
            response.headers_mut().insert(
                http::header::CONTENT_TYPE,
                http::HeaderValue::from_static("text/plain"),
            );
            Ok::<_, io::Error>(response)
        }
    });
    hyper::server::conn::http1::Builder::new()
        .keep_alive(true)
        .serve_connection(hyper_util::rt::TokioIo::new(stream), service)
        .await
        .map_err(broken)
}
