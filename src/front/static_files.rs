//! Static files and the front controller of the `http` front listener: `static_file` serves
//! an existing non-script file under a context's root (`static_files = true`), `try_files`
//! decides what a context with `front_controller` runs for a path that names nothing under
//! the root (nginx's `try_files $uri $uri/ /index.php?$args`). ARCHITECTURE.md, "HTTP
//! front", step 4.

use std::borrow::Cow;
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::Arc;

use http::header::HeaderValue;
use http::{Response, StatusCode};

use crate::beneath::{open_beneath, Access, Dir, OpenError, Opened};
use crate::front::file::{self, Loaded};
use crate::front::http::{plain, HttpBody};
use crate::front::open_files::{self, Cached};
use crate::gateway::Routed;
use crate::protocols::cgi::{has_allowed_ext, has_hidden_segment, RequestPath, ScriptMode};

/// What [`static_file`] learnt of a path it passed on, so that [`try_files`] does not look
/// it up a second time (every pretty permalink of a WordPress site is such a path).
#[derive(Debug, Clone, Copy)]
pub(super) enum Seen {
    /// Nothing beneath the root has that name (or it resolves outside the root).
    Missing,
    /// Something that is not served exists there.
    Found {
        /// Whether it is a directory.
        is_dir: bool,
    },
}

/// Serves an existing non-script file under the context's root when the context asks for
/// static files (`static_files = true`); `None` sends the request on to the backend, with
/// what the lookup found in `seen` when one was made.
///
/// Never served: anything that looks like a script in any letter case (`x.PHP` is not run,
/// but it is PHP source all the same), PHP's other source extensions in a PHP context, hidden
/// files (`.env`, `.git/config`, `.user.ini`; those are answered 404 here, not passed on),
/// anything whose real path leaves the real root, and anything not a regular file (a
/// directory, a named pipe, a socket: never read, passed on).
pub(super) async fn static_file(
    routed: &Routed,
    method: &http::Method,
    request: &http::HeaderMap,
    path: &RequestPath<'_>,
    seen: &mut Option<Seen>,
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
    // Opened once, beneath the real root, and judged by what was opened (ARCHITECTURE.md
    // invariant 17): a regular file, not a symlink out, and a real name that is no script
    // and not hidden either (`a.txt -> index.php`). A descriptor this thread opened so
    // within `open_files::VALID_FOR` serves again without opening anything. The open is
    // made on the serving thread, as the script guard's are; only reading a file's
    // contents the first time goes to the blocking pool (docs/decisions.md, decision 41).
    let read = method == http::Method::GET;
    let now = tokio::time::Instant::now();
    let key = root.as_os_str().as_bytes();
    let (got, real) = match open_files::get(key, norm, now, read) {
        Some((loaded, cached)) => (Got::Cached(loaded), cached.real),
        None => match look_up(root, norm, Access::Read) {
            Ok(opened) => {
                *seen = Some(Seen::Found {
                    is_dir: opened.meta.is_dir(),
                });
                let len = opened.meta.len();
                let file = opened.meta.is_file().then_some((opened.file, len));
                (Got::Opened(file), opened.real.map(Arc::from))
            }
            // Missing, or resolving outside the root: the backend may know the path.
            Err(_) => {
                *seen = Some(Seen::Missing);
                return None;
            }
        },
    };
    let real_name: Cow<'_, [u8]> = match &real {
        Some(rel) => {
            let mut name = b"/".to_vec();
            name.extend_from_slice(rel.as_os_str().as_bytes());
            Cow::Owned(name)
        }
        None => Cow::Borrowed(norm),
    };
    if looks_like_source(&real_name, extensions) || has_hidden_segment(&real_name) {
        return Some(plain(StatusCode::NOT_FOUND, "404 Not Found\n"));
    }
    let loaded = match got {
        Got::Cached(loaded) => loaded,
        // Not a regular file (a directory, a named pipe, a socket): never read, passed on.
        Got::Opened(None) => return None,
        Got::Opened(Some((file, len))) => {
            let loaded = if read && len <= file::SMALL_FILE {
                match file::off_thread(move || file::load(file, len, true)).await {
                    Ok(Ok(loaded)) => loaded,
                    Ok(Err(_)) => {
                        *seen = Some(Seen::Missing);
                        return None;
                    }
                    Err(e) => return Some(stalled(&e)),
                }
            } else {
                // Nothing to read now: a HEAD, or a file streamed chunk by chunk.
                Loaded::unread(file, len)
            };
            let cached = Cached {
                file: Arc::clone(&loaded.file),
                len: loaded.len,
                real,
            };
            open_files::put(key, norm, cached, now);
            loaded
        }
    };
    if method != http::Method::GET && method != http::Method::HEAD {
        let mut resp = plain(StatusCode::METHOD_NOT_ALLOWED, "405 Method Not Allowed\n");
        resp.headers_mut()
            .insert(http::header::ALLOW, HeaderValue::from_static("GET, HEAD"));
        return Some(resp);
    }
    let mut headers = http::HeaderMap::new();
    headers.insert(
        http::header::CONTENT_TYPE,
        HeaderValue::from_static(file::content_type(Path::new(OsStr::from_bytes(&real_name)))),
    );
    let (data, len) = loaded.into_data();
    Some(file::file_answer(
        data,
        len,
        StatusCode::OK,
        request,
        headers,
    ))
}

