//! The variable names a front server usually sends, recognised with one probe of a table
//! built at compile time.
//!
//! Every pair a front server sends is classified on arrival ([`FrontParams`]'s index): is its
//! name one the front logic reads ([`Known`]), one of the other names nginx's
//! `fastcgi.conf` and common browsers make (clean by construction, so its bytes need no
//! check, and told apart exactly, so a repeat needs no hashing), or anything else. A `match`
//! on the name compared it against each candidate of its length in turn; the table looks at
//! the name's first and last eight bytes and its length, hashed to one slot, and compares
//! those two words (and, for a name longer than 16 bytes, the middle eight, or the whole name
//! past 24) with the slot's entry. The compiler picks the hash's multiplier so that every
//! name of the table has a slot of its own: one slot is read, never a chain of them.
//!
//! [`FrontParams`]: super::FrontParams

/// The names the front logic reads or rewrites, found once as the pairs arrive.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Known {
    /// HTTP_HOST: the client's Host, checked and routed on.
    HttpHost,
    /// SERVER_NAME: routed on without a Host.
    ServerName,
    /// DOCUMENT_URI: the decoded path, routed on.
    DocumentUri,
    /// REQUEST_URI: the raw target, routed on without DOCUMENT_URI.
    RequestUri,
    /// CONTENT_LENGTH: the body's length.
    ContentLength,
    /// SCRIPT_FILENAME: checked against the context's root.
    ScriptFilename,
    /// SCRIPT_NAME.
    ScriptName,
    /// PATH_INFO.
    PathInfo,
    /// PATH_TRANSLATED.
    PathTranslated,
    /// DOCUMENT_ROOT.
    DocumentRoot,
    /// REQUEST_METHOD.
    RequestMethod,
    /// QUERY_STRING.
    QueryString,
    /// HTTP_PROXY: always dropped (httpoxy).
    HttpProxy,
    /// CORRAL_READY_PROBE: corral's own, always dropped.
    CorralReadyProbe,
    /// PHP_VALUE: dropped unless the context allows it.
    PhpValue,
    /// PHP_ADMIN_VALUE: dropped unless the context allows it.
    PhpAdminValue,
}

/// How many [`Known`] names there are.
pub(super) const KNOWN: usize = 16;

/// Every [`Known`] name, in the order of their discriminants.
const ALL_KNOWN: [Known; KNOWN] = [
    Known::HttpHost,
    Known::ServerName,
    Known::DocumentUri,
    Known::RequestUri,
    Known::ContentLength,
    Known::ScriptFilename,
    Known::ScriptName,
    Known::PathInfo,
    Known::PathTranslated,
    Known::DocumentRoot,
    Known::RequestMethod,
    Known::QueryString,
    Known::HttpProxy,
    Known::CorralReadyProbe,
    Known::PhpValue,
    Known::PhpAdminValue,
];

/// The names the table recognises, by id: the [`Known`] ones first, at their discriminants,
/// then the other common ones. Each is at least 8 bytes long (a shorter name, such as
/// `HTTPS`, is simply not in the table) and holds none of NUL, CR, LF or `=`.
const NAMES: [&[u8]; IDS] = [
    b"HTTP_HOST",
    b"SERVER_NAME",
    b"DOCUMENT_URI",
    b"REQUEST_URI",
    b"CONTENT_LENGTH",
    b"SCRIPT_FILENAME",
    b"SCRIPT_NAME",
    b"PATH_INFO",
    b"PATH_TRANSLATED",
    b"DOCUMENT_ROOT",
    b"REQUEST_METHOD",
    b"QUERY_STRING",
    b"HTTP_PROXY",
    b"CORRAL_READY_PROBE",
    b"PHP_VALUE",
    b"PHP_ADMIN_VALUE",
    // nginx's fastcgi.conf, beside the known ones.
    b"CONTENT_TYPE",
    b"SERVER_PROTOCOL",
    b"REQUEST_SCHEME",
    b"GATEWAY_INTERFACE",
    b"SERVER_SOFTWARE",
    b"REMOTE_ADDR",
    b"REMOTE_PORT",
    b"REMOTE_USER",
    b"SERVER_ADDR",
    b"SERVER_PORT",
    b"REDIRECT_STATUS",
    // Request headers browsers, clients and proxies commonly send.
    b"HTTP_ACCEPT",
    b"HTTP_ACCEPT_ENCODING",
    b"HTTP_ACCEPT_LANGUAGE",
    b"HTTP_AUTHORIZATION",
    b"HTTP_CACHE_CONTROL",
    b"HTTP_CONNECTION",
    b"HTTP_CONTENT_LENGTH",
    b"HTTP_CONTENT_TYPE",
    b"HTTP_COOKIE",
    b"HTTP_IF_MODIFIED_SINCE",
    b"HTTP_IF_NONE_MATCH",
    b"HTTP_ORIGIN",
    b"HTTP_PRAGMA",
    b"HTTP_REFERER",
    b"HTTP_SEC_FETCH_DEST",
    b"HTTP_SEC_FETCH_MODE",
    b"HTTP_SEC_FETCH_SITE",
    b"HTTP_UPGRADE_INSECURE_REQUESTS",
    b"HTTP_USER_AGENT",
    b"HTTP_X_FORWARDED_FOR",
    b"HTTP_X_FORWARDED_PROTO",
    b"HTTP_X_REAL_IP",
    b"HTTP_X_REQUESTED_WITH",
];

