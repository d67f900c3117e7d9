//! Static files and the front controller of the `http` front listener: `static_file` serves
//! an existing non-script file under a context's root (`static_files = true`), `try_files`
//! decides what a context with `front_controller` runs for a path that names nothing under
//! the root (nginx's `try_files $uri $uri/ /index.php?$args`). ARCHITECTURE.md, "The
//! request path", step 4.

use std::os::unix::ffi::OsStringExt;

use http::header::HeaderValue;
use http::{Response, StatusCode};

use crate::front::file;
use crate::front::http::{plain, HttpBody};
use crate::gateway::Routed;
use crate::protocols::cgi::{has_allowed_ext, has_hidden_segment, RequestPath, ScriptMode};

/// Serves an existing non-script file under the context's root when the context asks for
/// static files (`static_files = true`); `None` sends the request on to the backend.
///
/// Never served: anything that looks like a script in any letter case (`x.PHP` is not run,
/// but it is PHP source all the same), PHP's other source extensions in a PHP context, hidden
/// files (`.env`, `.git/config`, `.user.ini`; those are answered 404 here, not passed on), and
/// anything whose real path leaves the real root.
pub(super) async fn static_file(
    routed: &Routed,
    method: &http::Method,
    request: &http::HeaderMap,
    path: &RequestPath<'_>,
) -> Option<Response<HttpBody>> {
    let context = &routed.context;
    let root = context.config.root.as_ref()?;
    if !context.config.static_files {
        return None;
    }
    let ScriptMode::Files { extensions, .. } = &context.cgi.mode else {
        return None;
    };
    let norm = &path.normalized[..];
    if looks_like_source(norm, extensions) {
        return None;
    }
    if has_hidden_segment(norm) {
        // Not passed on either: the backend would refuse it anyway (not a script).
        return Some(plain(StatusCode::NOT_FOUND, "404 Not Found\n"));
    }
    // The real file must be a regular file still under the real root (no symlink out), and
    // its real name must not be a script or hidden either (`a.txt -> index.php`).
    let (real, real_root) = real_under_root(root, norm).await?;
    let rel = real.strip_prefix(&real_root).ok()?;
    let mut rel_path = b"/".to_vec();
    rel_path.extend_from_slice(rel.as_os_str().as_encoded_bytes());
    if looks_like_source(&rel_path, extensions) || has_hidden_segment(&rel_path) {
        return Some(plain(StatusCode::NOT_FOUND, "404 Not Found\n"));
    }
    let file = tokio::fs::File::open(&real).await.ok()?;
    let meta = file.metadata().await.ok()?;
    if !meta.is_file() {
        return None;
    }
    if method != http::Method::GET && method != http::Method::HEAD {
        let mut resp = plain(StatusCode::METHOD_NOT_ALLOWED, "405 Method Not Allowed\n");
        resp.headers_mut()
            .insert(http::header::ALLOW, HeaderValue::from_static("GET, HEAD"));
        return Some(resp);
    }
    let mut headers = http::HeaderMap::new();
    headers.insert(
        http::header::CONTENT_TYPE,
        HeaderValue::from_static(file::content_type(&real)),
    );
    Some(file::file_answer(file, meta.len(), StatusCode::OK, request, headers).await)
}

/// What the context's front controller makes of a request `static_file` did not answer.
pub(super) enum TryFiles {
    /// Served as the path says: the context has no front controller, or the path names a
    /// script, a hidden segment, an existing file or an existing directory with its `/`.
    Keep,
    /// Nothing under the root has that name: the front controller (its normalised path)
    /// runs instead, with the request's own REQUEST_URI and QUERY_STRING.
    Controller(Vec<u8>),
    /// An existing directory named without its trailing `/`: a 301 to the path with it
    /// (the value is the Location), as nginx answers, so relative links in its index work.
    AddSlash(Vec<u8>),
}

