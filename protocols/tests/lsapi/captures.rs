//! Real bytes: the requests our builder makes for tests/data/lsapi/scripts/*.php, and what
//! lsphp 8.2.32 answered to them (captured as tests/data/lsapi/README.md describes).
//!
//! `capture_requests_are_what_the_builder_makes` checks the committed request files against
//! the builder; run it with `LSAPI_WRITE_CAPTURE_REQUESTS=1` to (re)write them before a new
//! capture.

use super::*;

/// Where capture.py's instructions put the scripts (the path is inside the requests).
const SCRIPT_DIR: &str = "/tmp/corral-lsapi-capture";

fn data_path(name: &str) -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data/lsapi")
        .join(name)
}

struct Capture {
    name: &'static str,
    method: &'static str,
    script: &'static str,
    query: &'static str,
    headers: &'static [(&'static str, &'static str)],
    special: &'static [(&'static [u8], &'static [u8])],
    body: &'static [u8],
    order: ByteOrder,
}

const CAPTURES: &[Capture] = &[
    Capture {
        name: "get",
        method: "GET",
        script: "get.php",
        query: "name=corral&x=1",
        headers: &[
            ("Host", "capture.test"),
            ("User-Agent", "corral-capture/1"),
            ("Accept", "*/*"),
        ],
        special: &[],
        body: b"",
        order: ByteOrder::Little,
    },
    Capture {
        name: "post",
        method: "POST",
        script: "post.php",
        query: "mode=echo",
        headers: &[
            ("Host", "capture.test"),
            ("Content-Type", "application/x-www-form-urlencoded"),
            ("Content-Length", "9"),
            ("X-Custom-Thing", "yes"),
        ],
        special: &[(b"\x01\x01display_errors", b"1")],
        body: b"a=1&b=two",
        order: ByteOrder::Little,
    },
    Capture {
        name: "post-be",
        method: "POST",
        script: "post.php",
        query: "mode=echo",
        headers: &[
            ("Host", "capture.test"),
            ("Content-Type", "application/x-www-form-urlencoded"),
            ("Content-Length", "9"),
            ("X-Custom-Thing", "yes"),
        ],
        special: &[(b"\x01\x01display_errors", b"1")],
        body: b"a=1&b=two",
        order: ByteOrder::Big,
    },
    Capture {
        name: "errors",
        method: "GET",
        script: "errors.php",
        query: "",
        headers: &[("Host", "capture.test")],
        special: &[],
        body: b"",
        order: ByteOrder::Little,
    },
    Capture {
        name: "big",
        method: "GET",
        script: "big.php",
        query: "",
        headers: &[("Host", "capture.test")],
        special: &[],
        body: b"",
        order: ByteOrder::Little,
    },
];

/// BEGIN_REQUEST followed by the raw body: exactly the bytes capture.py sends.
fn build_capture(c: &Capture) -> Vec<u8> {
    let uri = if c.query.is_empty() {
        format!("/{}", c.script)
    } else {
        format!("/{}?{}", c.script, c.query)
    };
    let line = format!("{} {} HTTP/1.1", c.method, uri);
    let mut rb = RequestBuilder::new(&Limits::DEFAULT, line.as_bytes())
        .unwrap()
        .with_byte_order(c.order, FlagRule::Literal);
    let script_filename = format!("{SCRIPT_DIR}/{}", c.script);
    let script_name = format!("/{}", c.script);
    let env: [(&str, &str); 13] = [
        ("GATEWAY_INTERFACE", "CGI/1.1"),
        ("SERVER_SOFTWARE", "corral"),
        ("SERVER_PROTOCOL", "HTTP/1.1"),
        ("SERVER_NAME", "capture.test"),
        ("SERVER_PORT", "80"),
        ("REMOTE_ADDR", "127.0.0.1"),
        ("REMOTE_PORT", "40000"),
        ("DOCUMENT_ROOT", SCRIPT_DIR),
        ("REQUEST_URI", &uri),
        ("SCRIPT_FILENAME", &script_filename),
        ("SCRIPT_NAME", &script_name),
        ("QUERY_STRING", c.query),
        ("REQUEST_METHOD", c.method),
    ];
    for (n, v) in env {
        rb.env(n.as_bytes(), v.as_bytes()).unwrap();
    }
    for (n, v) in c.special {
        rb.special_env(n, v).unwrap();
    }
    for (n, v) in c.headers {
        rb.header(n.as_bytes(), v.as_bytes()).unwrap();
    }
    rb.body_len(c.body.len() as u64);
    let mut out = BytesMut::new();
    rb.encode(&mut out).unwrap();
    out.extend_from_slice(c.body);
    out.to_vec()
}

