//! ARCHITECTURE.md invariant 4 end to end: bodies stream with bounded buffers.
//!
//! - A large upload through the HTTP front, streamed (`request_buffering = false`) or
//!   spooled (the default), to a real SCGI app (the `scgi` package) does not grow corral's
//!   peak RSS (`VmHWM`, reset through `/proc/PID/clear_refs` before the upload) by more than
//!   a few MiB, a small fraction of the body.
//! - A body of unknown length (no CONTENT_LENGTH) from the FastCGI front reaches an SCGI pool
//!   and an LSAPI pool (the WSGI launcher) whole, with its CONTENT_LENGTH filled in, and
//!   within the same memory bound: it is spooled inside the exchange.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing,
    missing_docs
)]

mod support;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use corral::protocols::fastcgi::{
    encode_begin_request, encode_params, encode_stdin, encode_stdin_end, RecordDecoder, RecordType,
    Role,
};
use support::invariants::{proc_kib, reset_peak};
use support::peers::{self, shared_dir, write_file};
use support::server::{http, parse_response, Corral};

/// How much corral's peak RSS may grow while one large body passes through it. The bound
/// the invariant states is one chunk per direction plus framing (64 KiB spool buffer, hyper's
/// read buffer); the slack is for allocator arenas of the serving threads.
const GROWTH_KIB: u64 = 8 * 1024;

/// The period of [`pattern`], a prime number of bytes, so no chunk boundary lines up with it.
const PERIOD: usize = 65_521;

/// The body: `len` bytes from `offset` of a fixed sequence repeating every [`PERIOD`] bytes.
fn pattern(offset: usize, len: usize) -> Vec<u8> {
    static BLOCK: std::sync::LazyLock<Vec<u8>> = std::sync::LazyLock::new(|| {
        (0..PERIOD)
            .map(|i| u8::try_from((i * 7 + i / 4096) % 251).unwrap())
            .collect()
    });
    let mut out = Vec::with_capacity(len);
    let mut at = offset % PERIOD;
    while out.len() < len {
        let n = (len - out.len()).min(PERIOD - at);
        out.extend_from_slice(&BLOCK[at..at + n]);
        at = 0;
    }
    out
}

/// The md5 of `len` bytes of [`pattern`], computed in pieces.
fn pattern_md5(dir: &Path, len: usize) -> String {
    let path = dir.join("expected.bin");
    let mut f = std::fs::File::create(&path).unwrap();
    let mut at = 0;
    while at < len {
        let n = (len - at).min(1 << 20);
        f.write_all(&pattern(at, n)).unwrap();
        at += n;
    }
    drop(f);
    let out = std::process::Command::new("md5sum")
        .arg(&path)
        .output()
        .unwrap();
    std::fs::remove_file(&path).unwrap();
    String::from_utf8(out.stdout).unwrap()[..32].to_owned()
}

/// An SCGI app on the Unix socket argv[1] answering `len=CONTENT_LENGTH md5=...` of the
/// body it read in 64 KiB pieces; says "ready" once it listens.
const SCGI_APP: &str = r#"import hashlib, socket, sys
from scgi.scgi_server import SCGIServer
from scgi.util import SCGIHandler

class Handler(SCGIHandler):
    def produce(self, env, bodysize, input, output):
        digest, left = hashlib.md5(), bodysize
        while left > 0:
            piece = input.read(min(left, 65536))
            if not piece:
                break
            digest.update(piece)
            left -= len(piece)
        output.write(b'Content-Type: text/plain\r\n\r\n' + ('len=%s md5=%s' % (
            env.get('CONTENT_LENGTH'), digest.hexdigest())).encode())

class UnixServer(SCGIServer):
    def get_listening_socket(self):
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.bind(sys.argv[1])
        return s

    def serve_on_socket(self, s):
        s.listen(40)
        print('ready', flush=True)
        SCGIServer.serve_on_socket(self, s)

UnixServer(handler_class=Handler, max_children=2).serve()
"#;

/// The same answer from a WSGI app, reading wsgi.input to its end.
const WSGI_APP: &str = r#"import hashlib

def application(environ, start_response):
    digest, stream = hashlib.md5(), environ["wsgi.input"]
    while True:
        piece = stream.read(65536)
        if not piece:
            break
        digest.update(piece)
    start_response("200 OK", [("Content-Type", "text/plain")])
    return [("len=%s md5=%s" % (environ.get("CONTENT_LENGTH"), digest.hexdigest())).encode()]
