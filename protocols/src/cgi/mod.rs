//! CGI/1.1 meta-variables (RFC 3875 §4.1) for one request, built with corral's security
//! defaults: strict script/PATH_INFO splitting, no `..` above the root, httpoxy and
//! underscore-header filtering, and clean-up of what front servers send.
//!
//! Two entry points produce the same [`CgiVars`]:
//! - [`build_cgi_vars`] turns a neutral description of an HTTP request ([`CgiRequest`]) into
//!   the variables nginx's `fastcgi_params` sends and php-cgi/php-fpm expect;
//! - [`normalize_front`] filters and completes the variables a front server (nginx,
//!   Apache, lighttpd, Caddy) sent over FastCGI or SCGI, the way php-fpm does, from the
//!   pairs as they arrived ([`FrontParams`], indexed once as they were decoded).
//!
//! Nothing here touches the file system: SCRIPT_FILENAME is built lexically from the context's
//! document root, and the caller checks the real file (realpath, regular file, still inside the
//! root) before handing the request to a backend.

mod encode;
mod front;
mod front_checks;
mod front_names;
#[cfg(test)]
mod front_oracle;
mod front_params;
#[cfg(test)]
mod front_tests;
mod front_work;
mod headers;
mod host;
mod normal;
mod params;
mod path;
mod prepared;
#[cfg(test)]
mod prepared_tests;

use bytes::Bytes;

use crate::Limits;

pub use encode::{encode_cgi_vars, encode_prepared};
pub use front::{
    normalize_front, normalize_front_params, normalize_front_prepared, normalize_front_with,
    FrontVars,
};
pub use front_params::{FrontParams, Known};
pub use headers::dropped_headers;
pub use host::check_host;
pub use params::{CgiParams, Pairs};
pub use path::{
    has_allowed_ext, has_hidden_segment, normalize_decoded_path, parse_request_path,
    split_request_path, split_script_path, static_file_path, RequestPath, ScriptPath,
};
pub use prepared::{PreparedContext, RemoteVars, ServerVars};

/// The GATEWAY_INTERFACE value corral speaks.
pub const GATEWAY_INTERFACE: &[u8] = b"CGI/1.1";

/// How many bytes of an offending value an error message quotes.
const SNIPPET_LEN: usize = 64;

/// How a context maps request paths to what its backend runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ScriptMode {
    /// Script files under the document root, PHP style: the first path segment that ends
    /// with one of `extensions` is the script and the rest is PATH_INFO; a directory path
    /// gets the first entry of `index` whose extension is allowed.
    Files {
        /// Allowed script extensions, with or without the leading dot (`"php"`, `".phar"`).
        /// Matched byte for byte: `x.PHP` is not a `php` script.
        extensions: Vec<Vec<u8>>,
        /// Index file names tried, in order, for a path that ends with `/`.
        index: Vec<Vec<u8>>,
    },
    /// One application mounted at a path prefix (WSGI, Rack): SCRIPT_NAME is the mount point
    /// and PATH_INFO the rest of the path; there is no SCRIPT_FILENAME.
    App {
        /// Mount prefix, `""` or `"/"` for the whole site, otherwise `"/app"` style.
        mount: Vec<u8>,
    },
}

/// What a context says about CGI variables: trusted configuration, never request data.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CgiContext {
    /// Absolute document root without `.` or `..` segments (`/var/www/html`).
    pub document_root: Vec<u8>,
    /// How paths map to scripts.
    pub mode: ScriptMode,
    /// SERVER_SOFTWARE value (`corral/0.1.0`).
    pub server_software: Bytes,
    /// Extra variables appended last; one with the name of a built variable replaces it.
    pub extra_env: Vec<(Bytes, Bytes)>,
    /// Whether PHP_VALUE / PHP_ADMIN_VALUE sent by a front server are passed on.
    pub allow_php_ini_params: bool,
}

