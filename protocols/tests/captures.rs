//! Decodes bytes that real peers put on the wire: requests from nginx's `fastcgi_pass` and
//! `scgi_pass`, and php-cgi's responses (protocols/tests/data/README.md says how each file was
//! captured). Every file is also decoded split at every chunk size from 1 to 64 bytes, since
//! real sockets deliver arbitrary pieces.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing,
    missing_docs
)]

use bytes::{Bytes, BytesMut};
use corral_protocols::cgi::{normalize_front_params, CgiContext, ScriptMode};
use corral_protocols::cgi_response::{CgiResponseDecoder, CgiResponseHead, ResponseKind};
use corral_protocols::fastcgi::{
    ProtocolStatus, RequestDecoder, RequestEvent, ResponseDecoder, ResponseEvent, Role,
};
use corral_protocols::scgi::{ScgiRequestDecoder, ScgiRequestEvent};
use corral_protocols::Limits;

fn data(name: &str) -> Vec<u8> {
    let path = format!("{}/tests/data/{name}", env!("CARGO_MANIFEST_DIR"));
    std::fs::read(&path).unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// Feeds `bytes` to `step` in pieces of `chunk` bytes, collecting every item it yields.
fn decode_chunked<T, E: std::fmt::Debug>(
    bytes: &[u8],
    chunk: usize,
    mut step: impl FnMut(&mut BytesMut) -> Result<Option<T>, E>,
) -> Vec<T> {
    let mut buf = BytesMut::new();
    let mut out = Vec::new();
    for piece in bytes.chunks(chunk) {
        buf.extend_from_slice(piece);
        while let Some(item) = step(&mut buf).unwrap() {
            out.push(item);
        }
    }
    assert!(buf.is_empty(), "{} bytes left undecoded", buf.len());
    out
}

/// Every request event nginx sent on one connection, identical for every chunking. Each
/// request is finished once its stdin ends, as the front listener would after answering.
fn nginx_fastcgi(name: &str) -> Vec<RequestEvent> {
    let bytes = data(name);
    let run = |chunk: usize| {
        let mut dec = RequestDecoder::new(&Limits::DEFAULT);
        decode_chunked(&bytes, chunk, |buf| {
            let ev = dec.decode(buf)?;
            if let Some(RequestEvent::StdinEnd { request_id }) = &ev {
                dec.finish(*request_id);
            }
            Ok::<_, corral_protocols::fastcgi::FastCgiError>(ev)
        })
    };
    let whole = run(bytes.len());
    for chunk in 1..=64 {
        assert_eq!(run(chunk), whole, "{name} split every {chunk} bytes");
    }
    whole
}

fn param<'a>(params: &'a [(Bytes, Bytes)], name: &str) -> &'a [u8] {
    params
        .iter()
        .find(|(n, _)| n == name.as_bytes())
        .map(|(_, v)| &v[..])
        .unwrap_or_else(|| panic!("no {name}"))
}

fn stdin_of(events: &[RequestEvent]) -> Vec<u8> {
    events
        .iter()
        .filter_map(|ev| match ev {
            RequestEvent::Stdin { data, .. } => Some(&data[..]),
            _ => None,
        })
        .flatten()
        .copied()
        .collect()
}

fn php_context(root: &str) -> CgiContext {
    CgiContext {
        document_root: root.as_bytes().to_vec(),
        mode: ScriptMode::Files {
            extensions: vec![b"php".to_vec()],
            index: vec![b"index.php".to_vec()],
        },
        server_software: Bytes::from_static(b"corral/test"),
        extra_env: Vec::new(),
        allow_php_ini_params: false,
    }
}

#[test]
fn nginx_fastcgi_get_with_query_and_cookies() {
    let events = nginx_fastcgi("fastcgi/nginx-get-query-cookies.bin");
    assert_eq!(
        events[0],
        RequestEvent::Begin {
            request_id: 1,
            role: Role::Responder,
            keep_conn: false
        }
    );
    let RequestEvent::Params {
        request_id: 1,
        params,
    } = &events[1]
    else {
        panic!("second event is {:?}", events[1]);
    };
    assert_eq!(param(params, "REQUEST_METHOD"), b"GET");
    assert_eq!(
        param(params, "QUERY_STRING"),
        b"id=42&name=hello%20world&tags[]=a&tags[]=b"
    );
    assert_eq!(param(params, "SCRIPT_FILENAME"), b"/var/www/html/index.php");
    assert_eq!(param(params, "HTTP_COOKIE"), b"session=abc123; theme=dark");
    assert_eq!(events[2], RequestEvent::StdinEnd { request_id: 1 });
    assert_eq!(events.len(), 3);

    // The front listener's normalisation keeps nginx's script and passes the rest through.
    let vars =
        normalize_front_params(params.iter().cloned(), &php_context("/var/www/html")).unwrap();
    assert_eq!(
        vars.get(b"SCRIPT_FILENAME").map(|v| &v[..]),
        Some(&b"/var/www/html/index.php"[..])
    );
    assert_eq!(
        vars.get(b"SCRIPT_NAME").map(|v| &v[..]),
        Some(&b"/index.php"[..])
    );
    assert!(vars.dropped.is_empty(), "{:?}", vars.dropped);
}

