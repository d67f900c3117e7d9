//! Clean-up of the CGI variables a front server sends when corral is the FastCGI or SCGI
//! responder, so the backend sees the same clean variables whichever front is used.
//!
//! Front servers differ: Apache's mod_proxy_fcgi prefixes SCRIPT_FILENAME with
//! `proxy:fcgi://host:port` (php-fpm strips it, php bugs 54152 and 62172), nginx's `scgi_pass`
//! sends neither SCRIPT_NAME nor SCRIPT_FILENAME, some fronts pass the client's `Proxy`
//! header on as HTTP_PROXY, and anyone who can reach a FastCGI socket can send PHP_VALUE.
//! This module drops what must not pass, derives what is missing, and holds SCRIPT_FILENAME to
//! the same rules as [`super::build_cgi_vars`]: inside the context's root, no `..`, an allowed
//! extension, no NUL, CR or LF.
//!
//! It works on [`FrontParams`], the pairs as they arrived and indexed once: the variables it
//! reads or rewrites are found by position, what it changes is kept beside the pairs, and the
//! backend's block is written once at the end: it is the front server's own buffer when
//! nothing changed.

use std::borrow::Cow;

use bytes::Bytes;

use super::front_params::{FrontParams, Known, LeftOut};
use super::front_work::{Val, Work};
use super::normal::{checked_is_normal, normalize, percent_decode};
use super::params::CgiParams;
use super::path::{
    check_context, has_hidden_segment, normal_form, root_display, root_prefix, script_end,
    split_normalized, Split,
};
use super::prepared::PreparedContext;
use super::{
    has_nul_cr_lf, snippet, CgiContext, CgiError, CgiVars, DropReason, Dropped, ScriptMode,
};

/// Prefixes Apache's mod_proxy_fcgi and mod_proxy_balancer put before SCRIPT_FILENAME.
/// mod_proxy_scgi sends `proxy:scgi://host/...` the same way.
const APACHE_PREFIXES: [&[u8]; 3] = [b"proxy:fcgi://", b"proxy:scgi://", b"proxy:balancer://"];

/// A front server's variables made ready for the backend.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FrontVars {
    /// The variables, encoded once, in the order a backend should receive them.
    pub params: CgiParams,
    /// What was left out, for logging.
    pub dropped: Vec<Dropped>,
}

/// [`normalize_front`] over owned pairs, returned as owned pairs (for callers that hold
/// the pairs that way, and for tests).
pub fn normalize_front_params(
    params: impl IntoIterator<Item = (Bytes, Bytes)>,
    ctx: &CgiContext,
) -> Result<CgiVars, CgiError> {
    let mut front = FrontParams::new();
    for (name, value) in params {
        front.push(&name, &value)?;
    }
    let out = normalize_front(front, ctx)?;
    Ok(CgiVars {
        vars: out.params.to_pairs(),
        dropped: out.dropped,
    })
}

/// Filters and completes the parameters a front server sent, in their order.
///
/// - HTTP_PROXY and CORRAL_READY_PROBE (corral's own probe of its launchers) are dropped;
///   PHP_VALUE and PHP_ADMIN_VALUE are dropped unless
///   [`CgiContext::allow_php_ini_params`]; a repeated name keeps its last value (as php-fpm
///   does) in the place of its first, and is reported. Every drop is listed in
///   [`FrontVars::dropped`].
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
pub fn normalize_front(params: FrontParams, ctx: &CgiContext) -> Result<FrontVars, CgiError> {
    normalize_front_with(params, ctx, true)
}

/// [`normalize_front`], listing what was left out in [`FrontVars::dropped`] only when
/// `list_dropped` (a caller that logs the list only at debug level asks for it only then:
/// the list is an allocation per request, and a name copied per repeat). What the backend
/// gets is the same either way.
pub fn normalize_front_with(
    params: FrontParams,
    ctx: &CgiContext,
    list_dropped: bool,
) -> Result<FrontVars, CgiError> {
    check_context(ctx)?;
    normalize_checked(params, ctx, list_dropped)
}

