//! encode_cgi_request against the RequestBuilder fed pair by pair: the same packet for any
//! CGI variables, or a refusal from both.

use super::*;
use corral_protocols::cgi::CgiParams;

/// BEGIN_REQUEST from CGI variables through the builder, one call per pair: the way a
/// gateway encoded it before `encode_cgi_request`, kept as the oracle.
fn oracle(params: &CgiParams, body_len: u64, limits: &Limits) -> Result<BytesMut, LsapiError> {
    let get = |n: &str| params.get(n.as_bytes());
    let mut line = get("REQUEST_METHOD").unwrap_or(b"GET").to_vec();
    line.push(b' ');
    match get("REQUEST_URI").filter(|u| !u.is_empty()) {
        Some(uri) => line.extend_from_slice(uri),
        None => {
            line.extend_from_slice(get("SCRIPT_NAME").unwrap_or(b"/"));
            line.extend_from_slice(get("PATH_INFO").unwrap_or_default());
            if let Some(q) = get("QUERY_STRING").filter(|q| !q.is_empty()) {
                line.push(b'?');
                line.extend_from_slice(q);
            }
        }
    }
    line.push(b' ');
    line.extend_from_slice(get("SERVER_PROTOCOL").unwrap_or(b"HTTP/1.1"));
    let mut builder = RequestBuilder::new(limits, &line)?;
    let mut had_length = false;
    for (name, value) in params.iter() {
        match name {
            b"HTTP_CONTENT_LENGTH" | b"HTTP_CONTENT_TYPE" | b"HTTP_TRANSFER_ENCODING" => {}
            b"CONTENT_LENGTH" => had_length = true,
            b"CONTENT_TYPE" => {
                if !value.is_empty() {
                    builder.header(b"Content-Type", value)?;
                }
            }
            n if n.starts_with(b"HTTP_") => {
                let mut header = Vec::new();
                for (i, word) in n[5..].split(|&b| b == b'_').enumerate() {
                    if i > 0 {
                        header.push(b'-');
                    }
                    for (j, &b) in word.iter().enumerate() {
                        header.push(if j == 0 {
                            b.to_ascii_uppercase()
                        } else {
                            b.to_ascii_lowercase()
                        });
                    }
                }
                builder.header(&header, value)?;
            }
            n => builder.env(n, value)?,
        }
    }
    if body_len > 0 || had_length {
        builder.header(b"Content-Length", body_len.to_string().as_bytes())?;
    }
    let missing: Vec<&str> = builder.missing_pointed().collect();
    for name in missing {
        let value: &[u8] = if name == "REQUEST_METHOD" {
            b"GET"
        } else {
            b""
        };
        builder.env(name.as_bytes(), value)?;
    }
    builder.body_len(body_len);
    let mut out = BytesMut::new();
    builder.encode(&mut out)?;
    Ok(out)
}

/// Both encoders on `pairs`; the scratch is reused across calls, as a serving thread does.
fn compare(pairs: &[(&[u8], &[u8])], body_len: u64, limits: &Limits, scratch: &mut CgiScratch) {
    let mut params = CgiParams::default();
    for (n, v) in pairs {
        params.push(n, v).unwrap();
    }
    let expected = oracle(&params, body_len, limits);
    // Something already in the destination stays, and stays alone on a refusal.
    let mut got = BytesMut::from(&b"before"[..]);
    let result = encode_cgi_request(&params, body_len, limits, scratch, &mut got);
    match (expected, result) {
        (Ok(want), Ok(())) => assert_eq!(
            got[6..].escape_ascii().to_string(),
            want.escape_ascii().to_string(),
            "{params:?} body {body_len}"
        ),
        (Err(_), Err(_)) => assert_eq!(&got[..], b"before", "{params:?}: left bytes"),
        (want, got) => panic!("{params:?} body {body_len}: oracle {want:?}, encoder {got:?}"),
    }
}

/// Variables as the encoders take them.
type Pairs<'a> = Vec<(&'a [u8], &'a [u8])>;

fn p<'a>(pairs: &[(&'a str, &'a str)]) -> Pairs<'a> {
    pairs
        .iter()
        .map(|(n, v)| (n.as_bytes(), v.as_bytes()))
        .collect()
}

