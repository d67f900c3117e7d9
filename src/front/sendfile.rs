//! X-Sendfile and X-Accel-Redirect on the HTTP listener: a backend answers with a header
//! naming a file, and corral sends that file itself while the backend's worker goes back to
//! work. Only from directories the context allows (`sendfile_dirs`, `accel_redirect`), both
//! empty by default.
//!
//! - `X-Sendfile: /abs/path` (Apache's mod_xsendfile, lighttpd) names a file by its path.
//!   The path must be absolute, without `.` or `..` segments, and lie under a
//!   `sendfile_dirs` entry both as written and once symlinks are resolved.
//! - `X-Accel-Redirect: /uri` (nginx) names a URI that nginx would map through an `internal`
//!   location. Here the mapping is `accel_redirect`, URI prefix to directory (nginx's
//!   `location /protected/ { internal; alias /srv/files/; }`): the URI is decoded and
//!   normalised like a request path (no encoded `/`, NUL or `\`, no `..` above `/`), its
//!   query ignored, and the longest prefix it starts with replaced by its directory; the file
//!   must then lie under that directory once symlinks are resolved.
//!
//! The backend's status and headers are kept, its Content-Type included (the file's
//! extension decides only when the backend sent none), less those that described its body.
//!
//! A refusal is a 500 (the backend asked for something the configuration does not allow,
//! or wrote a bad value) or a 404 (the file is missing or not a regular file), each with a
//! log line naming the header, the value and the rule. These headers, and every `X-Accel-*`
//! header, never reach the client. The FastCGI and SCGI listeners pass them on untouched:
//! there the front server (nginx, Apache) acts on them.
//!
//! Toward the backend, the client's own `X-Sendfile-Type` and `X-Accel-Mapping` headers are
//! dropped (they tell an app such as Rack::Sendfile how to name files, which is the proxy's
//! word, not a client's: a client's mapping could turn one file's name into another's), and
//! a context that allows either header sends the backend its own: `X-Sendfile-Type:
//! X-Sendfile` with `sendfile_dirs`, else `X-Sendfile-Type: X-Accel-Redirect` and
//! `X-Accel-Mapping: DIR=PREFIX,...`. Rack 2.2.22 and later read only the mapping, and only
//! when the app configured `Rack::Sendfile` for X-Accel-Redirect; older ones read both.

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use bytes::Bytes;
use http::header::HeaderValue;
use http::{Response, StatusCode};

use crate::beneath::{open_beneath, Access, Dir, OpenError};
use crate::config::ContextConfig;
use crate::front::file::{self, FileData};
use crate::front::http::{plain, FrontBody, HttpBody};
use crate::protocols::ascii::eq_ignore_case;
use crate::protocols::cgi::parse_request_path;

/// The response header names corral acts on.
const X_SENDFILE: &[u8] = b"x-sendfile";
const X_ACCEL_REDIRECT: &[u8] = b"x-accel-redirect";

/// Which header a backend used to name a file, with its value.
#[derive(Debug, Clone, Copy)]
pub(super) enum Ask<'a> {
    /// `X-Sendfile: /abs/path`.
    Sendfile(&'a [u8]),
    /// `X-Accel-Redirect: /uri`.
    Accel(&'a [u8]),
}

impl Ask<'_> {
    fn header(&self) -> &'static str {
        match self {
            Ask::Sendfile(_) => "X-Sendfile",
            Ask::Accel(_) => "X-Accel-Redirect",
        }
    }

    fn value(&self) -> &[u8] {
        match self {
            Ask::Sendfile(v) | Ask::Accel(v) => v,
        }
    }
}

