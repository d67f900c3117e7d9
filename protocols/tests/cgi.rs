#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing,
    missing_docs
)]
//! CGI/1.1 variables: hand-written expectations from RFC 3875 §4.1 and nginx's fastcgi_params,
//! tables for the path split and header rules (with the known attacks), front-server
//! normalisation, and properties of the split over generated paths.

use bytes::Bytes;
use corral_protocols::cgi::{
    build_cgi_vars, split_script_path, CgiContext, CgiError, CgiRequest, CgiVars, DropReason,
    ScriptMode,
};
use corral_protocols::Limits;
use proptest::prelude::*;

/// Front-server parameter normalisation.
#[path = "cgi/front.rs"]
mod front;

const ROOT: &[u8] = b"/var/www/html";

/// Header lists as the front listener passes them.
type Headers<'a> = &'a [(&'a [u8], &'a [u8])];
/// Says whether an error is the expected variant.
type ErrCheck = fn(&CgiError) -> bool;

fn php_ctx() -> CgiContext {
    CgiContext {
        document_root: ROOT.to_vec(),
        mode: ScriptMode::Files {
            extensions: vec![b"php".to_vec(), b".phar".to_vec()],
            index: vec![b"index.php".to_vec()],
        },
        server_software: Bytes::from_static(b"corral/0.1.0"),
        extra_env: Vec::new(),
        allow_php_ini_params: false,
    }
}

fn app_ctx(mount: &[u8]) -> CgiContext {
    CgiContext {
        mode: ScriptMode::App {
            mount: mount.to_vec(),
        },
        ..php_ctx()
    }
}

fn request<'a>(target: &'a [u8], headers: &'a [(&'a [u8], &'a [u8])]) -> CgiRequest<'a> {
    CgiRequest {
        method: b"GET",
        target,
        protocol: b"HTTP/1.1",
        headers,
        body_length: None,
        remote_addr: b"192.0.2.7",
        remote_port: Some(51234),
        server_addr: b"198.51.100.1",
        server_port: Some(8080),
        server_name: b"example.com",
        https: false,
    }
}

fn build(target: &[u8], headers: &[(&[u8], &[u8])]) -> Result<CgiVars, CgiError> {
    build_cgi_vars(&request(target, headers), &php_ctx(), &Limits::DEFAULT)
}

fn get<'a>(vars: &'a CgiVars, name: &str) -> Option<&'a [u8]> {
    vars.get(name.as_bytes()).map(|v| &v[..])
}

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

/// (raw path, SCRIPT_NAME, PATH_INFO) for paths that must split.
const SPLITS: &[(&str, &str, &str)] = &[
    ("/index.php", "/index.php", ""),
    ("/", "/index.php", ""),
    ("/dir/", "/dir/index.php", ""),
    ("/a.php/b/c", "/a.php", "/b/c"),
    ("/a.php/", "/a.php", "/"),
    ("/tool.phar/run", "/tool.phar", "/run"),
    // The first allowed segment wins, and nothing walks back to an earlier segment: a file
    // uploaded as avatar.jpg is never executed (cgi.fix_pathinfo attack).
    ("/x.jpg/y.php", "/x.jpg/y.php", ""),
    (
        "/uploads/avatar.jpg/x.php/z",
        "/uploads/avatar.jpg/x.php",
        "/z",
    ),
    ("/a.php/b.php/c", "/a.php", "/b.php/c"),
    // Dot segments are resolved after decoding; staying inside the root is fine.
    ("/a/%2e%2e/b.php", "/b.php", ""),
    ("/a/../b.php", "/b.php", ""),
    ("/a.php/../b.php", "/b.php", ""),
    ("/./a.php", "/a.php", ""),
    ("//a.php//x//", "/a.php", "/x/"),
    ("/a.php/%2e%2e", "/index.php", ""),
    ("/dir/.", "/dir/index.php", ""),
    ("/a%20b.php/%41", "/a b.php", "/A"),
    ("/%252e%252e/x.php", "/%2e%2e/x.php", ""),
    ("/caf\u{e9}.php", "/caf\u{e9}.php", ""),
    // RFC 8615's well-known directory is the one hidden segment allowed.
    ("/.well-known/a.php", "/.well-known/a.php", ""),
];

