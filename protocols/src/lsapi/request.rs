//! Client role (corral → backend): building the BEGIN_REQUEST packet that carries a whole
//! request except its body, and the ABORT_REQUEST packet.
//!
//! Packet layout, in order: the 44-byte request header (packet header + nine int32), the
//! special env list and the env list (each pair `u16 BE keyLen+1, u16 BE valLen+1, key NUL,
//! value NUL`, each list ended by four zero bytes), zero padding to an 8-byte boundary, the
//! 152-byte known-header index, one 16-byte entry per unknown header, then the raw HTTP
//! request head. lsphp refuses a packet over 65535 bytes. The body follows the packet raw,
//! exactly `body_len` bytes, with no framing: the caller writes it itself.

use bytes::{BufMut, BytesMut};

use super::headers::{
    known_header_index, HEADER_INDEX_LEN, H_CONTENT_LENGTH, H_TRANSFER_ENCODING, KNOWN_HEADERS,
    KNOWN_HEADER_COUNT, UNKNOWN_HEADER_ENTRY_LEN,
};
use super::packet::{
    put_header, ByteOrder, FlagRule, PacketType, HEADER_LEN, MAX_HEADER_PACKET_LEN,
};
use super::LsapiError;
use crate::Limits;

/// Bytes in `struct lsapi_req_header`: the packet header and nine int32 fields.
pub const REQ_HEADER_LEN: usize = 44;
/// Most pairs one env list may hold (lsphp's `allocateEnvList`).
pub const MAX_ENV_PAIRS: usize = 8192;
/// `m_reqBodyLen` value meaning "2 GiB or more: take the length from Content-Length".
pub const BODY_LEN_FROM_CONTENT_LENGTH: i32 = -2;
/// The env variables whose values the request header points at, in field order
/// (`m_scriptFileOff`, `m_scriptNameOff`, `m_queryStringOff`, `m_requestMethodOff`).
pub const POINTED_ENV: [&str; 4] = [
    "SCRIPT_FILENAME",
    "SCRIPT_NAME",
    "QUERY_STRING",
    "REQUEST_METHOD",
];

/// Bytes one env pair takes on the wire.
fn pair_len(name: &[u8], value: &[u8]) -> usize {
    4 + name.len() + 1 + value.len() + 1
}

/// Rounds `n` up to a multiple of 8 (the padding rule before the header index).
pub(crate) fn align8(n: usize) -> usize {
    n.saturating_add(7) & !7
}

/// Builds one BEGIN_REQUEST. Push the special env, the CGI env and the request headers in
/// any order (each list keeps its own order), set the body length, then [`encode`].
///
/// Every push is checked against the [`Limits`] and against the 65535-byte packet limit
/// before anything is appended, so a failed push leaves the builder as it was; a caller that
/// gets [`LsapiError::RequestTooLarge`] should answer 431 itself.
///
/// Known headers (the 25 of [`KNOWN_HEADERS`]) go to the index, any other to the
/// unknown-header table; all appear, in push order, in the synthesised raw head
/// (`request line CRLF`, `Name: value CRLF`…, `CRLF`). A known header may be given once
/// (combine repeats first); Transfer-Encoding is refused, because the body is sent raw with
/// its length in the packet (send Content-Length instead).
///
/// [`encode`]: RequestBuilder::encode
#[derive(Debug, Clone)]
pub struct RequestBuilder {
    limits: Limits,
    order: ByteOrder,
    rule: FlagRule,
    special: BytesMut,
    special_count: usize,
    env: BytesMut,
    env_count: usize,
    /// Offset of each [`POINTED_ENV`] value inside `env` (last occurrence wins).
    pointed: [Option<usize>; 4],
    /// The raw head so far, without the final empty line.
    head: BytesMut,
    index_len: [u16; KNOWN_HEADER_COUNT],
    index_off: [i32; KNOWN_HEADER_COUNT],
    /// Known headers given (entries of `index_off` that are set).
    known_count: usize,
    unknown: Vec<[i32; 4]>,
    body_len: u64,
}

