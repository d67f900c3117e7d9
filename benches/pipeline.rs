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
//!
//! `cargo bench --bench pipeline -- --allocs` counts heap allocations per request instead
//! (a counting `#[global_allocator]`), on four paths with the null backends as processes of
//! their own (`corral null-backend`), so that only corral's and the client's allocations are
//! counted, and the client makes none: it writes one static request and reads into one
//! buffer. It prints a table and fails above [`ALLOC_BUDGET`] on the http → FastCGI path
//! (issue 19's target, a GET with 8 request headers).

#![allow(missing_docs, clippy::expect_used, clippy::unwrap_used)]

use std::alloc::{GlobalAlloc, Layout, System};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::BytesMut;
use corral::app::{Crew, CrewFront};
use corral::bench::{NullArgs, Protocol};
use corral::config::{FrontTimeouts, ListenAddress};
use corral::front::http::ConnInfo;
use corral::front::limits::{Admission, Client};
use corral::front::listener::Peer;
use corral::front::{fastcgi, http};
use corral::gateway::Gateway;
use corral::net::{QuietUnix, Stream};
use corral::protocols::fastcgi::{encode_begin_request, encode_params, encode_stdin_end, Role};
use criterion::{criterion_group, Criterion, Throughput};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::UnixStream;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// Heap allocations per request allowed on the http → FastCGI path (issue 19).
const ALLOC_BUDGET: f64 = 10.0;

/// The system allocator, counting calls and bytes.
struct Counting;

static ALLOCS: AtomicU64 = AtomicU64::new(0);
static ALLOC_BYTES: AtomicU64 = AtomicU64::new(0);

