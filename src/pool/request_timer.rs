//! Times one request's phases (queue wait, connect, time to the response head, total) into
//! its pool's histograms, and keeps the split for the access log.

use tokio::time::Instant;

use crate::pool::requests::{Phase, RequestStats};

/// Times one request's phases into its pool's histograms (the queue wait is timed by
/// [`RequestStats::acquire`]).
#[derive(Debug)]
pub struct RequestTimer {
    asked: Instant,
    phase: Instant,
    ended: bool,
    /// The split so far, for the access log: queue wait, connect, time to head, total.
    split: [std::time::Duration; 4],
}

impl RequestTimer {
    /// Starts timing a request that is about to ask for a slot.
    pub fn start() -> RequestTimer {
        let now = Instant::now();
        RequestTimer {
            asked: now,
            phase: now,
            ended: false,
            split: [std::time::Duration::ZERO; 4],
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
            self.split[0] = had - self.asked;
        }
    }

    /// A connection was had: records the connect time; the first-byte phase starts at the
    /// instant returned (the request's send time, so the backend need not read the clock).
    /// A kept connection (`kept`, taken from the idle list without awaiting) took no time
    /// the histograms can see, as they count in microseconds: its connect time is zero and
    /// the clock is not read again.
    pub fn connected(&mut self, stats: &RequestStats, kept: bool) -> Instant {
        if kept {
            self.split[1] = std::time::Duration::ZERO;
        } else {
            let now = Instant::now();
            self.split[1] = now - self.phase;
            self.phase = now;
        }
        stats.observe(Phase::Connect, self.split[1]);
        self.phase
    }

    /// The response head arrived: records the time to it.
    pub fn head(&mut self, stats: &RequestStats) {
        self.split[2] = self.phase.elapsed();
        stats.observe(Phase::FirstByte, self.split[2]);
    }

    /// The response body ended cleanly: records the total, once.
    pub fn end(&mut self, stats: &RequestStats) {
        if !self.ended {
            self.ended = true;
            self.split[3] = self.asked.elapsed();
            stats.observe(Phase::Total, self.split[3]);
        }
    }

    /// When the response body ended, if it did: read off the total, no clock read.
    pub fn ended_at(&self) -> Option<Instant> {
        self.ended.then(|| self.asked + self.split[3])
    }

    /// (queue wait, connect, time to head, total) as measured so far; the total is the time
    /// until now when the body has not ended.
    pub fn split(&self) -> [std::time::Duration; 4] {
        let mut split = self.split;
        if !self.ended {
            split[3] = self.asked.elapsed();
        }
        split
    }
}
