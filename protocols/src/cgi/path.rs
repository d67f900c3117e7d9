//! Request path to SCRIPT_NAME / PATH_INFO / SCRIPT_FILENAME: the request target parsed, its
//! path decoded and normalised (the steps themselves are in `super::normal`), the strict split
//! on the first segment with an allowed script extension, and the checks of a context's root,
//! extensions, index names and mount.
//!
//! The split never "walks back" the way php's `cgi.fix_pathinfo` does: `/avatar.jpg/x.php`
//! names the script `/avatar.jpg/x.php` (which will not exist), never `/avatar.jpg`. PATH_INFO
//! is always a suffix of the decoded, normalised path, so there is no length arithmetic to get
//! wrong (CVE-2019-11043).

use super::normal::{
    check_decoded, checked_is_normal, is_normal, normalize, normalize_in_place, percent_decode,
};
use super::{has_nul_cr_lf, snippet, CgiContext, CgiError, ScriptMode};

/// Where a request path leads, all values decoded and normalised.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScriptPath {
    /// SCRIPT_NAME: the path up to and including the script segment (files mode), or the
    /// mount point (app mode, `""` at the site root).
    pub script_name: Vec<u8>,
    /// PATH_INFO: the rest of the path after `script_name`, empty when there is none.
    pub path_info: Vec<u8>,
    /// SCRIPT_FILENAME: document root + `script_name` (files mode only).
    pub script_filename: Option<Vec<u8>>,
}

impl ScriptPath {
    /// DOCUMENT_URI: `script_name` followed by `path_info`, the normalised request path
    /// (with the index file when one was chosen).
    pub fn document_uri(&self) -> Vec<u8> {
        let mut uri = self.script_name.clone();
        uri.extend_from_slice(&self.path_info);
        if uri.is_empty() {
            uri.push(b'/');
        }
        uri
    }
}

/// A request target split into its parts, all still percent-encoded.
pub(super) struct Target<'a> {
    /// The path and query (REQUEST_URI).
    pub path_and_query: &'a [u8],
    /// The path, starting with `/`.
    pub path: &'a [u8],
    /// The query, without `?`; empty when there is none.
    pub query: &'a [u8],
}

/// Splits a raw request target (origin-form or absolute-form) into path and query.
pub(super) fn split_target(target: &[u8]) -> Result<Target<'_>, CgiError> {
    if let Some(&byte) = target
        .iter()
        .find(|&&c| c <= b' ' || c == 0x7f || c == b'#')
    {
        return Err(CgiError::TargetByte { byte });
    }
    let path_and_query = if target.first() == Some(&b'/') {
        target
    } else {
        strip_scheme_authority(target).ok_or_else(|| CgiError::TargetForm {
            target: snippet(target),
        })?
    };
    let (path, query) = match path_and_query.iter().position(|&c| c == b'?') {
        Some(q) => (
            path_and_query.get(..q).unwrap_or_default(),
            path_and_query.get(q + 1..).unwrap_or_default(),
        ),
        None => (path_and_query, &b""[..]),
    };
    Ok(Target {
        path_and_query,
        path,
        query,
    })
}

/// For an absolute-form target `scheme://authority/path?query`, the `/path?query` part
/// (`/` when the path is empty and there is no query).
fn strip_scheme_authority(target: &[u8]) -> Option<&[u8]> {
    let colon = target.iter().position(|&c| c == b':')?;
    let scheme = target.get(..colon)?;
    let scheme_ok = scheme.first().is_some_and(u8::is_ascii_alphabetic)
        && scheme
            .iter()
            .all(|&c| c.is_ascii_alphanumeric() || matches!(c, b'+' | b'-' | b'.'));
    let rest = target.get(colon + 1..)?.strip_prefix(b"//")?;
    if !scheme_ok {
        return None;
    }
    match rest.iter().position(|&c| c == b'/' || c == b'?') {
        Some(i) if rest.get(i) == Some(&b'/') => rest.get(i..),
        // `http://host?query` would need a "/" inserted before the query; refused as rare.
        Some(_) => None,
        None => Some(b"/"),
    }
}

