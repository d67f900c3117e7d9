//! The SCGI request header block: NUL-terminated name/value pairs inside the netstring,
//! CONTENT_LENGTH first, `SCGI` = `1`, no name twice.
//!
//! The client role encodes it (CONTENT_LENGTH, then SCGI, then the caller's variables); the
//! responder role decodes it, checking every pair against the [`Limits`] and returning the
//! names and values as slices of the received payload.

use std::ops::Range;

use bytes::{BufMut, Bytes, BytesMut};

use super::{snippet, ScgiError};
use crate::Limits;

const CONTENT_LENGTH: &[u8] = b"CONTENT_LENGTH";
const SCGI: &[u8] = b"SCGI";
/// The only SCGI version.
const SCGI_VERSION: &[u8] = b"1";

/// A decoded SCGI request header block.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScgiRequestHead {
    /// The body length (CONTENT_LENGTH).
    pub content_length: u64,
    /// Every other header in order, without CONTENT_LENGTH and SCGI.
    pub params: Vec<(Bytes, Bytes)>,
}

impl ScgiRequestHead {
    /// Writes this head as the netstring that starts an SCGI request.
    pub fn encode(&self, limits: &Limits, dst: &mut BytesMut) -> Result<(), ScgiError> {
        encode_request_head(self.content_length, &self.params, limits, dst)
    }

    /// Parses a netstring payload (see [`super::NetstringDecoder`]) as a header block.
    pub fn decode(payload: Bytes, limits: &Limits) -> Result<Self, ScgiError> {
        let mut params: Vec<(Bytes, Bytes)> = Vec::new();
        let mut length_pair = true;
        let content_length = walk(&payload, limits, |name, value| {
            // CONTENT_LENGTH is kept out of `params`.
            if !std::mem::take(&mut length_pair) {
                params.push((payload.slice(name), payload.slice(value)));
            }
        })?;
        Ok(ScgiRequestHead {
            content_length,
            params,
        })
    }
}

/// What the responder decodes a header block into: [`ScgiRequestHead`], or a form of its
/// own for a caller that has one ([`super::ScgiFrontHead`]).
pub trait ScgiHead: Sized {
    /// Parses a netstring payload as a header block, refusing what
    /// [`ScgiRequestHead::decode`] refuses.
    fn decode(payload: Bytes, limits: &Limits) -> Result<Self, ScgiError>;

    /// The body length (CONTENT_LENGTH).
    fn content_length(&self) -> u64;
}

impl ScgiHead for ScgiRequestHead {
    fn decode(payload: Bytes, limits: &Limits) -> Result<Self, ScgiError> {
        ScgiRequestHead::decode(payload, limits)
    }

    fn content_length(&self) -> u64 {
        self.content_length
    }
}

/// Checks every rule of a header block and hands each pair but SCGI to `pair`, as ranges of
/// `payload`, in order (CONTENT_LENGTH first, once its value is known to be a length);
/// returns CONTENT_LENGTH.
pub(super) fn walk(
    payload: &[u8],
    limits: &Limits,
    mut pair: impl FnMut(Range<usize>, Range<usize>),
) -> Result<u64, ScgiError> {
    let mut at = 0;
    let mut count = 0usize;
    let mut content_length = None;
    let mut scgi_seen = false;
    let mut names = Names::default();
    while at < payload.len() {
        let name_at = at..field_end(payload, at)?;
        let value_at = name_at.end + 1..field_end(payload, name_at.end + 1)?;
        at = value_at.end + 1;
        let name = payload.get(name_at.clone()).unwrap_or_default();
        let value = payload.get(value_at.clone()).unwrap_or_default();
        count += 1;
        if count > limits.max_params_count {
            return Err(ScgiError::TooManyParams {
                limit: limits.max_params_count,
            });
        }
        check_pair(name, value, limits)?;
        if content_length.is_none() {
            if name != CONTENT_LENGTH {
                return Err(ScgiError::ContentLengthNotFirst {
                    found: snippet(name),
                });
            }
            content_length = Some(parse_decimal(value)?);
            pair(name_at, value_at);
            continue;
        }
        // SCGI is not handed on: its repeat is caught by `scgi_seen`. The earlier names are
        // read again from the payload, only for a name whose class was seen before.
        let before = payload.get(..name_at.start).unwrap_or_default();
        if name == CONTENT_LENGTH
            || (name == SCGI && scgi_seen)
            || !names.insert(name, || earlier_names(before))
        {
            return Err(ScgiError::DuplicateName {
                name: snippet(name),
            });
        }
        if name == SCGI {
            if value != SCGI_VERSION {
                return Err(ScgiError::ScgiVersion {
                    value: snippet(value),
                });
            }
            scgi_seen = true;
        } else {
            pair(name_at, value_at);
        }
    }
    let content_length =
        content_length.ok_or(ScgiError::ContentLengthNotFirst { found: Vec::new() })?;
    if !scgi_seen {
        return Err(ScgiError::MissingScgi);
    }
    Ok(content_length)
}

/// Where the field starting at `at` ends: its NUL.
fn field_end(payload: &[u8], at: usize) -> Result<usize, ScgiError> {
    payload
        .get(at..)
        .and_then(|rest| rest.iter().position(|&c| c == 0))
        .map(|nul| at + nul)
        .ok_or(ScgiError::TruncatedPair)
}

