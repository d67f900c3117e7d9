#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing,
    missing_docs
)]
//! CGI/1.1 variables built from a request: hand-written expectations from RFC 3875 §4.1 and
//! nginx's fastcgi_params (their order, the defaults of a plain GET, the request-target
//! forms), the context's extra variables and the limits; the variables a front server sent,
//! normalised, are in `cgi/front.rs`. The path split is in `cgi_path.rs`, the header rules in
//! `cgi_headers.rs`; the contexts and the request they share in `support/cgi.rs`.

mod support;

use bytes::Bytes;
use corral_protocols::cgi::{build_cgi_vars, CgiContext, CgiError, CgiVars, DropReason};
use corral_protocols::Limits;
use support::cgi::*;

/// Front-server parameter normalisation.
#[path = "cgi/front.rs"]
mod front;

fn pairs(vars: &CgiVars) -> Vec<(String, String)> {
    vars.vars
        .iter()
        .map(|(n, v)| {
            (
                String::from_utf8_lossy(n).into_owned(),
                String::from_utf8_lossy(v).into_owned(),
            )
        })
        .collect()
}

#[test]
fn full_request_gives_fastcgi_params_in_order() {
    let headers: &[(&[u8], &[u8])] = &[
        (b"Host", b"example.com:8080"),
        (b"User-Agent", b"curl/8.0"),
        (b"Cookie", b"a=1"),
        (b"Accept", b"text/html"),
        (b"cookie", b"b=2"),
        (b"accept", b"*/*"),
        (b"Content-Type", b"application/x-www-form-urlencoded"),
        (b"Content-Length", b"11"),
    ];
    let mut req = request(b"/shop/cart.php/item/a%20b?id=7&x=%41", headers);
    req.method = b"POST";
    req.https = true;
    let vars = build_cgi_vars(&req, &php_ctx(), &Limits::DEFAULT).unwrap();
    let expected: Vec<(&str, &str)> = vec![
        ("GATEWAY_INTERFACE", "CGI/1.1"),
        ("SERVER_SOFTWARE", "corral/0.1.0"),
        // RFC 3875 §4.1.7: the query stays URL-encoded.
        ("QUERY_STRING", "id=7&x=%41"),
        ("REQUEST_METHOD", "POST"),
        ("CONTENT_TYPE", "application/x-www-form-urlencoded"),
        ("CONTENT_LENGTH", "11"),
        ("SCRIPT_NAME", "/shop/cart.php"),
        ("SCRIPT_FILENAME", "/var/www/html/shop/cart.php"),
        // §4.1.5: PATH_INFO is decoded.
        ("PATH_INFO", "/item/a b"),
        ("PATH_TRANSLATED", "/var/www/html/item/a b"),
        // nginx $request_uri: raw, with the query.
        ("REQUEST_URI", "/shop/cart.php/item/a%20b?id=7&x=%41"),
        ("DOCUMENT_URI", "/shop/cart.php/item/a b"),
        ("DOCUMENT_ROOT", "/var/www/html"),
        ("SERVER_PROTOCOL", "HTTP/1.1"),
        ("REQUEST_SCHEME", "https"),
        ("HTTPS", "on"),
        ("REMOTE_ADDR", "192.0.2.7"),
        ("REMOTE_PORT", "51234"),
        ("SERVER_ADDR", "198.51.100.1"),
        ("SERVER_PORT", "8080"),
        ("SERVER_NAME", "example.com"),
        ("REDIRECT_STATUS", "200"),
        ("HTTP_HOST", "example.com:8080"),
        ("HTTP_USER_AGENT", "curl/8.0"),
        ("HTTP_COOKIE", "a=1; b=2"),
        ("HTTP_ACCEPT", "text/html, */*"),
    ];
    let expected: Vec<(String, String)> = expected
        .into_iter()
        .map(|(n, v)| (n.to_owned(), v.to_owned()))
        .collect();
    assert_eq!(pairs(&vars), expected);
    assert!(vars.dropped.is_empty());
}

#[test]
fn plain_get_without_body_or_path_info() {
    let vars = build(b"/", &[]).unwrap();
    assert_eq!(get(&vars, "SCRIPT_NAME"), Some(&b"/index.php"[..]));
    assert_eq!(
        get(&vars, "SCRIPT_FILENAME"),
        Some(&b"/var/www/html/index.php"[..])
    );
    // An empty PATH_INFO is left out for a script (CVE-2019-11043's primitive).
    assert_eq!(get(&vars, "PATH_INFO"), None);
    assert_eq!(get(&vars, "PATH_TRANSLATED"), None);
    assert_eq!(get(&vars, "QUERY_STRING"), Some(&b""[..]));
    assert_eq!(get(&vars, "CONTENT_LENGTH"), Some(&b""[..]));
    assert_eq!(get(&vars, "CONTENT_TYPE"), Some(&b""[..]));
    assert_eq!(get(&vars, "REQUEST_SCHEME"), Some(&b"http"[..]));
    assert_eq!(get(&vars, "HTTPS"), None);
    assert_eq!(get(&vars, "DOCUMENT_URI"), Some(&b"/index.php"[..]));
}