/// A request target parsed once: its raw parts for REQUEST_URI and QUERY_STRING, and the one
/// decoded, normalised path that routing, the static-file test, the script split and every
/// CGI variable are then taken from. Deciding "is this a script?" on one spelling and serving
/// another (`/index.ph%70`) is how source code leaks; there is only one spelling here.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestPath<'a> {
    /// The raw path and query (REQUEST_URI).
    pub path_and_query: &'a [u8],
    /// The raw query without `?` (QUERY_STRING); empty when there is none.
    pub query: &'a [u8],
    /// The path percent-decoded once, with no NUL, CR, LF or `\`, dot segments resolved
    /// without climbing above `/`; starts with `/` and keeps a trailing `/`.
    pub normalized: Vec<u8>,
}

impl RequestPath<'_> {
    /// The normalised path as text, for routing and logs (`None` when it is not UTF-8).
    pub fn as_str(&self) -> Option<&str> {
        std::str::from_utf8(&self.normalized).ok()
    }
}

/// Parses a raw request target (origin-form or absolute-form) into a [`RequestPath`].
pub fn parse_request_path(target: &[u8]) -> Result<RequestPath<'_>, CgiError> {
    let t = split_target(target)?;
    if t.path.first() != Some(&b'/') {
        return Err(CgiError::TargetForm {
            target: snippet(target),
        });
    }
    Ok(RequestPath {
        path_and_query: t.path_and_query,
        query: t.query,
        normalized: decoded_normal(t.path)?,
    })
}

/// A raw path that starts with `/`, percent-decoded once, checked ([`check_decoded`]) and
/// normalised, all in the one buffer the decoding made.
fn decoded_normal(raw_path: &[u8]) -> Result<Vec<u8>, CgiError> {
    let mut normalized = percent_decode(raw_path)?;
    if !checked_is_normal(&normalized)? {
        normalize_in_place(&mut normalized, true).map_err(|()| CgiError::EscapesRoot {
            path: snippet(raw_path),
        })?;
    }
    Ok(normalized)
}

/// Normalises a path a front server sent already decoded (nginx's DOCUMENT_URI): the same
/// checks and dot-segment rules as [`parse_request_path`], without a decoding pass. Borrowed
/// when the path is already in normal form, as nginx sends it.
pub fn normalize_decoded_path(decoded: &[u8]) -> Result<std::borrow::Cow<'_, [u8]>, CgiError> {
    if decoded.first() != Some(&b'/') {
        return Err(CgiError::TargetForm {
            target: snippet(decoded),
        });
    }
    normal_form(decoded)
}

/// Splits an already parsed request path into SCRIPT_NAME, PATH_INFO and SCRIPT_FILENAME
/// under `ctx`.
pub fn split_request_path(
    path: &RequestPath<'_>,
    ctx: &CgiContext,
) -> Result<ScriptPath, CgiError> {
    check_context(ctx)?;
    let norm = normal_form(&path.normalized)?;
    Ok(split_normalized(&norm, ctx)?.to_owned())
}

/// `path` checked ([`check_decoded`]) and in normal form: borrowed when it already is (what
/// [`parse_request_path`] made), normalised anew otherwise (a path set by hand).
pub(super) fn normal_form(path: &[u8]) -> Result<std::borrow::Cow<'_, [u8]>, CgiError> {
    if checked_is_normal(path)? {
        Ok(std::borrow::Cow::Borrowed(path))
    } else {
        normalize(path, true).map(std::borrow::Cow::Owned)
    }
}

/// Whether a normalised path has a hidden segment (one starting with `.`: `.env`, `.git/`,
/// `.user.ini`, `.htpasswd`), which corral neither serves nor runs. `.well-known` (RFC 8615:
/// ACME challenges, security.txt) is the one exception.
pub fn has_hidden_segment(norm: &[u8]) -> bool {
    norm.split(|&c| c == b'/')
        .any(|s| s.first() == Some(&b'.') && s != b".well-known")
}

