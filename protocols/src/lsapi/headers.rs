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
    // The length first: most names are then compared with no byte of theirs read.
    KNOWN_HEADERS
        .iter()
        .position(|k| k.len() == name.len() && k.as_bytes().eq_ignore_ascii_case(name))
}

/// The index slot of a header name spelled exactly as [`KNOWN_HEADERS`] spells it
/// (`Content-Type`, not `content-type`): what [`known_header_index`] finds for such a name,
/// in a few comparisons (the names are told apart by length first).
pub fn known_header_exact(name: &[u8]) -> Option<usize> {
    Some(match name {
        b"Accept" => 0,
        b"Accept-Charset" => 1,
        b"Accept-Encoding" => 2,
        b"Accept-Language" => 3,
        b"Authorization" => 4,
        b"Connection" => 5,
        b"Content-Type" => 6,
        b"Content-Length" => 7,
        b"Cookie" => 8,
        b"Cookie2" => 9,
        b"Host" => 10,
        b"Pragma" => 11,
        b"Referer" => 12,
        b"User-Agent" => 13,
        b"Cache-Control" => 14,
        b"If-Modified-Since" => 15,
        b"If-Match" => 16,
        b"If-None-Match" => 17,
        b"If-Range" => 18,
        b"If-Unmodified-Since" => 19,
        b"Keep-Alive" => 20,
        b"Range" => 21,
        b"X-Forwarded-For" => 22,
        b"Via" => 23,
        b"Transfer-Encoding" => 24,
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_exact_match_agrees_with_the_table() {
        for (i, name) in KNOWN_HEADERS.iter().enumerate() {
            assert_eq!(known_header_exact(name.as_bytes()), Some(i), "{name}");
            assert_eq!(known_header_index(name.as_bytes()), Some(i), "{name}");
            let lower = name.to_ascii_lowercase();
            assert_eq!(known_header_index(lower.as_bytes()), Some(i), "{lower}");
        }
        for name in ["X-Custom", "Hosts", "Accep", ""] {
            assert_eq!(known_header_exact(name.as_bytes()), None, "{name}");
            assert_eq!(known_header_index(name.as_bytes()), None, "{name}");
        }
    }
}