/// Why a file a backend named is not sent.
#[derive(Debug, thiserror::Error)]
pub(super) enum SendfileError {
    /// More than one X-Sendfile or X-Accel-Redirect in one response.
    #[error(
        "the backend sent {count} X-Sendfile and X-Accel-Redirect headers; one names the file"
    )]
    Several {
        /// How many.
        count: usize,
    },
    /// The context allows no file for this header.
    #[error("the backend sent {header}: \"{}\", but this context allows none (set {key})", .value.escape_ascii())]
    NotEnabled {
        /// The header.
        header: &'static str,
        /// Its value.
        value: Vec<u8>,
        /// The key that would allow it.
        key: &'static str,
    },
    /// The value is no absolute path, or holds a `.` or `..` segment or a NUL.
    #[error("{header}: \"{}\" is not an absolute path without '.', '..' or empty segments", .value.escape_ascii())]
    BadPath {
        /// The header.
        header: &'static str,
        /// Its value.
        value: Vec<u8>,
    },
    /// The X-Accel-Redirect value is not a URI path corral can normalise.
    #[error("X-Accel-Redirect: \"{}\" is not a usable URI path: {reason}", .value.escape_ascii())]
    BadUri {
        /// The value.
        value: Vec<u8>,
        /// What parsing it said.
        reason: String,
    },
    /// The path lies under no allowed directory, or the URI under no prefix.
    #[error("{header}: \"{}\" is under none of {key}", .value.escape_ascii())]
    NotAllowed {
        /// The header.
        header: &'static str,
        /// Its value.
        value: Vec<u8>,
        /// The key listing what is allowed.
        key: &'static str,
    },
    /// The allowed directory cannot be resolved.
    #[error("{key} directory {} cannot be resolved: {source}", .dir.display())]
    Dir {
        /// The key.
        key: &'static str,
        /// The directory.
        dir: PathBuf,
        /// What realpath said.
        source: std::io::Error,
    },
    /// The file does not exist.
    #[error("{header} names {}, which does not exist: {source}", .path.display())]
    Missing {
        /// The header.
        header: &'static str,
        /// The file.
        path: PathBuf,
        /// What the file system said.
        source: std::io::Error,
    },
    /// The file resolves outside its allowed directory (a symlink out of it).
    #[error("{header} names {}, which resolves to {}, outside {}", .path.display(), .real.display(), .dir.display())]
    Escapes {
        /// The header.
        header: &'static str,
        /// The file.
        path: PathBuf,
        /// Its real path.
        real: PathBuf,
        /// The real allowed directory.
        dir: PathBuf,
    },
    /// The file is a directory, a device, a socket...
    #[error("{header} names {}, which is not a regular file", .path.display())]
    NotAFile {
        /// The header.
        header: &'static str,
        /// The file.
        path: PathBuf,
    },
    /// The file system did not answer in time.
    #[error("{header} names {}, which could not be opened: {source}", .path.display())]
    Stalled {
        /// The header.
        header: &'static str,
        /// The file.
        path: PathBuf,
        /// The timeout.
        source: std::io::Error,
    },
}

impl SendfileError {
    /// 404 when the file is not there, 503 when the file system did not answer, 500 when the
    /// backend asked for what the configuration does not allow (the client did nothing wrong,
    /// and learns nothing of the rule).
    pub(super) fn status(&self) -> http::StatusCode {
        match self {
            SendfileError::Missing { .. } | SendfileError::NotAFile { .. } => {
                http::StatusCode::NOT_FOUND
            }
            SendfileError::Stalled { .. } => http::StatusCode::SERVICE_UNAVAILABLE,
            _ => http::StatusCode::INTERNAL_SERVER_ERROR,
        }
    }
}

/// Whether the backend's response names a file, and which; an error when it names several.
pub(super) fn asked(headers: &[(Bytes, Bytes)]) -> Result<Option<Ask<'_>>, SendfileError> {
    let mut asks = headers.iter().filter_map(|(n, v)| {
        if eq_ignore_case(n, X_SENDFILE) {
            Some(Ask::Sendfile(&v[..]))
        } else if eq_ignore_case(n, X_ACCEL_REDIRECT) {
            Some(Ask::Accel(&v[..]))
        } else {
            None
        }
    });
    let first = asks.next();
    let more = asks.count();
    if more > 0 {
        return Err(SendfileError::Several { count: more + 1 });
    }
    Ok(first)
}

/// Whether a backend response header is meant for the proxy, never the client: X-Sendfile
/// (and `X-Sendfile-Temporary` and the like) and every `X-Accel-*` (nginx hides them too).
pub(super) fn is_proxy_instruction(name: &[u8]) -> bool {
    let starts = |prefix: &[u8]| {
        name.get(..prefix.len())
            .is_some_and(|p| p.eq_ignore_ascii_case(prefix))
    };
    starts(X_SENDFILE) || starts(b"x-accel-")
}

/// Whether a request header is one that only the proxy may send to the backend.
pub(super) fn is_proxy_request_header(name: &[u8]) -> bool {
    name.eq_ignore_ascii_case(b"x-sendfile-type") || name.eq_ignore_ascii_case(b"x-accel-mapping")
}

