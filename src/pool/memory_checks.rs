//! When to measure a worker's memory after a request (`max_memory`, ARCHITECTURE.md
//! decision 7): often when it grows fast or is close to the limit, rarely when it does not.
//!
//! A reading taken right after a request is noisy: the interpreter may still hold that
//! request's heap (php-cgi answers before it frees it) or may have released it already, and
//! PSS charges each shared page (php-cgi's own code, its libraries) to the processes sharing
//! it at that moment, so a worker's figure moves as its siblings, or any other php-cgi on the
//! host, start and exit. Two readings a request apart can differ by the size of one request's
//! heap plus several MiB of shared pages, either way. The estimate is therefore pessimistic:
//! it plans with the largest growth per request seen so far and twice that, and the gap at
//! most doubles from one check to the next (1, 2, 4 … [`MAX_GAP`]), so that one pair of
//! readings that understates the growth (the first still holding a request's heap, the
//! second not) cannot open a wide gap: it costs one check more, where a wide gap let a fast
//! leak serve request after request over its limit until the once-a-second sample.

/// Most requests a worker finishes between two memory checks, however far below
/// `max_memory` it is: bounds the cost to two small /proc reads per this many requests.
pub const MAX_GAP: u64 = 64;

/// What the checks after requests have learned of one worker.
#[derive(Debug, Clone, Copy, Default)]
pub struct MemoryWatch {
    /// The last reading and the requests that were asked to pass before it.
    last: Option<(u64, u64)>,
    /// The largest growth per request seen between two readings.
    max_growth: u64,
}

impl MemoryWatch {
    /// Takes a reading of `bytes` and says how many requests the worker may finish before
    /// the next check, given `limit`.
    ///
    /// From 80% of the limit every request is checked, as uWSGI's reload-on-rss does. Below
    /// it, the requests that fit in what is left up to 80% at twice the largest growth seen,
    /// but never more than twice the last gap (with no growth seen yet, twice the last gap:
    /// 1, 2, 4 … [`MAX_GAP`]). Without a previous reading, the next request, to learn the
    /// growth.
    pub fn next_gap(&mut self, limit: u64, bytes: u64) -> u64 {
        let near = limit / 5 * 4;
        let previous = self.last;
        let gap = match previous {
            _ if bytes >= near => 1,
            None => 1,
            Some((before, requests)) => {
                let growth = bytes.saturating_sub(before) / requests.max(1);
                self.max_growth = self.max_growth.max(growth);
                let widest = requests.saturating_mul(2).clamp(1, MAX_GAP);
                if self.max_growth == 0 {
                    widest
                } else {
                    ((near - bytes) / self.max_growth.saturating_mul(2)).clamp(1, widest)
                }
            }
        };
        self.last = Some((bytes, gap));
        gap
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;
    const LIMIT: u64 = 64 * MIB;
    const NEAR: u64 = LIMIT / 5 * 4;

    #[test]
    fn checks_come_closer_as_the_limit_nears() {
        let mut w = MemoryWatch::default();
        // First reading: learn the growth at the next request.
        assert_eq!(w.next_gap(LIMIT, 19 * MIB), 1);
        // 8 MiB per request, planned at 16: what is left up to 80% over 16 MiB.
        assert_eq!(w.next_gap(LIMIT, 27 * MIB), (NEAR - 27 * MIB) / (16 * MIB));
        // Near or over the limit: every request.
        assert_eq!(w.next_gap(LIMIT, 52 * MIB), 1);
        assert_eq!(MemoryWatch::default().next_gap(LIMIT, 70 * MIB), 1);
    }

    #[test]
    fn a_flat_worker_widens_its_gap_step_by_step() {
        let mut w = MemoryWatch::default();
        let gaps: Vec<u64> = (0..9).map(|_| w.next_gap(LIMIT, 20 * MIB)).collect();
        assert_eq!(gaps, [1, 2, 4, 8, 16, 32, 64, 64, 64]);
    }

    /// The pattern that let a leaking php-cgi serve two requests over its limit: the second
    /// reading came after the worker had freed its request heap, so the pair looked flat.
    /// One noisy pair no longer opens a wide gap, and the largest growth seen is kept.
    #[test]
    fn one_low_reading_does_not_hide_a_fast_leak() {
        let limit = 128 * MIB;
        let mut w = MemoryWatch::default();
        assert_eq!(w.next_gap(limit, 62 * MIB), 1);
        assert_eq!(w.next_gap(limit, 62 * MIB), 2);
        // Two requests later, 17 MiB each.
        assert_eq!(w.next_gap(limit, 96 * MIB), 1);
        // A reading lower than the last one keeps the growth learned.
        assert_eq!(w.next_gap(limit, 90 * MIB), 1);
    }

    /// corral's own readings in a run of tests/faults.rs beside php-cgi processes coming and
    /// going: the first still held the request's heap, or a larger share of php-cgi's pages,
    /// so a leak of about 17 MiB a request showed as 1.4 MiB. Planned from that pair, the
    /// gap was 15 requests, and the once-a-second sample found the worker at 159.5 MiB,
    /// 31.5 MiB over its 128 MiB limit, six requests later. The gap now at most doubles, and
    /// the next pair, two requests apart, shows the leak.
    #[test]
    fn one_understated_growth_does_not_open_a_wide_gap() {
        let limit = 128 * MIB;
        let mut w = MemoryWatch::default();
        assert_eq!(w.next_gap(limit, 60_216_320), 1);
        assert_eq!(w.next_gap(limit, 61_682_688), 2);
        // Two requests later, about 18 MiB each: close enough to check every request.
        assert_eq!(w.next_gap(limit, 96 * MIB), 1);
        // However little growth a pair shows, the gap grows 1, 2, 4 …
        let mut w = MemoryWatch::default();
        assert_eq!(w.next_gap(limit, 20 * MIB), 1);
        assert_eq!(w.next_gap(limit, 21 * MIB), 2);
        assert_eq!(w.next_gap(limit, 22 * MIB), 4);
    }
}