/// [`normalize_front_with`] for a context prepared when the router was built: its checks
/// were made then, so a usable one is not checked again per request (an unusable one is, for
/// the same error in the same place).
pub fn normalize_front_prepared(
    params: FrontParams,
    ctx: &PreparedContext,
    list_dropped: bool,
) -> Result<FrontVars, CgiError> {
    if !ctx.usable() {
        check_context(ctx)?;
    }
    normalize_checked(params, ctx, list_dropped)
}

/// [`normalize_front_with`] once the context's own checks have passed.
fn normalize_checked(
    params: FrontParams,
    ctx: &CgiContext,
    list_dropped: bool,
) -> Result<FrontVars, CgiError> {
    if let Some(e) = params.bad() {
        return Err(e.clone());
    }
    if !list_dropped {
        if let Some(removed) = only_left_out(&params, ctx)? {
            let params = match removed {
                0 => params.into_params()?,
                _ => params.into_params_without(removed)?,
            };
            return Ok(FrontVars {
                params,
                dropped: Vec::new(),
            });
        }
    }
    let mut w = Work::new(&params, ctx, list_dropped);
    match &ctx.mode {
        ScriptMode::Files { extensions, .. } => match w.get_cow(Known::ScriptFilename) {
            Some(filename) => fix_script_filename(&mut w, &filename, extensions)?,
            None => derive_script(&mut w, true)?,
        },
        ScriptMode::App { .. } => {
            // An application context has no document root, so nothing can check a script
            // path: a SCRIPT_FILENAME or PATH_TRANSLATED from the front server would reach a
            // PHP backend unchecked (php-cgi runs whatever file it names). They are dropped.
            for k in [Known::ScriptFilename, Known::PathTranslated] {
                if w.get(k).is_some() {
                    w.remove(k);
                    if list_dropped {
                        w.dropped.push(Dropped {
                            name: Bytes::from_static(k.name()),
                            reason: DropReason::NoRoot,
                        });
                    }
                }
            }
            if w.get(Known::ScriptName).is_none() {
                derive_script(&mut w, false)?
            }
        }
    }
    if matches!(ctx.mode, ScriptMode::Files { .. })
        && w.get(Known::PathInfo).is_some_and(|v| v.is_empty())
    {
        // As for an HTTP request: a script's empty PATH_INFO is left out, since an empty one
        // is what php-cgi's PATH_INFO arithmetic trips on (CVE-2019-11043).
        w.remove(Known::PathInfo);
    }
    if w.get(Known::DocumentRoot).is_none() {
        w.set(Known::DocumentRoot, Val::Root);
    }
    // The context's own variables come last and win, on every front alike.
    for (e, (name, value)) in ctx.extra_env.iter().enumerate() {
        if name.is_empty() || name.contains(&b'=') || has_nul_cr_lf(name) || has_nul_cr_lf(value) {
            return Err(CgiError::InvalidContext(
                "an extra variable has an empty name, '=', NUL, CR or LF",
            ));
        }
        w.set_extra(e, name);
    }
    if w.changed {
        if let Some(removed) = w.only_removals() {
            // Only left out (nginx's SCRIPT_FILENAME for an application context): the pairs
            // kept are moved down in the front server's own buffer.
            let dropped = std::mem::take(&mut w.dropped);
            drop(w);
            let params = params.into_params_without(removed)?;
            return Ok(FrontVars { params, dropped });
        }
        let params = w.write()?;
        return Ok(FrontVars {
            params,
            dropped: std::mem::take(&mut w.dropped),
        });
    }
    let dropped = std::mem::take(&mut w.dropped);
    drop(w);
    // Nothing changed: the block is the pairs as sent.
    let params = params.into_params()?;
    Ok(FrontVars { params, dropped })
}

