//! An HTTP client → corral's `http` listener → real backends (php-cgi, lsphp, a flup WSGI
//! app), and the limits: `max_conns` counted at the backend, queue overflow into 503 with
//! Retry-After, `queue_timeout`, and a hanging backend answered with 504.

mod support;

use std::path::Path;
use std::thread;
use std::time::Duration;

use support::peers::{self, Peer};
use support::server::{http, Corral};
use support::weak::{read_until_closed, AT_ONCE};
use tokio::time::Instant;

/// A config with one TCP http listener on a free port and one pool of running servers; the
/// runtime directory is `dir/run`, the test's own (not the default /run/corral).
fn config(dir: &Path, pool: &str, context: &str) -> String {
    format!(
        r#"
[server]
runtime_dir = "{run}"
grace = "2s"
log_level = "debug"

[[listen]]
address = "127.0.0.1:0"
protocol = "http"

[pools.main]
{pool}

[[contexts]]
pool = "main"
{context}
"#,
        run = dir.join("run").display(),
    )
}

/// php-cgi serving `dir` and a corral in front of it whose context's root is `dir`, with
/// `context` appended to the context (bound as `let (_php, corral)`: corral stops first).
fn php_corral(dir: &Path, context: &str) -> (Peer, Corral) {
    let php = peers::php_cgi(dir);
    let corral = Corral::start(
        &config(
            dir,
            &format!("servers = [\"unix:{}\"]", php.socket.display()),
            &format!("root = \"{}\"{context}", dir.display()),
        ),
        1,
    );
    (php, corral)
}

fn php_site(dir: &Path) {
    peers::write_file(
        dir,
        "hello.php",
        "<?php echo 'Hello ', $_GET['name'] ?? 'nobody', ' via ', $_SERVER['GATEWAY_INTERFACE'];",
    );
    peers::write_file(
        dir,
        "form.php",
        "<?php header('X-Seen-Method: ' . $_SERVER['REQUEST_METHOD']); \
         echo json_encode([$_POST, $_SERVER['CONTENT_TYPE'] ?? null, \
         $_SERVER['HTTP_X_CUSTOM'] ?? null, $_SERVER['PATH_INFO'] ?? null]);",
    );
    peers::write_file(
        dir,
        "status.php",
        "<?php http_response_code(418); setcookie('a', '1'); setcookie('b', '2'); echo 'teapot';",
    );
    peers::write_file(
        dir,
        "local.php",
        "<?php header('Location: /hello.php?name=redirected');",
    );
}

