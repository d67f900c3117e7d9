//! BEGIN_REQUEST encoded straight from a request's CGI variables ([`CgiParams`]) in one walk
//! over them: what a gateway in front of lsphp does per request. It writes the packet that a
//! [`RequestBuilder`](super::RequestBuilder) fed pair by pair writes (the same bytes; the
//! tests hold the two together), without the builder's intermediate lists:
//!
//! - env pairs go into the destination as they come, copied into a zero-filled room sized
//!   from the parameters (their NULs are its zeros; the 48 bytes before them are filled
//!   once the walk is over);
//! - `HTTP_*` variables become header lines in a scratch kept by the caller (`HTTP_X_THING`
//!   → `X-Thing`, written in place), their offsets counted from the first header line and
//!   moved past the request line at the end, so that the request line can be made from
//!   variables met anywhere in the walk;
//! - the name and value limits are checked once for all pairs when the parameters know
//!   they hold ([`CgiParams::within`]), pair by pair otherwise; the packet's size once, at
//!   the end (and along the way only as far as stopping a runaway needs).
//!
//! The rules are the builder's: `CONTENT_TYPE` (when not empty) and the `HTTP_*` variables
//! are request headers, `CONTENT_LENGTH` becomes a `Content-Length` header carrying the real
//! body length (also sent when the body is not empty), the `HTTP_` copies of the entity
//! headers are left out, any other variable is an env pair, and a pointed variable
//! ([`POINTED_ENV`]) the parameters lack is added (`REQUEST_METHOD` as `GET`, the others
//! empty). A request both encoders refuse may be refused for another of its faults here: the
//! walk checks the size last.

use bytes::{BufMut, BytesMut};

use super::headers::{
    known_header_exact, known_header_index, HEADER_INDEX_LEN, H_CONTENT_LENGTH,
    H_TRANSFER_ENCODING, KNOWN_HEADERS, KNOWN_HEADER_COUNT, UNKNOWN_HEADER_ENTRY_LEN,
};
use super::packet::{ByteOrder, FlagRule, PacketType, MAX_HEADER_PACKET_LEN};
use super::request::{
    align8, check_len, has_line_breaking_byte, parse_decimal, to_i32, BODY_LEN_FROM_CONTENT_LENGTH,
    MAX_ENV_PAIRS, POINTED_ENV, REQ_HEADER_LEN,
};
use super::LsapiError;
use crate::cgi::CgiParams;
use crate::Limits;

/// The slots of [`POINTED_ENV`].
const POINTED_SCRIPT_FILENAME: usize = 0;
const POINTED_SCRIPT_NAME: usize = 1;
const POINTED_QUERY: usize = 2;
const POINTED_METHOD: usize = 3;
/// Room for the pointed variables added at the end of the walk: four pairs with names of 15
/// bytes at most (`SCRIPT_FILENAME`), 6 bytes of lengths and NULs each, and `GET`.
const POINTED_ROOM: usize = 4 * (15 + 6) + 3;

/// What [`encode_cgi_request`] reuses from one request to the next (the header lines and
/// the unknown-header table), so that a thread encoding request after request allocates
/// only for its first. Each grows at most to the packet limit.
#[derive(Debug, Default)]
pub struct CgiScratch {
    /// The header lines (`Name: value CRLF`…), without the request line.
    head: Vec<u8>,
    /// One entry per unknown header: name offset, name length, value offset, value length,
    /// the offsets counted from the start of `head`.
    unknown: Vec<[i32; 4]>,
}

/// The request line's parts, the first of each variable (as [`CgiParams::get`] finds).
#[derive(Default)]
struct LineParts<'a> {
    method: Option<&'a [u8]>,
    protocol: Option<&'a [u8]>,
    uri: Option<&'a [u8]>,
    script: Option<&'a [u8]>,
    path_info: Option<&'a [u8]>,
    query: Option<&'a [u8]>,
}

