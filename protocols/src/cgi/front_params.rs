//! The parameters a front server sent (FastCGI's FCGI_PARAMS stream, SCGI's head), held as
//! it sent them: one buffer in FastCGI pair encoding, [`CgiParams`]'s own form, indexed as
//! the pairs arrive.
//!
//! Each pair is looked at once, on arrival: its name and value are checked against what an
//! environment can carry (the first failure is kept, and reported where
//! [`normalize_front`](super::normalize_front) reports it), a repeated name is linked to its
//! first occurrence, and the few names the front logic reads or rewrites ([`Known`]) are
//! remembered by position instead of searched for. When normalising changes nothing (nginx's
//! `fastcgi.conf` parameters for a script inside the root), the buffer itself becomes the
//! backend's parameter block: no pair is copied or encoded again.

use super::front_checks::{
    bad_name, bad_pair, class, pair_tail_has_nul_cr_lf, value_has_nul_cr_lf,
};
use super::front_names::lookup;

mod short_run;
pub use super::front_names::Known;
pub(super) use super::front_names::KNOWN;

/// A set of [`Known`] names, bit `k` for the name of index `k`: the variables a
/// normalisation leaves out.
pub(super) type LeftOut = u16;
const _: () = assert!(KNOWN <= LeftOut::BITS as usize);
use super::params::{pair_lens, CgiParams, MAX_FIELD_LEN};
use super::{snippet, CgiError};

/// No pair: an offset or an index that is not one.
pub(super) const NONE: u32 = u32::MAX;

/// Where one pair lies in the buffer, and how it relates to the others: an entry of the
/// full index ([`FrontParams::index_all`]), made only when normalising must look at every
/// pair, not as the pairs arrive.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct PairAt {
    /// Offset of the pair's first length byte in the buffer.
    pub(super) start: u32,
    /// Offset of the name; the value follows it.
    pub(super) at: u32,
    pub(super) name_len: u32,
    pub(super) value_len: u32,
    /// For a name sent before: the index of the pair that first had it. [`NONE`] for a
    /// first occurrence.
    pub(super) first: u32,
    /// For a first occurrence: the index of the last pair with its name (itself when it is
    /// not repeated).
    pub(super) last: u32,
    /// The [`Known`] name's index, or [`KNOWN`] for any other name.
    pub(super) known: u8,
}

/// The pairs a front server sent, in its order and its encoding, with what the front logic
/// reads found as they arrived: where each [`Known`] name was first and last sent, whether
/// any name repeats, the first pair no environment can carry. Nothing is kept per pair: the
/// buffer is the pairs, and the rare work that needs every pair (a changed block, a repeat)
/// walks it again.
#[derive(Clone, PartialEq, Eq)]
pub struct FrontParams {
    buf: Vec<u8>,
    /// Per [`Known`] name: the start (first length byte) of its first pair, [`NONE`] when it
    /// was not sent. (Where a repeated one was last sent, only the full index tells.)
    known: [u32; KNOWN],
    count: u32,
    /// The first pair no environment can carry, as the error it is reported as (boxed: the
    /// parameters are moved whole from the decoder to the front, and this is rare).
    bad: Option<Box<CgiError>>,
    /// One bit per class (length, first and last bytes) of the other names so far: a name
    /// whose bit is clear was not sent before, which spares the scan for nearly every one.
    seen: u64,
    /// One bit per common name of the table (not a [`Known`] one) sent so far.
    common: u64,
    /// Every length took its shortest form: the buffer is what encoding the pairs anew
    /// would write, so it can go to a backend as it is.
    canonical: bool,
    /// Some name was sent twice.
    repeated: bool,
}

impl std::fmt::Debug for FrontParams {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list()
            .entries(
                self.iter()
                    .map(|(n, v)| (n.escape_ascii().to_string(), v.escape_ascii().to_string())),
            )
            .finish()
    }
}

impl Default for FrontParams {
    fn default() -> Self {
        FrontParams::new()
    }
}

/// The prefix bytes a length takes in its shortest form.
fn short_prefix(len: usize) -> usize {
    if len < 0x80 {
        1
    } else {
        4
    }
}