impl RequestBuilder {
    /// Starts a request whose raw head begins with `request_line` (`GET /x.php?a=1
    /// HTTP/1.1`, no CRLF). lsphp never reads the line, but header offsets count from it.
    /// Integers are written in native order under [`FlagRule::HOST`], as LiteSpeed does.
    pub fn new(limits: &Limits, request_line: &[u8]) -> Result<RequestBuilder, LsapiError> {
        if request_line.is_empty() || has_line_breaking_byte(request_line) {
            return Err(LsapiError::InvalidHeaderBytes {
                what: "request line",
            });
        }
        let mut head = BytesMut::with_capacity(request_line.len() + 512);
        head.put_slice(request_line);
        head.put_slice(b"\r\n");
        let builder = RequestBuilder {
            limits: limits.clone(),
            order: ByteOrder::NATIVE,
            rule: FlagRule::HOST,
            special: BytesMut::new(),
            special_count: 0,
            env: BytesMut::with_capacity(1024),
            env_count: 0,
            pointed: [None; 4],
            head,
            index_len: [0; KNOWN_HEADER_COUNT],
            index_off: [0; KNOWN_HEADER_COUNT],
            known_count: 0,
            unknown: Vec::new(),
            body_len: 0,
        };
        builder.check_size(0, 0, 0, 0)?;
        Ok(builder)
    }

    /// Empties the builder for another request whose raw head begins with `request_line`,
    /// as [`new`](RequestBuilder::new) would make it, but keeping the buffers it has grown:
    /// a gateway that builds one packet after another on a thread allocates for the first
    /// only. On an error the builder is left empty and may be restarted again.
    pub fn restart(&mut self, limits: &Limits, request_line: &[u8]) -> Result<(), LsapiError> {
        self.limits.clone_from(limits);
        self.order = ByteOrder::NATIVE;
        self.rule = FlagRule::HOST;
        self.special.clear();
        self.special_count = 0;
        self.env.clear();
        self.env_count = 0;
        self.pointed = [None; 4];
        self.head.clear();
        self.index_len = [0; KNOWN_HEADER_COUNT];
        self.index_off = [0; KNOWN_HEADER_COUNT];
        self.known_count = 0;
        self.unknown.clear();
        self.body_len = 0;
        if request_line.is_empty() || has_line_breaking_byte(request_line) {
            return Err(LsapiError::InvalidHeaderBytes {
                what: "request line",
            });
        }
        self.head.put_slice(request_line);
        self.head.put_slice(b"\r\n");
        self.check_size(0, 0, 0, 0)
    }

    /// Writes the packet's integers in `order` and announces it with the flag `rule` gives.
    pub fn with_byte_order(mut self, order: ByteOrder, rule: FlagRule) -> RequestBuilder {
        self.order = order;
        self.rule = rule;
        self
    }

    /// Appends a special env pair (`"\x01\x04name"` = admin PHP ini value, `"\x01\x01name"`
    /// = per-dir ini value; see protocols/LSAPI.md §2).
    pub fn special_env(&mut self, name: &[u8], value: &[u8]) -> Result<(), LsapiError> {
        self.check_pair("special env", self.special_count, name, value)?;
        self.check_size(pair_len(name, value), 0, 0, 0)?;
        put_pair(&mut self.special, name, value);
        self.special_count += 1;
        Ok(())
    }

    /// Appends a CGI env pair (`SCRIPT_FILENAME`, `QUERY_STRING`, …). The request header
    /// points at the values of the four [`POINTED_ENV`] names, which must all be given.
    pub fn env(&mut self, name: &[u8], value: &[u8]) -> Result<(), LsapiError> {
        self.check_pair("env", self.env_count, name, value)?;
        self.check_size(0, pair_len(name, value), 0, 0)?;
        if let Some(i) = POINTED_ENV.iter().position(|p| p.as_bytes() == name) {
            if let Some(slot) = self.pointed.get_mut(i) {
                *slot = Some(self.env.len() + 4 + name.len() + 1);
            }
        }
        put_pair(&mut self.env, name, value);
        self.env_count += 1;
        Ok(())
    }