/// The CGI variables telling the backend how it may name files, when the context allows any.
pub(super) fn backend_vars(config: &ContextConfig) -> Vec<(Bytes, Bytes)> {
    if !config.sendfile_dirs.is_empty() {
        return vec![(
            Bytes::from_static(b"HTTP_X_SENDFILE_TYPE"),
            Bytes::from_static(b"X-Sendfile"),
        )];
    }
    if config.accel_redirect.is_empty() {
        return Vec::new();
    }
    let mut mapping = Vec::new();
    for (i, (prefix, dir)) in config.accel_redirect.iter().enumerate() {
        if i > 0 {
            mapping.push(b',');
        }
        mapping.extend_from_slice(dir.as_os_str().as_bytes());
        if !mapping.ends_with(b"/") {
            mapping.push(b'/');
        }
        mapping.push(b'=');
        mapping.extend_from_slice(prefix.as_bytes());
    }
    vec![
        (
            Bytes::from_static(b"HTTP_X_SENDFILE_TYPE"),
            Bytes::from_static(b"X-Accel-Redirect"),
        ),
        (
            Bytes::from_static(b"HTTP_X_ACCEL_MAPPING"),
            Bytes::from(mapping),
        ),
    ]
}

/// The answer for a backend response that names a file with `ask`: the file, with the
/// backend's `status` and `headers` (already without those that described its body), or a
/// refusal. `request` is the client's request head (for Range).
pub(super) async fn answer(
    context: &ContextConfig,
    ask: Ask<'_>,
    status: StatusCode,
    request: &http::HeaderMap,
    mut headers: http::HeaderMap,
    request_id: u64,
) -> Response<HttpBody> {
    if status == StatusCode::NO_CONTENT || status == StatusCode::NOT_MODIFIED {
        // An answer without a body (a conditional GET the app answered 304):
        // nothing to send, whatever file the header names.
        let mut resp = Response::new(FrontBody::full(Bytes::new()));
        *resp.status_mut() = status;
        *resp.headers_mut() = headers;
        return resp;
    }
    match open(context, ask).await {
        Ok((opened, len, real)) => {
            // The backend's type stands, as nginx keeps the upstream's for X-Accel-Redirect:
            // an app that serves an upload as `text/plain` with `nosniff` must not see it go
            // out as `text/html` (stored XSS on its origin). The extension decides only
            // when the backend sent no type at all. (PHP sends `text/html` unless the
            // script names a type: the app names its file's type, as it must for nginx.)
            if !headers.contains_key(http::header::CONTENT_TYPE) {
                headers.insert(
                    http::header::CONTENT_TYPE,
                    HeaderValue::from_static(file::content_type(&real)),
                );
            }
            tracing::debug!(request_id, file = %real.display(), "sending the file the backend named");
            file::file_answer(opened, len, status, request, headers)
        }
        Err(e) => refused(request_id, &e),
    }
}

/// The answer when the file a backend named is not sent, with its log line.
pub(super) fn refused(request_id: u64, e: &SendfileError) -> Response<HttpBody> {
    let status = e.status();
    tracing::warn!(request_id, status = status.as_u16(), error = %crate::logs::clean(e), "refused to send the file the backend named");
    let reason = status.canonical_reason().unwrap_or("Error");
    plain(status, &format!("{} {reason}\n", status.as_u16()))
}