"#;

struct Site {
    corral: Corral,
    dir: tempfile::TempDir,
    _scgi: peers::Peer,
}

impl Site {
    fn fastcgi_socket(&self) -> std::path::PathBuf {
        self.dir.path().join("fcgi.sock")
    }

    /// corral's peak RSS growth over `f`, in KiB.
    fn growth_over<T>(&self, f: impl FnOnce() -> T) -> (T, u64) {
        let pid = self.corral.pid();
        assert!(reset_peak(pid), "cannot reset VmHWM of corral ({pid})");
        let before = proc_kib(pid, "VmHWM");
        let out = f();
        let after = proc_kib(pid, "VmHWM");
        (out, after.saturating_sub(before))
    }
}

fn site() -> Site {
    let dir = shared_dir();
    let app = write_file(dir.path(), "scgi_app.py", SCGI_APP);
    let scgi = peers::python(&app, &dir.path().join("scgi.sock"), true);
    write_file(dir.path(), "app.py", WSGI_APP);
    let config = format!(
        r#"
[server]
runtime_dir = "{run}"
grace = "1s"
kill_timeout = "1s"
spool_budget = "4GiB"

[[listen]]
address = "127.0.0.1:0"
protocol = "http"

[[listen]]
address = "unix:{fcgi}"
protocol = "fastcgi"

[pools.scgi]
protocol = "scgi"
servers = ["unix:{scgi}"]
request_timeout = "120s"

[pools.wsgi]
app = "wsgi:app:application"
cwd = "{dir}"
mode = "static"
max = 1
request_timeout = "120s"

[[contexts]]
prefix = "/stream"
pool = "scgi"
request_buffering = false
max_body = "1GiB"

[[contexts]]
prefix = "/spool"
pool = "scgi"
max_body = "1GiB"

[[contexts]]
prefix = "/wsgi"
pool = "wsgi"
max_body = "1GiB"
"#,
        run = dir.path().join("run").display(),
        fcgi = dir.path().join("fcgi.sock").display(),
        scgi = scgi.socket.display(),
        dir = dir.path().display(),
    );
    let corral = Corral::start(&config, 2);
    // Warm up both pools, so the first request's one-time allocations are not counted.
    for path in ["/stream/x", "/wsgi/x"] {
        let r = http(corral.http_addr(), "POST", path, &[], b"warm");
        assert_eq!(r.status, 200, "{path}: {}\n{}", r.text(), corral.log());
    }
    Site {
        corral,
        dir,
        _scgi: scgi,
    }
}

/// POSTs `len` bytes of [`pattern`], generated as they are written: with a Content-Length,
/// or with `chunked` in chunks of 256 KiB.
fn upload(
    addr: std::net::SocketAddr,
    path: &str,
    len: usize,
    chunked: bool,
) -> support::server::HttpResponse {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(120))).unwrap();
    let framing = if chunked {
        "Transfer-Encoding: chunked".to_owned()
    } else {
        format!("Content-Length: {len}")
    };
    write!(
        s,
        "POST {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\
         Content-Type: application/octet-stream\r\n{framing}\r\n\r\n"
    )
    .unwrap();
    let mut at = 0;
    while at < len {
        let n = (len - at).min(256 * 1024);
        if chunked {
            write!(s, "{n:x}\r\n").unwrap();
        }
        s.write_all(&pattern(at, n)).unwrap();
        if chunked {
            s.write_all(b"\r\n").unwrap();
        }
        at += n;
    }
    if chunked {
        s.write_all(b"0\r\n\r\n").unwrap();
    }
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).unwrap();
    parse_response(&raw)
}

#[test]
fn a_large_upload_does_not_grow_corrals_memory() {
    let site = site();
    let len = 128 << 20;
    let expected = format!("len={len} md5={}", pattern_md5(site.dir.path(), len));
    // Streamed to the worker; spooled first (buffering); spooled to learn its length.
    for (path, chunked) in [
        ("/stream/upload", false),
        ("/spool/upload", false),
        ("/stream/chunked", true),
    ] {
        let (r, grew) = site.growth_over(|| upload(site.corral.http_addr(), path, len, chunked));
        assert_eq!(r.status, 200, "{path}: {}\n{}", r.text(), site.corral.log());
        assert_eq!(r.text(), expected, "{path}");
        eprintln!(
            "{path}: a {} MiB body grew corral's peak RSS by {grew} KiB",
            len >> 20
        );
        assert!(
            grew < GROWTH_KIB,
            "{path}: a {} MiB body grew corral's peak RSS by {grew} KiB",
            len >> 20
        );
    }
}