    /// The [`POINTED_ENV`] names not given yet (each must be before [`encode`]).
    ///
    /// [`encode`]: RequestBuilder::encode
    pub fn missing_pointed(&self) -> impl Iterator<Item = &'static str> {
        let pointed = self.pointed;
        POINTED_ENV
            .into_iter()
            .zip(pointed)
            .filter_map(|(name, at)| at.is_none().then_some(name))
    }

    /// Appends an HTTP request header.
    pub fn header(&mut self, name: &[u8], value: &[u8]) -> Result<(), LsapiError> {
        if name.is_empty() || name.contains(&b':') || has_line_breaking_byte(name) {
            return Err(LsapiError::InvalidHeaderBytes {
                what: "header name",
            });
        }
        if has_line_breaking_byte(value) {
            return Err(LsapiError::InvalidHeaderBytes {
                what: "header value",
            });
        }
        check_len("request header", name, value, &self.limits)?;
        let headers = self.unknown.len() + self.known_count;
        if headers >= self.limits.max_params_count {
            return Err(LsapiError::TooManyPairs {
                what: "headers",
                count: headers + 1,
                max: self.limits.max_params_count,
            });
        }
        let known = known_header_index(name);
        if known == Some(H_TRANSFER_ENCODING) {
            return Err(LsapiError::TransferEncodingHeader);
        }
        let line_len = name.len() + 2 + value.len() + 2;
        let entry = if known.is_some() { 0 } else { 1 };
        self.check_size(0, 0, entry, line_len)?;
        // All offsets below are < 65535 thanks to the size check, so they fit an i32.
        let name_off = to_i32(self.head.len());
        let value_off = to_i32(self.head.len() + name.len() + 2);
        let value_len = to_i32(value.len());
        let slot = known.and_then(|i| {
            let len = self.index_len.get_mut(i)?;
            let off = self.index_off.get_mut(i)?;
            Some((i, len, off))
        });
        match slot {
            Some((i, len, off)) => {
                if *off != 0 {
                    let name = KNOWN_HEADERS.get(i).copied().unwrap_or("known header");
                    return Err(LsapiError::RepeatedKnownHeader(name));
                }
                *off = value_off;
                *len = u16::try_from(value.len()).unwrap_or(u16::MAX);
                self.known_count += 1;
            }
            None => self
                .unknown
                .push([name_off, to_i32(name.len()), value_off, value_len]),
        }
        self.head.put_slice(name);
        self.head.put_slice(b": ");
        self.head.put_slice(value);
        self.head.put_slice(b"\r\n");
        Ok(())
    }

    /// Sets the body length (0 by default). Lengths of 2 GiB and more are sent as -2, which
    /// makes lsphp read the Content-Length header, so that header must then carry it.
    pub fn body_len(&mut self, len: u64) {
        self.body_len = len;
    }

    /// The size the packet has now.
    pub fn packet_len(&self) -> usize {
        self.size_with(0, 0, 0, 0)
    }

    /// Appends the whole BEGIN_REQUEST packet to `dst`. The body goes after it, raw.
    pub fn encode(&self, dst: &mut BytesMut) -> Result<(), LsapiError> {
        let mut pointed = [0i32; 4];
        let env_start = REQ_HEADER_LEN + self.special.len() + 4;
        for ((slot, at), name) in pointed.iter_mut().zip(self.pointed).zip(POINTED_ENV) {
            let at = at.ok_or(LsapiError::MissingEnv(name))?;
            *slot = to_i32(env_start + at);
        }
        let body_field = self.body_field()?;
        let total = self.packet_len();
        self.check_size(0, 0, 0, 0)?;
        let o = self.order;
        dst.reserve(total);
        put_header(PacketType::BeginRequest, o, self.rule, total, dst);
        o.put_i32(to_i32(self.head.len() + 2), dst);
        o.put_i32(body_field, dst);
        for off in pointed {
            o.put_i32(off, dst);
        }
        o.put_i32(to_i32(self.unknown.len()), dst);
        o.put_i32(to_i32(self.env_count), dst);
        o.put_i32(to_i32(self.special_count), dst);
        dst.put_slice(&self.special);
        dst.put_bytes(0, 4);
        dst.put_slice(&self.env);
        dst.put_bytes(0, 4);
        let lists_end = env_start + self.env.len() + 4;
        dst.put_bytes(0, align8(lists_end) - lists_end);
        for len in self.index_len {
            o.put_u16(len, dst);
        }
        dst.put_bytes(0, 2);
        for off in self.index_off {
            o.put_i32(off, dst);
        }
        for entry in &self.unknown {
            for field in entry {
                o.put_i32(*field, dst);
            }
        }
        dst.put_slice(&self.head);
        dst.put_slice(b"\r\n");
        Ok(())
    }

    /// `m_reqBodyLen`: the length, or -2 backed by a matching Content-Length header.
    fn body_field(&self) -> Result<i32, LsapiError> {
        if let Ok(len) = i32::try_from(self.body_len) {
            return Ok(len);
        }
        let declared = self.known_value(H_CONTENT_LENGTH).and_then(parse_decimal);
        if declared == Some(self.body_len) {
            Ok(BODY_LEN_FROM_CONTENT_LENGTH)
        } else {
            Err(LsapiError::LargeBodyWithoutContentLength(self.body_len))
        }
    }

    fn known_value(&self, i: usize) -> Option<&[u8]> {
        let off = usize::try_from(*self.index_off.get(i)?)
            .ok()
            .filter(|&o| o != 0)?;
        let len = usize::from(*self.index_len.get(i)?);
        self.head.get(off..off + len)
    }

    fn check_pair(
        &self,
        what: &'static str,
        count: usize,
        name: &[u8],
        value: &[u8],
    ) -> Result<(), LsapiError> {
        check_len(what, name, value, &self.limits)?;
        let max = self.limits.max_params_count.min(MAX_ENV_PAIRS);
        let pairs = self.special_count + self.env_count;
        if count >= MAX_ENV_PAIRS || pairs >= self.limits.max_params_count {
            return Err(LsapiError::TooManyPairs {
                what: "env pairs",
                count: pairs + 1,
                max,
            });
        }
        Ok(())
    }

    fn size_with(&self, special: usize, env: usize, entries: usize, head: usize) -> usize {
        let lists = REQ_HEADER_LEN + self.special.len() + special + 4 + self.env.len() + env + 4;
        align8(lists)
            + HEADER_INDEX_LEN
            + (self.unknown.len() + entries) * UNKNOWN_HEADER_ENTRY_LEN
            + self.head.len()
            + head
            + 2
    }

    fn check_size(
        &self,
        special: usize,
        env: usize,
        entries: usize,
        head: usize,
    ) -> Result<(), LsapiError> {
        let len = self.size_with(special, env, entries, head);
        let max = self.limits.max_params_bytes.min(MAX_HEADER_PACKET_LEN);
        if len > max {
            return Err(LsapiError::RequestTooLarge { len, max });
        }
        Ok(())
    }
}

