//! The state of one normalisation of a front server's variables ([`super::normalize_front`]):
//! the pairs as sent, what changes them (values set, variables removed or added, the
//! context's extra variables), and the writing of the backend's block at the end, unchanged
//! pairs copied a run at a time.

use std::borrow::Cow;
use std::cell::OnceCell;

use bytes::Bytes;

use super::front_params::{give_back_index, FrontParams, Known, LeftOut, PairAt, KNOWN, NONE};
use super::params::CgiParams;
use super::path::root_shown;
use super::{CgiContext, CgiError, DropReason, Dropped};

/// A variable's value while the front's variables are being normalised.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Val<'a> {
    /// The value of the pair that starts at this offset, as sent.
    Pair(u32),
    /// Part of a pair's value, or of the context (a derived SCRIPT_NAME or PATH_INFO).
    Borrowed(&'a [u8]),
    /// The value of the context's extra variable `i`.
    Extra(usize),
    /// The context's root as DOCUMENT_ROOT shows it.
    Root,
    /// Made here.
    Owned(Vec<u8>),
}

/// Where a known variable stands in the backend's order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Place {
    Absent,
    /// Where the front server first sent it: that pair's start.
    Pair(u32),
    /// After the front server's variables, the `n`th added.
    Appended(usize),
}

/// A variable added after the front server's.
#[derive(Debug, Clone, Copy)]
enum Added {
    Known(Known),
    /// The context's extra variable named as `name` is, with the value of `value` (the
    /// last of that name).
    Extra {
        name: usize,
        value: usize,
    },
}

/// The normalisation in progress: the front server's pairs, and what changes them.
pub(super) struct Work<'a> {
    p: &'a FrontParams,
    /// Every pair, indexed, once something needs them all ([`Work::all`]).
    all: OnceCell<Vec<PairAt>>,
    pub(super) ctx: &'a CgiContext,
    /// Per known name, its value now (`None`: absent or dropped).
    pub(super) val: [Option<Val<'a>>; KNOWN],
    place: [Place; KNOWN],
    added: Vec<Added>,
    /// Extra variables replacing the value of a pair whose name is not [`Known`]:
    /// (pair's index in [`Work::all`], extra variable).
    extra_over: Vec<(u32, usize)>,
    pub(super) dropped: Vec<Dropped>,
    /// The backend's variables differ from the pairs as sent.
    pub(super) changed: bool,
}

impl Drop for Work<'_> {
    fn drop(&mut self) {
        if let Some(all) = self.all.take() {
            give_back_index(all);
        }
    }
}