#[test]
fn nginx_fastcgi_post_form() {
    let events = nginx_fastcgi("fastcgi/nginx-post-urlencoded.bin");
    let RequestEvent::Params { params, .. } = &events[1] else {
        panic!("{:?}", events[1]);
    };
    assert_eq!(param(params, "REQUEST_METHOD"), b"POST");
    assert_eq!(
        param(params, "CONTENT_TYPE"),
        b"application/x-www-form-urlencoded"
    );
    assert_eq!(param(params, "CONTENT_LENGTH"), b"38");
    assert_eq!(stdin_of(&events), b"name=corral&lang=rust%20%26%20c&empty=");
    assert_eq!(
        events.last(),
        Some(&RequestEvent::StdinEnd { request_id: 1 })
    );
}

#[test]
fn nginx_fastcgi_100k_body_over_several_records() {
    let events = nginx_fastcgi("fastcgi/nginx-post-100k.bin");
    let body = stdin_of(&events);
    assert_eq!(body.len(), 102_400);
    assert!(body.iter().enumerate().all(|(i, &b)| b == (i % 251) as u8));
    let records = events
        .iter()
        .filter(|ev| matches!(ev, RequestEvent::Stdin { .. }))
        .count();
    assert!(records >= 4, "{records} stdin events");
}

#[test]
fn nginx_fastcgi_keep_conn_carries_two_requests() {
    let events = nginx_fastcgi("fastcgi/nginx-keepconn-two-requests.bin");
    let begins: Vec<_> = events
        .iter()
        .filter(|ev| matches!(ev, RequestEvent::Begin { .. }))
        .collect();
    assert_eq!(begins.len(), 2);
    for ev in begins {
        assert_eq!(
            ev,
            &RequestEvent::Begin {
                request_id: 1,
                role: Role::Responder,
                keep_conn: true
            }
        );
    }
    let uris: Vec<&[u8]> = events
        .iter()
        .filter_map(|ev| match ev {
            RequestEvent::Params { params, .. } => Some(param(params, "DOCUMENT_URI")),
            _ => None,
        })
        .collect();
    assert_eq!(uris, [&b"/keep/first.php"[..], b"/keep/second.php"]);
}

/// php-cgi's whole response: stderr text, stdout bytes and the end record.
struct PhpResponse {
    stdout: Vec<u8>,
    stderr: Vec<u8>,
    app_status: u32,
}

fn php_cgi(name: &str) -> PhpResponse {
    let bytes = data(name);
    let run = |chunk: usize| {
        let mut dec = ResponseDecoder::new(1, false, &Limits::DEFAULT);
        decode_chunked(&bytes, chunk, |buf| dec.decode(buf))
    };
    let whole = run(bytes.len());
    for chunk in 1..=64 {
        assert_eq!(run(chunk), whole, "{name} split every {chunk} bytes");
    }
    let mut out = PhpResponse {
        stdout: Vec::new(),
        stderr: Vec::new(),
        app_status: u32::MAX,
    };
    for ev in whole {
        match ev {
            ResponseEvent::Stdout(d) => out.stdout.extend_from_slice(&d),
            ResponseEvent::Stderr(d) => out.stderr.extend_from_slice(&d),
            ResponseEvent::End {
                app_status,
                protocol_status,
            } => {
                assert_eq!(protocol_status, ProtocolStatus::RequestComplete);
                out.app_status = app_status;
            }
            other => panic!("unexpected {other:?}"),
        }
    }
    out
}

/// Parses the CGI head at the start of `stdout` and returns it with the body after it.
fn cgi_head(stdout: &[u8]) -> (CgiResponseHead, Vec<u8>) {
    let mut buf = BytesMut::from(stdout);
    let head = CgiResponseDecoder::new(&Limits::DEFAULT)
        .decode(&mut buf)
        .unwrap()
        .expect("a complete head");
    (head, buf.to_vec())
}

