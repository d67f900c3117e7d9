//! LSAPI framing: the 8-byte packet header that starts every packet in both directions, the
//! packet types, and the byte-order flag that says how its integers are written.
//!
//! Layout (`struct lsapi_packet_header`): `'L' 'S'`, type, flag (bit 0: 0 = little-endian,
//! 1 = big-endian; other bits unused and ignored, as lsphp and OpenLiteSpeed do), then the
//! total packet length, header included, as an int32 in the order the flag names.

use std::fmt;

use bytes::{BufMut, BytesMut};

use super::LsapiError;

/// Bytes in a packet header.
pub const HEADER_LEN: usize = 8;
/// `LSAPI_MAX_HEADER_LEN`: the largest BEGIN_REQUEST packet (header included) lsphp reads,
/// and the largest RESP_HEADER payload OpenLiteSpeed accepts.
pub const MAX_HEADER_PACKET_LEN: usize = 65535;
/// `LSAPI_MAX_DATA_PACKET_LEN`: the largest payload of RESP_STREAM, STDERR_STREAM and
/// REQ_RECEIVED packets.
pub const MAX_DATA_LEN: usize = 16384;
/// The two magic bytes (`LSAPI_VERSION_B0`, `LSAPI_VERSION_B1`).
pub const MAGIC: [u8; 2] = *b"LS";

/// The byte order of a packet's multi-byte integers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ByteOrder {
    /// Least significant byte first (`LSAPI_ENDIAN_LITTLE`, flag 0).
    Little,
    /// Most significant byte first (`LSAPI_ENDIAN_BIG`, flag 1).
    Big,
}

impl ByteOrder {
    /// The byte order of the CPU this code runs on.
    pub const NATIVE: ByteOrder = if cfg!(target_endian = "big") {
        ByteOrder::Big
    } else {
        ByteOrder::Little
    };

    pub(crate) fn i32_from(self, b: [u8; 4]) -> i32 {
        match self {
            ByteOrder::Little => i32::from_le_bytes(b),
            ByteOrder::Big => i32::from_be_bytes(b),
        }
    }

    pub(crate) fn u16_from(self, b: [u8; 2]) -> u16 {
        match self {
            ByteOrder::Little => u16::from_le_bytes(b),
            ByteOrder::Big => u16::from_be_bytes(b),
        }
    }

    pub(crate) fn put_i32(self, v: i32, dst: &mut BytesMut) {
        match self {
            ByteOrder::Little => dst.put_i32_le(v),
            ByteOrder::Big => dst.put_i32(v),
        }
    }

    pub(crate) fn put_u16(self, v: u16, dst: &mut BytesMut) {
        match self {
            ByteOrder::Little => dst.put_u16_le(v),
            ByteOrder::Big => dst.put_u16(v),
        }
    }

    /// Reads the int32 at `at` in `buf`, or `None` when it runs past the end.
    pub(crate) fn read_i32(self, buf: &[u8], at: usize) -> Option<i32> {
        let b = buf.get(at..at.checked_add(4)?)?;
        Some(self.i32_from(b.try_into().ok()?))
    }

    /// Reads the uint16 at `at` in `buf`, or `None` when it runs past the end.
    pub(crate) fn read_u16(self, buf: &[u8], at: usize) -> Option<u16> {
        let b = buf.get(at..at.checked_add(2)?)?;
        Some(self.u16_from(b.try_into().ok()?))
    }
}

/// How the flag bit maps to a byte order.
///
/// lsapidef.h says flag 0 is little-endian and flag 1 big-endian, and that is what
/// [`FlagRule::Literal`] reads. But LiteSpeed's library picks the flag it writes (and the
/// order it expects) at compile time: LITTLE on x86/x86-64, BIG on every other CPU, while it
/// always writes native bytes. An lsphp built for little-endian aarch64 therefore labels its
/// little-endian integers as big-endian, and swaps exactly when the flag is 0.
/// [`FlagRule::HOST`] reproduces what a LiteSpeed peer built for this machine expects.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum FlagRule {
    /// Flag 0 = little-endian, 1 = big-endian (the header file; every x86 and big-endian
    /// build of LiteSpeed's library).
    #[default]
    Literal,
    /// Flag 1 = little-endian, 0 = big-endian (LiteSpeed's library built for a
    /// little-endian CPU other than x86).
    Inverted,
}

impl FlagRule {
    /// The rule a LiteSpeed library built for this machine follows.
    pub const HOST: FlagRule =
        if cfg!(any(target_arch = "x86", target_arch = "x86_64")) || cfg!(target_endian = "big") {
            FlagRule::Literal
        } else {
            FlagRule::Inverted
        };

    /// The byte order a packet with this flag byte is written in.
    pub fn order_of(self, flag: u8) -> ByteOrder {
        match (self, flag & 1 == 1) {
            (FlagRule::Literal, false) | (FlagRule::Inverted, true) => ByteOrder::Little,
            (FlagRule::Literal, true) | (FlagRule::Inverted, false) => ByteOrder::Big,
        }
    }

    /// The flag byte that announces `order`.
    pub fn flag_for(self, order: ByteOrder) -> u8 {
        match (self, order) {
            (FlagRule::Literal, ByteOrder::Little) | (FlagRule::Inverted, ByteOrder::Big) => 0,
            (FlagRule::Literal, ByteOrder::Big) | (FlagRule::Inverted, ByteOrder::Little) => 1,
        }
    }
}

