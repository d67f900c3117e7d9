//! From a decoded BEGIN_REQUEST to what PHP reads: `$_SERVER` (corral's CGI variables, then
//! the request headers as `HTTP_*`, then `PHP_SELF` as php-cgi adds it) and the fields PHP
//! takes at request startup (method, query, URI, body type and length, script, cookies,
//! authorization).

use std::ffi::CString;

use bytes::Bytes;
use corral_protocols::lsapi::BeginRequest;

use crate::php::RequestInfo;

/// A request's `$_SERVER` and startup fields.
pub struct Prepared {
    /// `$_SERVER`, in registration order (a later entry replaces an earlier one).
    pub vars: Vec<(CString, Bytes)>,
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

/// `HTTP_*` for a header name (`Content-Type` and `Content-Length` are CGI's own names).
fn header_var(name: &[u8]) -> Option<String> {
    let upper: String = name
        .iter()
        .map(|&b| match b {
            b'-' => '_',
            b => char::from(b.to_ascii_uppercase()),
        })
        .collect();
    match upper.as_str() {
        "CONTENT_TYPE" | "CONTENT_LENGTH" => Some(upper),
        // The body always arrives with its length (corral reads chunked bodies first).
        "TRANSFER_ENCODING" => None,
        _ => Some(format!("HTTP_{upper}")),
    }
}

fn c_string(bytes: &[u8]) -> CString {
    // A NUL cannot be in what the decoder hands over (it strips and checks them); an empty
    // string is the harmless answer if one ever were.
    CString::new(bytes).unwrap_or_default()
}

/// Builds `$_SERVER` and the startup fields; `script` is the script to run.
pub fn prepare(begin: &BeginRequest, script: &[u8]) -> Prepared {
    let mut vars: Vec<(CString, Bytes)> =
        Vec::with_capacity(begin.env.len() + begin.headers.len() + 1);
    for (name, value) in &begin.headers {
        if let Some(key) = header_var(name) {
            vars.push((c_string(key.as_bytes()), value.clone()));
        }
    }
    for (name, value) in &begin.env {
        if name.is_empty() || name.contains(&0) {
            continue;
        }
        vars.push((c_string(name), value.clone()));
    }
    let script_name = env(begin, "SCRIPT_NAME").cloned().unwrap_or_default();
    let path_info = env(begin, "PATH_INFO").cloned().unwrap_or_default();
    let mut php_self = script_name.to_vec();
    php_self.extend_from_slice(&path_info);
    vars.push((c_string(b"PHP_SELF"), Bytes::from(php_self)));

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
        assert_eq!(
            header_var(b"X-Forwarded-Proto").as_deref(),
            Some("HTTP_X_FORWARDED_PROTO")
        );
        assert_eq!(header_var(b"content-type").as_deref(), Some("CONTENT_TYPE"));
        assert_eq!(
            header_var(b"Content-Length").as_deref(),
            Some("CONTENT_LENGTH")
        );
        assert_eq!(header_var(b"Transfer-Encoding"), None);
    }
}
