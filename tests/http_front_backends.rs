//! An HTTP client → corral's `http` listener → real backends: php-cgi (FastCGI), lsphp
//! (LSAPI), a flup WSGI app mounted at a prefix and an SCGI app answering a local redirect;
//! index files, `Expect: 100-continue`, and a pool whose socket nobody listens on (502).

mod support;

use std::time::Duration;

use support::http_front::{config, flup, php_corral, php_site};
use support::peers;
use support::server::{http, Corral};

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