/// Splits a raw (percent-encoded) request path into SCRIPT_NAME, PATH_INFO and
/// SCRIPT_FILENAME under `ctx`.
pub fn split_script_path(raw_path: &[u8], ctx: &CgiContext) -> Result<ScriptPath, CgiError> {
    check_context(ctx)?;
    if raw_path.first() != Some(&b'/') {
        return Err(CgiError::TargetForm {
            target: snippet(raw_path),
        });
    }
    let decoded = percent_decode(raw_path)?;
    split_decoded(&decoded, ctx)
}

/// The file a raw (percent-encoded) request path names under `root`, for serving static
/// files: decoded, dot segments resolved, never above the root, no NUL/CR/LF, no encoded
/// `/` or backslash. Lexical only: the caller still checks the real file (symlinks).
pub fn static_file_path(raw_path: &[u8], root: &[u8]) -> Result<Vec<u8>, CgiError> {
    if raw_path.first() != Some(&b'/') {
        return Err(CgiError::TargetForm {
            target: snippet(raw_path),
        });
    }
    let norm = decoded_normal(raw_path)?;
    if has_hidden_segment(&norm) {
        return Err(CgiError::Hidden {
            path: snippet(&norm),
        });
    }
    let mut file = root_prefix(root).to_vec();
    file.extend_from_slice(&norm);
    Ok(file)
}

/// Splits an already decoded path (DOCUMENT_URI, SCRIPT_NAME from a front server).
pub(super) fn split_decoded(decoded: &[u8], ctx: &CgiContext) -> Result<ScriptPath, CgiError> {
    check_decoded(decoded)?;
    let norm = normalize(decoded, true)?;
    Ok(split_normalized(&norm, ctx)?.to_owned())
}

/// Where a normalised path leads under a context, borrowed from the two: what the encoder
/// writes out without building [`ScriptPath`]'s three buffers.
#[derive(Debug, Clone, Copy)]
pub(super) struct Split<'a> {
    /// SCRIPT_NAME is `name` followed by `index`.
    pub name: &'a [u8],
    /// The index file chosen for a directory, or empty.
    pub index: &'a [u8],
    /// PATH_INFO.
    pub info: &'a [u8],
    /// Files mode: the root SCRIPT_FILENAME starts with (without its trailing `/`); `None`
    /// for an application mount.
    pub root: Option<&'a [u8]>,
}

impl Split<'_> {
    fn to_owned(self) -> ScriptPath {
        let script_name = [self.name, self.index].concat();
        ScriptPath {
            script_filename: self.root.map(|root| [root, &script_name].concat()),
            script_name,
            path_info: self.info.to_vec(),
        }
    }
}

/// Splits a path in normal form (see [`normal_form`]) under `ctx`.
pub(super) fn split_normalized<'a>(
    norm: &'a [u8],
    ctx: &'a CgiContext,
) -> Result<Split<'a>, CgiError> {
    match &ctx.mode {
        ScriptMode::Files { extensions, index } => {
            split_files(norm, &ctx.document_root, extensions, index)
        }
        ScriptMode::App { mount } => split_app(norm, mount),
    }
}

fn split_files<'a>(
    norm: &'a [u8],
    root: &'a [u8],
    extensions: &[Vec<u8>],
    index: &'a [Vec<u8>],
) -> Result<Split<'a>, CgiError> {
    if has_hidden_segment(norm) {
        return Err(CgiError::Hidden {
            path: snippet(norm),
        });
    }
    let (name, index, info) = match script_end(norm, extensions) {
        Some(end) => {
            let (name, info) = norm.split_at(end.min(norm.len()));
            (name, &b""[..], info)
        }
        None if norm.ends_with(b"/") => {
            let file = index
                .iter()
                .find(|f| has_allowed_ext(f, extensions))
                .ok_or_else(|| CgiError::NoIndex {
                    path: snippet(norm),
                })?;
            (norm, &file[..], &b""[..])
        }
        None => {
            return Err(CgiError::NotAScript {
                path: snippet(norm),
            })
        }
    };
    Ok(Split {
        name,
        index,
        info,
        root: Some(root_prefix(root)),
    })
}