/// How many names the table holds.
const IDS: usize = 50;

/// Ids from [`KNOWN`] on are the common names; a set of them fits one `u64`.
const _: () = assert!(IDS - KNOWN <= 64);

/// Slots in the table: enough that a multiplier giving each name a slot of its own is found
/// in a few hundred tries.
const SLOTS: usize = 256;

/// A name of the table: its first, middle (bytes 8 to 16, for a name longer than 16) and
/// last eight bytes and its length.
#[derive(Clone, Copy)]
struct Entry {
    first: u64,
    mid: u64,
    last: u64,
    len: usize,
}

/// The eight bytes of `name` from `at`, as one word (the caller has checked they exist).
#[allow(clippy::indexing_slicing)] // Compile-time only: an index out of range fails the build.
const fn word_at(name: &[u8], at: usize) -> u64 {
    let mut w = 0u64;
    let mut i = 0;
    while i < 8 {
        w |= (name[at + i] as u64) << (8 * i);
        i += 1;
    }
    w
}

/// The slot a name with these first and last words and this length hashes to, with
/// multiplier `mul`.
const fn slot_of(first: u64, last: u64, len: usize, mul: u64) -> usize {
    let key = first ^ last.rotate_left(29) ^ (len as u64) << 56;
    (key.wrapping_mul(mul) >> 56) as usize
}

/// The names' entries, by id; built by the compiler, so a name that breaks the rules of
/// [`NAMES`] fails the build.
#[allow(clippy::indexing_slicing)] // Compile-time only, as above.
const ENTRIES: [Entry; IDS] = {
    let mut entries = [Entry {
        first: 0,
        mid: 0,
        last: 0,
        len: 0,
    }; IDS];
    let mut id = 0;
    while id < IDS {
        let name = NAMES[id];
        let len = name.len();
        assert!(len >= 8, "a name in the table is at least 8 bytes long");
        let mut i = 0;
        while i < len {
            assert!(!matches!(name[i], 0 | b'\r' | b'\n' | b'='));
            i += 1;
        }
        entries[id] = Entry {
            first: word_at(name, 0),
            mid: if len > 16 { word_at(name, 8) } else { 0 },
            last: word_at(name, len - 8),
            len,
        };
        id += 1;
    }
    entries
};

/// No name: an empty slot.
const FREE: u8 = u8::MAX;
const _: () = assert!(IDS < FREE as usize);

/// The multiplier that gives every name a slot of its own, found by the compiler: the first
/// of a sequence of odd constants that does (the build fails if none of the first 10,000
/// does).
#[allow(clippy::indexing_slicing)] // Compile-time only, as above.
const MUL: u64 = {
    let mut k = 0u64;
    loop {
        assert!(k < 10_000, "no multiplier separates the names");
        let mul = 0x9E37_79B9_7F4A_7C15u64.wrapping_add(k.wrapping_mul(0x2545_F491_4F6C_DD1E)) | 1;
        let mut taken = [false; SLOTS];
        let mut id = 0;
        while id < IDS {
            let e = ENTRIES[id];
            let slot = slot_of(e.first, e.last, e.len, mul);
            if taken[slot] {
                break;
            }
            taken[slot] = true;
            id += 1;
        }
        if id == IDS {
            break mul;
        }
        k += 1;
    }
};

/// Per slot, the id of the one name that hashes to it, or [`FREE`].
#[allow(clippy::indexing_slicing)] // Compile-time only, as above.
const TABLE: [u8; SLOTS] = {
    let mut table = [FREE; SLOTS];
    let mut id = 0;
    while id < IDS {
        let e = ENTRIES[id];
        table[slot_of(e.first, e.last, e.len, MUL)] = id as u8;
        id += 1;
    }
    table
};

/// The id of `name` in the table, if it is there: below [`KNOWN`], a [`Known`] name's
/// discriminant; from [`KNOWN`] on, a common name's.
#[inline]
pub(super) fn lookup(name: &[u8]) -> Option<u8> {
    let len = name.len();
    let (Some(head), Some(tail)) = (
        name.first_chunk::<8>(),
        name.get(len.saturating_sub(8)..)
            .and_then(|t| t.first_chunk::<8>()),
    ) else {
        return None;
    };
    probe(u64::from_le_bytes(*head), u64::from_le_bytes(*tail), name)
}

