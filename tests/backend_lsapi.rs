//! The LSAPI backend exchange against a real lsphp (run as `nobody`, so it serves connection
//! after connection): GET, POST, a chunked body spooled to learn its length, headers rebuilt
//! from `HTTP_*` parameters, stderr, and several requests on one kept connection.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing,
    missing_docs
)]

mod support;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use corral::backend::{
    lsapi, BackendConnection, BackendRequest, BackendResponse, Connections, ExchangeOptions,
    RequestBody, SpoolConfig, StderrSink,
};
use corral::config::BackendAddress;

use support::peers::{cgi_params, lsphp, md5_hex, shared_dir, write_file, Peer};
use support::weak::{assert_spooled_in_flight, spool_files_open, until};

fn address(peer: &Peer) -> BackendAddress {
    BackendAddress::Unix(peer.socket.clone())
}

async fn connect(peer: &Peer) -> BackendConnection {
    BackendConnection::connect(&address(peer), Duration::from_secs(5))
        .await
        .unwrap()
}

async fn body_bytes(response: &mut BackendResponse) -> Vec<u8> {
    let mut all = Vec::new();
    while let Some(chunk) = response.body.next_chunk().await {
        let chunk = chunk.unwrap();
        assert!(chunk.len() <= 16384, "RESP_STREAM carries at most 16 KiB");
        all.extend_from_slice(&chunk);
    }
    assert!(response.body.is_ended());
    all
}

async fn body_text(response: &mut BackendResponse) -> String {
    String::from_utf8(body_bytes(response).await).unwrap()
}

#[tokio::test]
async fn lsphp_get_hello_with_headers_and_stderr() {
    let dir = shared_dir();
    let script = write_file(
        dir.path(),
        "hello.php",
        "<?php error_log('corral lsapi: a warning'); \
         echo 'Hello ', $_GET['who'], ' ', $_SERVER['HTTP_X_CUSTOM_THING'], ' ', \
         $_SERVER['HTTP_USER_AGENT'];",
    );
    let php = lsphp(dir.path());
    let seen = Arc::new(Mutex::new(Vec::<u8>::new()));
    let sink_seen = seen.clone();
    let sink: StderrSink = Arc::new(move |t: &[u8]| sink_seen.lock().unwrap().extend_from_slice(t));
    let mut options = ExchangeOptions::new("lsphp", 1);
    options.stderr = Some(sink);
    let request = BackendRequest {
        params: cgi_params(
            "GET",
            &script,
            "who=corral",
            &[
                ("HTTP_X_CUSTOM_THING", "custom"),
                ("HTTP_USER_AGENT", "test-agent"),
            ],
        ),
        body: RequestBody::empty(),
    };
    let mut response = lsapi::send(connect(&php).await, request, &options)
        .await
        .unwrap();
    assert_eq!(response.head.status_code(), 200);
    assert_eq!(
        response.head.header(b"content-type").unwrap().as_ref(),
        b"text/html; charset=UTF-8"
    );
    assert_eq!(
        body_text(&mut response).await,
        "Hello corral custom test-agent"
    );
    let seen = String::from_utf8(seen.lock().unwrap().clone()).unwrap();
    assert!(seen.contains("corral lsapi: a warning"), "stderr: {seen:?}");
}

#[tokio::test]
async fn lsphp_404_with_two_cookies() {
    let dir = shared_dir();
    let script = write_file(
        dir.path(),
        "missing.php",
        "<?php http_response_code(404); setcookie('a', '1'); setcookie('b', '2'); echo 'gone';",
    );
    let php = lsphp(dir.path());
    let request = BackendRequest {
        params: cgi_params("GET", &script, "", &[]),
        body: RequestBody::empty(),
    };
    let options = ExchangeOptions::new("lsphp", 2);
    let mut response = lsapi::send(connect(&php).await, request, &options)
        .await
        .unwrap();
    assert_eq!(response.head.status_code(), 404);
    let cookies: Vec<_> = response
        .head
        .headers()
        .iter()
        .filter(|(n, _)| n.eq_ignore_ascii_case(b"set-cookie"))
        .map(|(_, v)| v.clone())
        .collect();
    assert_eq!(cookies, vec![Bytes::from("a=1"), Bytes::from("b=2")]);
    assert_eq!(body_text(&mut response).await, "gone");
}

#[tokio::test]
async fn lsphp_post_with_body() {
    let dir = shared_dir();
    let script = write_file(
        dir.path(),
        "post.php",
        "<?php echo $_SERVER['REQUEST_METHOD'], ' ', $_SERVER['CONTENT_TYPE'], ' ', \
         $_SERVER['CONTENT_LENGTH'], ' ', $_POST['name'];",
    );
    let php = lsphp(dir.path());
    let body = "name=corral&x=1";
    let request = BackendRequest {
        params: cgi_params(
            "POST",
            &script,
            "",
            &[
                ("CONTENT_TYPE", "application/x-www-form-urlencoded"),
                ("CONTENT_LENGTH", "15"),
                ("HTTP_CONTENT_LENGTH", "15"),
            ],
        ),
        body: RequestBody::full(Bytes::from(body)),
    };
    let options = ExchangeOptions::new("lsphp", 3);
    let mut response = lsapi::send(connect(&php).await, request, &options)
        .await
        .unwrap();
    assert_eq!(
        body_text(&mut response).await,
        "POST application/x-www-form-urlencoded 15 corral"
    );
}

