//! The `fastcgi` front listener end to end: curl → nginx (`fastcgi_pass` to corral's Unix
//! socket, Debian's `fastcgi_params`) → corral → php-cgi. Everything a PHP site needs from
//! its FastCGI server: query strings, forms, large uploads and downloads streamed both ways,
//! request headers, repeated response headers, status codes, redirects, stderr, and nginx's
//! kept upstream connections (`fastcgi_keep_conn on`).

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing,
    missing_docs
)]

mod support;

use std::collections::HashMap;
use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::Duration;

use bytes::BytesMut;
use corral::protocols::fastcgi::{
    encode_abort_request, encode_begin_request, encode_params, encode_stdin, encode_stdin_end,
    Record, RecordDecoder, RecordType, Role,
};
use support::front::{connected_unix_sockets, curl, php_cgi_with, Corral, Nginx};
use support::peers::{cgi_params, md5_hex, shared_dir, write_file, Peer};
use support::weak::AT_ONCE;
use tokio::time::Instant;

/// Size of the upload and download tests.
const TEN_MIB: usize = 10 * 1024 * 1024;

const SCRIPTS: &[(&str, &str)] = &[
    (
        "query.php",
        "<?php echo 'q=', $_GET['q'] ?? '', ' method=', $_SERVER['REQUEST_METHOD'];",
    ),
    (
        "form.php",
        "<?php echo 'name=', $_POST['name'] ?? '', ' age=', $_POST['age'] ?? '';",
    ),
    (
        "upload.php",
        "<?php $b = file_get_contents('php://input'); echo md5($b), ' ', strlen($b), ' ', \
         $_SERVER['CONTENT_LENGTH'];",
    ),
    (
        "download.php",
        "<?php $b = str_repeat('0123456789abcdef', 655360); header('X-Md5: ' . md5($b)); \
         header('Content-Type: application/octet-stream'); echo $b;",
    ),
    (
        "headers.php",
        "<?php echo 'custom=', $_SERVER['HTTP_X_CORRAL_TEST'] ?? 'none', \
         ' script=', $_SERVER['SCRIPT_NAME'], ' proxy=', $_SERVER['HTTP_PROXY'] ?? 'none';",
    ),
    (
        "cookies.php",
        "<?php setcookie('first', 'one'); setcookie('second', 'two'); \
         echo 'flavour=', $_COOKIE['flavour'] ?? 'none';",
    ),
    (
        "status.php",
        "<?php http_response_code((int)($_GET['code'] ?? 200)); echo 'status page';",
    ),
    (
        "redirect.php",
        "<?php header('Location: /x'); echo 'moved';",
    ),
    (
        "sleep.php",
        "<?php usleep((int)($_GET['ms'] ?? 0) * 1000); echo 'slept ', $_GET['ms'] ?? 0;",
    ),
    (
        "stderr.php",
        "<?php error_log('corral-front-stderr-marker'); echo 'logged';",
    ),
];

/// The chain: php-cgi, corral's fastcgi listener in front of it, and nginx with two servers:
/// 0 passes straight to corral's socket (a connection per request), 1 through an upstream
/// with `keepalive` and `fastcgi_keep_conn on`.
struct Chain {
    dir: tempfile::TempDir,
    nginx: Nginx,
    corral: Corral,
    php: Peer,
}