#[test]
fn path_split_table() {
    let ctx = php_ctx();
    for &(raw, name, info) in SPLITS {
        let got = split_script_path(raw.as_bytes(), &ctx).unwrap_or_else(|e| panic!("{raw}: {e}"));
        assert_eq!(got.script_name, name.as_bytes(), "{raw}");
        assert_eq!(got.path_info, info.as_bytes(), "{raw}");
        let mut filename = ROOT.to_vec();
        filename.extend_from_slice(name.as_bytes());
        assert_eq!(got.script_filename, Some(filename), "{raw}");
    }
}

#[test]
fn path_attack_table() {
    let ctx = php_ctx();
    let cases: &[(&str, ErrCheck)] = &[
        ("/a.php/../../etc/passwd", |e| {
            matches!(e, CgiError::EscapesRoot { .. })
        }),
        ("/../etc/passwd", |e| {
            matches!(e, CgiError::EscapesRoot { .. })
        }),
        ("/%2e%2e/etc/passwd", |e| {
            matches!(e, CgiError::EscapesRoot { .. })
        }),
        ("/%2E%2E/%2e%2e/x.php", |e| {
            matches!(e, CgiError::EscapesRoot { .. })
        }),
        ("/a/../../x.php", |e| {
            matches!(e, CgiError::EscapesRoot { .. })
        }),
        ("/a.php%00.jpg", |e| {
            matches!(e, CgiError::ForbiddenPathByte { byte: 0 })
        }),
        ("/a.php%0a", |e| {
            matches!(e, CgiError::ForbiddenPathByte { byte: b'\n' })
        }),
        ("/a.php%0d%0aX: y", |e| {
            matches!(e, CgiError::ForbiddenPathByte { byte: b'\r' })
        }),
        ("/a%2fb.php", |e| matches!(e, CgiError::EncodedSlash { .. })),
        ("/a.php%2F..%2F..%2Fetc", |e| {
            matches!(e, CgiError::EncodedSlash { .. })
        }),
        ("/a%5c..%5cb.php", |e| {
            matches!(e, CgiError::Backslash { .. })
        }),
        ("/a\\b.php", |e| matches!(e, CgiError::Backslash { .. })),
        ("/a%zz.php", |e| {
            matches!(e, CgiError::BadPercentEscape { .. })
        }),
        ("/a.php%2", |e| {
            matches!(e, CgiError::BadPercentEscape { .. })
        }),
        ("/a.php%", |e| {
            matches!(e, CgiError::BadPercentEscape { .. })
        }),
        // Disallowed extensions are never scripts, whatever follows or precedes.
        ("/x.jpg", |e| matches!(e, CgiError::NotAScript { .. })),
        ("/x.jpg/y", |e| matches!(e, CgiError::NotAScript { .. })),
        ("/x.PHP", |e| matches!(e, CgiError::NotAScript { .. })),
        // Hidden segments are neither run nor served, in any position.
        ("/.php", |e| matches!(e, CgiError::Hidden { .. })),
        ("/.env", |e| matches!(e, CgiError::Hidden { .. })),
        ("/.git/config.php", |e| matches!(e, CgiError::Hidden { .. })),
        ("/a/.user.ini/x.php", |e| {
            matches!(e, CgiError::Hidden { .. })
        }),
        ("/%2ehtpasswd", |e| matches!(e, CgiError::Hidden { .. })),
        ("/a/..%2e/x.php", |e| matches!(e, CgiError::Hidden { .. })),
        ("/a.phpx", |e| matches!(e, CgiError::NotAScript { .. })),
        ("/a.php.jpg", |e| matches!(e, CgiError::NotAScript { .. })),
        ("/a.p%68p5", |e| matches!(e, CgiError::NotAScript { .. })),
        ("/dir", |e| matches!(e, CgiError::NotAScript { .. })),
        ("relative.php", |e| matches!(e, CgiError::TargetForm { .. })),
    ];
    for (raw, is_expected) in cases {
        let err = split_script_path(raw.as_bytes(), &ctx).expect_err(raw);
        assert!(is_expected(&err), "{raw}: {err:?}");
    }
}

