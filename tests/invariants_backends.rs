//! ARCHITECTURE.md invariants 5, 6 and 13 end to end, through corral's HTTP front.
//!
//! - 5: an LSAPI CONN_CLOSE makes a kept connection unusable: a scripted LSAPI backend (fault
//!   injection: lsphp sends CONN_CLOSE only from `litespeed_finish_request()`) that sends
//!   RESP_END and CONN_CLOSE and then keeps the connection open, ready for more, sees the
//!   next request on a new connection.
//! - 6: a request whose server refuses the connection, or lets it time out, is tried on
//!   other servers a bounded number of times (one per other server, at least 3, at most 16:
//!   `retries` in `src/gateway/registry.rs`), counted by the servers' `requests` on the
//!   status page and by the retry log lines; the client has its 502 at once after refusals,
//!   and after exactly four `connect_timeout`s on a pool of one server that never accepts.
//! - 13: `Status:` and every hop-by-hop header a backend writes stay on corral's side:
//!   a Python SCGI app (the `scgi` package), lsphp over LSAPI, and the WSGI launcher over
//!   LSAPI (a reason phrase of its own goes as a `Status:` line).

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing,
    missing_docs
)]

mod support;

use std::io::{Read, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::Duration;

use bytes::BytesMut;
use corral::protocols::lsapi::{
    FlagRule, RequestDecoder as LsapiDecoder, RequestEvent as LsapiEvent, ResponseEncoder,
};
use corral::protocols::Limits;
use support::invariants::{counter, row_counters, timed_http};
use support::peers::{self, shared_dir, write_file};
use support::server::{http, Corral, HttpResponse};

fn header_config(dir: &Path) -> String {
    format!(
        "[server]\nruntime_dir = \"{}\"\ngrace = \"1s\"\nkill_timeout = \"1s\"\n\
         log_level = \"debug\"\n\n[[listen]]\naddress = \"127.0.0.1:0\"\nprotocol = \"http\"\n\n\
         [status]\naddress = \"127.0.0.1:0\"\n",
        dir.join("run").display()
    )
}

// ---------------------------------------------------------------------------------------
// Invariant 5
// ---------------------------------------------------------------------------------------

/// Requests each connection carried, in the order the connections were accepted.
type Served = Arc<Mutex<Vec<usize>>>;

/// One connection of the scripted LSAPI backend: answers every request; after one for a path
/// ending in `/close` it sends CONN_CLOSE right behind RESP_END (as lsphp does), and after
/// one ending in `/late` it sends CONN_CLOSE on its own once the test creates `dir/send-close`
/// (then creates `dir/close-sent`), when corral has put the connection back on its idle
/// stack. Either way it keeps the connection open, so a corral that reused it would be
/// served.
fn lsapi_conn(mut s: UnixStream, index: usize, served: &Served, dir: &Path) {
    let mut dec = LsapiDecoder::new(&Limits::DEFAULT);
    let mut buf = BytesMut::new();
    let mut chunk = [0u8; 65536];
    loop {
        let begin = match dec.decode(&mut buf) {
            Ok(Some(LsapiEvent::Begin(b))) => b,
            Ok(Some(_)) => continue,
            Ok(None) => match s.read(&mut chunk) {
                Ok(n) if n > 0 => {
                    buf.extend_from_slice(&chunk[..n]);
                    continue;
                }
                _ => return,
            },
            Err(_) => return,
        };
        served.lock().unwrap()[index] += 1;
        let uri = begin
            .env
            .iter()
            .find(|(n, _)| n.as_ref() == b"REQUEST_URI")
            .map(|(_, v)| v.clone())
            .unwrap_or_default();
        let close = uri.ends_with(b"/close");
        let late = uri.ends_with(b"/late");
        let enc = ResponseEncoder::new(begin.order, FlagRule::HOST);
        let mut out = BytesMut::new();
        enc.header(200, &[("Content-Type", "text/plain")], &mut out)
            .unwrap();
        enc.stream(format!("connection {index}").as_bytes(), &mut out);
        enc.end(&mut out);
        if close {
            enc.conn_close(&mut out);
        }
        if s.write_all(&out).is_err() {
            return;
        }
        if late {
            if !support::invariants::wait_file(&dir.join("send-close"), Duration::from_secs(30)) {
                return;
            }
            let mut close = BytesMut::new();
            enc.conn_close(&mut close);
            if s.write_all(&close).is_err() {
                return;
            }
            std::fs::write(dir.join("close-sent"), "").unwrap();
        }
    }
}

fn lsapi_fake(path: &Path) -> Served {
    let listener = UnixListener::bind(path).unwrap();
    let dir = path.parent().unwrap().to_path_buf();
    let served: Served = Arc::default();
    let record = Arc::clone(&served);
    thread::spawn(move || {
        for stream in listener.incoming().map_while(Result::ok) {
            let index = {
                let mut s = record.lock().unwrap();
                s.push(0);
                s.len() - 1
            };
            let (record, dir) = (Arc::clone(&record), dir.clone());
            thread::spawn(move || lsapi_conn(stream, index, &record, &dir));
        }
    });
    served
}

#[test]
fn an_lsapi_conn_close_is_the_kept_connections_last_request() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("fake.sock");
    let served = lsapi_fake(&socket);
    let config = format!(
        "{}\n[pools.l]\nprotocol = \"lsapi\"\nservers = [\"unix:{}\"]\nconcurrency = 1\n\
         \n[[contexts]]\npool = \"l\"\n",
        header_config(dir.path()),
        socket.display()
    );
    let corral = Corral::start(&config, 1);
    let addr = corral.http_addr();
    let get = |path: &str| {
        let r = http(addr, "GET", path, &[], b"");
        assert_eq!(r.status, 200, "{path}: {}\n{}", r.text(), corral.log());
        r.text()
    };
    // Without CONN_CLOSE the connection is kept: the control.
    assert_eq!(get("/a"), "connection 0");
    assert_eq!(get("/b"), "connection 0");
    // CONN_CLOSE comes on the kept connection; its response is whole.
    assert_eq!(get("/x/close"), "connection 0");
    // The next request goes out on a new connection, though the old one is still open.
    assert_eq!(get("/c"), "connection 1", "{:?}", served.lock().unwrap());
    assert_eq!(get("/d"), "connection 1");
    assert_eq!(*served.lock().unwrap(), vec![3, 2]);
    // Twice more, so a close after a request that came on a fresh connection counts too.
    assert_eq!(get("/y/close"), "connection 1");
    assert_eq!(get("/e"), "connection 2");
    assert_eq!(*served.lock().unwrap(), vec![3, 3, 1]);
    // A CONN_CLOSE that comes while the connection is idle on corral's stack: checkout finds
    // it, and the request goes out on a new connection.
    assert_eq!(get("/z/late"), "connection 2");
    std::fs::write(dir.path().join("send-close"), "").unwrap();
    assert!(support::invariants::wait_file(
        &dir.path().join("close-sent"),
        Duration::from_secs(30)
    ));
    assert_eq!(get("/f"), "connection 3", "{:?}", served.lock().unwrap());
    assert_eq!(*served.lock().unwrap(), vec![3, 3, 2, 1]);
}

