//! The one error type of the FastCGI codec: each variant is one rule of the FastCGI 1.0
//! specification (or one bound from [`Limits`](crate::Limits)) that a peer broke, carrying the
//! offending values so the message can name them.

use super::{RecordType, Role};

/// Which end of a FastCGI connection a record travels from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Side {
    /// The web server (front server, or corral acting as the client of a backend).
    WebServer,
    /// The FastCGI application (a backend, or corral acting as the responder).
    Application,
}

impl std::fmt::Display for Side {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Side::WebServer => "web server",
            Side::Application => "application",
        })
    }
}

/// A FastCGI rule the peer broke, or a value corral was asked to encode that the wire format
/// cannot carry. After any decode error the connection must be dropped, never reused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FastCgiError {
    /// The header's version byte is not FCGI_VERSION_1.
    #[error("FastCGI record version {version} is not 1")]
    UnsupportedVersion {
        /// The version byte received.
        version: u8,
    },
    /// The header's reserved byte is not zero.
    #[error("FastCGI record header reserved byte is {value}, not 0")]
    ReservedNotZero {
        /// The reserved byte received.
        value: u8,
    },
    /// A discrete record's content length differs from the fixed size of its body.
    #[error("FastCGI {kind} record carries {len} content bytes; its body is exactly {expected}")]
    BodyLength {
        /// The record type.
        kind: RecordType,
        /// The content length received.
        len: usize,
        /// The body size the specification fixes.
        expected: usize,
    },
    /// A record was sent in the wrong direction (e.g. a backend sent FCGI_STDIN).
    #[error("FastCGI {kind} record was sent by the {sender}, but only the other side sends it")]
    WrongDirection {
        /// The record type.
        kind: RecordType,
        /// The side that sent it.
        sender: Side,
    },
    /// A record type FastCGI 1.0 does not define, where the receiver cannot answer it with
    /// FCGI_UNKNOWN_TYPE (the client role).
    #[error("FastCGI record type {kind} is not defined by FastCGI 1.0")]
    UnknownRecordType {
        /// The type byte received.
        kind: u8,
    },
    /// An application record carried the null request id reserved for management records.
    #[error("FastCGI {kind} record uses request id 0, which only management records may use")]
    NullRequestId {
        /// The record type.
        kind: RecordType,
    },
    /// A management record carried a non-zero request id.
    #[error("FastCGI management record {kind} carries request id {request_id}, not 0")]
    ManagementRequestId {
        /// The record type.
        kind: RecordType,
        /// The request id received.
        request_id: u16,
    },
    /// A backend answered with a request id other than the one corral sent.
    #[error(
        "FastCGI {kind} record is for request id {got}, but the request in flight is {expected}"
    )]
    WrongRequestId {
        /// The record type.
        kind: RecordType,
        /// The request id corral sent.
        expected: u16,
        /// The request id received.
        got: u16,
    },
    /// FCGI_BEGIN_REQUEST named a request id that is still active.
    #[error("FastCGI BEGIN_REQUEST for request id {request_id}, which is already active")]
    RequestAlreadyActive {
        /// The request id received.
        request_id: u16,
    },
    /// A stream record arrived after that stream's empty end-of-stream record.
    #[error(
        "FastCGI {kind} stream of request {request_id} continued after its end-of-stream record"
    )]
    StreamAfterEnd {
        /// The stream's record type.
        kind: RecordType,
        /// The request id.
        request_id: u16,
    },
    /// FCGI_STDIN or FCGI_DATA arrived before the FCGI_PARAMS stream ended.
    #[error(
        "FastCGI {kind} record for request {request_id} arrived before its PARAMS stream ended"
    )]
    StreamBeforeParams {
        /// The stream's record type.
        kind: RecordType,
        /// The request id.
        request_id: u16,
    },
    /// FCGI_DATA arrived for a request whose role is not FILTER.
    #[error(
        "FastCGI DATA record for request {request_id}, whose role {role} takes no data stream"
    )]
    DataWithoutFilterRole {
        /// The request id.
        request_id: u16,
        /// The role the request began with.
        role: Role,
    },
    /// An application record arrived after FCGI_END_REQUEST for the request.
    #[error("FastCGI {kind} record for request {request_id} arrived after its END_REQUEST")]
    RecordAfterEnd {
        /// The record type.
        kind: RecordType,
        /// The request id.
        request_id: u16,
    },
    /// FCGI_END_REQUEST carried a protocol status FastCGI 1.0 does not define.
    #[error("FastCGI END_REQUEST protocol status {status} is not one of 0 to 3")]
    UnknownProtocolStatus {
        /// The status byte received.
        status: u8,
    },
    /// A name-value block (PARAMS stream or management record) exceeds `max_params_bytes`.
    #[error("FastCGI name-value block reached {len} bytes, over the limit of {limit}")]
    ParamsTooLarge {
        /// Bytes received so far.
        len: usize,
        /// `Limits::max_params_bytes`.
        limit: usize,
    },
    /// A name-value block holds more pairs than `max_params_count`.
    #[error("FastCGI name-value block holds more than {limit} pairs")]
    TooManyParams {
        /// `Limits::max_params_count`.
        limit: usize,
    },
    /// A name length prefix exceeds `max_name_len`.
    #[error("FastCGI name-value pair declares a {len}-byte name, over the limit of {limit}")]
    NameTooLong {
        /// The declared name length.
        len: usize,
        /// `Limits::max_name_len`.
        limit: usize,
    },
    /// A value length prefix exceeds `max_value_len`.
    #[error("FastCGI name-value pair declares a {len}-byte value, over the limit of {limit}")]
    ValueTooLong {
        /// The declared value length.
        len: usize,
        /// `Limits::max_value_len`.
        limit: usize,
    },
    /// A name-value block ended inside a pair (its lengths overrun the block).
    #[error("FastCGI name-value block ended {missing} bytes short of its last pair")]
    TruncatedPair {
        /// Bytes the last pair still needed (at least 1 when only its lengths were cut).
        missing: usize,
    },
    /// Content handed to an encoder does not fit one record's 16-bit length.
    #[error("FastCGI {kind} content of {len} bytes does not fit one record (at most 65535)")]
    ContentTooLong {
        /// The record type.
        kind: RecordType,
        /// The content length asked for.
        len: usize,
    },
    /// A name or value handed to an encoder is longer than the 31-bit length form allows.
    #[error("FastCGI name or value of {len} bytes is over the 2147483647-byte maximum")]
    PairFieldTooLong {
        /// The length asked for.
        len: usize,
    },
    /// A new request was started on a connection that FCGI_KEEP_CONN does not keep open, or
    /// whose previous request has not ended.
    #[error("FastCGI connection cannot carry request {request_id}: the previous request has not ended with FCGI_KEEP_CONN set")]
    NotReusable {
        /// The request id the caller tried to start.
        request_id: u16,
    },
}