#[test]
fn index_choice() {
    let mut ctx = php_ctx();
    ctx.mode = ScriptMode::Files {
        extensions: vec![b"php".to_vec()],
        index: vec![b"index.html".to_vec(), b"main.php".to_vec()],
    };
    assert_eq!(
        split_script_path(b"/", &ctx).unwrap().script_name,
        b"/main.php"
    );
    ctx.mode = ScriptMode::Files {
        extensions: vec![b"php".to_vec()],
        index: vec![b"index.html".to_vec()],
    };
    assert!(matches!(
        split_script_path(b"/sub/", &ctx),
        Err(CgiError::NoIndex { .. })
    ));
}

#[test]
fn app_mode_split() {
    let root = app_ctx(b"");
    let s = split_script_path(b"/foo/bar%20baz", &root).unwrap();
    assert_eq!(
        (
            s.script_name.as_slice(),
            s.path_info.as_slice(),
            s.script_filename
        ),
        (&b""[..], &b"/foo/bar baz"[..], None)
    );
    assert_eq!(
        split_script_path(b"/", &app_ctx(b"/")).unwrap().path_info,
        b"/"
    );
    let app = app_ctx(b"/app");
    let s = split_script_path(b"/app/x/../y", &app).unwrap();
    assert_eq!(
        (s.script_name.as_slice(), s.path_info.as_slice()),
        (&b"/app"[..], &b"/y"[..])
    );
    let s = split_script_path(b"/app", &app).unwrap();
    assert_eq!(
        (s.script_name.as_slice(), s.path_info.as_slice()),
        (&b"/app"[..], &b""[..])
    );
    assert!(matches!(
        split_script_path(b"/apple", &app),
        Err(CgiError::OutsideMount { .. })
    ));
    assert!(matches!(
        split_script_path(b"/app/../etc", &app),
        Err(CgiError::OutsideMount { .. })
    ));
    let vars = build_cgi_vars(&request(b"/app/hello?x", &[]), &app, &Limits::DEFAULT).unwrap();
    assert_eq!(get(&vars, "SCRIPT_NAME"), Some(&b"/app"[..]));
    assert_eq!(get(&vars, "PATH_INFO"), Some(&b"/hello"[..]));
    assert_eq!(get(&vars, "SCRIPT_FILENAME"), None);
    assert_eq!(get(&vars, "PATH_TRANSLATED"), None);
}

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

