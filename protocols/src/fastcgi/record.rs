//! FastCGI record framing: the 8-byte header, the decoder that cuts whole records out of a
//! byte stream (content taken without copying, padding skipped), and the encoders that frame
//! content into records padded to 8-byte boundaries.

use bytes::{Buf, BufMut, Bytes, BytesMut};

use super::FastCgiError;

/// The only protocol version: FCGI_VERSION_1.
pub const VERSION_1: u8 = 1;
/// Bytes in a record header (FCGI_HEADER_LEN).
pub const HEADER_LEN: usize = 8;
/// Most content bytes one record can carry (its length field is 16 bits).
pub const MAX_CONTENT_LEN: usize = 0xffff;
/// Most padding bytes one record can carry (its length field is 8 bits).
pub const MAX_PADDING_LEN: usize = 0xff;
/// Longest record on the wire: header, maximal content and maximal padding.
pub const MAX_RECORD_LEN: usize = HEADER_LEN + MAX_CONTENT_LEN + MAX_PADDING_LEN;
/// The boundary the specification recommends records be aligned to; our encoders pad to it.
pub const ALIGNMENT: usize = 8;
/// Content bytes our encoders put in each record of a split stream: the largest multiple of 8
/// not over [`MAX_CONTENT_LEN`], so full records need no padding. It also keeps content plus
/// padding within 65535 bytes, which php-cgi requires of PARAMS records.
pub const STREAM_CHUNK_LEN: usize = MAX_CONTENT_LEN & !(ALIGNMENT - 1);
/// The request id of management records (FCGI_NULL_REQUEST_ID).
pub const NULL_REQUEST_ID: u16 = 0;

/// The type byte of a record.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RecordType {
    /// FCGI_BEGIN_REQUEST (1), web server to application.
    BeginRequest,
    /// FCGI_ABORT_REQUEST (2), web server to application.
    AbortRequest,
    /// FCGI_END_REQUEST (3), application to web server.
    EndRequest,
    /// FCGI_PARAMS (4), a name-value stream from the web server.
    Params,
    /// FCGI_STDIN (5), a byte stream from the web server.
    Stdin,
    /// FCGI_STDOUT (6), a byte stream from the application.
    Stdout,
    /// FCGI_STDERR (7), a byte stream from the application.
    Stderr,
    /// FCGI_DATA (8), the FILTER role's second byte stream from the web server.
    Data,
    /// FCGI_GET_VALUES (9), a management query from the web server.
    GetValues,
    /// FCGI_GET_VALUES_RESULT (10), the application's management answer.
    GetValuesResult,
    /// FCGI_UNKNOWN_TYPE (11), the application's answer to a type it does not know.
    UnknownType,
    /// Any type byte FastCGI 1.0 does not define (0 or 12 and up).
    Other(u8),
}

impl RecordType {
    /// The record type for a type byte; bytes 1 to 11 never map to [`RecordType::Other`].
    pub const fn from_u8(byte: u8) -> RecordType {
        match byte {
            1 => RecordType::BeginRequest,
            2 => RecordType::AbortRequest,
            3 => RecordType::EndRequest,
            4 => RecordType::Params,
            5 => RecordType::Stdin,
            6 => RecordType::Stdout,
            7 => RecordType::Stderr,
            8 => RecordType::Data,
            9 => RecordType::GetValues,
            10 => RecordType::GetValuesResult,
            11 => RecordType::UnknownType,
            other => RecordType::Other(other),
        }
    }

    /// The type byte written on the wire.
    pub const fn as_u8(self) -> u8 {
        match self {
            RecordType::BeginRequest => 1,
            RecordType::AbortRequest => 2,
            RecordType::EndRequest => 3,
            RecordType::Params => 4,
            RecordType::Stdin => 5,
            RecordType::Stdout => 6,
            RecordType::Stderr => 7,
            RecordType::Data => 8,
            RecordType::GetValues => 9,
            RecordType::GetValuesResult => 10,
            RecordType::UnknownType => 11,
            RecordType::Other(byte) => byte,
        }
    }

    /// Whether this is one of the three management types, which travel with request id 0.
    pub const fn is_management(self) -> bool {
        matches!(
            self,
            RecordType::GetValues | RecordType::GetValuesResult | RecordType::UnknownType
        )
    }
}

impl std::fmt::Display for RecordType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let name = match self {
            RecordType::BeginRequest => "BEGIN_REQUEST",
            RecordType::AbortRequest => "ABORT_REQUEST",
            RecordType::EndRequest => "END_REQUEST",
            RecordType::Params => "PARAMS",
            RecordType::Stdin => "STDIN",
            RecordType::Stdout => "STDOUT",
            RecordType::Stderr => "STDERR",
            RecordType::Data => "DATA",
            RecordType::GetValues => "GET_VALUES",
            RecordType::GetValuesResult => "GET_VALUES_RESULT",
            RecordType::UnknownType => "UNKNOWN_TYPE",
            RecordType::Other(byte) => return write!(f, "type-{byte}"),
        };
        f.write_str(name)
    }
}

