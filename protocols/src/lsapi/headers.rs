//! The 25 request headers LSAPI describes through its fixed-size header index
//! (`struct lsapi_http_header_index`, enum in lsapidef.h), and the index's wire layout.

/// Number of known headers (`H_TRANSFER_ENCODING + 1`).
pub const KNOWN_HEADER_COUNT: usize = 25;
/// Bytes in the header index: 25 × u16 lengths, 2 pad bytes, 25 × i32 offsets.
pub const HEADER_INDEX_LEN: usize = 152;
/// Offset of the int32 offset array inside the index (after the lengths and 2 pad bytes).
pub(crate) const INDEX_OFFSETS_AT: usize = 2 * KNOWN_HEADER_COUNT + 2;
/// Bytes in one unknown-header table entry (`struct lsapi_header_offset`: four int32).
pub const UNKNOWN_HEADER_ENTRY_LEN: usize = 16;

/// The known headers in index order (canonical spelling as LiteSpeed's library names them).
pub const KNOWN_HEADERS: [&str; KNOWN_HEADER_COUNT] = [
    "Accept",
    "Accept-Charset",
    "Accept-Encoding",
    "Accept-Language",
    "Authorization",
    "Connection",
    "Content-Type",
    "Content-Length",
    "Cookie",
    "Cookie2",
    "Host",
    "Pragma",
    "Referer",
    "User-Agent",
    "Cache-Control",
    "If-Modified-Since",
    "If-Match",
    "If-None-Match",
    "If-Range",
    "If-Unmodified-Since",
    "Keep-Alive",
    "Range",
    "X-Forwarded-For",
    "Via",
    "Transfer-Encoding",
];

/// Index of Content-Length (`H_CONTENT_LENGTH`).
pub const H_CONTENT_LENGTH: usize = 7;
/// Index of Transfer-Encoding (`H_TRANSFER_ENCODING`); lsphp ignores this slot.
pub const H_TRANSFER_ENCODING: usize = 24;

/// The index slot of a header name (ASCII case-insensitive), or `None` for a header that
/// goes to the unknown-header table.
pub fn known_header_index(name: &[u8]) -> Option<usize> {
    KNOWN_HEADERS
        .iter()
        .position(|k| k.as_bytes().eq_ignore_ascii_case(name))
}
