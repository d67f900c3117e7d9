//! Connections through the `http` listener: pipelined requests answered in order, no
//! request header coming back on a kept-alive connection, php-cgi's connection reused when an
//! answer has a Content-Length, and an early 502 reaching a client still uploading.

mod support;

use std::thread;
use std::time::Duration;

use support::http_front::{config, php_corral, php_site};
use support::peers;
use support::server::{http, Corral};

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
