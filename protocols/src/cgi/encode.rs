//! Writes one request's CGI variables ([`encode_cgi_vars`], [`encode_prepared`]): nginx's
//! `fastcgi_params` order, then the `HTTP_*` headers, then the context's extra variables,
//! straight into the block a backend codec sends. The variables that are the same for every
//! request of a context or of a connection are written by the same functions into blocks
//! prepared once (`prepared.rs`) and appended as bytes.

use super::params::CgiParams;
use super::prepared::{fixed, PreparedContext, RemoteVars, ServerVars};
use super::{
    check_field, has_nul_cr_lf, headers, is_token, path, snippet, CgiContext, CgiError, CgiRequest,
    RequestPath, GATEWAY_INTERFACE,
};
use crate::Limits;

/// The variables of [`build_cgi_vars_for`](super::build_cgi_vars_for), encoded once into a
/// [`CgiParams`] (what the request path sends); [`dropped_headers`](super::dropped_headers)
/// names the headers left out, for a log. The one place the rules live: that owned form is
/// a view of this one, and [`encode_prepared`] is this one with the context's and the
/// connection's constant blocks already encoded.
pub fn encode_cgi_vars(
    req: &CgiRequest<'_>,
    path: &RequestPath<'_>,
    ctx: &CgiContext,
    limits: &Limits,
) -> Result<CgiParams, CgiError> {
    let prepared = PreparedContext::new(ctx.clone());
    encode_prepared(req, path, &prepared, None, None, limits)
}

