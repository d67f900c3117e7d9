//! The bounds every decoder checks peer-supplied lengths against.
//!
//! One value is passed to every decoder so that an operator can tighten or loosen all of them
//! in one place. The defaults are generous for real traffic (nginx's own defaults are smaller)
//! and small enough that a hostile peer cannot make corral allocate more than a few hundred
//! KiB per connection before the exchange is refused.

/// Bounds on what a peer may make a decoder buffer or track.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Limits {
    /// Total bytes of one request's parameter block: a FastCGI PARAMS stream, an SCGI
    /// netstring header, or an LSAPI BEGIN_REQUEST packet's header and environment.
    pub max_params_bytes: usize,
    /// Number of name-value pairs in one parameter block.
    pub max_params_count: usize,
    /// Bytes of one parameter or header name.
    pub max_name_len: usize,
    /// Bytes of one parameter or header value.
    pub max_value_len: usize,
    /// Bytes of a CGI response head (status and header lines up to the blank line).
    pub max_response_head_bytes: usize,
    /// Header lines in one CGI response head.
    pub max_response_headers: usize,
    /// Length of one LSAPI packet (header included) other than BEGIN_REQUEST, whose bound is
    /// `max_params_bytes`.
    pub max_packet_len: usize,
    /// FastCGI requests one connection may have in flight at once (multiplexing).
    pub max_concurrent_requests: usize,
}

impl Limits {
    /// The defaults: 64 KiB of parameters in at most 1,000 pairs, names up to 1 KiB and
    /// values up to 16 KiB, a 64 KiB response head of at most 200 lines, LSAPI packets up to
    /// 1 MiB, and 128 multiplexed FastCGI requests per connection.
    pub const DEFAULT: Limits = Limits {
        max_params_bytes: 64 * 1024,
        max_params_count: 1000,
        max_name_len: 1024,
        max_value_len: 16 * 1024,
        max_response_head_bytes: 64 * 1024,
        max_response_headers: 200,
        max_packet_len: 1024 * 1024,
        max_concurrent_requests: 128,
    };
}

impl Default for Limits {
    fn default() -> Self {
        Limits::DEFAULT
    }
}
