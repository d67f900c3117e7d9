//! The `fastcgi` front listener end to end: curl → nginx (`fastcgi_pass` to corral's Unix
//! socket, Debian's `fastcgi_params`) → corral → php-cgi. Everything a PHP site needs from
//! its FastCGI server: query strings, forms, large uploads and downloads streamed both ways,
//! request headers, repeated response headers, status codes, redirects, stderr, and nginx's
//! kept upstream connections (`fastcgi_keep_conn on`). What nginx never sends (multiplexing,
//! aborts, management records) is in `tests/front_fastcgi_raw.rs`.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing,
    missing_docs
)]

mod support;

use std::path::Path;
use std::time::Duration;

use support::front::{connected_unix_sockets, curl, Corral, Nginx};
use support::front_fastcgi::{site, Site};
use support::peers::{md5_hex, Peer};
use tokio::time::Instant;

/// Size of the upload and download tests.
const TEN_MIB: usize = 10 * 1024 * 1024;

/// The chain: php-cgi, corral's fastcgi listener in front of it, and nginx with two servers:
/// 0 passes straight to corral's socket (a connection per request), 1 through an upstream
/// with `keepalive` and `fastcgi_keep_conn on`.
struct Chain {
    dir: tempfile::TempDir,
    nginx: Nginx,
    corral: Corral,
    _php: Peer,
}

fn chain() -> Chain {
    let Site { dir, corral, php } = site();
    let root = dir.path().join("www");
    let socket = &corral.socket;
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
        _php: php,
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
