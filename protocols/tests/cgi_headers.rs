#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing,
    missing_docs
)]
//! CGI/1.1 variables from request headers: the HTTP_* names (httpoxy, underscores,
//! hop-by-hop and odd characters dropped, repeats joined), CONTENT_LENGTH and CONTENT_TYPE,
//! malformed names, values and fields refused with their errors, and generated header names
//! never colliding. The contexts and the request they share are in `support/cgi.rs`.

mod support;

use bytes::Bytes;
use corral_protocols::cgi::{build_cgi_vars, CgiError, DropReason};
use corral_protocols::Limits;
use proptest::prelude::*;
use support::cgi::*;

/// Header lists as the front listener passes them.
type Headers<'a> = &'a [(&'a [u8], &'a [u8])];

#[test]
fn header_rules() {
    let headers: &[(&[u8], &[u8])] = &[
        (b"Proxy", b"http://evil.example:8080"),
        (b"X_Auth_User", b"admin"),
        (b"X-Auth-User", b"alice"),
        (b"Transfer-Encoding", b"chunked"),
        (b"Connection", b"keep-alive"),
        (b"X-Forwarded-For", b"192.0.2.1"),
        (b"x-forwarded-for", b"192.0.2.2"),
        (b"Content_Length", b"0"),
        (b"X-Auth.User", b"mallory"),
        (b"X-Auth+User", b"mallory"),
    ];
    let vars = build(b"/a.php", headers).unwrap();
    assert_eq!(get(&vars, "HTTP_PROXY"), None);
    assert_eq!(get(&vars, "HTTP_X_AUTH_USER"), Some(&b"alice"[..]));
    assert_eq!(get(&vars, "HTTP_TRANSFER_ENCODING"), None);
    assert_eq!(get(&vars, "HTTP_CONNECTION"), None);
    assert_eq!(
        get(&vars, "HTTP_X_FORWARDED_FOR"),
        Some(&b"192.0.2.1, 192.0.2.2"[..])
    );
    assert_eq!(get(&vars, "CONTENT_LENGTH"), Some(&b""[..]));
    let dropped: Vec<(&[u8], DropReason)> = vars
        .dropped
        .iter()
        .map(|d| (&d.name[..], d.reason))
        .collect();
    assert_eq!(
        dropped,
        vec![
            (&b"Proxy"[..], DropReason::Httpoxy),
            (&b"X_Auth_User"[..], DropReason::Underscore),
            (&b"Transfer-Encoding"[..], DropReason::HopByHop),
            (&b"Connection"[..], DropReason::HopByHop),
            (&b"Content_Length"[..], DropReason::Underscore),
            (&b"X-Auth.User"[..], DropReason::NameChars),
            (&b"X-Auth+User"[..], DropReason::NameChars),
        ]
    );
    // Every name appears once.
    let mut names: Vec<&Bytes> = vars.vars.iter().map(|(n, _)| n).collect();
    names.sort();
    names.dedup();
    assert_eq!(names.len(), vars.vars.len());
}

#[test]
fn content_length_rules() {
    let same: &[(&[u8], &[u8])] = &[(b"Content-Length", b"007"), (b"content-length", b"7")];
    assert_eq!(
        get(&build(b"/a.php", same).unwrap(), "CONTENT_LENGTH"),
        Some(&b"7"[..])
    );
    let mut req = request(b"/a.php", &[(b"Content-Length", b"10")]);
    req.body_length = Some(5);
    let vars = build_cgi_vars(&req, &php_ctx(), &Limits::DEFAULT).unwrap();
    assert_eq!(get(&vars, "CONTENT_LENGTH"), Some(&b"5"[..]));
    assert_eq!(get(&vars, "HTTP_CONTENT_LENGTH"), None);
    let cases: &[(Headers, CgiError)] = &[
        (
            &[(b"Content-Length", b"abc")],
            CgiError::InvalidContentLength {
                value: b"abc".to_vec(),
            },
        ),
        (
            &[(b"Content-Length", b"")],
            CgiError::InvalidContentLength {
                value: b"".to_vec(),
            },
        ),
        (
            &[(b"Content-Length", b"-1")],
            CgiError::InvalidContentLength {
                value: b"-1".to_vec(),
            },
        ),
        (
            &[(b"Content-Length", b"99999999999999999999")],
            CgiError::InvalidContentLength {
                value: b"99999999999999999999".to_vec(),
            },
        ),
        (
            &[(b"Content-Length", b"1"), (b"Content-Length", b"2")],
            CgiError::ConflictingContentLength,
        ),
        (
            &[(b"Content-Type", b"a/b"), (b"content-type", b"c/d")],
            CgiError::RepeatedContentType,
        ),
    ];
    for (headers, expected) in cases {
        assert_eq!(build(b"/a.php", headers).unwrap_err(), *expected);
    }
}

#[test]
fn malformed_headers_and_fields() {
    let cases: &[(Headers, CgiError)] = &[
        (
            &[(b"Bad Name", b"x")],
            CgiError::InvalidHeaderName {
                name: b"Bad Name".to_vec(),
            },
        ),
        (
            &[(b"X:Y", b"x")],
            CgiError::InvalidHeaderName {
                name: b"X:Y".to_vec(),
            },
        ),
        (
            &[(b"", b"x")],
            CgiError::InvalidHeaderName { name: Vec::new() },
        ),
        (
            &[(b"X-A", b"a\r\nX-B: b")],
            CgiError::InvalidHeaderValue {
                name: b"X-A".to_vec(),
            },
        ),
        (
            &[(b"X-A", b"a\0b")],
            CgiError::InvalidHeaderValue {
                name: b"X-A".to_vec(),
            },
        ),
        (
            &[(b"X-A", b"a\x7f")],
            CgiError::InvalidHeaderValue {
                name: b"X-A".to_vec(),
            },
        ),
    ];
    for (headers, expected) in cases {
        assert_eq!(build(b"/a.php", headers).unwrap_err(), *expected);
    }
    assert!(build(b"/a.php", &[(b"X-A", b"tab\tok \xc3\xa9")]).is_ok());
    let mut req = request(b"/a.php", &[]);
    req.method = b"GE T";
    assert!(matches!(
        build_cgi_vars(&req, &php_ctx(), &Limits::DEFAULT),
        Err(CgiError::InvalidMethod { .. })
    ));
    let mut req = request(b"/a.php", &[]);
    req.server_name = b"example.com\r\nX: y";
    assert!(matches!(
        build_cgi_vars(&req, &php_ctx(), &Limits::DEFAULT),
        Err(CgiError::ForbiddenByte { .. })
    ));
}

proptest! {
    #[test]
    fn header_names_never_collide(names in prop::collection::vec("[A-Za-z][A-Za-z_-]{0,6}", 0..12)) {
        let headers: Vec<(&[u8], &[u8])> = names.iter().map(|n| (n.as_bytes(), &b"v"[..])).collect();
        let vars = build(b"/a.php", &headers).unwrap();
        for (name, _) in &vars.vars {
            prop_assert_eq!(vars.vars.iter().filter(|(n, _)| n == name).count(), 1);
        }
        for d in &vars.dropped {
            prop_assert!(d.name.contains(&b'_') || d.name.eq_ignore_ascii_case(b"proxy")
                || matches!(d.reason, DropReason::HopByHop));
        }
    }
}
