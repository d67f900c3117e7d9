//! A request's WSGI environ (PEP 3333) from a decoded BEGIN_REQUEST: the CGI variables
//! corral sends, the request headers as `HTTP_*`, and what the pure-Python launcher adds
//! (CONTENT_LENGTH the body's real length, SCRIPT_NAME without a trailing slash,
//! wsgi.url_scheme from HTTPS, corral.connection_requests). Keys are interned Python
//! strings made once per name and kept ([`Keys`]), so a request makes only its values.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

use corral_protocols::lsapi::BeginRequest;

use crate::python::{self, Environ, Obj};

/// Most names kept: a peer inventing header names cannot grow the cache without end.
const MAX_KEYS: usize = 512;

/// FNV-1a: a name of a few bytes hashes in a few instructions, where the default SipHash
/// costs a thousand per request. Its keys come from the peer, but the maps are bounded to
/// [`MAX_KEYS`] entries, so colliding names cannot make a lookup costly.
#[derive(Default)]
struct Fnv(u64);

impl Hasher for Fnv {
    fn write(&mut self, bytes: &[u8]) {
        let mut h = if self.0 == 0 {
            0xcbf2_9ce4_8422_2325
        } else {
            self.0
        };
        for &b in bytes {
            h = (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
        }
        self.0 = h;
    }

    fn finish(&self) -> u64 {
        self.0
    }
}

type Map<V> = HashMap<Vec<u8>, V, BuildHasherDefault<Fnv>>;

/// Join rules for a repeated request header.
const REPLACE: i32 = 0;
const COMMA: i32 = 1;
const SEMICOLON: i32 = 2;

/// Longest value kept for reuse: most CGI variables and headers repeat from one request to
/// the next (SERVER_NAME, HTTP_HOST, HTTP_USER_AGENT...), and a value equal to the last one
/// of its name reuses that str rather than making a new one.
const MAX_KEPT_VALUE: usize = 256;

/// An environ key and the last value set under it.
struct Entry {
    key: Obj,
    join: i32,
    last: Option<(Vec<u8>, Obj)>,
}

impl Entry {
    fn new(key: Obj, join: i32) -> Entry {
        Entry {
            key,
            join,
            last: None,
        }
    }

    /// `environ[key] = value` (joined to a value set before in this request when `joined`).
    fn set(&mut self, environ: &mut Environ, value: &[u8], joined: bool) -> Option<()> {
        if joined && self.join != REPLACE {
            environ.set(&self.key, value, self.join);
            return Some(());
        }
        if let Some((bytes, text)) = &self.last {
            if bytes.as_slice() == value {
                environ.set_obj(&self.key, text);
                return Some(());
            }
        }
        let text = python::text(value)?;
        environ.set_obj(&self.key, &text);
        if value.len() <= MAX_KEPT_VALUE {
            self.last = Some((value.to_vec(), text));
        }
        Some(())
    }
}

/// Environ keys by the bytes they come from: CGI variable names as they are, header names
/// turned into `HTTP_*` (`None`: a header the environ does not carry).
pub struct Keys {
    vars: Map<Entry>,
    headers: Map<Option<Entry>>,
    fixed: Fixed,
}

/// The keys this file sets itself.
struct Fixed {
    content_length: Obj,
    content_type: Obj,
    script_name: Obj,
    path_info: Obj,
    url_scheme: Obj,
    connection_requests: Obj,
}

impl Keys {
    /// The fixed keys made; `None` if Python cannot make a string (out of memory).
    pub fn new() -> Option<Keys> {
        Some(Keys {
            vars: Map::default(),
            headers: Map::default(),
            fixed: Fixed {
                content_length: python::key(b"CONTENT_LENGTH")?,
                content_type: python::key(b"CONTENT_TYPE")?,
                script_name: python::key(b"SCRIPT_NAME")?,
                path_info: python::key(b"PATH_INFO")?,
                url_scheme: python::key(b"wsgi.url_scheme")?,
                connection_requests: python::key(b"corral.connection_requests")?,
            },
        })
    }

    /// Sets CGI variable `name`.
    fn set_var(&mut self, environ: &mut Environ, name: &[u8], value: &[u8]) -> Option<()> {
        if let Some(entry) = self.vars.get_mut(name) {
            return entry.set(environ, value, false);
        }
        let mut entry = Entry::new(python::key(name)?, REPLACE);
        entry.set(environ, value, false)?;
        if self.vars.len() < MAX_KEYS {
            self.vars.insert(name.to_vec(), entry);
        }
        Some(())
    }