/// A neutral description of one HTTP request, as the front listener parsed it.
#[derive(Debug, Clone, Copy)]
pub struct CgiRequest<'a> {
    /// Request method (`GET`); must be an HTTP token.
    pub method: &'a [u8],
    /// Raw request target as received: origin-form `/path?query` or absolute-form
    /// `http://host/path?query`, still percent-encoded.
    pub target: &'a [u8],
    /// Protocol version (`HTTP/1.1`).
    pub protocol: &'a [u8],
    /// Header fields in arrival order, names in any case.
    pub headers: &'a [(&'a [u8], &'a [u8])],
    /// Length of the body corral will forward, when the front listener framed it (for
    /// example after de-chunking). When set it is CONTENT_LENGTH and any Content-Length
    /// header is ignored; when `None` the Content-Length header (if any) is used.
    pub body_length: Option<u64>,
    /// Client address as text (`192.0.2.7`, `2001:db8::1`); empty when unknown, and then
    /// REMOTE_ADDR is left out.
    pub remote_addr: &'a [u8],
    /// Client port; `None` for Unix sockets.
    pub remote_port: Option<u16>,
    /// Address the request arrived on, as text.
    pub server_addr: &'a [u8],
    /// Port the request arrived on; `None` for Unix sockets.
    pub server_port: Option<u16>,
    /// Server name (the context's host name, or the Host header's host part).
    pub server_name: &'a [u8],
    /// Whether the client connection used TLS.
    pub https: bool,
}

/// Why a header or parameter was left out of the CGI variables.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DropReason {
    /// The `Proxy` header / `HTTP_PROXY` variable (httpoxy, CVE-2016-5385).
    Httpoxy,
    /// A header name containing `_`, which could collide with a `-` name once mapped.
    Underscore,
    /// A header name with a byte outside `[A-Za-z0-9-]` (`X-Auth.User`): PHP maps `.` and
    /// space to `_`, so it could impersonate the `-` spelling.
    NameChars,
    /// A hop-by-hop header (Connection, Transfer-Encoding, ...): it described the client
    /// connection, which corral terminated.
    HopByHop,
    /// PHP_VALUE / PHP_ADMIN_VALUE from a front server while the context does not allow them.
    PhpIni,
    /// SCRIPT_FILENAME or PATH_TRANSLATED from a front server for a context without a
    /// document root, where nothing could check the file they name.
    NoRoot,
    /// A front-server parameter repeated later with a new value (the last one is kept, as
    /// php-fpm does).
    Duplicate,
    /// A name corral itself sends its workers (`CORRAL_READY_PROBE`, the launchers' readiness
    /// probe, answered without calling the app): never taken from a front server.
    Reserved,
}

/// A header or parameter that was left out, for the caller to log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Dropped {
    /// The name as it arrived.
    pub name: Bytes,
    /// Why it was left out.
    pub reason: DropReason,
}

/// The CGI variables for one request, in the order a backend should receive them.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct CgiVars {
    /// Name-value pairs; every name appears once.
    pub vars: Vec<(Bytes, Bytes)>,
    /// Headers or parameters left out, for logging.
    pub dropped: Vec<Dropped>,
}

impl CgiVars {
    /// The value of variable `name`, if present.
    pub fn get(&self, name: &[u8]) -> Option<&Bytes> {
        self.vars.iter().find(|(n, _)| n == name).map(|(_, v)| v)
    }
}

