//! The CGI response head (RFC 3875 §6): an incremental, bounded parser for the head a backend
//! writes (php-cgi on FastCGI STDOUT, an SCGI or LSAPI app) and an encoder for when corral is
//! the responder.
//!
//! The head is header lines ending in CRLF or LF, then a blank line; the body follows. Parsing
//! is strict because a backend is a peer too: a line without a colon, an obs-fold continuation,
//! a bare CR or a control byte in a value is an error, never passed through (the class of bug
//! behind OpenBSD httpd's FastCGI header injection and CVE-2025-1734). `Status:` and
//! `Location:` are interpreted as RFC 3875 §6.2 says: see [`ResponseKind`].

use std::ops::Range;

use bytes::{Bytes, BytesMut};

use crate::ascii::eq_ignore_case;
use crate::Limits;

/// The status a backend gave in a `Status:` line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CgiStatus {
    /// Three-digit code, 100 to 999.
    pub code: u16,
    /// Reason phrase, empty when none was given.
    pub reason: Bytes,
}

/// A parsed CGI response head.
///
/// Its fields are reached through accessors so that the head can carry a mark: "decoded, and
/// not edited since". The decoder sets it on the heads it returns (it refuses everything
/// [`encode_head`] refuses); every way of changing a head ([`set_status`](Self::set_status),
/// [`headers_mut`](Self::headers_mut)) clears it, and a head built with [`new`](Self::new)
/// has none. `encode_head` writes a marked head without checking it again and checks every
/// other one, so no head that was built or edited is written unchecked. The mark is no part
/// of equality.
#[derive(Debug, Clone, Default)]
pub struct CgiResponseHead {
    status: Option<CgiStatus>,
    headers: Vec<(Bytes, Bytes)>,
    /// Set by the decoder only; cleared by every `&mut` access to the fields.
    decoded: bool,
}

impl PartialEq for CgiResponseHead {
    fn eq(&self, other: &Self) -> bool {
        self.status == other.status && self.headers == other.headers
    }
}

impl Eq for CgiResponseHead {}

/// What the gateway must do with a response (RFC 3875 §6.2).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ResponseKind<'a> {
    /// A document: send the status (200 by default), headers and body.
    Document,
    /// A `Location:` starting with `/` and no `Status:`: the gateway must serve that
    /// path-and-query as if the client had requested it (as a GET), and send nothing of this
    /// response (RFC 3875 §6.2.2).
    LocalRedirect {
        /// The path and query to serve.
        location: &'a [u8],
    },
    /// Any other `Location:`: a redirect sent to the client, status 302 unless the backend
    /// gave one (RFC 3875 §6.2.3, §6.2.4).
    ClientRedirect {
        /// The target, passed on as the Location header.
        location: &'a [u8],
    },
}

impl CgiResponseHead {
    /// A head with `status` (the `Status:` line, if any) and every other header line in
    /// order, `Location` among them. It is checked when it is encoded.
    pub fn new(status: Option<CgiStatus>, headers: Vec<(Bytes, Bytes)>) -> Self {
        CgiResponseHead {
            status,
            headers,
            decoded: false,
        }
    }

    /// The `Status:` line, if the backend wrote one.
    pub fn status(&self) -> Option<&CgiStatus> {
        self.status.as_ref()
    }

    /// Every other header line in order, names as written, values without surrounding
    /// whitespace. `Location` stays in this list.
    pub fn headers(&self) -> &[(Bytes, Bytes)] {
        &self.headers
    }

    /// Replaces the `Status:` line; the head is checked again when it is encoded.
    pub fn set_status(&mut self, status: Option<CgiStatus>) {
        self.decoded = false;
        self.status = status;
    }

    /// The header lines, to change; the head is checked again when it is encoded.
    pub fn headers_mut(&mut self) -> &mut Vec<(Bytes, Bytes)> {
        self.decoded = false;
        &mut self.headers
    }

    /// The status line and the header lines, taken apart.
    pub fn into_parts(self) -> (Option<CgiStatus>, Vec<(Bytes, Bytes)>) {
        (self.status, self.headers)
    }

    /// Whether this head came from the decoder and was not changed since: [`encode_head`]
    /// writes it without checking it again.
    pub fn is_decoded(&self) -> bool {
        self.decoded
    }

    /// The value of the first header named `name` (ASCII case-insensitive).
    pub fn header(&self, name: &[u8]) -> Option<&Bytes> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v)
    }

    /// The `Location:` value, if any.
    pub fn location(&self) -> Option<&Bytes> {
        self.header(b"location")
    }

    /// How the gateway must treat this response.
    pub fn kind(&self) -> ResponseKind<'_> {
        match self.location() {
            None => ResponseKind::Document,
            Some(l) if l.starts_with(b"/") && self.status.is_none() => {
                ResponseKind::LocalRedirect { location: l }
            }
            Some(l) => ResponseKind::ClientRedirect { location: l },
        }
    }

    /// The status to send the client: the `Status:` code, else 302 with a `Location:`, else
    /// 200. Meaningless for a [`ResponseKind::LocalRedirect`].
    pub fn status_code(&self) -> u16 {
        match (&self.status, self.location()) {
            (Some(s), _) => s.code,
            (None, Some(_)) => 302,
            (None, None) => 200,
        }
    }
}