#[tokio::test]
async fn lsphp_chunked_body_is_spooled() {
    let dir = shared_dir();
    // The script reads its body only once the gate file is there: until then the body,
    // larger than the socket buffers, is in flight, and its spool file open. The method is
    // PUT because PHP reads a POST body of a type it has no parser for whole, before the
    // script starts (php_default_post_reader), which would end the flight at once.
    let gate = dir.path().join("gate");
    let script = write_file(
        dir.path(),
        "md5.php",
        &format!(
            "<?php while (!file_exists('{}')) usleep(10000); \
             $d = file_get_contents('php://input'); echo strlen($d), ' ', md5($d);",
            gate.display()
        ),
    );
    let php = lsphp(dir.path());
    let data: Vec<u8> = (0..3_000_000usize).map(|i| (i * 13 % 253) as u8).collect();
    let expected = format!("{} {}", data.len(), md5_hex(dir.path(), &data));
    let spool_dir = tempfile::tempdir().unwrap();
    let mut options = ExchangeOptions::new("lsphp", 4);
    let spool = SpoolConfig {
        dir: spool_dir.path().into(),
        max_bytes: 4 << 20,
        memory_bytes: 64 * 1024,
        ..SpoolConfig::default()
    };
    let budget = Arc::clone(&spool.budget);
    options.spool = Some(spool);
    let (sender, body) = RequestBody::channel(None, 2);
    let length = data.len() as u64;
    let feeder = tokio::spawn(async move {
        for chunk in data.chunks(33_333) {
            sender.send(Bytes::copy_from_slice(chunk)).await.unwrap();
        }
    });
    let request = BackendRequest {
        params: cgi_params(
            "PUT",
            &script,
            "",
            &[
                ("CONTENT_TYPE", "application/octet-stream"),
                ("HTTP_TRANSFER_ENCODING", "chunked"),
            ],
        ),
        body,
    };
    let conn = connect(&php).await;
    let exchange = tokio::spawn(async move {
        let mut response = lsapi::send(conn, request, &options).await.unwrap();
        body_text(&mut response).await
    });
    // In flight: the whole body sits in one unlinked spool file, counted in the budget.
    assert_spooled_in_flight(spool_dir.path(), length, || budget.used()).await;
    feeder.await.unwrap();
    std::fs::write(&gate, b"").unwrap();
    assert_eq!(exchange.await.unwrap(), expected);
    assert!(
        until(Duration::from_secs(5), || {
            spool_files_open(spool_dir.path()) == 0 && budget.used() == 0
        })
        .await,
        "the spool file outlived its request"
    );
}

#[tokio::test]
async fn lsphp_chunked_body_over_the_spool_limit_is_413() {
    let dir = shared_dir();
    let script = write_file(dir.path(), "x.php", "<?php echo 'never';");
    let php = lsphp(dir.path());
    let mut options = ExchangeOptions::new("lsphp", 5);
    options.spool = Some(SpoolConfig {
        max_bytes: 1000,
        ..SpoolConfig::default()
    });
    let (sender, body) = RequestBody::channel(None, 1);
    tokio::spawn(async move {
        for _ in 0..10 {
            if sender.send(Bytes::from(vec![b'x'; 300])).await.is_err() {
                break;
            }
        }
    });
    let request = BackendRequest {
        params: cgi_params("POST", &script, "", &[]),
        body,
    };
    let err = lsapi::send(connect(&php).await, request, &options)
        .await
        .unwrap_err();
    assert_eq!(err.status(), 413, "{err}");
}

#[tokio::test]
async fn lsphp_serves_two_requests_on_one_connection() {
    let dir = shared_dir();
    let script = write_file(
        dir.path(),
        "pid.php",
        "<?php echo getmypid(), ' ', file_get_contents('php://input');",
    );
    let php = lsphp(dir.path());
    let conns = Connections::new(1);
    let addr = address(&php);
    let mut answers = Vec::new();
    for body in ["one", "two"] {
        let conn = conns.get(&addr, Duration::from_secs(5)).await.unwrap();
        let request = BackendRequest {
            params: cgi_params("POST", &script, "", &[]),
            body: RequestBody::full(Bytes::from(body)),
        };
        let options = ExchangeOptions::new("lsphp", 6);
        let mut response = lsapi::send(conn, request, &options).await.unwrap();
        answers.push(body_text(&mut response).await);
        assert_eq!(conns.idle(&addr), 1, "RESP_END gives the connection back");
    }
    // setpriv execs lsphp, so the peer's pid is lsphp's; one lsphp process serves one
    // connection at a time, so both answers came over the kept connection.
    let pid = php.pid();
    assert_eq!(answers, vec![format!("{pid} one"), format!("{pid} two")]);
    let conn = conns.get(&addr, Duration::from_secs(5)).await.unwrap();
    assert_eq!(conn.requests_served(), 2);
}