/// The nine LSAPI packet types.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PacketType {
    /// 1, server to backend: the request (env, headers); the body follows raw.
    BeginRequest,
    /// 2, server to backend: the client went away (lsphp never reads it).
    AbortRequest,
    /// 3, backend to server: status and header lines, once per response.
    RespHeader,
    /// 4, backend to server: response body bytes.
    RespStream,
    /// 5, backend to server: the response is complete; the connection stays usable.
    RespEnd,
    /// 6, backend to server: log text, or the 8-byte `"\0PID"` + pid form.
    StderrStream,
    /// 7, backend to server: the BEGIN_REQUEST was read and parsed.
    ReqReceived,
    /// 8, backend to server: the backend will close the connection.
    ConnClose,
    /// 9, backend to server: defined, never sent by LiteSpeed's library.
    InternalError,
}

impl PacketType {
    /// The type for a wire byte, or `None` for bytes outside 1..=9.
    pub fn from_u8(b: u8) -> Option<PacketType> {
        Some(match b {
            1 => PacketType::BeginRequest,
            2 => PacketType::AbortRequest,
            3 => PacketType::RespHeader,
            4 => PacketType::RespStream,
            5 => PacketType::RespEnd,
            6 => PacketType::StderrStream,
            7 => PacketType::ReqReceived,
            8 => PacketType::ConnClose,
            9 => PacketType::InternalError,
            _ => return None,
        })
    }

    /// The wire byte.
    pub fn as_u8(self) -> u8 {
        match self {
            PacketType::BeginRequest => 1,
            PacketType::AbortRequest => 2,
            PacketType::RespHeader => 3,
            PacketType::RespStream => 4,
            PacketType::RespEnd => 5,
            PacketType::StderrStream => 6,
            PacketType::ReqReceived => 7,
            PacketType::ConnClose => 8,
            PacketType::InternalError => 9,
        }
    }
}

impl fmt::Display for PacketType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            PacketType::BeginRequest => "BEGIN_REQUEST",
            PacketType::AbortRequest => "ABORT_REQUEST",
            PacketType::RespHeader => "RESP_HEADER",
            PacketType::RespStream => "RESP_STREAM",
            PacketType::RespEnd => "RESP_END",
            PacketType::StderrStream => "STDERR_STREAM",
            PacketType::ReqReceived => "REQ_RECEIVED",
            PacketType::ConnClose => "CONN_CLOSE",
            PacketType::InternalError => "INTERNAL_ERROR",
        })
    }
}

/// A decoded packet header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PacketHeader {
    /// The packet type.
    pub kind: PacketType,
    /// The byte order of every multi-byte integer in this packet (except env lengths, which
    /// are always big-endian).
    pub order: ByteOrder,
    /// Total packet length, these 8 bytes included (so at least 8).
    pub len: usize,
}

impl PacketHeader {
    /// Reads the header at the start of `src` without consuming anything: `Ok(None)` when
    /// fewer than 8 bytes are there. Checks the magic, the type and that the length covers
    /// the header itself; per-type bounds are the caller's.
    pub fn parse(src: &[u8], rule: FlagRule) -> Result<Option<PacketHeader>, LsapiError> {
        let Some(head) = src.get(..HEADER_LEN) else {
            return Ok(None);
        };
        let (b0, b1, ty, flag) = match *head {
            [b0, b1, ty, flag, ..] => (b0, b1, ty, flag),
            _ => return Ok(None),
        };
        if [b0, b1] != MAGIC {
            return Err(LsapiError::BadMagic(b0, b1));
        }
        let kind = PacketType::from_u8(ty).ok_or(LsapiError::UnknownPacketType(ty))?;
        let order = rule.order_of(flag);
        let raw = order
            .read_i32(head, 4)
            .ok_or(LsapiError::PacketLengthTooSmall(0))?;
        let len = usize::try_from(raw)
            .ok()
            .filter(|&l| l >= HEADER_LEN)
            .ok_or(LsapiError::PacketLengthTooSmall(i64::from(raw)))?;
        Ok(Some(PacketHeader { kind, order, len }))
    }

    /// Payload bytes after the header.
    pub fn payload_len(&self) -> usize {
        self.len.saturating_sub(HEADER_LEN)
    }

    /// The 8 wire bytes of this header, with the flag `rule` gives for `self.order`.
    pub fn to_bytes(&self, rule: FlagRule) -> Result<[u8; HEADER_LEN], LsapiError> {
        let len =
            i32::try_from(self.len)
                .ok()
                .filter(|&l| l >= 8)
                .ok_or(LsapiError::PacketTooLarge {
                    kind: self.kind,
                    len: self.len,
                    max: i32::MAX as usize,
                })?;
        let l = match self.order {
            ByteOrder::Little => len.to_le_bytes(),
            ByteOrder::Big => len.to_be_bytes(),
        };
        let [l0, l1, l2, l3] = l;
        Ok([
            MAGIC[0],
            MAGIC[1],
            self.kind.as_u8(),
            rule.flag_for(self.order),
            l0,
            l1,
            l2,
            l3,
        ])
    }

    /// Appends the 8 wire bytes to `dst`.
    pub fn encode(&self, rule: FlagRule, dst: &mut BytesMut) -> Result<(), LsapiError> {
        dst.extend_from_slice(&self.to_bytes(rule)?);
        Ok(())
    }
}

/// Writes a header for a packet whose `len` the caller has already bounded (≤ 65535 or
/// 8 + 16384), so it cannot fail.
pub(crate) fn put_header(
    kind: PacketType,
    order: ByteOrder,
    rule: FlagRule,
    len: usize,
    dst: &mut BytesMut,
) {
    dst.put_slice(&MAGIC);
    dst.put_u8(kind.as_u8());
    dst.put_u8(rule.flag_for(order));
    order.put_i32(i32::try_from(len).unwrap_or(i32::MAX), dst);
}
