//! LSAPI (LiteSpeed SAPI), both roles: corral as the server talking to lsphp and other
//! LSAPI backends (build BEGIN_REQUEST, decode the response packets), and corral as a
//! backend (decode BEGIN_REQUEST, encode the response packets) for its own launchers and
//! null backend.
//!
//! One connection carries one request at a time: the server writes a BEGIN_REQUEST packet
//! and then the body raw (exactly its declared length, no framing); the backend answers
//! REQ_RECEIVED, STDERR_STREAM, RESP_HEADER, RESP_STREAM… and RESP_END, after which the next
//! request may follow. Every packet starts with an 8-byte header whose flag names the byte
//! order of the packet's integers; env lengths inside BEGIN_REQUEST are always big-endian.
//! The reference is the protocol notes in the project's `protocols/LSAPI.md`, checked
//! against a real lsphp 8.2.
//!
//! Files: `packet` (header, types, byte order), `headers` (the 25-slot known-header index),
//! `request` (building BEGIN_REQUEST), `request_cgi` (BEGIN_REQUEST straight from CGI
//! variables), `request_decode` (parsing it), `response` (decoding
//! the backend's packets), `response_encode` (writing them), `error`.

mod error;
mod headers;
mod packet;
mod request;
mod request_cgi;
mod request_decode;
mod request_view;
mod response;
mod response_encode;

pub use error::LsapiError;
pub use headers::{
    known_header_exact, known_header_index, HEADER_INDEX_LEN, H_CONTENT_LENGTH,
    H_TRANSFER_ENCODING, KNOWN_HEADERS, KNOWN_HEADER_COUNT, UNKNOWN_HEADER_ENTRY_LEN,
};
pub use packet::{
    ByteOrder, FlagRule, PacketHeader, PacketType, HEADER_LEN, MAGIC, MAX_DATA_LEN,
    MAX_HEADER_PACKET_LEN,
};
pub use request::{
    encode_abort, RequestBuilder, BODY_LEN_FROM_CONTENT_LENGTH, MAX_ENV_PAIRS, POINTED_ENV,
    REQ_HEADER_LEN,
};
pub use request_cgi::{encode_cgi_request, CgiScratch};
pub use request_decode::{BeginRequest, RequestDecoder, RequestEvent};
pub use request_view::{RequestView, ViewEvent};
pub use response::{
    split_header_line, ResponseDecoder, ResponseEvent, ResponseHead, TextEvent, PID_MARKER,
    RESP_INFO_LEN,
};
pub use response_encode::{ResponseEncoder, MAX_RESP_HEADERS, MAX_RESP_HEADER_LINE};