/// The names of the whole pairs in `block` (the start of a header block), CONTENT_LENGTH
/// and SCGI among them: neither can be a later pair's name without being refused anyway.
fn earlier_names(block: &[u8]) -> impl Iterator<Item = &[u8]> {
    block
        .split(|&c| c == 0)
        .step_by(2)
        .filter(|n| !n.is_empty())
}

fn check_pair(name: &[u8], value: &[u8], limits: &Limits) -> Result<(), ScgiError> {
    if name.is_empty() {
        return Err(ScgiError::EmptyName);
    }
    if name.len() > limits.max_name_len {
        return Err(ScgiError::NameTooLong {
            name: snippet(name),
            limit: limits.max_name_len,
        });
    }
    if value.len() > limits.max_value_len {
        return Err(ScgiError::ValueTooLong {
            name: snippet(name),
            limit: limits.max_value_len,
        });
    }
    Ok(())
}

/// A non-empty run of ASCII digits that fits in a u64 (the spec allows leading zeros).
fn parse_decimal(value: &[u8]) -> Result<u64, ScgiError> {
    let bad = || ScgiError::InvalidContentLength {
        value: snippet(value),
    };
    if value.is_empty() {
        return Err(bad());
    }
    value.iter().try_fold(0u64, |n, &c| {
        if !c.is_ascii_digit() {
            return Err(bad());
        }
        n.checked_mul(10)
            .and_then(|n| n.checked_add(u64::from(c - b'0')))
            .ok_or_else(bad)
    })
}

/// Writes the netstring that starts an SCGI request: CONTENT_LENGTH, then `SCGI` = `1`, then
/// `params` in order. The body (exactly `content_length` bytes) follows it on the wire.
///
/// Refuses what a responder would refuse: an empty name, NUL in a name or value, a name given
/// twice, CONTENT_LENGTH or SCGI among `params`, and anything over the [`Limits`].
pub fn encode_request_head(
    content_length: u64,
    params: &[(impl AsRef<[u8]>, impl AsRef<[u8]>)],
    limits: &Limits,
    dst: &mut BytesMut,
) -> Result<(), ScgiError> {
    let content_length = content_length.to_string();
    let fixed = [
        (CONTENT_LENGTH, content_length.as_bytes()),
        (SCGI, SCGI_VERSION),
    ];
    let count = params.len() + fixed.len();
    if count > limits.max_params_count {
        return Err(ScgiError::TooManyParams {
            limit: limits.max_params_count,
        });
    }
    let mut names = Names::default();
    let mut len = fixed
        .iter()
        .map(|(n, v)| n.len() + v.len() + 2)
        .sum::<usize>();
    for (i, (name, value)) in params.iter().enumerate() {
        let (name, value) = (name.as_ref(), value.as_ref());
        check_pair(name, value, limits)?;
        if name.contains(&0) || value.contains(&0) {
            return Err(ScgiError::NulInParam {
                name: snippet(name),
            });
        }
        if name == CONTENT_LENGTH || name == SCGI {
            return Err(ScgiError::ReservedName {
                name: name.to_vec(),
            });
        }
        let before = params.get(..i).unwrap_or_default();
        if !names.insert(name, || before.iter().map(|(n, _)| n.as_ref())) {
            return Err(ScgiError::DuplicateName {
                name: snippet(name),
            });
        }
        len = len.saturating_add(name.len() + value.len() + 2);
    }
    if len > limits.max_params_bytes {
        return Err(ScgiError::HeaderTooLarge {
            len,
            limit: limits.max_params_bytes,
        });
    }
    let digits = len.to_string();
    dst.reserve(digits.len() + len + 2);
    dst.put_slice(digits.as_bytes());
    dst.put_u8(b':');
    let pairs = fixed
        .iter()
        .map(|&(n, v)| (n, v))
        .chain(params.iter().map(|(n, v)| (n.as_ref(), v.as_ref())));
    for (name, value) in pairs {
        dst.put_slice(name);
        dst.put_u8(0);
        dst.put_slice(value);
        dst.put_u8(0);
    }
    dst.put_u8(b',');
    Ok(())
}

/// The names of one head seen so far, for refusing a repeat without a hash set per head: a
/// bit per (length, first byte, last byte) class says which names may have been seen, and
/// only a name whose class bit is set is compared with the earlier ones.
#[derive(Default)]
struct Names(u64);

impl Names {
    /// Records `name`; false if it is among `earlier` (the names recorded before it).
    fn insert<'a, I: Iterator<Item = &'a [u8]>>(
        &mut self,
        name: &[u8],
        earlier: impl FnOnce() -> I,
    ) -> bool {
        let (first, last) = (name.first().copied(), name.last().copied());
        let h =
            name.len() ^ usize::from(first.unwrap_or(0)) << 2 ^ usize::from(last.unwrap_or(0)) << 4;
        let bit = 1u64 << (h % 64);
        if self.0 & bit != 0 && earlier().any(|n| n == name) {
            return false;
        }
        self.0 |= bit;
        true
    }
}