/// [`encode_cgi_vars`] for a context prepared at configuration time, with the connection's
/// address variables encoded at accept time: `remote` stands for `req.remote_addr` and
/// `req.remote_port`, `server` for `req.server_addr` and `req.server_port` (those fields are
/// then not read). `None` takes them from `req`, as for a client a trusted proxy named.
pub fn encode_prepared(
    req: &CgiRequest<'_>,
    path: &RequestPath<'_>,
    prepared: &PreparedContext,
    remote: Option<&RemoteVars>,
    server: Option<&ServerVars>,
    limits: &Limits,
) -> Result<CgiParams, CgiError> {
    let ctx = prepared.context();
    if !is_token(req.method) {
        return Err(CgiError::InvalidMethod {
            method: snippet(req.method),
        });
    }
    check_field("protocol", req.protocol)?;
    // An address encoded at accept time was checked then: its error comes out here, where
    // the same address given as text is checked.
    let remote = match remote {
        Some(vars) => Some(vars.encoded()?),
        None => check_field("remote address", req.remote_addr).map(|()| None)?,
    };
    let server = match server {
        Some(vars) => Some(vars.encoded()?),
        None => check_field("server address", req.server_addr).map(|()| None)?,
    };
    check_field("server name", req.server_name)?;
    prepared.checked()?;
    let norm = path::normal_form(&path.normalized)?;
    let script = path::split_normalized(&norm, ctx)?;
    let headers = headers::check_headers(req.headers, req.body_length)?;
    let body = &headers.body;

    let header_bytes: usize = req.headers.iter().map(|(n, v)| n.len() + v.len() + 8).sum();
    let mut out = CgiParams::with_capacity(
        512 + header_bytes
            + 2 * path.path_and_query.len()
            + 2 * ctx.document_root.len()
            + ctx.server_software.len(),
    );
    let mut length_text = [0u8; 20];
    // GATEWAY_INTERFACE, SERVER_SOFTWARE.
    out.append(prepared.head());
    out.push(b"QUERY_STRING", path.query)?;
    out.push(b"REQUEST_METHOD", req.method)?;
    let fixed = fixed();
    match (fixed, body.content_type, body.content_length) {
        (Some(fixed), None, None) => out.append(fixed.no_body()),
        _ => {
            out.push(b"CONTENT_TYPE", body.content_type.unwrap_or_default())?;
            out.push(
                b"CONTENT_LENGTH",
                body.content_length
                    .map(|n| decimal(n, &mut length_text))
                    .unwrap_or_default(),
            )?;
        }
    }
    let path::Split {
        name,
        index,
        info: path_info,
        root,
    } = script;
    let is_script = root.is_some();
    out.push_joined(b"SCRIPT_NAME", &[name, index], b"")?;
    if let Some(root) = root {
        out.push_joined(b"SCRIPT_FILENAME", &[root, name, index], b"")?;
    }
    // A script's empty PATH_INFO is left out (as nginx's fastcgi_params does): an empty one
    // is what feeds php-cgi's PATH_INFO arithmetic (CVE-2019-11043). An application mount
    // keeps it, empty or not (PEP 3333, Rack).
    if !path_info.is_empty() || !is_script {
        out.push(b"PATH_INFO", path_info)?;
    }
    // PATH_TRANSLATED maps PATH_INFO under the document root (RFC 3875 §4.1.6); an app has
    // no document tree to map it into.
    if let Some(root) = root.filter(|_| !path_info.is_empty()) {
        out.push_joined(b"PATH_TRANSLATED", &[root, path_info], b"")?;
    }
    out.push(b"REQUEST_URI", path.path_and_query)?;
    // DOCUMENT_URI: SCRIPT_NAME then PATH_INFO (the normalised path, with the index file
    // when one was chosen), `/` when both are empty.
    if name.is_empty() && index.is_empty() && path_info.is_empty() {
        out.push(b"DOCUMENT_URI", b"/")?;
    } else {
        out.push_joined(b"DOCUMENT_URI", &[name, index, path_info], b"")?;
    }
    match prepared.root_and_protocol(req.protocol, req.https) {
        Some(block) => out.append(block),
        None => {
            out.append(prepared.root());
            push_protocol(&mut out, req.protocol, req.https)?;
        }
    }
    match remote {
        Some(vars) => out.append(vars),
        None => push_remote(&mut out, req.remote_addr, req.remote_port)?,
    }
    match server {
        Some(vars) => out.append(vars),
        None => push_server(&mut out, req.server_addr, req.server_port)?,
    }
    out.push(b"SERVER_NAME", req.server_name)?;
    match fixed {
        Some(fixed) => out.append(fixed.redirect_status()),
        None => push_redirect_status(&mut out)?,
    }
    headers::push_http_vars(req.headers, &headers, &mut out)?;
    // Checked once, when the context was prepared.
    for (name, value) in &ctx.extra_env {
        out.set(name, value)?;
    }
    check_limits(&out, limits)?;
    Ok(out)
}

/// GATEWAY_INTERFACE and SERVER_SOFTWARE, the variables every request of `ctx` starts with.
pub(super) fn push_head(out: &mut CgiParams, ctx: &CgiContext) -> Result<(), CgiError> {
    out.push(b"GATEWAY_INTERFACE", GATEWAY_INTERFACE)?;
    out.push(b"SERVER_SOFTWARE", &ctx.server_software)
}

/// CONTENT_TYPE and CONTENT_LENGTH of a request without a body: both empty.
pub(super) fn push_no_body(out: &mut CgiParams) -> Result<(), CgiError> {
    out.push(b"CONTENT_TYPE", b"")?;
    out.push(b"CONTENT_LENGTH", b"")
}

/// SERVER_PROTOCOL, REQUEST_SCHEME, and HTTPS over TLS.
pub(super) fn push_protocol(
    out: &mut CgiParams,
    protocol: &[u8],
    https: bool,
) -> Result<(), CgiError> {
    out.push(b"SERVER_PROTOCOL", protocol)?;
    out.push(b"REQUEST_SCHEME", if https { b"https" } else { b"http" })?;
    if https {
        out.push(b"HTTPS", b"on")?;
    }
    Ok(())
}

