//! Netstrings (D. J. Bernstein, cr.yp.to/proto/netstrings.txt) as SCGI uses them for its
//! header block: decimal length, ':', that many bytes, ','.
//!
//! The length is checked against the limit digit by digit, so a peer cannot make the decoder
//! wait for (or buffer) more than `max_len` payload bytes, and a long run of digits fails as
//! soon as its value passes the limit. Leading zeros are refused ("0" itself is the only
//! length that may start with '0') so every length has one spelling.

use bytes::{Buf, BufMut, Bytes, BytesMut};

use super::ScgiError;

/// Incremental decoder of one netstring.
///
/// Call [`decode`](Self::decode) each time bytes are appended to the same buffer; digits
/// already checked are not scanned again. It consumes the netstring only when it is complete
/// and returns its payload without copying.
#[derive(Debug, Clone)]
pub struct NetstringDecoder {
    max_len: usize,
    /// Length digits checked so far.
    digits: usize,
    /// Their value.
    len: usize,
}

impl NetstringDecoder {
    /// A decoder refusing payloads longer than `max_len` bytes.
    pub fn new(max_len: usize) -> Self {
        NetstringDecoder {
            max_len,
            digits: 0,
            len: 0,
        }
    }

    /// Returns the payload once the whole netstring is in `src`, `Ok(None)` before.
    pub fn decode(&mut self, src: &mut BytesMut) -> Result<Option<Bytes>, ScgiError> {
        loop {
            match src.get(self.digits) {
                None => return Ok(None),
                Some(b':') if self.digits == 0 => return Err(ScgiError::EmptyLength),
                Some(b':') => break,
                Some(&c) if c.is_ascii_digit() => {
                    if self.digits == 1 && self.len == 0 {
                        return Err(ScgiError::LeadingZero);
                    }
                    self.len = self
                        .len
                        .checked_mul(10)
                        .and_then(|n| n.checked_add(usize::from(c - b'0')))
                        .filter(|&n| n <= self.max_len)
                        .ok_or(ScgiError::LengthOverLimit {
                            limit: self.max_len,
                        })?;
                    self.digits += 1;
                }
                Some(&byte) => return Err(ScgiError::InvalidLengthByte { byte }),
            }
        }
        // digits ':' payload ','
        let comma_at = self.digits + 1 + self.len;
        match src.get(comma_at) {
            None => Ok(None),
            Some(b',') => {
                src.advance(self.digits + 1);
                let payload = src.split_to(self.len).freeze();
                src.advance(1);
                self.digits = 0;
                self.len = 0;
                Ok(Some(payload))
            }
            Some(&found) => Err(ScgiError::MissingComma { found }),
        }
    }
}

/// Writes `payload` as a netstring.
pub fn encode_netstring(payload: &[u8], dst: &mut BytesMut) {
    let len = payload.len().to_string();
    dst.reserve(len.len() + payload.len() + 2);
    dst.put_slice(len.as_bytes());
    dst.put_u8(b':');
    dst.put_slice(payload);
    dst.put_u8(b',');
}