/// The pairs of an encoded block as (start, name offset, name length, value length), in
/// order; stops at the first pair that is not wholly there.
fn walk(buf: &[u8]) -> impl Iterator<Item = (usize, usize, usize, usize)> + '_ {
    let mut pos = 0usize;
    std::iter::from_fn(move || {
        let (prefix, name_len, value_len) = pair_lens(buf.get(pos..)?)?;
        let start = pos;
        let at = start.checked_add(prefix)?;
        let end = at.checked_add(name_len)?.checked_add(value_len)?;
        if end > buf.len() {
            return None;
        }
        pos = end;
        Some((start, at, name_len, value_len))
    })
}

impl FrontParams {
    /// No pairs.
    pub fn new() -> FrontParams {
        FrontParams {
            buf: Vec::new(),
            known: [NONE; KNOWN],
            count: 0,
            bad: None,
            seen: 0,
            common: 0,
            canonical: true,
            repeated: false,
        }
    }

    /// Pairs sent, repeats included.
    pub fn len(&self) -> usize {
        self.count as usize
    }

    /// Whether none were.
    pub fn is_empty(&self) -> bool {
        self.count == 0
    }

    /// Appends a pair (a front server that sends pairs in another encoding: SCGI).
    pub fn push(&mut self, name: &[u8], value: &[u8]) -> Result<(), CgiError> {
        if name.len() > MAX_FIELD_LEN {
            return Err(CgiError::NameTooLong {
                name: snippet(name),
                limit: MAX_FIELD_LEN,
            });
        }
        if value.len() > MAX_FIELD_LEN {
            return Err(CgiError::ValueTooLong {
                name: snippet(name),
                len: value.len(),
                limit: MAX_FIELD_LEN,
            });
        }
        let prefix = short_prefix(name.len()) + short_prefix(value.len());
        let end = self.buf.len() + prefix + name.len() + value.len();
        if u32::try_from(end).is_err() {
            return Err(CgiError::VarsTooLarge {
                total: end,
                limit: u32::MAX as usize,
            });
        }
        self.buf.reserve(prefix + name.len() + value.len());
        let start = self.buf.len();
        put_len(&mut self.buf, name.len());
        put_len(&mut self.buf, value.len());
        self.buf.extend_from_slice(name);
        self.buf.extend_from_slice(value);
        self.index(start, prefix, name.len(), value.len());
        Ok(())
    }

    /// The encoded pairs as they arrived, for a decoder to append to; it calls
    /// [`index`](Self::index) for each pair once it is wholly in.
    pub(crate) fn buf_mut(&mut self) -> &mut Vec<u8> {
        &mut self.buf
    }

    /// The encoded pairs as they arrived.
    pub(crate) fn encoded(&self) -> &[u8] {
        &self.buf
    }

    /// Makes room for about `bytes` more of encoded pairs, arriving in one piece.
    pub(crate) fn reserve_for(&mut self, bytes: usize) {
        self.buf.reserve(bytes);
    }

    /// Notes that a pair's length prefixes did not take their shortest form.
    pub(crate) fn note_long_prefix(&mut self) {
        self.canonical = false;
    }

    /// Indexes the pair that starts at `start` in the buffer: `prefix` bytes of lengths,
    /// then the name, then the value; the caller has checked that it lies inside the
    /// buffer (and that the buffer holds under 4 GiB).
    #[inline(always)]
    pub(crate) fn index(&mut self, start: usize, prefix: usize, name_len: usize, value_len: usize) {
        let at = start.saturating_add(prefix);
        let end = at.saturating_add(name_len).saturating_add(value_len);
        // `end` fitting 32 bits bounds `start` too.
        let (Some(pair), Ok(_)) = (self.buf.get(at..end), u32::try_from(end)) else {
            // Callers never pass such a pair; dropping it would lose a parameter silently.
            self.bad.get_or_insert_with(|| {
                Box::new(CgiError::VarsTooLarge {
                    total: end,
                    limit: u32::MAX as usize,
                })
            });
            return;
        };
        let (name, value) = pair.split_at_checked(name_len).unwrap_or_default();
        let id = lookup(name);
        // A name from the table is a clean one: only the others need the scan.
        let bad_name = id.is_none() && bad_name(name);
        if self.bad.is_none() && (bad_name || pair_tail_has_nul_cr_lf(pair, value_len)) {
            self.bad = Some(Box::new(bad_pair(bad_name, name, value)));
        }
        let s = start as u32;
        match id {
            Some(k) if usize::from(k) < KNOWN => {
                if let Some(slot) = self.known.get_mut(usize::from(k)) {
                    if *slot == NONE {
                        *slot = s;
                    } else {
                        self.repeated = true;
                    }
                }
            }
            Some(common) => {
                // Told apart exactly: a set bit is a repeat.
                let bit = 1u64 << (usize::from(common) - KNOWN);
                self.repeated |= self.common & bit != 0;
                self.common |= bit;
            }
            None => {
                let c = class(name);
                if self.seen & c != 0 && !self.repeated && sent_before(&self.buf, start, name) {
                    self.repeated = true;
                }
                self.seen |= c;
            }
        }
        self.count = self.count.saturating_add(1);
    }