/// REDIRECT_STATUS, which php-cgi's `cgi.force_redirect` asks for.
pub(super) fn push_redirect_status(out: &mut CgiParams) -> Result<(), CgiError> {
    out.push(b"REDIRECT_STATUS", b"200")
}

/// DOCUMENT_ROOT of `ctx`.
pub(super) fn push_root(out: &mut CgiParams, ctx: &CgiContext) -> Result<(), CgiError> {
    out.push(b"DOCUMENT_ROOT", path::root_shown(&ctx.document_root))
}

/// REMOTE_ADDR and REMOTE_PORT. An empty address means the front listener does not know the
/// client (a Unix socket with no trusted forwarded header): the variable is left out, not
/// made up.
pub(super) fn push_remote(
    out: &mut CgiParams,
    addr: &[u8],
    port: Option<u16>,
) -> Result<(), CgiError> {
    let mut port_text = [0u8; 20];
    if !addr.is_empty() {
        out.push(b"REMOTE_ADDR", addr)?;
    }
    match port {
        Some(p) => out.push(b"REMOTE_PORT", decimal(u64::from(p), &mut port_text)),
        None => out.push(b"REMOTE_PORT", b""),
    }
}

/// SERVER_ADDR and SERVER_PORT.
pub(super) fn push_server(
    out: &mut CgiParams,
    addr: &[u8],
    port: Option<u16>,
) -> Result<(), CgiError> {
    let mut port_text = [0u8; 20];
    out.push(b"SERVER_ADDR", addr)?;
    match port {
        Some(p) => out.push(b"SERVER_PORT", decimal(u64::from(p), &mut port_text)),
        None => out.push(b"SERVER_PORT", b""),
    }
}

/// Refuses a context whose extra variables could not be sent as they are.
pub(super) fn check_extra_env(ctx: &CgiContext) -> Result<(), CgiError> {
    for (name, value) in &ctx.extra_env {
        if name.is_empty() || name.contains(&b'=') || has_nul_cr_lf(name) || has_nul_cr_lf(value) {
            return Err(CgiError::InvalidContext(
                "an extra variable has an empty name, '=', NUL, CR or LF",
            ));
        }
    }
    Ok(())
}

/// `n` in decimal, written into `buf`.
pub(super) fn decimal(mut n: u64, buf: &mut [u8; 20]) -> &[u8] {
    let mut at = buf.len();
    loop {
        at -= 1;
        if let Some(d) = buf.get_mut(at) {
            *d = b'0' + (n % 10) as u8;
        }
        n /= 10;
        if n == 0 || at == 0 {
            break;
        }
    }
    buf.get(at..).unwrap_or_default()
}

/// Checks `vars` against the parameter-block limits a responder will apply to them; the byte
/// total is the sum of name and value lengths (framing overhead is the encoder's to check).
fn check_limits(vars: &CgiParams, limits: &Limits) -> Result<(), CgiError> {
    if vars.len() <= limits.max_params_count
        && vars.within(
            limits.max_name_len,
            limits.max_value_len,
            limits.max_params_bytes,
        )
    {
        return Ok(());
    }
    // Over some limit: find which, to name it.
    if vars.len() > limits.max_params_count {
        return Err(CgiError::TooManyVars {
            count: vars.len(),
            limit: limits.max_params_count,
        });
    }
    let mut total = 0usize;
    for (name, value) in vars.iter() {
        if name.len() > limits.max_name_len {
            return Err(CgiError::NameTooLong {
                name: snippet(name),
                limit: limits.max_name_len,
            });
        }
        if value.len() > limits.max_value_len {
            return Err(CgiError::ValueTooLong {
                name: snippet(name),
                len: value.len(),
                limit: limits.max_value_len,
            });
        }
        total = total.saturating_add(name.len()).saturating_add(value.len());
    }
    if total > limits.max_params_bytes {
        return Err(CgiError::VarsTooLarge {
            total,
            limit: limits.max_params_bytes,
        });
    }
    Ok(())
}