#[test]
fn cgi_requests_encode_as_the_builder_does() {
    let php = p(&[
        ("SCRIPT_FILENAME", "/srv/www/index.php"),
        ("QUERY_STRING", "a=1"),
        ("REQUEST_METHOD", "POST"),
        ("CONTENT_TYPE", "text/plain"),
        ("CONTENT_LENGTH", "11"),
        ("SCRIPT_NAME", "/index.php"),
        ("REQUEST_URI", "/index.php?a=1"),
        ("SERVER_PROTOCOL", "HTTP/1.1"),
        ("HTTP_HOST", "example.test"),
        ("HTTP_USER_AGENT", "ab/2.3"),
        ("HTTP_ACCEPT", "*/*"),
        ("HTTP_X_CUSTOM_THING", "x"),
        ("HTTP_CONTENT_LENGTH", "11"),
        ("HTTP_CONTENT_TYPE", "text/plain"),
        ("HTTP_COOKIE", "a=b; c=d"),
        ("REMOTE_ADDR", "127.0.0.1"),
    ]);
    let cases: Vec<(Pairs<'_>, u64)> = vec![
        (php.clone(), 11),
        (php.clone(), 0),
        (php.clone(), u64::from(u32::MAX) + 5),
        (vec![], 0),
        (vec![], 3),
        // The line from SCRIPT_NAME, PATH_INFO and QUERY_STRING; the first of each.
        (
            p(&[
                ("REQUEST_URI", ""),
                ("SCRIPT_NAME", "/s.php"),
                ("PATH_INFO", "/p"),
                ("QUERY_STRING", "q=1"),
                ("QUERY_STRING", "q=2"),
                ("SCRIPT_NAME", "/t.php"),
            ]),
            0,
        ),
        (
            p(&[
                ("REQUEST_URI", "/first"),
                ("REQUEST_URI", "/second"),
                ("REQUEST_METHOD", "PUT"),
                ("REQUEST_METHOD", "GET"),
                ("SCRIPT_FILENAME", "/a"),
                ("SCRIPT_FILENAME", "/b"),
            ]),
            0,
        ),
        // Bytes that break the line, where the line uses them and where it does not.
        (p(&[("REQUEST_URI", "/a\r\nb")]), 0),
        (p(&[("REQUEST_URI", "/a"), ("PATH_INFO", "/b\nc")]), 0),
        (p(&[("PATH_INFO", "/b\nc")]), 0),
        (p(&[("REQUEST_METHOD", "G\0T")]), 0),
        (p(&[("SERVER_PROTOCOL", "HTTP/1.1\r")]), 0),
        // Headers: bad bytes, odd names, repeats, Transfer-Encoding by another spelling.
        (p(&[("HTTP_X_A", "a\rb")]), 0),
        (p(&[("HTTP_X_A", "a\0b")]), 0),
        (p(&[("HTTP_X:A", "a")]), 0),
        (p(&[("HTTP_", "a")]), 0),
        (p(&[("HTTP__X__Y_", "a"), ("HTTP_x_lower", "b")]), 0),
        (p(&[("HTTP_HOST", "a"), ("HTTP_HOST", "b")]), 0),
        (p(&[("HTTP_HOST", "a"), ("HTTP_host", "b")]), 0),
        (p(&[("HTTP_transfer_encoding", "chunked")]), 0),
        (p(&[("HTTP_content_length", "5")]), 5),
        (p(&[("HTTP_content_length", "5")]), 0),
        (p(&[("HTTP_content_length", "5")]), u64::from(u32::MAX) + 1),
        (p(&[("CONTENT_TYPE", ""), ("CONTENT_LENGTH", "")]), 0),
        (p(&[("CONTENT_TYPE", "a"), ("HTTP_CONTENT-TYPE", "b")]), 0),
        // Env values with any byte (they are counted, not terminated).
        (p(&[("X", "a\0b\r\n"), ("", ""), ("Y", "")]), 0),
    ];
    let limits = Limits::default();
    let mut scratch = CgiScratch::default();
    for (pairs, body) in &cases {
        compare(pairs, *body, &limits, &mut scratch);
    }
}