/// The padding that brings `content_len` bytes up to the next 8-byte boundary.
pub const fn padding_for(content_len: usize) -> usize {
    (ALIGNMENT - content_len % ALIGNMENT) % ALIGNMENT
}

/// The fixed 8-byte prefix of every record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RecordHeader {
    /// The record type.
    pub kind: RecordType,
    /// The request the record belongs to (0 for management records).
    pub request_id: u16,
    /// Content bytes that follow the header.
    pub content_len: u16,
    /// Padding bytes that follow the content.
    pub padding_len: u8,
}

impl RecordHeader {
    /// A header for `content_len` content bytes, padded to an 8-byte boundary.
    pub const fn new(kind: RecordType, request_id: u16, content_len: u16) -> RecordHeader {
        RecordHeader {
            kind,
            request_id,
            content_len,
            padding_len: padding_for(content_len as usize) as u8,
        }
    }

    /// Parses a header, checking the version and reserved bytes.
    pub fn decode(bytes: [u8; HEADER_LEN]) -> Result<RecordHeader, FastCgiError> {
        let [version, kind, id_hi, id_lo, len_hi, len_lo, padding_len, reserved] = bytes;
        if version != VERSION_1 {
            return Err(FastCgiError::UnsupportedVersion { version });
        }
        if reserved != 0 {
            return Err(FastCgiError::ReservedNotZero { value: reserved });
        }
        Ok(RecordHeader {
            kind: RecordType::from_u8(kind),
            request_id: u16::from_be_bytes([id_hi, id_lo]),
            content_len: u16::from_be_bytes([len_hi, len_lo]),
            padding_len,
        })
    }

    /// The header's wire form.
    pub const fn to_bytes(&self) -> [u8; HEADER_LEN] {
        let [id_hi, id_lo] = self.request_id.to_be_bytes();
        let [len_hi, len_lo] = self.content_len.to_be_bytes();
        [
            VERSION_1,
            self.kind.as_u8(),
            id_hi,
            id_lo,
            len_hi,
            len_lo,
            self.padding_len,
            0,
        ]
    }

    /// Appends the header's wire form to `dst`.
    pub fn encode(&self, dst: &mut BytesMut) {
        dst.put_slice(&self.to_bytes());
    }

    /// Bytes the whole record occupies: header, content and padding.
    pub const fn record_len(&self) -> usize {
        HEADER_LEN + self.content_len as usize + self.padding_len as usize
    }
}

/// One record with its padding removed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    /// The record type; undefined types are returned, not refused, so a responder can answer
    /// FCGI_UNKNOWN_TYPE.
    pub kind: RecordType,
    /// The request the record belongs to (0 for management records).
    pub request_id: u16,
    /// The content, sharing the input buffer's memory.
    pub content: Bytes,
}

/// Cuts whole records out of a byte stream. It buffers nothing itself: a record is returned
/// once all of its bytes, padding included, are in `src` (at most [`MAX_RECORD_LEN`]).
#[derive(Debug, Clone, Default)]
pub struct RecordDecoder {
    _private: (),
}

impl RecordDecoder {
    /// A decoder at the start of a connection.
    pub const fn new() -> RecordDecoder {
        RecordDecoder { _private: () }
    }

    /// Takes the next whole record from `src`; `Ok(None)` until all of it has arrived, in which
    /// case `src` is reserved enough room for the rest.
    pub fn decode(&mut self, src: &mut BytesMut) -> Result<Option<Record>, FastCgiError> {
        let Some(header) = src.get(..HEADER_LEN) else {
            return Ok(None);
        };
        let mut bytes = [0u8; HEADER_LEN];
        bytes.copy_from_slice(header);
        let header = RecordHeader::decode(bytes)?;
        let total = header.record_len();
        if src.len() < total {
            src.reserve(total - src.len());
            return Ok(None);
        }
        src.advance(HEADER_LEN);
        let content = src.split_to(usize::from(header.content_len)).freeze();
        src.advance(usize::from(header.padding_len));
        Ok(Some(Record {
            kind: header.kind,
            request_id: header.request_id,
            content,
        }))
    }
}

