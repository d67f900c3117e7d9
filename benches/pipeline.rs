//! One whole request through corral's in-process pipeline: front bytes in, backend bytes out,
//! and the answer back. The real connection-serving code of the FastCGI and HTTP fronts gets
//! a socketpair as its connection; the gateway's one pool is corral's null FastCGI backend
//! (13 bytes) on a thread of its own, over a real Unix socket. So a regression in the
//! listener, the router, the slot table or the backend exchange shows here without a server,
//! nginx or a load tool (benches/hop.sh measures the same paths with them).
//!
//! - `fastcgi_front_new_connection`: what nginx's plain `fastcgi_pass` does: a connection per
//!   request, nginx's own `fastcgi.conf` parameters, no FCGI_KEEP_CONN.
//! - `http_front_keep_alive`: GET after GET on one HTTP/1.1 connection.

#![allow(missing_docs, clippy::expect_used, clippy::unwrap_used)]

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use bytes::BytesMut;
use corral::bench::{NullArgs, Protocol};
use corral::config::{FrontTimeouts, ListenAddress};
use corral::front::http::ConnInfo;
use corral::front::limits::{Admission, Client};
use corral::front::listener::Peer;
use corral::front::{fastcgi, http};
use corral::gateway::Gateway;
use corral::net::Stream;
use corral::protocols::fastcgi::{encode_begin_request, encode_params, encode_stdin_end, Role};
use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::UnixStream;
use tokio_util::sync::CancellationToken;

struct Harness {
    runtime: tokio::runtime::Runtime,
    gateway: Arc<Gateway>,
    fastcgi: ListenAddress,
    http: ListenAddress,
    timeouts: FrontTimeouts,
    admission: Arc<Admission>,
    _dir: tempfile::TempDir,
}

fn harness() -> Harness {
    let dir = tempfile::tempdir().unwrap();
    let null = dir.path().join("null.sock");
    start_null_backend(null.clone());
    let config = format!(
        r#"
[server]
runtime_dir = "{dir}/run"
log_level = "error"

[[listen]]
address = "unix:{dir}/fcgi.sock"
protocol = "fastcgi"

[[listen]]
address = "127.0.0.1:8080"
protocol = "http"

[pools.null]
servers = ["unix:{null}"]
concurrency = 16

[[contexts]]
pool = "null"
"#,
        dir = dir.path().display(),
        null = null.display(),
    );
    let config = corral::config::parse(&config, "pipeline.toml").expect("a valid config");
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let gateway = {
        let _entered = runtime.enter();
        let settings = corral::gateway::BuildSettings::default();
        let (gateway, drivers) = Gateway::build(&config, &settings).expect("build the gateway");
        assert!(drivers.is_empty(), "an external pool has no driver");
        Arc::new(gateway)
    };
    Harness {
        fastcgi: config.listeners[0].bind.address(),
        http: config.listeners[1].bind.address(),
        timeouts: config.listeners[0].timeouts,
        admission: Admission::new("front", 1024),
        runtime,
        gateway,
        _dir: dir,
    }
}

