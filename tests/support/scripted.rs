//! Scripted FastCGI and LSAPI backends for fault injection: the pieces the kept-connection
//! suites and `tests/hostile_backends.rs` build their misbehaving servers from. Reading one
//! request whole off a plain std stream with corral's own decoders, writing a complete
//! FastCGI answer, accepting connections on a thread each, and the corral configuration of
//! one pool whose only server is such a backend.

use std::io::Read;
use std::net::{TcpListener, TcpStream};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::Path;
use std::sync::Arc;
use std::thread;

use bytes::{Bytes, BytesMut};
use corral::protocols::fastcgi::{
    encode_end_request, encode_stdout, encode_stdout_end, ProtocolStatus,
    RequestDecoder as FcgiDecoder, RequestEvent as FcgiEvent,
};
use corral::protocols::lsapi::{
    FlagRule, RequestDecoder as LsapiDecoder, RequestEvent as LsapiEvent, ResponseEncoder,
};

use super::server::{http, Corral};

/// The protocol a scripted backend speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Proto {
    FastCgi,
    Lsapi,
}

impl Proto {
    /// The pool's `protocol` setting for it.
    pub fn name(self) -> &'static str {
        match self {
            Proto::FastCgi => "fastcgi",
            Proto::Lsapi => "lsapi",
        }
    }
}

/// One request read whole: what the scripts look at.
#[derive(Debug, Default)]
pub struct Request {
    pub method: Vec<u8>,
    pub uri: Vec<u8>,
    pub body: Vec<u8>,
}

/// Reads from `s` into `buf`; false at EOF or on an error.
pub fn fill(s: &mut impl Read, buf: &mut BytesMut) -> bool {
    let mut chunk = [0u8; 16384];
    match s.read(&mut chunk) {
        Ok(0) | Err(_) => false,
        Ok(n) => {
            buf.extend_from_slice(&chunk[..n]);
            true
        }
    }
}

/// Reads until the peer closes its end (or the read fails): a connection held open.
pub fn drain(s: &mut impl Read) {
    let mut rest = [0u8; 1024];
    while matches!(s.read(&mut rest), Ok(n) if n > 0) {}
}

/// The parameter `name` among `params` (empty when absent).
pub fn param<'a>(params: &'a [(Bytes, Bytes)], name: &[u8]) -> &'a [u8] {
    params
        .iter()
        .find(|(n, _)| n == name)
        .map_or(&b""[..], |(_, v)| v)
}

/// Reads one whole FastCGI request: its id and what it asked, or `None` at EOF or on an
/// error.
pub fn read_fastcgi(
    s: &mut impl Read,
    dec: &mut FcgiDecoder,
    buf: &mut BytesMut,
) -> Option<(u16, Request)> {
    let mut request = Request::default();
    loop {
        match dec.decode(buf) {
            Ok(Some(FcgiEvent::Params { params, .. })) => {
                request.method = param(&params, b"REQUEST_METHOD").to_vec();
                request.uri = param(&params, b"REQUEST_URI").to_vec();
            }
            Ok(Some(FcgiEvent::Stdin { data, .. })) => request.body.extend_from_slice(&data),
            Ok(Some(FcgiEvent::StdinEnd { request_id })) => return Some((request_id, request)),
            Ok(Some(_)) => {}
            Ok(None) if fill(s, buf) => {}
            Ok(None) | Err(_) => return None,
        }
    }
}

/// Reads one whole LSAPI request, its body included: the encoder for its answer and what it
/// asked, or `None` at EOF or on an error.
pub fn read_lsapi(
    s: &mut impl Read,
    dec: &mut LsapiDecoder,
    buf: &mut BytesMut,
) -> Option<(ResponseEncoder, Request)> {
    let (enc, mut request, mut left) = loop {
        match dec.decode(buf) {
            Ok(Some(LsapiEvent::Begin(b))) => {
                let request = Request {
                    method: b.request_method.as_deref().unwrap_or_default().to_vec(),
                    uri: param(&b.env, b"REQUEST_URI").to_vec(),
                    body: Vec::new(),
                };
                break (
                    ResponseEncoder::new(b.order, FlagRule::HOST),
                    request,
                    b.body_len,
                );
            }
            Ok(Some(_)) => {}
            Ok(None) if fill(s, buf) => {}
            Ok(None) | Err(_) => return None,
        }
    };
    while left > 0 {
        match dec.decode(buf) {
            Ok(Some(LsapiEvent::Body(data))) => {
                left = left.saturating_sub(data.len() as u64);
                request.body.extend_from_slice(&data);
            }
            Ok(Some(_)) => {}
            Ok(None) if fill(s, buf) => {}
            Ok(None) | Err(_) => return None,
        }
    }
    Some((enc, request))
}

