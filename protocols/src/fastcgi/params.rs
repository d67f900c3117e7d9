//! FastCGI name-value pairs: the 1- and 4-byte length encoding, the PARAMS stream writer, and
//! the incremental decoder that reassembles pairs split across record boundaries, bounded by
//! [`Limits`].

use bytes::{Buf, BufMut, Bytes, BytesMut};

use super::record::{padding_for, RecordHeader, StreamWriter, HEADER_LEN, STREAM_CHUNK_LEN};
use super::{FastCgiError, RecordType};
use crate::cgi::CgiParams;
use crate::Limits;

/// Longest name or value a pair can carry: the 4-byte length form holds 31 bits.
pub const MAX_PAIR_FIELD_LEN: usize = 0x7fff_ffff;
/// Lengths up to this use the 1-byte form; longer ones use 4 bytes with the high bit set.
pub const MAX_SHORT_LEN: usize = 0x7f;

/// Bytes one length prefix takes on the wire.
const fn len_prefix_len(len: usize) -> usize {
    if len <= MAX_SHORT_LEN {
        1
    } else {
        4
    }
}

/// Bytes a pair with these field lengths takes on the wire, prefixes included.
pub const fn encoded_pair_len(name_len: usize, value_len: usize) -> usize {
    len_prefix_len(name_len) + len_prefix_len(value_len) + name_len + value_len
}

fn check_field(len: usize) -> Result<(), FastCgiError> {
    if len > MAX_PAIR_FIELD_LEN {
        return Err(FastCgiError::PairFieldTooLong { len });
    }
    Ok(())
}

/// The length prefix of one field, written into a small array (1 or 4 bytes used).
fn len_prefix(len: usize) -> ([u8; 4], usize) {
    if len <= MAX_SHORT_LEN {
        ([len as u8, 0, 0, 0], 1)
    } else {
        // Callers checked len <= MAX_PAIR_FIELD_LEN, so it fits 31 bits.
        ((len as u32 | 0x8000_0000).to_be_bytes(), 4)
    }
}

/// Appends one pair (lengths, name, value) without any record framing: the body of a
/// FCGI_GET_VALUES record, or a piece of a PARAMS stream built by hand.
pub fn encode_pair(name: &[u8], value: &[u8], dst: &mut BytesMut) -> Result<(), FastCgiError> {
    check_field(name.len())?;
    check_field(value.len())?;
    dst.reserve(encoded_pair_len(name.len(), value.len()));
    let (prefix, used) = len_prefix(name.len());
    dst.put_slice(prefix.get(..used).unwrap_or_default());
    let (prefix, used) = len_prefix(value.len());
    dst.put_slice(prefix.get(..used).unwrap_or_default());
    dst.put_slice(name);
    dst.put_slice(value);
    Ok(())
}

/// Writes a PARAMS stream pair by pair straight into the destination buffer. A pair is kept
/// inside one record whenever it fits one (php-cgi parses each PARAMS record on its own and
/// refuses a pair that straddles two); only a pair longer than a record is split. Call
/// [`finish`](Self::finish) to end the stream: until then the open record's header is a
/// zeroed placeholder.
#[derive(Debug)]
pub struct ParamsWriter<'a> {
    stream: StreamWriter<'a>,
}

