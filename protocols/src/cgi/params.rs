//! One request's CGI variables encoded once: name-value pairs in FastCGI's length-prefixed
//! form (FastCGI 1.0 §3.4: a length under 128 in one byte, a longer one in four with the
//! high bit set), one after another in one buffer.
//!
//! That is the form a FastCGI backend receives, so the FastCGI codec copies the block into
//! its PARAMS record whole instead of encoding pair by pair; the SCGI and LSAPI codecs walk
//! the pairs ([`CgiParams::iter`]) and encode them their way. Building the variables costs
//! one buffer, not two allocations per variable (ARCHITECTURE.md, "HTTP front", step 5).

use bytes::Bytes;

use super::{snippet, CgiError};

/// Longest name or value a pair can carry: the 4-byte length form holds 31 bits.
pub(super) const MAX_FIELD_LEN: usize = 0x7fff_ffff;

/// CGI variables in FastCGI pair encoding. Names may repeat only if the builder let them;
/// [`get`](Self::get) finds the first.
#[derive(Clone, Default)]
pub struct CgiParams {
    buf: Vec<u8>,
    count: usize,
    /// The longest name and value, and the sum of all name and value lengths, kept as pairs
    /// are appended, so the limits are checked without walking the pairs again.
    longest_name: usize,
    longest_value: usize,
    total: usize,
    /// Some pairs came whole from elsewhere, their lengths not counted in the three above (a
    /// front server's block passed on as it came: only the HTTP front checks the limits,
    /// and it builds its own): [`within`](Self::within) walks the pairs.
    unmeasured: bool,
}

/// Two blocks are equal when they hold the same pairs, however their lengths were counted.
impl PartialEq for CgiParams {
    fn eq(&self, other: &CgiParams) -> bool {
        self.count == other.count && self.buf == other.buf
    }
}

impl Eq for CgiParams {}

impl std::fmt::Debug for CgiParams {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list()
            .entries(
                self.iter()
                    .map(|(n, v)| (n.escape_ascii().to_string(), v.escape_ascii().to_string())),
            )
            .finish()
    }
}

#[inline]
fn put_len(buf: &mut Vec<u8>, len: usize) {
    if len < 0x80 {
        buf.push(len as u8);
    } else {
        // Callers checked len <= MAX_FIELD_LEN, so it fits 31 bits.
        buf.extend_from_slice(&(len as u32 | 0x8000_0000).to_be_bytes());
    }
}

fn check_lens(name: &[u8], value_len: usize) -> Result<(), CgiError> {
    if name.len() > MAX_FIELD_LEN {
        return Err(CgiError::NameTooLong {
            name: snippet(name),
            limit: MAX_FIELD_LEN,
        });
    }
    if value_len > MAX_FIELD_LEN {
        return Err(CgiError::ValueTooLong {
            name: snippet(name),
            len: value_len,
            limit: MAX_FIELD_LEN,
        });
    }
    Ok(())
}

/// The lengths of the pair at the start of `buf`: (prefix bytes, name length, value length).
#[inline]
pub(super) fn pair_lens(buf: &[u8]) -> Option<(usize, usize, usize)> {
    let (name_len, a) = read_len(buf)?;
    let (value_len, b) = read_len(buf.get(a..)?)?;
    Some((a + b, name_len, value_len))
}

/// A length at the start of `buf`: (length, prefix bytes).
#[inline]
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

impl CgiParams {
    /// No variables, room for `bytes` of encoded pairs.
    pub fn with_capacity(bytes: usize) -> CgiParams {
        CgiParams {
            buf: Vec::with_capacity(bytes),
            ..CgiParams::default()
        }
    }

    /// Pairs already encoded in `buf` (whole, each length in its shortest form), with their
    /// count; [`within`](Self::within) measures them when it is asked.
    pub(super) fn from_encoded_unmeasured(buf: Vec<u8>, count: usize) -> CgiParams {
        CgiParams {
            buf,
            count,
            unmeasured: true,
            ..CgiParams::default()
        }
    }

