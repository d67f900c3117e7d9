//! The front-parameter clean-up as it was before `front.rs` worked on indexed pairs
//! (`FrontParams`), two passes over a vector of owned pairs searched by name: kept, for tests
//! only, as the oracle `front_tests.rs` holds the one-pass version to. Not used by corral.
//!
//! Its original description:
//!
//! Front servers differ: Apache's mod_proxy_fcgi prefixes SCRIPT_FILENAME with
//! `proxy:fcgi://host:port` (php-fpm strips it, php bugs 54152 and 62172), nginx's `scgi_pass`
//! sends neither SCRIPT_NAME nor SCRIPT_FILENAME, some fronts pass the client's `Proxy`
//! header on as HTTP_PROXY, and anyone who can reach a FastCGI socket can send PHP_VALUE.
//! This module drops what must not pass, derives what is missing, and holds SCRIPT_FILENAME to
//! the same rules as [`super::build_cgi_vars`]: inside the context's root, no `..`, an allowed
//! extension, no NUL, CR or LF.

use bytes::Bytes;

use super::normal::{check_decoded, normalize, percent_decode};
use super::path::{
    check_context, has_hidden_segment, root_display, root_prefix, script_end, split_decoded,
};
use super::{
    has_nul_cr_lf, snippet, CgiContext, CgiError, CgiVars, DropReason, Dropped, ScriptMode,
};

/// `CgiVars::set` as it was: `name` set to `value`, in place if it exists, appended otherwise.
trait Set {
    fn set(&mut self, name: &[u8], value: Bytes);
}

impl Set for CgiVars {
    fn set(&mut self, name: &[u8], value: Bytes) {
        match self.vars.iter_mut().find(|(n, _)| n == name) {
            Some(slot) => slot.1 = value,
            None => self.vars.push((Bytes::copy_from_slice(name), value)),
        }
    }
}

/// Prefixes Apache's mod_proxy_fcgi and mod_proxy_balancer put before SCRIPT_FILENAME.
/// mod_proxy_scgi sends `proxy:scgi://host/...` the same way.
const APACHE_PREFIXES: [&[u8]; 3] = [b"proxy:fcgi://", b"proxy:scgi://", b"proxy:balancer://"];

