//! Sans-IO wire codecs for the protocols corral speaks: FastCGI 1.0, SCGI, LSAPI and the
//! CGI/1.1 variables and response head they all carry.
//!
//! Nothing here performs I/O, reads a clock or logs. Every decoder has the shape
//! `decode(&mut self, src: &mut BytesMut) -> Result<Option<T>, DecodeError>`: it consumes bytes
//! only when it returns `Ok(Some(_))`, `Ok(None)` means "need more bytes", and `Err` means the
//! peer broke a named rule of the protocol. Every length read from the wire is checked against
//! a [`Limits`] value before anything is allocated or sliced, and no input can make a decoder
//! panic: peers (front servers, clients and backends alike) are untrusted.
//!
//! Each protocol has two layers: framing (records, netstrings, packets) and an exchange state
//! machine that turns frames into one request/response exchange, for both roles.

pub mod ascii;
pub mod cgi;
pub mod cgi_response;
pub mod fastcgi;
pub mod limits;
pub mod lsapi;
pub mod scgi;

pub use limits::Limits;
