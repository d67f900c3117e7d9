//! The FastCGI backend exchange against a real php-cgi and a flup WSGI app: GET and POST,
//! 10 MiB streamed each way, status, cookies, stderr, a redirect, and several requests on
//! one kept connection. The faults real backends do not commit are injected by the fakes of
//! `tests/backend_fastcgi_faults.rs`.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing,
    missing_docs
)]

mod support;

use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use corral::backend::{
    fastcgi, BackendConnection, BackendRequest, BackendResponse, Connections, RequestBody,
    StderrSink,
};
use corral::protocols::cgi_response::ResponseKind;

use support::backend_fastcgi::{address, options, read_all};
use support::peers::{cgi_params, md5_hex, php_cgi, python, shared_dir, write_file};

const TEN_MIB: usize = 10 * 1024 * 1024;

async fn connect(socket: &Path) -> BackendConnection {
    BackendConnection::connect(&address(socket), Duration::from_secs(5))
        .await
        .unwrap()
}

fn header<'a>(response: &'a BackendResponse, name: &str) -> Vec<&'a [u8]> {
    response
        .head
        .headers()
        .iter()
        .filter(|(n, _)| n.eq_ignore_ascii_case(name.as_bytes()))
        .map(|(_, v)| v.as_ref())
        .collect()
}

#[tokio::test]
async fn php_get_hello() {
    let dir = shared_dir();
    let script = write_file(
        dir.path(),
        "hello.php",
        "<?php echo 'Hello, ', $_GET['name'] ?? 'nobody', \"\\n\";",
    );
    let php = php_cgi(dir.path());
    let request = BackendRequest {
        params: cgi_params("GET", &script, "name=corral", &[]),
        body: RequestBody::empty(),
    };
    let mut response = fastcgi::send(connect(&php.socket).await, request, &options())
        .await
        .unwrap();
    assert_eq!(response.head.status_code(), 200);
    assert_eq!(response.head.kind(), ResponseKind::Document);
    assert_eq!(
        header(&response, "content-type"),
        vec![&b"text/html; charset=UTF-8"[..]]
    );
    assert_eq!(read_all(&mut response).await, b"Hello, corral\n");
    assert!(
        response.body.take_connection().is_some(),
        "KEEP_CONN keeps it"
    );
}

#[tokio::test]
async fn php_post_form_body() {
    let dir = shared_dir();
    let script = write_file(
        dir.path(),
        "form.php",
        "<?php echo $_SERVER['REQUEST_METHOD'], ' ', $_POST['name'], ' ', $_POST['lang'];",
    );
    let php = php_cgi(dir.path());
    let body = "name=corral&lang=rust%20%26%20c";
    let length = body.len().to_string();
    let request = BackendRequest {
        params: cgi_params(
            "POST",
            &script,
            "",
            &[
                ("CONTENT_TYPE", "application/x-www-form-urlencoded"),
                ("CONTENT_LENGTH", &length),
            ],
        ),
        body: RequestBody::full(Bytes::from(body)),
    };
    let mut response = fastcgi::send(connect(&php.socket).await, request, &options())
        .await
        .unwrap();
    assert_eq!(read_all(&mut response).await, b"POST corral rust & c");
}

#[tokio::test]
async fn php_streams_a_10_mib_upload() {
    let dir = shared_dir();
    let script = write_file(
        dir.path(),
        "upload.php",
        "<?php $d = file_get_contents('php://input'); echo strlen($d), ' ', md5($d);",
    );
    let php = php_cgi(dir.path());
    let data: Vec<u8> = (0..TEN_MIB).map(|i| (i * 7 % 251) as u8).collect();
    let expected = format!("{} {}", TEN_MIB, md5_hex(dir.path(), &data));
    let length = TEN_MIB.to_string();
    let (sender, body) = RequestBody::channel(Some(TEN_MIB as u64), 2);
    let feeder = tokio::spawn(async move {
        for chunk in data.chunks(100_000) {
            sender.send(Bytes::copy_from_slice(chunk)).await.unwrap();
        }
    });
    let request = BackendRequest {
        params: cgi_params(
            "POST",
            &script,
            "",
            &[
                ("CONTENT_TYPE", "application/octet-stream"),
                ("CONTENT_LENGTH", &length),
            ],
        ),
        body,
    };
    let mut response = fastcgi::send(connect(&php.socket).await, request, &options())
        .await
        .unwrap();
    let text = read_all(&mut response).await;
    feeder.await.unwrap();
    assert_eq!(String::from_utf8(text).unwrap(), expected);
}

#[tokio::test]
async fn php_streams_a_10_mib_download() {
    let dir = shared_dir();
    let script = write_file(
        dir.path(),
        "download.php",
        "<?php $s = str_repeat('0123456789abcdef', 65536); for ($i = 0; $i < 10; $i++) { echo $s; }",
    );
    let php = php_cgi(dir.path());
    let request = BackendRequest {
        params: cgi_params("GET", &script, "", &[]),
        body: RequestBody::empty(),
    };
    let mut response = fastcgi::send(connect(&php.socket).await, request, &options())
        .await
        .unwrap();
    let mut total = 0usize;
    let mut chunks = 0usize;
    while let Some(chunk) = response.body.next_chunk().await {
        let chunk = chunk.unwrap();
        assert!(chunk.len() <= 65535);
        for (i, b) in chunk.iter().enumerate() {
            assert_eq!(*b, b"0123456789abcdef"[(total + i) % 16]);
        }
        total += chunk.len();
        chunks += 1;
    }
    assert_eq!(total, TEN_MIB);
    assert!(chunks >= 160, "streamed in {chunks} chunks");
}