/// A whole FastCGI answer to request `id` into `out`: `cgi` as STDOUT, the end of STDOUT and
/// a completed END_REQUEST.
pub fn fastcgi_answer(id: u16, cgi: &[u8], out: &mut BytesMut) {
    encode_stdout(id, cgi, out);
    encode_stdout_end(id, out);
    encode_end_request(id, 0, ProtocolStatus::RequestComplete, out);
}

/// Runs `conn` on a thread of its own for every connection `accept` yields, until it yields
/// none, each with the shared `seen`.
fn each_connection<S, T, F>(
    mut accept: impl FnMut() -> Option<S> + Send + 'static,
    seen: &Arc<T>,
    conn: F,
) where
    S: Send + 'static,
    T: Send + Sync + 'static,
    F: Fn(S, &T) + Send + Sync + 'static,
{
    let seen = Arc::clone(seen);
    let conn = Arc::new(conn);
    thread::spawn(move || {
        while let Some(stream) = accept() {
            let (seen, conn) = (Arc::clone(&seen), Arc::clone(&conn));
            thread::spawn(move || conn(stream, &seen));
        }
    });
}

/// A scripted backend on a loopback TCP port (returned): `conn` serves each connection.
pub fn tcp_backend<T, F>(seen: &Arc<T>, conn: F) -> u16
where
    T: Send + Sync + 'static,
    F: Fn(TcpStream, &T) + Send + Sync + 'static,
{
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    each_connection(move || listener.accept().ok().map(|(s, _)| s), seen, conn);
    port
}

/// A scripted backend on the Unix socket `path`: `conn` serves each connection.
pub fn unix_backend<T, F>(path: &Path, seen: &Arc<T>, conn: F)
where
    T: Send + Sync + 'static,
    F: Fn(UnixStream, &T) + Send + Sync + 'static,
{
    let listener = UnixListener::bind(path).unwrap();
    each_connection(move || listener.accept().ok().map(|(s, _)| s), seen, conn);
}

/// What goes into the configuration of a corral with one pool `app` of one server.
#[derive(Debug, Clone)]
pub struct OneServer<'a> {
    pub proto: Proto,
    /// The pool's `servers` entry: `127.0.0.1:PORT` or `unix:PATH`.
    pub server: String,
    /// Lines added to the pool's settings.
    pub pool: &'a str,
    /// Lines added to the one context's settings.
    pub context: &'a str,
    /// Whether corral serves its status page (on a port of its choosing).
    pub status: bool,
}

impl OneServer<'_> {
    /// The one server on loopback TCP `port`, nothing added.
    pub fn tcp(proto: Proto, port: u16) -> Self {
        Self::at(proto, format!("127.0.0.1:{port}"))
    }

    /// The one server on the Unix socket `path`, nothing added.
    pub fn unix(proto: Proto, path: &Path) -> Self {
        Self::at(proto, format!("unix:{}", path.display()))
    }

    fn at(proto: Proto, server: String) -> Self {
        OneServer {
            proto,
            server,
            pool: "",
            context: "",
            status: false,
        }
    }

    /// The configuration text: an HTTP listener, debug logging, and one pool of the one
    /// server at concurrency 1 (so one kept connection at most), under one context.
    pub fn config(&self, run: &Path) -> String {
        let status = if self.status {
            "\n[status]\naddress = \"127.0.0.1:0\"\n"
        } else {
            ""
        };
        format!(
            r#"
[server]
runtime_dir = "{run}"
log_level = "debug"

[[listen]]
address = "127.0.0.1:0"
protocol = "http"
{status}
[pools.app]
protocol = "{protocol}"
servers = ["{server}"]
concurrency = 1
{pool}

[[contexts]]
pool = "app"
{context}
"#,
            run = run.display(),
            protocol = self.proto.name(),
            server = self.server,
            pool = self.pool,
            context = self.context,
        )
    }

    /// Starts corral so configured, its runtime directory `run` under `dir`.
    pub fn start(&self, dir: &Path) -> Corral {
        Corral::start(&self.config(&dir.join("run")), 1)
    }
}

/// Sends `method` to `/x` with `body` on a new connection: the status and the body's text.
pub fn ask(corral: &Corral, method: &str, body: &[u8]) -> (u16, String) {
    let r = http(corral.http_addr(), method, "/x", &[], body);
    (r.status, r.text())
}
