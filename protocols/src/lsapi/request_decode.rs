//! Backend role (server → backend, as corral's own launchers and null backend read it):
//! parsing BEGIN_REQUEST into a structured request, passing the raw body through, and
//! recognising ABORT_REQUEST.
//!
//! The checks are lsphp's (`readReq`, `parseRequest`, `parseEnv`, `validateHeaders`) plus a
//! few it skips: negative offsets and counts, the NUL after every env key and value, zero
//! padding, and the [`Limits`].

use std::ops::Range;

use bytes::{Buf, Bytes, BytesMut};

use super::headers::{
    HEADER_INDEX_LEN, H_CONTENT_LENGTH, INDEX_OFFSETS_AT, KNOWN_HEADERS, KNOWN_HEADER_COUNT,
    UNKNOWN_HEADER_ENTRY_LEN,
};
use super::packet::{
    ByteOrder, FlagRule, PacketHeader, PacketType, HEADER_LEN, MAX_HEADER_PACKET_LEN,
};
use super::request::{
    align8, parse_decimal, BODY_LEN_FROM_CONTENT_LENGTH, MAX_ENV_PAIRS, REQ_HEADER_LEN,
};
use super::request_view::{RequestView, ViewEvent};
use super::LsapiError;
use crate::Limits;

const REQ_FIELDS: [&str; 9] = [
    "m_httpHeaderLen",
    "m_reqBodyLen",
    "m_scriptFileOff",
    "m_scriptNameOff",
    "m_queryStringOff",
    "m_requestMethodOff",
    "m_cntUnknownHeaders",
    "m_cntEnv",
    "m_cntSpecialEnv",
];

/// A parsed BEGIN_REQUEST. Every `Bytes` shares the one packet buffer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BeginRequest {
    /// Byte order the server wrote the packet in.
    pub order: ByteOrder,
    /// Special env pairs (PHP ini overrides, suEXEC control), NULs stripped.
    pub special_env: Vec<(Bytes, Bytes)>,
    /// CGI env pairs, NULs stripped, in packet order.
    pub env: Vec<(Bytes, Bytes)>,
    /// The string `m_scriptFileOff` points at; `None` when the offset is 0 (OpenLiteSpeed's
    /// "no real path").
    pub script_filename: Option<Bytes>,
    /// The string `m_scriptNameOff` points at (`None` for offset 0).
    pub script_name: Option<Bytes>,
    /// The string `m_queryStringOff` points at (`None` for offset 0).
    pub query_string: Option<Bytes>,
    /// The string `m_requestMethodOff` points at (`None` for offset 0).
    pub request_method: Option<Bytes>,
    /// The raw HTTP request head (request line, header lines, empty line).
    pub head: Bytes,
    /// Request headers in their original order (by value offset, as lsphp's
    /// `getallheaders()` orders them): known ones under their canonical name, unknown ones
    /// under the name found in the head.
    pub headers: Vec<(Bytes, Bytes)>,
    /// Body length: the raw bytes after the packet (-2 resolved through Content-Length;
    /// other negative values mean no body, as in lsphp).
    pub body_len: u64,
}

/// One thing read from the server side of a connection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RequestEvent {
    /// A new request.
    Begin(Box<BeginRequest>),
    /// Raw body bytes of the current request (as many as were available, never more than
    /// remain).
    Body(Bytes),
    /// ABORT_REQUEST: the client went away.
    Abort,
}

/// Reads what a server sends a backend: BEGIN_REQUEST, the raw body, ABORT_REQUEST.
#[derive(Debug, Clone)]
pub struct RequestDecoder {
    limits: Limits,
    rule: FlagRule,
    body_left: u64,
}

impl RequestDecoder {
    /// A decoder reading flags under [`FlagRule::HOST`].
    pub fn new(limits: &Limits) -> RequestDecoder {
        RequestDecoder {
            limits: limits.clone(),
            rule: FlagRule::HOST,
            body_left: 0,
        }
    }

    /// Reads flags under `rule` instead.
    pub fn with_flag_rule(mut self, rule: FlagRule) -> RequestDecoder {
        self.rule = rule;
        self
    }

    /// Body bytes of the current request still to come.
    pub fn body_remaining(&self) -> u64 {
        self.body_left
    }

