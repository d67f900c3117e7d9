//! Times one request's phases (queue wait, connect, time to the response head, total) into
//! its pool's histograms, and keeps the split for the access log.

use std::time::Duration;

use tokio::time::Instant;

use crate::pool::requests::{Phase, RequestStats};

/// Times one request's phases into its pool's histograms (the queue wait is timed by
/// [`RequestStats::acquire`]).
///
/// The split is kept in nanoseconds rather than as `Duration`s, so the timer, which the
/// request's futures hold and move, is 72 bytes rather than 104.
#[derive(Debug)]
pub struct RequestTimer {
    asked: Instant,
    /// When the current phase started.
    phase: Instant,
    /// The split so far, for the access log, in nanoseconds: queue wait, connect, time to
    /// head, total.
    split: [u64; 4],
    ended: bool,
}

/// `d` in nanoseconds; past 584 years, the most a `u64` holds.
fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

impl RequestTimer {
    /// Starts timing a request that is about to ask for a slot.
    pub fn start() -> RequestTimer {
        let now = Instant::now();
        RequestTimer {
            asked: now,
            phase: now,
            split: [0; 4],
            ended: false,
        }
    }

    /// When the request started asking for a slot.
    pub fn asked(&self) -> Instant {
        self.asked
    }

    /// A slot was had at `had` (a clock reading the caller already made): the connect phase
    /// starts.
    pub fn slot_at(&mut self, had: Instant) {
        self.phase = had;
        if had != self.asked {
            self.split[0] = nanos(had - self.asked);
        }
    }

    /// A connection was had: records the connect time; the first-byte phase starts at the
    /// instant returned (the request's send time, so the backend need not read the clock).
    /// A kept connection (`kept`, taken from the idle list without awaiting) took no time
    /// the histograms can see, as they count in microseconds: its connect time is zero and
    /// the clock is not read again.
    pub fn connected(&mut self, stats: &RequestStats, kept: bool) -> Instant {
        if kept {
            self.split[1] = 0;
            stats.observe(Phase::Connect, Duration::ZERO);
            return self.phase;
        }
        let now = Instant::now();
        let connect = now - self.phase;
        self.split[1] = nanos(connect);
        self.phase = now;
        stats.observe(Phase::Connect, connect);
        now
    }

    /// The response head arrived: records the time to it.
    pub fn head(&mut self, stats: &RequestStats) {
        let to_head = self.phase.elapsed();
        self.split[2] = nanos(to_head);
        stats.observe(Phase::FirstByte, to_head);
    }

    /// The response body ended cleanly: records the total, once.
    pub fn end(&mut self, stats: &RequestStats) {
        if !self.ended {
            self.ended = true;
            let total = self.asked.elapsed();
            self.split[3] = nanos(total);
            stats.observe(Phase::Total, total);
        }
    }

    /// When the response body ended, if it did: read off the total, no clock read.
    pub fn ended_at(&self) -> Option<Instant> {
        self.ended
            .then(|| self.asked + Duration::from_nanos(self.split[3]))
    }

    /// (queue wait, connect, time to head, total) as measured so far; the total is the time
    /// until now when the body has not ended.
    pub fn split(&self) -> [Duration; 4] {
        let mut split = self.split.map(Duration::from_nanos);
        if !self.ended {
            split[3] = self.asked.elapsed();
        }
        split
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[tokio::test(start_paused = true)]
    async fn each_phase_is_timed_from_the_end_of_the_one_before() {
        let stats = RequestStats::new(4, 0);
        let mut timer = RequestTimer::start();
        let asked = timer.asked();
        tokio::time::advance(ms(3)).await;
        timer.slot_at(Instant::now());
        tokio::time::advance(ms(5)).await;
        let sent = timer.connected(&stats, false);
        assert_eq!(sent, asked + ms(8));
        tokio::time::advance(ms(7)).await;
        timer.head(&stats);
        assert_eq!(timer.split()[..3], [ms(3), ms(5), ms(7)]);
        assert_eq!(timer.ended_at(), None);
        tokio::time::advance(ms(11)).await;
        assert_eq!(timer.split()[3], ms(26), "the total so far");
        timer.end(&stats);
        tokio::time::advance(ms(100)).await;
        timer.end(&stats);
        assert_eq!(timer.split(), [ms(3), ms(5), ms(7), ms(26)]);
        assert_eq!(timer.ended_at(), Some(asked + ms(26)));
        assert_eq!(stats.histogram(Phase::Total).count(), 1, "ended once");
    }

    #[test]
    fn the_timer_stays_small() {
        // Every future of the request path that holds it moves it.
        assert!(std::mem::size_of::<RequestTimer>() <= 72);
    }

    #[tokio::test(start_paused = true)]
    async fn a_kept_connection_starts_the_next_phase_where_the_slot_was_had() {
        let stats = RequestStats::new(4, 0);
        let mut timer = RequestTimer::start();
        let asked = timer.asked();
        // A slot had at once: the clock was not read for it.
        timer.slot_at(asked);
        tokio::time::advance(ms(2)).await;
        assert_eq!(timer.connected(&stats, true), asked);
        tokio::time::advance(ms(4)).await;
        timer.head(&stats);
        assert_eq!(timer.split()[..3], [ms(0), ms(0), ms(6)]);
    }
}
