//! The Host a client names (RFC 9110 §7.2), checked before it routes a request or becomes
//! SERVER_NAME, as nginx checks it: a host that could name a path or hide a second value is
//! refused (400), never passed on.

use super::{snippet, CgiError};

/// Checks a Host value (`example.com`, `example.com:8080`, `[2001:db8::1]:443`): refused are
/// an empty host, a byte that is a control, a space, DEL, `/` or `\` (a path separator in
/// what a script may use as a directory name or cache key), an empty label (`a..b`, `.a`: one
/// final dot, `example.com.`, is the absolute form and kept), a bracketed literal that is not
/// closed or holds anything but hex digits, `:` and `.`, and a port that is not 1 to 5
/// digits. Bytes from 0x80 up pass, as nginx lets raw UTF-8 names through.
pub fn check_host(raw: &[u8]) -> Result<(), CgiError> {
    if raw.first() == Some(&b'[') {
        return check_literal(raw);
    }
    // One pass over a name and its port, each byte classed by one table load: the name's
    // bytes up to the first ':' (an empty label noted, not yet reported: a refused byte
    // later in the Host is the first error), then the port's. The errors are then reported
    // in the order the checks are documented in: a refused byte, the port, no name, an
    // empty label.
    let mut bytes = raw.iter();
    let mut after_dot = true;
    let mut empty_label = false;
    let mut name_len = raw.len();
    for (at, &byte) in bytes.by_ref().enumerate() {
        match class(byte) {
            PLAIN | DIGIT => after_dot = false,
            DOT => {
                empty_label |= after_dot;
                after_dot = true;
            }
            COLON => {
                name_len = at;
                break;
            }
            _ => return Err(refused_byte(raw, byte)),
        }
    }
    if name_len < raw.len() {
        // The port: 1 to 5 digits; any byte but a refused one only spoils it.
        let port = bytes.as_slice();
        let mut digits_only = true;
        for &byte in port {
            match class(byte) {
                DIGIT => {}
                REFUSED => return Err(refused_byte(raw, byte)),
                _ => digits_only = false,
            }
        }
        if !digits_only || port.is_empty() || port.len() > 5 {
            return Err(refuse(raw, "Host has a port that is not 1 to 5 digits"));
        }
    }
    if name_len == 0 {
        return Err(refuse(raw, "Host has no host name"));
    }
    // One final dot is the absolute form: a dot after a byte that is not one leaves no empty
    // label, so only a dot that follows a dot (or starts the name) is one.
    if empty_label {
        return Err(refuse(
            raw,
            "Host has an empty label (a leading dot or '..')",
        ));
    }
    Ok(())
}

/// A byte of a Host, by what the checks make of it.
const PLAIN: u8 = 0;
const DIGIT: u8 = 1;
const DOT: u8 = 2;
const COLON: u8 = 3;
const REFUSED: u8 = 4;

/// A byte's class (a `u8` indexes the 256 entries: no bound to check).
#[inline(always)]
fn class(byte: u8) -> u8 {
    CLASS.get(usize::from(byte)).copied().unwrap_or(REFUSED)
}

/// Every byte's class: a control byte, a space, DEL, `/` and `\` are refused; bytes from 0x80
/// up are plain.
#[allow(clippy::indexing_slicing)] // Indexes below 256, the table's length.
static CLASS: [u8; 256] = {
    let mut table = [PLAIN; 256];
    let mut byte = 0;
    while byte < 256 {
        table[byte] = match byte as u8 {
            0..=b' ' | 0x7f | b'/' | b'\\' => REFUSED,
            b'0'..=b'9' => DIGIT,
            b'.' => DOT,
            b':' => COLON,
            _ => PLAIN,
        };
        byte += 1;
    }
    table
};

#[cold]
fn refuse(raw: &[u8], reason: &'static str) -> CgiError {
    CgiError::InvalidHost {
        value: snippet(raw),
        reason,
    }
}

#[cold]
fn refused_byte(raw: &[u8], byte: u8) -> CgiError {
    refuse(
        raw,
        match byte {
            b'/' => "Host holds a '/'",
            b'\\' => "Host holds a '\\'",
            0 => "Host holds a NUL byte",
            b' ' => "Host holds a space",
            _ => "Host holds a control byte",
        },
    )
}

