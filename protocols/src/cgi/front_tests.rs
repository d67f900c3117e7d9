//! The one-pass normalisation (`front.rs` over `FrontParams`) against the two-pass one it
//! replaced (`front_oracle.rs`): over generated parameter lists and contexts, both accept
//! the same lists with the same variables, in the same order, with the same drops, and refuse
//! the others with the same error; the block written is what encoding the oracle's variables
//! writes; and the values the front logic reads by name are the first ones sent, as a search
//! of the pairs finds them.
#![allow(clippy::unwrap_used, clippy::indexing_slicing, clippy::panic)]

use bytes::Bytes;
use proptest::prelude::*;

use super::front::{
    normalize_front, normalize_front_params, normalize_front_prepared, normalize_front_with,
};
use super::front_oracle;
use super::front_params::{FrontParams, Known};
use super::{CgiContext, CgiParams, ScriptMode};

/// Names: the ones the rules treat apart, some others, and some no environment can carry.
const NAMES: &[&str] = &[
    "SCRIPT_FILENAME",
    "SCRIPT_NAME",
    "PATH_INFO",
    "PATH_TRANSLATED",
    "DOCUMENT_ROOT",
    "DOCUMENT_URI",
    "REQUEST_URI",
    "CONTENT_LENGTH",
    "HTTP_HOST",
    "SERVER_NAME",
    "REQUEST_METHOD",
    "QUERY_STRING",
    "HTTP_PROXY",
    "CORRAL_READY_PROBE",
    "PHP_VALUE",
    "PHP_ADMIN_VALUE",
    "HTTPS",
    "APP_ENV",
    // Common names the index tells apart exactly (`front_names`), repeats included.
    "REMOTE_ADDR",
    "HTTP_ACCEPT",
    "HTTP_USER_AGENT",
    "HTTP_UPGRADE_INSECURE_REQUESTS",
    "HTTP_X_A",
    "HTTP_X_B",
    "X",
    // Names one byte, or only the case, away from a known or a common one, and a name long
    // enough for the 4-byte length form.
    "http_host",
    "HTTP_HOSt",
    "SCRIPT_FILENAMF",
    "DOCUMENT_UR",
    "PHP_VALUE_",
    "HTTP_USER_AGENt",
    "HTTP_X_LONG_NAME_LONG_NAME_LONG_NAME_LONG_NAME_LONG_NAME_LONG_NAME_LONG_NAME_LONG_NAME_LONG_NAME_LONG_NAME_LONG_NAME_LONG_NAME_LONG",
    "",
    "A=B",
    "N\0",
    "N\r",
    "N\n",
];

/// Pieces values are made of: paths inside and outside the root, dot segments, Apache's
/// prefixes, queries, escapes and forbidden bytes.
const PIECES: &[&str] = &[
    "/var/www/html",
    "/",
    "a.php",
    "b.txt",
    "index.php",
    "x",
    "..",
    ".",
    ".git",
    "/srv",
    "proxy:fcgi://h:1",
    "PROXY:SCGI://h",
    "?q=1",
    "%2e",
    "%41",
    "%",
    "\\",
    "\0",
    "\n",
    "app",
    "//",
    "",
];

fn name() -> impl Strategy<Value = String> {
    prop_oneof![
        8 => prop::sample::select(NAMES).prop_map(str::to_owned),
        1 => "[A-Z_=\\x00]{0,4}",
    ]
}

fn value() -> impl Strategy<Value = String> {
    prop::collection::vec(prop::sample::select(PIECES), 0..6).prop_map(|pieces| {
        let mut v = String::new();
        for (i, p) in pieces.iter().enumerate() {
            // Pieces joined by `/` mostly, as paths are.
            if i > 0 && !p.starts_with('?') && !p.starts_with('/') && i % 3 != 0 {
                v.push('/');
            }
            v.push_str(p);
        }
        v
    })
}

