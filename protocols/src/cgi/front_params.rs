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

use super::front_checks::{bad_name, bad_pair, class, tail_has_nul_cr_lf};
use super::front_names::lookup;
pub use super::front_names::Known;
pub(super) use super::front_names::KNOWN;
use super::params::{CgiParams, MAX_FIELD_LEN};
use super::{snippet, CgiError};

/// No pair: an index that is not one.
pub(super) const NONE: u32 = u32::MAX;

/// Where one pair lies in the buffer, and how it relates to the others.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct PairAt {
    /// Offset of the name in the buffer; the value follows it.
    pub(super) at: u32,
    pub(super) name_len: u32,
    pub(super) value_len: u32,
    /// For a name sent before: the pair that first had it. [`NONE`] for a first occurrence.
    pub(super) first: u32,
    /// For a first occurrence: the last pair with its name (itself when it is not repeated).
    pub(super) last: u32,
    /// The [`Known`] name's index, or [`KNOWN`] for any other name.
    pub(super) known: u8,
}

/// The pairs a front server sent, in its order and its encoding, indexed.
#[derive(Clone, PartialEq, Eq)]
pub struct FrontParams {
    buf: Vec<u8>,
    pairs: Vec<PairAt>,
    /// Per [`Known`] name: its first and last pair, [`NONE`] when it was not sent.
    known: [(u32, u32); KNOWN],
    /// The first pair no environment can carry, as the error it is reported as.
    bad: Option<CgiError>,
    /// One bit per class (length, first and last byte) of the other names so far: a name
    /// whose bit is clear was not sent before, which spares the scan for nearly every one.
    seen: u128,
    /// One bit per common name of the table (not a [`Known`] one) sent so far.
    common: u64,
    longest_name: usize,
    longest_value: usize,
    total: usize,
    /// Every length took its shortest form: the buffer is what encoding the pairs anew
    /// would write, so it can go to a backend as it is.
    canonical: bool,
    /// Some name was sent twice.
    repeated: bool,
}

thread_local! {
    /// The index vector of the thread's last parameters, cleared, for its next ones: a
    /// front server that opens a connection per request (nginx's plain `fastcgi_pass`)
    /// would otherwise cost an allocation per request for it.
    static SPARE_INDEX: std::cell::Cell<Vec<PairAt>> = const { std::cell::Cell::new(Vec::new()) };
}

/// The most pairs a kept index vector has room for: what the first guess reserves.
const SPARE_MAX: usize = 256;

impl Drop for FrontParams {
    fn drop(&mut self) {
        let mut pairs = std::mem::take(&mut self.pairs);
        if pairs.capacity() != 0 && pairs.capacity() <= SPARE_MAX {
            pairs.clear();
            // A vector kept before (another request's, still in flight then) is freed.
            SPARE_INDEX.set(pairs);
        }
    }
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

impl FrontParams {
    /// No pairs.
    pub fn new() -> FrontParams {
        FrontParams {
            buf: Vec::new(),
            pairs: Vec::new(),
            known: [(NONE, NONE); KNOWN],
            bad: None,
            seen: 0,
            common: 0,
            longest_name: 0,
            longest_value: 0,
            total: 0,
            canonical: true,
            repeated: false,
        }
    }

    /// Pairs sent, repeats included.
    pub fn len(&self) -> usize {
        self.pairs.len()
    }