/// A rule the request, the front server's parameters or the context broke.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CgiError {
    /// The request target is neither origin-form nor absolute-form.
    #[error("request target \"{}\" is neither an absolute path nor an absolute URI", .target.escape_ascii())]
    TargetForm {
        /// The start of the target.
        target: Vec<u8>,
    },
    /// The request target holds a byte a target may not hold.
    #[error("request target holds byte 0x{byte:02x}, which a request target may not contain")]
    TargetByte {
        /// The byte.
        byte: u8,
    },
    /// A `%` not followed by two hexadecimal digits.
    #[error("request path \"{}\" has a '%' not followed by two hex digits", .path.escape_ascii())]
    BadPercentEscape {
        /// The start of the path.
        path: Vec<u8>,
    },
    /// A percent-encoded NUL, CR or LF in the path.
    #[error("request path decodes to byte 0x{byte:02x} (NUL, CR and LF are refused in paths)")]
    ForbiddenPathByte {
        /// The decoded byte.
        byte: u8,
    },
    /// A percent-encoded `/` (`%2F`), which would make two different paths look alike.
    #[error("request path \"{}\" has an encoded '/' (%2F), which corral refuses", .path.escape_ascii())]
    EncodedSlash {
        /// The start of the path.
        path: Vec<u8>,
    },
    /// A `\` in the path, raw or encoded: a separator on some systems, refused everywhere.
    #[error("request path \"{}\" has a backslash, which corral refuses", .path.escape_ascii())]
    Backslash {
        /// The start of the path.
        path: Vec<u8>,
    },
    /// A `..` segment that would climb above the document root.
    #[error("path \"{}\" climbs above the document root with '..'", .path.escape_ascii())]
    EscapesRoot {
        /// The start of the path.
        path: Vec<u8>,
    },
    /// No path segment ends with an allowed script extension.
    #[error("path \"{}\" names no script with an allowed extension", .path.escape_ascii())]
    NotAScript {
        /// The start of the normalised path.
        path: Vec<u8>,
    },
    /// A path segment starts with `.` (`.env`, `.git`, `.user.ini`): never served or run.
    #[error("path \"{}\" has a hidden segment (one starting with '.'), which corral neither serves nor runs", .path.escape_ascii())]
    Hidden {
        /// The start of the normalised path.
        path: Vec<u8>,
    },
    /// A directory path, and no index file has an allowed extension.
    #[error("path \"{}\" is a directory and no index file has an allowed extension", .path.escape_ascii())]
    NoIndex {
        /// The start of the normalised path.
        path: Vec<u8>,
    },
    /// In app mode, a path outside the application's mount point.
    #[error("path \"{}\" is outside the application mount point", .path.escape_ascii())]
    OutsideMount {
        /// The start of the normalised path.
        path: Vec<u8>,
    },
    /// The method is not an HTTP token.
    #[error("request method \"{}\" is not an HTTP token", .method.escape_ascii())]
    InvalidMethod {
        /// The start of the method.
        method: Vec<u8>,
    },
    /// A header name that is not an HTTP token.
    #[error("header name \"{}\" is not an HTTP token", .name.escape_ascii())]
    InvalidHeaderName {
        /// The start of the name.
        name: Vec<u8>,
    },
    /// A header value with a control byte (NUL, CR, LF, ...).
    #[error("value of header \"{}\" holds a control byte", .name.escape_ascii())]
    InvalidHeaderValue {
        /// The start of the header name.
        name: Vec<u8>,
    },
    /// A Content-Length header that is not a decimal number.
    #[error("Content-Length \"{}\" is not a decimal number", .value.escape_ascii())]
    InvalidContentLength {
        /// The start of the value.
        value: Vec<u8>,
    },
    /// A Host (or a front server's HTTP_HOST) that no host name looks like.
    #[error("{reason}: \"{}\"", .value.escape_ascii())]
    InvalidHost {
        /// The start of the value.
        value: Vec<u8>,
        /// What is wrong with it, e.g. "Host holds a '/'".
        reason: &'static str,
    },
    /// Two Content-Length headers with different values.
    #[error("Content-Length is given twice with different values")]
    ConflictingContentLength,
    /// Content-Type given more than once.
    #[error("Content-Type is given more than once")]
    RepeatedContentType,
    /// A field of the request description or a front parameter value holds NUL, CR or LF.
    #[error("{field} \"{}\" holds NUL, CR or LF", .value.escape_ascii())]
    ForbiddenByte {
        /// Which field or parameter.
        field: String,
        /// The start of the value.
        value: Vec<u8>,
    },
    /// A front-server parameter name that cannot be a CGI variable name.
    #[error("parameter name \"{}\" is empty or holds NUL or '='", .name.escape_ascii())]
    InvalidParamName {
        /// The start of the name.
        name: Vec<u8>,
    },
    /// SCRIPT_FILENAME from a front server is not inside the context's document root. Most
    /// often the front server's root and the context's `root` name different directories,
    /// so both are named.
    #[error(
        "SCRIPT_FILENAME \"{}\" is not inside the context's root \"{}\"{}: the front server's \
         root and the context's root must name the same directory",
        .path.escape_ascii(),
        .root.escape_ascii(),
        .front_root.as_ref().map(|r| format!(" (the front server's DOCUMENT_ROOT is \"{}\")", r.escape_ascii())).unwrap_or_default()
    )]
    OutsideRoot {
        /// The start of the path.
        path: Vec<u8>,
        /// The context's document root.
        root: Vec<u8>,
        /// The DOCUMENT_ROOT the front server sent, if any (its start).
        front_root: Option<Vec<u8>>,
    },
    /// The front server sent nothing to derive the script from.
    #[error(
        "front parameters have none of SCRIPT_FILENAME, SCRIPT_NAME, DOCUMENT_URI, REQUEST_URI"
    )]
    NoScriptInfo,
    /// The context itself is unusable (bad root, extension or index name).
    #[error("CGI context is invalid: {0}")]
    InvalidContext(&'static str),
    /// More variables than `max_params_count`.
    #[error("{count} CGI variables exceed the limit of {limit}")]
    TooManyVars {
        /// How many.
        count: usize,
        /// The limit.
        limit: usize,
    },
    /// A variable name longer than `max_name_len`.
    #[error("CGI variable name \"{}\" is longer than {limit} bytes", .name.escape_ascii())]
    NameTooLong {
        /// The start of the name.
        name: Vec<u8>,
        /// The limit.
        limit: usize,
    },
    /// A variable value longer than `max_value_len`.
    #[error("value of CGI variable \"{}\" is {len} bytes, over the limit of {limit}", .name.escape_ascii())]
    ValueTooLong {
        /// The variable name.
        name: Vec<u8>,
        /// Its length.
        len: usize,
        /// The limit.
        limit: usize,
    },
    /// All names and values together exceed `max_params_bytes`.
    #[error("CGI variables total {total} bytes, over the limit of {limit}")]
    VarsTooLarge {
        /// Sum of name and value lengths.
        total: usize,
        /// The limit.
        limit: usize,
    },
}