    /// Decodes the next event; `Ok(None)` means more bytes are needed.
    pub fn decode(&mut self, src: &mut BytesMut) -> Result<Option<RequestEvent>, LsapiError> {
        let mut layout = Layout::default();
        Ok(match self.step(src, &mut layout)? {
            None => None,
            Some(Step::Body(b)) => Some(RequestEvent::Body(b)),
            Some(Step::Abort) => Some(RequestEvent::Abort),
            Some(Step::Begin(len, order)) => {
                let packet = src.split_to(len).freeze();
                Some(RequestEvent::Begin(Box::new(
                    layout.into_request(&packet, order),
                )))
            }
        })
    }

    /// Decodes the next event as [`decode`](Self::decode) does (the same checks, the same
    /// errors), but a BEGIN_REQUEST lands in `view`: its packet is copied into the view's
    /// buffer and its parts are kept as offsets, so a view reused across requests allocates
    /// nothing once its buffers have grown to the largest request seen. On an error or
    /// `Ok(None)` the view's content is unspecified (not a request).
    pub fn decode_into(
        &mut self,
        src: &mut BytesMut,
        view: &mut RequestView,
    ) -> Result<Option<ViewEvent>, LsapiError> {
        Ok(match self.step(src, &mut view.layout)? {
            None => None,
            Some(Step::Body(b)) => Some(ViewEvent::Body(b)),
            Some(Step::Abort) => Some(ViewEvent::Abort),
            Some(Step::Begin(len, order)) => {
                view.packet.clear();
                view.packet
                    .extend_from_slice(src.get(..len).unwrap_or_default());
                view.order = order;
                src.advance(len);
                Some(ViewEvent::Begin)
            }
        })
    }

    /// The current request's next body bytes when some are owed and `src` holds any: what
    /// [`decode`](Self::decode) returns as [`RequestEvent::Body`] at that point, for a
    /// backend reading a body, where any other event would be an error. `None` when the
    /// body is complete (nothing is consumed) or `src` is empty.
    pub fn decode_body(&mut self, src: &mut BytesMut) -> Option<Bytes> {
        if self.body_left == 0 || src.is_empty() {
            return None;
        }
        let n = usize::try_from(self.body_left).map_or(src.len(), |left| left.min(src.len()));
        self.body_left -= n as u64;
        Some(src.split_to(n).freeze())
    }

    /// One step: body bytes, an abort, or a BEGIN_REQUEST parsed into `layout` and still
    /// at the front of `src` (its length and byte order returned).
    fn step(
        &mut self,
        src: &mut BytesMut,
        layout: &mut Layout,
    ) -> Result<Option<Step>, LsapiError> {
        if self.body_left > 0 {
            return Ok(self.decode_body(src).map(Step::Body));
        }
        let Some(h) = PacketHeader::parse(src, self.rule)? else {
            return Ok(None);
        };
        match h.kind {
            PacketType::AbortRequest => {
                if h.len != HEADER_LEN {
                    return Err(LsapiError::PayloadNotEmpty {
                        kind: h.kind,
                        len: h.len,
                    });
                }
                src.advance(HEADER_LEN);
                Ok(Some(Step::Abort))
            }
            PacketType::BeginRequest => {
                let max = self.limits.max_params_bytes.min(MAX_HEADER_PACKET_LEN);
                if h.len > max {
                    return Err(LsapiError::PacketTooLarge {
                        kind: h.kind,
                        len: h.len,
                        max,
                    });
                }
                if h.len < REQ_HEADER_LEN {
                    return Err(LsapiError::BeginRequestTooShort(h.len));
                }
                let Some(bytes) = src.get(..h.len) else {
                    src.reserve(h.len - src.len());
                    return Ok(None);
                };
                parse_layout(bytes, h.order, &self.limits, layout)?;
                self.body_left = layout.body_len;
                Ok(Some(Step::Begin(h.len, h.order)))
            }
            kind => Err(LsapiError::UnexpectedPacket {
                kind,
                direction: "server to backend",
            }),
        }
    }
}

/// What [`RequestDecoder::step`] found.
enum Step {
    Begin(usize, ByteOrder),
    Body(Bytes),
    Abort,
}

/// An env pair as key and value ranges inside the packet.
pub(super) type PairRange = (Range<usize>, Range<usize>);

