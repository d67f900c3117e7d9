//! From a decoded BEGIN_REQUEST to what PHP reads: `$_SERVER` (the request headers as
//! `HTTP_*`, then corral's CGI variables, then `PHP_SELF` as php-cgi adds it), registered
//! straight from the decoded packet when PHP asks ([`Server`]), and the fields PHP takes at
//! request startup (method, query, URI, body type and length, script, cookies,
//! authorization) as C strings in one buffer ([`RequestInfo`]).
//!
//! The CGI variables the worker itself needs are found in one pass over the packet's
//! variables ([`Known`]); nothing is copied but those few C strings (callgrind: building a
//! copy of every variable first, and a string allocation per startup field, cost about as
//! many instructions as PHP's own request startup).

use std::cell::{Cell, RefCell};

use bytes::Bytes;
use corral_protocols::lsapi::RequestView;

use crate::php::{self, Zval};

/// The CGI variables the worker reads, each the last of its name in the packet (as a later
/// variable replaces an earlier one in `$_SERVER`).
#[derive(Default)]
pub struct Known<'a> {
    /// SCRIPT_FILENAME.
    pub script_filename: Option<&'a [u8]>,
    /// SCRIPT_NAME.
    pub script_name: Option<&'a [u8]>,
    /// PATH_INFO.
    pub path_info: Option<&'a [u8]>,
    /// REQUEST_METHOD.
    pub request_method: Option<&'a [u8]>,
    /// REQUEST_URI.
    pub request_uri: Option<&'a [u8]>,
    /// QUERY_STRING.
    pub query_string: Option<&'a [u8]>,
    /// CONTENT_TYPE.
    pub content_type: Option<&'a [u8]>,
    /// HTTP_COOKIE.
    pub cookie: Option<&'a [u8]>,
    /// HTTP_AUTHORIZATION.
    pub authorization: Option<&'a [u8]>,
    /// CORRAL_READY_PROBE: corral asking whether the worker is up.
    pub probe: Option<&'a [u8]>,
}

