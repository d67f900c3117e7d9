#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing,
    missing_docs
)]
//! The script path split of CGI/1.1 (SCRIPT_NAME, PATH_INFO, SCRIPT_FILENAME): a table of
//! paths that must split and one of the known attacks (root escapes, cgi.fix_pathinfo,
//! forbidden and encoded bytes, hidden segments), the index choice, app mounts, contexts
//! refused, properties of the split over generated paths, and static file paths kept under
//! the root. The contexts and the request they share are in `support/cgi.rs`.

mod support;

use corral_protocols::cgi::{build_cgi_vars, split_script_path, CgiContext, CgiError, ScriptMode};
use corral_protocols::Limits;
use proptest::prelude::*;
use support::cgi::*;

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
