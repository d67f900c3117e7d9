//! The FCGI_PARAMS stream of a request to corral's FastCGI front, collected for the front
//! logic: the records' content appended to one buffer in the order it came (pair encoding
//! needs no translation: it is [`CgiParams`](crate::cgi::CgiParams)'s own form), each pair
//! bounded by [`Limits`] as soon as its lengths are in and indexed once it is wholly in
//! ([`FrontParams`]). It refuses exactly what [`ParamsDecoder`](super::ParamsDecoder) refuses,
//! with the same errors, at the same record.

use bytes::Bytes;

use super::params::{admit_pair, read_lengths, ParamsCollector};
use super::FastCgiError;
use crate::cgi::FrontParams;
use crate::Limits;

/// Bytes a length takes in its shortest form.
fn short_prefix(len: usize) -> usize {
    if len < 0x80 {
        1
    } else {
        4
    }
}

/// Collects one FCGI_PARAMS stream into [`FrontParams`].
#[derive(Debug, Clone)]
pub struct FrontParamsDecoder {
    limits: Limits,
    params: FrontParams,
    /// Bytes of the buffer holding whole pairs, indexed; the rest is a pair not yet whole.
    parsed: usize,
    total: usize,
    /// Whether the limits admit every name and value a one-byte length can give (below
    /// 128 bytes): such a pair then needs only the count checked.
    short_admitted: bool,
}

impl FrontParamsDecoder {
    /// A collector for one stream bounded by `limits`.
    pub fn new(limits: &Limits) -> FrontParamsDecoder {
        FrontParamsDecoder {
            limits: limits.clone(),
            params: FrontParams::new(),
            parsed: 0,
            total: 0,
            short_admitted: limits.max_name_len >= 0x7f && limits.max_value_len >= 0x7f,
        }
    }

    /// Feeds the content of the next FCGI_PARAMS record.
    pub fn push(&mut self, content: &[u8]) -> Result<(), FastCgiError> {
        self.total = self.total.saturating_add(content.len());
        if self.total > self.limits.max_params_bytes || u32::try_from(self.total).is_err() {
            return Err(FastCgiError::ParamsTooLarge {
                len: self.total,
                limit: self.limits.max_params_bytes,
            });
        }
        self.params.reserve_for(content.len());
        self.params.buf_mut().extend_from_slice(content);
        if self.short_admitted {
            // Most pairs in one loop; it stops at the first one that needs more than it
            // does, which the loop below takes (a count past the limit is refused there).
            self.parsed = self
                .params
                .index_short_run(self.parsed, self.limits.max_params_count);
        }
        loop {
            let rest = self.params.encoded().get(self.parsed..).unwrap_or_default();
            // Both lengths in their one-byte form (most pairs a front server sends): the
            // same checks in the same order, those the limits cannot fail left out.
            if let (&[name_len, value_len, ..], true) = (rest, self.short_admitted) {
                if (name_len | value_len) < 0x80 {
                    let lens = (2, usize::from(name_len), usize::from(value_len));
                    if self.params.len() >= self.limits.max_params_count {
                        admit_pair(&self.limits, self.params.len(), lens)?;
                    }
                    let whole = 2 + lens.1 + lens.2;
                    if rest.len() < whole {
                        return Ok(());
                    }
                    self.params.index(self.parsed, 2, lens.1, lens.2);
                    self.parsed += whole;
                    continue;
                }
            }
            if rest.is_empty() {
                return Ok(());
            }
            let Some(lens) = read_lengths(rest) else {
                return Ok(());
            };
            admit_pair(&self.limits, self.params.len(), lens)?;
            let (prefix, name_len, value_len) = lens;
            let whole = prefix + name_len + value_len;
            if rest.len() < whole {
                return Ok(());
            }
            // Two bytes of lengths are both in their one-byte form, the shortest.
            if prefix != 2 && prefix != short_prefix(name_len) + short_prefix(value_len) {
                self.params.note_long_prefix();
            }
            self.params.index(self.parsed, prefix, name_len, value_len);
            self.parsed += whole;
        }
    }

    /// Ends the stream: its pairs, and the collector ready for another. Fails if the stream
    /// stopped inside a pair.
    pub fn finish(&mut self) -> Result<FrontParams, FastCgiError> {
        let rest = self.params.encoded().get(self.parsed..).unwrap_or_default();
        if !rest.is_empty() {
            let missing = match read_lengths(rest) {
                Some((prefix, name_len, value_len)) => prefix + name_len + value_len - rest.len(),
                None => 1,
            };
            return Err(FastCgiError::TruncatedPair { missing });
        }
        self.parsed = 0;
        self.total = 0;
        Ok(std::mem::take(&mut self.params))
    }
}

impl ParamsCollector for FrontParamsDecoder {
    type Block = FrontParams;

    fn new(limits: &Limits) -> Self {
        FrontParamsDecoder::new(limits)
    }

    fn push(&mut self, content: Bytes) -> Result<(), FastCgiError> {
        FrontParamsDecoder::push(self, &content)
    }

    const COPIES: bool = true;

    fn push_slice(&mut self, content: &[u8]) -> Result<(), FastCgiError> {
        FrontParamsDecoder::push(self, content)
    }

    fn finish(&mut self) -> Result<FrontParams, FastCgiError> {
        FrontParamsDecoder::finish(self)
    }
}