impl<'a> Known<'a> {
    /// The variables of `begin` the worker reads, in one pass.
    pub fn of(begin: &'a RequestView) -> Known<'a> {
        let mut k = Known::default();
        for (name, value) in begin.env() {
            let slot = match name {
                b"SCRIPT_FILENAME" => &mut k.script_filename,
                b"SCRIPT_NAME" => &mut k.script_name,
                b"PATH_INFO" => &mut k.path_info,
                b"REQUEST_METHOD" => &mut k.request_method,
                b"REQUEST_URI" => &mut k.request_uri,
                b"QUERY_STRING" => &mut k.query_string,
                b"CONTENT_TYPE" => &mut k.content_type,
                b"HTTP_COOKIE" => &mut k.cookie,
                b"HTTP_AUTHORIZATION" => &mut k.authorization,
                b"CORRAL_READY_PROBE" => &mut k.probe,
                _ => continue,
            };
            *slot = Some(value);
        }
        k
    }

    /// The script to run: the packet's script field, else SCRIPT_FILENAME (empty: none).
    pub fn script(&self, begin: &'a RequestView) -> &'a [u8] {
        begin
            .script_filename()
            .or(self.script_filename)
            .unwrap_or_default()
    }

    /// Whether this is corral's readiness probe (`CORRAL_READY_PROBE=1`).
    pub fn is_probe(&self) -> bool {
        self.probe == Some(b"1")
    }
}

/// What `$_SERVER` is filled from.
pub enum Server {
    /// A request's: its headers, then corral's variables, then PHP_SELF (SCRIPT_NAME and
    /// PATH_INFO joined). The view goes back to [`spare_view`] when this is dropped (it is
    /// `None` only then: taking the box out leaves nothing to allocate in its place).
    Request(Option<Box<RequestView>>),
    /// Fixed entries (the worker script's boot request).
    Fixed(Vec<(&'static str, Bytes)>),
}

/// Longest key built on the stack (`HTTP_` and a header name, or PHP_SELF's value); a
/// longer one takes an allocation.
const STACK_KEY: usize = 128;

impl Server {
    /// A request's variables, read from `view`.
    pub fn request(view: Box<RequestView>) -> Server {
        Server::Request(Some(view))
    }

    /// Registers every entry into `track_vars`; `keep_keys`: through the keys kept from the
    /// request before ([`crate::keys`], worker mode).
    pub fn register(&self, track_vars: *mut Zval, keep_keys: bool) {
        let mut at = 0;
        let mut put = |key: &[u8], value: &[u8]| {
            if keep_keys {
                crate::keys::register(track_vars, at, key, value);
                at += 1;
            } else {
                php::register_variable(track_vars, key, value);
            }
        };
        match self {
            Server::Fixed(entries) => {
                for (key, value) in entries {
                    php::register_variable(track_vars, key.as_bytes(), value);
                }
            }
            Server::Request(None) => {}
            Server::Request(Some(begin)) => {
                for (name, value) in begin.headers() {
                    with_header_key(name, |key| put(key, value));
                }
                let mut known = Known::default();
                for (name, value) in begin.env() {
                    put(name, value);
                    match name {
                        b"SCRIPT_NAME" => known.script_name = Some(value),
                        b"PATH_INFO" => known.path_info = Some(value),
                        _ => {}
                    }
                }
                let parts = [known.script_name, known.path_info].map(Option::unwrap_or_default);
                with_joined(&parts, |self_| put(b"PHP_SELF", self_));
            }
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if let Server::Request(view) = self {
            if let Some(view) = view.take() {
                SPARE.with(|s| *s.borrow_mut() = Some(view));
            }
        }
    }
}

thread_local! {
    /// The view of the last request, kept for the next one to decode into: its buffers
    /// have already grown, so a request on a kept connection allocates nothing to decode.
    static SPARE: RefCell<Option<Box<RequestView>>> = const { RefCell::new(None) };
}

/// A view to decode the next request into: the last request's, or a new one.
pub fn spare_view() -> Box<RequestView> {
    SPARE.with(|s| s.borrow_mut().take()).unwrap_or_default()
}

/// Calls `f` with `parts` joined, on the stack when they fit in [`STACK_KEY`] bytes.
fn with_joined(parts: &[&[u8]], f: impl FnOnce(&[u8])) {
    let len: usize = parts.iter().map(|p| p.len()).sum();
    let mut stack = [0u8; STACK_KEY];
    if let Some(dst) = stack.get_mut(..len) {
        let mut at = 0;
        for part in parts {
            if let Some(d) = dst.get_mut(at..at + part.len()) {
                d.copy_from_slice(part);
            }
            at += part.len();
        }
        f(dst);
    } else {
        f(&parts.concat());
    }
}

/// Calls `f` with request header `name` as CGI names it (`HTTP_X_FORWARDED_FOR`;
/// `CONTENT_TYPE` and `CONTENT_LENGTH` are CGI's own names); `Transfer-Encoding` is left out
/// (the body always arrives with its length: corral reads chunked bodies first), and so is
/// an empty name.
pub fn with_header_key(name: &[u8], f: impl FnOnce(&[u8])) {
    if name.is_empty() || name.eq_ignore_ascii_case(b"transfer-encoding") {
        return;
    }
    let own =
        name.eq_ignore_ascii_case(b"content-type") || name.eq_ignore_ascii_case(b"content-length");
    let prefix: &[u8] = if own { b"" } else { b"HTTP_" };
    let cgi = |b: &u8| match b {
        b'-' => b'_',
        b => b.to_ascii_uppercase(),
    };
    let len = prefix.len() + name.len();
    let mut stack = [0u8; STACK_KEY];
    if let Some(dst) = stack.get_mut(..len) {
        let (p, n) = dst.split_at_mut(prefix.len());
        p.copy_from_slice(prefix);
        for (d, s) in n.iter_mut().zip(name) {
            *d = cgi(s);
        }
        f(dst);
    } else {
        let mut key = prefix.to_vec();
        key.extend(name.iter().map(cgi));
        f(&key);
    }
}

/// The request fields PHP reads at startup, NUL-terminated, back to back in one buffer;
/// [`php::c_request`] points into it.
pub struct RequestInfo {
    /// The strings.
    pub text: Vec<u8>,
    /// Where each string starts in `text`: method, query string, URI, content type, script,
    /// cookie, authorization (`None`: absent).
    pub at: [Option<usize>; 7],
    /// The body's length.
    pub content_length: i64,
}

/// The index in [`RequestInfo::at`] of each field.
pub mod field {
    /// REQUEST_METHOD.
    pub const METHOD: usize = 0;
    /// QUERY_STRING.
    pub const QUERY: usize = 1;
    /// REQUEST_URI.
    pub const URI: usize = 2;
    /// CONTENT_TYPE.
    pub const CONTENT_TYPE: usize = 3;
    /// The script.
    pub const SCRIPT: usize = 4;
    /// The Cookie header.
    pub const COOKIE: usize = 5;
    /// The Authorization header.
    pub const AUTHORIZATION: usize = 6;
}

impl RequestInfo {
    /// Builds the fields from `values` (in [`field`] order; `None`: absent) and the body's
    /// length. A value holding a NUL byte becomes empty (the decoder strips them from
    /// variables; a header value is the one place one could be).
    pub fn new(values: [Option<&[u8]>; 7], content_length: u64) -> RequestInfo {
        let len: usize = values.iter().map(|v| v.map_or(0, |v| v.len() + 1)).sum();
        let mut text = SPARE_TEXT.take().unwrap_or_default();
        text.clear();
        text.reserve(len);
        let mut at = [None; 7];
        for (slot, value) in at.iter_mut().zip(values) {
            let Some(value) = value else { continue };
            *slot = Some(text.len());
            if !value.contains(&0) {
                text.extend_from_slice(value);
            }
            text.push(0);
        }
        RequestInfo {
            text,
            at,
            content_length: i64::try_from(content_length).unwrap_or(i64::MAX),
        }
    }

    /// The field `i` (without its NUL), if present.
    #[cfg(test)]
    pub fn get(&self, i: usize) -> Option<&[u8]> {
        let start = (*self.at.get(i)?)?;
        let rest = self.text.get(start..)?;
        let end = rest.iter().position(|&b| b == 0)?;
        rest.get(..end)
    }
}

/// Longest startup-field buffer kept for the next request.
const MAX_KEPT_TEXT: usize = 64 * 1024;

thread_local! {
    /// The last request's startup-field buffer, for the next one (no allocation per
    /// request once it has grown).
    static SPARE_TEXT: Cell<Option<Vec<u8>>> = const { Cell::new(None) };
}

impl Drop for RequestInfo {
    fn drop(&mut self) {
        let text = std::mem::take(&mut self.text);
        if text.capacity() <= MAX_KEPT_TEXT {
            SPARE_TEXT.set(Some(text));
        }
    }
}

/// The startup fields of `begin` (`known` its variables, `script` the script to run).
pub fn info(begin: &RequestView, known: &Known<'_>, script: &[u8]) -> RequestInfo {
    // The request headers stand in for the variables corral did not send, the first of each
    // name; found in one pass, a header ruled out by its length.
    let [mut content_type, mut cookie, mut authorization] =
        [known.content_type, known.cookie, known.authorization];
    if content_type.is_none() || cookie.is_none() || authorization.is_none() {
        let mut found: [Option<&[u8]>; 3] = [None; 3];
        for (name, value) in begin.headers() {
            let i = match name.len() {
                12 if name.eq_ignore_ascii_case(b"content-type") => 0,
                6 if name.eq_ignore_ascii_case(b"cookie") => 1,
                13 if name.eq_ignore_ascii_case(b"authorization") => 2,
                _ => continue,
            };
            if let Some(slot @ None) = found.get_mut(i) {
                *slot = Some(value);
            }
        }
        let [c, k, a] = found;
        content_type = content_type.or(c);
        cookie = cookie.or(k);
        authorization = authorization.or(a);
    }
    let content_type = content_type.filter(|v| !v.is_empty());
    let method = begin
        .request_method()
        .or(known.request_method)
        .filter(|m| !m.is_empty())
        .unwrap_or(b"GET");
    RequestInfo::new(
        [
            Some(method),
            Some(
                begin
                    .query_string()
                    .or(known.query_string)
                    .unwrap_or_default(),
            ),
            Some(known.request_uri.unwrap_or_default()),
            content_type,
            Some(script),
            cookie,
            authorization,
        ],
        begin.body_len(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(name: &[u8]) -> Option<String> {
        let mut out = None;
        with_header_key(name, |k| out = Some(String::from_utf8(k.to_vec()).unwrap()));
        out
    }

    #[test]
    fn header_names_become_cgi_variables() {
        assert_eq!(
            key(b"X-Forwarded-Proto").as_deref(),
            Some("HTTP_X_FORWARDED_PROTO")
        );
        assert_eq!(key(b"content-type").as_deref(), Some("CONTENT_TYPE"));
        assert_eq!(key(b"Content-Length").as_deref(), Some("CONTENT_LENGTH"));
        assert_eq!(key(b"Transfer-Encoding"), None);
        assert_eq!(key(b""), None);
        // Longer than the stack buffer: the same name, from the heap.
        let long = vec![b'a'; 300];
        let want = format!("HTTP_{}", "A".repeat(300));
        assert_eq!(key(&long), Some(want));
        let mut joined = Vec::new();
        with_joined(&[b"/index.php", b"/x"], |j| joined = j.to_vec());
        assert_eq!(joined, b"/index.php/x");
        let big = vec![b'x'; 200];
        with_joined(&[&big, b"/y"], |j| joined = j.to_vec());
        assert_eq!(joined.len(), 202);
    }

    /// A view of a request with the four variables LSAPI points at (`/w/i.php`, GET), then
    /// `env` and `headers`.
    fn view(env: &[(&str, &str)], headers: &[(&str, &str)]) -> RequestView {
        use bytes::BytesMut;
        use corral_protocols::lsapi::{RequestBuilder, RequestDecoder, ViewEvent};
        use corral_protocols::Limits;
        let limits = Limits::DEFAULT;
        let mut rb = RequestBuilder::new(&limits, b"GET /i.php HTTP/1.1").unwrap();
        let pointed = [
            ("SCRIPT_FILENAME", "/w/i.php"),
            ("SCRIPT_NAME", "/i.php"),
            ("QUERY_STRING", ""),
            ("REQUEST_METHOD", "GET"),
        ];
        for (k, v) in pointed.iter().chain(env) {
            rb.env(k.as_bytes(), v.as_bytes()).unwrap();
        }
        for (k, v) in headers {
            rb.header(k.as_bytes(), v.as_bytes()).unwrap();
        }
        let mut packet = BytesMut::new();
        rb.encode(&mut packet).unwrap();
        let mut view = RequestView::new();
        let event = RequestDecoder::new(&limits).decode_into(&mut packet, &mut view);
        assert_eq!(event, Ok(Some(ViewEvent::Begin)));
        view
    }

    #[test]
    fn every_variable_the_worker_reads_is_found_the_last_of_its_name() {
        let names = [
            "SCRIPT_NAME",
            "PATH_INFO",
            "REQUEST_URI",
            "CONTENT_TYPE",
            "HTTP_COOKIE",
            "HTTP_AUTHORIZATION",
            "CORRAL_READY_PROBE",
        ];
        let mut env: Vec<(&str, &str)> = names.iter().map(|n| (*n, "first")).collect();
        env.extend(names.iter().map(|n| (*n, "last")));
        // Names of the same lengths that are none of them: not taken.
        env.extend([
            ("SCRIPT_NAMES", "x"),
            ("REQUEST_URL", "x"),
            ("PATH_INFX", "x"),
        ]);
        let v = view(&env, &[]);
        let k = Known::of(&v);
        let got = [
            k.script_name,
            k.path_info,
            k.request_uri,
            k.content_type,
            k.cookie,
            k.authorization,
            k.probe,
        ];
        for (name, value) in names.iter().zip(got) {
            assert_eq!(value, Some(&b"last"[..]), "{name}");
        }
        assert_eq!(k.script_filename, Some(&b"/w/i.php"[..]));
        assert_eq!(k.request_method, Some(&b"GET"[..]));
        assert!(!k.is_probe());
    }

    #[test]
    fn startup_fields_take_the_first_header_where_no_variable_was_sent() {
        let v = view(
            &[("REQUEST_URI", "/i.php")],
            &[
                ("Cookie", "a=1"),
                ("Content-Type", "text/plain"),
                ("authorization", "Basic eDp5"),
                ("X-Other", "z"),
            ],
        );
        let known = Known::of(&v);
        let got = info(&v, &known, known.script(&v));
        assert_eq!(got.get(field::COOKIE), Some(&b"a=1"[..]));
        assert_eq!(got.get(field::CONTENT_TYPE), Some(&b"text/plain"[..]));
        assert_eq!(got.get(field::AUTHORIZATION), Some(&b"Basic eDp5"[..]));
        assert_eq!(got.get(field::SCRIPT), Some(&b"/w/i.php"[..]));
        assert_eq!(got.get(field::METHOD), Some(&b"GET"[..]));

        // A variable wins over its header; an empty content type is none; absent is absent.
        let v = view(
            &[("HTTP_COOKIE", "from=var"), ("CONTENT_TYPE", "")],
            &[("Cookie", "from=header"), ("Content-Type", "text/html")],
        );
        let known = Known::of(&v);
        let got = info(&v, &known, b"");
        assert_eq!(got.get(field::COOKIE), Some(&b"from=var"[..]));
        assert_eq!(got.get(field::CONTENT_TYPE), None);
        assert_eq!(got.get(field::AUTHORIZATION), None);
    }

    #[test]
    fn startup_fields_are_c_strings_in_one_buffer() {
        let info = RequestInfo::new(
            [
                Some(b"GET"),
                Some(b""),
                Some(b"/a?b"),
                None,
                Some(b"/s.php"),
                Some(b"a\0b"),
                None,
            ],
            5,
        );
        assert_eq!(info.get(field::METHOD), Some(&b"GET"[..]));
        assert_eq!(info.get(field::QUERY), Some(&b""[..]));
        assert_eq!(info.get(field::URI), Some(&b"/a?b"[..]));
        assert_eq!(info.get(field::CONTENT_TYPE), None);
        assert_eq!(info.get(field::SCRIPT), Some(&b"/s.php"[..]));
        // A NUL inside: empty rather than cut short.
        assert_eq!(info.get(field::COOKIE), Some(&b""[..]));
        assert_eq!(info.get(field::AUTHORIZATION), None);
        assert_eq!(info.content_length, 5);
    }
}
