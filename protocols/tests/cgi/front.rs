//! Front-server parameters: what nginx (fastcgi_pass, scgi_pass) and Apache (mod_proxy_fcgi)
//! really send, the SCRIPT_FILENAME rules, and the filtering of HTTP_PROXY and PHP_VALUE.

use super::*;
use corral_protocols::cgi::normalize_front_params;

fn params(list: &[(&str, &str)]) -> Vec<(Bytes, Bytes)> {
    list.iter()
        .map(|(n, v)| {
            (
                Bytes::copy_from_slice(n.as_bytes()),
                Bytes::copy_from_slice(v.as_bytes()),
            )
        })
        .collect()
}

#[test]
fn nginx_fastcgi_params_pass_unchanged() {
    let sent = params(&[
        ("QUERY_STRING", "a=1"),
        ("REQUEST_METHOD", "GET"),
        ("CONTENT_TYPE", ""),
        ("CONTENT_LENGTH", ""),
        ("SCRIPT_NAME", "/info.php"),
        ("REQUEST_URI", "/info.php/x?a=1"),
        ("DOCUMENT_URI", "/info.php/x"),
        ("DOCUMENT_ROOT", "/var/www/html"),
        ("SERVER_PROTOCOL", "HTTP/1.1"),
        ("GATEWAY_INTERFACE", "CGI/1.1"),
        ("SCRIPT_FILENAME", "/var/www/html/info.php"),
        ("PATH_INFO", "/x"),
        ("REDIRECT_STATUS", "200"),
        ("HTTP_HOST", "example.com"),
    ]);
    let out = normalize_front_params(sent.clone(), &php_ctx()).unwrap();
    assert_eq!(out.vars, sent);
    assert!(out.dropped.is_empty());
}

#[test]
fn apache_proxy_fcgi_prefix_is_stripped() {
    let out = normalize_front_params(
        params(&[
            (
                "SCRIPT_FILENAME",
                "proxy:fcgi://127.0.0.1:9000/var/www/html/info.php/extra?x=1",
            ),
            ("SCRIPT_NAME", "/info.php/extra"),
        ]),
        &php_ctx(),
    )
    .unwrap();
    assert_eq!(
        get(&out, "SCRIPT_FILENAME"),
        Some(&b"/var/www/html/info.php"[..])
    );
    assert_eq!(get(&out, "SCRIPT_NAME"), Some(&b"/info.php/extra"[..]));
    assert_eq!(get(&out, "PATH_INFO"), Some(&b"/extra"[..]));
    assert_eq!(
        get(&out, "PATH_TRANSLATED"),
        Some(&b"/var/www/html/extra"[..])
    );
    assert_eq!(get(&out, "DOCUMENT_ROOT"), Some(&b"/var/www/html"[..]));
    let out = normalize_front_params(
        params(&[
            (
                "SCRIPT_FILENAME",
                "PROXY:BALANCER://pool/var/www/html/a.php",
            ),
            ("PATH_INFO", "/keep"),
        ]),
        &php_ctx(),
    )
    .unwrap();
    assert_eq!(
        get(&out, "SCRIPT_FILENAME"),
        Some(&b"/var/www/html/a.php"[..])
    );
    assert_eq!(get(&out, "SCRIPT_NAME"), Some(&b"/a.php"[..]));
    assert_eq!(get(&out, "PATH_INFO"), Some(&b"/keep"[..]));
}

#[test]
fn a_script_outside_the_root_names_both_roots() {
    // nginx's root is /usr/share/wordpress, the context's /var/www/html (the WordPress
    // recipe run with conf/php.toml): the message says which two directories differ.
    let e = normalize_front_params(
        params(&[
            ("SCRIPT_FILENAME", "/usr/share/wordpress/index.php"),
            ("DOCUMENT_ROOT", "/usr/share/wordpress"),
        ]),
        &php_ctx(),
    )
    .unwrap_err();
    assert_eq!(
        e.to_string(),
        "SCRIPT_FILENAME \"/usr/share/wordpress/index.php\" is not inside the context's root \
         \"/var/www/html\" (the front server's DOCUMENT_ROOT is \"/usr/share/wordpress\"): the \
         front server's root and the context's root must name the same directory"
    );
    // Without a DOCUMENT_ROOT from the front server, the context's root is still named.
    let e = normalize_front_params(
        params(&[("SCRIPT_FILENAME", "/srv/other/a.php")]),
        &php_ctx(),
    )
    .unwrap_err();
    assert!(
        e.to_string()
            .contains("the context's root \"/var/www/html\": "),
        "{e}"
    );
}