fn context() -> impl Strategy<Value = CgiContext> {
    let extra = prop::sample::select(vec![
        vec![],
        vec![("APP_ENV", "prod")],
        vec![("HTTPS", "on"), ("SCRIPT_NAME", "/x")],
        vec![("HTTP_PROXY", "y")],
        vec![("X", "1"), ("X", "2")],
        vec![("HTTP_X_A", "z"), ("NEW", "n"), ("NEW", "m")],
        vec![("DOCUMENT_ROOT", "/elsewhere")],
        vec![("A=B", "")],
    ]);
    let mode = prop::sample::select(vec![
        ScriptMode::Files {
            extensions: vec![b"php".to_vec(), b".phar".to_vec()],
            index: vec![b"index.php".to_vec()],
        },
        ScriptMode::App {
            mount: b"".to_vec(),
        },
        ScriptMode::App {
            mount: b"/app".to_vec(),
        },
    ]);
    let root = prop::sample::select(vec!["/var/www/html", "/var/www/html/", "/"]);
    (mode, root, extra, any::<bool>()).prop_map(|(mode, root, extra, allow)| CgiContext {
        document_root: root.as_bytes().to_vec(),
        mode,
        server_software: Bytes::from_static(b"corral/test"),
        extra_env: extra
            .into_iter()
            .map(|(n, v)| (Bytes::from(n), Bytes::from(v)))
            .collect(),
        allow_php_ini_params: allow,
    })
}

fn pairs() -> impl Strategy<Value = Vec<(Bytes, Bytes)>> {
    prop::collection::vec((name(), value()), 0..12).prop_map(|list| {
        list.into_iter()
            .map(|(n, v)| (Bytes::from(n), Bytes::from(v)))
            .collect()
    })
}

