//! Backend role (backend → server, for corral's own launchers and null backend): encoding the
//! response packets exactly as LiteSpeed's library lays them out.

use bytes::{BufMut, BytesMut};

use super::packet::{
    put_header, ByteOrder, FlagRule, PacketType, HEADER_LEN, MAX_DATA_LEN, MAX_HEADER_PACKET_LEN,
};
use super::response::{PID_MARKER, RESP_INFO_LEN};
use super::LsapiError;

/// Most header lines LiteSpeed's library puts in one RESP_HEADER (`LSAPI_MAX_RESP_HEADERS`).
pub const MAX_RESP_HEADERS: usize = 1000;
/// Longest header line, NUL included, that fits the int16 length OpenLiteSpeed reads.
pub const MAX_RESP_HEADER_LINE: usize = i16::MAX as usize;

/// Writes response packets in one byte order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ResponseEncoder {
    order: ByteOrder,
    rule: FlagRule,
}

impl Default for ResponseEncoder {
    /// Native byte order under [`FlagRule::HOST`], as lsphp built for this machine writes.
    fn default() -> ResponseEncoder {
        ResponseEncoder::new(ByteOrder::NATIVE, FlagRule::HOST)
    }
}

impl ResponseEncoder {
    /// Writes integers in `order`, announced with the flag `rule` gives for it.
    pub fn new(order: ByteOrder, rule: FlagRule) -> ResponseEncoder {
        ResponseEncoder { order, rule }
    }

    /// REQ_RECEIVED: the request was read.
    pub fn req_received(&self, dst: &mut BytesMut) {
        self.empty(PacketType::ReqReceived, dst);
    }

    /// The 16-byte `"\0PID"` + pid STDERR_STREAM a prefork child sends first on a connection.
    pub fn pid(&self, pid: u32, dst: &mut BytesMut) {
        put_header(
            PacketType::StderrStream,
            self.order,
            self.rule,
            HEADER_LEN + 8,
            dst,
        );
        dst.put_slice(&PID_MARKER);
        self.order
            .put_i32(i32::from_ne_bytes(pid.to_ne_bytes()), dst);
    }

    /// RESP_HEADER with `status` (0 = "see the Status: line") and `Name: value` lines.
    pub fn header<N: AsRef<[u8]>, V: AsRef<[u8]>>(
        &self,
        status: u16,
        headers: &[(N, V)],
        dst: &mut BytesMut,
    ) -> Result<(), LsapiError> {
        if status != 0 && !(100..=999).contains(&status) {
            return Err(LsapiError::BadStatus(i64::from(status)));
        }
        if headers.len() > MAX_RESP_HEADERS {
            return Err(LsapiError::TooManyResponseHeaders {
                count: headers.len(),
                max: MAX_RESP_HEADERS,
            });
        }
        let mut len = HEADER_LEN + RESP_INFO_LEN;
        for (name, value) in headers {
            let (name, value) = (name.as_ref(), value.as_ref());
            let bad_name =
                name.is_empty() || name.contains(&b':') || name.iter().any(|&b| is_breaking(b));
            if bad_name || value.iter().any(|&b| is_breaking(b)) {
                return Err(LsapiError::InvalidHeaderBytes {
                    what: "response header",
                });
            }
            let line = name.len() + 2 + value.len() + 1;
            if line > MAX_RESP_HEADER_LINE {
                return Err(LsapiError::HeaderLineTooLong {
                    len: line,
                    max: MAX_RESP_HEADER_LINE,
                });
            }
            len += 2 + line;
        }
        if len > MAX_HEADER_PACKET_LEN {
            return Err(LsapiError::PacketTooLarge {
                kind: PacketType::RespHeader,
                len,
                max: MAX_HEADER_PACKET_LEN,
            });
        }
        dst.reserve(len);
        put_header(PacketType::RespHeader, self.order, self.rule, len, dst);
        // Counts and lengths are bounded above (1000 lines, 32767 bytes each).
        self.order
            .put_i32(i32::try_from(headers.len()).unwrap_or(0), dst);
        self.order.put_i32(i32::from(status), dst);
        for (name, value) in headers {
            let line = name.as_ref().len() + 2 + value.as_ref().len() + 1;
            self.order.put_u16(u16::try_from(line).unwrap_or(0), dst);
        }
        for (name, value) in headers {
            dst.put_slice(name.as_ref());
            dst.put_slice(b": ");
            dst.put_slice(value.as_ref());
            dst.put_u8(0);
        }
        Ok(())
    }

    /// Body bytes, as RESP_STREAM packets of at most 16384 bytes; nothing for empty input.
    pub fn stream(&self, body: &[u8], dst: &mut BytesMut) {
        for chunk in body.chunks(MAX_DATA_LEN) {
            self.data(PacketType::RespStream, chunk, dst);
        }
    }

    /// Log text, as STDERR_STREAM packets of at most 16384 bytes; nothing for empty input.
    /// An 8-byte chunk that starts with `"\0PID"` would read as the pid packet, so it is sent
    /// as two 4-byte packets instead.
    pub fn stderr(&self, text: &[u8], dst: &mut BytesMut) {
        for chunk in text.chunks(MAX_DATA_LEN) {
            if chunk.len() == 8 && chunk.starts_with(&PID_MARKER) {
                let (a, b) = chunk.split_at(4);
                self.data(PacketType::StderrStream, a, dst);
                self.data(PacketType::StderrStream, b, dst);
            } else {
                self.data(PacketType::StderrStream, chunk, dst);
            }
        }
    }

    /// RESP_END: the response is complete.
    pub fn end(&self, dst: &mut BytesMut) {
        self.empty(PacketType::RespEnd, dst);
    }

    /// CONN_CLOSE: this side will close the connection.
    pub fn conn_close(&self, dst: &mut BytesMut) {
        self.empty(PacketType::ConnClose, dst);
    }

    /// The 8 header bytes of a RESP_STREAM carrying `len` bytes, for writing a body chunk
    /// without copying it (vectored write). `len` must be at most 16384.
    pub fn stream_header(&self, len: usize, dst: &mut BytesMut) -> Result<(), LsapiError> {
        if len > MAX_DATA_LEN {
            return Err(LsapiError::PacketTooLarge {
                kind: PacketType::RespStream,
                len: HEADER_LEN + len,
                max: HEADER_LEN + MAX_DATA_LEN,
            });
        }
        put_header(
            PacketType::RespStream,
            self.order,
            self.rule,
            HEADER_LEN + len,
            dst,
        );
        Ok(())
    }

    fn empty(&self, kind: PacketType, dst: &mut BytesMut) {
        put_header(kind, self.order, self.rule, HEADER_LEN, dst);
    }

    fn data(&self, kind: PacketType, chunk: &[u8], dst: &mut BytesMut) {
        dst.reserve(HEADER_LEN + chunk.len());
        put_header(kind, self.order, self.rule, HEADER_LEN + chunk.len(), dst);
        dst.put_slice(chunk);
    }
}

fn is_breaking(b: u8) -> bool {
    matches!(b, b'\r' | b'\n' | 0)
}