    /// Appends pairs already encoded (whole, each length in its shortest form), with their
    /// count and lengths.
    pub(super) fn extend_encoded(
        &mut self,
        pairs: &[u8],
        count: usize,
        longest_name: usize,
        longest_value: usize,
        total: usize,
    ) {
        self.buf.extend_from_slice(pairs);
        self.count += count;
        self.longest_name = self.longest_name.max(longest_name);
        self.longest_value = self.longest_value.max(longest_value);
        self.total = self.total.saturating_add(total);
    }

    /// Appends the pairs of `other` (a block encoded once and sent with every request), as
    /// if each had been pushed.
    pub fn append(&mut self, other: &CgiParams) {
        self.buf.extend_from_slice(&other.buf);
        self.count += other.count;
        self.unmeasured |= other.unmeasured;
        self.longest_name = self.longest_name.max(other.longest_name);
        self.longest_value = self.longest_value.max(other.longest_value);
        self.total = self.total.saturating_add(other.total);
    }

    /// Variables in all.
    pub fn len(&self) -> usize {
        self.count
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.count == 0
    }

    /// The pairs as FastCGI encodes them (without record framing).
    pub fn encoded(&self) -> &[u8] {
        &self.buf
    }

    /// Counts one appended pair.
    #[inline]
    fn note(&mut self, name_len: usize, value_len: usize) {
        self.count += 1;
        self.longest_name = self.longest_name.max(name_len);
        self.longest_value = self.longest_value.max(value_len);
        self.total = self.total.saturating_add(name_len + value_len);
    }

    /// Whether every name, every value and all of them together are within `names`,
    /// `values` and `total` bytes, without walking the pairs.
    pub(crate) fn within(&self, names: usize, values: usize, total: usize) -> bool {
        if self.unmeasured {
            let (mut n, mut v, mut t) = (0usize, 0usize, 0usize);
            for (name, value) in self.iter() {
                n = n.max(name.len());
                v = v.max(value.len());
                t = t.saturating_add(name.len() + value.len());
            }
            return n <= names && v <= values && t <= total;
        }
        self.longest_name <= names && self.longest_value <= values && self.total <= total
    }

    /// Appends a variable. Never inlined: a request pushes a dozen variables from as many
    /// call sites, and one shared body is less code to fetch per request than a copy at
    /// each (`FOOTPRINT=1 bash benches/callgrind.sh http`), for a few instructions of call.
    #[inline(never)]
    pub fn push(&mut self, name: &[u8], value: &[u8]) -> Result<(), CgiError> {
        check_lens(name, value.len())?;
        self.buf.reserve(name.len() + value.len() + 8);
        if name.len() < 0x80 && value.len() < 0x80 {
            // Both lengths in their one-byte form (most variables): one append for both.
            self.buf
                .extend_from_slice(&[name.len() as u8, value.len() as u8]);
        } else {
            put_len(&mut self.buf, name.len());
            put_len(&mut self.buf, value.len());
        }
        self.buf.extend_from_slice(name);
        self.buf.extend_from_slice(value);
        self.note(name.len(), value.len());
        Ok(())
    }

    /// Appends a variable whose value is `parts` joined by `sep`, without joining them first.
    pub fn push_joined(
        &mut self,
        name: &[u8],
        parts: &[&[u8]],
        sep: &[u8],
    ) -> Result<(), CgiError> {
        let len = parts.iter().map(|p| p.len()).sum::<usize>()
            + sep.len() * parts.len().saturating_sub(1);
        check_lens(name, len)?;
        put_len(&mut self.buf, name.len());
        put_len(&mut self.buf, len);
        self.buf.extend_from_slice(name);
        for (i, part) in parts.iter().enumerate() {
            if i > 0 {
                self.buf.extend_from_slice(sep);
            }
            self.buf.extend_from_slice(part);
        }
        self.note(name.len(), len);
        Ok(())
    }