/// [`lookup`] for the name that starts `pair` and is `len` bytes long (at most the pair's
/// length): its first and last eight bytes are read from the pair.
#[inline]
pub(super) fn lookup_at(pair: &[u8], len: usize) -> Option<u8> {
    if len < 8 {
        return None;
    }
    let word = |at: usize| {
        pair.get(at..)
            .and_then(<[u8]>::first_chunk::<8>)
            .map(|w| u64::from_le_bytes(*w))
    };
    let (Some(first), Some(last), Some(name)) = (word(0), word(len - 8), pair.get(..len)) else {
        return None;
    };
    probe(first, last, name)
}

/// The table's entry for `name`, whose first and last eight bytes are `first` and `last`:
/// one slot, one entry compared (for a name longer than 24 bytes, the whole name).
#[inline(always)]
fn probe(first: u64, last: u64, name: &[u8]) -> Option<u8> {
    let len = name.len();
    let id = TABLE
        .get(slot_of(first, last, len, MUL))
        .copied()
        .unwrap_or(FREE);
    let e = ENTRIES.get(usize::from(id))?;
    let same = e.len == len
        && e.first == first
        && e.last == last
        && (len <= 16
            || match len <= 24 {
                // First, middle and last words cover the name.
                true => {
                    name.get(8..16)
                        .and_then(<[u8]>::first_chunk::<8>)
                        .map(|w| u64::from_le_bytes(*w))
                        == Some(e.mid)
                }
                false => NAMES.get(usize::from(id)).copied() == Some(name),
            });
    same.then_some(id)
}

impl Known {
    /// The known name `name` is, if any.
    pub fn of(name: &[u8]) -> Option<Known> {
        lookup(name).and_then(Known::from_index)
    }

    /// The variable's name.
    pub fn name(self) -> &'static [u8] {
        NAMES.get(self as usize).copied().unwrap_or_default()
    }

    /// The known name with index `i` (its discriminant).
    pub(super) fn from_index(i: u8) -> Option<Known> {
        ALL_KNOWN.get(usize::from(i)).copied()
    }
}

#[cfg(test)]
mod tests {
    use super::{lookup, Known, ALL_KNOWN, IDS, KNOWN, NAMES};

    #[test]
    fn every_name_is_found_with_its_own_id_and_its_neighbours_are_not() {
        for (id, name) in NAMES.iter().enumerate() {
            assert_eq!(lookup(name), Some(id as u8), "{}", name.escape_ascii());
            // Any one byte changed anywhere, or the length changed, is another name.
            for at in 0..name.len() {
                for b in [b'A', b'_', b'Z', 0, b'=', 0xff] {
                    let mut other = name.to_vec();
                    if other[at] == b {
                        continue;
                    }
                    other[at] = b;
                    assert_eq!(lookup(&other), None, "{}", other.escape_ascii());
                }
            }
            assert_eq!(lookup(&name[..name.len() - 1]), None);
            assert_eq!(lookup(&[name, &b"X"[..]].concat()), None);
            assert_eq!(lookup(&[&b"X"[..], name].concat()), None);
        }
        assert_eq!(NAMES.len(), IDS);
        for (i, k) in ALL_KNOWN.iter().enumerate() {
            assert_eq!(*k as usize, i);
            assert_eq!(Known::of(k.name()), Some(*k));
        }
        // A common name is recognised, but is no known one.
        assert_eq!(lookup(b"HTTP_USER_AGENT").map(usize::from), Some(IDS - 5));
        assert_eq!(Known::of(b"HTTP_USER_AGENT"), None);
        assert!(usize::from(lookup(b"GATEWAY_INTERFACE").unwrap()) >= KNOWN);
    }

    #[test]
    fn short_and_long_names_are_not_in_the_table() {
        for name in [&b""[..], b"H", b"HTTPS", b"HTTP_HO", b"PATH_INF"] {
            assert_eq!(lookup(name), None, "{}", name.escape_ascii());
        }
        let long = vec![b'A'; 70_000];
        assert_eq!(lookup(&long), None);
        // Same first and last eight bytes and length as a long table name, another middle.
        assert_eq!(lookup(b"HTTP_UPGRADE_XXXXXXXXXXREQUESTS"), None);
        assert_eq!(lookup(b"HTTP_UPGRADE_INSECURE_XEQUESTS"), None);
        assert_eq!(lookup(b"HTTP_UPGRADE_XNSECURE_REQUESTS"), None);
    }
}