    /// Every pair, indexed: where it lies, its [`Known`] name, its first and last
    /// occurrence. Made by the normalisations that write the block anew; the pairs were
    /// checked as they arrived.
    pub(super) fn index_all(&self) -> Vec<PairAt> {
        let buf = &self.buf;
        let mut pairs = SPARE_INDEX.take();
        pairs.clear();
        pairs.reserve(self.len());
        let mut known_first = [NONE; KNOWN];
        let mut common_first = [NONE; 64];
        let mut seen = 0u64;
        for (start, at, name_len, value_len) in walk(buf) {
            let Ok(i) = u32::try_from(pairs.len()) else {
                break;
            };
            let name = buf.get(at..at + name_len).unwrap_or_default();
            let mut first = NONE;
            let mut known = KNOWN as u8;
            let slot = match lookup(name) {
                Some(k) if usize::from(k) < KNOWN => {
                    known = k;
                    known_first.get_mut(usize::from(k))
                }
                Some(common) => common_first.get_mut(usize::from(common) - KNOWN),
                None => {
                    let c = class(name);
                    if seen & c != 0 {
                        first = first_named(buf, &pairs, name);
                    }
                    seen |= c;
                    None
                }
            };
            if let Some(slot) = slot {
                if *slot == NONE {
                    *slot = i;
                } else {
                    first = *slot;
                }
            }
            if let Some(p) = pairs.get_mut(first as usize) {
                p.last = i;
            }
            pairs.push(PairAt {
                start: start as u32,
                at: at as u32,
                name_len: name_len as u32,
                value_len: value_len as u32,
                first,
                last: i,
                known,
            });
        }
        pairs
    }

    /// The value of the first pair named `k`, as the front server sent it. Inlined: the
    /// fronts ask for a dozen of them per request, and the call cost more than the lookup.
    #[inline]
    pub fn first(&self, k: Known) -> Option<&[u8]> {
        let first = *self.known.get(k as usize)?;
        (first != NONE).then(|| self.value_at(first))
    }

    /// The value of the first pair named `name`.
    pub fn get(&self, name: &[u8]) -> Option<&[u8]> {
        match Known::of(name) {
            Some(k) => self.first(k),
            None => self.iter().find(|(n, _)| *n == name).map(|(_, v)| v),
        }
    }

