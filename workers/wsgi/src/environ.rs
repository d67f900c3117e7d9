//! A request's WSGI environ (PEP 3333) from a decoded BEGIN_REQUEST: the CGI variables
//! corral sends, the request headers as `HTTP_*`, and what the pure-Python launcher adds
//! (CONTENT_LENGTH the body's real length, SCRIPT_NAME without a trailing slash,
//! wsgi.url_scheme from HTTPS, corral.connection_requests). Names and values are borrowed
//! from the request's view. Keys are interned Python strings made once per name and kept
//! ([`Keys`]), so a request makes only its values; the names a request sends are looked up
//! by their place first (corral sends the same variables in the same order every time),
//! and by hash only when that place held another name.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

use corral_protocols::lsapi::RequestView;

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

type Map<V> = HashMap<Box<[u8]>, V, BuildHasherDefault<Fnv>>;

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

/// The CGI variables [`build`] reads besides setting them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Role {
    Other,
    ContentType,
    ScriptName,
    PathInfo,
    Https,
}

impl Role {
    fn of(name: &[u8]) -> Role {
        match name {
            b"CONTENT_TYPE" => Role::ContentType,
            b"SCRIPT_NAME" => Role::ScriptName,
            b"PATH_INFO" => Role::PathInfo,
            b"HTTPS" => Role::Https,
            _ => Role::Other,
        }
    }
}

/// A name as it comes in the packet, with what it becomes (`None`: a header the environ
/// does not carry).
struct Slot {
    name: Box<[u8]>,
    role: Role,
    entry: Option<Entry>,
}

/// Slots by name, bounded to [`MAX_KEYS`], with the slot each place of the last request's
/// list held.
#[derive(Default)]
struct Names {
    index: Map<usize>,
    slots: Vec<Slot>,
    order: Vec<usize>,
}

impl Names {
    /// The slot of `name`, the `place`-th of its list in this request, made by `make` when
    /// the name is new; `f` is applied to it. `None` when `make` or `f` fails.
    fn with<R>(
        &mut self,
        place: usize,
        name: &[u8],
        make: impl FnOnce(&[u8]) -> Option<Slot>,
        f: impl FnOnce(&mut Slot) -> Option<R>,
    ) -> Option<R> {
        let cached = self.order.get(place).copied();
        let slots = &self.slots;
        if let Some(i) = cached.filter(|&i| slots.get(i).is_some_and(|s| *s.name == *name)) {
            return f(self.slots.get_mut(i)?);
        }
        let i = match self.index.get(name) {
            Some(&i) => i,
            None if self.slots.len() < MAX_KEYS => {
                let i = self.slots.len();
                self.slots.push(make(name)?);
                self.index.insert(name.into(), i);
                i
            }
            // Full: the name is served, not kept.
            None => return f(&mut make(name)?),
        };
        let known = self.order.len();
        match self.order.get_mut(place) {
            Some(at) => *at = i,
            None if known == place && place < MAX_KEYS => self.order.push(i),
            None => {}
        }
        f(self.slots.get_mut(i)?)
    }
}

/// Environ keys by the bytes they come from: CGI variable names as they are, header names
/// turned into `HTTP_*`.
pub struct Keys {
    vars: Names,
    headers: Names,
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
            vars: Names::default(),
            headers: Names::default(),
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
}

fn var_slot(name: &[u8]) -> Option<Slot> {
    Some(Slot {
        name: name.into(),
        role: Role::of(name),
        entry: Some(Entry::new(python::key(name)?, REPLACE)),
    })
}

fn header_slot(name: &[u8]) -> Option<Slot> {
    let entry = match header_var(name) {
        Some((var, join)) => Some(Entry::new(python::key(&var)?, join)),
        None => None,
    };
    Some(Slot {
        name: name.into(),
        role: Role::Other,
        entry,
    })
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

/// The value of CGI variable `name` in `view`'s env, if any (the last one wins).
pub fn env<'a>(view: &'a RequestView, name: &[u8]) -> Option<&'a [u8]> {
    view.env()
        .filter(|(k, _)| *k == name)
        .last()
        .map(|(_, v)| v)
}

/// The variables [`build`] reads, the last of each name.
#[derive(Default)]
struct Seen<'a> {
    content_type: Option<&'a [u8]>,
    script_name: Option<&'a [u8]>,
    path_info: Option<&'a [u8]>,
    https: Option<&'a [u8]>,
}