    /// Sets the variable of request header `name`; `joined`: its name came before in this
    /// request.
    fn set_header(
        &mut self,
        environ: &mut Environ,
        name: &[u8],
        value: &[u8],
        joined: bool,
    ) -> Option<()> {
        if let Some(entry) = self.headers.get_mut(name) {
            return match entry {
                Some(entry) => entry.set(environ, value, joined),
                None => Some(()),
            };
        }
        let mut entry = match header_var(name) {
            Some((var, join)) => Some(Entry::new(python::key(&var)?, join)),
            None => None,
        };
        if let Some(entry) = &mut entry {
            entry.set(environ, value, joined)?;
        }
        if self.headers.len() < MAX_KEYS {
            self.headers.insert(name.to_vec(), entry);
        }
        Some(())
    }
}

/// The environ variable for a request header and how repeats join; `None` for a header the
/// environ must not carry: Transfer-Encoding (the body always arrives with its length), and
/// names that would pose as CGI's own CONTENT_TYPE or CONTENT_LENGTH without being them.
fn header_var(name: &[u8]) -> Option<(Vec<u8>, i32)> {
    if name.eq_ignore_ascii_case(b"content-type") {
        return Some((b"CONTENT_TYPE".to_vec(), REPLACE));
    }
    if name.eq_ignore_ascii_case(b"content-length") {
        return Some((b"CONTENT_LENGTH".to_vec(), REPLACE));
    }
    if name.eq_ignore_ascii_case(b"transfer-encoding") {
        return None;
    }
    let mut var = Vec::with_capacity(5 + name.len());
    var.extend_from_slice(b"HTTP_");
    var.extend(name.iter().map(|&b| match b {
        b'-' => b'_',
        b => b.to_ascii_uppercase(),
    }));
    match var.as_slice() {
        b"HTTP_CONTENT_TYPE" | b"HTTP_CONTENT_LENGTH" => None,
        b"HTTP_COOKIE" => Some((var, SEMICOLON)),
        _ => Some((var, COMMA)),
    }
}

/// The value of CGI variable `name` in `begin`'s env, if any (the last one wins).
pub fn env<'a>(begin: &'a BeginRequest, name: &[u8]) -> Option<&'a [u8]> {
    begin
        .env
        .iter()
        .rev()
        .find(|(k, _)| k.as_ref() == name)
        .map(|(_, v)| v.as_ref())
}

/// The environ of `begin`, whose connection carried `served` requests with this one;
/// `None` when Python cannot build it (out of memory).
pub fn build(keys: &mut Keys, begin: &BeginRequest, served: u64) -> Option<Environ> {
    let mut environ = Environ::new()?;
    for (name, value) in &begin.env {
        // Empty values keep the base's defaults (REQUEST_METHOD "GET", QUERY_STRING "").
        if name.is_empty() || (value.is_empty() && name.as_ref() != b"SCRIPT_NAME") {
            continue;
        }
        keys.set_var(&mut environ, name, value)?;
    }
    for (i, (name, value)) in begin.headers.iter().enumerate() {
        // A repeated header joins the value before it; headers are few, so a look back
        // costs less than a set.
        let joined = begin
            .headers
            .iter()
            .take(i)
            .any(|(n, _)| n.eq_ignore_ascii_case(name));
        keys.set_header(&mut environ, name, value, joined)?;
    }
    let f = &keys.fixed;
    let mut digits = itoa(begin.body_len);
    environ.set(&f.content_length, digits.text(), REPLACE);
    if env(begin, b"CONTENT_TYPE").is_none()
        && !begin
            .headers
            .iter()
            .any(|(k, v)| k.eq_ignore_ascii_case(b"content-type") && !v.is_empty())
    {
        environ.remove(&f.content_type);
    }
    // PEP 3333: SCRIPT_NAME is "" for an app at the root, never "/" or "/x/".
    if let Some(script) = env(begin, b"SCRIPT_NAME").filter(|s| s.ends_with(b"/")) {
        let trimmed = script.len() - script.iter().rev().take_while(|&&b| b == b'/').count();
        environ.set(
            &f.script_name,
            script.get(..trimmed).unwrap_or_default(),
            REPLACE,
        );
        let path = env(begin, b"PATH_INFO").unwrap_or_default();
        let rest = path.get(path.iter().take_while(|&&b| b == b'/').count()..);
        let mut fixed = Vec::with_capacity(path.len() + 1);
        fixed.push(b'/');
        fixed.extend_from_slice(rest.unwrap_or_default());
        environ.set(&f.path_info, &fixed, REPLACE);
    }
    if env(begin, b"HTTPS").is_some_and(|v| {
        v.eq_ignore_ascii_case(b"on") || v == b"1" || v.eq_ignore_ascii_case(b"yes")
    }) {
        environ.set(&f.url_scheme, b"https", REPLACE);
    }
    environ.set_int(&f.connection_requests, served);
    Some(environ)
}

/// A number's decimal digits without an allocation.
struct Digits {
    buf: [u8; 20],
    start: usize,
}

impl Digits {
    fn text(&mut self) -> &[u8] {
        self.buf.get(self.start..).unwrap_or_default()
    }
}

fn itoa(mut n: u64) -> Digits {
    let mut d = Digits {
        buf: [0; 20],
        start: 20,
    };
    loop {
        d.start -= 1;
        if let Some(slot) = d.buf.get_mut(d.start) {
            *slot = b'0' + (n % 10) as u8;
        }
        n /= 10;
        if n == 0 || d.start == 0 {
            return d;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_names_become_environ_keys() {
        assert_eq!(
            header_var(b"X-Forwarded-Proto"),
            Some((b"HTTP_X_FORWARDED_PROTO".to_vec(), COMMA))
        );
        assert_eq!(
            header_var(b"cookie"),
            Some((b"HTTP_COOKIE".to_vec(), SEMICOLON))
        );
        assert_eq!(
            header_var(b"content-type").map(|v| v.0),
            Some(b"CONTENT_TYPE".to_vec())
        );
        assert_eq!(header_var(b"Transfer-Encoding"), None);
        // A header posing as CGI's own entity variables is not carried.
        assert_eq!(header_var(b"Content_Type"), None);
        assert_eq!(header_var(b"content_length"), None);
    }

    #[test]
    fn digits() {
        assert_eq!(itoa(0).text(), b"0");
        assert_eq!(itoa(1234567).text(), b"1234567");
        assert_eq!(itoa(u64::MAX).text(), b"18446744073709551615");
    }
}