/// The first bytes of `b`, for an error message.
pub(crate) fn snippet(b: &[u8]) -> Vec<u8> {
    b.get(..SNIPPET_LEN).unwrap_or(b).to_vec()
}

/// Whether `b` is an HTTP token (RFC 9110 §5.6.2).
pub(crate) fn is_token(b: &[u8]) -> bool {
    !b.is_empty() && token_run(b) == b.len()
}

/// The length of the run of token characters at the start of `b`. Eight bytes at a time:
/// each byte's entry in [`NOT_TCHAR`] is one bit of a mask, whose lowest set bit is the first
/// byte that is no token character (one branch per eight bytes, not one per byte); the last
/// bytes short of a word one by one.
#[inline]
pub(crate) fn token_run(b: &[u8]) -> usize {
    let mut len = 0;
    while let Some(word) = b.get(len..).and_then(<[u8]>::first_chunk::<8>) {
        let mut stop = 0u32;
        for (i, &c) in word.iter().enumerate() {
            stop |= u32::from(NOT_TCHAR.get(usize::from(c)).copied().unwrap_or(1)) << i;
        }
        if stop != 0 {
            return len + stop.trailing_zeros() as usize;
        }
        len += 8;
    }
    while let Some(&c) = b.get(len) {
        if !is_tchar(c) {
            break;
        }
        len += 1;
    }
    len
}

/// Whether `b` is a token character, for tables built at compile time.
const fn is_tchar_const(b: u8) -> bool {
    b.is_ascii_alphanumeric()
        || matches!(
            b,
            b'!' | b'#'
                | b'$'
                | b'%'
                | b'&'
                | b'\''
                | b'*'
                | b'+'
                | b'-'
                | b'.'
                | b'^'
                | b'_'
                | b'`'
                | b'|'
                | b'~'
        )
}

/// The token characters, one entry per byte: every header name of every request is checked
/// against it, and a table costs one load where the list of symbols cost a scan.
#[allow(clippy::indexing_slicing)] // `c` runs over 0..256, the table's own length.
const TCHAR: [bool; 256] = {
    let mut table = [false; 256];
    let mut c = 0;
    while c < 256 {
        table[c] = is_tchar_const(c as u8);
        c += 1;
    }
    table
};

/// 1 for each byte that is no token character, 0 for the others: [`token_run`]'s mask bits.
#[allow(clippy::indexing_slicing)] // `c` runs over 0..256, the table's own length.
const NOT_TCHAR: [u8; 256] = {
    let mut table = [0u8; 256];
    let mut c = 0;
    while c < 256 {
        table[c] = !TCHAR[c] as u8;
        c += 1;
    }
    table
};

/// Whether `c` may stand in an HTTP token.
pub(crate) fn is_tchar(c: u8) -> bool {
    TCHAR.get(usize::from(c)).copied().unwrap_or(false)
}