/// The state of one walk.
struct Walk<'s> {
    limits: &'s Limits,
    /// Whether each name and value must be checked against the limits (the parameters could
    /// not vouch for all of them at once).
    each_len: bool,
    /// The packet's size limit.
    max: usize,
    /// The destination and where the packet starts in it. While the walk runs, `dst` is
    /// zero-filled up to the room the env pairs may take, and `end` (counted from `start`)
    /// is where the next pair goes: a pair is copied in with no NUL to write and no
    /// capacity check per piece.
    dst: &'s mut BytesMut,
    start: usize,
    end: usize,
    head: &'s mut Vec<u8>,
    unknown: &'s mut Vec<[i32; 4]>,
    /// Whether each known header was given.
    seen: [bool; KNOWN_HEADER_COUNT],
    /// The known headers given, in the order met (the first `known_count`): slot, value
    /// offset in `head`, value length. The index is written from these alone, its other
    /// slots left zero.
    known: [KnownAt; KNOWN_HEADER_COUNT],
    known_count: usize,
    env_count: usize,
    /// Offset of each pointed variable's value from the packet's start (the last wins).
    pointed: [Option<usize>; 4],
}

/// Appends the BEGIN_REQUEST packet of the request `params` describe, with a body of
/// `body_len` bytes, to `dst`, in native byte order under [`FlagRule::HOST`]. On an error
/// `dst` is left as it was; a caller should answer 431.
pub fn encode_cgi_request(
    params: &CgiParams,
    body_len: u64,
    limits: &Limits,
    scratch: &mut CgiScratch,
    dst: &mut BytesMut,
) -> Result<(), LsapiError> {
    let start = dst.len();
    let done = encode(params, body_len, limits, scratch, dst, start);
    if done.is_err() {
        dst.truncate(start);
    }
    done
}

fn encode(
    params: &CgiParams,
    body_len: u64,
    limits: &Limits,
    scratch: &mut CgiScratch,
    dst: &mut BytesMut,
    start: usize,
) -> Result<(), LsapiError> {
    scratch.head.clear();
    scratch.unknown.clear();
    let max = limits.max_params_bytes.min(MAX_HEADER_PACKET_LEN);
    // Each env pair takes 4 bytes more than its FastCGI form at most (a 2-byte prefix at
    // least there, 4 bytes and two NULs here), the pointed variables added at the end
    // fewer than POINTED_ROOM bytes: this room holds them all, and never more than one
    // byte past the packet limit (a pair that would end past it is refused as it comes).
    let room = (REQ_HEADER_LEN + 4 + params.encoded().len() + 4 * params.len() + POINTED_ROOM)
        .min(max + 1);
    // The request header (filled at the end), the empty special env list, then the pairs.
    dst.resize(start + room, 0);
    let mut walk = Walk {
        limits,
        each_len: !params.within(limits.max_name_len, limits.max_value_len, usize::MAX),
        max,
        dst,
        start,
        end: REQ_HEADER_LEN + 4,
        head: &mut scratch.head,
        unknown: &mut scratch.unknown,
        seen: [false; KNOWN_HEADER_COUNT],
        known: [KnownAt::default(); KNOWN_HEADER_COUNT],
        known_count: 0,
        env_count: 0,
        pointed: [None; 4],
    };
    let mut line = LineParts::default();
    let mut had_length = false;
    for (name, value) in params.iter() {
        // Told apart by the first byte, then by name: most variables are looked at once.
        match name.first() {
            Some(b'H') if name.starts_with(b"HTTP_") => match name {
                b"HTTP_CONTENT_LENGTH" | b"HTTP_CONTENT_TYPE" | b"HTTP_TRANSFER_ENCODING" => {}
                n => walk.header(Name::Cgi(n.get(5..).unwrap_or_default()), value)?,
            },
            Some(b'C') if name == b"CONTENT_LENGTH" => had_length = true,
            Some(b'C') if name == b"CONTENT_TYPE" => {
                if !value.is_empty() {
                    walk.header(Name::Plain(b"Content-Type"), value)?;
                }
            }
            Some(b'P' | b'Q' | b'R' | b'S') => {
                // The request line's parts (the first of each) and the pointed variables
                // (the last of each), told apart in the one match.
                let pointed = match name {
                    b"REQUEST_METHOD" => {
                        first(&mut line.method, value);
                        Some(POINTED_METHOD)
                    }
                    b"SCRIPT_NAME" => {
                        first(&mut line.script, value);
                        Some(POINTED_SCRIPT_NAME)
                    }
                    b"QUERY_STRING" => {
                        first(&mut line.query, value);
                        Some(POINTED_QUERY)
                    }
                    b"SCRIPT_FILENAME" => Some(POINTED_SCRIPT_FILENAME),
                    b"SERVER_PROTOCOL" => {
                        first(&mut line.protocol, value);
                        None
                    }
                    b"REQUEST_URI" => {
                        first(&mut line.uri, value);
                        None
                    }
                    b"PATH_INFO" => {
                        first(&mut line.path_info, value);
                        None
                    }
                    _ => None,
                };
                walk.env(name, value, pointed)?;
            }
            _ => walk.env(name, value, None)?,
        }
    }
    if body_len > 0 || had_length {
        let mut digits = [0u8; 20];
        walk.header(
            Name::Plain(b"Content-Length"),
            decimal(body_len, &mut digits),
        )?;
    }
    for (i, name) in POINTED_ENV.into_iter().enumerate() {
        if walk.pointed.get(i).is_some_and(Option::is_none) {
            let value: &[u8] = if name == "REQUEST_METHOD" {
                b"GET"
            } else {
                b""
            };
            // Checked here whatever the parameters hold: the name is not one of theirs.
            check_len("env", name.as_bytes(), value, limits)?;
            walk.env(name.as_bytes(), value, Some(i))?;
        }
    }
    walk.finish(&line, body_len)
}

