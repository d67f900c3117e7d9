//! The blocks encoded once (a prepared context, a connection's addresses) against the
//! variables written per request from the same values given as text: over generated
//! requests, contexts and addresses, both give the same block or the same error. And the
//! one-pass header-name scan against the separate questions it answers.
#![allow(clippy::unwrap_used, clippy::indexing_slicing, clippy::panic)]

use bytes::Bytes;
use proptest::prelude::*;

use super::headers::scan_name_for_tests;
use super::{
    encode_cgi_vars, encode_prepared, is_token, parse_request_path, CgiContext, CgiError,
    CgiRequest, PreparedContext, RemoteVars, ScriptMode, ServerVars,
};
use crate::Limits;

/// Header names: the ones the rules treat apart, repeats in other cases, and names that are
/// not tokens or not `[A-Za-z0-9-]`.
const NAMES: &[&str] = &[
    "Host",
    "host",
    "User-Agent",
    "Accept",
    "Cookie",
    "cookie",
    "Connection",
    "Proxy",
    "Content-Type",
    "Content-Length",
    "X_Forwarded",
    "X.Auth",
    "Bad Name",
    "",
    "X-A",
];

const VALUES: &[&str] = &["a", "1", "2", "*/*", "", "x\r", "a b", "\t"];

/// Addresses as a front listener writes them, an empty one (client unknown), and ones a
/// request may not carry.
const ADDRS: &[&str] = &["192.0.2.7", "2001:db8::1", "", "1.2.3.4\n", "a\0"];

const TARGETS: &[&str] = &[
    "/index.php",
    "/a.php/x/y?q=1",
    "/",
    "/app/hello?x",
    "/b.txt",
    "/x/../y.php",
];

fn header() -> impl Strategy<Value = (String, String)> {
    (prop::sample::select(NAMES), prop::sample::select(VALUES))
        .prop_map(|(n, v)| (n.to_owned(), v.to_owned()))
}

fn context() -> impl Strategy<Value = CgiContext> {
    let mode = prop::sample::select(vec![
        ScriptMode::Files {
            extensions: vec![b"php".to_vec()],
            index: vec![b"index.php".to_vec()],
        },
        ScriptMode::App {
            mount: b"/app".to_vec(),
        },
    ]);
    let root = prop::sample::select(vec!["/var/www/html", "/", "relative", "/a/../b"]);
    let extra = prop::sample::select(vec![
        vec![],
        vec![("SERVER_NAME", "pinned")],
        vec![("A=B", "x")],
        vec![("APP_ENV", "prod")],
    ]);
    (mode, root, extra).prop_map(|(mode, root, extra)| CgiContext {
        document_root: root.as_bytes().to_vec(),
        mode,
        server_software: Bytes::from_static(b"corral/test"),
        extra_env: extra
            .into_iter()
            .map(|(n, v)| (Bytes::from(n), Bytes::from(v)))
            .collect(),
        allow_php_ini_params: false,
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(3000))]

    #[test]
    fn encoded_once_is_encoded_per_request(
        ctx in context(),
        target in prop::sample::select(TARGETS),
        // Past 64 headers, the classes are not remembered between the two passes.
        headers in prop::collection::vec(header(), 0..80),
        remote in (prop::sample::select(ADDRS), any::<Option<u16>>()),
        server in (prop::sample::select(ADDRS), any::<Option<u16>>()),
        https in any::<bool>(),
    ) {
        let fields: Vec<(&[u8], &[u8])> =
            headers.iter().map(|(n, v)| (n.as_bytes(), v.as_bytes())).collect();
        let req = CgiRequest {
            method: b"GET",
            target: target.as_bytes(),
            protocol: b"HTTP/1.1",
            headers: &fields,
            body_length: None,
            remote_addr: remote.0.as_bytes(),
            remote_port: remote.1,
            server_addr: server.0.as_bytes(),
            server_port: server.1,
            server_name: b"example.com",
            https,
        };
        let Ok(path) = parse_request_path(req.target) else {
            return Ok(());
        };
        let per_request = encode_cgi_vars(&req, &path, &ctx, &Limits::DEFAULT);
        let prepared = PreparedContext::new(ctx.clone());
        let remote_vars = RemoteVars::new(remote.0.as_bytes(), remote.1);
        let server_vars = ServerVars::new(server.0.as_bytes(), server.1);
        // The text fields the blocks stand for are not read.
        let blank = CgiRequest {
            remote_addr: b"\0unread",
            remote_port: Some(1),
            server_addr: b"\0unread",
            server_port: Some(1),
            ..req
        };
        let once = encode_prepared(
            &blank,
            &path,
            &prepared,
            Some(&remote_vars),
            Some(&server_vars),
            &Limits::DEFAULT,
        );
        prop_assert_eq!(&once, &per_request);
        // Only the server's block, as for a client a trusted proxy names.
        let mixed = CgiRequest { server_addr: b"\0unread", server_port: None, ..req };
        let once = encode_prepared(
            &mixed,
            &path,
            &prepared,
            None,
            Some(&server_vars),
            &Limits::DEFAULT,
        );
        prop_assert_eq!(&once, &per_request);
    }

    #[test]
    fn one_scan_of_a_name_answers_each_question(name in prop::collection::vec(any::<u8>(), 0..12)) {
        let scan = scan_name_for_tests(&name);
        prop_assert_eq!(scan.0, is_token(&name));
        prop_assert_eq!(scan.1, name.contains(&b'_'));
        prop_assert_eq!(
            scan.2,
            name.iter().any(|&c| !(c.is_ascii_alphanumeric() || c == b'-'))
        );
    }
}