/// The file the backend named, opened, with its length and real path (the allowed
/// directory as configured, joined with the file's real path beneath it).
pub(super) async fn open(
    config: &ContextConfig,
    ask: Ask<'_>,
) -> Result<(FileData, u64, PathBuf), SendfileError> {
    let header = ask.header();
    let (path, dir, key) = match ask {
        Ask::Sendfile(value) => {
            if config.sendfile_dirs.is_empty() {
                return Err(not_enabled(ask, "sendfile_dirs"));
            }
            let path = clean_path(value).ok_or_else(|| SendfileError::BadPath {
                header,
                value: value.to_vec(),
            })?;
            let dir = config
                .sendfile_dirs
                .iter()
                .find(|d| path.starts_with(d))
                .ok_or_else(|| SendfileError::NotAllowed {
                    header,
                    value: value.to_vec(),
                    key: "sendfile_dirs",
                })?;
            (path, dir, "sendfile_dirs")
        }
        Ask::Accel(value) => {
            if config.accel_redirect.is_empty() {
                return Err(not_enabled(ask, "accel_redirect"));
            }
            let uri = parse_request_path(value).map_err(|e| SendfileError::BadUri {
                value: value.to_vec(),
                reason: e.to_string(),
            })?;
            let norm = &uri.normalized[..];
            let (rest, dir) = config
                .accel_redirect
                .iter()
                .find_map(|(prefix, dir)| Some((norm.strip_prefix(prefix.as_bytes())?, dir)))
                .ok_or_else(|| SendfileError::NotAllowed {
                    header,
                    value: value.to_vec(),
                    key: "accel_redirect",
                })?;
            // `rest` is normalised: no `.`, `..` or empty segment, no leading `/`.
            (dir.join(OsStr::from_bytes(rest)), dir, "accel_redirect")
        }
    };
    // `rel` is clean (no `.`, `..` or empty segment): opened beneath the allowed directory,
    // and judged by the descriptor that was opened (ARCHITECTURE.md invariant 17).
    let rel =
        path.strip_prefix(dir)
            .map(Path::to_path_buf)
            .map_err(|_| SendfileError::NotAllowed {
                header,
                value: ask.value().to_vec(),
                key,
            })?;
    let walked = file::off_thread({
        let (dir, path) = (dir.clone(), path.clone());
        move || {
            let opened_dir = Dir::open(&dir).map_err(|source| SendfileError::Dir {
                key,
                dir: dir.clone(),
                source,
            })?;
            let opened = match open_beneath(&opened_dir, &rel, Access::Read) {
                Ok(o) => o,
                Err(OpenError::Outside { real, dir }) => {
                    return Err(SendfileError::Escapes {
                        header,
                        path,
                        real,
                        dir,
                    })
                }
                Err(OpenError::Io(source)) => {
                    return Err(SendfileError::Missing {
                        header,
                        path,
                        source,
                    })
                }
            };
            if !opened.meta.is_file() {
                return Err(SendfileError::NotAFile { header, path });
            }
            let real = dir.join(opened.real_rel(&rel));
            let (data, len) = file::load(opened.file, opened.meta.len(), true)
                .map_err(|source| SendfileError::Missing {
                    header,
                    path: path.clone(),
                    source,
                })?
                .into_data();
            Ok((data, len, real))
        }
    })
    .await;
    walked.unwrap_or_else(|source| {
        Err(SendfileError::Stalled {
            header,
            path,
            source,
        })
    })
}

fn not_enabled(ask: Ask<'_>, key: &'static str) -> SendfileError {
    SendfileError::NotEnabled {
        header: ask.header(),
        value: ask.value().to_vec(),
        key,
    }
}

/// An X-Sendfile value as a path: absolute, no NUL, no `.`, `..` or empty segment (so what
/// was checked against `sendfile_dirs` is what the file system walks).
fn clean_path(value: &[u8]) -> Option<PathBuf> {
    let value = value.trim_ascii();
    let rest = value.strip_prefix(b"/")?;
    let clean = !value.contains(&0)
        && !rest.is_empty()
        && rest
            .split(|&c| c == b'/')
            .all(|s| !s.is_empty() && s != b"." && s != b"..");
    clean.then(|| Path::new(OsStr::from_bytes(value)).to_path_buf())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sendfile_paths_are_absolute_and_clean() {
        assert_eq!(
            clean_path(b"/srv/private/a.pdf"),
            Some(PathBuf::from("/srv/private/a.pdf"))
        );
        for bad in [
            &b"srv/a"[..],
            b"/",
            b"/srv/../etc/passwd",
            b"/srv/./a",
            b"/srv//a",
            b"/srv/a/",
            b"/srv/a\0b",
        ] {
            assert_eq!(clean_path(bad), None, "{}", bad.escape_ascii());
        }
    }

    #[test]
    fn proxy_headers_are_recognised_in_any_case() {
        assert!(is_proxy_instruction(b"X-Sendfile"));
        assert!(is_proxy_instruction(b"x-accel-redirect"));
        assert!(is_proxy_instruction(b"X-Accel-Buffering"));
        assert!(!is_proxy_instruction(b"X-Accel"));
        assert!(!is_proxy_instruction(b"X-Powered-By"));
        let two = [
            (Bytes::from_static(b"X-Sendfile"), Bytes::from_static(b"/a")),
            (
                Bytes::from_static(b"x-accel-redirect"),
                Bytes::from_static(b"/b"),
            ),
        ];
        assert!(matches!(
            asked(&two),
            Err(SendfileError::Several { count: 2 })
        ));
        assert!(matches!(asked(&two[1..]), Ok(Some(Ask::Accel(b"/b")))));
    }
}
