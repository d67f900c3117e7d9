//! The requests in progress on one FastCGI connection, by id: the first in a slot of its own
//! (a front server that does not multiplex, as nginx, Apache and Caddy do not, never needs
//! more and never pays for a map), any others in a map.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

use super::Active;

/// A map keyed by request id. Ids are the front server's, but a map holds at most
/// `Limits::max_concurrent_requests` of them (the writer's, one per id ever ended, at most
/// 65,535): a multiplicative hash spreads them well enough, without the cost of seeding and
/// running SipHash for every request.
pub(super) type IdMap<V> = HashMap<u16, V, BuildHasherDefault<IdHasher>>;

/// The hasher of [`IdMap`].
#[derive(Debug, Default)]
pub(super) struct IdHasher(u64);

impl Hasher for IdHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0 << 8 | u64::from(b)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        }
    }

    fn write_u16(&mut self, id: u16) {
        self.0 = u64::from(id).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    }
}

#[derive(Debug, Default)]
pub(super) struct Requests {
    one: Option<(u16, Active)>,
    more: IdMap<Active>,
}

impl Requests {
    pub(super) fn get(&self, id: &u16) -> Option<&Active> {
        match &self.one {
            Some((at, a)) if at == id => Some(a),
            _ => self.more.get(id),
        }
    }

    pub(super) fn get_mut(&mut self, id: &u16) -> Option<&mut Active> {
        match &mut self.one {
            Some((at, a)) if at == id => Some(a),
            _ => self.more.get_mut(id),
        }
    }

    /// Sets request `id`; the one it replaces, if any.
    pub(super) fn insert(&mut self, id: u16, active: Active) -> Option<Active> {
        match &mut self.one {
            Some((at, a)) if *at == id => Some(std::mem::replace(a, active)),
            Some(_) => self.more.insert(id, active),
            None => match self.more.remove(&id) {
                // Never both: an id lives in one place.
                Some(old) => {
                    self.one = Some((id, active));
                    Some(old)
                }
                None => {
                    self.one = Some((id, active));
                    None
                }
            },
        }
    }

    pub(super) fn remove(&mut self, id: &u16) -> Option<Active> {
        match &self.one {
            Some((at, _)) if at == id => self.one.take().map(|(_, a)| a),
            _ => self.more.remove(id),
        }
    }

    pub(super) fn is_empty(&self) -> bool {
        self.one.is_none() && self.more.is_empty()
    }

    pub(super) fn len(&self) -> usize {
        usize::from(self.one.is_some()) + self.more.len()
    }

    pub(super) fn clear(&mut self) {
        self.one = None;
        self.more.clear();
    }

    pub(super) fn values(&self) -> impl Iterator<Item = &Active> {
        self.one.iter().map(|(_, a)| a).chain(self.more.values())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn active(seq: u64) -> Active {
        Active {
            seq,
            keep_conn: true,
            body: None,
            stdin_ended: false,
            answer: None,
            task: None,
            begun: tokio::time::Instant::now(),
            busy: None,
        }
    }

    #[test]
    fn ids_are_found_wherever_they_live_and_live_once() {
        let mut t = Requests::default();
        assert!(t.is_empty());
        assert!(t.insert(1, active(1)).is_none());
        assert!(t.insert(2, active(2)).is_none());
        assert!(t.insert(3, active(3)).is_none());
        assert_eq!(t.len(), 3);
        assert_eq!(t.insert(2, active(20)).map(|a| a.seq), Some(2));
        assert_eq!(t.len(), 3);
        assert_eq!(t.remove(&1).map(|a| a.seq), Some(1));
        assert!(t.get(&1).is_none());
        // The slot is free again: an id from the map may move into it, never be in both.
        assert_eq!(t.insert(3, active(30)).map(|a| a.seq), Some(3));
        assert_eq!(t.len(), 2);
        assert_eq!(t.get(&3).map(|a| a.seq), Some(30));
        if let Some(a) = t.get_mut(&2) {
            a.seq = 21;
        }
        let mut seqs: Vec<u64> = t.values().map(|a| a.seq).collect();
        seqs.sort_unstable();
        assert_eq!(seqs, vec![21, 30]);
        assert!(t.remove(&9).is_none());
        t.clear();
        assert!(t.is_empty() && t.values().next().is_none());
    }
}