/// A rule the response head broke.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CgiResponseError {
    /// No blank line within `max_response_head_bytes`.
    #[error("CGI response head has no blank line within {limit} bytes")]
    HeadTooLarge {
        /// The limit.
        limit: usize,
    },
    /// More header lines than `max_response_headers`.
    #[error("CGI response head has more than {limit} header lines")]
    TooManyHeaders {
        /// The limit.
        limit: usize,
    },
    /// A line starting with space or tab (obsolete line folding).
    #[error("CGI response header line {line} starts with whitespace (obs-fold is refused)")]
    ObsFold {
        /// 1-based line number.
        line: usize,
    },
    /// A CR not followed by LF.
    #[error("CGI response header line {line} holds a CR that does not end the line")]
    BareCr {
        /// 1-based line number.
        line: usize,
    },
    /// A header line without `:`.
    #[error("CGI response header line {line} has no ':'")]
    MissingColon {
        /// 1-based line number.
        line: usize,
    },
    /// A header name that is not an HTTP token (empty, or with spaces or separators).
    #[error("CGI response header name \"{}\" is not an HTTP token", .name.escape_ascii())]
    InvalidName {
        /// The start of the name.
        name: Vec<u8>,
    },
    /// A header value with a control byte (NUL, CR, LF, DEL, ...), or, when encoding,
    /// surrounding whitespace.
    #[error("value of CGI response header \"{}\" holds a control byte or surrounding whitespace", .name.escape_ascii())]
    InvalidValue {
        /// The start of the header name.
        name: Vec<u8>,
    },
    /// A `Status:` value that is not a code from 100 to 999 and an optional reason.
    #[error("CGI Status \"{}\" is not a code from 100 to 999 and an optional reason", .value.escape_ascii())]
    InvalidStatus {
        /// The start of the value.
        value: Vec<u8>,
    },
    /// `Status:` given twice (or, when encoding, a `Status` entry among the headers).
    #[error("CGI response gives Status twice")]
    DuplicateStatus,
    /// `Location:` given twice.
    #[error("CGI response gives Location twice")]
    DuplicateLocation,
    /// An empty `Location:`, or one with whitespace inside.
    #[error("CGI Location \"{}\" is empty or holds whitespace", .value.escape_ascii())]
    InvalidLocation {
        /// The start of the value.
        value: Vec<u8>,
    },
}

impl CgiResponseError {
    /// Whether the head was well formed (lines with a colon, a blank line within the limits)
    /// and only a field in it broke a rule: a name that is not a token, a control byte in a
    /// value, a bad `Status:` or `Location:`. Such an error is the application's (a script
    /// that reflects input into a header), not a sign that the stream is out of step; the
    /// others may be either, where the head is all the framing there is (SCGI).
    pub fn is_field_error(&self) -> bool {
        matches!(
            self,
            CgiResponseError::InvalidName { .. }
                | CgiResponseError::InvalidValue { .. }
                | CgiResponseError::InvalidStatus { .. }
                | CgiResponseError::DuplicateStatus
                | CgiResponseError::DuplicateLocation
                | CgiResponseError::InvalidLocation { .. }
        )
    }
}

/// How many bytes of an offending value an error quotes.
const SNIPPET_LEN: usize = 64;

fn snippet(b: &[u8]) -> Vec<u8> {
    b.get(..SNIPPET_LEN).unwrap_or(b).to_vec()
}

/// Header lines a head holds without the parser allocating: more than most applications send.
const INLINE_FIELDS: usize = 16;

/// The name and value ranges of a head's header lines, the first [`INLINE_FIELDS`] inline, so
/// that parsing a head allocates only the list it returns.
#[derive(Debug, Clone, Default)]
struct Fields {
    inline: [[u32; 4]; INLINE_FIELDS],
    len: usize,
    more: Vec<[u32; 4]>,
}

impl Fields {
    fn clear(&mut self) {
        self.len = 0;
        self.more.clear();
    }

    /// Offsets past `u32::MAX` (never, under any head limit) are clamped, and then clamped
    /// again to the head when sliced.
    fn push(&mut self, name: Range<usize>, value: Range<usize>) {
        let field = [name.start, name.end, value.start, value.end]
            .map(|at| u32::try_from(at).unwrap_or(u32::MAX));
        match self.inline.get_mut(self.len) {
            Some(slot) => *slot = field,
            None => self.more.push(field),
        }
        self.len += 1;
    }