impl<'a> ParamsWriter<'a> {
    /// Starts the PARAMS stream of `request_id` at the end of `dst`.
    pub fn new(request_id: u16, dst: &'a mut BytesMut) -> ParamsWriter<'a> {
        ParamsWriter {
            stream: StreamWriter::new(RecordType::Params, request_id, dst),
        }
    }

    /// Appends one pair; nothing is written when a field is too long for the wire format.
    pub fn push(&mut self, name: &[u8], value: &[u8]) -> Result<(), FastCgiError> {
        check_field(name.len())?;
        check_field(value.len())?;
        let len = encoded_pair_len(name.len(), value.len());
        if len > self.stream.room() && len <= STREAM_CHUNK_LEN {
            self.stream.close_record();
        }
        let (name_prefix, name_used) = len_prefix(name.len());
        let (value_prefix, value_used) = len_prefix(value.len());
        let parts = [
            name_prefix.get(..name_used).unwrap_or_default(),
            value_prefix.get(..value_used).unwrap_or_default(),
            name,
            value,
        ];
        if len <= self.stream.room() {
            self.stream.write_fitting(&parts, len);
        } else {
            for part in parts {
                self.stream.write(part);
            }
        }
        Ok(())
    }

    /// Closes the last record and appends the empty PARAMS record that ends the stream.
    pub fn finish(self) {
        self.stream.finish();
    }
}

/// Appends a whole PARAMS stream (records, then the empty end record) for `pairs`, with one
/// reserve of the exact size. Every field is checked before anything is written.
pub fn encode_params<N: AsRef<[u8]>, V: AsRef<[u8]>>(
    request_id: u16,
    pairs: &[(N, V)],
    dst: &mut BytesMut,
) -> Result<(), FastCgiError> {
    let mut layout = Layout::default();
    for (name, value) in pairs {
        let (name, value) = (name.as_ref(), value.as_ref());
        check_field(name.len())?;
        check_field(value.len())?;
        layout.add(encoded_pair_len(name.len(), value.len()));
    }
    let expected = layout.finish();
    dst.reserve(expected);
    let start = dst.len();
    let mut writer = ParamsWriter::new(request_id, dst);
    for (name, value) in pairs {
        writer.push(name.as_ref(), value.as_ref())?;
    }
    writer.finish();
    debug_assert_eq!(
        dst.len() - start,
        expected,
        "Layout disagrees with ParamsWriter"
    );
    Ok(())
}

/// Appends the PARAMS stream of `params`, already encoded as pairs: when they fit one record
/// (nearly every request: 65,528 bytes), its header, the block copied whole, the padding and
/// the empty end record; otherwise pair by pair as [`encode_params`] lays them out, so no
/// pair straddles two records.
pub fn encode_params_block(request_id: u16, params: &CgiParams, dst: &mut BytesMut) {
    let block = params.encoded();
    if block.is_empty() {
        dst.put_slice(&RecordHeader::new(RecordType::Params, request_id, 0).to_bytes());
        return;
    }
    if block.len() <= STREAM_CHUNK_LEN {
        // At most STREAM_CHUNK_LEN bytes, so the cast cannot truncate.
        let header = RecordHeader::new(RecordType::Params, request_id, block.len() as u16);
        dst.reserve(2 * HEADER_LEN + block.len() + usize::from(header.padding_len));
        dst.put_slice(&header.to_bytes());
        dst.put_slice(block);
        dst.put_bytes(0, usize::from(header.padding_len));
        dst.put_slice(&RecordHeader::new(RecordType::Params, request_id, 0).to_bytes());
        return;
    }
    let mut writer = ParamsWriter::new(request_id, dst);
    for (name, value) in params.iter() {
        // CgiParams holds only fields its 31-bit length form could encode.
        let _ = writer.push(name, value);
    }
    writer.finish();
}

/// Replays [`ParamsWriter`]'s record layout on pair lengths alone, to size the one reserve.
#[derive(Debug, Default)]
struct Layout {
    /// Bytes of closed records.
    closed: usize,
    /// Content bytes in the open record.
    open: usize,
}

impl Layout {
    fn close(&mut self) {
        if self.open > 0 {
            self.closed += HEADER_LEN + self.open + padding_for(self.open);
            self.open = 0;
        }
    }

    fn add(&mut self, pair_len: usize) {
        if pair_len > STREAM_CHUNK_LEN - self.open && pair_len <= STREAM_CHUNK_LEN {
            self.close();
        }
        let mut rest = pair_len;
        while rest > 0 {
            let now = rest.min(STREAM_CHUNK_LEN - self.open);
            self.open += now;
            rest -= now;
            if self.open == STREAM_CHUNK_LEN {
                self.close();
            }
        }
    }