/// The environ of `view`, whose connection carried `served` requests with this one;
/// `None` when Python cannot build it (out of memory).
pub fn build(keys: &mut Keys, view: &RequestView, served: u64) -> Option<Environ> {
    let mut environ = Environ::new()?;
    let mut seen = Seen::default();
    for (place, (name, value)) in view.env().enumerate() {
        if name.is_empty() {
            continue;
        }
        keys.vars.with(place, name, var_slot, |slot| {
            match slot.role {
                Role::Other => {}
                Role::ContentType => seen.content_type = Some(value),
                Role::ScriptName => seen.script_name = Some(value),
                Role::PathInfo => seen.path_info = Some(value),
                Role::Https => seen.https = Some(value),
            }
            // Empty values keep the base's defaults (REQUEST_METHOD "GET", QUERY_STRING "").
            if value.is_empty() && slot.role != Role::ScriptName {
                return Some(());
            }
            slot.entry.as_mut()?.set(&mut environ, value, false)
        })?;
    }
    let headers = view.headers();
    let mut content_type_header = false;
    for (place, (name, value)) in headers.clone().enumerate() {
        // A repeated header joins the value before it; headers are few, so a look back
        // costs less than a set.
        let joined = headers
            .clone()
            .take(place)
            .any(|(n, _)| n.eq_ignore_ascii_case(name));
        keys.headers
            .with(place, name, header_slot, |slot| match &mut slot.entry {
                Some(entry) => entry.set(&mut environ, value, joined),
                None => Some(()),
            })?;
        content_type_header = content_type_header
            || (!value.is_empty() && name.eq_ignore_ascii_case(b"content-type"));
    }
    let f = &keys.fixed;
    let mut digits = itoa(view.body_len());
    environ.set(&f.content_length, digits.text(), REPLACE);
    if seen.content_type.is_none() && !content_type_header {
        environ.remove(&f.content_type);
    }
    // PEP 3333: SCRIPT_NAME is "" for an app at the root, never "/" or "/x/".
    if let Some(script) = seen.script_name.filter(|s| s.ends_with(b"/")) {
        let trimmed = script.len() - script.iter().rev().take_while(|&&b| b == b'/').count();
        environ.set(
            &f.script_name,
            script.get(..trimmed).unwrap_or_default(),
            REPLACE,
        );
        let path = seen.path_info.unwrap_or_default();
        let rest = path.get(path.iter().take_while(|&&b| b == b'/').count()..);
        let mut fixed = Vec::with_capacity(path.len() + 1);
        fixed.push(b'/');
        fixed.extend_from_slice(rest.unwrap_or_default());
        environ.set(&f.path_info, &fixed, REPLACE);
    }
    if seen.https.is_some_and(|v| {
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

    fn slot(name: &[u8]) -> Option<Slot> {
        Some(Slot {
            name: name.into(),
            role: Role::of(name),
            entry: None,
        })
    }

    /// The index of the slot `Names::with` gives `name` at `place` (`None`: a slot made
    /// for this once, not kept), checking it is `name`'s.
    fn found(names: &mut Names, place: usize, name: &[u8]) -> Option<usize> {
        let got = names.with(place, name, slot, |s| Some(s.name.to_vec()));
        assert_eq!(got.as_deref(), Some(name));
        names.index.get(name).copied()
    }

    #[test]
    fn names_are_found_by_place_then_by_hash() {
        let mut names = Names::default();
        assert_eq!(found(&mut names, 0, b"SERVER_NAME"), Some(0));
        assert_eq!(found(&mut names, 1, b"HTTPS"), Some(1));
        assert_eq!(names.slots[1].role, Role::Https);
        assert_eq!(names.order, [0, 1]);
        // The same order again: the same slots, nothing new made.
        assert_eq!(found(&mut names, 0, b"SERVER_NAME"), Some(0));
        assert_eq!(found(&mut names, 1, b"HTTPS"), Some(1));
        assert_eq!(names.slots.len(), 2);
        // Another order: each name still gets its own slot, and the places learn it.
        assert_eq!(found(&mut names, 0, b"HTTPS"), Some(1));
        assert_eq!(found(&mut names, 1, b"SERVER_NAME"), Some(0));
        assert_eq!(names.order, [1, 0]);
        assert_eq!(names.slots.len(), 2);
        // A new name at a known place.
        assert_eq!(found(&mut names, 0, b"X"), Some(2));
        assert_eq!(names.order, [2, 0]);
        // Full: a new name is served from a slot made for it, and kept nowhere.
        for i in names.slots.len()..MAX_KEYS {
            found(&mut names, 5, format!("N{i}").as_bytes());
        }
        assert_eq!(names.slots.len(), MAX_KEYS);
        assert_eq!(found(&mut names, 2, b"ONE_TOO_MANY"), None);
        assert_eq!(names.slots.len(), MAX_KEYS);
        // The places are bounded too.
        assert!(names.order.len() <= MAX_KEYS);
    }

    #[test]
    fn digits() {
        assert_eq!(itoa(0).text(), b"0");
        assert_eq!(itoa(1234567).text(), b"1234567");
        assert_eq!(itoa(u64::MAX).text(), b"18446744073709551615");
    }
}