#[test]
fn php_cgi_through_the_http_listener() {
    let dir = peers::shared_dir();
    php_site(dir.path());
    let (php, corral) = php_corral(dir.path(), "\nextension = \"php\"");
    let addr = corral.http_addr();

    let r = http(addr, "GET", "/hello.php?name=corral", &[], b"");
    assert_eq!(r.status, 200, "{}", corral.log());
    assert_eq!(r.text(), "Hello corral via CGI/1.1");

    let r = http(
        addr,
        "POST",
        "/form.php/extra/info",
        &[
            ("Content-Type", "application/x-www-form-urlencoded"),
            ("X-Custom", "yes"),
        ],
        b"a=1&b=two",
    );
    assert_eq!(r.status, 200);
    assert_eq!(r.header("x-seen-method"), Some("POST"));
    assert_eq!(
        r.text(),
        r#"[{"a":"1","b":"two"},"application\/x-www-form-urlencoded","yes","\/extra\/info"]"#
    );

    let r = http(addr, "GET", "/status.php", &[], b"");
    assert_eq!(r.status, 418);
    let cookies: Vec<_> = r
        .headers
        .iter()
        .filter(|(n, _)| n == "set-cookie")
        .map(|(_, v)| v.as_str())
        .collect();
    assert_eq!(cookies, ["a=1", "b=2"]);

    // A local redirect is followed inside corral (RFC 3875 §6.2.2)... but PHP's header()
    // adds `Status: 302`, which makes it a client redirect.
    let r = http(addr, "GET", "/local.php", &[], b"");
    assert_eq!(r.status, 302);
    assert_eq!(r.header("location"), Some("/hello.php?name=redirected"));

    // HEAD gets the head and no body.
    let r = http(addr, "HEAD", "/hello.php", &[], b"");
    assert_eq!(r.status, 200);
    assert!(r.body.is_empty());

    // Paths outside the rules never reach PHP.
    assert_eq!(
        http(addr, "GET", "/../etc/passwd.php", &[], b"").status,
        403
    );
    assert_eq!(http(addr, "GET", "/hello.php/a%00b", &[], b"").status, 400);
    // A NUL anywhere in the decoded path is refused before routing.
    assert_eq!(http(addr, "GET", "/hello.php%00.txt", &[], b"").status, 400);

    // A chunked upload arrives whole.
    let r = http(
        addr,
        "POST",
        "/form.php",
        &[
            ("Content-Type", "application/x-www-form-urlencoded"),
            ("Transfer-Encoding", "chunked"),
        ],
        b"5\r\nx=abc\r\n0\r\n\r\n",
    );
    assert_eq!(r.status, 200, "{}", corral.log());
    assert!(r.text().starts_with(r#"[{"x":"abc"}"#), "{}", r.text());
    drop(php);
}

#[test]
fn lsphp_through_the_http_listener() {
    let dir = peers::shared_dir();
    php_site(dir.path());
    let lsphp = peers::lsphp(dir.path());
    let corral = Corral::start(
        &config(
            dir.path(),
            &format!(
                "protocol = \"lsapi\"\nservers = [\"unix:{}\"]",
                lsphp.socket.display()
            ),
            &format!("root = \"{}\"\nextension = \"php\"", dir.path().display()),
        ),
        1,
    );
    let addr = corral.http_addr();
    for _ in 0..3 {
        let r = http(addr, "GET", "/hello.php?name=lsphp", &[], b"");
        assert_eq!(r.status, 200, "{}", corral.log());
        assert_eq!(r.text(), "Hello lsphp via CGI/1.1");
    }
    let r = http(
        addr,
        "POST",
        "/form.php",
        &[("Content-Type", "application/x-www-form-urlencoded")],
        b"k=v",
    );
    assert_eq!(r.status, 200, "{}", corral.log());
    assert!(r.text().starts_with(r#"[{"k":"v"}"#), "{}", r.text());
    let r = http(addr, "GET", "/status.php", &[], b"");
    assert_eq!(r.status, 418);
}

/// A threaded flup WSGI app on a Unix socket: `/slow` sleeps 300 ms while counting how many
/// requests are inside at once; `/max` reports the most seen; `/hold` appends a byte to
/// `entered` beside the socket and answers once a `gate` file is there; anything else echoes
/// the path.
const FLUP_APP: &str = r#"
import os, sys, threading, time
from flup.server.fcgi import WSGIServer
here = os.path.dirname(sys.argv[1])
lock = threading.Lock()
inside = 0
most = 0
def app(environ, start_response):
    global inside, most
    path = environ.get('PATH_INFO', '')
    if path == '/slow':
        with lock:
            inside += 1
            most = max(most, inside)
        time.sleep(0.3)
        with lock:
            inside -= 1
        body = b'slow done'
    elif path == '/hold':
        with lock:
            with open(os.path.join(here, 'entered'), 'a') as f:
                f.write('x')
        while not os.path.exists(os.path.join(here, 'gate')):
            time.sleep(0.01)
        body = b'held'
    elif path == '/max':
        body = str(most).encode()
    else:
        body = ('script=%s path=%s' % (environ.get('SCRIPT_NAME'), path)).encode()
    start_response('200 OK', [('Content-Type', 'text/plain')])
    return [body]
WSGIServer(app, bindAddress=sys.argv[1], multithreaded=True, maxThreads=32).run()
"#;

fn flup(dir: &Path) -> Peer {
    let script = peers::write_file(dir, "app.py", FLUP_APP);
    peers::python(&script, &dir.join("flup.sock"), false)
}

/// Fires `n` GETs of `path` at once and returns their statuses and Retry-After values.
fn burst(addr: std::net::SocketAddr, path: &'static str, n: usize) -> Vec<(u16, Option<String>)> {
    let handles: Vec<_> = (0..n)
        .map(|_| {
            thread::spawn(move || {
                let r = http(addr, "GET", path, &[], b"");
                (r.status, r.header("retry-after").map(str::to_owned))
            })
        })
        .collect();
    handles.into_iter().map(|h| h.join().unwrap()).collect()
}

#[test]
fn flup_app_mounted_at_a_prefix() {
    let dir = peers::shared_dir();
    let app = flup(dir.path());
    let corral = Corral::start(
        &config(
            dir.path(),
            &format!("servers = [\"unix:{}\"]", app.socket.display()),
            "prefix = \"/app\"",
        ),
        1,
    );
    let r = http(corral.http_addr(), "GET", "/app/items/7", &[], b"");
    assert_eq!(r.status, 200, "{}", corral.log());
    assert_eq!(r.text(), "script=/app path=/items/7");
}

#[test]
fn max_conns_holds_exactly_at_the_backend() {
    let dir = peers::shared_dir();
    let app = flup(dir.path());
    let corral = Corral::start(
        &config(
            dir.path(),
            &format!(
                "servers = [\"unix:{}\"]\nconcurrency = 8\nmax_conns = 3\nqueue_size = 64",
                app.socket.display()
            ),
            "",
        ),
        1,
    );
    let addr = corral.http_addr();
    let statuses = burst(addr, "/slow", 12);
    assert!(statuses.iter().all(|(s, _)| *s == 200), "{statuses:?}");
    let most = http(addr, "GET", "/max", &[], b"");
    assert_eq!(
        most.text(),
        "3",
        "the backend saw more than max_conns at once"
    );
}

#[test]
fn a_full_queue_answers_503_with_retry_after_at_once() {
    let dir = peers::shared_dir();
    let app = flup(dir.path());
    let corral = Corral::start(
        &config(
 dir.path(),
            &format!(
                "servers = [\"unix:{}\"]\nconcurrency = 1\nmax_conns = 1\nqueue_size = 1\nqueue_timeout = \"10s\"",
                app.socket.display()
            ),
            "\n[status]\naddress = \"127.0.0.1:0\"",
        ),
        1,
    );
    let (addr, status) = (corral.http_addr(), corral.status_ready_addr());
    let entered = dir.path().join("entered");
    let queued = || {
        let text = http(status, "GET", "/status", &[], b"").text();
        text.lines()
            .find_map(|l| l.strip_prefix("listen queue:"))
            .map(|v| v.trim().to_owned())
            .unwrap_or_else(|| panic!("no listen queue in:\n{text}"))
    };
    let hold = move || thread::spawn(move || http(addr, "GET", "/hold", &[], b""));
    // One request holds the only slot (it is inside the app), one waits in the queue.
    let first = hold();
    assert!(
        support::eventually(Duration::from_secs(10), || entered.exists()),
        "the first request never reached the app\n{}",
        corral.log()
    );
    let second = hold();
    assert!(
        support::eventually(Duration::from_secs(10), || queued() == "1"),
        "the second request never queued\n{}",
        corral.log()
    );
    // The queue is full and stays full (the slot is held until the gate opens): the next ones
    // are refused at once, long before the 10 s queue_timeout that would refuse them anyway.
    for _ in 0..2 {
        let started = Instant::now();
        let r = http(addr, "GET", "/hold", &[], b"");
        let took = started.elapsed();
        assert_eq!(r.status, 503, "{}", corral.log());
        assert_eq!(r.header("retry-after"), Some("1"));
        assert!(took < AT_ONCE, "a 503 for a full queue took {took:?}");
    }
    assert!(corral.wait_log("the queue is full"), "{}", corral.log());
    assert_eq!(queued(), "1", "a refused request stayed in the queue");
    std::fs::write(dir.path().join("gate"), b"").unwrap();
    for held in [first, second] {
        let r = held.join().unwrap();
        assert_eq!((r.status, r.text().as_str()), (200, "held"));
    }
    assert_eq!(
        std::fs::read_to_string(&entered).unwrap(),
        "xx",
        "only the two admitted requests reached the app"
    );
}

#[test]
fn queue_timeout_answers_503() {
    let dir = peers::shared_dir();
    let app = flup(dir.path());
    let corral = Corral::start(
        &config(
 dir.path(),
            &format!(
                "servers = [\"unix:{}\"]\nconcurrency = 1\nmax_conns = 1\nqueue_size = 8\nqueue_timeout = \"100ms\"",
                app.socket.display()
            ),
            "",
        ),
        1,
    );
    let statuses = burst(corral.http_addr(), "/slow", 3);
    assert_eq!(
        statuses.iter().filter(|(s, _)| *s == 200).count(),
        1,
        "{statuses:?}"
    );
    assert_eq!(
        statuses.iter().filter(|(s, _)| *s == 503).count(),
        2,
        "{statuses:?}"
    );
    assert!(
        corral.wait_log("no slot came free within the queue timeout"),
        "{}",
        corral.log()
    );
}

#[test]
fn a_hanging_backend_is_answered_504() {
    let dir = peers::shared_dir();
    // Accepts connections and never answers.
    let socket = dir.path().join("hang.sock");
    let listener = std::os::unix::net::UnixListener::bind(&socket).unwrap();
    // Every connection is held open until the test process ends.
    thread::spawn(move || {
        let mut held = Vec::new();
        for s in listener.incoming() {
            held.push(s);
        }
    });
    let corral = Corral::start(
        &config(
            dir.path(),
            &format!(
                "servers = [\"unix:{}\"]\nfirst_byte_timeout = \"300ms\"\nrequest_timeout = \"2s\"",
                socket.display()
            ),
            "",
        ),
        1,
    );
    let r = http(corral.http_addr(), "GET", "/anything", &[], b"");
    assert_eq!(r.status, 504, "{}", corral.log());
}

#[test]
fn static_files_trusted_https_and_the_allow_list() {
    let dir = peers::shared_dir();
    peers::write_file(
        dir.path(),
        "https.php",
        "<?php echo $_SERVER['HTTPS'] ?? 'off';",
    );
    peers::write_file(dir.path(), "style.css", "body { color: red }\n");
    std::fs::create_dir(dir.path().join("sub")).unwrap();
    let php = peers::php_cgi(dir.path());
    let outside = tempfile::tempdir().unwrap();
    std::fs::write(outside.path().join("secret.txt"), "secret").unwrap();
    std::os::unix::fs::symlink(
        outside.path().join("secret.txt"),
        dir.path().join("link.txt"),
    )
    .unwrap();
    let corral = Corral::start(
        &format!(
            r#"
[server]
runtime_dir = "{}/run"

[[listen]]
address = "127.0.0.1:0"
protocol = "http"
forwarded = "x-forwarded"
trusted_proxies = ["127.0.0.1/32"]

[[listen]]
address = "127.0.0.2:0"
protocol = "http"
allow = ["10.0.0.0/8"]

[pools.main]
servers = ["unix:{}"]

[[contexts]]
pool = "main"
root = "{}"
static_files = true
"#,
            dir.path().display(),
            php.socket.display(),
            dir.path().display()
        ),
        2,
    );
    // Both listeners log as they start, in either order: take the open one by address.
    let addr: std::net::SocketAddr = corral
        .listeners
        .iter()
        .find(|a| a.starts_with("127.0.0.1:"))
        .unwrap()
        .parse()
        .unwrap();

    let r = http(addr, "GET", "/style.css", &[], b"");
    assert_eq!(r.status, 200, "{}", corral.log());
    assert_eq!(r.header("content-type"), Some("text/css; charset=utf-8"));
    assert_eq!(r.text(), "body { color: red }\n");
    assert_eq!(http(addr, "POST", "/style.css", &[], b"x").status, 405);
    // A symlink out of the root is not served, and no script by that name exists.
    assert_ne!(http(addr, "GET", "/link.txt", &[], b"").text(), "secret");
    // A directory is not a file; with no index script it is not found.
    assert_eq!(http(addr, "GET", "/sub/", &[], b"").status, 404);

    // The trusted proxy's header makes HTTPS=on; without it, off.
    let r = http(
        addr,
        "GET",
        "/https.php",
        &[("X-Forwarded-Proto", "https")],
        b"",
    );
    assert_eq!(r.text(), "on", "{}", corral.log());
    assert_eq!(http(addr, "GET", "/https.php", &[], b"").text(), "off");

    // The second listener only takes clients from 10/8: loopback is closed at once.
    let second: std::net::SocketAddr = corral
        .listeners
        .iter()
        .find(|a| a.starts_with("127.0.0.2:"))
        .unwrap()
        .parse()
        .unwrap();
    let mut s = std::net::TcpStream::connect(second).unwrap();
    use std::io::Write;
    // The write may fail: the connection may already be closed.
    let _ = s.write_all(b"GET /style.css HTTP/1.1\r\nHost: x\r\n\r\n");
    let buf = read_until_closed(&mut s, AT_ONCE);
    assert!(buf.is_empty(), "{}", String::from_utf8_lossy(&buf));
    assert!(corral.wait_log("outside the listener's allow list"));
}

#[test]
fn pipelined_requests_on_one_connection_are_answered_in_order() {
    use std::io::{Read, Write};
    let dir = peers::shared_dir();
    php_site(dir.path());
    let (_php, corral) = php_corral(dir.path(), "");
    let mut s = std::net::TcpStream::connect(corral.http_addr()).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.write_all(
        b"GET /hello.php?name=one HTTP/1.1\r\nHost: x\r\n\r\n\
          GET /hello.php?name=two HTTP/1.1\r\nHost: x\r\n\r\n\
          GET /hello.php?name=three HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
    )
    .unwrap();
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).unwrap();
    let text = String::from_utf8_lossy(&raw);
    let one = text.find("Hello one").expect("first answer");
    let two = text.find("Hello two").expect("second answer");
    let three = text.find("Hello three").expect("third answer");
    assert!(one < two && two < three, "{text}");
    assert_eq!(text.matches("HTTP/1.1 200 OK").count(), 3, "{text}");
}

/// The response's headers are written into the request's own header map, emptied first
/// (hyper then parses the connection's next request into it): no field of any request on a
/// kept-alive connection comes back in a response, on HTTP/1.1 or HTTP/1.0.
#[test]
fn no_request_header_comes_back_in_a_response() {
    use std::io::{Read, Write};
    let dir = peers::shared_dir();
    php_site(dir.path());
    let (_php, corral) = php_corral(dir.path(), "");
    let mut s = std::net::TcpStream::connect(corral.http_addr()).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.write_all(
        b"GET /hello.php?name=one HTTP/1.1\r\nHost: x\r\nX-Secret: s3cret-a\r\n\
          Cookie: c=s3cret-b\r\nAuthorization: Basic s3cret-c\r\n\r\n\
          GET /hello.php?name=two HTTP/1.0\r\nHost: x\r\nConnection: keep-alive\r\n\
          X-Secret: s3cret-d\r\n\r\n\
          GET /hello.php?name=three HTTP/1.1\r\nHost: x\r\nX-Secret: s3cret-e\r\n\
          Connection: close\r\n\r\n",
    )
    .unwrap();
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).unwrap();
    let text = String::from_utf8_lossy(&raw);
    for name in ["one", "two", "three"] {
        assert!(text.contains(&format!("Hello {name}")), "{text}");
    }
    assert!(
        !text.contains("s3cret"),
        "a request field came back: {text}"
    );
    assert!(!text.to_ascii_lowercase().contains("x-secret"), "{text}");
}

/// A raw-CGI app on the Python `scgi` package: `/go` answers a local redirect to `/app/target` (a `Location:`
/// path and no `Status:`), `/target` answers what it was asked for.
const SCGI_REDIRECT_APP: &str = r#"import socket, sys
from scgi.scgi_server import SCGIServer
from scgi.util import SCGIHandler

class Handler(SCGIHandler):
    def produce(self, env, bodysize, input, output):
        if bodysize:
            input.read(bodysize)
        if env.get('PATH_INFO') == '/go':
            output.write(b'Location: /app/target?from=go\r\n\r\n')
        else:
            text = 'target %s %s %s' % (env['REQUEST_METHOD'], env.get('PATH_INFO'), env.get('QUERY_STRING'))
            output.write(b'Content-Type: text/plain\r\n\r\n' + text.encode())

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

#[test]
fn local_redirects_index_files_expect_continue_and_a_refused_backend() {
    use std::io::{Read, Write};
    let dir = peers::shared_dir();
    php_site(dir.path());
    peers::write_file(
        dir.path(),
        "index.php",
        "<?php echo 'index of ', $_SERVER['SCRIPT_NAME'];",
    );
    let php = peers::php_cgi(dir.path());
    let script = peers::write_file(dir.path(), "redirect_app.py", SCGI_REDIRECT_APP);
    let app = peers::python(&script, &dir.path().join("scgi.sock"), true);
    let corral = Corral::start(
        &format!(
            r#"
[server]
runtime_dir = "{root}/run"

[[listen]]
address = "127.0.0.1:0"
protocol = "http"

[pools.php]
servers = ["unix:{php}"]

[pools.app]
protocol = "scgi"
servers = ["unix:{app}"]

[pools.gone]
servers = ["unix:{gone}"]

[[contexts]]
pool = "php"
root = "{root}"

[[contexts]]
prefix = "/app"
pool = "app"

[[contexts]]
prefix = "/gone"
pool = "gone"
"#,
            php = php.socket.display(),
            app = app.socket.display(),
            gone = dir.path().join("nobody-listens.sock").display(),
            root = dir.path().display()
        ),
        1,
    );
    let addr = corral.http_addr();

    // RFC 3875 §6.2.2: the gateway serves the new path itself, as a GET.
    let r = http(addr, "POST", "/app/go", &[], b"ignored body");
    assert_eq!(r.status, 200, "{}", corral.log());
    assert_eq!(r.text(), "target GET /target from=go");
    assert_eq!(r.header("location"), None);

    // A directory gets its index file.
    let r = http(addr, "GET", "/", &[], b"");
    assert_eq!(r.text(), "index of /index.php", "{}", corral.log());

    // Expect: 100-continue: the interim answer comes before the body is sent.
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.write_all(
        b"POST /form.php HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\
          Content-Type: application/x-www-form-urlencoded\r\nContent-Length: 3\r\n\
          Expect: 100-continue\r\n\r\n",
    )
    .unwrap();
    let mut interim = [0u8; 25];
    s.read_exact(&mut interim).unwrap();
    assert_eq!(&interim, b"HTTP/1.1 100 Continue\r\n\r\n");
    s.write_all(b"a=1").unwrap();
    let mut rest = Vec::new();
    s.read_to_end(&mut rest).unwrap();
    let r = support::server::parse_response(&rest);
    assert_eq!(r.status, 200);
    assert!(r.text().starts_with(r#"[{"a":"1"}"#), "{}", r.text());

    // Nobody listens on the gone pool's socket: 502, and one log line saying so.
    let r = http(addr, "GET", "/gone/x", &[], b"");
    assert_eq!(r.status, 502);
    assert!(
        corral.wait_log("cannot connect to backend"),
        "{}",
        corral.log()
    );
}

#[test]
fn backend_connections_are_reused_when_the_response_has_a_content_length() {
    let dir = peers::shared_dir();
    peers::write_file(
        dir.path(),
        "sized.php",
        "<?php $b = 'sized'; header('Content-Length: ' . strlen($b)); echo $b;",
    );
    let (php, corral) = php_corral(dir.path(), "");
    for _ in 0..20 {
        let r = http(corral.http_addr(), "GET", "/sized.php", &[], b"");
        assert_eq!(r.text(), "sized");
    }
    // hyper stops reading a body once it has Content-Length bytes; the end of the FastCGI
    // response was read with the last chunk, so the connection went back to the idle stack
    // instead of being aborted: php-cgi holds one connection, not one per request.
    assert_eq!(
        support::front::connected_unix_sockets(&php.socket),
        1,
        "{}",
        corral.log()
    );
}

#[test]
fn an_early_error_answer_reaches_a_client_still_uploading() {
    use std::io::{Read, Write};
    let dir = peers::shared_dir();
    // A backend that reads a little of each request and hangs up: corral's write of the
    // body fails half-way, and the client is still uploading when the 502 is sent.
    let socket = dir.path().join("hangs-up.sock");
    let listener = std::os::unix::net::UnixListener::bind(&socket).unwrap();
    thread::spawn(move || {
        for mut conn in listener.incoming().flatten() {
            let mut buf = [0u8; 4096];
            let _ = conn.read(&mut buf);
        }
    });
    // Unbuffered, so that the body is streamed to the backend as it arrives (a buffered
    // request would be read whole before the backend is asked).
    let corral = Corral::start(
        &config(
            dir.path(),
            &format!("servers = [\"unix:{}\"]", socket.display()),
            "request_buffering = false",
        ),
        1,
    );
    for _ in 0..5 {
        let mut s = std::net::TcpStream::connect(corral.http_addr()).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let body = vec![b'x'; 4 << 20];
        let head = format!(
            "POST /upload HTTP/1.1\r\nHost: x\r\nContent-Length: {}\r\n\r\n",
            body.len()
        );
        s.write_all(head.as_bytes()).unwrap();
        // corral answers 502 before reading the body; the client goes on sending (the write
        // may fail once corral closes), then reads the answer, which must be there.
        let mut writer = s.try_clone().unwrap();
        let upload = thread::spawn(move || {
            let _ = writer.write_all(&body);
        });
        let mut raw = Vec::new();
        let read = s.read_to_end(&mut raw);
        let _ = upload.join();
        let text = String::from_utf8_lossy(&raw);
        assert!(
            text.starts_with("HTTP/1.1 502"),
            "read {read:?}, got {text:?}\n{}",
            corral.log()
        );
    }
}

/// Threads of process `pid` whose name is `name`.
fn threads_named(pid: u32, name: &str) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/task"))
        .unwrap()
        .filter(|t| {
            let comm = t.as_ref().unwrap().path().join("comm");
            std::fs::read_to_string(comm).is_ok_and(|c| c.trim() == name)
        })
        .count()
}

/// Sockets listening on 127.0.0.1:`port`, from /proc/net/tcp (state 0A).
fn listening_sockets(port: u16) -> usize {
    let local = format!("0100007F:{port:04X}");
    std::fs::read_to_string("/proc/net/tcp")
        .unwrap()
        .lines()
        .skip(1)
        .filter(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            f.get(1) == Some(&local.as_str()) && f.get(3) == Some(&"0A")
        })
        .count()
}

/// `[server] threads` and `scheduler`: with `work-stealing` the number is the runtime's worker
/// threads; with `per-thread` it is the serving threads, each with a TCP socket of
/// its own on the port (SO_REUSEPORT), beside one runtime thread for the control plane.
/// Counted in /proc while corral serves a PHP request; the log says the number.
#[test]
fn the_threads_setting_sets_the_serving_threads() {
    let dir = peers::shared_dir();
    php_site(dir.path());
    let php = peers::php_cgi(dir.path());
    for (scheduler, threads) in [
        ("work-stealing", 1usize),
        ("work-stealing", 3),
        ("per-thread", 1),
        ("per-thread", 3),
    ] {
        let text = config(
            dir.path(),
            &format!("servers = [\"unix:{}\"]", php.socket.display()),
            &format!("root = \"{}\"\nextension = \"php\"", dir.path().display()),
        )
        .replacen(
            "[server]\n",
            &format!("[server]\nthreads = {threads}\nscheduler = \"{scheduler}\"\n"),
            1,
        );
        let corral = Corral::start(&text, 1);
        // Several connections, so that every serving thread's socket may get some.
        for _ in 0..8 {
            let r = http(corral.http_addr(), "GET", "/hello.php?name=t", &[], b"");
            assert_eq!(r.status, 200, "{}", corral.log());
            assert_eq!(r.body, b"Hello t via CGI/1.1", "{}", corral.log());
        }
        let (rt, serving, sockets) = match scheduler {
            "work-stealing" => (threads, 0, 1),
            _ => (1, threads, threads),
        };
        let what = format!("{scheduler}, threads = {threads}");
        assert_eq!(
            threads_named(corral.pid(), "tokio-rt-worker"),
            rt,
            "{what}: {}",
            corral.log()
        );
        let named = (0..threads)
            .map(|i| threads_named(corral.pid(), &format!("corral-serve-{i}")))
            .sum::<usize>();
        assert_eq!(named, serving, "{what}: {}", corral.log());
        assert_eq!(
            listening_sockets(corral.http_addr().port()),
            sockets,
            "{what}: {}",
            corral.log()
        );
        assert!(
            corral.wait_log(&format!("threads={threads} scheduler=\"{scheduler}\"")),
            "{what}: {}",
            corral.log()
        );
    }
}

/// With `per-thread` the TCP sockets share their port by SO_REUSEPORT, which would let a second
/// corral (same user) bind the same port and silently take half of its connections. It must
/// fail to start instead, as it does without SO_REUSEPORT.
#[test]
fn a_second_corral_on_a_taken_port_refuses_to_start() {
    let dir = peers::shared_dir();
    let text = |port: u16| {
        config(dir.path(), "servers = [\"127.0.0.1:9\"]", "")
            .replacen(
                "[server]\n",
                "[server]\nthreads = 2\nscheduler = \"per-thread\"\n",
                1,
            )
            .replacen("127.0.0.1:0", &format!("127.0.0.1:{port}"), 1)
    };
    let first = Corral::start(&text(0), 1);
    let port = first.http_addr().port();
    let file = support::config_file(&text(port));
    let mut second = std::process::Command::new(support::CORRAL)
        .args(["run", "-c"])
        .arg(file.path())
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let status = support::wait(&mut second, Duration::from_secs(20)).unwrap_or_else(|| {
        panic!("a second corral started on port {port}, which the first one holds")
    });
    let mut err = String::new();
    std::io::Read::read_to_string(&mut second.stderr.take().unwrap(), &mut err).unwrap();
    assert!(!status.success(), "{err}");
    assert!(
        err.contains(&format!("cannot listen on 127.0.0.1:{port}")),
        "{err}"
    );
    assert_eq!(
        listening_sockets(port),
        2,
        "the first corral's sockets are all there"
    );
}