#[test]
fn a_bad_address_encoded_at_accept_refuses_every_request_of_the_connection() {
    let ctx = CgiContext {
        document_root: b"/var/www/html".to_vec(),
        mode: ScriptMode::Files {
            extensions: vec![b"php".to_vec()],
            index: vec![],
        },
        server_software: Bytes::from_static(b"corral/test"),
        extra_env: Vec::new(),
        allow_php_ini_params: false,
    };
    let req = CgiRequest {
        method: b"GET",
        target: b"/index.php",
        protocol: b"HTTP/1.1",
        headers: &[],
        body_length: None,
        remote_addr: b"",
        remote_port: None,
        server_addr: b"",
        server_port: None,
        server_name: b"example.com",
        https: false,
    };
    let path = parse_request_path(req.target).unwrap();
    let prepared = PreparedContext::new(ctx);
    let bad = RemoteVars::new(b"192.0.2.7\r\nX: y", Some(1));
    let err = encode_prepared(&req, &path, &prepared, Some(&bad), None, &Limits::DEFAULT);
    assert!(
        matches!(&err, Err(CgiError::ForbiddenByte { field, .. }) if field == "remote address"),
        "{err:?}"
    );
    let bad = ServerVars::new(b"10.0.0.1\n", Some(1));
    let err = encode_prepared(&req, &path, &prepared, None, Some(&bad), &Limits::DEFAULT);
    assert!(
        matches!(&err, Err(CgiError::ForbiddenByte { field, .. }) if field == "server address"),
        "{err:?}"
    );
}

#[test]
fn a_fixed_block_is_what_its_variables_encode_to() {
    use super::encode::{push_no_body, push_protocol, push_redirect_status};
    use super::CgiParams;
    let fixed = super::prepared::fixed().unwrap();
    let pushed = |push: &dyn Fn(&mut CgiParams) -> Result<(), CgiError>| {
        let mut out = CgiParams::default();
        push(&mut out).unwrap();
        out
    };
    let prepared = PreparedContext::new(CgiContext {
        document_root: b"/var/www/html".to_vec(),
        mode: ScriptMode::App {
            mount: b"/app".to_vec(),
        },
        server_software: Bytes::from_static(b"corral/test"),
        extra_env: Vec::new(),
        allow_php_ini_params: false,
    });
    for version in [&b"HTTP/1.1"[..], b"HTTP/1.0"] {
        for https in [false, true] {
            let mut expected = prepared.root().clone();
            expected.append(&pushed(&|out| push_protocol(out, version, https)));
            assert_eq!(prepared.root_and_protocol(version, https), Some(&expected));
        }
    }
    assert_eq!(prepared.root_and_protocol(b"HTTP/2.0", false), None);
    assert_eq!(fixed.no_body(), &pushed(&push_no_body));
    assert_eq!(fixed.redirect_status(), &pushed(&push_redirect_status));
}