#[test]
fn limits_refuse_as_the_builder_does() {
    let long = "v".repeat(70_000);
    let mid = "w".repeat(30_000);
    let mut scratch = CgiScratch::default();
    let base = Limits::default();
    let small = Limits {
        max_name_len: 12,
        max_value_len: 20,
        max_params_count: 5,
        max_params_bytes: 400,
        ..Limits::default()
    };
    let cases: Vec<Pairs<'_>> = vec![
        p(&[("HTTP_X_BIG", &long)]),
        p(&[("BIG", &long)]),
        p(&[("A", &mid), ("B", &mid)]),
        p(&[("HTTP_A", &mid), ("HTTP_B", &mid)]),
        p(&[("A", &mid), ("HTTP_B", &mid)]),
        p(&[("A", "1"), ("B", "2")]),
        p(&[("A_RATHER_LONG_NAME", "1")]),
        p(&[("HTTP_A_LONG_HEADER", "1")]),
        p(&[("HTTP_A_LONG_HEAD", "1")]),
        p(&[("A", "a value longer than twenty")]),
        p(&[("HTTP_A", "a value longer than twenty")]),
        p(&[("CONTENT_TYPE", "text/plain")]),
        p(&[("A", "1"), ("B", "2"), ("C", "3"), ("D", "4"), ("E", "5")]),
        p(&[
            ("HTTP_A", "1"),
            ("HTTP_B", "2"),
            ("HTTP_C", "3"),
            ("HTTP_D", "4"),
            ("HTTP_E", "5"),
        ]),
        p(&[
            ("HTTP_A", "1"),
            ("HTTP_B", "2"),
            ("HTTP_C", "3"),
            ("HTTP_D", "4"),
        ]),
    ];
    for limits in [&base, &small] {
        for pairs in &cases {
            compare(pairs, 0, limits, &mut scratch);
            compare(pairs, 7, limits, &mut scratch);
        }
    }
    // Many pairs: the count limits.
    let names: Vec<String> = (0..9000).map(|i| format!("V{i}")).collect();
    let many: Vec<(&[u8], &[u8])> = names.iter().map(|n| (n.as_bytes(), &b""[..])).collect();
    let wide = Limits {
        max_params_count: 20_000,
        max_params_bytes: usize::MAX,
        ..Limits::default()
    };
    compare(&many, 0, &wide, &mut scratch);
    compare(&many[..100], 0, &wide, &mut scratch);
}

fn cgi_name() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        prop::sample::select(vec![
            "REQUEST_METHOD",
            "REQUEST_URI",
            "SCRIPT_NAME",
            "SCRIPT_FILENAME",
            "PATH_INFO",
            "QUERY_STRING",
            "SERVER_PROTOCOL",
            "CONTENT_TYPE",
            "CONTENT_LENGTH",
            "HTTP_HOST",
            "HTTP_ACCEPT",
            "HTTP_COOKIE",
            "HTTP_CONTENT_LENGTH",
            "HTTP_TRANSFER_ENCODING",
            "HTTP_X_FORWARDED_FOR",
            "REMOTE_ADDR",
        ])
        .prop_map(|n| n.as_bytes().to_vec()),
        "HTTP_[A-Za-z_:-]{0,12}".prop_map(String::into_bytes),
        "[A-Z_]{0,10}".prop_map(String::into_bytes),
    ]
}

fn cgi_value() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        "[ -~]{0,40}".prop_map(String::into_bytes),
        prop::collection::vec(any::<u8>(), 0..12),
    ]
}

proptest! {
    #[test]
    fn any_cgi_variables_encode_as_the_builder_does(
        pairs in prop::collection::vec((cgi_name(), cgi_value()), 0..24),
        body in prop_oneof![Just(0u64), 1u64..100_000, Just(u64::from(u32::MAX) + 9)],
        tight in any::<bool>(),
    ) {
        let limits = if tight {
            Limits { max_name_len: 10, max_value_len: 30, max_params_count: 12, max_params_bytes: 600, ..Limits::default() }
        } else {
            Limits::default()
        };
        let pairs: Vec<(&[u8], &[u8])> = pairs.iter().map(|(n, v)| (&n[..], &v[..])).collect();
        let mut scratch = CgiScratch::default();
        compare(&pairs, body, &limits, &mut scratch);
        compare(&pairs, body, &limits, &mut scratch);
    }
}