#[tokio::test]
async fn php_404_with_two_cookies_and_stderr() {
    let dir = shared_dir();
    let script = write_file(
        dir.path(),
        "missing.php",
        "<?php http_response_code(404); setcookie('a', '1'); \
         setcookie('b', 'two', ['path' => '/', 'httponly' => true]); \
         error_log('corral test: something went wrong'); echo \"not found\\n\";",
    );
    let php = php_cgi(dir.path());
    let seen = Arc::new(Mutex::new(Vec::<u8>::new()));
    let sink_seen = seen.clone();
    let sink: StderrSink = Arc::new(move |text: &[u8]| {
        sink_seen.lock().unwrap().extend_from_slice(text);
    });
    let mut options = options();
    options.stderr = Some(sink);
    let request = BackendRequest {
        params: cgi_params("GET", &script, "", &[]),
        body: RequestBody::empty(),
    };
    let mut response = fastcgi::send(connect(&php.socket).await, request, &options)
        .await
        .unwrap();
    assert_eq!(response.head.status_code(), 404);
    assert_eq!(
        header(&response, "set-cookie"),
        vec![&b"a=1"[..], &b"b=two; path=/; HttpOnly"[..]]
    );
    assert_eq!(read_all(&mut response).await, b"not found\n");
    let seen = String::from_utf8(seen.lock().unwrap().clone()).unwrap();
    assert!(
        seen.contains("corral test: something went wrong"),
        "stderr seen: {seen:?}"
    );
}

#[tokio::test]
async fn php_location_is_a_client_redirect() {
    let dir = shared_dir();
    let script = write_file(
        dir.path(),
        "go.php",
        "<?php header('Location: /elsewhere');",
    );
    let php = php_cgi(dir.path());
    let request = BackendRequest {
        params: cgi_params("GET", &script, "", &[]),
        body: RequestBody::empty(),
    };
    let mut response = fastcgi::send(connect(&php.socket).await, request, &options())
        .await
        .unwrap();
    // php-cgi adds "Status: 302 Found", so this is not a local redirect.
    assert_eq!(response.head.status_code(), 302);
    assert_eq!(
        response.head.kind(),
        ResponseKind::ClientRedirect {
            location: b"/elsewhere"
        }
    );
    assert_eq!(read_all(&mut response).await, b"");
}

#[tokio::test]
async fn php_serves_several_requests_on_one_kept_connection() {
    let dir = shared_dir();
    let script = write_file(dir.path(), "pid.php", "<?php echo getmypid();");
    let php = php_cgi(dir.path());
    let conns = Connections::new(2);
    let addr = address(&php.socket);
    let mut pids = Vec::new();
    for _ in 0..4 {
        let conn = conns.get(&addr, Duration::from_secs(5)).await.unwrap();
        let request = BackendRequest {
            params: cgi_params("GET", &script, "", &[]),
            body: RequestBody::empty(),
        };
        let mut response = fastcgi::send(conn, request, &options()).await.unwrap();
        pids.push(String::from_utf8(read_all(&mut response).await).unwrap());
        assert_eq!(
            conns.idle(&addr),
            1,
            "the connection went back to the stack"
        );
    }
    assert!(pids.iter().all(|p| *p == php.pid().to_string()), "{pids:?}");
    // php-cgi (PHP_FCGI_CHILDREN=0) serves one connection at a time: a second connection
    // would hang while the first is kept, so four answers prove the reuse.
    let conn = conns.get(&addr, Duration::from_secs(5)).await.unwrap();
    assert_eq!(conn.requests_served(), 4);
}

#[tokio::test]
async fn flup_wsgi_app_answers_a_get() {
    let dir = shared_dir();
    let script = write_file(
        dir.path(),
        "app.py",
        r#"import sys
from flup.server.fcgi import WSGIServer

def app(environ, start_response):
    start_response('200 OK', [('Content-Type', 'text/plain'), ('X-App', 'flup')])
    return [b'hello from flup ', environ.get('QUERY_STRING', '').encode()]

WSGIServer(app, bindAddress=sys.argv[1]).run()
"#,
    );
    let socket = dir.path().join("flup.sock");
    let flup = python(&script, &socket, false);
    let request = BackendRequest {
        params: cgi_params("GET", &script, "x=1", &[]),
        body: RequestBody::empty(),
    };
    let mut response = fastcgi::send(connect(&flup.socket).await, request, &options())
        .await
        .unwrap();
    assert_eq!(response.head.status_code(), 200);
    assert_eq!(header(&response, "x-app"), vec![&b"flup"[..]]);
    assert_eq!(read_all(&mut response).await, b"hello from flup x=1");
}
