//! The latency histograms of a pool's requests: fixed buckets, counted without a lock,
//! cumulative only when read; and how a counter is added to by the serving thread that owns
//! it (a load and a store, no locked instruction) or by any thread.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

/// Who adds to a counter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Writer {
    /// Only the calling thread ever writes it (its serving thread's counters): a relaxed
    /// load and store, which no other writer can interleave with, so nothing is lost.
    Owner,
    /// Any thread may write it: an atomic read-modify-write.
    Shared,
}

/// Adds `n` to `a` as `writer` may.
pub fn add(a: &AtomicU64, n: u64, writer: Writer) {
    match writer {
        Writer::Owner => a.store(a.load(Ordering::Relaxed).wrapping_add(n), Ordering::Relaxed),
        Writer::Shared => {
            a.fetch_add(n, Ordering::Relaxed);
        }
    }
}

/// Raises `a` to `v` if `v` is larger, as `writer` may.
pub fn raise(a: &AtomicUsize, v: usize, writer: Writer) {
    match writer {
        Writer::Owner => {
            if v > a.load(Ordering::Relaxed) {
                a.store(v, Ordering::Relaxed);
            }
        }
        Writer::Shared => {
            a.fetch_max(v, Ordering::Relaxed);
        }
    }
}

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
    /// Records one observation (from any thread).
    pub fn observe(&self, d: Duration) {
        self.observe_as(d, Writer::Shared);
    }

    /// Records one observation as `writer` may.
    pub fn observe_as(&self, d: Duration, writer: Writer) {
        let secs = d.as_secs_f64();
        let i = BUCKETS
            .iter()
            .position(|&b| secs <= b)
            .unwrap_or(BUCKETS.len());
        if let Some(b) = self.buckets.get(i) {
            add(b, 1, writer);
        }
        let us = u64::try_from(d.as_micros()).unwrap_or(u64::MAX);
        add(&self.sum_us, us, writer);
    }

    /// The buckets made cumulative, as OpenMetrics wants them.
    pub fn snapshot(&self) -> HistogramSnapshot {
        Histogram::sum_of(std::iter::once(self))
    }

    /// Several histograms (one per serving thread) added up, made cumulative.
    pub fn sum_of<'a>(parts: impl Iterator<Item = &'a Histogram> + Clone) -> HistogramSnapshot {
        let mut total = 0u64;
        let mut cumulative = Vec::with_capacity(BUCKETS.len() + 1);
        for i in 0..=BUCKETS.len() {
            let here = parts
                .clone()
                .filter_map(|h| h.buckets.get(i))
                .fold(0u64, |n, b| n.saturating_add(b.load(Ordering::Relaxed)));
            total = total.saturating_add(here);
            cumulative.push(total);
        }
        let sum_us = parts.fold(0u64, |n, h| {
            n.saturating_add(h.sum_us.load(Ordering::Relaxed))
        });
        HistogramSnapshot {
            cumulative,
            sum: sum_us as f64 / 1e6,
        }
    }
}