    /// The pairs in the order sent, repeats included.
    pub fn iter(&self) -> impl Iterator<Item = (&[u8], &[u8])> + '_ {
        let buf = &self.buf;
        walk(buf).map(move |(_, at, n, v)| {
            let name = buf.get(at..at + n).unwrap_or_default();
            let value = buf.get(at + n..at + n + v).unwrap_or_default();
            (name, value)
        })
    }

    /// The start of the first pair of known name `k`, [`NONE`] when it was not sent.
    pub(super) fn known(&self, k: Known) -> u32 {
        self.known.get(k as usize).copied().unwrap_or(NONE)
    }

    /// Whether every length took its shortest form.
    pub(super) fn is_canonical(&self) -> bool {
        self.canonical
    }

    /// Whether some name was sent more than once.
    pub(super) fn repeated(&self) -> bool {
        self.repeated
    }

    pub(super) fn bad(&self) -> Option<&CgiError> {
        self.bad.as_deref()
    }

    pub(super) fn name(&self, p: &PairAt) -> &[u8] {
        pair_name(&self.buf, p)
    }

    pub(super) fn value(&self, p: &PairAt) -> &[u8] {
        let at = p.at as usize + p.name_len as usize;
        self.buf
            .get(at..at + p.value_len as usize)
            .unwrap_or_default()
    }

    /// The value of the pair that starts at `start`.
    #[inline]
    pub(super) fn value_at(&self, start: u32) -> &[u8] {
        let rest = self.buf.get(start as usize..).unwrap_or_default();
        let Some((prefix, name_len, value_len)) = pair_lens(rest) else {
            return &[];
        };
        let at = prefix + name_len;
        rest.get(at..at + value_len).unwrap_or_default()
    }

    /// The pairs as the backend's parameter block, when they are exactly what a backend
    /// should get (the caller knows nothing was dropped or changed): the buffer itself when
    /// no name repeats and every length took its shortest form, else encoded anew.
    pub(super) fn into_params(mut self) -> Result<CgiParams, CgiError> {
        if self.canonical && !self.repeated {
            return Ok(CgiParams::from_encoded_unmeasured(
                std::mem::take(&mut self.buf),
                self.len(),
            ));
        }
        let mut out = CgiParams::with_capacity(self.buf.len());
        for (name, value) in self.iter() {
            out.push(name, value)?;
        }
        Ok(out)
    }
}

impl FrontParams {
    /// The pairs as the backend's block without those whose [`Known`] name `removed` marks,
    /// the bytes between them moved down in place in the front server's own buffer, one copy
    /// per stretch: no allocation and no pair encoded again. The caller has checked that
    /// every length took its shortest form and that no name repeats (`Work::only_removals`),
    /// so each marked name is one pair and the others lie end to end around them.
    pub(super) fn into_params_without(mut self, removed: LeftOut) -> Result<CgiParams, CgiError> {
        let broken = |at: usize| CgiError::VarsTooLarge {
            total: at,
            limit: u32::MAX as usize,
        };
        // The pairs left out, in the order they lie in the buffer.
        let mut cut = [NONE; KNOWN];
        let mut n = 0;
        let mut bits = removed;
        while bits != 0 {
            let k = bits.trailing_zeros() as usize;
            bits &= bits - 1;
            let first = self.known.get(k).copied().unwrap_or(NONE);
            if let (false, Some(slot)) = (first == NONE, cut.get_mut(n)) {
                *slot = first;
                n += 1;
            }
        }
        let cut = cut.get_mut(..n).unwrap_or_default();
        cut.sort_unstable();
        let len = self.buf.len();
        let mut count = self.len();
        // Bytes before `from` are settled: `write` of them kept.
        let (mut write, mut from) = (0usize, 0usize);
        for &start in cut.iter() {
            let start = start as usize;
            let Some((prefix, name_len, value_len)) = self.buf.get(start..).and_then(pair_lens)
            else {
                return Err(broken(start));
            };
            let end = start + prefix + name_len + value_len;
            // Every pair was indexed inside the buffer, after the ones before it; were one
            // not, no pair is dropped silently.
            if start < from || end > len {
                return Err(broken(end));
            }
            if from != write {
                self.buf.copy_within(from..start, write);
            }
            write += start - from;
            from = end;
            count = count.saturating_sub(1);
        }
        if from != write {
            self.buf.copy_within(from..len, write);
        }
        write += len - from;
        self.buf.truncate(write);
        Ok(CgiParams::from_encoded_unmeasured(
            std::mem::take(&mut self.buf),
            count,
        ))
    }
}

thread_local! {
    /// The full index the thread's last normalisation made, emptied, for its next one: a
    /// front server whose parameters are rewritten on every request (nginx's `scgi_pass`
    /// sends no SCRIPT_NAME) would otherwise cost an allocation per request for it.
    static SPARE_INDEX: std::cell::Cell<Vec<PairAt>> =
        const { std::cell::Cell::new(Vec::new()) };
}

/// The most pairs a kept index has room for.
const SPARE_MAX: usize = 256;