/// Keeps the first value a variable had.
fn first<'a>(slot: &mut Option<&'a [u8]>, value: &'a [u8]) {
    if slot.is_none() {
        *slot = Some(value);
    }
}

/// A header's name: as given, or a CGI name without its `HTTP_` (`X_THING` → `X-Thing`).
#[derive(Clone, Copy)]
enum Name<'a> {
    Plain(&'a [u8]),
    Cgi(&'a [u8]),
}

impl Walk<'_> {
    /// Appends an env pair; `pointed`: its slot in [`POINTED_ENV`] if it is one. Inlined:
    /// the walk calls it for most variables.
    #[inline(always)]
    fn env(&mut self, name: &[u8], value: &[u8], pointed: Option<usize>) -> Result<(), LsapiError> {
        if self.each_len {
            check_len("env", name, value, self.limits)?;
        }
        if self.env_count >= MAX_ENV_PAIRS || self.env_count >= self.limits.max_params_count {
            return Err(LsapiError::TooManyPairs {
                what: "env pairs",
                count: self.env_count + 1,
                max: self.limits.max_params_count.min(MAX_ENV_PAIRS),
            });
        }
        let at = self.end;
        let value_at = at + 4 + name.len() + 1;
        let end = value_at + value.len() + 1;
        // The packet holds at least this much: stop a runaway here, before any length could
        // pass the two bytes it is written in.
        if end > self.max {
            return Err(LsapiError::RequestTooLarge {
                len: end,
                max: self.max,
            });
        }
        let room = self.start + end;
        if room > self.dst.len() {
            // Past the room foreseen (it cannot be, but the walk does not count on it).
            self.dst.resize(room, 0);
        }
        // Both lengths fit their two bytes: the pair's end is within the packet limit.
        let [n1, n0] = u16::try_from(name.len() + 1)
            .unwrap_or(u16::MAX)
            .to_be_bytes();
        let [v1, v0] = u16::try_from(value.len() + 1)
            .unwrap_or(u16::MAX)
            .to_be_bytes();
        // The bytes between the pieces are the room's zeros: the NULs that end them.
        let out = self.dst.get_mut(self.start..room).unwrap_or_default();
        if let Some(lens) = out.get_mut(at..at + 4) {
            lens.copy_from_slice(&[n1, n0, v1, v0]);
        }
        if let Some(n) = out.get_mut(at + 4..value_at - 1) {
            n.copy_from_slice(name);
        }
        if let Some(v) = out.get_mut(value_at..end - 1) {
            v.copy_from_slice(value);
        }
        self.end = end;
        if let Some(slot) = pointed.and_then(|i| self.pointed.get_mut(i)) {
            *slot = Some(value_at);
        }
        self.env_count += 1;
        Ok(())
    }

    fn header(&mut self, name: Name<'_>, value: &[u8]) -> Result<(), LsapiError> {
        // A CGI name's bytes map one to one onto the header name's (only `_` and letter
        // case change), so the name's checks can look at either.
        let raw = match name {
            Name::Plain(n) | Name::Cgi(n) => n,
        };
        if raw.is_empty() || raw.iter().any(|&b| matches!(b, b':' | b'\r' | b'\n' | 0)) {
            return Err(LsapiError::InvalidHeaderBytes {
                what: "header name",
            });
        }
        if has_line_breaking_byte(value) {
            return Err(LsapiError::InvalidHeaderBytes {
                what: "header value",
            });
        }
        if self.each_len || matches!(name, Name::Plain(_)) {
            check_len("request header", raw, value, self.limits)?;
        }
        let headers = self.unknown.len() + self.known_count;
        if headers >= self.limits.max_params_count {
            return Err(LsapiError::TooManyPairs {
                what: "headers",
                count: headers + 1,
                max: self.limits.max_params_count,
            });
        }
        let name_off = self.head.len();
        match name {
            Name::Plain(n) => self.head.extend_from_slice(n),
            Name::Cgi(n) => put_header_name(n, self.head),
        }
        // put_header_name spells a name as KNOWN_HEADERS does (each word capitalised) unless
        // the CGI name held a `-` (`HTTP_CONTENT-TYPE` gives `Content-type`), and the plain
        // names are given so: the exact match finds the known headers, the slower one is
        // left for such names.
        let written = self.head.get(name_off..).unwrap_or_default();
        let known = match known_header_exact(written) {
            Some(i) => Some(i),
            None if raw.contains(&b'-') => known_header_index(written),
            None => None,
        };
        if known == Some(H_TRANSFER_ENCODING) {
            return Err(LsapiError::TransferEncodingHeader);
        }
        self.head.extend_from_slice(b": ");
        let value_off = self.head.len();
        match known {
            Some(i) => {
                let (Some(seen), Some(at)) =
                    (self.seen.get_mut(i), self.known.get_mut(self.known_count))
                else {
                    return Err(LsapiError::RepeatedKnownHeader("known header"));
                };
                if *seen {
                    let name = KNOWN_HEADERS.get(i).copied().unwrap_or("known header");
                    return Err(LsapiError::RepeatedKnownHeader(name));
                }
                *seen = true;
                *at = KnownAt {
                    slot: i,
                    off: value_off,
                    len: u16::try_from(value.len()).unwrap_or(u16::MAX),
                };
                self.known_count += 1;
            }
            None => self.unknown.push([
                to_i32(name_off),
                to_i32(raw.len()),
                to_i32(value_off),
                to_i32(value.len()),
            ]),
        }
        self.head.extend_from_slice(value);
        self.head.extend_from_slice(b"\r\n");
        if self.head.len() > self.max {
            return Err(LsapiError::RequestTooLarge {
                len: self.head.len(),
                max: self.max,
            });
        }
        Ok(())
    }

    /// Checks the whole packet's size, then writes what follows the env pairs and fills
    /// the request header.
    fn finish(self, parts: &LineParts<'_>, body_len: u64) -> Result<(), LsapiError> {
        let (dst, start) = (self.dst, self.start);
        dst.truncate(start + self.end);
        if line_breaks(parts) {
            return Err(LsapiError::InvalidHeaderBytes {
                what: "request line",
            });
        }
        let line_len = request_line_len(parts);
        let lists_end = self.end + 4;
        let total = align8(lists_end)
            + HEADER_INDEX_LEN
            + self.unknown.len() * UNKNOWN_HEADER_ENTRY_LEN
            + line_len
            + 2
            + self.head.len()
            + 2;
        if total > self.max {
            return Err(LsapiError::RequestTooLarge {
                len: total,
                max: self.max,
            });
        }
        let mut pointed = [0i32; 4];
        for ((slot, at), name) in pointed.iter_mut().zip(self.pointed).zip(POINTED_ENV) {
            *slot = to_i32(at.ok_or(LsapiError::MissingEnv(name))?);
        }
        let body_field = match i32::try_from(body_len) {
            Ok(len) => len,
            Err(_) => {
                let declared = self
                    .known
                    .get(..self.known_count)
                    .unwrap_or_default()
                    .iter()
                    .find(|k| k.slot == H_CONTENT_LENGTH)
                    .and_then(|k| self.head.get(k.off..k.off + usize::from(k.len)))
                    .and_then(parse_decimal);
                if declared != Some(body_len) {
                    return Err(LsapiError::LargeBodyWithoutContentLength(body_len));
                }
                BODY_LEN_FROM_CONTENT_LENGTH
            }
        };
        // Header offsets count from the raw head's start: the request line comes first.
        let base = line_len + 2;
        dst.reserve(total - self.end);
        dst.put_bytes(0, 4);
        dst.put_bytes(0, align8(lists_end) - lists_end);
        // The index built on the stack and appended in one piece: the lengths, two bytes of
        // padding, the offsets.
        let mut index = [0u8; HEADER_INDEX_LEN];
        let (lens, offs) = index.split_at_mut(2 * KNOWN_HEADER_COUNT + 2);
        for k in self.known.get(..self.known_count).unwrap_or_default() {
            if let Some(len) = lens.get_mut(2 * k.slot..2 * k.slot + 2) {
                len.copy_from_slice(&k.len.to_ne_bytes());
            }
            if let Some(off) = offs.get_mut(4 * k.slot..4 * k.slot + 4) {
                off.copy_from_slice(&to_i32(base + k.off).to_ne_bytes());
            }
        }
        dst.put_slice(&index);
        for &[name_off, name_len, value_off, value_len] in self.unknown.iter() {
            let mut entry = [0u8; UNKNOWN_HEADER_ENTRY_LEN];
            let fields = [
                name_off + to_i32(base),
                name_len,
                value_off + to_i32(base),
                value_len,
            ];
            for (slot, field) in entry.chunks_exact_mut(4).zip(fields) {
                slot.copy_from_slice(&field.to_ne_bytes());
            }
            dst.put_slice(&entry);
        }
        put_request_line(parts, dst);
        dst.put_slice(b"\r\n");
        dst.put_slice(self.head);
        dst.put_slice(b"\r\n");
        // The request header: the packet header, then nine int32.
        let order = ByteOrder::NATIVE;
        let mut fixed = [0u8; REQ_HEADER_LEN];
        let fields = [
            to_i32(total),
            to_i32(line_len + 2 + self.head.len() + 2),
            body_field,
            pointed[0],
            pointed[1],
            pointed[2],
            pointed[3],
            to_i32(self.unknown.len()),
            to_i32(self.env_count),
            0,
        ];
        if let Some(magic) = fixed.get_mut(..4) {
            magic.copy_from_slice(&[
                b'L',
                b'S',
                PacketType::BeginRequest.as_u8(),
                FlagRule::HOST.flag_for(order),
            ]);
        }
        for (slot, field) in fixed
            .get_mut(4..)
            .unwrap_or_default()
            .chunks_exact_mut(4)
            .zip(fields)
        {
            slot.copy_from_slice(&field.to_ne_bytes());
        }
        if let Some(at) = dst.get_mut(start..start + REQ_HEADER_LEN) {
            at.copy_from_slice(&fixed);
        }
        Ok(())
    }
}