    fn finish(mut self) -> usize {
        self.close();
        self.closed + HEADER_LEN
    }
}

/// Checks the declared lengths of a pair (`(prefix, name, value)` bytes), the next after
/// `count` pairs, against `limits` before any of it is buffered.
pub(super) fn admit_pair(
    limits: &Limits,
    count: usize,
    lens: (usize, usize, usize),
) -> Result<(), FastCgiError> {
    let (_, name_len, value_len) = lens;
    if name_len > limits.max_name_len {
        return Err(FastCgiError::NameTooLong {
            len: name_len,
            limit: limits.max_name_len,
        });
    }
    if value_len > limits.max_value_len {
        return Err(FastCgiError::ValueTooLong {
            len: value_len,
            limit: limits.max_value_len,
        });
    }
    if count >= limits.max_params_count {
        return Err(FastCgiError::TooManyParams {
            limit: limits.max_params_count,
        });
    }
    Ok(())
}

/// What collects the FCGI_PARAMS stream of each request a [`RequestDecoder`] decodes: the
/// pairs as owned slices ([`ParamsDecoder`], the default), or indexed in one buffer for the
/// front logic ([`FrontParamsDecoder`](super::FrontParamsDecoder)).
///
/// [`RequestDecoder`]: super::RequestDecoder
pub trait ParamsCollector: std::fmt::Debug + Clone {
    /// What a whole stream comes to.
    type Block: std::fmt::Debug + Clone + PartialEq + Eq;

    /// A collector for one stream bounded by `limits`.
    fn new(limits: &Limits) -> Self;

    /// Feeds the content of the next (non-empty) record of the stream.
    fn push(&mut self, content: Bytes) -> Result<(), FastCgiError>;

    /// Whether the collector copies what it is fed: the request decoder then hands it each
    /// record's content where it lies in the input ([`push_slice`](Self::push_slice)), not
    /// as a `Bytes` cut off the input (a reference count taken and dropped per record).
    const COPIES: bool = false;

    /// As [`push`](Self::push), the content borrowed; by default copied into a `Bytes`.
    fn push_slice(&mut self, content: &[u8]) -> Result<(), FastCgiError> {
        self.push(Bytes::copy_from_slice(content))
    }

    /// Ends the stream, readying the collector for another.
    fn finish(&mut self) -> Result<Self::Block, FastCgiError>;
}

impl ParamsCollector for ParamsDecoder {
    type Block = Vec<(Bytes, Bytes)>;

    fn new(limits: &Limits) -> Self {
        ParamsDecoder::new(limits)
    }

    fn push(&mut self, content: Bytes) -> Result<(), FastCgiError> {
        ParamsDecoder::push(self, content)
    }

    fn finish(&mut self) -> Result<Self::Block, FastCgiError> {
        ParamsDecoder::finish(self)
    }
}

/// A guess at the wire size of a typical CGI parameter pair, used to size the pair vector.
const AVERAGE_PAIR_LEN: usize = 24;

/// The lengths at the start of a pair: (prefix bytes, name length, value length), or `None`
/// when `buf` does not hold both prefixes yet.
pub(super) fn read_lengths(buf: &[u8]) -> Option<(usize, usize, usize)> {
    let (name_len, name_prefix) = read_len(buf)?;
    let (value_len, value_prefix) = read_len(buf.get(name_prefix..)?)?;
    Some((name_prefix + value_prefix, name_len, value_len))
}

fn read_len(buf: &[u8]) -> Option<(usize, usize)> {
    let first = *buf.first()?;
    if first & 0x80 == 0 {
        return Some((usize::from(first), 1));
    }
    match *buf.get(..4)? {
        [b3, b2, b1, b0] => Some((u32::from_be_bytes([b3 & 0x7f, b2, b1, b0]) as usize, 4)),
        _ => None,
    }
}

/// Reassembles name-value pairs from a PARAMS stream (or one management record), fed one
/// record's content at a time. Pairs wholly inside one record are sliced out of it without
/// copying; a pair that straddles records is copied once into a buffer bounded by the limits.
#[derive(Debug, Clone)]
pub struct ParamsDecoder {
    max_bytes: usize,
    max_count: usize,
    max_name_len: usize,
    max_value_len: usize,
    /// Bytes of a pair begun in an earlier record.
    partial: BytesMut,
    /// The lengths of the partial pair, once its prefixes are complete.
    partial_lens: Option<(usize, usize, usize)>,
    pairs: Vec<(Bytes, Bytes)>,
    total: usize,
}

impl ParamsDecoder {
    /// A decoder for one name-value block bounded by `limits`.
    pub fn new(limits: &Limits) -> ParamsDecoder {
        ParamsDecoder {
            max_bytes: limits.max_params_bytes,
            max_count: limits.max_params_count,
            max_name_len: limits.max_name_len,
            max_value_len: limits.max_value_len,
            partial: BytesMut::new(),
            partial_lens: None,
            pairs: Vec::new(),
            total: 0,
        }
    }