/// Appends one record holding `content`, padded to an 8-byte boundary.
pub fn encode_record(
    kind: RecordType,
    request_id: u16,
    content: &[u8],
    dst: &mut BytesMut,
) -> Result<(), FastCgiError> {
    let Ok(len) = u16::try_from(content.len()) else {
        return Err(FastCgiError::ContentTooLong {
            kind,
            len: content.len(),
        });
    };
    let header = RecordHeader::new(kind, request_id, len);
    dst.reserve(header.record_len());
    header.encode(dst);
    dst.put_slice(content);
    dst.put_bytes(0, usize::from(header.padding_len));
    Ok(())
}

/// Bytes [`encode_stream`] writes for `data_len` bytes of stream data.
pub const fn stream_encoded_len(data_len: usize) -> usize {
    let full = data_len / STREAM_CHUNK_LEN;
    let rest = data_len % STREAM_CHUNK_LEN;
    let last = if rest == 0 {
        0
    } else {
        HEADER_LEN + rest + padding_for(rest)
    };
    full * (HEADER_LEN + STREAM_CHUNK_LEN) + last
}

/// Appends `data` to a stream as records of at most [`STREAM_CHUNK_LEN`] content bytes, with
/// one reserve. Empty `data` writes nothing: an empty record would end the stream, which is
/// [`encode_stream_end`]'s job.
pub fn encode_stream(kind: RecordType, request_id: u16, data: &[u8], dst: &mut BytesMut) {
    dst.reserve(stream_encoded_len(data.len()));
    for chunk in data.chunks(STREAM_CHUNK_LEN) {
        // A chunk is at most STREAM_CHUNK_LEN bytes, so the cast cannot truncate.
        let header = RecordHeader::new(kind, request_id, chunk.len() as u16);
        header.encode(dst);
        dst.put_slice(chunk);
        dst.put_bytes(0, usize::from(header.padding_len));
    }
}

/// Appends the empty record that ends a stream.
pub fn encode_stream_end(kind: RecordType, request_id: u16, dst: &mut BytesMut) {
    RecordHeader::new(kind, request_id, 0).encode(dst);
}

/// Writes a stream whose total length is not known up front (a PARAMS stream built pair by
/// pair): content goes straight into `dst`, and each record's header is filled in when the
/// record closes, so nothing is copied twice.
#[derive(Debug)]
pub(crate) struct StreamWriter<'a> {
    dst: &'a mut BytesMut,
    kind: RecordType,
    request_id: u16,
    /// Where the open record's header sits in `dst`, if a record is open.
    open_at: Option<usize>,
    /// Content bytes in the open record.
    open_len: usize,
}

impl<'a> StreamWriter<'a> {
    pub(crate) fn new(kind: RecordType, request_id: u16, dst: &'a mut BytesMut) -> Self {
        StreamWriter {
            dst,
            kind,
            request_id,
            open_at: None,
            open_len: 0,
        }
    }

    /// Content bytes the open record can still take (a full chunk when none is open).
    pub(crate) fn room(&self) -> usize {
        STREAM_CHUNK_LEN - self.open_len
    }

    fn open_record(&mut self) {
        if self.open_at.is_none() {
            self.open_at = Some(self.dst.len());
            self.dst.put_bytes(0, HEADER_LEN);
        }
    }

    /// Appends `parts` (`len` bytes in all, at most [`room`](Self::room)) to the open record:
    /// the common case of a pair that fits, without `write`'s per-slice splitting.
    pub(crate) fn write_fitting(&mut self, parts: &[&[u8]], len: usize) {
        debug_assert!(len <= self.room());
        self.open_record();
        for part in parts {
            self.dst.put_slice(part);
        }
        self.open_len += len;
        if self.open_len == STREAM_CHUNK_LEN {
            self.close_record();
        }
    }

    /// Appends `data`, opening and closing records as each fills.
    pub(crate) fn write(&mut self, mut data: &[u8]) {
        while !data.is_empty() {
            self.open_record();
            let (now, later) = data.split_at(self.room().min(data.len()));
            self.dst.put_slice(now);
            self.open_len += now.len();
            data = later;
            if self.open_len == STREAM_CHUNK_LEN {
                self.close_record();
            }
        }
    }

    /// Closes the open record (if any) so the next write starts a new one.
    pub(crate) fn close_record(&mut self) {
        let Some(at) = self.open_at.take() else {
            return;
        };
        // open_len never exceeds STREAM_CHUNK_LEN, so the cast cannot truncate.
        let header = RecordHeader::new(self.kind, self.request_id, self.open_len as u16);
        if let Some(slot) = self.dst.get_mut(at..at + HEADER_LEN) {
            slot.copy_from_slice(&header.to_bytes());
        }
        self.dst.put_bytes(0, usize::from(header.padding_len));
        self.open_len = 0;
    }

    /// Closes the open record and appends the empty record that ends the stream.
    pub(crate) fn finish(mut self) {
        self.close_record();
        encode_stream_end(self.kind, self.request_id, self.dst);
    }
}