/// A Host that starts with `[`: an IP literal, then an optional port. A refused byte
/// anywhere is still the first error.
#[cold]
fn check_literal(raw: &[u8]) -> Result<(), CgiError> {
    if let Some(&byte) = raw.iter().find(|&&b| class(b) == REFUSED) {
        return Err(refused_byte(raw, byte));
    }
    let literal = raw.get(1..).unwrap_or_default();
    let close = literal
        .iter()
        .position(|&b| b == b']')
        .ok_or_else(|| refuse(raw, "Host has a '[' that is not closed"))?;
    let (inside, rest) = literal.split_at(close);
    if inside.is_empty()
        || !inside
            .iter()
            .all(|b| b.is_ascii_hexdigit() || *b == b':' || *b == b'.')
    {
        return Err(refuse(raw, "Host has an IP literal that is not an address"));
    }
    match rest.get(1..).unwrap_or_default() {
        [] => Ok(()),
        [b':', port @ ..] => {
            if port.is_empty() || port.len() > 5 || !port.iter().all(u8::is_ascii_digit) {
                Err(refuse(raw, "Host has a port that is not 1 to 5 digits"))
            } else {
                Ok(())
            }
        }
        _ => Err(refuse(raw, "Host has bytes after its IP literal")),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::panic)]

    use proptest::prelude::*;

    use super::*;

    /// The checks as first written, a pass per question, to hold the one-pass version to.
    fn oracle(raw: &[u8]) -> Result<(), &'static str> {
        if let Some(&byte) = raw
            .iter()
            .find(|&&b| b <= b' ' || b == 0x7f || b == b'/' || b == b'\\')
        {
            return Err(match byte {
                b'/' => "Host holds a '/'",
                b'\\' => "Host holds a '\\'",
                0 => "Host holds a NUL byte",
                b' ' => "Host holds a space",
                _ => "Host holds a control byte",
            });
        }
        let (name, port) = if let Some(literal) = raw.strip_prefix(b"[") {
            let close = literal
                .iter()
                .position(|&b| b == b']')
                .ok_or("Host has a '[' that is not closed")?;
            let (inside, rest) = literal.split_at(close);
            if inside.is_empty()
                || !inside
                    .iter()
                    .all(|b| b.is_ascii_hexdigit() || *b == b':' || *b == b'.')
            {
                return Err("Host has an IP literal that is not an address");
            }
            match rest.get(1..).unwrap_or_default() {
                [] => (None, None),
                [b':', port @ ..] => (None, Some(port)),
                _ => return Err("Host has bytes after its IP literal"),
            }
        } else {
            match raw.iter().position(|&b| b == b':') {
                Some(colon) => (raw.get(..colon), raw.get(colon + 1..)),
                None => (Some(raw), None),
            }
        };
        if let Some(port) = port {
            if port.is_empty() || port.len() > 5 || !port.iter().all(u8::is_ascii_digit) {
                return Err("Host has a port that is not 1 to 5 digits");
            }
        }
        if let Some(name) = name {
            if name.is_empty() {
                return Err("Host has no host name");
            }
            let name = name.strip_suffix(b".").unwrap_or(name);
            if name.split(|&b| b == b'.').any(<[u8]>::is_empty) {
                return Err("Host has an empty label (a leading dot or '..')");
            }
        }
        Ok(())
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(5000))]

        #[test]
        fn one_pass_answers_as_the_oracle(
            raw in prop::collection::vec(
                prop::sample::select(&b"a.:1[]f/ \\\x00\x7f\xc3"[..]),
                0..12,
            )
        ) {
            let got = check_host(&raw).map_err(|e| match e {
                CgiError::InvalidHost { reason, .. } => reason,
                other => panic!("{other:?}"),
            });
            prop_assert_eq!(got, oracle(&raw));
        }
    }

    fn reason(raw: &[u8]) -> &'static str {
        match check_host(raw) {
            Err(CgiError::InvalidHost { reason, .. }) => reason,
            other => panic!("{:?}: {other:?}", raw.escape_ascii().to_string()),
        }
    }

    #[test]
    fn ordinary_hosts_pass() {
        for ok in [
            &b"example.com"[..],
            b"example.com:8080",
            b"example.com.",
            b"localhost",
            b"127.0.0.1:80",
            b"[::1]",
            b"[2001:db8::1]:443",
            b"xn--bcher-kva.example",
            "bücher.example".as_bytes(),
            b"under_score.example",
        ] {
            assert!(check_host(ok).is_ok(), "{}", ok.escape_ascii());
        }
    }

    #[test]
    fn what_nginx_refuses_is_refused() {
        assert_eq!(reason(b""), "Host has no host name");
        assert_eq!(reason(b":80"), "Host has no host name");
        assert_eq!(reason(b"a/b"), "Host holds a '/'");
        assert_eq!(reason(b"a\\b"), "Host holds a '\\'");
        assert_eq!(reason(b"a\0b"), "Host holds a NUL byte");
        assert_eq!(reason(b"a\x01b"), "Host holds a control byte");
        assert_eq!(reason(b"a\x7fb"), "Host holds a control byte");
        assert_eq!(reason(b"a b"), "Host holds a space");
        assert_eq!(
            reason(b"a..b"),
            "Host has an empty label (a leading dot or '..')"
        );
        assert_eq!(
            reason(b".."),
            "Host has an empty label (a leading dot or '..')"
        );
        assert_eq!(
            reason(b".example.com"),
            "Host has an empty label (a leading dot or '..')"
        );
        assert_eq!(
            reason(b"example.com.."),
            "Host has an empty label (a leading dot or '..')"
        );
        assert_eq!(
            reason(b"."),
            "Host has an empty label (a leading dot or '..')"
        );
        assert_eq!(
            reason(b"example.com:"),
            "Host has a port that is not 1 to 5 digits"
        );
        assert_eq!(
            reason(b"example.com:8x"),
            "Host has a port that is not 1 to 5 digits"
        );
        assert_eq!(
            reason(b"a:1:2"),
            "Host has a port that is not 1 to 5 digits"
        );
        assert_eq!(reason(b"[::1"), "Host has a '[' that is not closed");
        assert_eq!(reason(b"[::1]x"), "Host has bytes after its IP literal");
        assert_eq!(
            reason(b"[evil.com]"),
            "Host has an IP literal that is not an address"
        );
    }
}