#[test]
fn invalid_contexts() {
    let bad_roots: &[&[u8]] = &[
        b"relative/root",
        b"/var/../etc",
        b"/var/./www",
        b"/var//www",
        b"/var/www\n",
        b"",
    ];
    for root in bad_roots {
        let ctx = CgiContext {
            document_root: root.to_vec(),
            ..php_ctx()
        };
        assert!(
            matches!(
                split_script_path(b"/a.php", &ctx),
                Err(CgiError::InvalidContext(_))
            ),
            "{root:?}"
        );
    }
    let bad_modes = [
        ScriptMode::Files {
            extensions: vec![b"".to_vec()],
            index: vec![],
        },
        ScriptMode::Files {
            extensions: vec![b".".to_vec()],
            index: vec![],
        },
        ScriptMode::Files {
            extensions: vec![b"p/hp".to_vec()],
            index: vec![],
        },
        ScriptMode::Files {
            extensions: vec![b"php".to_vec()],
            index: vec![b"../x.php".to_vec()],
        },
        ScriptMode::Files {
            extensions: vec![b"php".to_vec()],
            index: vec![b"..".to_vec()],
        },
        ScriptMode::App {
            mount: b"app".to_vec(),
        },
        ScriptMode::App {
            mount: b"/a/../b".to_vec(),
        },
    ];
    for mode in bad_modes {
        let ctx = CgiContext {
            mode: mode.clone(),
            ..php_ctx()
        };
        assert!(
            matches!(
                split_script_path(b"/a.php", &ctx),
                Err(CgiError::InvalidContext(_))
            ),
            "{mode:?}"
        );
    }
    // A root with a trailing slash is fine and does not double the slash.
    let ctx = CgiContext {
        document_root: b"/srv/".to_vec(),
        ..php_ctx()
    };
    assert_eq!(
        split_script_path(b"/a.php", &ctx)
            .unwrap()
            .script_filename
            .unwrap(),
        b"/srv/a.php"
    );
    let ctx = CgiContext {
        document_root: b"/".to_vec(),
        ..php_ctx()
    };
    assert_eq!(
        split_script_path(b"/a.php", &ctx)
            .unwrap()
            .script_filename
            .unwrap(),
        b"/a.php"
    );
}

// ----- properties -----

fn segment() -> impl Strategy<Value = &'static str> {
    prop::sample::select(vec![
        "a",
        "b.php",
        "x.jpg",
        "..",
        ".",
        "",
        "%2e%2e",
        "%2E.",
        "index.php",
        "c%20d",
        "e.phar",
        ".php",
        "%00",
        "%2f",
        "%5c",
    ])
}

proptest! {
    #[test]
    fn split_invariants(segments in prop::collection::vec(segment(), 0..8)) {
        let raw = format!("/{}", segments.join("/"));
        let ctx = php_ctx();
        if let Ok(s) = split_script_path(raw.as_bytes(), &ctx) {
            let uri = s.document_uri();
            prop_assert!(uri.ends_with(&s.path_info), "PATH_INFO is a suffix of the path");
            prop_assert!(uri.starts_with(&s.script_name));
            let filename = s.script_filename.clone().unwrap();
            prop_assert!(filename.starts_with(b"/var/www/html/"));
            prop_assert!(!filename.split(|&c| c == b'/').any(|seg| seg == b".." || seg == b"."));
            prop_assert!(!filename.iter().any(|&c| matches!(c, 0 | b'\r' | b'\n' | b'\\')));
            prop_assert!(s.script_name.ends_with(b".php") || s.script_name.ends_with(b".phar"));
            let script_segment = s.script_name.rsplit(|&c| c == b'/').next().unwrap();
            prop_assert!(script_segment.len() > 4, "a stem before the extension");
        }
    }

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

#[test]
fn static_file_paths_stay_under_the_root() {
    use corral_protocols::cgi::{static_file_path, CgiError};
    assert_eq!(
        static_file_path(b"/css/site%20main.css", b"/srv/www/").unwrap(),
        b"/srv/www/css/site main.css"
    );
    assert_eq!(
        static_file_path(b"/a/./b/../c.txt", b"/srv/www").unwrap(),
        b"/srv/www/a/c.txt"
    );
    assert!(matches!(
        static_file_path(b"/../etc/passwd", b"/srv/www"),
        Err(CgiError::EscapesRoot { .. })
    ));
    assert!(matches!(
        static_file_path(b"/%2e%2e/etc/passwd", b"/srv/www"),
        Err(CgiError::EscapesRoot { .. })
    ));
    assert!(static_file_path(b"/a%00.txt", b"/srv/www").is_err());
    assert!(static_file_path(b"/a%2fb", b"/srv/www").is_err());
    assert!(static_file_path(b"relative", b"/srv/www").is_err());
}