fn start_null_backend(socket: PathBuf) {
    let args = NullArgs {
        protocol: Protocol::Fastcgi,
        listen: format!("unix:{}", socket.display()),
        body_size: 13,
        threads: Some(1),
    };
    std::thread::spawn(move || corral::bench::run_null(args).expect("the null backend"));
    for _ in 0..1000 {
        if std::os::unix::net::UnixStream::connect(&socket).is_ok() {
            return;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    panic!("the null backend never listened");
}

/// The request nginx 1.22 sends for `GET /bench?x=1` with Debian's `fastcgi.conf`.
fn nginx_request() -> Vec<u8> {
    let params: &[(&str, &str)] = &[
        ("SCRIPT_FILENAME", "/var/www/html/bench"),
        ("QUERY_STRING", "x=1"),
        ("REQUEST_METHOD", "GET"),
        ("CONTENT_TYPE", ""),
        ("CONTENT_LENGTH", ""),
        ("SCRIPT_NAME", "/bench"),
        ("REQUEST_URI", "/bench?x=1"),
        ("DOCUMENT_URI", "/bench"),
        ("DOCUMENT_ROOT", "/var/www/html"),
        ("SERVER_PROTOCOL", "HTTP/1.1"),
        ("REQUEST_SCHEME", "http"),
        ("GATEWAY_INTERFACE", "CGI/1.1"),
        ("SERVER_SOFTWARE", "nginx/1.22.1"),
        ("REMOTE_ADDR", "127.0.0.1"),
        ("REMOTE_PORT", "53012"),
        ("REMOTE_USER", ""),
        ("SERVER_ADDR", "127.0.0.1"),
        ("SERVER_PORT", "8080"),
        ("SERVER_NAME", "localhost"),
        ("REDIRECT_STATUS", "200"),
        ("HTTP_HOST", "127.0.0.1:8080"),
        ("HTTP_USER_AGENT", "wrk"),
        ("HTTP_ACCEPT", "*/*"),
    ];
    let mut out = BytesMut::new();
    encode_begin_request(1, Role::Responder, false, &mut out);
    encode_params(1, params, &mut out).unwrap();
    encode_stdin_end(1, &mut out);
    out.to_vec()
}

fn admit(h: &Harness) -> corral::front::limits::Ticket {
    h.admission
        .admit(Client {
            listener: 0,
            addr: None,
            cap: None,
        })
        .expect("room in the table")
}

/// One nginx-style FastCGI connection: the request written, the answer read to the close.
async fn fastcgi_once(h: &Harness, request: &[u8], scratch: &mut Vec<u8>) -> usize {
    let (ours, theirs) = UnixStream::pair().unwrap();
    let server = tokio::spawn(fastcgi::serve_connection(
        Stream::Unix(ours),
        h.fastcgi.clone(),
        admit(h),
        h.timeouts,
        Arc::clone(&h.gateway),
        CancellationToken::new(),
    ));
    let (mut rx, mut tx) = theirs.into_split();
    tx.write_all(request).await.unwrap();
    scratch.clear();
    rx.read_to_end(scratch).await.unwrap();
    drop(tx);
    server.await.unwrap();
    scratch.len()
}

fn bench(c: &mut Criterion) {
    let h = harness();
    let request = nginx_request();
    let mut group = c.benchmark_group("pipeline");
    group.throughput(Throughput::Elements(1));
    let mut scratch = Vec::with_capacity(4096);
    // The answer is the null backend's: a head, 13 bytes and FCGI_END_REQUEST.
    let answered = h.runtime.block_on(fastcgi_once(&h, &request, &mut scratch));
    assert!(
        scratch.windows(13).any(|w| w == b"Hello, world\n"),
        "unexpected answer of {answered} bytes: {:?}",
        String::from_utf8_lossy(&scratch)
    );
    group.bench_function("fastcgi_front_new_connection", |b| {
        b.iter(|| h.runtime.block_on(fastcgi_once(&h, &request, &mut scratch)))
    });

    // One kept-alive HTTP connection for the whole run.
    let (ours, theirs) = h.runtime.block_on(async { UnixStream::pair().unwrap() });
    let info = ConnInfo {
        listener: h.http.clone(),
        local: Some(std::net::SocketAddr::from(([127, 0, 0, 1], 8080))),
        peer: Peer::Tcp(std::net::SocketAddr::from(([127, 0, 0, 1], 40000))),
        forwarded: None,
        timeouts: h.timeouts,
    };
    let _server = h.runtime.spawn(http::serve_connection(
        Stream::Unix(ours),
        info,
        admit(&h),
        Arc::clone(&h.gateway),
        CancellationToken::new(),
    ));
    let (mut rx, mut tx) = theirs.into_split();
    let get = b"GET /bench?x=1 HTTP/1.1\r\nHost: 127.0.0.1:8080\r\nUser-Agent: wrk\r\n\r\n";
    let mut buf = vec![0u8; 4096];
    let mut exchange = move || {
        h.runtime.block_on(async {
            tx.write_all(get).await.unwrap();
            // The answer ends with the null backend's 13-byte body.
            let mut have = Vec::new();
            while !have.ends_with(b"Hello, world\n") {
                let n = rx.read(&mut buf).await.unwrap();
                assert!(n > 0, "the http front closed the connection");
                have.extend_from_slice(&buf[..n]);
            }
            have.len()
        })
    };
    assert!(exchange() > 13);
    group.bench_function("http_front_keep_alive", |b| b.iter(&mut exchange));
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