/// What [`static_file`] has to answer with.
enum Got {
    /// A file this thread had open already, ready to answer.
    Cached(Loaded),
    /// What the lookup opened: a regular file with its length, or `None` for anything else.
    Opened(Option<(std::fs::File, u64)>),
}

/// Opens what the normalised `norm` names beneath `root`. On the serving thread: the walk
/// and the `fstat` of a tree the kernel has cached cost less than a hop to the blocking pool
/// and back, as the script guard's do (decision 41).
fn look_up(root: &Path, norm: &[u8], access: Access) -> Result<Opened, OpenError> {
    let dir = Dir::open(root)?;
    let rel = Path::new(OsStr::from_bytes(norm.strip_prefix(b"/").unwrap_or(norm)));
    open_beneath(&dir, rel, access)
}

/// The answer when the file system did not answer in time, with its log line.
fn stalled(e: &std::io::Error) -> Response<HttpBody> {
    tracing::warn!(error = %e, "gave up on a static file");
    plain(StatusCode::SERVICE_UNAVAILABLE, "503 Service Unavailable\n")
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
pub(super) fn try_files(routed: &Routed, path: &RequestPath<'_>, seen: Option<Seen>) -> TryFiles {
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
    // Existence is judged beneath the real root: a name that resolves outside is missing.
    // `static_file` may have looked already.
    let seen = match seen {
        Some(seen) => seen,
        None => match look_up(root, norm, Access::Look) {
            Ok(opened) => Seen::Found {
                is_dir: opened.meta.is_dir(),
            },
            Err(_) => Seen::Missing,
        },
    };
    let is_dir = match seen {
        Seen::Missing => return TryFiles::Controller(controller.as_bytes().to_vec()),
        Seen::Found { is_dir } => is_dir,
    };
    if is_dir && !norm.ends_with(b"/") {
        let mut location = percent_encode_path(norm);
        location.push(b'/');
        if !path.query.is_empty() {
            location.push(b'?');
            location.extend_from_slice(path.query);
        }
        return TryFiles::AddSlash(location);
    }
    TryFiles::Keep
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

/// Whether some segment of a normalised path names source: a script extension in any letter
/// case (or, when the context runs PHP, one of PHP's other source extensions), at the end of
/// the name or followed by anything but a letter or a digit. The latter are the backups an
/// editor, a deploy or an admin leaves beside a script (`config.php.bak`, `config.php~`,
/// `.orig`, `.save`, `.swp`, `config.php.` with its trailing dot, `config.php#`): the
/// source, which must never go out as text. `x.phpnotes.txt` is another name.
fn looks_like_source(norm: &[u8], extensions: &[Vec<u8>]) -> bool {
    let php = extensions.iter().any(|e| {
        e.strip_prefix(b".")
            .unwrap_or(e)
            .eq_ignore_ascii_case(b"php")
    });
    norm.split(|&c| c == b'/').any(|segment| {
        extensions.iter().any(|ext| names_source(segment, ext))
            || (php
                && PHP_SOURCE_EXTENSIONS
                    .iter()
                    .any(|ext| names_source(segment, ext.as_bytes())))
    })
}

/// Whether `segment` holds `.EXT` after at least one byte of name, at its end or followed by
/// a byte that is not ASCII alphanumeric.
fn names_source(segment: &[u8], ext: &[u8]) -> bool {
    let ext = ext.strip_prefix(b".").unwrap_or(ext);
    if ext.is_empty() {
        return false;
    }
    (1..segment.len()).any(|dot| {
        segment.get(dot) == Some(&b'.')
            && segment
                .get(dot + 1..dot + 1 + ext.len())
                .is_some_and(|e| e.eq_ignore_ascii_case(ext))
            && segment
                .get(dot + 1 + ext.len())
                .is_none_or(|c| !c.is_ascii_alphanumeric())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scripts_and_their_backups_look_like_source() {
        let php = [b"php".to_vec()];
        for source in [
            &b"/index.php"[..],
            b"/a/INDEX.PHP",
            b"/lib.inc",
            b"/old.phps",
            b"/config.php.bak",
            b"/config.php~",
            b"/config.php.orig",
            b"/config.php.save",
            b"/config.php.swp",
            b"/config.php.",
            b"/config.php#",
            b"/config.php-1",
            b"/Config.PHP.Bak",
            b"/lib.inc.old",
            b"/x.php/y.txt",
        ] {
            assert!(looks_like_source(source, &php), "{}", source.escape_ascii());
        }
        for other in [
            &b"/style.css"[..],
            b"/about.phpnotes.txt",
            b"/php.txt",
            b"/php",
            b"/a.include",
            b"/.php",
        ] {
            assert!(!looks_like_source(other, &php), "{}", other.escape_ascii());
        }
        // PHP's other extensions only in a PHP context; a context's own in any.
        let py = [b".py".to_vec()];
        assert!(!looks_like_source(b"/lib.inc.bak", &py));
        assert!(looks_like_source(b"/app.py~", &py));
    }
}