#[test]
fn front_script_filename_rules() {
    let cases: &[(&str, ErrCheck)] = &[
        ("/etc/passwd", |e| matches!(e, CgiError::OutsideRoot { .. })),
        ("/var/www/htmlx/a.php", |e| {
            matches!(e, CgiError::OutsideRoot { .. })
        }),
        ("/var/www/html/../../etc/x.php", |e| {
            matches!(e, CgiError::EscapesRoot { .. })
        }),
        ("/var/www/html/a/../b.php", |e| {
            matches!(e, CgiError::EscapesRoot { .. })
        }),
        ("/var/www/html/a.txt", |e| {
            matches!(e, CgiError::NotAScript { .. })
        }),
        ("/var/www/html/", |e| {
            matches!(e, CgiError::NotAScript { .. })
        }),
        ("proxy:fcgi://host", |e| {
            matches!(e, CgiError::OutsideRoot { .. })
        }),
        ("a.php", |e| matches!(e, CgiError::OutsideRoot { .. })),
        ("/var/www/html/a\\b.php", |e| {
            matches!(e, CgiError::Backslash { .. })
        }),
        ("/var/www/html/x.jpg", |e| {
            matches!(e, CgiError::NotAScript { .. })
        }),
        ("/var/www/html/.git/x.php", |e| {
            matches!(e, CgiError::Hidden { .. })
        }),
        ("/var/www/html/.user.ini", |e| {
            matches!(e, CgiError::Hidden { .. })
        }),
    ];
    for (filename, is_expected) in cases {
        let err = normalize_front_params(params(&[("SCRIPT_FILENAME", filename)]), &php_ctx())
            .expect_err(filename);
        assert!(is_expected(&err), "{filename}: {err:?}");
    }
    let out = normalize_front_params(
        params(&[("SCRIPT_FILENAME", "/var/www/html//./a.php")]),
        &php_ctx(),
    )
    .unwrap();
    assert_eq!(
        get(&out, "SCRIPT_FILENAME"),
        Some(&b"/var/www/html/a.php"[..])
    );
}

#[test]
fn nginx_scgi_pass_gets_script_vars_derived() {
    let out = normalize_front_params(
        params(&[
            ("REQUEST_METHOD", "GET"),
            ("REQUEST_URI", "/app/index.php/x?y=1"),
            ("DOCUMENT_URI", "/app/index.php/x"),
            ("SCGI", "1"),
        ]),
        &php_ctx(),
    )
    .unwrap();
    assert_eq!(get(&out, "SCRIPT_NAME"), Some(&b"/app/index.php"[..]));
    assert_eq!(
        get(&out, "SCRIPT_FILENAME"),
        Some(&b"/var/www/html/app/index.php"[..])
    );
    assert_eq!(get(&out, "PATH_INFO"), Some(&b"/x"[..]));
    assert_eq!(get(&out, "PATH_TRANSLATED"), Some(&b"/var/www/html/x"[..]));
    assert_eq!(get(&out, "DOCUMENT_ROOT"), Some(&b"/var/www/html"[..]));
    let out =
        normalize_front_params(params(&[("REQUEST_URI", "/a%20b.php?q=%2f")]), &php_ctx()).unwrap();
    assert_eq!(
        get(&out, "SCRIPT_FILENAME"),
        Some(&b"/var/www/html/a b.php"[..])
    );
    assert_eq!(
        get(&out, "PATH_INFO"),
        None,
        "an empty PATH_INFO is left out"
    );
    let err = normalize_front_params(params(&[("REQUEST_URI", "/x.jpg/../../y.php")]), &php_ctx())
        .unwrap_err();
    assert!(matches!(err, CgiError::EscapesRoot { .. }));
    assert_eq!(
        normalize_front_params(params(&[("REQUEST_METHOD", "GET")]), &php_ctx()).unwrap_err(),
        CgiError::NoScriptInfo
    );
    let out =
        normalize_front_params(params(&[("DOCUMENT_URI", "/hello/world")]), &app_ctx(b"")).unwrap();
    assert_eq!(get(&out, "SCRIPT_NAME"), Some(&b""[..]));
    assert_eq!(get(&out, "PATH_INFO"), Some(&b"/hello/world"[..]));
    assert_eq!(get(&out, "SCRIPT_FILENAME"), None);
}