impl<'a> Work<'a> {
    /// The work on `p` for `ctx`; `list_dropped`: [`Work::dropped`] lists the pairs left out.
    pub(super) fn new(p: &'a FrontParams, ctx: &'a CgiContext, list_dropped: bool) -> Work<'a> {
        let mut w = Work {
            p,
            all: OnceCell::new(),
            ctx,
            val: std::array::from_fn(|_| None),
            place: [Place::Absent; KNOWN],
            added: Vec::new(),
            extra_over: Vec::new(),
            dropped: Vec::new(),
            changed: false,
        };
        let mut any_drop = p.repeated();
        for i in 0..KNOWN as u8 {
            let Some(k) = Known::from_index(i) else {
                continue;
            };
            let first = p.known(k);
            if first == NONE {
                continue;
            }
            // A repeated name's value is its last one's; only the full index knows where.
            let last = match p.repeated() {
                true => {
                    let all = w.all.get_or_init(|| p.index_all());
                    let at = all.iter().find(|q| q.start == first);
                    at.and_then(|q| all.get(q.last as usize))
                        .map_or(first, |q| q.start)
                }
                false => first,
            };
            if w.drop_reason(k).is_some() {
                any_drop = true;
                continue;
            }
            if let Some(v) = w.val.get_mut(usize::from(i)) {
                *v = Some(Val::Pair(last));
            }
            if let Some(place) = w.place.get_mut(usize::from(i)) {
                *place = Place::Pair(first);
            }
        }
        if any_drop && list_dropped {
            // In the order sent, as a log reads best.
            let all = w.all.get_or_init(|| p.index_all());
            for pair in all {
                let reason = Known::from_index(pair.known)
                    .and_then(|k| w.drop_reason(k))
                    .or((pair.first != NONE).then_some(DropReason::Duplicate));
                if let Some(reason) = reason {
                    w.dropped.push(Dropped {
                        name: Bytes::copy_from_slice(p.name(pair)),
                        reason,
                    });
                }
            }
        }
        w.changed |= any_drop;
        w
    }

    /// Why a known name is never passed on in this context.
    fn drop_reason(&self, k: Known) -> Option<DropReason> {
        match k {
            Known::HttpProxy => Some(DropReason::Httpoxy),
            Known::CorralReadyProbe => Some(DropReason::Reserved),
            Known::PhpValue | Known::PhpAdminValue if !self.ctx.allow_php_ini_params => {
                Some(DropReason::PhpIni)
            }
            _ => None,
        }
    }

    fn resolve<'v>(&'v self, v: &'v Val<'a>) -> &'v [u8] {
        match v {
            Val::Pair(start) => self.p.value_at(*start),
            Val::Extra(e) => self
                .ctx
                .extra_env
                .get(*e)
                .map(|(_, v)| &v[..])
                .unwrap_or_default(),
            Val::Root => root_shown(&self.ctx.document_root),
            Val::Borrowed(b) => b,
            Val::Owned(b) => b,
        }
    }

    pub(super) fn get(&self, k: Known) -> Option<&[u8]> {
        self.val.get(k as usize)?.as_ref().map(|v| self.resolve(v))
    }

    /// [`get`](Self::get), borrowed from the pairs or the context (not from `self`) when
    /// it can be, so that it can be held while `self` changes.
    pub(super) fn get_cow(&self, k: Known) -> Option<Cow<'a, [u8]>> {
        let (p, ctx) = (self.p, self.ctx);
        Some(match self.val.get(k as usize)?.as_ref()? {
            Val::Pair(start) => Cow::Borrowed(p.value_at(*start)),
            Val::Extra(e) => Cow::Borrowed(
                ctx.extra_env
                    .get(*e)
                    .map(|(_, v)| &v[..])
                    .unwrap_or_default(),
            ),
            Val::Root => Cow::Borrowed(root_shown(&ctx.document_root)),
            Val::Borrowed(b) => Cow::Borrowed(b),
            Val::Owned(b) => Cow::Owned(b.clone()),
        })
    }

    /// Sets `k` to `v`: in its place, or added after the others.
    pub(super) fn set(&mut self, k: Known, v: Val<'a>) {
        let i = k as usize;
        let Some(slot) = self.val.get_mut(i) else {
            return;
        };
        if slot.is_none() {
            if let Some(place) = self.place.get_mut(i) {
                *place = Place::Appended(self.added.len());
            }
            self.added.push(Added::Known(k));
        }
        *slot = Some(v);
        self.changed = true;
    }

    /// Sets `k` to a value made here; nothing changes when it already has that value.
    pub(super) fn set_owned(&mut self, k: Known, value: Vec<u8>) {
        self.set_bytes(k, Cow::Owned(value));
    }

    /// Sets `k` to `value`, borrowed from the pairs or the context when it can be; nothing
    /// changes when it already has that value.
    pub(super) fn set_bytes(&mut self, k: Known, value: Cow<'a, [u8]>) {
        if self.get(k).is_some_and(|v| v == &*value) {
            return;
        }
        self.set(
            k,
            match value {
                Cow::Borrowed(b) => Val::Borrowed(b),
                Cow::Owned(v) => Val::Owned(v),
            },
        );
    }

    pub(super) fn remove(&mut self, k: Known) {
        let i = k as usize;
        if let (Some(v), Some(place)) = (self.val.get_mut(i), self.place.get_mut(i)) {
            *v = None;
            *place = Place::Absent;
            self.changed = true;
        }
    }

    /// Sets the context's extra variable `e` (named `name`).
    pub(super) fn set_extra(&mut self, e: usize, name: &[u8]) {
        self.changed = true;
        if let Some(k) = Known::of(name) {
            self.set(k, Val::Extra(e));
            return;
        }
        let p = self.p;
        let sent = self
            .all()
            .iter()
            .position(|q| q.first == NONE && usize::from(q.known) == KNOWN && p.name(q) == name);
        if let Some(i) = sent.and_then(|i| u32::try_from(i).ok()) {
            match self.extra_over.iter_mut().find(|(j, _)| *j == i) {
                Some(slot) => slot.1 = e,
                None => self.extra_over.push((i, e)),
            }
            return;
        }
        let extra = &self.ctx.extra_env;
        let added = self.added.iter_mut().find(|a| {
            matches!(a, Added::Extra { name: n, .. }
                if extra.get(*n).is_some_and(|(n, _)| n == name))
        });
        match added {
            Some(Added::Extra { value, .. }) => *value = e,
            _ => self.added.push(Added::Extra { name: e, value: e }),
        }
    }

    /// When every change leaves variables out (none is set, added, repeated or replaced by
    /// an extra variable) and the pairs are in their shortest encoding: per [`Known`] name,
    /// whether it is left out. The block is then the front server's buffer without those
    /// pairs ([`FrontParams::into_params_without`]), with nothing encoded again. `None`
    /// otherwise.
    pub(super) fn only_removals(&self) -> Option<LeftOut> {
        let p = self.p;
        if p.repeated()
            || !p.is_canonical()
            || !self.added.is_empty()
            || !self.extra_over.is_empty()
        {
            return None;
        }
        let mut removed: LeftOut = 0;
        for i in 0..KNOWN {
            let first = p.known(Known::from_index(u8::try_from(i).ok()?)?);
            if first == NONE {
                continue;
            }
            match (self.val.get(i)?, self.place.get(i)?) {
                (None, _) => removed |= 1 << i,
                (Some(Val::Pair(j)), Place::Pair(at)) if *j == first && *at == first => {}
                _ => return None,
            }
        }
        Some(removed)
    }

    /// The backend's variables: the pairs in their order with what changed, then what was
    /// added. Pairs passed on as they came are copied a run at a time, as they lie in the
    /// front server's buffer.
    pub(super) fn write(&self) -> Result<CgiParams, CgiError> {
        let p = self.p;
        let buf = p.encoded();
        let mut out = CgiParams::with_capacity(buf.len() + 256);
        let runs = p.is_canonical();
        let mut run = Run::default();
        let all = self.all();
        for (i, pair) in all.iter().enumerate() {
            if pair.first != NONE {
                continue;
            }
            let i = u32::try_from(i).unwrap_or(NONE);
            let (value, as_sent) = match Known::from_index(pair.known) {
                Some(k) => {
                    if self.place.get(k as usize) != Some(&Place::Pair(pair.start)) {
                        continue;
                    }
                    let Some(v) = self.val.get(k as usize).and_then(Option::as_ref) else {
                        continue;
                    };
                    (self.resolve(v), *v == Val::Pair(pair.start))
                }
                None => match self.extra_over.iter().find(|(j, _)| *j == i) {
                    Some(&(_, e)) => (self.resolve_extra(e), false),
                    None => (
                        all.get(pair.last as usize)
                            .map(|q| p.value(q))
                            .unwrap_or_default(),
                        pair.last == i,
                    ),
                },
            };
            if as_sent && runs {
                let start = pair.start as usize;
                if run.count == 0 || run.end != start {
                    run.flush(buf, &mut out);
                    run.start = start;
                }
                run.add(
                    pair.at as usize,
                    pair.name_len as usize,
                    pair.value_len as usize,
                );
                continue;
            }
            run.flush(buf, &mut out);
            out.push(p.name(pair), value)?;
        }
        run.flush(buf, &mut out);
        for (n, added) in self.added.iter().enumerate() {
            match *added {
                Added::Known(k) => {
                    if self.place.get(k as usize) == Some(&Place::Appended(n)) {
                        if let Some(v) = self.get(k) {
                            out.push(k.name(), v)?;
                        }
                    }
                }
                Added::Extra { name, value } => {
                    let name = self.ctx.extra_env.get(name).map(|(n, _)| &n[..]);
                    out.push(name.unwrap_or_default(), self.resolve_extra(value))?;
                }
            }
        }
        Ok(out)
    }

    /// Every pair, indexed: made the first time it is asked for.
    fn all(&self) -> &[PairAt] {
        self.all.get_or_init(|| self.p.index_all())
    }

    fn resolve_extra(&self, e: usize) -> &[u8] {
        self.ctx
            .extra_env
            .get(e)
            .map(|(_, v)| &v[..])
            .unwrap_or_default()
    }
}

/// Contiguous pairs of the front server's buffer passed on as they are.
#[derive(Debug, Default)]
struct Run {
    start: usize,
    end: usize,
    count: usize,
    longest_name: usize,
    longest_value: usize,
    total: usize,
}

impl Run {
    /// Adds the pair whose name starts at `at` (the run ends where it began).
    fn add(&mut self, at: usize, name_len: usize, value_len: usize) {
        self.end = at + name_len + value_len;
        self.count += 1;
        self.longest_name = self.longest_name.max(name_len);
        self.longest_value = self.longest_value.max(value_len);
        self.total += name_len + value_len;
    }

    /// Copies the run, if any, and starts an empty one.
    fn flush(&mut self, buf: &[u8], out: &mut CgiParams) {
        if self.count > 0 {
            let pairs = buf.get(self.start..self.end).unwrap_or_default();
            out.extend_encoded(
                pairs,
                self.count,
                self.longest_name,
                self.longest_value,
                self.total,
            );
        }
        *self = Run::default();
    }
}