fn chain() -> Chain {
    let dir = shared_dir();
    let root = dir.path().join("www");
    std::fs::create_dir(&root).unwrap();
    for (name, text) in SCRIPTS {
        write_file(&root, name, text);
    }
    let php = php_cgi_with(
        dir.path(),
        &[
            "post_max_size=64M",
            "upload_max_filesize=64M",
            "memory_limit=256M",
        ],
    );
    let socket = dir.path().join("corral-fcgi.sock");
    let config = format!(
        r#"
[server]
# Not {dir} itself: the shared dir is world-writable, which corral refuses.
runtime_dir = "{dir}/run"

[[listen]]
address = "unix:{socket}"
protocol = "fastcgi"

[status]
address = "127.0.0.1:0"

[pools.php]
servers = ["unix:{php}"]

[[contexts]]
prefix = "/"
extension = "php"
root = "{root}"
index = ["index.php"]
pool = "php"
"#,
        dir = dir.path().display(),
        socket = socket.display(),
        php = php.socket.display(),
        root = root.display(),
    );
    let corral = Corral::start(dir.path(), &config, &socket);
    let location = |pass: &str, keep: &str| {
        format!(
            "    root {root};\n    location ~ \\.php$ {{\n      include /etc/nginx/fastcgi_params;\n      \
             fastcgi_param SCRIPT_FILENAME $document_root$fastcgi_script_name;\n      \
             fastcgi_pass {pass};\n{keep}    }}",
            root = root.display(),
        )
    };
    let upstream = format!(
        "  upstream corral_kept {{\n    server unix:{};\n    keepalive 4;\n  }}",
        socket.display()
    );
    let nginx = Nginx::start(
        dir.path(),
        &upstream,
        &[
            location(&format!("unix:{}", socket.display()), ""),
            location("corral_kept", "      fastcgi_keep_conn on;\n"),
        ],
    );
    Chain {
        dir,
        nginx,
        corral,
        php,
    }
}

impl Chain {
    fn url(&self, path: &str) -> String {
        format!("{}{path}", self.nginx.url(0))
    }

    fn path(&self) -> &Path {
        self.dir.path()
    }
}

#[test]
fn get_with_query_and_post_form() {
    let c = chain();
    let r = curl(&c.url("/query.php?q=hello%20world&x=1"), &[]);
    assert_eq!(r.status, 200, "{r:?}\n{}", c.corral.log());
    assert_eq!(r.text(), "q=hello world method=GET");

    let r = curl(
        &c.url("/form.php"),
        &["--data-urlencode", "name=Zoë & co", "-d", "age=42"],
    );
    assert_eq!(r.status, 200);
    assert_eq!(r.text(), "name=Zoë & co age=42");
}

#[test]
fn ten_mib_upload_and_download_stream_through() {
    let c = chain();
    let upload: Vec<u8> = (0..TEN_MIB).map(|i| (i * 7 % 251) as u8).collect();
    let file = c.path().join("upload.bin");
    std::fs::write(&file, &upload).unwrap();
    let expected = md5_hex(c.path(), &upload);
    let r = curl(
        &c.url("/upload.php"),
        &[
            "-H",
            "Content-Type: application/octet-stream",
            "--data-binary",
            &format!("@{}", file.display()),
        ],
    );
    assert_eq!(r.status, 200, "{r:?}\n{}", c.corral.log());
    assert_eq!(r.text(), format!("{expected} {TEN_MIB} {TEN_MIB}"));

    let r = curl(&c.url("/download.php"), &[]);
    assert_eq!(r.status, 200);
    assert_eq!(r.body.len(), TEN_MIB);
    assert_eq!(
        md5_hex(c.path(), &r.body),
        r.header("x-md5").unwrap(),
        "the body PHP wrote is the body the client got"
    );
}

#[test]
fn request_headers_and_repeated_cookies() {
    let c = chain();
    let r = curl(
        &c.url("/headers.php"),
        &[
            "-H",
            "X-Corral-Test: sesame",
            "-H",
            "Proxy: http://evil.example",
        ],
    );
    assert_eq!(r.status, 200);
    assert_eq!(
        r.text(),
        "custom=sesame script=/headers.php proxy=none",
        "custom headers pass, httpoxy's Proxy header does not"
    );

    let r = curl(&c.url("/cookies.php"), &["-b", "flavour=oatmeal"]);
    assert_eq!(r.status, 200);
    assert_eq!(r.text(), "flavour=oatmeal");
    let cookies = r.all("set-cookie");
    assert_eq!(cookies.len(), 2, "{:?}", r.headers);
    assert!(cookies[0].starts_with("first=one"), "{cookies:?}");
    assert!(cookies[1].starts_with("second=two"), "{cookies:?}");
}

