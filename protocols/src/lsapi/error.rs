//! The one error type of the LSAPI codec: every rule a peer (or a caller building a request)
//! can break, one variant each, with the offending values.

use super::packet::PacketType;

/// A broken LSAPI rule. Decoders return it when the peer sent bytes that break the protocol
/// (the connection must then be dropped, never reused); encoders return it when the caller's
/// input cannot be expressed on the wire.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LsapiError {
    // ---- packet header -------------------------------------------------------------------
    /// The first two bytes of a packet are not `'L' 'S'`.
    #[error("LSAPI packet magic is {0:#04x} {1:#04x}, not 'L' 'S' (0x4c 0x53)")]
    BadMagic(u8, u8),
    /// The type byte names no LSAPI packet type (valid: 1..=9).
    #[error("LSAPI packet type {0} is not one of the nine types 1..=9")]
    UnknownPacketType(u8),
    /// The declared packet length is below the 8-byte header it includes.
    #[error("LSAPI packet length {0} is smaller than the 8-byte packet header it includes")]
    PacketLengthTooSmall(i64),
    /// The declared packet length is above what this packet type (or the configured limit)
    /// allows.
    #[error("LSAPI {kind} packet of {len} bytes exceeds the limit of {max} bytes")]
    PacketTooLarge {
        /// The packet type.
        kind: PacketType,
        /// The declared total length, header included.
        len: usize,
        /// The largest total length accepted for this type.
        max: usize,
    },
    /// A packet type that only carries its 8-byte header came with a payload.
    #[error("LSAPI {kind} packet must be exactly 8 bytes, but declares {len}")]
    PayloadNotEmpty {
        /// The packet type.
        kind: PacketType,
        /// The declared total length.
        len: usize,
    },
    /// A packet type that this direction of the connection never carries.
    #[error("LSAPI {kind} packet is never sent in this direction ({direction})")]
    UnexpectedPacket {
        /// The packet type received.
        kind: PacketType,
        /// Which direction the decoder reads: "backend to server" or "server to backend".
        direction: &'static str,
    },

    // ---- response sequence (backend -> server) --------------------------------------------
    /// RESP_STREAM arrived before the RESP_HEADER of the response.
    #[error("LSAPI RESP_STREAM arrived before the response's RESP_HEADER")]
    StreamBeforeHeader,
    /// RESP_END arrived before the RESP_HEADER of the response.
    #[error("LSAPI RESP_END arrived before the response's RESP_HEADER")]
    EndBeforeHeader,
    /// A second RESP_HEADER arrived for the same response.
    #[error("LSAPI RESP_HEADER arrived twice for one response")]
    HeaderTwice,
    /// REQ_RECEIVED arrived in the middle of a response.
    #[error("LSAPI REQ_RECEIVED arrived after the response's RESP_HEADER")]
    AckDuringResponse,
    /// A packet arrived after CONN_CLOSE, which announces that the backend closes.
    #[error("LSAPI {0} packet arrived after CONN_CLOSE")]
    PacketAfterConnClose(PacketType),

    // ---- RESP_HEADER layout ---------------------------------------------------------------
    /// `m_cntHeaders` is negative.
    #[error("LSAPI RESP_HEADER declares a negative header count {0}")]
    NegativeHeaderCount(i32),
    /// More response header lines than the limit.
    #[error("LSAPI RESP_HEADER declares {count} header lines, more than the limit of {max}")]
    TooManyResponseHeaders {
        /// Declared (or given) count.
        count: usize,
        /// The limit.
        max: usize,
    },
    /// `m_status` is neither 0 ("not set") nor a three-digit HTTP status.
    #[error("LSAPI RESP_HEADER status {0} is neither 0 nor a three-digit HTTP status")]
    BadStatus(i64),
    /// A header-line length of 0 (it must count the trailing NUL, so it is at least 1).
    #[error("LSAPI RESP_HEADER line {index} has length 0; lengths count the trailing NUL")]
    EmptyHeaderLine {
        /// Zero-based line number.
        index: usize,
    },
    /// A header line does not end with the NUL its length counts.
    #[error("LSAPI RESP_HEADER line {index} does not end with a NUL byte")]
    HeaderLineNotNulTerminated {
        /// Zero-based line number.
        index: usize,
    },
    /// A header line contains a NUL before its end.
    #[error("LSAPI RESP_HEADER line {index} contains a NUL byte before its end")]
    HeaderLineContainsNul {
        /// Zero-based line number.
        index: usize,
    },
    /// The length array and lines do not fill the packet exactly.
    #[error("LSAPI RESP_HEADER lines need {needed} payload bytes but the packet carries {actual}")]
    RespHeaderSizeMismatch {
        /// Bytes the counts and lengths call for.
        needed: usize,
        /// Bytes the packet carries.
        actual: usize,
    },
    /// A response header line that does not fit in LSAPI's 16-bit length (or 32768 bytes).
    #[error("LSAPI response header line of {len} bytes exceeds the maximum of {max}")]
    HeaderLineTooLong {
        /// Line length, NUL included.
        len: usize,
        /// The maximum.
        max: usize,
    },

    // ---- names and values -----------------------------------------------------------------
    /// A name (environment or header) longer than `Limits::max_name_len`.
    #[error("LSAPI {what} name of {len} bytes exceeds the limit of {max} bytes")]
    NameTooLong {
        /// "env", "special env", "request header" or "response header".
        what: &'static str,
        /// Its length.
        len: usize,
        /// The limit.
        max: usize,
    },
    /// A value (environment or header) longer than `Limits::max_value_len`.
    #[error("LSAPI {what} value of {len} bytes exceeds the limit of {max} bytes")]
    ValueTooLong {
        /// "env", "special env", "request header" or "response header".
        what: &'static str,
        /// Its length.
        len: usize,
        /// The limit.
        max: usize,
    },

    // ---- BEGIN_REQUEST layout (server -> backend) ------------------------------------------
    /// A BEGIN_REQUEST shorter than its fixed 44-byte header.
    #[error("LSAPI BEGIN_REQUEST of {0} bytes is shorter than its 44-byte fixed header")]
    BeginRequestTooShort(usize),
    /// One of the nine int32 fields of the request header is negative where it may not be.
    #[error("LSAPI BEGIN_REQUEST field {field} is negative ({value})")]
    NegativeField {
        /// Field name as in `struct lsapi_req_header`.
        field: &'static str,
        /// Its value.
        value: i32,
    },
    /// More env (plus special env) pairs, or headers, than the limits allow.
    #[error("LSAPI BEGIN_REQUEST carries {count} {what}, more than the limit of {max}")]
    TooManyPairs {
        /// "env pairs", "special env pairs", or "headers".
        what: &'static str,
        /// The count.
        count: usize,
        /// The limit.
        max: usize,
    },
    /// An env list runs past the end of the packet.
    #[error("LSAPI {list} list runs past the end of the BEGIN_REQUEST packet")]
    EnvListTruncated {
        /// "env" or "special env".
        list: &'static str,
    },
    /// An env key or value length of 0 (lengths count the trailing NUL).
    #[error("LSAPI {list} pair has a zero length; lengths count the trailing NUL")]
    EnvLengthZero {
        /// "env" or "special env".
        list: &'static str,
    },
    /// An env key or value does not end with the NUL its length counts.
    #[error("LSAPI {list} key or value does not end with a NUL byte")]
    EnvNotNulTerminated {
        /// "env" or "special env".
        list: &'static str,
    },
    /// An env list is not followed by its four zero bytes.
    #[error("LSAPI {list} list is not followed by the four-zero-byte terminator")]
    EnvListNotTerminated {
        /// "env" or "special env".
        list: &'static str,
    },
    /// The padding before the header index is not zero bytes.
    #[error("LSAPI BEGIN_REQUEST padding before the header index is not zero")]
    NonZeroPadding,
    /// The blocks of a BEGIN_REQUEST do not end exactly at the declared packet length.
    #[error("LSAPI BEGIN_REQUEST blocks end at byte {actual} but the packet length is {declared}")]
    RequestSizeMismatch {
        /// `m_packetLen`.
        declared: usize,
        /// Where the blocks end.
        actual: usize,
    },
    /// One of the four string offsets is outside the packet or points at no NUL-terminated
    /// string.
    #[error("LSAPI BEGIN_REQUEST {field} offset {offset} does not point at a NUL-terminated string inside the {len}-byte packet")]
    BadStringOffset {
        /// Field name as in `struct lsapi_req_header`.
        field: &'static str,
        /// Its value.
        offset: i32,
        /// Packet length.
        len: usize,
    },
    /// A known-header index entry points outside the raw header block.
    #[error("LSAPI header index entry {index} (offset {offset}, length {len}) lies outside the {block}-byte header block")]
    KnownHeaderOutOfRange {
        /// Index 0..=24.
        index: usize,
        /// Offset.
        offset: i32,
        /// Length.
        len: u16,
        /// Block length.
        block: usize,
    },
    /// An unknown-header table entry points outside the raw header block.
    #[error("LSAPI unknown-header entry {index} lies outside the {block}-byte header block")]
    UnknownHeaderOutOfRange {
        /// Zero-based entry number.
        index: usize,
        /// Block length.
        block: usize,
    },
    /// `m_reqBodyLen` is -2 ("2 GiB or more") but there is no valid Content-Length header.
    #[error("LSAPI BEGIN_REQUEST body length -2 needs a decimal Content-Length header, and none is valid")]
    MissingContentLength,

    // ---- building a BEGIN_REQUEST ---------------------------------------------------------
    /// The BEGIN_REQUEST would exceed 65535 bytes or `Limits::max_params_bytes`.
    #[error("LSAPI BEGIN_REQUEST of {len} bytes exceeds the limit of {max} bytes")]
    RequestTooLarge {
        /// Size it would have.
        len: usize,
        /// The limit.
        max: usize,
    },
    /// One of the four variables the request header points at is missing from the env.
    #[error("LSAPI BEGIN_REQUEST needs the env variable {0}, which was not given")]
    MissingEnv(&'static str),
    /// A known header given twice: the index has one slot per known header.
    #[error("LSAPI known header {0} given twice; combine repeats into one value first")]
    RepeatedKnownHeader(&'static str),
    /// A Transfer-Encoding request header: LSAPI bodies are raw and of known length.
    #[error("LSAPI requests carry a raw body of known length, so a Transfer-Encoding header cannot be sent")]
    TransferEncodingHeader,
    /// A request line, header name or header value with a byte that cannot appear there.
    #[error("LSAPI {what} contains CR, LF, NUL (or, in a name, ':' or nothing at all)")]
    InvalidHeaderBytes {
        /// "request line", "header name" or "header value".
        what: &'static str,
    },
    /// A body of 2 GiB or more needs a matching Content-Length header (length is sent as -2).
    #[error("LSAPI body of {0} bytes (2 GiB or more) needs a matching Content-Length header")]
    LargeBodyWithoutContentLength(u64),
}
