//! SCGI (Neil Schemenauer's "Simple Common Gateway Interface", python.ca/scgi/protocol.txt),
//! both roles.
//!
//! A request is a netstring (`len:payload,`) whose payload is NUL-terminated name/value pairs,
//! CONTENT_LENGTH first and `SCGI` = `1` among them, followed by exactly CONTENT_LENGTH body
//! bytes. The response is a plain CGI response written until the connection closes: parse it
//! with [`crate::cgi_response`]. One connection carries one request.
//!
//! - [`netstring`]: the netstring framing.
//! - [`header`]: the request header block, encoded by the client, decoded by the responder.
//! - [`exchange`]: the responder's state machine: head, then body chunks, then the end.
//! - [`front_head`]: the header block decoded straight into the CGI front's parameters.

pub mod exchange;
pub mod front_head;
pub mod header;
pub mod netstring;

pub use exchange::{ScgiRequestDecoder, ScgiRequestEvent};
pub use front_head::ScgiFrontHead;
pub use header::{encode_request_head, ScgiHead, ScgiRequestHead};
pub use netstring::{encode_netstring, NetstringDecoder};

/// How many bytes of an offending value an error quotes.
const SNIPPET_LEN: usize = 64;

fn snippet(b: &[u8]) -> Vec<u8> {
    b.get(..SNIPPET_LEN).unwrap_or(b).to_vec()
}

/// A rule an SCGI peer (or the caller of an encoder) broke.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ScgiError {
    /// A byte other than a digit or ':' in the netstring length.
    #[error("SCGI netstring length holds byte 0x{byte:02x}, not a digit")]
    InvalidLengthByte {
        /// The byte.
        byte: u8,
    },
    /// The netstring starts with ':'.
    #[error("SCGI netstring has no length digits before ':'")]
    EmptyLength,
    /// A length like `07`: only `0` itself may start with a zero.
    #[error("SCGI netstring length has a leading zero")]
    LeadingZero,
    /// The netstring length exceeds `max_params_bytes`.
    #[error("SCGI netstring length exceeds the limit of {limit} bytes")]
    LengthOverLimit {
        /// The limit.
        limit: usize,
    },
    /// The byte after the netstring payload is not ','.
    #[error("SCGI netstring ends with byte 0x{found:02x}, not ','")]
    MissingComma {
        /// The byte found instead.
        found: u8,
    },
    /// The header block ends inside a name or value (no terminating NUL).
    #[error("SCGI header block ends inside a name or value")]
    TruncatedPair,
    /// A header with an empty name.
    #[error("SCGI header has an empty name")]
    EmptyName,
    /// The first header is not CONTENT_LENGTH (or the block is empty).
    #[error("SCGI first header is \"{}\", not CONTENT_LENGTH", .found.escape_ascii())]
    ContentLengthNotFirst {
        /// The start of the first name (empty when there are no headers).
        found: Vec<u8>,
    },
    /// CONTENT_LENGTH is not a non-empty decimal number that fits in 64 bits.
    #[error("SCGI CONTENT_LENGTH \"{}\" is not a decimal number", .value.escape_ascii())]
    InvalidContentLength {
        /// The start of the value.
        value: Vec<u8>,
    },
    /// No `SCGI` header.
    #[error("SCGI header block has no SCGI header")]
    MissingScgi,
    /// An `SCGI` header whose value is not `1`.
    #[error("SCGI version \"{}\" is not 1", .value.escape_ascii())]
    ScgiVersion {
        /// The start of the value.
        value: Vec<u8>,
    },
    /// A header name given twice.
    #[error("SCGI header \"{}\" is given twice", .name.escape_ascii())]
    DuplicateName {
        /// The start of the name.
        name: Vec<u8>,
    },
    /// More headers than `max_params_count`.
    #[error("SCGI header block has more than {limit} headers")]
    TooManyParams {
        /// The limit.
        limit: usize,
    },
    /// A name longer than `max_name_len`.
    #[error("SCGI header name \"{}\" is longer than {limit} bytes", .name.escape_ascii())]
    NameTooLong {
        /// The start of the name.
        name: Vec<u8>,
        /// The limit.
        limit: usize,
    },
    /// A value longer than `max_value_len`.
    #[error("value of SCGI header \"{}\" is longer than {limit} bytes", .name.escape_ascii())]
    ValueTooLong {
        /// The start of the name.
        name: Vec<u8>,
        /// The limit.
        limit: usize,
    },
    /// Encoding: a name or value holding NUL, which would end it early.
    #[error("SCGI header \"{}\" holds a NUL byte in its name or value", .name.escape_ascii())]
    NulInParam {
        /// The start of the name.
        name: Vec<u8>,
    },
    /// Encoding: CONTENT_LENGTH or SCGI among the parameters; the encoder writes both itself.
    #[error("SCGI header \"{}\" is written by the encoder and may not be passed in", .name.escape_ascii())]
    ReservedName {
        /// The name.
        name: Vec<u8>,
    },
    /// Encoding: the header block would exceed `max_params_bytes`.
    #[error("SCGI header block of {len} bytes exceeds the limit of {limit}")]
    HeaderTooLarge {
        /// The block's length.
        len: usize,
        /// The limit.
        limit: usize,
    },
    /// Bytes after the request body, which SCGI does not allow.
    #[error("SCGI client sent bytes after the request body")]
    BytesAfterBody,
}
