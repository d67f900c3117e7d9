//! The run of pairs a front server sends with both lengths in their one-byte form (every
//! pair of nginx's `fastcgi.conf` and of common headers), indexed in one loop over the
//! buffer.
//!
//! It decides for each pair exactly what [`FrontParams::index`] decides (the first pair no
//! environment can carry, the [`Known`](super::Known) and common names, a repeat, the
//! count), with the index's state held in locals for the whole run and written back once:
//! per pair, two length bytes, the table probe, the value's word scan and a few bit
//! operations. A pair it cannot judge alone (a length in the four-byte form, a pair not
//! wholly in, the pair past the count limit) ends the run, and the caller takes it from
//! there by the general way. `tests::a_run_indexes_as_pair_by_pair` and the collector's
//! property test against pushed pairs (`front_tests`) hold it to `index`.

use super::{bad_name, bad_pair, class, sent_before, value_has_nul_cr_lf};
use super::{FrontParams, KNOWN, NONE};
use crate::cgi::front_names::lookup_at;

impl FrontParams {
    /// Indexes, from offset `from` (a pair's start) on, each pair whose two lengths take
    /// their one-byte form and which lies wholly in the buffer, as [`index`](Self::index)
    /// would one by one, while fewer than `max_count` pairs are indexed. Returns where it
    /// stopped: the buffer's end, or the first pair it left for the caller (a length in the
    /// four-byte form, a pair not wholly in, or one past `max_count`).
    pub(crate) fn index_short_run(&mut self, from: usize, max_count: usize) -> usize {
        let FrontParams {
            buf,
            known,
            count,
            bad,
            seen,
            common,
            repeated,
            ..
        } = self;
        let buf: &[u8] = buf;
        // Offsets are kept as 32 bits: a larger buffer is left to the general way, which
        // reports it.
        if u32::try_from(buf.len()).is_err() {
            return from;
        }
        let Some(mut rest) = buf.get(from..) else {
            return from;
        };
        // Pairs the count limit leaves room for.
        let room_at_start = max_count.saturating_sub(*count as usize);
        let mut room = room_at_start;
        let mut clean = bad.is_none();
        let (mut seen_now, mut common_now, mut rep) = (*seen, *common, *repeated);
        while let [name_len, value_len, tail @ ..] = rest {
            if (name_len | value_len) >= 0x80 || room == 0 {
                break;
            }
            let (name_len, value_len) = (usize::from(*name_len), usize::from(*value_len));
            let Some((pair, next)) = tail.split_at_checked(name_len + value_len) else {
                break;
            };
            // The pair's start, below 2^32: the buffer's length is.
            let start = (buf.len() - rest.len()) as u32;
            rest = next;
            room -= 1;
            // Ids past the table's for a name not in it.
            let id = lookup_at(pair, name_len).map_or(usize::MAX, usize::from);
            if clean {
                let name = pair.get(..name_len).unwrap_or_default();
                // A name from the table is a clean one: only the others need the scan.
                let bad_name = id == usize::MAX && bad_name(name);
                if bad_name || value_has_nul_cr_lf(pair, value_len) {
                    let value = pair.get(name_len..).unwrap_or_default();
                    *bad = Some(Box::new(bad_pair(bad_name, name, value)));
                    clean = false;
                }
            }
            if id < KNOWN {
                if let Some(slot) = known.get_mut(id) {
                    if *slot == NONE {
                        *slot = start;
                    } else {
                        rep = true;
                    }
                }
            } else if id != usize::MAX {
                let bit = 1u64 << (id - KNOWN);
                rep |= common_now & bit != 0;
                common_now |= bit;
            } else {
                let name = pair.get(..name_len).unwrap_or_default();
                let c = class(name);
                if seen_now & c != 0 && !rep && sent_before(buf, start as usize, name) {
                    rep = true;
                }
                seen_now |= c;
            }
        }
        // At most one pair per two bytes of a buffer under 4 GiB.
        let indexed = u32::try_from(room_at_start - room).unwrap_or(u32::MAX);
        *count = count.saturating_add(indexed);
        (*seen, *common, *repeated) = (seen_now, common_now, rep);
        buf.len() - rest.len()
    }
}

#[cfg(test)]
mod tests {
    use super::FrontParams;

    /// `FrontParams::push` indexes pair by pair: the run over the same bytes must leave the
    /// same state, and stop where the general way must take over.
    #[test]
    fn a_run_indexes_as_pair_by_pair() {
        let names: [&[u8]; 12] = [
            b"HTTP_HOST",
            b"SCRIPT_NAME",
            b"HTTP_ACCEPT",
            b"GATEWAY_INTERFACE",
            b"X_A",
            b"X_B",
            b"HTTPS",
            b"A=B",
            b"",
            b"HTTP_UPGRADE_INSECURE_REQUESTS",
            b"Q\0",
            b"X_A\r",
        ];
        let values: [&[u8]; 7] = [
            b"",
            b"v",
            b"a\nb",
            b"/var/www/html/x.php",
            b"\0",
            b"127.0.0.1:8080\r",
            b"x",
        ];
        for a in 0..names.len() {
            for b in 0..names.len() {
                for (va, vb) in [(0, 1), (2, 3), (3, 4), (5, 6), (6, 6), (3, 3)] {
                    let sent = [
                        (names[a], values[va]),
                        (names[b], values[vb]),
                        (names[a], values[vb]),
                    ];
                    let mut want = FrontParams::new();
                    let mut got = FrontParams::new();
                    for (n, v) in sent {
                        want.push(n, v).unwrap();
                        got.buf.push(n.len() as u8);
                        got.buf.push(v.len() as u8);
                        got.buf.extend_from_slice(n);
                        got.buf.extend_from_slice(v);
                    }
                    let end = got.index_short_run(0, usize::MAX);
                    assert_eq!(end, got.buf.len());
                    assert_eq!(got, want, "{sent:?}");
                    // A count limit stops the run before the pair past it.
                    let mut capped = FrontParams::new();
                    capped.buf = want.buf.clone();
                    let at = capped.index_short_run(0, 2);
                    assert_eq!(capped.len(), 2);
                    assert_eq!(
                        at,
                        4 + names[a].len() + names[b].len() + values[va].len() + values[vb].len()
                    );
                }
            }
        }
        // A pair not wholly in, and one in the four-byte form, end the run where they start.
        let mut p = FrontParams::new();
        p.buf
            .extend_from_slice(&[1, 1, b'A', b'b', 2, 5, b'C', b'D', b'e']);
        assert_eq!(p.index_short_run(0, usize::MAX), 4);
        assert_eq!(p.len(), 1);
        let mut p = FrontParams::new();
        p.buf
            .extend_from_slice(&[1, 1, b'A', b'b', 0x80, 0, 0, 1, 1, b'C', b'd']);
        assert_eq!(p.index_short_run(0, usize::MAX), 4);
        assert_eq!(p.index_short_run(4, usize::MAX), 4);
        let mut p = FrontParams::new();
        p.buf.push(1);
        assert_eq!(p.index_short_run(0, usize::MAX), 0);
    }
}