#[test]
fn request_target_forms() {
    let vars = build(b"http://example.com:8080/a.php/x?q=1", &[]).unwrap();
    assert_eq!(get(&vars, "REQUEST_URI"), Some(&b"/a.php/x?q=1"[..]));
    assert_eq!(get(&vars, "QUERY_STRING"), Some(&b"q=1"[..]));
    assert_eq!(get(&vars, "PATH_INFO"), Some(&b"/x"[..]));
    assert_eq!(
        get(&build(b"HTTPS://example.com", &[]).unwrap(), "SCRIPT_NAME"),
        Some(&b"/index.php"[..])
    );
    // The query is passed raw, even with encoded NUL: it is the script's to decode.
    assert_eq!(
        get(&build(b"/a.php?x=%00&y=%zz", &[]).unwrap(), "QUERY_STRING"),
        Some(&b"x=%00&y=%zz"[..])
    );
    assert_eq!(
        build(b"*", &[]).unwrap_err(),
        CgiError::TargetForm {
            target: b"*".to_vec()
        }
    );
    assert_eq!(
        build(b"example.com:443", &[]).unwrap_err(),
        CgiError::TargetForm {
            target: b"example.com:443".to_vec()
        }
    );
    assert_eq!(
        build(b"/a.php#frag", &[]).unwrap_err(),
        CgiError::TargetByte { byte: b'#' }
    );
    assert_eq!(
        build(b"/a b.php", &[]).unwrap_err(),
        CgiError::TargetByte { byte: b' ' }
    );
    assert_eq!(
        build(b"/a.php\r\n", &[]).unwrap_err(),
        CgiError::TargetByte { byte: b'\r' }
    );
}

#[test]
fn extra_env_and_limits() {
    let mut ctx = php_ctx();
    ctx.extra_env = vec![
        (Bytes::from_static(b"APP_ENV"), Bytes::from_static(b"prod")),
        (
            Bytes::from_static(b"SERVER_NAME"),
            Bytes::from_static(b"www"),
        ),
    ];
    let vars = build_cgi_vars(&request(b"/a.php", &[]), &ctx, &Limits::DEFAULT).unwrap();
    assert_eq!(get(&vars, "SERVER_NAME"), Some(&b"www"[..]));
    assert_eq!(
        vars.vars.last().unwrap(),
        &(Bytes::from_static(b"APP_ENV"), Bytes::from_static(b"prod"))
    );
    ctx.extra_env = vec![(Bytes::from_static(b"A=B"), Bytes::new())];
    assert!(matches!(
        build_cgi_vars(&request(b"/a.php", &[]), &ctx, &Limits::DEFAULT),
        Err(CgiError::InvalidContext(_))
    ));

    let big = vec![b'a'; 100];
    let headers: &[(&[u8], &[u8])] = &[(b"X-Big", &big)];
    let small = Limits {
        max_value_len: 99,
        ..Limits::DEFAULT
    };
    let err = build_cgi_vars(&request(b"/a.php", headers), &php_ctx(), &small).unwrap_err();
    assert_eq!(
        err,
        CgiError::ValueTooLong {
            name: b"HTTP_X_BIG".to_vec(),
            len: 100,
            limit: 99
        }
    );
    let few = Limits {
        max_params_count: 10,
        ..Limits::DEFAULT
    };
    assert!(matches!(
        build_cgi_vars(&request(b"/a.php", &[]), &php_ctx(), &few),
        Err(CgiError::TooManyVars { limit: 10, .. })
    ));
    let tight = Limits {
        max_params_bytes: 100,
        ..Limits::DEFAULT
    };
    assert!(matches!(
        build_cgi_vars(&request(b"/a.php", &[]), &php_ctx(), &tight),
        Err(CgiError::VarsTooLarge { limit: 100, .. })
    ));
    let short = Limits {
        max_name_len: 8,
        ..Limits::DEFAULT
    };
    assert!(matches!(
        build_cgi_vars(&request(b"/a.php", &[]), &php_ctx(), &short),
        Err(CgiError::NameTooLong { limit: 8, .. })
    ));
}