/// Filters and completes the parameters a front server sent, in their order.
///
/// - HTTP_PROXY and CORRAL_READY_PROBE (corral's own probe of its launchers) are dropped;
///   PHP_VALUE and PHP_ADMIN_VALUE are dropped unless
///   [`CgiContext::allow_php_ini_params`]; a repeated name keeps its last value (as php-fpm
///   does) and is reported. Every drop is listed in [`CgiVars::dropped`].
/// - A name that is empty or holds NUL, CR, LF or `=`, or a value with NUL, CR or LF, is an
///   error: no environment can carry it faithfully.
/// - Files mode: SCRIPT_FILENAME loses an Apache `proxy:fcgi://host[:port]` prefix and any
///   `?query`, must lie inside the document root with no `..`, and is cut after the first
///   segment with an allowed extension (the rest becomes PATH_INFO when the front sent none).
///   Without SCRIPT_FILENAME, the script is derived from SCRIPT_NAME, DOCUMENT_URI or
///   REQUEST_URI (first present) exactly as for an HTTP request.
/// - App mode: SCRIPT_NAME and PATH_INFO are derived from DOCUMENT_URI or REQUEST_URI when
///   SCRIPT_NAME is missing.
/// - DOCUMENT_ROOT is set to the context's root when missing.
pub(super) fn normalize_front_params(
    params: impl IntoIterator<Item = (Bytes, Bytes)>,
    ctx: &CgiContext,
) -> Result<CgiVars, CgiError> {
    check_context(ctx)?;
    let params = params.into_iter();
    let mut out = CgiVars {
        // What the front server sent, and room for what is derived or added below.
        vars: Vec::with_capacity(params.size_hint().0 + ctx.extra_env.len() + 4),
        dropped: Vec::new(),
    };
    // One bit per (length, first byte, last byte) class of the names kept so far: a name
    // whose bit is clear cannot be a duplicate, which spares the scan for nearly every one.
    let mut seen: u64 = 0;
    let class = |n: &[u8]| {
        let (first, last) = (n.first().copied(), n.last().copied());
        let h =
            n.len() ^ usize::from(first.unwrap_or(0)) << 2 ^ usize::from(last.unwrap_or(0)) << 4;
        1u64 << (h % 64)
    };
    for (name, value) in params {
        if name.is_empty() || name.contains(&b'=') || has_nul_cr_lf(&name) {
            return Err(CgiError::InvalidParamName {
                name: snippet(&name),
            });
        }
        if has_nul_cr_lf(&value) {
            return Err(CgiError::ForbiddenByte {
                field: String::from_utf8_lossy(&name).into_owned(),
                value: snippet(&value),
            });
        }
        let reason = match &name[..] {
            b"HTTP_PROXY" => DropReason::Httpoxy,
            b"CORRAL_READY_PROBE" => DropReason::Reserved,
            b"PHP_VALUE" | b"PHP_ADMIN_VALUE" if !ctx.allow_php_ini_params => DropReason::PhpIni,
            _ if seen & class(&name) != 0 && out.get(&name).is_some() => {
                out.set(&name, value);
                DropReason::Duplicate
            }
            _ => {
                seen |= class(&name);
                out.vars.push((name, value));
                continue;
            }
        };
        out.dropped.push(Dropped { name, reason });
    }
    match &ctx.mode {
        ScriptMode::Files { extensions, .. } => match out.get(b"SCRIPT_FILENAME").cloned() {
            Some(filename) => {
                fix_script_filename(&mut out, &filename, &ctx.document_root, extensions)?
            }
            None => derive_script(&mut out, ctx, true)?,
        },
        ScriptMode::App { .. } => {
            // An application context has no document root, so nothing can check a script
            // path: a SCRIPT_FILENAME or PATH_TRANSLATED from the front server would reach a
            // PHP backend unchecked (php-cgi runs whatever file it names). They are dropped.
            for name in [&b"SCRIPT_FILENAME"[..], b"PATH_TRANSLATED"] {
                if let Some(i) = out.vars.iter().position(|(n, _)| n == name) {
                    let (name, _) = out.vars.remove(i);
                    out.dropped.push(Dropped {
                        name,
                        reason: DropReason::NoRoot,
                    });
                }
            }
            if out.get(b"SCRIPT_NAME").is_none() {
                derive_script(&mut out, ctx, false)?
            }
        }
    }
    if matches!(ctx.mode, ScriptMode::Files { .. }) {
        // As for an HTTP request: a script's empty PATH_INFO is left out, since an empty one
        // is what php-cgi's PATH_INFO arithmetic trips on (CVE-2019-11043).
        if let Some(i) = out
            .vars
            .iter()
            .position(|(n, v)| n == &b"PATH_INFO"[..] && v.is_empty())
        {
            out.vars.remove(i);
        }
    }
    if out.get(b"DOCUMENT_ROOT").is_none() {
        out.set(
            b"DOCUMENT_ROOT",
            Bytes::from(root_display(&ctx.document_root)),
        );
    }
    // The context's own variables come last and win, on every front alike.
    for (name, value) in &ctx.extra_env {
        if name.is_empty() || name.contains(&b'=') || has_nul_cr_lf(name) || has_nul_cr_lf(value) {
            return Err(CgiError::InvalidContext(
                "an extra variable has an empty name, '=', NUL, CR or LF",
            ));
        }
        out.set(name, value.clone());
    }
    Ok(out)
}