/// `try_files $uri $uri/ CONTROLLER?$args` for a context with `front_controller`.
///
/// Script paths are kept, existing or not (the script guard answers 404 for a missing one,
/// as nginx's `try_files $uri =404` in its PHP location does): a missing `/x.php` must not
/// turn into the controller, nor a path choose which script runs. Hidden paths are kept (and
/// refused later) without touching the file system, so the answer says nothing about
/// whether `/.git/HEAD` exists. Existence is judged on the real path: a name whose real path
/// leaves the real root counts as missing, so the answer is the same whatever exists outside.
/// The controller itself is checked by the script guard in `Gateway::dispatch` like any
/// other script (ARCHITECTURE.md invariant 2).
pub(super) async fn try_files(routed: &Routed, path: &RequestPath<'_>) -> TryFiles {
    let context = &routed.context;
    let (Some(controller), Some(root)) = (&context.config.front_controller, &context.config.root)
    else {
        return TryFiles::Keep;
    };
    let ScriptMode::Files { extensions, .. } = &context.cgi.mode else {
        return TryFiles::Keep;
    };
    let norm = &path.normalized[..];
    let names_script = norm
        .split(|&c| c == b'/')
        .any(|segment| has_allowed_ext(segment, extensions));
    if names_script || has_hidden_segment(norm) {
        return TryFiles::Keep;
    }
    let Some((real, _)) = real_under_root(root, norm).await else {
        return TryFiles::Controller(controller.as_bytes().to_vec());
    };
    match tokio::fs::metadata(&real).await {
        Ok(meta) if meta.is_dir() && !norm.ends_with(b"/") => {
            let mut location = percent_encode_path(norm);
            location.push(b'/');
            if !path.query.is_empty() {
                location.push(b'?');
                location.extend_from_slice(path.query);
            }
            TryFiles::AddSlash(location)
        }
        Ok(_) => TryFiles::Keep,
        Err(_) => TryFiles::Controller(controller.as_bytes().to_vec()),
    }
}

/// The real path of the normalised `norm` under `root`, with the real root, when it exists
/// and its real path lies under the real root.
async fn real_under_root(
    root: &std::path::Path,
    norm: &[u8],
) -> Option<(std::path::PathBuf, std::path::PathBuf)> {
    let mut lexical = root.as_os_str().as_encoded_bytes().to_vec();
    if lexical.last() == Some(&b'/') {
        lexical.pop();
    }
    lexical.extend_from_slice(norm);
    let lexical = std::path::PathBuf::from(std::ffi::OsString::from_vec(lexical));
    let real = tokio::fs::canonicalize(&lexical).await.ok()?;
    let real_root = tokio::fs::canonicalize(root).await.ok()?;
    real.starts_with(&real_root).then_some((real, real_root))
}

/// A decoded, normalised path written back as a URI path: unreserved characters, sub-delims,
/// `:`, `@` and `/` as they are, every other byte as `%XX`. Built from the normalised path,
/// never the raw one, so a Location cannot start with `//` (another host).
fn percent_encode_path(norm: &[u8]) -> Vec<u8> {
    const HEX: &[u8; 16] = b"0123456789ABCDEF";
    let mut out = Vec::with_capacity(norm.len());
    for &c in norm {
        if c.is_ascii_alphanumeric() || b"-._~!$&'()*+,;=:@/".contains(&c) {
            out.push(c);
        } else {
            out.push(b'%');
            out.push(HEX[usize::from(c >> 4)]);
            out.push(HEX[usize::from(c & 0x0f)]);
        }
    }
    out
}

/// 301 to `location`, a directory's path with its trailing `/`.
pub(super) fn add_slash(location: Vec<u8>) -> Response<HttpBody> {
    let mut resp = plain(StatusCode::MOVED_PERMANENTLY, "301 Moved Permanently\n");
    match HeaderValue::from_bytes(&location) {
        Ok(v) => {
            resp.headers_mut().insert(http::header::LOCATION, v);
            resp
        }
        // The query came from the request target, whose bytes are all visible ASCII.
        Err(_) => plain(StatusCode::NOT_FOUND, "404 Not Found\n"),
    }
}

/// PHP's other source extensions: never sent as static files from a PHP context, though only
/// the context's own extensions are run.
const PHP_SOURCE_EXTENSIONS: [&str; 10] = [
    "php", "phtml", "phar", "phps", "php3", "php4", "php5", "php7", "php8", "inc",
];

/// Whether some segment of a normalised path ends with a script extension in any letter case
/// (or, when the context runs PHP, with one of PHP's other source extensions).
fn looks_like_source(norm: &[u8], extensions: &[Vec<u8>]) -> bool {
    let php = extensions.iter().any(|e| {
        e.strip_prefix(b".")
            .unwrap_or(e)
            .eq_ignore_ascii_case(b"php")
    });
    let ends_with_ext = |segment: &[u8], ext: &[u8]| {
        let ext = ext.strip_prefix(b".").unwrap_or(ext);
        segment.len() > ext.len() + 1
            && segment.get(segment.len() - ext.len() - 1) == Some(&b'.')
            && segment
                .get(segment.len() - ext.len()..)
                .is_some_and(|tail| tail.eq_ignore_ascii_case(ext))
    };
    norm.split(|&c| c == b'/').any(|segment| {
        extensions.iter().any(|ext| ends_with_ext(segment, ext))
            || (php
                && PHP_SOURCE_EXTENSIONS
                    .iter()
                    .any(|ext| ends_with_ext(segment, ext.as_bytes())))
    })
}