// ---------------------------------------------------------------------------------------
// Invariant 6
// ---------------------------------------------------------------------------------------

/// `n` Unix socket paths that refuse connections (a killed server's files).
fn refusing(dir: &Path, n: usize) -> Vec<String> {
    (0..n)
        .map(|i| {
            let path = dir.join(format!("gone{i}.sock"));
            support::invariants::refusing_socket(&path);
            format!("\"unix:{}\"", path.display())
        })
        .collect()
}

#[test]
fn connect_retries_are_bounded_and_answered_within_their_timeouts() {
    let dir = tempfile::tempdir().unwrap();
    let refusing_in = |name: &str, n: usize| {
        let sub = dir.path().join(name);
        std::fs::create_dir_all(&sub).unwrap();
        refusing(&sub, n)
    };
    let (one, few, many) = (
        refusing_in("one", 1),
        refusing_in("few", 5),
        refusing_in("many", 20),
    );
    // A TCP server whose accept queue is full: its SYNs are dropped, so every connect
    // waits for `connect_timeout`.
    let (full, _filler) = full_listener();
    let config = format!(
        "{}\n[pools.slow]\nservers = [\"{full}\"]\nconnect_timeout = \"{}ms\"\n\n\
         [[contexts]]\nprefix = \"/slow\"\npool = \"slow\"\n\n\
         [pools.one]\nservers = [{}]\n\n[pools.few]\nservers = [{}]\n\n\
         [pools.many]\nservers = [{}]\n\n\
         [[contexts]]\nprefix = \"/one\"\npool = \"one\"\n\n\
         [[contexts]]\nprefix = \"/few\"\npool = \"few\"\n\n\
         [[contexts]]\nprefix = \"/many\"\npool = \"many\"\n",
        header_config(dir.path()),
        CONNECT_TIMEOUT.as_millis(),
        one.join(", "),
        few.join(", "),
        many.join(", "),
    );
    let corral = Corral::start(&config, 1);
    let status = corral.status_ready_addr();
    let addr = corral.http_addr();
    // One try, then one retry per other server: at least 3 retries, at most 16.
    for (pool, attempts) in [("one", 4), ("few", 5), ("many", 17)] {
        let retries_logged = corral.count_log("request not sent; trying another worker");
        let (r, took) = timed_http(addr, "GET", &format!("/{pool}/x"), &[], b"");
        assert_eq!(r.status, 502, "{pool}: {}\n{}", r.text(), corral.log());
        assert!(
            took < Duration::from_secs(3),
            "{pool}: refused connects answered after {took:?}"
        );
        let tried: u64 = row_counters(status, pool, "requests").iter().sum();
        assert_eq!(
            tried,
            attempts,
            "{pool}: connect attempts for one request\n{}",
            support::invariants::status_text(status, pool, true)
        );
        assert!(
            corral.wait_count(
                "request not sent; trying another worker",
                retries_logged + attempts as usize - 1,
                Duration::from_secs(5)
            ),
            "{pool}: retries logged:\n{}",
            corral.log()
        );
        assert_eq!(
            corral.count_log("request not sent; trying another worker"),
            retries_logged + attempts as usize - 1,
            "{pool}: retries logged"
        );
        assert_eq!(counter(status, pool, "backend errors"), 1, "{pool}");
    }
    // Connects that time out: the same bound, so the answer comes after 4 timeouts, not
    // more (one try and at least 3 retries on a pool of one server).
    let (r, took) = timed_http(addr, "GET", "/slow/x", &[], b"");
    assert_eq!(r.status, 502, "slow: {}\n{}", r.text(), corral.log());
    let tried: u64 = row_counters(status, "slow", "requests").iter().sum();
    assert_eq!(tried, 4, "slow: connect attempts for one request");
    assert!(
        took >= CONNECT_TIMEOUT * 4 && took < CONNECT_TIMEOUT * 4 + Duration::from_secs(2),
        "slow: four connect timeouts of {CONNECT_TIMEOUT:?} answered after {took:?}"
    );
}