#[test]
fn status_codes_and_redirects_reach_the_client() {
    let c = chain();
    let r = curl(&c.url("/status.php?code=404"), &[]);
    assert_eq!(r.status, 404);
    assert_eq!(r.text(), "status page");
    let r = curl(&c.url("/status.php?code=500"), &[]);
    assert_eq!(r.status, 500);

    let r = curl(&c.url("/redirect.php"), &[]);
    assert_eq!(r.status, 302, "{r:?}");
    assert!(r.header("location").unwrap().ends_with("/x"), "{r:?}");

    // A script that does not exist: corral answers 404 itself, nginx passes it on.
    let r = curl(&c.url("/missing.php"), &[]);
    assert_eq!(r.status, 404, "{r:?}");
}

#[test]
fn an_early_answer_to_a_large_upload_reaches_the_client() {
    let c = chain();
    let file = c.path().join("big.bin");
    std::fs::write(&file, vec![b'x'; 4 * 1024 * 1024]).unwrap();
    let upload = format!("@{}", file.display());
    // corral answers 404 before reading the body, then drains it so closing does not reset
    // the connection under the answer.
    for url in [
        c.url("/missing.php"),
        format!("{}/missing.php", c.nginx.url(1)),
    ] {
        let r = curl(&url, &["--data-binary", &upload]);
        assert_eq!(r.status, 404, "{r:?}\n{}", c.nginx.error_log());
    }
    let r = curl(&c.url("/query.php?q=still"), &[]);
    assert_eq!(r.text(), "q=still method=GET");
}

#[test]
fn php_stderr_shows_in_corrals_log() {
    let c = chain();
    let r = curl(&c.url("/stderr.php"), &[]);
    assert_eq!(r.status, 200);
    assert_eq!(r.text(), "logged");
    c.corral
        .wait_log("corral-front-stderr-marker", Duration::from_secs(10));
}