/// Appends the 8-byte ABORT_REQUEST packet (OpenLiteSpeed sends it before closing the
/// connection when the client goes away; lsphp ignores it, so the close is what stops the
/// script, and the connection must not be reused).
pub fn encode_abort(order: ByteOrder, rule: FlagRule, dst: &mut BytesMut) {
    put_header(PacketType::AbortRequest, order, rule, HEADER_LEN, dst);
}

fn put_pair(dst: &mut BytesMut, name: &[u8], value: &[u8]) {
    // Room for the whole pair is made once.
    dst.reserve(pair_len(name, value));
    write_pair(dst, name, value);
}

/// Appends one env pair (the two big-endian lengths as one slice, then the name and the
/// value, each NUL-terminated) and returns where in `dst` its value starts. Both lengths are
/// below 65535: the caller's size check refuses a packet that could hold a longer one.
#[inline]
pub(super) fn write_pair(dst: &mut BytesMut, name: &[u8], value: &[u8]) -> usize {
    let [n1, n0] = u16::try_from(name.len() + 1)
        .unwrap_or(u16::MAX)
        .to_be_bytes();
    let [v1, v0] = u16::try_from(value.len() + 1)
        .unwrap_or(u16::MAX)
        .to_be_bytes();
    dst.extend_from_slice(&[n1, n0, v1, v0]);
    dst.extend_from_slice(name);
    dst.put_u8(0);
    let at = dst.len();
    dst.extend_from_slice(value);
    dst.put_u8(0);
    at
}

#[inline]
pub(super) fn check_len(
    what: &'static str,
    name: &[u8],
    value: &[u8],
    limits: &Limits,
) -> Result<(), LsapiError> {
    if name.len() > limits.max_name_len {
        return Err(LsapiError::NameTooLong {
            what,
            len: name.len(),
            max: limits.max_name_len,
        });
    }
    if value.len() > limits.max_value_len {
        return Err(LsapiError::ValueTooLong {
            what,
            len: value.len(),
            max: limits.max_value_len,
        });
    }
    Ok(())
}

#[inline]
pub(super) fn has_line_breaking_byte(s: &[u8]) -> bool {
    s.iter().any(|&b| matches!(b, b'\r' | b'\n' | 0))
}

/// Converts a size already bounded by the 65535-byte packet limit.
#[inline]
pub(super) fn to_i32(n: usize) -> i32 {
    i32::try_from(n).unwrap_or(i32::MAX)
}

/// A Content-Length value: optional surrounding spaces/tabs around ASCII digits.
pub(crate) fn parse_decimal(v: &[u8]) -> Option<u64> {
    let v = v.trim_ascii();
    if v.is_empty() {
        return None;
    }
    v.iter().try_fold(0u64, |acc, &b| {
        let d = b.checked_sub(b'0').filter(|d| *d < 10)?;
        acc.checked_mul(10)?.checked_add(u64::from(d))
    })
}
