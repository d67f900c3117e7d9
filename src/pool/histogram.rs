//! The latency histograms of a pool's requests: fixed buckets, counted without a lock,
//! cumulative only when read.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// Upper bounds, in seconds, of the latency histogram buckets (a `+Inf` bucket follows).
pub const BUCKETS: [f64; 12] = [
    0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];

/// A latency histogram with fixed buckets, cumulative only when read.
#[derive(Debug, Default)]
pub struct Histogram {
    /// Observations per bucket (not cumulative); the last entry is the `+Inf` bucket.
    buckets: [AtomicU64; BUCKETS.len() + 1],
    /// Sum of all observations, in microseconds.
    sum_us: AtomicU64,
}

/// A histogram read at one moment.
#[derive(Debug, Clone, PartialEq)]
pub struct HistogramSnapshot {
    /// Cumulative counts, one per entry of [`BUCKETS`], then the `+Inf` bucket (= count).
    pub cumulative: Vec<u64>,
    /// Sum of all observations, in seconds.
    pub sum: f64,
}

impl HistogramSnapshot {
    /// Observations in all.
    pub fn count(&self) -> u64 {
        self.cumulative.last().copied().unwrap_or(0)
    }
}

impl Histogram {
    /// Records one observation.
    pub fn observe(&self, d: Duration) {
        let secs = d.as_secs_f64();
        let i = BUCKETS
            .iter()
            .position(|&b| secs <= b)
            .unwrap_or(BUCKETS.len());
        if let Some(b) = self.buckets.get(i) {
            b.fetch_add(1, Ordering::Relaxed);
        }
        let us = u64::try_from(d.as_micros()).unwrap_or(u64::MAX);
        self.sum_us.fetch_add(us, Ordering::Relaxed);
    }

    /// The buckets made cumulative, as OpenMetrics wants them.
    pub fn snapshot(&self) -> HistogramSnapshot {
        let mut total = 0u64;
        let cumulative = self
            .buckets
            .iter()
            .map(|b| {
                total = total.saturating_add(b.load(Ordering::Relaxed));
                total
            })
            .collect();
        HistogramSnapshot {
            cumulative,
            sum: self.sum_us.load(Ordering::Relaxed) as f64 / 1e6,
        }
    }
}