    fn iter(&self) -> impl Iterator<Item = (Range<usize>, Range<usize>)> + '_ {
        let at = |n: u32| usize::try_from(n).unwrap_or(usize::MAX);
        self.inline
            .iter()
            .take(self.len)
            .chain(&self.more)
            .map(move |&[a, b, c, d]| (at(a)..at(b), at(c)..at(d)))
    }
}

/// Incremental parser of one CGI response head.
///
/// Call [`decode`](Self::decode) each time bytes are appended to the same buffer. It returns
/// `Ok(None)` until the blank line has arrived, then removes the head from the buffer and
/// returns it, leaving the body bytes in place. The buffer must not be changed between calls
/// except by appending; lines already checked are not scanned again. After a head (or an
/// error) the decoder is ready for the next response.
#[derive(Debug, Clone)]
pub struct CgiResponseDecoder {
    max_bytes: usize,
    max_headers: usize,
    /// Offset of the first byte not yet scanned (the start of the current line).
    scanned: usize,
    /// Header lines seen so far.
    lines: usize,
    /// Status code and reason range, once seen.
    status: Option<(u16, Range<usize>)>,
    /// Name and value ranges of the other header lines.
    fields: Fields,
    location_seen: bool,
}

impl CgiResponseDecoder {
    /// A decoder bounded by `limits.max_response_head_bytes` and
    /// `limits.max_response_headers`.
    pub fn new(limits: &Limits) -> Self {
        CgiResponseDecoder {
            max_bytes: limits.max_response_head_bytes,
            max_headers: limits.max_response_headers,
            scanned: 0,
            lines: 0,
            status: None,
            fields: Fields::default(),
            location_seen: false,
        }
    }

    /// Makes this decoder what [`new`](Self::new) with `limits` makes, in place: its field
    /// table is left as it is (only its length is cleared), so a kept decoder starts the next
    /// response without its table being written again.
    pub fn restart(&mut self, limits: &Limits) {
        self.max_bytes = limits.max_response_head_bytes;
        self.max_headers = limits.max_response_headers;
        self.reset();
    }

    fn reset(&mut self) {
        self.scanned = 0;
        self.lines = 0;
        self.status = None;
        self.fields.clear();
        self.location_seen = false;
    }

    /// Parses the head once its blank line is in `src`; see the type's documentation.
    pub fn decode(
        &mut self,
        src: &mut BytesMut,
    ) -> Result<Option<CgiResponseHead>, CgiResponseError> {
        let result = self.scan(src).map(|end| {
            end.map(|next| {
                let head = src.split_to(next).freeze();
                self.build(&head)
            })
        });
        if !matches!(result, Ok(None)) {
            self.reset();
        }
        result
    }

    /// [`decode`](Self::decode) for a head that may be whole in `src` already (one FastCGI
    /// STDOUT record, one LSAPI packet): the head is split off `src` without a copy. On
    /// `Ok(None)` nothing is consumed, and the caller goes on with a buffer that starts
    /// with the same bytes (a copy of `src`, then appended to) and [`decode`](Self::decode).
    pub fn decode_bytes(
        &mut self,
        src: &mut Bytes,
    ) -> Result<Option<CgiResponseHead>, CgiResponseError> {
        let result = self.scan(src).map(|end| {
            end.map(|next| {
                let head = src.split_to(next);
                self.build(&head)
            })
        });
        if !matches!(result, Ok(None)) {
            self.reset();
        }
        result
    }

    /// Scans the lines not yet scanned; the length of the head (up to and including its
    /// blank line) once it is complete.
    fn scan(&mut self, src: &[u8]) -> Result<Option<usize>, CgiResponseError> {
        loop {
            let rest = src.get(self.scanned..).unwrap_or_default();
            // The usual line, whole and breaking no rule, is found and checked in one pass;
            // anything else (the blank line, a line not whole yet, any broken rule) takes
            // the steps below, which name the rule. Both give the same result.
            if let Some(line) = clean_line(rest) {
                let start = self.scanned;
                let next = start + line.next;
                if next > self.max_bytes {
                    return Err(CgiResponseError::HeadTooLarge {
                        limit: self.max_bytes,
                    });
                }
                self.lines += 1;
                if self.lines > self.max_headers {
                    return Err(CgiResponseError::TooManyHeaders {
                        limit: self.max_headers,
                    });
                }
                let text = rest.get(..line.end).unwrap_or_default();
                self.field(text, start, line.colon, line.value)?;
                self.scanned = next;
                continue;
            }
            let Some(lf) = rest.iter().position(|&c| c == b'\n') else {
                if src.len() >= self.max_bytes {
                    return Err(CgiResponseError::HeadTooLarge {
                        limit: self.max_bytes,
                    });
                }
                return Ok(None);
            };
            let start = self.scanned;
            let end = start + lf;
            let next = end + 1;
            if next > self.max_bytes {
                return Err(CgiResponseError::HeadTooLarge {
                    limit: self.max_bytes,
                });
            }
            let end = if end > start && src.get(end - 1) == Some(&b'\r') {
                end - 1
            } else {
                end
            };
            if end == start {
                return Ok(Some(next));
            }
            self.lines += 1;
            if self.lines > self.max_headers {
                return Err(CgiResponseError::TooManyHeaders {
                    limit: self.max_headers,
                });
            }
            self.line(src.get(start..end).unwrap_or_default(), start)?;
            self.scanned = next;
        }
    }