/// The `connect_timeout` of the pool whose server never accepts.
const CONNECT_TIMEOUT: Duration = Duration::from_millis(300);

/// A TCP listener with a backlog of 0 and one connection waiting in it, so the kernel drops
/// the SYN of every further connect; its address, and what keeps it so.
fn full_listener() -> (
    std::net::SocketAddr,
    (std::net::TcpListener, std::net::TcpStream),
) {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    nix::sys::socket::listen(&listener, nix::sys::socket::Backlog::new(0).unwrap()).unwrap();
    let addr = listener.local_addr().unwrap();
    let filler = std::net::TcpStream::connect(addr).unwrap();
    let probe = std::net::TcpStream::connect_timeout(&addr, Duration::from_millis(200));
    assert!(probe.is_err(), "the listener's queue is not full");
    (addr, (listener, filler))
}

// ---------------------------------------------------------------------------------------
// Invariant 13
// ---------------------------------------------------------------------------------------

/// The hop-by-hop headers every backend below writes, and the header its `Connection` names.
const HOP: &[(&str, &str)] = &[
    ("Connection", "close, X-Hop"),
    ("X-Hop", "secret-hop"),
    ("Keep-Alive", "timeout=77"),
    ("Proxy-Connection", "keep-alive"),
    ("TE", "trailers"),
    ("Trailer", "X-Trailer"),
    ("Upgrade", "h2c"),
    ("Transfer-Encoding", "gzip"),
];

/// The client saw the backend's status and its end-to-end headers, and nothing of its hop.
fn assert_clean(what: &str, r: &HttpResponse, status: u16, body: &str) {
    assert_eq!(r.status, status, "{what}: {:?} {}", r.headers, r.text());
    assert_eq!(r.text(), body, "{what}");
    assert_eq!(r.header("x-kept"), Some("yes"), "{what}: {:?}", r.headers);
    for name in [
        "status",
        "x-hop",
        "keep-alive",
        "proxy-connection",
        "te",
        "trailer",
        "upgrade",
    ] {
        assert!(
            r.header(name).is_none(),
            "{what}: the backend's {name} reached the client: {:?}",
            r.headers
        );
    }
    // corral's own framing and connection handling may add these; never the backend's.
    for v in r.all("connection") {
        assert!(!v.to_ascii_lowercase().contains("x-hop"), "{what}: {v}");
    }
    let codings = r.all("transfer-encoding");
    assert!(
        codings.iter().all(|v| *v == "chunked") && codings.len() <= 1,
        "{what}: the backend's Transfer-Encoding reached the client: {codings:?}"
    );
}

trait All {
    fn all(&self, name: &str) -> Vec<&str>;
}