    /// Appends a variable whose name is `prefix` followed by `tail` mapped byte by byte
    /// through `map` (`HTTP_` and a header name upper-cased, `-` as `_`). Inlined, so that
    /// a constant prefix is stored, not copied through a call.
    #[inline]
    pub(crate) fn push_mapped_name(
        &mut self,
        prefix: &[u8],
        tail: &[u8],
        map: impl Fn(u8) -> u8,
        value: &[u8],
    ) -> Result<(), CgiError> {
        let name_len = prefix.len() + tail.len();
        if name_len > MAX_FIELD_LEN {
            return Err(CgiError::NameTooLong {
                name: snippet(tail),
                limit: MAX_FIELD_LEN,
            });
        }
        check_lens(tail, value.len())?;
        self.buf.reserve(name_len + value.len() + 8);
        put_len(&mut self.buf, name_len);
        put_len(&mut self.buf, value.len());
        self.buf.extend_from_slice(prefix);
        // Mapped as it is copied: a slice's mapped iterator tells its exact length, so the
        // vector reserves once and writes each byte without checking its capacity again
        // (pushing byte by byte checked it at every byte; copying, then mapping in place,
        // read the name twice and called memcpy).
        self.buf.extend(tail.iter().map(|&c| map(c)));
        self.buf.extend_from_slice(value);
        self.note(name_len, value.len());
        Ok(())
    }

    /// The pairs in order.
    pub fn iter(&self) -> Pairs<'_> {
        Pairs { rest: &self.buf }
    }

    /// The value of the first variable named `name`.
    pub fn get(&self, name: &[u8]) -> Option<&[u8]> {
        self.iter().find(|(n, _)| *n == name).map(|(_, v)| v)
    }

    /// Sets `name` to `value`: in place of its first occurrence, or appended.
    pub fn set(&mut self, name: &[u8], value: &[u8]) -> Result<(), CgiError> {
        if self.get(name).is_none() {
            return self.push(name, value);
        }
        let mut out = CgiParams::with_capacity(self.buf.len() + value.len());
        let mut done = false;
        for (n, v) in self.iter() {
            if !done && n == name {
                out.push(n, value)?;
                done = true;
            } else {
                out.push(n, v)?;
            }
        }
        *self = out;
        Ok(())
    }

    /// The variables as owned pairs (for tests and for callers that keep them).
    pub fn to_pairs(&self) -> Vec<(Bytes, Bytes)> {
        self.iter()
            .map(|(n, v)| (Bytes::copy_from_slice(n), Bytes::copy_from_slice(v)))
            .collect()
    }

    /// Encodes `pairs` in order.
    pub fn from_pairs<N: AsRef<[u8]>, V: AsRef<[u8]>>(
        pairs: &[(N, V)],
    ) -> Result<CgiParams, CgiError> {
        let bytes = pairs
            .iter()
            .map(|(n, v)| n.as_ref().len() + v.as_ref().len() + 2)
            .sum();
        let mut out = CgiParams::with_capacity(bytes);
        for (n, v) in pairs {
            out.push(n.as_ref(), v.as_ref())?;
        }
        Ok(out)
    }
}

/// The pairs of a [`CgiParams`], decoded as they are walked.
#[derive(Debug, Clone)]
pub struct Pairs<'a> {
    rest: &'a [u8],
}

impl<'a> Iterator for Pairs<'a> {
    type Item = (&'a [u8], &'a [u8]);

    fn next(&mut self) -> Option<Self::Item> {
        let (name_len, a) = read_len(self.rest)?;
        let (value_len, b) = read_len(self.rest.get(a..)?)?;
        let start = a + b;
        let name = self.rest.get(start..start + name_len)?;
        let value = self
            .rest
            .get(start + name_len..start + name_len + value_len)?;
        self.rest = self.rest.get(start + name_len + value_len..)?;
        Some((name, value))
    }
}

#[cfg(test)]
mod tests {
    use super::CgiParams;