    /// Decodes a complete block held in one buffer (a management record's content).
    pub fn decode_block(
        content: Bytes,
        limits: &Limits,
    ) -> Result<Vec<(Bytes, Bytes)>, FastCgiError> {
        let mut decoder = ParamsDecoder::new(limits);
        decoder.push(content)?;
        decoder.finish()
    }

    /// Checks a pair's declared lengths against the limits before any of it is buffered.
    fn admit(&self, lens: (usize, usize, usize)) -> Result<(), FastCgiError> {
        let limits = Limits {
            max_name_len: self.max_name_len,
            max_value_len: self.max_value_len,
            max_params_count: self.max_count,
            ..Limits::DEFAULT
        };
        admit_pair(&limits, self.pairs.len(), lens)
    }

    /// Feeds the content of the next record of the block.
    pub fn push(&mut self, mut content: Bytes) -> Result<(), FastCgiError> {
        self.total = self.total.saturating_add(content.len());
        if self.total > self.max_bytes {
            return Err(FastCgiError::ParamsTooLarge {
                len: self.total,
                limit: self.max_bytes,
            });
        }
        if self.pairs.capacity() == 0 {
            // Real parameter pairs average some 40 to 60 bytes; one early guess saves the
            // vector several regrowths on a typical 1-2 KiB block.
            self.pairs
                .reserve((content.len() / AVERAGE_PAIR_LEN).clamp(1, self.max_count.max(1)));
        }
        if !self.partial.is_empty() && !self.complete_partial(&mut content)? {
            return Ok(());
        }
        while !content.is_empty() {
            let Some(lens) = read_lengths(&content) else {
                // At most 7 bytes of length prefixes: keep them for the next record.
                self.partial.extend_from_slice(&content);
                return Ok(());
            };
            self.admit(lens)?;
            let (prefix, name_len, value_len) = lens;
            if content.len() < prefix + name_len + value_len {
                self.partial.extend_from_slice(&content);
                self.partial_lens = Some(lens);
                return Ok(());
            }
            content.advance(prefix);
            let name = content.split_to(name_len);
            let value = content.split_to(value_len);
            self.pairs.push((name, value));
        }
        Ok(())
    }

    /// Moves bytes from `content` into the pair begun in an earlier record; true once that pair
    /// is complete (and pushed), false when `content` ran out first.
    fn complete_partial(&mut self, content: &mut Bytes) -> Result<bool, FastCgiError> {
        let lens = loop {
            if let Some(lens) = self.partial_lens {
                break lens;
            }
            // Length prefixes are at most 8 bytes, so this copies a byte at a time only briefly.
            if content.is_empty() {
                return Ok(false);
            }
            self.partial.extend_from_slice(&content.split_to(1));
            if let Some(lens) = read_lengths(&self.partial) {
                self.admit(lens)?;
                self.partial_lens = Some(lens);
            }
        };
        let (prefix, name_len, value_len) = lens;
        let need = prefix + name_len + value_len - self.partial.len();
        let take = need.min(content.len());
        self.partial.extend_from_slice(&content.split_to(take));
        if take < need {
            return Ok(false);
        }
        let mut pair = self.partial.split().freeze();
        pair.advance(prefix);
        let name = pair.split_to(name_len);
        self.pairs.push((name, pair));
        self.partial_lens = None;
        Ok(true)
    }

    /// Ends the block: returns its pairs and readies the decoder for another block. Fails if
    /// the block stopped inside a pair.
    pub fn finish(&mut self) -> Result<Vec<(Bytes, Bytes)>, FastCgiError> {
        if !self.partial.is_empty() {
            let missing = match self.partial_lens {
                Some((prefix, name_len, value_len)) => {
                    prefix + name_len + value_len - self.partial.len()
                }
                None => 1,
            };
            return Err(FastCgiError::TruncatedPair { missing });
        }
        self.total = 0;
        Ok(std::mem::take(&mut self.pairs))
    }
}