/// A known header met in the walk.
#[derive(Clone, Copy, Default)]
struct KnownAt {
    /// Its slot in the index.
    slot: usize,
    /// Its value's offset in the header lines.
    off: usize,
    /// Its value's length (capped at the index field's range).
    len: u16,
}

/// `X_CUSTOM_THING` → `X-Custom-Thing`, appended to `dst` (lsphp turns it back into the
/// same variable).
fn put_header_name(cgi: &[u8], dst: &mut Vec<u8>) {
    let mut word_start = true;
    // One extend over the mapped bytes: no capacity check per byte.
    dst.extend(cgi.iter().map(|&b| {
        if b == b'_' {
            word_start = true;
            b'-'
        } else if word_start {
            word_start = false;
            b.to_ascii_uppercase()
        } else {
            b.to_ascii_lowercase()
        }
    }));
}

/// Whether a part the request line is made of holds a byte that would end it early (CR,
/// LF, NUL).
fn line_breaks(p: &LineParts<'_>) -> bool {
    let target = match p.uri.filter(|u| !u.is_empty()) {
        Some(uri) => [Some(uri), None, None],
        None => [p.script, p.path_info, p.query],
    };
    [p.method, p.protocol]
        .into_iter()
        .chain(target)
        .flatten()
        .any(has_line_breaking_byte)
}

