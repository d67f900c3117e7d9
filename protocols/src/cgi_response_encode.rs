//! The CGI response head's encoder, for when corral is the responder (its own answers) or
//! relays a backend's head to a front server: it refuses what the decoder refuses, so that
//! decoding what it wrote gives the head back. A head straight from the decoder passed the
//! same rules there, and is written without them (see [`CgiResponseHead::is_decoded`]).

use bytes::{BufMut, BytesMut};

use super::{check_location, is_token, snippet, CgiResponseError, CgiResponseHead, CgiStatus};

/// At most the bytes [`encode_head`] writes for `head` (exactly, but for a `Status:` line
/// without a reason, one less): a caller that frames the head with more bytes sizes its
/// buffer once.
pub fn encoded_len(head: &CgiResponseHead) -> usize {
    // "Status: NNN reason\r\n", each "name: value\r\n", and the blank line.
    let status = head.status().map_or(0, |s| 14 + s.reason.len());
    head.headers()
        .iter()
        .fold(status + 2, |len, (name, value)| {
            len + name.len() + value.len() + 4
        })
}

/// Writes `head` as a CGI response head (`Status:` line, headers, blank line, CRLF endings).
///
/// Refuses what the decoder would refuse, so that decoding the output gives `head` back: a
/// code outside 100-999, names that are not tokens, a `Status` entry in `headers`, values with
/// control bytes or surrounding whitespace, more than one `Location`. A head the decoder
/// returned and nobody changed ([`CgiResponseHead::is_decoded`]) broke none of these rules
/// (the decoder refuses the same) and is written without looking at them again.
pub fn encode_head(head: &CgiResponseHead, dst: &mut BytesMut) -> Result<(), CgiResponseError> {
    if head.is_decoded() {
        write_decoded(head, dst);
        return Ok(());
    }
    // Checked as it is written, in one pass over the head; on a refusal `dst` is cut back to
    // what it held, so nothing of a refused head is left in it.
    let mark = dst.len();
    let written = write_head(head, dst);
    if written.is_err() {
        dst.truncate(mark);
    }
    written
}

/// [`encode_head`] for a decoded head: the same bytes, written without the checks.
fn write_decoded(head: &CgiResponseHead, dst: &mut BytesMut) {
    dst.reserve(encoded_len(head));
    if let Some(status) = head.status() {
        write_status(status, dst);
    }
    for (name, value) in head.headers() {
        write_field(name, value, dst);
    }
    dst.put_slice(b"\r\n");
}

/// The `Status:` line of a status whose code is 100 to 999.
#[inline]
fn write_status(status: &CgiStatus, dst: &mut BytesMut) {
    dst.put_slice(b"Status: ");
    // 100..=999 (checked by the caller or the decoder): three digits.
    let code = status.code;
    dst.put_slice(&[
        b'0' + (code / 100 % 10) as u8,
        b'0' + (code / 10 % 10) as u8,
        b'0' + (code % 10) as u8,
    ]);
    if !status.reason.is_empty() {
        dst.put_u8(b' ');
        dst.put_slice(&status.reason);
    }
    dst.put_slice(b"\r\n");
}

#[inline]
fn write_field(name: &[u8], value: &[u8], dst: &mut BytesMut) {
    dst.put_slice(name);
    dst.put_slice(b": ");
    dst.put_slice(value);
    dst.put_slice(b"\r\n");
}

/// [`encode_head`]'s pass: each part checked, then written.
fn write_head(head: &CgiResponseHead, dst: &mut BytesMut) -> Result<(), CgiResponseError> {
    dst.reserve(encoded_len(head));
    if let Some(status) = head.status() {
        if !(100..=999).contains(&status.code) || !is_clean_value(&status.reason) {
            return Err(CgiResponseError::InvalidStatus {
                value: snippet(&status.reason),
            });
        }
        write_status(status, dst);
    }
    let mut locations = 0;
    for (name, value) in head.headers() {
        if !is_token(name) {
            return Err(CgiResponseError::InvalidName {
                name: snippet(name),
            });
        }
        if name.eq_ignore_ascii_case(b"status") {
            return Err(CgiResponseError::DuplicateStatus);
        }
        if !is_clean_value(value) {
            return Err(CgiResponseError::InvalidValue {
                name: snippet(name),
            });
        }
        if name.eq_ignore_ascii_case(b"location") {
            locations += 1;
            if locations > 1 {
                return Err(CgiResponseError::DuplicateLocation);
            }
            check_location(value)?;
        }
        write_field(name, value, dst);
    }
    dst.put_slice(b"\r\n");
    Ok(())
}

/// A value the decoder would give back as it is: field-value bytes only (no control byte but
/// a tab, no DEL: no line break can be smuggled into the head), and no space or tab at either
/// end (the decoder trims them). Every byte is looked at, without branching on each, so the
/// usual short value is checked in a few instructions.
fn is_clean_value(value: &[u8]) -> bool {
    let bad = value.iter().fold(false, |bad, &c| {
        bad | ((c < b' ' && c != b'\t') | (c == 0x7f))
    });
    let padded = |c: Option<&u8>| matches!(c, Some(b' ' | b'\t'));
    !bad && !padded(value.first()) && !padded(value.last())
}