/// Where everything is inside the packet; turned into `Bytes` once the packet is frozen, so
/// nothing is consumed when the packet is refused. Reused across requests by a
/// [`RequestView`] (every field is rewritten by each parse).
#[derive(Debug, Clone, Default)]
pub(super) struct Layout {
    pub(super) special_env: Vec<PairRange>,
    pub(super) env: Vec<PairRange>,
    pub(super) pointed: [Option<Range<usize>>; 4],
    pub(super) head: Range<usize>,
    /// (name: known index or range in packet, value range in packet), in header order.
    pub(super) headers: Vec<(HeaderName, Range<usize>)>,
    pub(super) body_len: u64,
}

#[derive(Debug, Clone)]
pub(super) enum HeaderName {
    /// Slot in the known-header index.
    Known(usize),
    Raw(Range<usize>),
}

impl Layout {
    pub(super) fn into_request(self, p: &Bytes, order: ByteOrder) -> BeginRequest {
        let pairs = |v: Vec<PairRange>| {
            v.into_iter()
                .map(|(k, v)| (p.slice(k), p.slice(v)))
                .collect::<Vec<_>>()
        };
        let [a, b, c, d] = self.pointed.map(|r| r.map(|r| p.slice(r)));
        BeginRequest {
            order,
            special_env: pairs(self.special_env),
            env: pairs(self.env),
            script_filename: a,
            script_name: b,
            query_string: c,
            request_method: d,
            head: p.slice(self.head),
            headers: self
                .headers
                .into_iter()
                .map(|(n, v)| {
                    let name = match n {
                        HeaderName::Known(i) => KNOWN_HEADERS
                            .get(i)
                            .map_or_else(Bytes::new, |s| Bytes::from_static(s.as_bytes())),
                        HeaderName::Raw(r) => p.slice(r),
                    };
                    (name, p.slice(v))
                })
                .collect(),
            body_len: self.body_len,
        }
    }
}