    #[test]
    fn pairs_come_back_as_pushed_with_both_length_forms() {
        let long = vec![b'v'; 300];
        let mut p = CgiParams::with_capacity(0);
        p.push(b"A", b"1").unwrap();
        p.push(b"LONG", &long).unwrap();
        p.push(b"EMPTY", b"").unwrap();
        p.push_joined(b"HTTP_COOKIE", &[b"a=1", b"b=2"], b"; ")
            .unwrap();
        p.push_mapped_name(b"HTTP_", b"x-a", |c| c.to_ascii_uppercase(), b"z")
            .unwrap();
        let got: Vec<(&[u8], &[u8])> = p.iter().collect();
        assert_eq!(
            got,
            vec![
                (&b"A"[..], &b"1"[..]),
                (b"LONG", &long[..]),
                (b"EMPTY", b""),
                (b"HTTP_COOKIE", b"a=1; b=2"),
                (b"HTTP_X-A", b"z"),
            ]
        );
        assert_eq!(p.len(), 5);
        // The 300-byte value took the 4-byte length form.
        assert_eq!(&p.encoded()[5..9], &(300u32 | 0x8000_0000).to_be_bytes());
    }

    #[test]
    fn set_replaces_in_place_or_appends() {
        let mut p = CgiParams::from_pairs(&[("A", "1"), ("B", "2")]).unwrap();
        p.set(b"A", b"one").unwrap();
        p.set(b"C", b"3").unwrap();
        assert_eq!(p.get(b"A"), Some(&b"one"[..]));
        assert_eq!(
            p.iter().map(|(n, _)| n.to_vec()).collect::<Vec<_>>(),
            vec![b"A".to_vec(), b"B".to_vec(), b"C".to_vec()]
        );
        assert_eq!(p.len(), 3);
    }

    #[test]
    fn the_running_lengths_are_those_of_the_pairs() {
        let mut p = CgiParams::from_pairs(&[("NAME", "value"), ("LONGER_NAME", "v")]).unwrap();
        p.push_joined(b"J", &[b"ab", b"cd"], b"/").unwrap();
        p.push_mapped_name(b"HTTP_", b"x-y", |c| c.to_ascii_uppercase(), b"1234567")
            .unwrap();
        p.set(b"NAME", b"a much longer value").unwrap();
        let longest_name = p.iter().map(|(n, _)| n.len()).max().unwrap();
        let longest_value = p.iter().map(|(_, v)| v.len()).max().unwrap();
        let total: usize = p.iter().map(|(n, v)| n.len() + v.len()).sum();
        assert!(p.within(longest_name, longest_value, total));
        assert!(!p.within(longest_name - 1, longest_value, total));
        assert!(!p.within(longest_name, longest_value - 1, total));
        assert!(!p.within(longest_name, longest_value, total - 1));
        // The same pairs taken whole, uncounted (a front server's block), measured when asked;
        // and appended to a counted block, they count in it.
        let whole = CgiParams::from_encoded_unmeasured(p.encoded().to_vec(), p.len());
        assert_eq!(whole, p);
        let mut appended = CgiParams::from_pairs(&[("A", "b")]).unwrap();
        appended.append(&whole);
        for q in [&whole, &appended] {
            assert!(q.within(longest_name, longest_value, total + 2));
            assert!(!q.within(longest_name - 1, longest_value, total + 2));
            assert!(!q.within(longest_name, longest_value - 1, total + 2));
        }
        assert!(whole.within(longest_name, longest_value, total));
        assert!(!whole.within(longest_name, longest_value, total - 1));
        assert!(!appended.within(longest_name, longest_value, total + 1));
    }

    #[test]
    fn a_truncated_buffer_ends_the_walk_without_panicking() {
        let p = CgiParams::from_pairs(&[("NAME", "value")]).unwrap();
        for cut in 0..p.encoded().len() {
            let q = CgiParams {
                buf: p.encoded()[..cut].to_vec(),
                count: 1,
                ..CgiParams::default()
            };
            assert_eq!(q.iter().count(), 0, "cut at {cut}");
        }
    }
}