/// Keeps `pairs` (an index from [`FrontParams::index_all`] no longer wanted) for the thread's
/// next one, unless it grew past [`SPARE_MAX`].
pub(super) fn give_back_index(mut pairs: Vec<PairAt>) {
    if pairs.capacity() != 0 && pairs.capacity() <= SPARE_MAX {
        pairs.clear();
        SPARE_INDEX.set(pairs);
    }
}

/// The first pair of `pairs` named `name` (no [`Known`] or common name), [`NONE`] when
/// none is.
fn first_named(buf: &[u8], pairs: &[PairAt], name: &[u8]) -> u32 {
    pairs
        .iter()
        .position(|p| {
            p.name_len as usize == name.len()
                && p.first == NONE
                && usize::from(p.known) == KNOWN
                && pair_name(buf, p) == name
        })
        .and_then(|j| u32::try_from(j).ok())
        .unwrap_or(NONE)
}

/// Whether a pair of `buf` before `upto` (a pair's start) is named `name`.
#[cold]
#[inline(never)]
fn sent_before(buf: &[u8], upto: usize, name: &[u8]) -> bool {
    let before = buf.get(..upto).unwrap_or_default();
    walk(before).any(|(_, at, n, _)| n == name.len() && before.get(at..at + n) == Some(name))
}

fn pair_name<'a>(buf: &'a [u8], p: &PairAt) -> &'a [u8] {
    let at = p.at as usize;
    buf.get(at..at + p.name_len as usize).unwrap_or_default()
}

fn put_len(buf: &mut Vec<u8>, len: usize) {
    if len < 0x80 {
        buf.push(len as u8);
    } else {
        // Callers checked len <= MAX_FIELD_LEN, so it fits 31 bits.
        buf.extend_from_slice(&(len as u32 | 0x8000_0000).to_be_bytes());
    }
}

#[cfg(test)]
mod tests {
    use super::FrontParams;

    #[test]
    fn an_index_given_back_serves_the_thread_s_next_one() {
        let mut p = FrontParams::new();
        for i in 0..20 {
            p.push(format!("X_{i}").as_bytes(), b"v").unwrap();
        }
        let first = p.index_all();
        let at = first.as_ptr();
        super::give_back_index(first);
        let second = p.index_all();
        assert_eq!(second.as_ptr(), at, "the index was not reused");
        assert_eq!(second.len(), 20, "pairs of the last index were kept");
        // Taken, so an index made meanwhile gets one of its own.
        let third = p.index_all();
        assert_ne!(third.as_ptr(), at);
        // One grown past the bound is freed, not kept.
        let mut big = FrontParams::new();
        for i in 0..super::SPARE_MAX * 2 {
            big.push(format!("X_{i}").as_bytes(), b"v").unwrap();
        }
        super::give_back_index(big.index_all());
        assert!(p.index_all().capacity() <= super::SPARE_MAX);
    }

    #[test]
    fn a_repeat_is_found_among_many_other_names_and_only_a_repeat() {
        let mut p = FrontParams::new();
        // Far more names than duplicate classes: most of them share a class with another.
        for i in 0..300 {
            p.push(format!("X_{i}").as_bytes(), b"v").unwrap();
        }
        assert!(
            !p.repeated(),
            "distinct names whose classes collide are no repeat"
        );
        assert_eq!(p.len(), 300);
        p.push(b"X_17", b"w").unwrap();
        assert!(p.repeated());
        let all = p.index_all();
        assert_eq!(all.len(), 301);
        assert_eq!(all[300].first, 17);
        assert_eq!(all[17].last, 300);
        assert_eq!(p.get(b"X_17"), Some(&b"v"[..]));
        // A known name and a common one repeated are found too.
        for name in [&b"HTTP_HOST"[..], b"HTTP_USER_AGENT"] {
            let mut p = FrontParams::new();
            p.push(name, b"a").unwrap();
            p.push(b"X", b"b").unwrap();
            assert!(!p.repeated());
            p.push(name, b"c").unwrap();
            assert!(p.repeated());
            let all = p.index_all();
            assert_eq!((all[0].last, all[2].first), (2, 0));
        }
    }
}