/// In a normalised path, the byte offset just after the first segment that ends with an
/// allowed extension.
pub(super) fn script_end(norm: &[u8], extensions: &[Vec<u8>]) -> Option<usize> {
    let mut start = 1;
    for segment in norm.get(1..)?.split(|&c| c == b'/') {
        let end = start + segment.len();
        if has_allowed_ext(segment, extensions) {
            return Some(end);
        }
        start = end + 1;
    }
    None
}

fn split_app<'a>(norm: &'a [u8], mount: &'a [u8]) -> Result<Split<'a>, CgiError> {
    let mount = mount_prefix(mount);
    let rest = norm
        .strip_prefix(mount)
        .filter(|rest| rest.is_empty() || rest.first() == Some(&b'/'));
    let rest = rest.ok_or_else(|| CgiError::OutsideMount {
        path: snippet(norm),
    })?;
    Ok(Split {
        name: mount,
        index: b"",
        info: rest,
        root: None,
    })
}

/// Whether `segment` is `stem.ext` with a non-empty stem and `ext` allowed (byte for byte).
pub fn has_allowed_ext(segment: &[u8], extensions: &[Vec<u8>]) -> bool {
    extensions.iter().any(|ext| {
        let ext = ext.strip_prefix(b".").unwrap_or(ext);
        segment.len() > ext.len() + 1
            && segment.ends_with(ext)
            && segment.get(segment.len() - ext.len() - 1) == Some(&b'.')
    })
}

/// The root without its trailing `/`, ready to have an absolute path appended.
pub(super) fn root_prefix(root: &[u8]) -> &[u8] {
    root.strip_suffix(b"/").unwrap_or(root)
}

/// DOCUMENT_ROOT: the root without a trailing `/`, except the root `/` itself.
pub(super) fn root_display(root: &[u8]) -> Vec<u8> {
    match root_prefix(root) {
        b"" => b"/".to_vec(),
        r => r.to_vec(),
    }
}

/// [`root_display`] borrowed from the root itself.
pub(super) fn root_shown(root: &[u8]) -> &[u8] {
    match root_prefix(root) {
        b"" => b"/",
        r => r,
    }
}

/// A mount point as a SCRIPT_NAME prefix: `""` for the site root, no trailing `/`.
fn mount_prefix(mount: &[u8]) -> &[u8] {
    mount.strip_suffix(b"/").unwrap_or(mount)
}

/// Refuses a context whose root, extensions, index names or mount cannot be used safely.
pub(super) fn check_context(ctx: &CgiContext) -> Result<(), CgiError> {
    let root = &ctx.document_root;
    if root.first() != Some(&b'/') || has_nul_cr_lf(root) {
        return Err(CgiError::InvalidContext(
            "the document root must be an absolute path without NUL, CR or LF",
        ));
    }
    if root.split(|&c| c == b'/').any(|s| s == b"." || s == b"..")
        || root.windows(2).any(|w| w == b"//")
    {
        return Err(CgiError::InvalidContext(
            "the document root must have no '.', '..' or empty segments",
        ));
    }
    let plain = |name: &[u8]| {
        !name.is_empty() && !name.contains(&b'/') && !name.contains(&b'\\') && !has_nul_cr_lf(name)
    };
    match &ctx.mode {
        ScriptMode::Files { extensions, index } => {
            if extensions
                .iter()
                .any(|e| !plain(e.strip_prefix(b".").unwrap_or(e)))
            {
                return Err(CgiError::InvalidContext(
                    "a script extension is empty or holds '/', '\\', NUL, CR or LF",
                ));
            }
            if index.iter().any(|f| !plain(f) || f == b"." || f == b"..") {
                return Err(CgiError::InvalidContext(
                    "an index file name is not a plain file name",
                ));
            }
        }
        ScriptMode::App { mount } => {
            let norm = mount.is_empty() || is_normal(mount);
            if !norm || mount.first().is_some_and(|&c| c != b'/') || has_nul_cr_lf(mount) {
                return Err(CgiError::InvalidContext(
                    "the mount point must be a normalised absolute path",
                ));
            }
        }
    }
    Ok(())
}