/// [`pairs`] without a repeated name, with SCRIPT_NAME and DOCUMENT_ROOT sent (after the
/// others when the list had none), values long enough for the 4-byte length form now and then.
fn pairs_sent_once() -> impl Strategy<Value = Vec<(Bytes, Bytes)>> {
    (pairs(), any::<bool>()).prop_map(|(list, long)| {
        let mut seen = std::collections::HashSet::new();
        let mut out: Vec<(Bytes, Bytes)> = list
            .into_iter()
            .filter(|(n, _)| seen.insert(n.clone()))
            .map(|(n, v)| match long && n.starts_with(b"HTTP_X") {
                true => (n, Bytes::from("v".repeat(200))),
                false => (n, v),
            })
            .collect();
        for (n, v) in [("SCRIPT_NAME", "/x"), ("DOCUMENT_ROOT", "/var/www/html")] {
            if !out.iter().any(|(m, _)| m == n.as_bytes()) {
                out.push((Bytes::from(n), Bytes::from(v)));
            }
        }
        out
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(4000))]

    #[test]
    fn one_pass_normalisation_decides_as_the_two_pass_one_did(
        sent in pairs(),
        ctx in context(),
    ) {
        let old = front_oracle::normalize_front_params(sent.clone(), &ctx);
        let new = normalize_front_params(sent.clone(), &ctx);
        prop_assert_eq!(&new, &old);
        let mut front = FrontParams::new();
        for (n, v) in &sent {
            front.push(n, v).unwrap();
        }
        // Unlisted, the usual request takes a shorter way (`only_left_out`): the same
        // refusals.
        if let Err(old) = &old {
            prop_assert_eq!(&normalize_front_with(front.clone(), &ctx, false).unwrap_err(), old);
        }
        if let Ok(old) = old {
            let unlisted = normalize_front_with(front.clone(), &ctx, false).unwrap();
            prop_assert!(unlisted.dropped.is_empty());
            let block = normalize_front(front, &ctx).unwrap().params;
            // Listing what was left out or not, the backend gets the same block.
            prop_assert_eq!(&unlisted.params, &block);
            prop_assert_eq!(block, CgiParams::from_pairs(&old.vars).unwrap());
        }
    }

    /// Lists where no name repeats and SCRIPT_NAME and DOCUMENT_ROOT are sent, so that an
    /// application context often only leaves variables out: the case whose block is the
    /// front server's buffer with the pairs left out cut from it, moved down in place.
    #[test]
    fn variables_only_left_out_give_the_block_the_oracle_encodes(
        sent in pairs_sent_once(),
        ctx in context(),
    ) {
        let old = front_oracle::normalize_front_params(sent.clone(), &ctx);
        let mut front = FrontParams::new();
        for (n, v) in &sent {
            front.push(n, v).unwrap();
        }
        let unlisted = normalize_front_with(front.clone(), &ctx, false);
        match (normalize_front(front, &ctx), old) {
            (Ok(new), Ok(old)) => {
                let want = CgiParams::from_pairs(&old.vars).unwrap();
                prop_assert_eq!(&new.params, &want);
                prop_assert_eq!(new.dropped, old.dropped);
                prop_assert_eq!(unlisted.unwrap().params, want);
            }
            (Err(new), Err(old)) => {
                prop_assert_eq!(&new, &old);
                prop_assert_eq!(unlisted.unwrap_err(), old);
            }
            (new, old) => prop_assert!(false, "{:?} against {:?}", new, old),
        }
    }

    /// The FastCGI front's collector indexes most pairs in one run over the buffer
    /// (`FrontParams::index_short_run`), the others one by one: fed the encoded pairs in
    /// any chunking, it ends with the parameters pushing them one by one gives, and so with
    /// the oracle's decision.
    #[test]
    fn the_collector_indexes_as_pairs_pushed_one_by_one(
        sent in pairs(),
        long in prop::option::of(any::<prop::sample::Index>()),
        cuts in prop::collection::vec(any::<prop::sample::Index>(), 0..6),
        ctx in context(),
    ) {
        let mut sent = sent;
        // Now and then a value in the four-byte length form, which ends a run.
        if let (Some(i), false) = (long, sent.is_empty()) {
            let at = i.index(sent.len());
            sent[at].1 = Bytes::from("/".repeat(200));
        }
        let mut pushed = FrontParams::new();
        for (n, v) in &sent {
            pushed.push(n, v).unwrap();
        }
        let wire = pushed.encoded().to_vec();
        let mut points: Vec<usize> = cuts.iter().map(|c| c.index(wire.len() + 1)).collect();
        points.extend([0, wire.len()]);
        points.sort_unstable();
        let mut collector = crate::fastcgi::FrontParamsDecoder::new(&crate::Limits::DEFAULT);
        for w in points.windows(2) {
            collector.push(&wire[w[0]..w[1]]).unwrap();
        }
        let collected = collector.finish().unwrap();
        prop_assert_eq!(&collected, &pushed);
        let old = front_oracle::normalize_front_params(sent.clone(), &ctx);
        match (normalize_front(collected, &ctx), old) {
            (Ok(new), Ok(old)) => {
                prop_assert_eq!(new.params, CgiParams::from_pairs(&old.vars).unwrap());
            }
            (Err(new), Err(old)) => prop_assert_eq!(new, old),
            (new, old) => prop_assert!(false, "{:?} against {:?}", new, old),
        }
    }

    /// A context prepared when the router is built is not checked again per request: the
    /// same block or the same refusal as checking it, for usable contexts and unusable ones
    /// (a bad root, a bad extra variable).
    #[test]
    fn a_prepared_context_normalises_as_the_context_checked_per_request(
        sent in pairs(),
        ctx in context(),
        root in prop::sample::select(vec![None, Some("relative"), Some("/a/../b"), Some("/a//b")]),
    ) {
        let mut ctx = ctx;
        if let Some(root) = root {
            ctx.document_root = root.as_bytes().to_vec();
        }
        let mut front = FrontParams::new();
        for (n, v) in &sent {
            front.push(n, v).unwrap();
        }
        let prepared = super::PreparedContext::new(ctx.clone());
        for listed in [false, true] {
            prop_assert_eq!(
                normalize_front_prepared(front.clone(), &prepared, listed),
                normalize_front_with(front.clone(), &ctx, listed)
            );
        }
    }

    #[test]
    fn known_names_read_the_first_value_sent(sent in pairs()) {
        let mut front = FrontParams::new();
        for (n, v) in &sent {
            front.push(n, v).unwrap();
        }
        for i in 0..16 {
            let k = Known::from_index(i).unwrap();
            let searched = sent.iter().find(|(n, _)| n == k.name()).map(|(_, v)| &v[..]);
            prop_assert_eq!(front.first(k), searched);
            prop_assert_eq!(front.get(k.name()), searched);
        }
        let got: Vec<(&[u8], &[u8])> = front.iter().collect();
        let want: Vec<(&[u8], &[u8])> = sent.iter().map(|(n, v)| (&n[..], &v[..])).collect();
        prop_assert_eq!(got, want);
    }
}