/// Parses the packet `p` into `out`, replacing all it held.
fn parse_layout(
    p: &[u8],
    order: ByteOrder,
    limits: &Limits,
    out: &mut Layout,
) -> Result<(), LsapiError> {
    let len = p.len();
    let mut f = [0i32; 9];
    for (i, slot) in f.iter_mut().enumerate() {
        *slot = order
            .read_i32(p, HEADER_LEN + 4 * i)
            .ok_or(LsapiError::BeginRequestTooShort(len))?;
    }
    let [head_len, body_raw, o0, o1, o2, o3, n_unknown, n_env, n_special] = f;
    let nonneg = |i: usize, v: i32| {
        usize::try_from(v).map_err(|_| LsapiError::NegativeField {
            field: REQ_FIELDS.get(i).copied().unwrap_or("field"),
            value: v,
        })
    };
    let head_len = nonneg(0, head_len)?;
    let n_unknown = nonneg(6, n_unknown)?;
    let n_env = nonneg(7, n_env)?;
    let n_special = nonneg(8, n_special)?;

    let max_pairs = limits.max_params_count;
    if n_env > MAX_ENV_PAIRS || n_special > MAX_ENV_PAIRS || n_env + n_special > max_pairs {
        return Err(LsapiError::TooManyPairs {
            what: "env pairs",
            count: n_env.saturating_add(n_special),
            max: max_pairs.min(MAX_ENV_PAIRS),
        });
    }
    if n_unknown > max_pairs {
        return Err(LsapiError::TooManyPairs {
            what: "unknown headers",
            count: n_unknown,
            max: max_pairs,
        });
    }

    let mut pos = REQ_HEADER_LEN;
    parse_env_list(
        p,
        &mut pos,
        n_special,
        "special env",
        limits,
        &mut out.special_env,
    )?;
    parse_env_list(p, &mut pos, n_env, "env", limits, &mut out.env)?;
    let index_at = align8(pos);
    // Saturating: counts and lengths come from the peer (each ≤ i32::MAX), and a sum that
    // does not fit cannot equal the packet length anyway.
    let head_at = (index_at + HEADER_INDEX_LEN)
        .saturating_add(n_unknown.saturating_mul(UNKNOWN_HEADER_ENTRY_LEN));
    let end = head_at.saturating_add(head_len);
    if end != len {
        return Err(LsapiError::RequestSizeMismatch {
            declared: len,
            actual: end,
        });
    }
    if p.get(pos..index_at)
        .is_some_and(|pad| pad.iter().any(|&b| b != 0))
    {
        return Err(LsapiError::NonZeroPadding);
    }

    for ((slot, off), field) in out.pointed.iter_mut().zip([o0, o1, o2, o3]).zip(2..) {
        *slot = c_string_at(p, off).map_err(|()| LsapiError::BadStringOffset {
            field: REQ_FIELDS.get(field).copied().unwrap_or("offset"),
            offset: off,
            len,
        })?;
    }

    out.head = head_at..end;
    let headers = &mut out.headers;
    headers.clear();
    let bad_known = |index, offset, vlen| LsapiError::KnownHeaderOutOfRange {
        index,
        offset,
        len: vlen,
        block: head_len,
    };
    // The index lies inside the packet (the size check above); read as one slice, its
    // lengths and offsets pair up without a bounds check per field.
    let index = p
        .get(index_at..index_at + HEADER_INDEX_LEN)
        .unwrap_or_default();
    let lens = index.get(..2 * KNOWN_HEADER_COUNT).unwrap_or_default();
    let offs = index.get(INDEX_OFFSETS_AT..).unwrap_or_default();
    for (i, (l, o)) in lens.chunks_exact(2).zip(offs.chunks_exact(4)).enumerate() {
        // Most of the table is absent headers: offset 0 in either byte order.
        if o == [0, 0, 0, 0] {
            continue;
        }
        let off = order.read_i32(o, 0).unwrap_or(0);
        let vlen = order.read_u16(l, 0).unwrap_or(0);
        let start = usize::try_from(off).map_err(|_| bad_known(i, off, vlen))?;
        let stop = start.saturating_add(usize::from(vlen));
        if stop > head_len {
            return Err(bad_known(i, off, vlen));
        }
        check_header_lens(0, usize::from(vlen), limits)?;
        headers.push((HeaderName::Known(i), head_at + start..head_at + stop));
    }
    for i in 0..n_unknown {
        let at = index_at + HEADER_INDEX_LEN + i * UNKNOWN_HEADER_ENTRY_LEN;
        let field = |k: usize| {
            order
                .read_i32(p, at + 4 * k)
                .and_then(|v| usize::try_from(v).ok())
        };
        let bad = LsapiError::UnknownHeaderOutOfRange {
            index: i,
            block: head_len,
        };
        let (Some(no), Some(nl), Some(vo), Some(vl)) = (field(0), field(1), field(2), field(3))
        else {
            return Err(bad);
        };
        if no.saturating_add(nl) > head_len || vo.saturating_add(vl) > head_len {
            return Err(bad);
        }
        check_header_lens(nl, vl, limits)?;
        headers.push((
            HeaderName::Raw(head_at + no..head_at + no + nl),
            head_at + vo..head_at + vo + vl,
        ));
    }
    headers.sort_by_key(|(_, v)| v.start);

    let body_len = match u64::try_from(body_raw) {
        Ok(n) => n,
        Err(_) if body_raw == BODY_LEN_FROM_CONTENT_LENGTH => headers
            .iter()
            .find(|(n, _)| matches!(n, HeaderName::Known(H_CONTENT_LENGTH)))
            .and_then(|(_, v)| p.get(v.clone()))
            .and_then(parse_decimal)
            .ok_or(LsapiError::MissingContentLength)?,
        // lsphp reads no body for any other length ≤ 0.
        Err(_) => 0,
    };

    out.body_len = body_len;
    Ok(())
}