    /// Whether none were.
    pub fn is_empty(&self) -> bool {
        self.pairs.is_empty()
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
                total: self.total.saturating_add(name.len() + value.len()),
                limit: u32::MAX as usize,
            });
        }
        self.buf.reserve(prefix + name.len() + value.len());
        put_len(&mut self.buf, name.len());
        put_len(&mut self.buf, value.len());
        let at = self.buf.len();
        self.buf.extend_from_slice(name);
        self.buf.extend_from_slice(value);
        self.index(at, name.len(), value.len());
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
        if self.pairs.capacity() == 0 {
            self.pairs = SPARE_INDEX.take();
            // Parameter pairs take some 16 to 60 bytes on the wire (nginx's `fastcgi.conf`
            // for a request with a few short headers: about 20 pairs in 450 bytes); one early
            // guess at the short end saves the index its regrowths on a typical block.
            self.pairs.reserve((bytes / 16).clamp(8, SPARE_MAX));
        }
    }

    /// Notes that a pair's length prefixes did not take their shortest form.
    pub(crate) fn note_long_prefix(&mut self) {
        self.canonical = false;
    }

    /// Indexes the pair whose name starts at `at` in the buffer, the value after it; the
    /// caller has checked that both lie inside it (and that it holds under 4 GiB).
    #[inline(always)]
    pub(crate) fn index(&mut self, at: usize, name_len: usize, value_len: usize) {
        let end = at.saturating_add(name_len).saturating_add(value_len);
        // `end` fitting 32 bits bounds `at` and both lengths too.
        let (Some(pair), Ok(_), Ok(i)) = (
            self.buf.get(at..end),
            u32::try_from(end),
            u32::try_from(self.pairs.len()),
        ) else {
            // Callers never pass such a pair; dropping it would lose a parameter silently.
            self.bad.get_or_insert(CgiError::VarsTooLarge {
                total: end,
                limit: u32::MAX as usize,
            });
            return;
        };
        let (name, value) = pair.split_at_checked(name_len).unwrap_or_default();
        let id = lookup(name);
        // A name from the table is a clean one: only the others need the scan.
        let bad_name = id.is_none() && bad_name(name);
        if self.bad.is_none() && (bad_name || tail_has_nul_cr_lf(pair, value_len)) {
            self.bad = Some(bad_pair(bad_name, name, value));
        }
        let (n32, v32) = (name_len as u32, value_len as u32);
        let mut first = NONE;
        let mut known = KNOWN as u8;
        match id {
            Some(k) if usize::from(k) < KNOWN => {
                known = k;
                if let Some(slot) = self.known.get_mut(usize::from(k)) {
                    if slot.0 == NONE {
                        *slot = (i, i);
                    } else {
                        first = slot.0;
                        slot.1 = i;
                    }
                }
            }
            Some(common) => {
                // Told apart exactly: a set bit is a repeat, found by the scan.
                let bit = 1u64 << (usize::from(common) - KNOWN);
                if self.common & bit != 0 {
                    first = self.first_named(name);
                }
                self.common |= bit;
            }
            None => {
                let c = class(name);
                if self.seen & c != 0 {
                    first = self.first_named(name);
                }
                self.seen |= c;
            }
        }
        if let Some(p) = self.pairs.get_mut(first as usize) {
            p.last = i;
            self.repeated = true;
        }
        self.pairs.push(PairAt {
            at: at as u32,
            name_len: n32,
            value_len: v32,
            first,
            last: i,
            known,
        });
        self.longest_name = self.longest_name.max(name_len);
        self.longest_value = self.longest_value.max(value_len);
        self.total = self.total.saturating_add(name_len + value_len);
    }

    /// The first pair named `name` (no [`Known`] name), [`NONE`] when it was not sent.
    fn first_named(&self, name: &[u8]) -> u32 {
        let buf = &self.buf;
        self.pairs
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

    /// The value of the first pair named `k`, as the front server sent it.
    pub fn first(&self, k: Known) -> Option<&[u8]> {
        let (first, _) = *self.known.get(k as usize)?;
        self.pairs.get(first as usize).map(|p| self.value(p))
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
        self.pairs.iter().map(|p| (self.name(p), self.value(p)))
    }

    pub(super) fn pairs(&self) -> &[PairAt] {
        &self.pairs
    }

    pub(super) fn pair(&self, i: u32) -> Option<&PairAt> {
        self.pairs.get(i as usize)
    }

    /// First and last pair of known name `k`.
    pub(super) fn known(&self, k: Known) -> (u32, u32) {
        self.known.get(k as usize).copied().unwrap_or((NONE, NONE))
    }

    /// Whether every length took its shortest form.
    pub(super) fn is_canonical(&self) -> bool {
        self.canonical
    }

    /// Where pair `p` begins, length prefixes included, in a canonical buffer.
    pub(super) fn start(&self, p: &PairAt) -> usize {
        (p.at as usize)
            .saturating_sub(short_prefix(p.name_len as usize) + short_prefix(p.value_len as usize))
    }

    /// Whether some name was sent more than once.
    pub(super) fn repeated(&self) -> bool {
        self.repeated
    }

    pub(super) fn bad(&self) -> Option<&CgiError> {
        self.bad.as_ref()
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

    /// The pairs as the backend's parameter block, when they are exactly what a backend
    /// should get (the caller knows nothing was dropped or changed): the buffer itself when
    /// no name repeats and every length took its shortest form, else encoded anew.
    pub(super) fn into_params(mut self) -> Result<CgiParams, CgiError> {
        if self.canonical && !self.repeated {
            return Ok(CgiParams::from_encoded(
                std::mem::take(&mut self.buf),
                self.pairs.len(),
                self.longest_name,
                self.longest_value,
                self.total,
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
    pub(super) fn into_params_without(
        mut self,
        removed: &[bool; KNOWN],
    ) -> Result<CgiParams, CgiError> {
        let broken = |at: usize| CgiError::VarsTooLarge {
            total: at,
            limit: u32::MAX as usize,
        };
        // The pairs left out, in the order they lie in the buffer.
        let mut cut = [NONE; KNOWN];
        let mut n = 0;
        for (k, _) in removed.iter().enumerate().filter(|(_, out)| **out) {
            let (first, _) = self.known.get(k).copied().unwrap_or((NONE, NONE));
            if let (false, Some(slot)) = (first == NONE, cut.get_mut(n)) {
                *slot = first;
                n += 1;
            }
        }
        let cut = cut.get_mut(..n).unwrap_or_default();
        cut.sort_unstable();
        let end_of = |p: &PairAt| p.at as usize + p.name_len as usize + p.value_len as usize;
        let len = self.pairs.last().map_or(0, end_of);
        if len > self.buf.len() {
            return Err(broken(len));
        }
        let (mut count, mut total) = (self.pairs.len(), self.total);
        let mut rescan = false;
        // Bytes before `from` are settled: `write` of them kept.
        let (mut write, mut from) = (0usize, 0usize);
        for &i in cut.iter() {
            let Some(p) = self.pairs.get(i as usize) else {
                return Err(broken(len));
            };
            let (start, end) = (self.start(p), end_of(p));
            // Every pair was indexed inside the buffer, after the ones before it; were one
            // not, no pair is dropped silently.
            if start < from || start > p.at as usize || end > len {
                return Err(broken(end));
            }
            if from != write {
                self.buf.copy_within(from..start, write);
            }
            write += start - from;
            from = end;
            count = count.saturating_sub(1);
            total = total.saturating_sub(p.name_len as usize + p.value_len as usize);
            rescan |= p.name_len as usize == self.longest_name
                || p.value_len as usize == self.longest_value;
        }
        if from != write {
            self.buf.copy_within(from..len, write);
        }
        write += len - from;
        self.buf.truncate(write);
        let (mut longest_name, mut longest_value) = (self.longest_name, self.longest_value);
        if rescan {
            // A pair left out may have been the longest: the longest of those kept.
            (longest_name, longest_value) = (0, 0);
            for p in &self.pairs {
                if !removed.get(usize::from(p.known)).copied().unwrap_or(false) {
                    longest_name = longest_name.max(p.name_len as usize);
                    longest_value = longest_value.max(p.value_len as usize);
                }
            }
        }
        Ok(CgiParams::from_encoded(
            std::mem::take(&mut self.buf),
            count,
            longest_name,
            longest_value,
            total,
        ))
    }
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
    use super::{FrontParams, SPARE_MAX};

    fn indexed(pairs: usize) -> FrontParams {
        let mut p = FrontParams::new();
        p.reserve_for(pairs * 16);
        for i in 0..pairs {
            p.push(format!("HTTP_X_{i}").as_bytes(), b"v").unwrap();
        }
        p
    }

    #[test]
    fn the_index_vector_of_dropped_parameters_serves_the_next_ones_on_the_thread() {
        let first = indexed(20);
        let at = first.pairs.as_ptr();
        drop(first);
        let second = indexed(3);
        assert_eq!(second.pairs.as_ptr(), at, "the index vector was not reused");
        assert_eq!(second.len(), 3, "pairs of the last parameters were kept");
        assert_eq!(second.iter().last().unwrap().0, b"HTTP_X_2");
        // Taken, so the next parameters made while these live get one of their own.
        let third = indexed(2);
        assert_ne!(third.pairs.as_ptr(), at);
        // A vector grown past the bound is freed, not kept.
        drop(indexed(SPARE_MAX * 2));
        let fourth = indexed(1);
        assert!(fourth.pairs.capacity() <= SPARE_MAX);
    }
}