#[test]
fn nginx_parameters_for_a_script_in_the_root_become_the_block_unchanged() {
    let ctx = CgiContext {
        document_root: b"/var/www/html".to_vec(),
        mode: ScriptMode::Files {
            extensions: vec![b"php".to_vec()],
            index: vec![b"index.php".to_vec()],
        },
        server_software: Bytes::from_static(b"corral/test"),
        extra_env: Vec::new(),
        allow_php_ini_params: false,
    };
    let mut front = FrontParams::new();
    for (n, v) in [
        ("SCRIPT_FILENAME", "/var/www/html/index.php"),
        ("QUERY_STRING", "x=1"),
        ("SCRIPT_NAME", "/index.php"),
        ("DOCUMENT_ROOT", "/var/www/html"),
    ] {
        front.push(n.as_bytes(), v.as_bytes()).unwrap();
    }
    let sent = front.encoded().to_vec();
    let unlisted = normalize_front_with(front.clone(), &ctx, false).unwrap();
    assert_eq!(unlisted.params.encoded(), &sent[..]);
    let out = normalize_front(front.clone(), &ctx).unwrap();
    assert_eq!(out.params.encoded(), &sent[..]);
    assert!(out.dropped.is_empty());
    // A SCRIPT_FILENAME that is not the script's exact name, or outside the root, takes the
    // general way, or is refused, as before.
    for (filename, ok) in [
        ("/var/www/html/./index.php", true),
        ("/var/www/html/index.php/extra", true),
        ("/var/www/other/index.php", false),
        ("/var/www/html/index.txt", false),
    ] {
        let mut other = FrontParams::new();
        for (n, v) in front.iter() {
            let v = if n == b"SCRIPT_FILENAME" {
                filename.as_bytes()
            } else {
                v
            };
            other.push(n, v).unwrap();
        }
        let quick = normalize_front_with(other.clone(), &ctx, false);
        let general = normalize_front(other, &ctx);
        assert_eq!(quick.is_ok(), ok, "{filename}");
        assert_eq!(
            quick.map(|v| v.params),
            general.map(|v| v.params),
            "{filename}"
        );
    }
    // An empty PATH_INFO is left out either way.
    front.push(b"PATH_INFO", b"").unwrap();
    let quick = normalize_front_with(front.clone(), &ctx, false).unwrap();
    assert_eq!(quick.params.encoded(), &sent[..]);
    assert_eq!(quick.params, normalize_front(front, &ctx).unwrap().params);
}

/// nginx's `fastcgi.conf` order (SCRIPT_FILENAME first) for an application context, with
/// HTTP_PROXY in the middle and PHP_VALUE last: the three are left out and every other pair
/// (one with a value in the 4-byte length form) is moved down in the sent buffer, giving the
/// block that encoding the kept variables anew gives.
#[test]
fn an_application_context_cuts_the_left_out_pairs_from_the_sent_buffer() {
    let ctx = CgiContext {
        document_root: b"/".to_vec(),
        mode: ScriptMode::App {
            mount: b"".to_vec(),
        },
        server_software: Bytes::from_static(b"corral/test"),
        extra_env: Vec::new(),
        allow_php_ini_params: false,
    };
    let long = "a".repeat(300);
    let sent = [
        ("SCRIPT_FILENAME", "/usr/share/nginx/html/x"),
        ("QUERY_STRING", ""),
        ("REQUEST_METHOD", "GET"),
        ("SCRIPT_NAME", "/x"),
        ("HTTP_PROXY", "http://evil"),
        ("HTTP_USER_AGENT", long.as_str()),
        ("DOCUMENT_ROOT", "/usr/share/nginx/html"),
        ("HTTP_HOST", "localhost"),
        ("PHP_VALUE", "auto_prepend_file=/tmp/x"),
    ];
    let mut front = FrontParams::new();
    for (n, v) in sent {
        front.push(n.as_bytes(), v.as_bytes()).unwrap();
    }
    let unlisted = normalize_front_with(front.clone(), &ctx, false).unwrap();
    let out = normalize_front(front, &ctx).unwrap();
    let kept: Vec<(Bytes, Bytes)> = sent
        .iter()
        .filter(|(n, _)| !matches!(*n, "SCRIPT_FILENAME" | "HTTP_PROXY" | "PHP_VALUE"))
        .map(|(n, v)| (Bytes::from(*n), Bytes::copy_from_slice(v.as_bytes())))
        .collect();
    assert_eq!(out.params, CgiParams::from_pairs(&kept).unwrap());
    assert_eq!(unlisted.params, out.params);
    // The names dropped whatever the context first, as sent; then the context's own drop.
    let dropped: Vec<&[u8]> = out.dropped.iter().map(|d| &d.name[..]).collect();
    assert_eq!(
        dropped,
        [
            &b"HTTP_PROXY"[..],
            &b"PHP_VALUE"[..],
            &b"SCRIPT_FILENAME"[..]
        ]
    );
}