/// Parses one env list (`count` pairs and the four-zero-byte terminator) starting at `*pos`,
/// into `out` (emptied first).
///
/// Each pair is checked with one slice of exactly its length (lengths, key, NUL, value,
/// NUL): every other read is inside it, so the refusals (truncated, zero length, missing
/// NUL, over a limit, in that order) cost a compare each rather than a bounds check per
/// field.
fn parse_env_list(
    p: &[u8],
    pos: &mut usize,
    count: usize,
    list: &'static str,
    limits: &Limits,
    out: &mut Vec<PairRange>,
) -> Result<(), LsapiError> {
    let truncated = LsapiError::EnvListTruncated { list };
    out.clear();
    out.reserve(count.min(64));
    let mut at = *pos;
    for _ in 0..count {
        let Some(&[k1, k0, v1, v0]) = p.get(at..).and_then(|r| r.first_chunk::<4>()) else {
            return Err(truncated);
        };
        // Lengths are big-endian in every packet, whatever its byte order, and count the NUL.
        let k = usize::from(u16::from_be_bytes([k1, k0]));
        let v = usize::from(u16::from_be_bytes([v1, v0]));
        if k == 0 || v == 0 {
            return Err(LsapiError::EnvLengthZero { list });
        }
        let key_at = at + 4;
        let end = key_at + k + v;
        let Some(pair) = p.get(key_at..end) else {
            return Err(truncated);
        };
        if pair.get(k - 1) != Some(&0) || pair.last() != Some(&0) {
            return Err(LsapiError::EnvNotNulTerminated { list });
        }
        if k - 1 > limits.max_name_len {
            return Err(LsapiError::NameTooLong {
                what: list,
                len: k - 1,
                max: limits.max_name_len,
            });
        }
        if v - 1 > limits.max_value_len {
            return Err(LsapiError::ValueTooLong {
                what: list,
                len: v - 1,
                max: limits.max_value_len,
            });
        }
        out.push((key_at..key_at + k - 1, key_at + k..end - 1));
        at = end;
    }
    match p.get(at..at + 4) {
        None => Err(truncated),
        Some(t) if t != [0, 0, 0, 0] => Err(LsapiError::EnvListNotTerminated { list }),
        Some(_) => {
            *pos = at + 4;
            Ok(())
        }
    }
}

/// The NUL-terminated string at `off` (without its NUL); `Ok(None)` for offset 0.
fn c_string_at(p: &[u8], off: i32) -> Result<Option<Range<usize>>, ()> {
    if off == 0 {
        return Ok(None);
    }
    let start = usize::try_from(off).map_err(|_| ())?;
    let rest = p.get(start..).ok_or(())?;
    let nul = find_nul(rest).ok_or(())?;
    Ok(Some(start..start + nul))
}

/// Where the first zero byte of `s` is, looked for eight bytes at a time (the strings the
/// offsets point at are paths and URIs of tens of bytes).
fn find_nul(s: &[u8]) -> Option<usize> {
    const ONES: u64 = 0x0101_0101_0101_0101;
    const HIGHS: u64 = 0x8080_8080_8080_8080;
    let mut words = s.chunks_exact(8);
    let mut at = 0;
    for word in &mut words {
        let Ok(bytes) = <[u8; 8]>::try_from(word) else {
            break;
        };
        let w = u64::from_le_bytes(bytes);
        // A byte's high bit is set here when it is zero, or sits above a zero byte (the
        // borrow runs upwards): the lowest one set marks the first zero byte exactly.
        let zero = w.wrapping_sub(ONES) & !w & HIGHS;
        if zero != 0 {
            return Some(at + (zero.trailing_zeros() / 8) as usize);
        }
        at += 8;
    }
    let tail = words.remainder();
    tail.iter().position(|&b| b == 0).map(|i| at + i)
}

fn check_header_lens(name: usize, value: usize, limits: &Limits) -> Result<(), LsapiError> {
    if name > limits.max_name_len {
        return Err(LsapiError::NameTooLong {
            what: "request header",
            len: name,
            max: limits.max_name_len,
        });
    }
    if value > limits.max_value_len {
        return Err(LsapiError::ValueTooLong {
            what: "request header",
            len: value,
            max: limits.max_value_len,
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::find_nul;

    #[test]
    fn find_nul_finds_the_first_zero_byte_wherever_it_is() {
        // Every position in strings around the word size, with the bytes a borrow could
        // confuse (0x01, 0x80, 0xff) before and after the zero.
        for len in 0..40 {
            for fill in [b'a', 0x01, 0x80, 0xff] {
                let mut s = vec![fill; len];
                assert_eq!(find_nul(&s), None, "len {len} fill {fill:#x}");
                for at in 0..len {
                    s.fill(fill);
                    s[at] = 0;
                    if at + 1 < len {
                        s[at + 1] = 0;
                    }
                    assert_eq!(find_nul(&s), Some(at), "len {len} fill {fill:#x}");
                }
            }
        }
    }
}