/// Whether `b` holds NUL, CR or LF.
pub(crate) fn has_nul_cr_lf(b: &[u8]) -> bool {
    // Eight bytes at a time: every parameter of every request goes through here. A byte of
    // `w ^ splat(c)` is zero where `w` holds `c`; `(x - 0x01..) & !x & 0x80..` is non-zero
    // exactly when some byte of `x` is zero (the classic test, exact for "any").
    const ONES: u64 = 0x0101_0101_0101_0101;
    const HIGHS: u64 = 0x8080_8080_8080_8080;
    let zero_byte = |x: u64| x.wrapping_sub(ONES) & !x & HIGHS != 0;
    let mut chunks = b.chunks_exact(8);
    for chunk in &mut chunks {
        let mut word = [0u8; 8];
        word.copy_from_slice(chunk);
        let w = u64::from_ne_bytes(word);
        if zero_byte(w)
            || zero_byte(w ^ (ONES * u64::from(b'\r')))
            || zero_byte(w ^ (ONES * u64::from(b'\n')))
        {
            return true;
        }
    }
    chunks
        .remainder()
        .iter()
        .any(|&c| matches!(c, 0 | b'\r' | b'\n'))
}

fn check_field(field: &str, value: &[u8]) -> Result<(), CgiError> {
    if has_nul_cr_lf(value) {
        return Err(CgiError::ForbiddenByte {
            field: field.to_owned(),
            value: snippet(value),
        });
    }
    Ok(())
}

/// Builds the CGI variables for `req` in context `ctx`, in nginx `fastcgi_params` order, then
/// the HTTP_* headers, then the context's extra variables.
///
/// Errors name the broken rule; path errors ([`CgiError::NotAScript`],
/// [`CgiError::EscapesRoot`], ...) are the caller's 403/404, the others its 400, and the
/// limit errors its 431 or 414.
pub fn build_cgi_vars(
    req: &CgiRequest<'_>,
    ctx: &CgiContext,
    limits: &Limits,
) -> Result<CgiVars, CgiError> {
    let path = path::parse_request_path(req.target)?;
    build_cgi_vars_for(req, &path, ctx, limits)
}

/// [`build_cgi_vars`] for a target the caller has already parsed (and routed on): every
/// variable comes from `path`, and `req.target` is not read again.
pub fn build_cgi_vars_for(
    req: &CgiRequest<'_>,
    path: &RequestPath<'_>,
    ctx: &CgiContext,
    limits: &Limits,
) -> Result<CgiVars, CgiError> {
    let params = encode_cgi_vars(req, path, ctx, limits)?;
    let dropped = dropped_headers(req.headers).collect();
    Ok(CgiVars {
        vars: params.to_pairs(),
        dropped,
    })
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_token_run_stops_at_the_first_byte_that_is_no_token_character() {
        for len in 0..20 {
            let clean: Vec<u8> = (0..len).map(|i| b"aZ9!#$%&'*+-.^_`|~"[i % 18]).collect();
            assert_eq!(super::token_run(&clean), len);
            assert_eq!(super::is_token(&clean), len > 0);
            for at in 0..len {
                for c in 0..=255u8 {
                    let mut b = clean.clone();
                    b[at] = c;
                    let naive = b.iter().position(|&c| !super::is_tchar(c)).unwrap_or(len);
                    assert_eq!(super::token_run(&b), naive, "len {len} at {at} byte {c:#x}");
                    assert_eq!(super::is_token(&b), naive == len && len > 0);
                }
            }
        }
    }

    use super::has_nul_cr_lf;

    #[test]
    fn decimal_writes_every_width() {
        for n in [0u64, 7, 10, 65535, 1234567890, u64::MAX] {
            let mut buf = [0u8; 20];
            assert_eq!(
                super::encode::decimal(n, &mut buf),
                n.to_string().as_bytes()
            );
        }
    }

    #[test]
    fn the_word_at_a_time_scan_finds_every_forbidden_byte_anywhere() {
        let naive = |b: &[u8]| b.iter().any(|&c| matches!(c, 0 | b'\r' | b'\n'));
        for len in 0..40 {
            let clean: Vec<u8> = (0..len).map(|i| b'a' + (i % 26) as u8).collect();
            assert!(!has_nul_cr_lf(&clean), "len {len}");
            for at in 0..len {
                // Forbidden bytes, and their neighbours that a sloppy mask would confuse.
                for bad in [0u8, b'\r', b'\n', 1, 0x0e, 0x0c, 0x8d, 0x80, 0xff] {
                    let mut v = clean.clone();
                    v[at] = bad;
                    assert_eq!(
                        has_nul_cr_lf(&v),
                        naive(&v),
                        "len {len} at {at} byte {bad:#x}"
                    );
                }
            }
        }
    }
}