#[test]
fn php_cgi_hello() {
    let r = php_cgi("fastcgi/php-cgi-hello.response.bin");
    assert_eq!(r.app_status, 0);
    assert!(r.stderr.is_empty());
    let (head, body) = cgi_head(&r.stdout);
    assert_eq!(head.status_code(), 200);
    assert_eq!(head.kind(), ResponseKind::Document);
    assert_eq!(
        head.header(b"content-type").map(|v| &v[..]),
        Some(&b"text/html; charset=UTF-8"[..])
    );
    assert_eq!(body, b"Hello, world\n");
}

#[test]
fn php_cgi_404_with_cookies_and_stderr() {
    let r = php_cgi("fastcgi/php-cgi-status-cookies-stderr.response.bin");
    assert_eq!(r.stderr, b"corral capture: something went wrong\n");
    let (head, body) = cgi_head(&r.stdout);
    assert_eq!(head.status_code(), 404);
    let cookies: Vec<&[u8]> = head
        .headers()
        .iter()
        .filter(|(n, _)| n.eq_ignore_ascii_case(b"set-cookie"))
        .map(|(_, v)| &v[..])
        .collect();
    assert_eq!(cookies, [&b"a=1"[..], b"b=two; path=/; HttpOnly"]);
    assert_eq!(body, b"not found\n");
}

#[test]
fn php_cgi_200k_output_with_junk_in_end_request_reserved_bytes() {
    let r = php_cgi("fastcgi/php-cgi-output-200k.response.bin");
    let (head, body) = cgi_head(&r.stdout);
    assert_eq!(head.status_code(), 200);
    assert_eq!(body.len(), 204_800);
    assert!(body.chunks(16).all(|c| c == b"0123456789abcdef"));
}

#[test]
fn php_cgi_redirect() {
    let r = php_cgi("fastcgi/php-cgi-redirect.response.bin");
    let (head, body) = cgi_head(&r.stdout);
    assert_eq!(head.status_code(), 302);
    assert_eq!(
        head.kind(),
        ResponseKind::ClientRedirect { location: b"/x" }
    );
    assert!(body.is_empty());
}

fn nginx_scgi(name: &str) -> Vec<ScgiRequestEvent> {
    let bytes = data(name);
    let run = |chunk: usize| {
        let mut dec = ScgiRequestDecoder::new(&Limits::DEFAULT);
        decode_chunked(&bytes, chunk, |buf| dec.decode(buf))
    };
    let whole = run(bytes.len());
    for chunk in 1..=64 {
        // Body pieces follow the chunking; compare the head and the joined body.
        let split = run(chunk);
        assert_eq!(split.first(), whole.first(), "{name} every {chunk} bytes");
        assert_eq!(scgi_body(&split), scgi_body(&whole));
        assert_eq!(split.last(), Some(&ScgiRequestEvent::End));
    }
    whole
}

fn scgi_body(events: &[ScgiRequestEvent]) -> Vec<u8> {
    events
        .iter()
        .filter_map(|ev| match ev {
            ScgiRequestEvent::Body(b) => Some(&b[..]),
            _ => None,
        })
        .flatten()
        .copied()
        .collect()
}

#[test]
fn nginx_scgi_get_and_post() {
    let get = nginx_scgi("scgi/nginx-get.bin");
    let ScgiRequestEvent::Head(head) = &get[0] else {
        panic!("{:?}", get[0]);
    };
    assert_eq!(head.content_length, 0);
    assert_eq!(
        param(&head.params, "REQUEST_URI"),
        b"/app/items?page=2&sort=name"
    );
    assert_eq!(param(&head.params, "HTTP_ACCEPT"), b"text/html");
    assert!(scgi_body(&get).is_empty());

    // nginx's scgi_pass sends no SCRIPT_NAME: the front listener derives it for an app
    // mounted at /app.
    let ctx = CgiContext {
        mode: ScriptMode::App {
            mount: b"/app".to_vec(),
        },
        ..php_context("/srv/app")
    };
    let vars = normalize_front_params(head.params.iter().cloned(), &ctx).unwrap();
    assert_eq!(vars.get(b"SCRIPT_NAME").map(|v| &v[..]), Some(&b"/app"[..]));
    assert_eq!(vars.get(b"PATH_INFO").map(|v| &v[..]), Some(&b"/items"[..]));

    let post = nginx_scgi("scgi/nginx-post.bin");
    let ScgiRequestEvent::Head(head) = &post[0] else {
        panic!("{:?}", post[0]);
    };
    assert_eq!(head.content_length, 34);
    assert_eq!(param(&head.params, "CONTENT_TYPE"), b"application/json");
    assert_eq!(scgi_body(&post), br#"{"name":"corral","tags":["a","b"]}"#);
}