// SAFETY: every call is passed to the system allocator unchanged; only counters are added.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCS.fetch_add(1, Ordering::Relaxed);
        ALLOC_BYTES.fetch_add(layout.size() as u64, Ordering::Relaxed);
        // SAFETY: the caller keeps `GlobalAlloc::alloc`'s contract, which System's shares.
        unsafe { System.alloc(layout) }
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        ALLOCS.fetch_add(1, Ordering::Relaxed);
        ALLOC_BYTES.fetch_add(layout.size() as u64, Ordering::Relaxed);
        // SAFETY: as for `alloc`.
        unsafe { System.alloc_zeroed(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` came from this allocator, that is from System, with `layout`.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        ALLOCS.fetch_add(1, Ordering::Relaxed);
        ALLOC_BYTES.fetch_add(new_size as u64, Ordering::Relaxed);
        // SAFETY: as for `dealloc`, and the caller keeps `realloc`'s contract.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

fn counted() -> (u64, u64) {
    (
        ALLOCS.load(Ordering::Relaxed),
        ALLOC_BYTES.load(Ordering::Relaxed),
    )
}

struct Harness {
    runtime: tokio::runtime::Runtime,
    gateway: Arc<Gateway>,
    fastcgi: Arc<ListenAddress>,
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
    let (config, runtime, gateway) = gateway_for(&config, "pipeline.toml");
    Harness {
        fastcgi: Arc::new(config.listeners[0].bind.address()),
        http: config.listeners[1].bind.address(),
        timeouts: config.listeners[0].timeouts,
        admission: Admission::new("front", 1024),
        runtime,
        gateway,
        _dir: dir,
    }
}

/// `text` parsed, a current-thread runtime, and the gateway of the configuration (external
/// pools only, so no driver to run).
fn gateway_for(
    text: &str,
    name: &str,
) -> (
    corral::config::Config,
    tokio::runtime::Runtime,
    Arc<Gateway>,
) {
    let config = corral::config::parse(text, name).expect("a valid config");
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
    (config, runtime, gateway)
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

/// A connected pair: corral's end registered for reads only, as its Unix listener accepts
/// one (one registration, as in production: a tokio stream converted would be registered
/// twice and count an allocation the front does not make), and the peer's end. Called on
/// the runtime.
fn front_pair() -> (QuietUnix, UnixStream) {
    let (ours, theirs) = std::os::unix::net::UnixStream::pair().unwrap();
    theirs.set_nonblocking(true).unwrap();
    (
        QuietUnix::new(ours).unwrap(),
        UnixStream::from_std(theirs).unwrap(),
    )
}

/// One nginx-style FastCGI connection: the request written, the answer read to the close.
async fn fastcgi_once(h: &Harness, request: &[u8], scratch: &mut Vec<u8>) -> usize {
    let (ours, theirs) = front_pair();
    let server = tokio::spawn(fastcgi::serve_connection(
        Stream::Unix(ours),
        Arc::clone(&h.fastcgi),
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
    // Registered inside the runtime: a `QuietUnix` needs its reactor.
    let (ours, theirs) = h.runtime.block_on(async {
        let (ours, theirs) = UnixStream::pair().unwrap();
        (QuietUnix::from_tokio(ours).unwrap(), theirs)
    });
    let info = ConnInfo {
        listener: h.http.clone(),
        peer: Peer::Tcp(std::net::SocketAddr::from(([127, 0, 0, 1], 40000))),
        forwarded: None,
        timeouts: h.timeouts,
        server_vars: Arc::new(http::server_vars(Some(std::net::SocketAddr::from((
            [127, 0, 0, 1],
            8080,
        ))))),
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

fn main() {
    if std::env::args().any(|a| a == "--allocs") {
        std::process::exit(alloc_report());
    }
    benches();
    Criterion::default().configure_from_args().final_summary();
}

/// A null backend of `protocol` as a process of its own, listening on `socket`.
fn null_process(protocol: &str, socket: &Path) -> std::process::Child {
    let child = std::process::Command::new(env!("CARGO_BIN_EXE_corral"))
        .args([
            "null-backend",
            "--protocol",
            protocol,
            "--threads",
            "1",
            "--listen",
        ])
        .arg(format!("unix:{}", socket.display()))
        .stdout(std::process::Stdio::null())
        .spawn()
        .expect("start corral null-backend");
    let mut child = child;
    for _ in 0..1000 {
        if std::os::unix::net::UnixStream::connect(socket).is_ok() {
            return child;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let _ = child.kill();
    let _ = child.wait();
    panic!("the null {protocol} backend never listened");
}

/// Requests counted per path, after as many to warm up.
const COUNTED: u64 = 2000;

/// Allocations per request on each path; the exit code (1 above the budget).
fn alloc_report() -> i32 {
    let dir = tempfile::tempdir().unwrap();
    let fcgi_sock = dir.path().join("null-fcgi.sock");
    let lsapi_sock = dir.path().join("null-lsapi.sock");
    let mut children = [
        null_process("fastcgi", &fcgi_sock),
        null_process("lsapi", &lsapi_sock),
    ];
    let config = format!(
        r#"
[server]
runtime_dir = "{dir}/run"
log_level = "error"
threads = 1

[[listen]]
address = "unix:{dir}/fcgi.sock"
protocol = "fastcgi"

[[listen]]
address = "unix:{dir}/scgi.sock"
protocol = "scgi"

[[listen]]
address = "127.0.0.1:8080"
protocol = "http"

[pools.null]
servers = ["unix:{fcgi}"]
concurrency = 16

[pools.lsapi]
servers = ["unix:{lsapi}"]
protocol = "lsapi"
concurrency = 16

[[contexts]]
pool = "null"

[[contexts]]
prefix = "/lsapi"
pool = "lsapi"
"#,
        dir = dir.path().display(),
        fcgi = fcgi_sock.display(),
        lsapi = lsapi_sock.display(),
    );
    let (config, runtime, gateway) = gateway_for(&config, "allocs.toml");
    let timeouts = config.listeners[0].timeouts;
    let admission = Admission::new("front", 1024);
    let ticket = || {
        admission
            .admit(Client {
                listener: 0,
                addr: None,
                cap: None,
            })
            .expect("room in the table")
    };
    let mut buf = vec![0u8; 64 * 1024];
    let mut rows = Vec::new();

    // A GET with 8 request headers on one kept-alive connection, to each backend protocol.
    for (name, get) in [
        ("http -> fastcgi (8 headers, keep-alive)", HTTP_GET_FCGI),
        ("http -> lsapi (8 headers, keep-alive)", HTTP_GET_LSAPI),
    ] {
        // Registered inside the runtime: a `QuietUnix` needs its reactor.
        let (ours, theirs) = runtime.block_on(async {
            let (ours, theirs) = UnixStream::pair().unwrap();
            (QuietUnix::from_tokio(ours).unwrap(), theirs)
        });
        let info = ConnInfo {
            listener: config.listeners[2].bind.address(),
            peer: Peer::Tcp(std::net::SocketAddr::from(([127, 0, 0, 1], 40000))),
            forwarded: None,
            timeouts,
            server_vars: Arc::new(http::server_vars(Some(std::net::SocketAddr::from((
                [127, 0, 0, 1],
                8080,
            ))))),
        };
        let server = runtime.spawn(http::serve_connection(
            Stream::Unix(ours),
            info,
            ticket(),
            Arc::clone(&gateway),
            CancellationToken::new(),
        ));
        let (mut rx, mut tx) = theirs.into_split();
        let mut once = || {
            runtime.block_on(async {
                tx.write_all(get).await.unwrap();
                let mut have = 0;
                while !buf[..have].ends_with(b"Hello, world\n") {
                    let n = rx.read(&mut buf[have..]).await.unwrap();
                    assert!(n > 0, "the http front closed the connection");
                    have += n;
                }
            })
        };
        rows.push((name, per_request(&mut once)));
        server.abort();
    }

    // nginx's plain fastcgi_pass and its scgi_pass: a connection per request.
    let front = CgiFront {
        runtime: &runtime,
        gateway: &gateway,
        timeouts,
        ticket: &ticket,
        open: &|| admission.open(),
    };
    let listener = Arc::new(config.listeners[0].bind.address());
    rows.push((
        "fastcgi front -> fastcgi (nginx plain fastcgi_pass)",
        front.per_request(CrewFront::Fastcgi, &listener, &nginx_request(), &mut buf),
    ));
    let listener = Arc::new(config.listeners[1].bind.address());
    rows.push((
        "scgi front -> fastcgi (nginx scgi_pass)",
        front.per_request(CrewFront::Scgi, &listener, &scgi_request(), &mut buf),
    ));

    for c in &mut children {
        let _ = c.kill();
        let _ = c.wait();
    }
    println!("| path | heap allocations per request | bytes allocated per request |");
    println!("| --- | ---: | ---: |");
    for (name, (allocs, bytes)) in &rows {
        println!("| {name} | {allocs:.1} | {bytes:.0} |");
    }
    let http = rows[0].1 .0;
    if http > ALLOC_BUDGET {
        eprintln!(
            "FAIL: {http:.1} allocations per request on http -> fastcgi, over the budget of {ALLOC_BUDGET}"
        );
        return 1;
    }
    println!("ok: {http:.1} allocations per request on http -> fastcgi, within the budget of {ALLOC_BUDGET}");
    0
}

/// What a CGI front's connection needs, for [`CgiFront::per_request`].
struct CgiFront<'a> {
    runtime: &'a tokio::runtime::Runtime,
    gateway: &'a Arc<Gateway>,
    timeouts: FrontTimeouts,
    ticket: &'a dyn Fn() -> corral::front::limits::Ticket,
    /// Connections counted open in the tickets' table.
    open: &'a dyn Fn() -> usize,
}

impl CgiFront<'_> {
    /// Allocations per request of a CGI front's connections as the accept loop serves them
    /// (`corral::app::Crew`: a task that served a connection serves the next), one request
    /// per connection: the request written, the answer read to the close.
    fn per_request(
        &self,
        front: CrewFront,
        listener: &Arc<ListenAddress>,
        request: &[u8],
        buf: &mut [u8],
    ) -> (f64, f64) {
        let tracker = TaskTracker::new();
        let crew = {
            let _entered = self.runtime.enter();
            Crew::new(
                front,
                Arc::clone(listener),
                self.timeouts,
                Arc::clone(self.gateway),
                CancellationToken::new(),
                tracker.clone(),
            )
        };
        let mut once = || {
            self.runtime.block_on(async {
                let (ours, theirs) = front_pair();
                crew.serve(Stream::Unix(ours), (self.ticket)());
                let (mut rx, mut tx) = theirs.into_split();
                tx.write_all(request).await.unwrap();
                read_to_close(&mut rx, buf).await;
                drop(tx);
                // The crew's task ends its connection after the close the client saw.
                while (self.open)() != 0 {
                    tokio::task::yield_now().await;
                }
            })
        };
        let counted = per_request(&mut once);
        drop(crew);
        tracker.close();
        self.runtime.block_on(tracker.wait());
        counted
    }
}

/// Allocations and bytes per call of `once`, over [`COUNTED`] calls after as many to warm up.
fn per_request(once: &mut dyn FnMut()) -> (f64, f64) {
    for _ in 0..COUNTED {
        once();
    }
    let (a0, b0) = counted();
    for _ in 0..COUNTED {
        once();
    }
    let (a1, b1) = counted();
    (
        (a1 - a0) as f64 / COUNTED as f64,
        (b1 - b0) as f64 / COUNTED as f64,
    )
}

async fn read_to_close(rx: &mut tokio::net::unix::OwnedReadHalf, buf: &mut [u8]) {
    loop {
        let n = rx.read(buf).await.unwrap();
        if n == 0 {
            return;
        }
    }
}

/// A browser-like GET: 8 request headers.
const HTTP_GET_FCGI: &[u8] = b"GET /bench?x=1 HTTP/1.1\r\nHost: 127.0.0.1:8080\r\nUser-Agent: Mozilla/5.0 (X11; Linux x86_64) bench\r\nAccept: text/html,application/xhtml+xml\r\nAccept-Language: en-US,en;q=0.5\r\nAccept-Encoding: gzip, deflate\r\nCookie: session=0123456789abcdef\r\nReferer: http://127.0.0.1:8080/\r\nCache-Control: no-cache\r\n\r\n";
/// The same GET to the LSAPI pool's prefix.
const HTTP_GET_LSAPI: &[u8] = b"GET /lsapi/bench?x=1 HTTP/1.1\r\nHost: 127.0.0.1:8080\r\nUser-Agent: Mozilla/5.0 (X11; Linux x86_64) bench\r\nAccept: text/html,application/xhtml+xml\r\nAccept-Language: en-US,en;q=0.5\r\nAccept-Encoding: gzip, deflate\r\nCookie: session=0123456789abcdef\r\nReferer: http://127.0.0.1:8080/\r\nCache-Control: no-cache\r\n\r\n";

/// The request nginx 1.22 sends with `scgi_pass` and Debian's `scgi_params`.
fn scgi_request() -> Vec<u8> {
    let params: &[(&str, &str)] = &[
        ("REQUEST_METHOD", "GET"),
        ("REQUEST_URI", "/bench?x=1"),
        ("QUERY_STRING", "x=1"),
        ("CONTENT_TYPE", ""),
        ("DOCUMENT_URI", "/bench"),
        ("DOCUMENT_ROOT", "/var/www/html"),
        ("SCGI", "1"),
        ("SERVER_PROTOCOL", "HTTP/1.1"),
        ("REQUEST_SCHEME", "http"),
        ("REMOTE_ADDR", "127.0.0.1"),
        ("REMOTE_PORT", "53012"),
        ("SERVER_PORT", "8080"),
        ("SERVER_NAME", "localhost"),
        ("HTTP_HOST", "127.0.0.1:8080"),
        ("HTTP_USER_AGENT", "wrk"),
        ("HTTP_ACCEPT", "*/*"),
    ];
    let mut head = Vec::new();
    for (k, v) in [("CONTENT_LENGTH", "0")].iter().chain(params) {
        head.extend_from_slice(k.as_bytes());
        head.push(0);
        head.extend_from_slice(v.as_bytes());
        head.push(0);
    }
    let mut out = format!("{}:", head.len()).into_bytes();
    out.extend_from_slice(&head);
    out.push(b',');
    out
}