impl All for HttpResponse {
    fn all(&self, name: &str) -> Vec<&str> {
        self.headers
            .iter()
            .filter(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
            .collect()
    }
}

/// An SCGI app (the `scgi` package) on the Unix socket argv[1] writing `Status:` and the
/// hop-by-hop headers; says "ready" once it listens.
fn scgi_app(hop: &str) -> String {
    format!(
        r#"import socket, sys
from scgi.scgi_server import SCGIServer
from scgi.util import SCGIHandler

class Handler(SCGIHandler):
    def produce(self, env, bodysize, input, output):
        output.write(b'Status: 203 Non-Authoritative Information\r\n'
                     b'Content-Type: text/plain\r\n'
                     {hop}
                     b'X-Kept: yes\r\n\r\nscgi body')

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
"#
    )
}

/// A WSGI app whose status has a reason phrase of its own, which the launcher sends as a
/// `Status:` line.
const WSGI_APP: &str = r#"
def application(environ, start_response):
    start_response("299 Entirely Custom", [("Content-Type", "text/plain"), ("X-Kept", "yes")])
    return [b"wsgi body"]
"#;

#[test]
fn status_and_hop_by_hop_headers_of_scgi_and_lsapi_backends_stay_behind() {
    let dir = shared_dir();
    let hop_py: String = HOP
        .iter()
        .map(|(n, v)| format!("b'{n}: {v}\\r\\n'\n                     "))
        .collect();
    let app = write_file(dir.path(), "scgi_app.py", &scgi_app(&hop_py));
    let scgi = peers::python(&app, &dir.path().join("scgi.sock"), true);
    let root = dir.path().join("www");
    std::fs::create_dir_all(&root).unwrap();
    let hop_php: String = HOP
        .iter()
        .map(|(n, v)| format!("header('{n}: {v}'); "))
        .collect();
    write_file(
        &root,
        "hop.php",
        &format!(
            "<?php header('Status: 203 Non-Authoritative Information'); {hop_php} \
             header('X-Kept: yes'); http_response_code(203); echo 'lsphp body';"
        ),
    );
    write_file(dir.path(), "app.py", WSGI_APP);
    let config = format!(
        r#"{head}
[pools.scgi]
protocol = "scgi"
servers = ["unix:{scgi}"]

[pools.lsphp]
protocol = "lsapi"
command = ["{lsphp}", "-n"]
mode = "static"
max = 1

[pools.wsgi]
app = "wsgi:app:application"
cwd = "{dir}"
mode = "static"
max = 1

[[contexts]]
prefix = "/scgi"
pool = "scgi"

[[contexts]]
prefix = "/wsgi"
pool = "wsgi"

[[contexts]]
root = "{root}"
pool = "lsphp"
"#,
        head = header_config(dir.path()),
        scgi = scgi.socket.display(),
        lsphp = peers::LSPHP,
        dir = dir.path().display(),
        root = root.display(),
    );
    let corral = Corral::start(&config, 1);
    let addr = corral.http_addr();
    let r = http(addr, "GET", "/scgi/page", &[], b"");
    assert_clean("scgi", &r, 203, "scgi body");
    let r = http(addr, "GET", "/hop.php", &[], b"");
    assert_clean("lsphp", &r, 203, "lsphp body");
    let r = http(addr, "GET", "/wsgi/page", &[], b"");
    assert_eq!(r.status, 299, "wsgi: {}\n{}", r.text(), corral.log());
    assert_eq!(r.text(), "wsgi body");
    assert_eq!(r.header("x-kept"), Some("yes"));
    assert!(r.header("status").is_none(), "wsgi: {:?}", r.headers);
    // Kept alive on the client's side regardless of the backend's `Connection: close`.
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    for round in 0..2 {
        s.write_all(b"GET /scgi/page HTTP/1.1\r\nHost: localhost\r\n\r\n")
            .unwrap();
        let head = read_head(&mut s);
        assert!(head.starts_with("HTTP/1.1 203"), "round {round}: {head}");
        assert!(!head.to_ascii_lowercase().contains("x-hop"), "{head}");
    }
}

/// Reads one response on a kept connection: its head as text, and its chunked body.
fn read_head(s: &mut std::net::TcpStream) -> String {
    let mut raw = Vec::new();
    let mut byte = [0u8; 1];
    while !raw.ends_with(b"\r\n\r\n") {
        assert_eq!(s.read(&mut byte).unwrap(), 1, "closed: {raw:?}");
        raw.push(byte[0]);
    }
    let head = String::from_utf8_lossy(&raw).into_owned();
    assert!(
        head.to_ascii_lowercase()
            .contains("transfer-encoding: chunked")
            || head.to_ascii_lowercase().contains("content-length"),
        "{head}"
    );
    // Read the body to its last chunk (or its length).
    let lower = head.to_ascii_lowercase();
    if let Some(len) = lower
        .lines()
        .find_map(|l| l.strip_prefix("content-length:"))
        .and_then(|v| v.trim().parse::<usize>().ok())
    {
        let mut body = vec![0u8; len];
        s.read_exact(&mut body).unwrap();
    } else {
        let mut tail = Vec::new();
        while !tail.ends_with(b"0\r\n\r\n") {
            assert_eq!(s.read(&mut byte).unwrap(), 1, "closed mid-body");
            tail.push(byte[0]);
        }
    }
    head
}