#[test]
fn known_names_are_recognised_exactly() {
    for i in 0..16 {
        let k = Known::from_index(i).unwrap();
        let name = k.name();
        assert_eq!(Known::of(name), Some(k), "{}", name.escape_ascii());
        // Only the whole name, byte for byte: a near miss (case, one byte, length) is another.
        let mut last = name.to_vec();
        *last.last_mut().unwrap() ^= 0x20;
        assert_eq!(Known::of(&last), None, "{}", last.escape_ascii());
        let mut middle = name.to_vec();
        middle[name.len() / 2] = b'X';
        assert_eq!(Known::of(&middle), None, "{}", middle.escape_ascii());
        assert_eq!(Known::of(&name.to_ascii_lowercase()), None);
        assert_eq!(Known::of(&name[..name.len() - 1]), None);
        assert_eq!(Known::of(&[name, b"X"].concat()), None);
    }
    // nginx's other names share a length and first bytes with known ones: not known.
    for other in [
        "SERVER_SOFTWARE",
        "SERVER_PORT",
        "REQUEST_SCHEME",
        "HTTP_ACCEPT",
        "",
    ] {
        assert_eq!(Known::of(other.as_bytes()), None, "{other}");
    }
}

#[test]
fn a_pair_with_a_forbidden_byte_in_a_short_value_is_refused() {
    for bad in [&b"\r"[..], b"a\nb", b"GET\0"] {
        let mut front = FrontParams::new();
        front.push(b"REQUEST_METHOD", b"GET").unwrap();
        front.push(b"HTTP_X_A", bad).unwrap();
        let err = front.bad();
        assert!(
            matches!(err, Some(super::CgiError::ForbiddenByte { field, .. }) if field == "HTTP_X_A"),
            "{err:?}"
        );
    }
}

/// Every set of known pairs left out of a list, wherever they lie: the block is the other
/// pairs in order, whichever way the kept ones were moved (down to the buffer's start, or up
/// to its end when that moves fewer bytes), and more pairs appended to it follow them.
#[test]
fn pairs_left_out_anywhere_leave_the_others_in_order() {
    let sent: [(&[u8], &[u8]); 7] = [
        (b"SCRIPT_FILENAME", b"/srv/app/index.php"),
        (
            b"APP_A",
            b"a long value that makes the stretch after it the larger one",
        ),
        (b"PATH_INFO", b""),
        (b"HTTP_PROXY", b"http://proxy"),
        (b"APP_B", b"b"),
        (b"PHP_VALUE", b"x=1"),
        (b"QUERY_STRING", b"q=1"),
    ];
    let known: Vec<usize> = (0..sent.len())
        .filter(|&i| Known::of(sent[i].0).is_some())
        .collect();
    assert_eq!(known.len(), 5);
    for mask in 0u32..1 << known.len() {
        let mut front = FrontParams::new();
        for (n, v) in sent {
            front.push(n, v).unwrap();
        }
        let mut removed = 0u16;
        let mut out = vec![false; sent.len()];
        for (bit, &i) in known.iter().enumerate() {
            if mask & 1 << bit != 0 {
                removed |= 1 << (Known::of(sent[i].0).unwrap() as u32);
                out[i] = true;
            }
        }
        let mut block = front.into_params_without(removed).unwrap();
        let kept: Vec<(&[u8], &[u8])> = (0..sent.len())
            .filter(|&i| !out[i])
            .map(|i| sent[i])
            .collect();
        assert_eq!(
            block,
            CgiParams::from_pairs(&kept).unwrap(),
            "mask {mask:#b}"
        );
        assert_eq!(block.len(), kept.len());
        block.push(b"LAST", b"1").unwrap();
        assert_eq!(block.iter().last(), Some((&b"LAST"[..], &b"1"[..])));
        assert_eq!(block.iter().count(), kept.len() + 1);
    }
}