/// Checks and rewrites a SCRIPT_FILENAME the front server sent (files mode).
fn fix_script_filename(
    out: &mut CgiVars,
    filename: &[u8],
    root: &[u8],
    extensions: &[Vec<u8>],
) -> Result<(), CgiError> {
    let path = strip_apache_prefix(filename);
    let outside = || CgiError::OutsideRoot {
        path: snippet(path),
        root: snippet(&root_display(root)),
        front_root: out.get(b"DOCUMENT_ROOT").map(|r| snippet(r)),
    };
    if path.first() != Some(&b'/') {
        return Err(outside());
    }
    check_decoded(path)?;
    let norm = normalize(path, false)?;
    let prefix = root_prefix(root);
    let rel = norm
        .strip_prefix(prefix)
        .filter(|r| r.first() == Some(&b'/'))
        .ok_or_else(outside)?;
    if has_hidden_segment(rel) {
        return Err(CgiError::Hidden {
            path: snippet(&norm),
        });
    }
    let end = script_end(rel, extensions).ok_or_else(|| CgiError::NotAScript {
        path: snippet(&norm),
    })?;
    let (script_name, tail) = rel.split_at(end.min(rel.len()));
    let mut script_filename = prefix.to_vec();
    script_filename.extend_from_slice(script_name);
    out.set(b"SCRIPT_FILENAME", Bytes::from(script_filename));
    if out.get(b"SCRIPT_NAME").is_none() {
        out.set(b"SCRIPT_NAME", Bytes::copy_from_slice(script_name));
    }
    if !tail.is_empty() && out.get(b"PATH_INFO").is_none_or(|p| p.is_empty()) {
        set_path_info(out, tail, root);
    }
    Ok(())
}

/// Derives SCRIPT_NAME, PATH_INFO and (files mode) SCRIPT_FILENAME from the request path the
/// front server sent.
fn derive_script(out: &mut CgiVars, ctx: &CgiContext, files: bool) -> Result<(), CgiError> {
    let decoded = if let Some(name) = out.get(b"SCRIPT_NAME").filter(|_| files) {
        name.to_vec()
    } else if let Some(uri) = out.get(b"DOCUMENT_URI") {
        uri.to_vec()
    } else if let Some(uri) = out.get(b"REQUEST_URI") {
        let path = uri.split(|&c| c == b'?').next().unwrap_or_default();
        if path.first() != Some(&b'/') {
            return Err(CgiError::TargetForm {
                target: snippet(uri),
            });
        }
        percent_decode(path)?
    } else {
        return Err(CgiError::NoScriptInfo);
    };
    if decoded.first() != Some(&b'/') {
        return Err(CgiError::TargetForm {
            target: snippet(&decoded),
        });
    }
    let script = split_decoded(&decoded, ctx)?;
    if let Some(filename) = script.script_filename {
        out.set(b"SCRIPT_FILENAME", Bytes::from(filename));
    }
    out.set(b"SCRIPT_NAME", Bytes::from(script.script_name));
    if out.get(b"PATH_INFO").is_none_or(|p| p.is_empty()) {
        if files && !script.path_info.is_empty() {
            set_path_info(out, &script.path_info, &ctx.document_root);
        } else {
            out.set(b"PATH_INFO", Bytes::from(script.path_info));
        }
    }
    Ok(())
}

/// Sets PATH_INFO, and PATH_TRANSLATED (root + PATH_INFO) when the front sent none.
fn set_path_info(out: &mut CgiVars, path_info: &[u8], root: &[u8]) {
    out.set(b"PATH_INFO", Bytes::copy_from_slice(path_info));
    if out.get(b"PATH_TRANSLATED").is_none() {
        let mut translated = root_prefix(root).to_vec();
        translated.extend_from_slice(path_info);
        out.set(b"PATH_TRANSLATED", Bytes::from(translated));
    }
}

/// `proxy:fcgi://host:port/var/www/x.php?q` → `/var/www/x.php`; other values unchanged.
fn strip_apache_prefix(filename: &[u8]) -> &[u8] {
    let Some(rest) = APACHE_PREFIXES.iter().find_map(|p| {
        let head = filename.get(..p.len())?;
        head.eq_ignore_ascii_case(p)
            .then(|| filename.get(p.len()..))
            .flatten()
    }) else {
        return filename;
    };
    let path = rest
        .iter()
        .position(|&c| c == b'/')
        .and_then(|i| rest.get(i..))
        .unwrap_or_default();
    path.split(|&c| c == b'?').next().unwrap_or_default()
}