#[test]
fn front_params_filtering() {
    let sent = params(&[
        ("SCRIPT_FILENAME", "/var/www/html/old.php"),
        ("HTTP_PROXY", "http://evil:1"),
        ("PHP_VALUE", "auto_prepend_file=php://input"),
        ("PHP_ADMIN_VALUE", "allow_url_include=On"),
        ("SCRIPT_FILENAME", "/var/www/html/new.php"),
        ("CORRAL_READY_PROBE", "1"),
    ]);
    let out = normalize_front_params(sent.clone(), &php_ctx()).unwrap();
    assert_eq!(get(&out, "HTTP_PROXY"), None);
    // The launchers answer this one without calling the app: corral's own, never a front's.
    assert_eq!(get(&out, "CORRAL_READY_PROBE"), None);
    assert_eq!(get(&out, "PHP_VALUE"), None);
    assert_eq!(get(&out, "PHP_ADMIN_VALUE"), None);
    assert_eq!(
        get(&out, "SCRIPT_FILENAME"),
        Some(&b"/var/www/html/new.php"[..])
    );
    let reasons: Vec<DropReason> = out.dropped.iter().map(|d| d.reason).collect();
    assert_eq!(
        reasons,
        vec![
            DropReason::Httpoxy,
            DropReason::PhpIni,
            DropReason::PhpIni,
            DropReason::Duplicate,
            DropReason::Reserved
        ]
    );
    let trusting = CgiContext {
        allow_php_ini_params: true,
        ..php_ctx()
    };
    let out = normalize_front_params(sent, &trusting).unwrap();
    assert_eq!(
        get(&out, "PHP_VALUE"),
        Some(&b"auto_prepend_file=php://input"[..])
    );
    assert_eq!(get(&out, "HTTP_PROXY"), None);

    let bad = |list: &[(&str, &str)]| normalize_front_params(params(list), &php_ctx()).unwrap_err();
    assert_eq!(
        bad(&[("A=B", "x")]),
        CgiError::InvalidParamName {
            name: b"A=B".to_vec()
        }
    );
    assert_eq!(
        bad(&[("", "x")]),
        CgiError::InvalidParamName { name: Vec::new() }
    );
    assert_eq!(
        bad(&[("A\0", "x")]),
        CgiError::InvalidParamName {
            name: b"A\0".to_vec()
        }
    );
    assert_eq!(
        bad(&[("SCRIPT_FILENAME", "/var/www/html/a.php\0.jpg")]),
        CgiError::ForbiddenByte {
            field: "SCRIPT_FILENAME".to_owned(),
            value: b"/var/www/html/a.php\0.jpg".to_vec()
        }
    );
    assert!(matches!(
        bad(&[("PATH_INFO", "/x\n")]),
        CgiError::ForbiddenByte { .. }
    ));
}

#[test]
fn apache_proxy_scgi_prefix_is_stripped() {
    let out = normalize_front_params(
        params(&[(
            "SCRIPT_FILENAME",
            "proxy:scgi://localhost/var/www/html/info.php",
        )]),
        &php_ctx(),
    )
    .unwrap();
    assert_eq!(
        get(&out, "SCRIPT_FILENAME"),
        Some(&b"/var/www/html/info.php"[..])
    );
}

#[test]
fn a_rootless_context_drops_the_front_script_filename() {
    // Nothing can check a file without a root: a PHP backend behind such a context must not
    // be handed a path to run.
    let out = normalize_front_params(
        params(&[
            ("SCRIPT_FILENAME", "/var/www/html/uploads/avatar.gif"),
            ("PATH_TRANSLATED", "/var/www/html/uploads/avatar.gif"),
            ("REQUEST_URI", "/app/x"),
        ]),
        &app_ctx(b"/app"),
    )
    .unwrap();
    assert_eq!(get(&out, "SCRIPT_FILENAME"), None);
    assert_eq!(get(&out, "PATH_TRANSLATED"), None);
    assert_eq!(get(&out, "SCRIPT_NAME"), Some(&b"/app"[..]));
    assert_eq!(
        out.dropped
            .iter()
            .filter(|d| d.reason == DropReason::NoRoot)
            .count(),
        2
    );
}

#[test]
fn context_params_apply_to_front_requests_too() {
    let mut ctx = php_ctx();
    ctx.extra_env = vec![
        (Bytes::from_static(b"APP_ENV"), Bytes::from_static(b"prod")),
        (Bytes::from_static(b"HTTPS"), Bytes::from_static(b"on")),
    ];
    let out = normalize_front_params(
        params(&[("SCRIPT_FILENAME", "/var/www/html/a.php"), ("HTTPS", "off")]),
        &ctx,
    )
    .unwrap();
    assert_eq!(get(&out, "APP_ENV"), Some(&b"prod"[..]));
    assert_eq!(get(&out, "HTTPS"), Some(&b"on"[..]), "the context wins");
}