/// A SCRIPT_FILENAME the front server sent (files mode), checked: its normal form and where
/// the script's name ends in it (the rest is a path info).
fn check_script_filename<'v>(
    filename: &'v [u8],
    root: &[u8],
    extensions: &[Vec<u8>],
    front_root: Option<&[u8]>,
) -> Result<(Cow<'v, [u8]>, usize), CgiError> {
    let path = strip_apache_prefix(filename);
    let outside = || CgiError::OutsideRoot {
        path: snippet(path),
        root: snippet(&root_display(root)),
        front_root: front_root.map(snippet),
    };
    if path.first() != Some(&b'/') {
        return Err(outside());
    }
    // What `normalize` would make of a path already in normal form is the path itself.
    let norm = if checked_is_normal(path)? {
        Cow::Borrowed(path)
    } else {
        Cow::Owned(normalize(path, false)?)
    };
    let prefix = root_prefix(root);
    let Some(rel) = norm
        .strip_prefix(prefix)
        .filter(|r| r.first() == Some(&b'/'))
    else {
        return Err(outside());
    };
    if has_hidden_segment(rel) {
        return Err(CgiError::Hidden {
            path: snippet(&norm),
        });
    }
    let end = script_end(rel, extensions).ok_or_else(|| CgiError::NotAScript {
        path: snippet(&norm),
    })?;
    let end = prefix.len() + end.min(rel.len());
    Ok((norm, end))
}

/// Checks and rewrites a SCRIPT_FILENAME the front server sent (files mode).
fn fix_script_filename(
    w: &mut Work<'_>,
    filename: &[u8],
    extensions: &[Vec<u8>],
) -> Result<(), CgiError> {
    let root = &w.ctx.document_root[..];
    let (norm, end) =
        check_script_filename(filename, root, extensions, w.get(Known::DocumentRoot))?;
    let prefix = root_prefix(root);
    let script_filename = norm.get(..end).unwrap_or_default();
    let script_name = script_filename.get(prefix.len()..).unwrap_or_default();
    let tail = norm.get(end..).unwrap_or_default();
    let same = w.get(Known::ScriptFilename) == Some(script_filename);
    if !same {
        w.set(Known::ScriptFilename, Val::Owned(script_filename.to_vec()));
    }
    if w.get(Known::ScriptName).is_none() {
        w.set_owned(Known::ScriptName, script_name.to_vec());
    }
    if !tail.is_empty() && w.get(Known::PathInfo).is_none_or(|p| p.is_empty()) {
        set_path_info(w, tail, root);
    }
    Ok(())
}

/// The usual request of a front server that sent what the context needs (nginx's
/// `fastcgi.conf`: SCRIPT_NAME and DOCUMENT_ROOT, and in files mode a SCRIPT_FILENAME inside
/// the root that names the script exactly), no name twice, every length in its shortest
/// form, for a context without extra variables: per [`Known`] name, whether it is left out
/// (the names never passed on, and in an application context SCRIPT_FILENAME and
/// PATH_TRANSLATED, and in files mode an empty PATH_INFO), nothing else changing. Decided
/// from where the names lie, with the checks [`normalize_front_with`] makes in the same
/// order, without building its [`Work`]. `None`: the general way decides.
fn only_left_out(p: &FrontParams, ctx: &CgiContext) -> Result<Option<LeftOut>, CgiError> {
    if p.repeated() || !p.is_canonical() || !ctx.extra_env.is_empty() {
        return Ok(None);
    }
    let sent = |k: Known| p.first(k);
    if sent(Known::DocumentRoot).is_none() || sent(Known::ScriptName).is_none() {
        return Ok(None);
    }
    let mut removed: LeftOut = 0;
    let mut leave_out = |k: Known| {
        if sent(k).is_some() {
            removed |= 1 << (k as u32);
        }
    };
    leave_out(Known::HttpProxy);
    leave_out(Known::CorralReadyProbe);
    if !ctx.allow_php_ini_params {
        leave_out(Known::PhpValue);
        leave_out(Known::PhpAdminValue);
    }
    match &ctx.mode {
        ScriptMode::App { .. } => {
            leave_out(Known::ScriptFilename);
            leave_out(Known::PathTranslated);
        }
        ScriptMode::Files { extensions, .. } => {
            let Some(filename) = sent(Known::ScriptFilename) else {
                return Ok(None);
            };
            let (norm, end) = check_script_filename(
                filename,
                &ctx.document_root,
                extensions,
                sent(Known::DocumentRoot),
            )?;
            let path_info = sent(Known::PathInfo);
            if norm.get(..end) != Some(filename)
                || (end < norm.len() && path_info.is_none_or(<[u8]>::is_empty))
            {
                return Ok(None);
            }
            if path_info.is_some_and(<[u8]>::is_empty) {
                leave_out(Known::PathInfo);
            }
        }
    }
    Ok(Some(removed))
}

