#![no_main]
//! Fuzzes CGI variable construction, both from an HTTP request and from front-server
//! parameters: never panic, and whatever is accepted keeps the safety invariants (no NUL, CR
//! or LF in any value, every name once, PATH_INFO a suffix of DOCUMENT_URI, SCRIPT_FILENAME
//! inside the root with no `..`, no HTTP_PROXY or PHP_VALUE).
//!
//! Input: fields separated by 0xFF; the first field is the request target (and, for the front
//! path, the first parameter name), the rest alternate header names and values.

use bytes::Bytes;
use corral_protocols::cgi::{
    build_cgi_vars, normalize_front_params, CgiContext, CgiRequest, CgiVars, ScriptMode,
};
use corral_protocols::Limits;
use libfuzzer_sys::fuzz_target;

const ROOT: &[u8] = b"/srv/www";

fn contexts() -> [CgiContext; 2] {
    let files = CgiContext {
        document_root: ROOT.to_vec(),
        mode: ScriptMode::Files {
            extensions: vec![b"php".to_vec()],
            index: vec![b"index.php".to_vec()],
        },
        server_software: Bytes::from_static(b"corral"),
        extra_env: Vec::new(),
        allow_php_ini_params: false,
    };
    let app = CgiContext {
        mode: ScriptMode::App {
            mount: b"/app".to_vec(),
        },
        ..files.clone()
    };
    [files, app]
}

fn check(vars: &CgiVars, ctx: &CgiContext) {
    for (name, value) in &vars.vars {
        assert!(
            !value.iter().any(|&c| matches!(c, 0 | b'\r' | b'\n')),
            "{name:?} = {value:?}"
        );
        assert_eq!(
            vars.vars.iter().filter(|(n, _)| n == name).count(),
            1,
            "{name:?} twice"
        );
    }
    assert!(vars.get(b"HTTP_PROXY").is_none());
    assert!(vars.get(b"PHP_VALUE").is_none() && vars.get(b"PHP_ADMIN_VALUE").is_none());
    if let ScriptMode::Files { .. } = ctx.mode {
        let filename = vars
            .get(b"SCRIPT_FILENAME")
            .expect("files mode always has SCRIPT_FILENAME");
        assert!(filename.starts_with(b"/srv/www/"), "{filename:?}");
        assert!(
            !filename
                .split(|&c| c == b'/')
                .any(|s| s == b".." || s == b"."),
            "{filename:?}"
        );
        assert!(filename.ends_with(b".php"), "{filename:?}");
    }
}

fuzz_target!(|data: &[u8]| {
    let fields: Vec<&[u8]> = data.split(|&c| c == 0xff).collect();
    let Some((&target, rest)) = fields.split_first() else {
        return;
    };
    let headers: Vec<(&[u8], &[u8])> = rest
        .chunks(2)
        .map(|p| (p[0], p.get(1).copied().unwrap_or_default()))
        .collect();
    for ctx in contexts() {
        let req = CgiRequest {
            method: b"GET",
            target,
            protocol: b"HTTP/1.1",
            headers: &headers,
            body_length: None,
            remote_addr: b"192.0.2.1",
            remote_port: Some(1),
            server_addr: b"192.0.2.2",
            server_port: Some(2),
            server_name: b"h",
            https: false,
        };
        if let Ok(vars) = build_cgi_vars(&req, &ctx, &Limits::DEFAULT) {
            check(&vars, &ctx);
            let uri = vars.get(b"DOCUMENT_URI").unwrap();
            // An empty PATH_INFO is left out for scripts (CVE-2019-11043): absent is empty.
            let path_info = vars.get(b"PATH_INFO").map_or(&b""[..], |p| &p[..]);
            assert!(uri.ends_with(path_info));
            assert!(uri.starts_with(vars.get(b"SCRIPT_NAME").unwrap()));
        }
        let params = fields.chunks(2).map(|p| {
            (
                Bytes::copy_from_slice(p[0]),
                Bytes::copy_from_slice(p.get(1).copied().unwrap_or_default()),
            )
        });
        if let Ok(vars) = normalize_front_params(params, &ctx) {
            check(&vars, &ctx);
        }
    }
});