#[test]
fn kept_connections_serve_many_requests() {
    let c = chain();
    // Without fastcgi_keep_conn, corral closes each connection after its request.
    for i in 0..3 {
        assert_eq!(curl(&c.url(&format!("/query.php?q={i}")), &[]).status, 200);
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    while connected_unix_sockets(&c.corral.socket) > 0 {
        assert!(
            Instant::now() < deadline,
            "corral kept a connection without KEEP_CONN"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    let kept = |path: &str| format!("{}{path}", c.nginx.url(1));
    for i in 0..8 {
        let r = curl(&kept(&format!("/query.php?q={i}")), &[]);
        assert_eq!(r.status, 200, "{r:?}\n{}", c.corral.log());
        assert_eq!(r.text(), format!("q={i} method=GET"));
        let r = curl(&kept("/form.php"), &["-d", &format!("name=n{i}")]);
        assert_eq!(r.text(), format!("name=n{i} age="));
    }
    // A 404 from corral on a kept connection leaves it usable.
    assert_eq!(curl(&kept("/missing.php"), &[]).status, 404);
    assert_eq!(
        curl(&kept("/query.php?q=after"), &[]).text(),
        "q=after method=GET"
    );
    // nginx reused one upstream connection for all of them, and corral still holds it.
    assert_eq!(
        connected_unix_sockets(&c.corral.socket),
        1,
        "one kept connection to corral's socket"
    );
    assert!(
        !c.nginx.error_log().contains("upstream prematurely closed"),
        "{}",
        c.nginx.error_log()
    );
}

/// A FastCGI web server written out by hand, talking straight to corral's socket: for what
/// nginx never does (multiplexing, FCGI_ABORT_REQUEST, management records, broken records).
struct Raw {
    stream: UnixStream,
    buf: BytesMut,
    records: RecordDecoder,
}

impl Raw {
    fn connect(c: &Chain) -> Raw {
        let stream = UnixStream::connect(&c.corral.socket).unwrap();
        stream
            .set_read_timeout(Some(Duration::from_secs(20)))
            .unwrap();
        Raw {
            stream,
            buf: BytesMut::new(),
            records: RecordDecoder::new(),
        }
    }

    fn send(&mut self, bytes: &[u8]) {
        self.stream.write_all(bytes).unwrap();
    }

    /// BEGIN_REQUEST, PARAMS for a GET of `script?query`, and the end of STDIN.
    fn get(&mut self, c: &Chain, id: u16, keep_conn: bool, script: &str, query: &str) {
        let mut out = BytesMut::new();
        encode_begin_request(id, Role::Responder, keep_conn, &mut out);
        let params = cgi_params("GET", &c.path().join("www").join(script), query, &[]);
        encode_params(id, &params, &mut out).unwrap();
        encode_stdin_end(id, &mut out);
        self.send(&out);
    }

    /// The next record; `None` when corral closed the connection.
    fn record(&mut self) -> Option<Record> {
        loop {
            if let Some(r) = self.records.decode(&mut self.buf).unwrap() {
                return Some(r);
            }
            let mut chunk = [0u8; 65536];
            let n = self
                .stream
                .read(&mut chunk)
                .expect("corral answers in time");
            if n == 0 {
                assert!(self.buf.is_empty(), "connection closed mid-record");
                return None;
            }
            self.buf.extend_from_slice(&chunk[..n]);
        }
    }

    /// Reads until every id in `ids` has its END_REQUEST: each id's STDOUT and END_REQUEST
    /// body.
    fn answers(&mut self, ids: &[u16]) -> HashMap<u16, (String, Vec<u8>)> {
        let mut stdout: HashMap<u16, String> = HashMap::new();
        let mut done = HashMap::new();
        while done.len() < ids.len() {
            let r = self.record().expect("END_REQUEST before the close");
            match r.kind {
                RecordType::Stdout => stdout
                    .entry(r.request_id)
                    .or_default()
                    .push_str(&String::from_utf8_lossy(&r.content)),
                RecordType::EndRequest => {
                    let out = stdout.remove(&r.request_id).unwrap_or_default();
                    assert!(
                        done.insert(r.request_id, (out, r.content.to_vec()))
                            .is_none(),
                        "a second END_REQUEST for {}",
                        r.request_id
                    );
                }
                RecordType::Stderr => {}
                other => panic!("unexpected {other:?} record"),
            }
        }
        done
    }
}

/// FCGI_END_REQUEST's body: app status 0 and the given protocol status.
fn end_body(protocol_status: u8) -> Vec<u8> {
    vec![0, 0, 0, 0, protocol_status, 0, 0, 0]
}

#[test]
fn multiplexed_requests_share_one_connection() {
    let c = chain();
    let mut raw = Raw::connect(&c);
    // Three requests in flight at once: php-cgi serves one at a time, so two wait in
    // corral's queue while the first sleeps.
    raw.get(&c, 7, true, "sleep.php", "ms=300");
    raw.get(&c, 1, true, "query.php", "q=one");
    raw.get(&c, 300, true, "query.php", "q=three");
    let answers = raw.answers(&[7, 1, 300]);
    for (id, want) in [
        (7, "slept 300"),
        (1, "q=one method=GET"),
        (300, "q=three method=GET"),
    ] {
        let (out, end) = &answers[&id];
        assert!(out.ends_with(want), "request {id}: {out:?}");
        assert!(
            out.contains("Content-type: text/html"),
            "a CGI head first: {out:?}"
        );
        assert_eq!(end, &end_body(0), "REQUEST_COMPLETE");
    }
    // The ids are free again: reuse one on the same connection.
    raw.get(&c, 1, false, "query.php", "q=again");
    assert!(raw.answers(&[1])[&1].0.ends_with("q=again method=GET"));
    assert!(
        raw.record().is_none(),
        "closed after a request without KEEP_CONN"
    );
}

/// The pool's `in flight` count on corral's status page: requests holding a slot.
fn in_flight(c: &Chain) -> String {
    let log = c
        .corral
        .wait_log("status listener ready", Duration::from_secs(10));
    let addr: std::net::SocketAddr = log
        .lines()
        .find(|l| l.contains("status listener ready"))
        .and_then(|l| {
            l.split_whitespace()
                .find_map(|w| w.strip_prefix("listener="))
        })
        .and_then(|a| a.parse().ok())
        .unwrap_or_else(|| panic!("no status listener address in:\n{log}"));
    let text = support::server::http(addr, "GET", "/status", &[], b"").text();
    text.lines()
        .find_map(|l| l.strip_prefix("in flight:"))
        .map(|v| v.trim().to_owned())
        .unwrap_or_else(|| panic!("no in flight in:\n{text}"))
}

#[test]
fn an_aborted_request_ends_at_once_and_frees_its_slot() {
    // The script sleeps 8 s; the abort must be answered, and its slot freed, in under 3 s.
    const SCRIPT_MS: u64 = 8000;
    let c = chain();
    let mut raw = Raw::connect(&c);
    raw.get(&c, 1, true, "sleep.php", &format!("ms={SCRIPT_MS}"));
    // Once the request holds a slot and has reached php-cgi, abort it.
    assert!(
        support::eventually(Duration::from_secs(10), || {
            connected_unix_sockets(&c.php.socket) > 0 && in_flight(&c) == "1"
        }),
        "the request never reached php-cgi"
    );
    let started = Instant::now();
    let mut out = BytesMut::new();
    encode_abort_request(1, &mut out);
    raw.send(&out);
    let answers = raw.answers(&[1]);
    let took = started.elapsed();
    assert!(
        took < AT_ONCE,
        "the abort was answered after {took:?}, against a {SCRIPT_MS} ms script"
    );
    assert_eq!(answers[&1].1, end_body(0));
    // The slot is free while php-cgi still sleeps.
    assert!(
        support::eventually(AT_ONCE, || in_flight(&c) == "0"),
        "the aborted request still holds its slot\n{}",
        c.corral.log()
    );
    let freed = started.elapsed();
    assert!(
        freed < Duration::from_millis(SCRIPT_MS) / 2,
        "the slot came free after {freed:?}, against a {SCRIPT_MS} ms script"
    );
    // And a new request is served (once php-cgi, one request at a time, is done sleeping).
    raw.get(&c, 1, true, "query.php", "q=next");
    assert!(raw.answers(&[1])[&1].0.ends_with("q=next method=GET"));
}

#[test]
fn management_records_and_refusals() {
    let c = chain();
    let mut raw = Raw::connect(&c);
    // FCGI_GET_VALUES (type 9, id 0) asking for FCGI_MPXS_CONNS, FCGI_MAX_REQS and a name
    // FastCGI does not define: pairs of (1-byte name length, 1-byte value length, name).
    let mut query = vec![1, 9, 0, 0, 0, 0, 0, 0];
    for name in [&b"FCGI_MPXS_CONNS"[..], b"FCGI_MAX_REQS", b"X_UNKNOWN"] {
        query.extend_from_slice(&[name.len() as u8, 0]);
        query.extend_from_slice(name);
    }
    let content_len = (query.len() - 8) as u16;
    query[4..6].copy_from_slice(&content_len.to_be_bytes());
    raw.send(&query);
    let r = raw.record().unwrap();
    assert_eq!(r.kind, RecordType::GetValuesResult);
    assert_eq!(r.request_id, 0);
    let content = r.content.to_vec();
    assert!(
        content.starts_with(b"\x0f\x01FCGI_MPXS_CONNS1"),
        "{:?}",
        String::from_utf8_lossy(&content)
    );
    assert!(content.windows(13).any(|w| w == b"FCGI_MAX_REQS"));
    assert!(!content.windows(9).any(|w| w == b"X_UNKNOWN"));

    // A record of type 42 on id 0: FCGI_UNKNOWN_TYPE (11) naming it.
    raw.send(&[1, 42, 0, 0, 0, 0, 0, 0]);
    let r = raw.record().unwrap();
    assert_eq!((r.kind, r.request_id), (RecordType::UnknownType, 0));
    assert_eq!(&r.content[..], &[42, 0, 0, 0, 0, 0, 0, 0]);

    // BEGIN_REQUEST for the FILTER role (3), then for role 9: FCGI_UNKNOWN_ROLE (3) both.
    raw.send(&[1, 1, 0, 5, 0, 8, 0, 0, 0, 3, 1, 0, 0, 0, 0, 0]);
    assert_eq!(raw.answers(&[5])[&5].1, end_body(3));
    raw.send(&[1, 1, 0, 6, 0, 8, 0, 0, 0, 9, 1, 0, 0, 0, 0, 0]);
    assert_eq!(raw.answers(&[6])[&6].1, end_body(3));

    // The connection still serves requests.
    raw.get(&c, 2, true, "query.php", "q=after");
    assert!(raw.answers(&[2])[&2].0.ends_with("q=after method=GET"));

    // A record of version 2 breaks the protocol: corral says why in its log and closes.
    raw.send(&[2, 1, 0, 1, 0, 8, 0, 0, 0, 1, 1, 0, 0, 0, 0, 0]);
    assert!(raw.record().is_none());
    c.corral
        .wait_log("broke the protocol", Duration::from_secs(10));
}

#[test]
fn a_request_body_streams_in_many_stdin_records() {
    let c = chain();
    let mut raw = Raw::connect(&c);
    let body: Vec<u8> = (0..1_000_000u32).map(|i| (i % 253) as u8).collect();
    let mut out = BytesMut::new();
    encode_begin_request(4, Role::Responder, true, &mut out);
    let len = body.len().to_string();
    let params = cgi_params(
        "POST",
        &c.path().join("www").join("upload.php"),
        "",
        &[
            ("CONTENT_LENGTH", &len),
            ("CONTENT_TYPE", "application/octet-stream"),
        ],
    );
    encode_params(4, &params, &mut out).unwrap();
    raw.send(&out);
    for piece in body.chunks(10_000) {
        let mut out = BytesMut::new();
        encode_stdin(4, piece, &mut out);
        raw.send(&out);
    }
    let mut out = BytesMut::new();
    encode_stdin_end(4, &mut out);
    raw.send(&out);
    let md5 = md5_hex(c.path(), &body);
    let (text, end) = &raw.answers(&[4])[&4];
    assert!(text.ends_with(&format!("{md5} {len} {len}")), "{text:?}");
    assert_eq!(end, &end_body(0));
}

#[test]
fn a_front_server_that_goes_away_aborts_the_backend_request() {
    let c = chain();
    let mut raw = Raw::connect(&c);
    raw.get(&c, 1, true, "download.php", "");
    let first = raw.record().unwrap();
    assert_eq!(first.kind, RecordType::Stdout);
    // Gone mid-response, 10 MiB still to come: corral must drop the backend request, or
    // php-cgi (one request at a time) would block writing into a full socket and hold the
    // pool's only slot.
    drop(raw);
    let mut raw = Raw::connect(&c);
    raw.get(&c, 1, true, "query.php", "q=next");
    let (text, _) = &raw.answers(&[1])[&1];
    assert!(text.ends_with("q=next method=GET"), "{text:?}");
}

#[test]
fn a_graceful_stop_finishes_the_request_in_progress_then_closes() {
    let c = chain();
    let mut raw = Raw::connect(&c);
    raw.get(&c, 3, true, "sleep.php", "ms=500");
    let deadline = Instant::now() + Duration::from_secs(10);
    while connected_unix_sockets(&c.php.socket) == 0 {
        assert!(
            Instant::now() < deadline,
            "the request never reached php-cgi"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    let status = std::process::Command::new("kill")
        .args(["-TERM", &c.corral.pid().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    let (text, end) = &raw.answers(&[3])[&3];
    assert!(text.ends_with("slept 500"), "{text:?}");
    assert_eq!(end, &end_body(0));
    assert!(
        raw.record().is_none(),
        "the kept connection closes once it is idle"
    );
}