/// The request line's length (see [`put_request_line`]).
fn request_line_len(p: &LineParts<'_>) -> usize {
    let target = match p.uri.filter(|u| !u.is_empty()) {
        Some(uri) => uri.len(),
        None => {
            p.script.unwrap_or(b"/").len()
                + p.path_info.unwrap_or_default().len()
                + p.query.filter(|q| !q.is_empty()).map_or(0, |q| q.len() + 1)
        }
    };
    p.method.unwrap_or(b"GET").len() + 1 + target + 1 + p.protocol.unwrap_or(b"HTTP/1.1").len()
}

/// The synthesised head's request line, `METHOD target PROTOCOL`, the target being
/// REQUEST_URI or, without one, SCRIPT_NAME + PATH_INFO + `?QUERY_STRING`: lsphp never
/// parses it, but header offsets count from it. [`line_breaks`] checked its parts first.
fn put_request_line(p: &LineParts<'_>, dst: &mut BytesMut) {
    dst.put_slice(p.method.unwrap_or(b"GET"));
    dst.put_u8(b' ');
    match p.uri.filter(|u| !u.is_empty()) {
        Some(uri) => dst.put_slice(uri),
        None => {
            dst.put_slice(p.script.unwrap_or(b"/"));
            dst.put_slice(p.path_info.unwrap_or_default());
            if let Some(q) = p.query.filter(|q| !q.is_empty()) {
                dst.put_u8(b'?');
                dst.put_slice(q);
            }
        }
    }
    dst.put_u8(b' ');
    dst.put_slice(p.protocol.unwrap_or(b"HTTP/1.1"));
}

/// `n` in decimal, written at the end of `buf` (20 digits hold any u64).
fn decimal(mut n: u64, buf: &mut [u8; 20]) -> &[u8] {
    let mut at = buf.len();
    loop {
        at -= 1;
        if let Some(d) = buf.get_mut(at) {
            *d = b'0' + (n % 10) as u8;
        }
        n /= 10;
        if n == 0 || at == 0 {
            return buf.get(at..).unwrap_or_default();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{POINTED_ENV, POINTED_ROOM};

    #[test]
    fn pointed_room_holds_every_pointed_variable_added() {
        // Each added pair: 4 bytes of lengths, the name, two NULs; REQUEST_METHOD's `GET`.
        let need: usize = POINTED_ENV.iter().map(|n| 4 + n.len() + 2).sum::<usize>() + 3;
        assert!(need <= POINTED_ROOM, "{need} > {POINTED_ROOM}");
    }
}