    /// Checks one header line (without its line ending) found at offset `at`.
    fn line(&mut self, line: &[u8], at: usize) -> Result<(), CgiResponseError> {
        let (colon, value) = match well_formed(line) {
            Some(parts) => parts,
            None => self.line_error(line)?,
        };
        self.field(line, at, colon, value)
    }

    /// Takes in a well-formed header line found at offset `at`: its colon's offset and its
    /// value's range (relative to what follows the colon, trimmed).
    fn field(
        &mut self,
        line: &[u8],
        at: usize,
        colon: usize,
        value: Range<usize>,
    ) -> Result<(), CgiResponseError> {
        let name = line.get(..colon).unwrap_or_default();
        let raw_value = line.get(colon + 1..).unwrap_or_default();
        let value_bytes = raw_value.get(value.clone()).unwrap_or_default();
        // Ranges relative to the value are moved to offsets in the whole head.
        let shift = |r: Range<usize>| r.start + at + colon + 1..r.end + at + colon + 1;
        if eq_ignore_case(name, b"status") {
            if self.status.is_some() {
                return Err(CgiResponseError::DuplicateStatus);
            }
            let (code, reason) = parse_status(value_bytes)?;
            let base = value.start;
            self.status = Some((code, shift(reason.start + base..reason.end + base)));
            return Ok(());
        }
        if name.eq_ignore_ascii_case(b"location") {
            if std::mem::replace(&mut self.location_seen, true) {
                return Err(CgiResponseError::DuplicateLocation);
            }
            check_location(value_bytes)?;
        }
        self.fields.push(at..at + colon, shift(value));
        Ok(())
    }

    /// The checks of a header line one by one, in the order their errors take precedence,
    /// for a line [`well_formed`] refused: the error that names what is wrong. (Returns the
    /// parts should the line pass them all, which `well_formed` rules out.)
    fn line_error(&self, line: &[u8]) -> Result<(usize, Range<usize>), CgiResponseError> {
        let n = self.lines;
        if line.contains(&b'\r') {
            return Err(CgiResponseError::BareCr { line: n });
        }
        if matches!(line.first(), Some(b' ' | b'\t')) {
            return Err(CgiResponseError::ObsFold { line: n });
        }
        let colon = line
            .iter()
            .position(|&c| c == b':')
            .ok_or(CgiResponseError::MissingColon { line: n })?;
        let name = line.get(..colon).unwrap_or_default();
        if !is_token(name) {
            return Err(CgiResponseError::InvalidName {
                name: snippet(name),
            });
        }
        let raw_value = line.get(colon + 1..).unwrap_or_default();
        let value = trim_ows(raw_value);
        let value_bytes = raw_value.get(value.clone()).unwrap_or_default();
        if !is_field_value(value_bytes.iter().copied()) {
            return Err(CgiResponseError::InvalidValue {
                name: snippet(name),
            });
        }
        Ok((colon, value))
    }

    fn build(&self, head: &Bytes) -> CgiResponseHead {
        let slice = |r: &Range<usize>| head.slice(r.start.min(head.len())..r.end.min(head.len()));
        // Sized once: the count is known.
        let mut headers = Vec::with_capacity(self.fields.len);
        for (n, v) in self.fields.iter() {
            headers.push((slice(&n), slice(&v)));
        }
        // Every line passed the decoder's checks, which refuse all that `encode_head` refuses
        // (the fuzz target `cgi_response` re-encodes every head it decodes, checks and all).
        CgiResponseHead {
            status: self.status.as_ref().map(|(code, reason)| CgiStatus {
                code: *code,
                reason: slice(reason),
            }),
            headers,
            decoded: true,
        }
    }
}

#[path = "cgi_response_lines.rs"]
mod lines;
use lines::{
    check_location, clean_line, is_field_value, is_token, parse_status, trim_ows, well_formed,
};

#[path = "cgi_response_encode.rs"]
mod encode;
pub use encode::{encode_head, encoded_len};

#[cfg(test)]
#[path = "cgi_response_tests.rs"]
mod tests;
