//! From a decoded BEGIN_REQUEST to what PHP reads: `$_SERVER` (corral's CGI variables, then
//! the request headers as `HTTP_*`, then `PHP_SELF` as php-cgi adds it) and the fields PHP
//! takes at request startup (method, query, URI, body type and length, script, cookies,
//! authorization).

use std::ffi::{CStr, CString};

use bytes::Bytes;
use corral_protocols::lsapi::BeginRequest;

use crate::php::RequestInfo;

/// A request's `$_SERVER` and startup fields.
pub struct Prepared {
    /// `$_SERVER`.
    pub vars: Vars,
    /// What PHP reads at request startup.
    pub info: RequestInfo,
}

/// The value of CGI variable `name` in `begin`'s env, if any.
pub fn env<'a>(begin: &'a BeginRequest, name: &str) -> Option<&'a Bytes> {
    begin
        .env
        .iter()
        .rev()
        .find(|(k, _)| k.as_ref() == name.as_bytes())
        .map(|(_, v)| v)
}

/// `$_SERVER`'s entries in registration order (a later entry replaces an earlier one): the
/// keys NUL-terminated, back to back in one buffer, each with its value. Two allocations per
/// request instead of one per key (a `CString` each cost a malloc and a free: callgrind).
#[derive(Default)]
pub struct Vars {
    keys: Vec<u8>,
    /// Where each key starts in `keys`, and its value.
    entries: Vec<(usize, Bytes)>,
}

impl Vars {
    /// Room for `n` entries of about 16-byte keys.
    pub fn with_capacity(n: usize) -> Vars {
        Vars {
            keys: Vec::with_capacity(n * 16),
            entries: Vec::with_capacity(n),
        }
    }

    /// Adds `key` (the bytes of `parts` one after another) = `value`; a key that is empty or
    /// holds a NUL byte is left out.
    pub fn push(&mut self, parts: &[&[u8]], value: Bytes) {
        let start = self.keys.len();
        for part in parts {
            self.keys.extend_from_slice(part);
        }
        self.end_key(start, value);
    }

    /// Ends the key written from `start` on, with its value (or drops it; see `push`).
    fn end_key(&mut self, start: usize, value: Bytes) {
        let key = self.keys.get(start..).unwrap_or_default();
        if key.is_empty() || key.contains(&0) {
            self.keys.truncate(start);
            return;
        }
        self.keys.push(0);
        self.entries.push((start, value));
    }

    /// Adds request header `name` as CGI names it (`HTTP_X_FORWARDED_FOR`; `CONTENT_TYPE`
    /// and `CONTENT_LENGTH` are CGI's own names; `Transfer-Encoding` is left out: the body
    /// always arrives with its length, corral reads chunked bodies first).
    pub fn push_header(&mut self, name: &[u8], value: Bytes) {
        if name.eq_ignore_ascii_case(b"transfer-encoding") {
            return;
        }
        let own = name.eq_ignore_ascii_case(b"content-type")
            || name.eq_ignore_ascii_case(b"content-length");
        let start = self.keys.len();
        if !own {
            self.keys.extend_from_slice(b"HTTP_");
        }
        self.keys.extend(name.iter().map(|&b| match b {
            b'-' => b'_',
            b => b.to_ascii_uppercase(),
        }));
        self.end_key(start, value);
    }

    /// The entries, keys as C strings.
    pub fn iter(&self) -> impl Iterator<Item = (&CStr, &Bytes)> {
        self.entries.iter().filter_map(|(start, value)| {
            let key = CStr::from_bytes_until_nul(self.keys.get(*start..)?).ok()?;
            Some((key, value))
        })
    }
}

fn c_string(bytes: &[u8]) -> CString {
    // A NUL cannot be in what the decoder hands over (it strips and checks them); an empty
    // string is the harmless answer if one ever were.
    CString::new(bytes).unwrap_or_default()
}

/// Builds `$_SERVER` and the startup fields; `script` is the script to run.
pub fn prepare(begin: &BeginRequest, script: &[u8]) -> Prepared {
    let mut vars = Vars::with_capacity(begin.env.len() + begin.headers.len() + 1);
    for (name, value) in &begin.headers {
        vars.push_header(name, value.clone());
    }
    for (name, value) in &begin.env {
        vars.push(&[name], value.clone());
    }
    let script_name = env(begin, "SCRIPT_NAME").cloned().unwrap_or_default();
    let path_info = env(begin, "PATH_INFO").cloned().unwrap_or_default();
    let mut php_self = script_name.to_vec();
    php_self.extend_from_slice(&path_info);
    vars.push(&[b"PHP_SELF"], Bytes::from(php_self));

    let header = |name: &str| {
        begin
            .headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name.as_bytes()))
            .map(|(_, v)| c_string(v))
    };
    let field = |pointed: &Option<Bytes>, name: &str| {
        pointed
            .as_ref()
            .or_else(|| env(begin, name))
            .map(|v| c_string(v))
            .unwrap_or_default()
    };
    let content_type = env(begin, "CONTENT_TYPE")
        .map(|v| c_string(v))
        .or_else(|| header("Content-Type"))
        .filter(|v| !v.as_bytes().is_empty());
    let info = RequestInfo {
        method: {
            let m = field(&begin.request_method, "REQUEST_METHOD");
            if m.as_bytes().is_empty() {
                c_string(b"GET")
            } else {
                m
            }
        },
        query_string: field(&begin.query_string, "QUERY_STRING"),
        request_uri: field(&None, "REQUEST_URI"),
        content_type,
        content_length: i64::try_from(begin.body_len).unwrap_or(i64::MAX),
        script_filename: c_string(script),
        cookie: env(begin, "HTTP_COOKIE")
            .map(|v| c_string(v))
            .or_else(|| header("Cookie")),
        authorization: env(begin, "HTTP_AUTHORIZATION")
            .map(|v| c_string(v))
            .or_else(|| header("Authorization")),
    };
    Prepared { vars, info }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_names_become_cgi_variables() {
        let mut vars = Vars::default();
        vars.push_header(b"X-Forwarded-Proto", Bytes::from_static(b"https"));
        vars.push_header(b"content-type", Bytes::from_static(b"text/plain"));
        vars.push_header(b"Content-Length", Bytes::from_static(b"3"));
        vars.push_header(b"Transfer-Encoding", Bytes::from_static(b"chunked"));
        vars.push_header(b"Bad\0Name", Bytes::from_static(b"x"));
        vars.push(&[b""], Bytes::from_static(b"empty"));
        vars.push(&[b"PHP_", b"SELF"], Bytes::from_static(b"/i.php"));
        let got: Vec<(String, &[u8])> = vars
            .iter()
            .map(|(k, v)| (k.to_str().unwrap().to_owned(), v.as_ref()))
            .collect();
        let want: Vec<(String, &[u8])> = vec![
            ("HTTP_X_FORWARDED_PROTO".into(), b"https"),
            ("CONTENT_TYPE".into(), b"text/plain"),
            ("CONTENT_LENGTH".into(), b"3"),
            ("PHP_SELF".into(), b"/i.php"),
        ];
        assert_eq!(got, want);
    }
}