#[test]
fn capture_requests_are_what_the_builder_makes() {
    let write = std::env::var_os("LSAPI_WRITE_CAPTURE_REQUESTS").is_some();
    for c in CAPTURES {
        let bytes = build_capture(c);
        let path = data_path(&format!("{}.request.bin", c.name));
        if write {
            std::fs::write(&path, &bytes).unwrap();
        }
        let committed = std::fs::read(&path).unwrap();
        assert_eq!(
            committed,
            bytes,
            "{} differs from the builder's output",
            path.display()
        );
        // And our own backend-role parser reads them back.
        let events = request_events(&Limits::DEFAULT, &bytes, &[]).unwrap();
        let req = begin(&events[0]);
        assert_eq!(req.order, c.order);
        assert_eq!(req.request_method.as_deref(), Some(c.method.as_bytes()));
        assert_eq!(req.headers.len(), c.headers.len());
        assert_eq!(req.body_len, c.body.len() as u64);
    }
}

/// The captured response, decoded whole and fed one byte at a time (same events).
fn captured(name: &str) -> Vec<ResponseEvent> {
    let bytes = std::fs::read(data_path(&format!("{name}.response.bin"))).unwrap();
    let whole = decode_response(&bytes).unwrap();
    let mut dec = ResponseDecoder::new(&Limits::DEFAULT).with_flag_rule(FlagRule::Literal);
    let every_byte: Vec<usize> = (0..bytes.len()).collect();
    assert_eq!(
        response_events(&mut dec, &bytes, &every_byte).unwrap(),
        whole
    );
    whole
}

fn php_head(status: u16, extra: &[&str]) -> ResponseEvent {
    let mut lines = vec![b("X-Powered-By: PHP/8.2.32")];
    lines.extend(extra.iter().map(|l| b(l)));
    lines.push(b("Content-type: text/html; charset=UTF-8"));
    ResponseEvent::Header(ResponseHead { status, lines })
}

#[test]
fn lsphp_get_with_query() {
    assert_eq!(
        captured("get"),
        vec![
            ResponseEvent::ReqReceived,
            php_head(200, &[]),
            ResponseEvent::Stream(b(concat!(
                "method=GET\n",
                "query=name=corral&x=1\n",
                "script_name=/get.php\n",
                "host=capture.test\n",
                "user_agent=corral-capture/1\n",
                "get[name]=corral\n",
                "get[x]=1\n",
            ))),
            ResponseEvent::End,
        ]
    );
}

#[test]
fn lsphp_post_with_body_unknown_header_and_special_env_in_both_orders() {
    let expected = vec![
        ResponseEvent::ReqReceived,
        php_head(200, &[]),
        ResponseEvent::Stream(b(concat!(
            "method=POST\n",
            "get[mode]=echo\n",
            "content_type=application/x-www-form-urlencoded\n",
            "content_length=9\n",
            "x_custom_thing=yes\n",
            "display_errors=1\n",
            "input=a=1&b=two\n",
            "post[a]=1\n",
            "post[b]=two\n",
            "header[Host]=capture.test\n",
            "header[Content-Type]=application/x-www-form-urlencoded\n",
            "header[Content-Length]=9\n",
            "header[X-Custom-Thing]=yes\n",
        ))),
        ResponseEvent::End,
    ];
    assert_eq!(captured("post"), expected);
    // The big-endian request was understood the same way; lsphp answers in its own order.
    assert_eq!(captured("post-be"), expected);
}

#[test]
fn lsphp_error_log_404_and_two_cookies() {
    let events = captured("errors");
    assert_eq!(
        events,
        vec![
            ResponseEvent::ReqReceived,
            ResponseEvent::Stderr(b("corral capture: something went wrong\n")),
            php_head(
                404,
                &[
                    "Set-Cookie: first=1; Path=/",
                    "Set-Cookie: second=2; HttpOnly"
                ]
            ),
            ResponseEvent::Stream(b("not found\n")),
            ResponseEvent::End,
        ]
    );
    let cookies: Vec<Bytes> = head(&events[2])
        .fields()
        .filter(|(n, _)| n.eq_ignore_ascii_case(b"set-cookie"))
        .map(|(_, v)| v)
        .collect();
    assert_eq!(cookies, vec![b("first=1; Path=/"), b("second=2; HttpOnly")]);
}

#[test]
fn lsphp_large_body_of_small_writes_comes_in_8200_byte_packets() {
    // 1000 small printf() writes pass through lsphp's 8 KiB response buffer, so the packets
    // are smaller than the 16384-byte maximum one large write would give.
    let events = captured("big");
    assert_eq!(events[0], ResponseEvent::ReqReceived);
    assert_eq!(events[1], php_head(200, &[]));
    assert_eq!(events.last(), Some(&ResponseEvent::End));
    let streams: Vec<&Bytes> = events
        .iter()
        .filter_map(|e| match e {
            ResponseEvent::Stream(b) => Some(b),
            _ => None,
        })
        .collect();
    let sizes: Vec<usize> = streams.iter().map(|s| s.len()).collect();
    assert_eq!(sizes, vec![8200, 8200, 8200, 8200, 7200]);
    let body: Vec<u8> = streams.iter().flat_map(|s| s.iter().copied()).collect();
    let expected: String = (0..1000)
        .map(|i| format!("line {i:05} {}\n", "x".repeat(28)))
        .collect();
    assert_eq!(body, expected.as_bytes());
    assert_eq!(events.len(), 2 + 5 + 1);
}