/// One FastCGI request without CONTENT_LENGTH (or, with `empty`, with an empty one, which
/// means the same) carrying `len` bytes of [`pattern`] as FCGI_STDIN; the CGI response's
/// body as text.
fn fastcgi_unknown_length(socket: &Path, uri: &str, len: usize, empty: bool) -> String {
    let mut s = UnixStream::connect(socket).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(120))).unwrap();
    let mut params: Vec<(&str, &str)> = vec![
        ("REQUEST_METHOD", "POST"),
        ("REQUEST_URI", uri),
        ("DOCUMENT_URI", uri),
        ("SCRIPT_NAME", uri),
        ("QUERY_STRING", ""),
        ("SERVER_PROTOCOL", "HTTP/1.1"),
        ("GATEWAY_INTERFACE", "CGI/1.1"),
        ("SERVER_NAME", "localhost"),
        ("HTTP_HOST", "localhost"),
        ("CONTENT_TYPE", "application/octet-stream"),
    ];
    if empty {
        params.push(("CONTENT_LENGTH", ""));
    }
    let params: Vec<(Bytes, Bytes)> = params
        .iter()
        .map(|(n, v)| (Bytes::from(n.to_string()), Bytes::from(v.to_string())))
        .collect();
    let mut out = BytesMut::new();
    encode_begin_request(1, Role::Responder, false, &mut out);
    encode_params(1, &params, &mut out).unwrap();
    s.write_all(&out).unwrap();
    let mut at = 0;
    while at < len {
        let n = (len - at).min(32 * 1024);
        let mut rec = BytesMut::new();
        encode_stdin(1, &pattern(at, n), &mut rec);
        s.write_all(&rec).unwrap();
        at += n;
    }
    let mut end = BytesMut::new();
    encode_stdin_end(1, &mut end);
    s.write_all(&end).unwrap();
    let mut decoder = RecordDecoder::new();
    let mut buf = BytesMut::new();
    let mut stdout = Vec::new();
    loop {
        while let Some(r) = decoder.decode(&mut buf).unwrap() {
            match r.kind {
                RecordType::Stdout => stdout.extend_from_slice(&r.content),
                RecordType::EndRequest => {
                    let text = String::from_utf8_lossy(&stdout).into_owned();
                    return text
                        .split_once("\r\n\r\n")
                        .map_or(text.clone(), |(_, body)| body.to_owned());
                }
                _ => {}
            }
        }
        let mut chunk = [0u8; 16384];
        let n = s.read(&mut chunk).expect("corral answers in time");
        assert!(
            n > 0,
            "closed before END_REQUEST: {:?}",
            String::from_utf8_lossy(&stdout)
        );
        buf.extend_from_slice(&chunk[..n]);
    }
}

#[test]
fn an_unknown_length_fastcgi_body_reaches_scgi_and_lsapi_whole_and_bounded() {
    let site = site();
    for len in [0, 100, 3 << 20] {
        let expected = format!("len={len} md5={}", pattern_md5(site.dir.path(), len));
        for uri in ["/stream/unknown", "/wsgi/unknown"] {
            for empty in [false, true] {
                let body = fastcgi_unknown_length(&site.fastcgi_socket(), uri, len, empty);
                assert_eq!(
                    body,
                    expected,
                    "{uri}, {len} bytes, empty CONTENT_LENGTH {empty}:\n{}",
                    site.corral.log()
                );
            }
        }
    }
    let len = 32 << 20;
    let expected = format!("len={len} md5={}", pattern_md5(site.dir.path(), len));
    for uri in ["/stream/unknown", "/wsgi/unknown"] {
        let (body, grew) =
            site.growth_over(|| fastcgi_unknown_length(&site.fastcgi_socket(), uri, len, false));
        assert_eq!(body, expected, "{uri}:\n{}", site.corral.log());
        eprintln!(
            "{uri}: a {} MiB body of unknown length grew corral's peak RSS by {grew} KiB",
            len >> 20
        );
        assert!(
            grew < GROWTH_KIB,
            "{uri}: a {} MiB body of unknown length grew corral's peak RSS by {grew} KiB",
            len >> 20
        );
    }
}