/// Derives SCRIPT_NAME, PATH_INFO and (files mode) SCRIPT_FILENAME from the request path the
/// front server sent.
fn derive_script<'a>(w: &mut Work<'a>, files: bool) -> Result<(), CgiError> {
    let ctx = w.ctx;
    let decoded = if let Some(name) = w.get_cow(Known::ScriptName).filter(|_| files) {
        name
    } else if let Some(uri) = w.get_cow(Known::DocumentUri) {
        uri
    } else if let Some(uri) = w.get(Known::RequestUri) {
        let path = uri.split(|&c| c == b'?').next().unwrap_or_default();
        if path.first() != Some(&b'/') {
            return Err(CgiError::TargetForm {
                target: snippet(uri),
            });
        }
        Cow::Owned(percent_decode(path)?)
    } else {
        return Err(CgiError::NoScriptInfo);
    };
    if decoded.first() != Some(&b'/') {
        return Err(CgiError::TargetForm {
            target: snippet(&decoded),
        });
    }
    // Split where the path lies, normalised in a buffer of its own only when it is not in
    // normal form already; SCRIPT_NAME and PATH_INFO then borrow from the pairs (or the
    // context's mount), when the path was sent in normal form.
    match decoded {
        Cow::Borrowed(sent) => match normal_form(sent)? {
            Cow::Borrowed(norm) => {
                apply_split(w, split_normalized(norm, ctx)?, files, Cow::Borrowed)
            }
            Cow::Owned(norm) => apply_split(w, split_normalized(&norm, ctx)?, files, |b| {
                Cow::Owned(b.to_vec())
            }),
        },
        Cow::Owned(decoded) => {
            let renormalised = match normal_form(&decoded)? {
                Cow::Owned(norm) => Some(norm),
                Cow::Borrowed(_) => None,
            };
            let norm = renormalised.unwrap_or(decoded);
            apply_split(w, split_normalized(&norm, ctx)?, files, |b| {
                Cow::Owned(b.to_vec())
            })
        }
    }
    Ok(())
}

/// Sets what a derived split gives: SCRIPT_FILENAME (files mode), SCRIPT_NAME and PATH_INFO;
/// `lift` makes a value of a part of the split (borrowed when the split borrows from the
/// pairs or the context).
fn apply_split<'a, 'b>(
    w: &mut Work<'a>,
    split: Split<'b>,
    files: bool,
    lift: impl Fn(&'b [u8]) -> Cow<'a, [u8]>,
) {
    if let Some(root) = split.root {
        w.set_owned(
            Known::ScriptFilename,
            [root, split.name, split.index].concat(),
        );
    }
    let script_name = if split.index.is_empty() {
        lift(split.name)
    } else {
        Cow::Owned([split.name, split.index].concat())
    };
    w.set_bytes(Known::ScriptName, script_name);
    if w.get(Known::PathInfo).is_none_or(|p| p.is_empty()) {
        if files && !split.info.is_empty() {
            set_path_info(w, split.info, &w.ctx.document_root);
        } else {
            w.set_bytes(Known::PathInfo, lift(split.info));
        }
    }
}

/// Sets PATH_INFO, and PATH_TRANSLATED (root + PATH_INFO) when the front sent none.
fn set_path_info(w: &mut Work<'_>, path_info: &[u8], root: &[u8]) {
    w.set_owned(Known::PathInfo, path_info.to_vec());
    if w.get(Known::PathTranslated).is_none() {
        let mut translated = root_prefix(root).to_vec();
        translated.extend_from_slice(path_info);
        w.set_owned(Known::PathTranslated, translated);
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
