//! The last minutes of each pool, for the sparklines of the HTML status page: a sampler takes
//! one [`Sample`] per pool every [`SAMPLE_EVERY`] and keeps the latest [`KEEP`] (ten minutes)
//! in a ring per pool; `/status?history` writes them out with the supervisors' recent notices.
//!
//! A sample holds counters as they are (the reader turns `accepted` into req/s), gauges as
//! they are at that moment, and the request latency of the requests that ended since the
//! previous sample, estimated from the histogram buckets ([`quantile`]).
//!
//! The sampler reads pools only through [`collect`], like every status answer, so it never
//! waits on a worker or a driver; the rings are behind one lock held for a copy at most.

use std::collections::VecDeque;
use std::fmt::Write as _;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tokio_util::sync::CancellationToken;

use crate::gateway::Gateway;
use crate::pool::requests::{HistogramSnapshot, BUCKETS};
use crate::pool::state::{Notice, RecycleReason};
use crate::status::collect::{collect, PoolReport, StatusSource};
use crate::status::render::json_string;

/// How often the sampler takes a sample.
pub const SAMPLE_EVERY: Duration = Duration::from_secs(2);
/// Samples kept per pool: ten minutes' worth.
pub const KEEP: usize = 300;

/// One pool at one sampling moment.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Sample {
    /// Wall-clock time, in milliseconds since the epoch.
    pub at_ms: u64,
    /// Requests that got a slot, since start (a counter).
    pub accepted: u64,
    /// Requests refused or failed, since start (a counter): queue full, queue timeout,
    /// stopping, and backend errors.
    pub failed: u64,
    /// Requests waiting for a slot now.
    pub queued: usize,
    /// Requests holding a slot now.
    pub in_flight: usize,
    /// Median total time of the requests that ended since the previous sample, in
    /// seconds; `None` when none did.
    pub p50: Option<f64>,
    /// Their 99th percentile.
    pub p99: Option<f64>,
}

#[derive(Debug)]
struct Series {
    pool: String,
    samples: VecDeque<Sample>,
    /// The total-time histogram at the previous sample.
    last_total: Option<HistogramSnapshot>,
}

/// Every pool's ring of samples.
#[derive(Debug, Default)]
pub struct History {
    series: Mutex<Vec<Series>>,
}

impl History {
    /// Records one sample per pool in `pools`, taken at `at`. Pools no longer reported
    /// (removed by a reload) are dropped; new ones start an empty ring.
    pub fn record(&self, pools: &[PoolReport], at: SystemTime) {
        let at_ms = millis(at);
        let mut series = self.series.lock().unwrap_or_else(|p| p.into_inner());
        series.retain(|s| pools.iter().any(|p| p.info.name == s.pool));
        for p in pools {
            let i = match series.iter().position(|s| s.pool == p.info.name) {
                Some(i) => i,
                None => {
                    series.push(Series {
                        pool: p.info.name.clone(),
                        samples: VecDeque::with_capacity(KEEP),
                        last_total: None,
                    });
                    series.len() - 1
                }
            };
            let Some(s) = series.get_mut(i) else {
                continue;
            };
            let ended = delta(&p.total, s.last_total.as_ref());
            let r = &p.requests;
            let sample = Sample {
                at_ms,
                accepted: r.accepted,
                failed: r
                    .rejected_queue_full
                    .saturating_add(r.queue_timeouts)
                    .saturating_add(r.rejected_closed)
                    .saturating_add(r.backend_errors_total()),
                queued: p.slots.queued,
                in_flight: p.slots.in_flight,
                p50: quantile(&ended, 0.5),
                p99: quantile(&ended, 0.99),
            };
            if s.samples.len() >= KEEP {
                s.samples.pop_front();
            }
            s.samples.push_back(sample);
            s.last_total = Some(p.total.clone());
        }
    }

    /// The samples of `pool`, oldest first (empty for a pool never sampled).
    pub fn samples(&self, pool: &str) -> Vec<Sample> {
        let series = self.series.lock().unwrap_or_else(|p| p.into_inner());
        series
            .iter()
            .find(|s| s.pool == pool)
            .map(|s| s.samples.iter().copied().collect())
            .unwrap_or_default()
    }
}

fn millis(at: SystemTime) -> u64 {
    u64::try_from(
        at.duration_since(UNIX_EPOCH)
            .unwrap_or_default()
            .as_millis(),
    )
    .unwrap_or(0)
}

/// The per-bucket observations (cumulative, as in [`HistogramSnapshot::cumulative`]) made
/// between `before` and `now`; all of `now` without `before`, or when a bucket went down
/// (the counters were started afresh).
pub fn delta(now: &HistogramSnapshot, before: Option<&HistogramSnapshot>) -> Vec<u64> {
    match before {
        Some(b)
            if b.cumulative.len() == now.cumulative.len()
                && b.cumulative
                    .iter()
                    .zip(&now.cumulative)
                    .all(|(b, n)| b <= n) =>
        {
            now.cumulative
                .iter()
                .zip(&b.cumulative)
                .map(|(n, b)| n - b)
                .collect()
        }
        _ => now.cumulative.clone(),
    }
}

/// The `q` quantile (0 to 1) of a histogram of corral's [`BUCKETS`], given as cumulative
/// counts per bucket then `+Inf`, in seconds; see [`quantile_in`].
pub fn quantile(cumulative: &[u64], q: f64) -> Option<f64> {
    quantile_in(&BUCKETS, cumulative, q)
}

/// The `q` quantile (0 to 1) of a histogram with the finite upper `bounds` (ascending), given
/// as cumulative counts per bucket then `+Inf`: interpolated linearly inside the bucket that
/// holds it, as Prometheus' `histogram_quantile` does, so it is an estimate as coarse as the
/// buckets. A quantile in the `+Inf` bucket is the last finite bound. `None` without
/// observations.
pub fn quantile_in(bounds: &[f64], cumulative: &[u64], q: f64) -> Option<f64> {
    let count = *cumulative.last()?;
    if count == 0 || !(0.0..=1.0).contains(&q) {
        return None;
    }
    let rank = q * count as f64;
    let mut below = 0u64;
    for (i, &c) in cumulative.iter().enumerate() {
        if c as f64 >= rank && c > below {
            let Some(&upper) = bounds.get(i) else {
                return bounds.last().copied();
            };
            let lower = i
                .checked_sub(1)
                .and_then(|j| bounds.get(j))
                .copied()
                .unwrap_or(0.0);
            let inside = (c - below) as f64;
            let frac = ((rank - below as f64) / inside).clamp(0.0, 1.0);
            return Some(lower + (upper - lower) * frac);
        }
        below = c;
    }
    bounds.last().copied()
}

/// Samples every pool every [`SAMPLE_EVERY`] into `source.history` until `shutdown`.
pub async fn sample(gateway: Arc<Gateway>, source: Arc<StatusSource>, shutdown: CancellationToken) {
    let mut tick = tokio::time::interval(SAMPLE_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            () = shutdown.cancelled() => return,
        }
        let pools = collect(&gateway, &source, None, false);
        source.history.record(&pools, SystemTime::now());
    }
}

/// A notice's kind, as the page labels it.
fn notice_kind(n: &Notice) -> &'static str {
    match n {
        Notice::Crashed { .. } => "crashed",
        Notice::SpawnFailed { .. } => "spawn failed",
        Notice::StartTimedOut { .. } => "start timeout",
        Notice::RequestTimedOut { .. } => "request timeout",
        Notice::Refused { .. } => "refused",
        Notice::KillTimedOut { .. } => "kill timeout",
        Notice::Recycling { .. } => "recycled",
        Notice::CrashLoop { .. } => "crash loop",
        Notice::CrashLoopOver => "crash loop over",
        Notice::RollingRestartStopped { .. } => "rolling restart stopped",
    }
}

/// A notice's reason in a few words.
fn notice_reason(n: &Notice) -> String {
    match n {
        Notice::Crashed { status, .. } => status.to_string(),
        Notice::SpawnFailed { reason, .. } => reason.clone(),
        Notice::StartTimedOut { after, .. } => format!("not ready within {after:?}"),
        Notice::RequestTimedOut { .. } => "a request ran past request_timeout".to_owned(),
        Notice::Refused { .. } => "its socket refused a connection".to_owned(),
        Notice::KillTimedOut { after, .. } => format!("did not stop within {after:?}"),
        Notice::Recycling { reason, .. } => match reason {
            RecycleReason::MaxRequests => "max_requests",
            RecycleReason::MaxMemory => "max_memory",
            RecycleReason::MaxPoolMemory => "max_pool_memory (largest private memory)",
            RecycleReason::MaxLifetime => "max_lifetime",
            RecycleReason::Rolling => "rolling restart",
            RecycleReason::Suspect => "suspect (reset, no first byte in time, or bad bytes)",
        }
        .to_owned(),
        Notice::CrashLoop { crashes, retry_in } => {
            format!("{crashes} crashes in a row; one spawn every {retry_in:?}")
        }
        Notice::CrashLoopOver => "a worker served again".to_owned(),
        Notice::RollingRestartStopped { kept, .. } => {
            format!("its replacement could not come up; {kept} workers serve on")
        }
    }
}

fn json_number(out: &mut String, x: Option<f64>) {
    match x {
        Some(x) if x.is_finite() => {
            let _ = write!(out, "{x}");
        }
        _ => out.push_str("null"),
    }
}

fn json_array<T>(out: &mut String, key: &str, items: &[T], mut item: impl FnMut(&mut String, &T)) {
    out.push(',');
    json_string(out, key);
    out.push_str(":[");
    for (i, x) in items.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        item(out, x);
    }
    out.push(']');
}

/// `/status?history`: per pool (in `pools`' order), its samples as one array per field
/// (`t` in milliseconds since the epoch, then `accepted`, `failed`, `queue`, `in flight`,
/// `p50`, `p99`, the last two in seconds or `null`) and its recent notices (`events`:
/// `t`, `worker`, `pid`, `kind`, `reason`, `message`).
pub fn json(history: &History, pools: &[PoolReport], now: SystemTime) -> String {
    let mut out = String::new();
    let _ = write!(
        out,
        "{{\"every\":{},\"keep\":{KEEP},\"now\":{},\"pools\":[",
        SAMPLE_EVERY.as_secs_f64(),
        millis(now)
    );
    for (i, p) in pools.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        let samples = history.samples(&p.info.name);
        out.push_str("{\"pool\":");
        json_string(&mut out, &p.info.name);
        json_array(&mut out, "t", &samples, |o, s| {
            let _ = write!(o, "{}", s.at_ms);
        });
        json_array(&mut out, "accepted", &samples, |o, s| {
            let _ = write!(o, "{}", s.accepted);
        });
        json_array(&mut out, "failed", &samples, |o, s| {
            let _ = write!(o, "{}", s.failed);
        });
        json_array(&mut out, "queue", &samples, |o, s| {
            let _ = write!(o, "{}", s.queued);
        });
        json_array(&mut out, "in flight", &samples, |o, s| {
            let _ = write!(o, "{}", s.in_flight);
        });
        json_array(&mut out, "p50", &samples, |o, s| json_number(o, s.p50));
        json_array(&mut out, "p99", &samples, |o, s| json_number(o, s.p99));
        let events: Vec<_> = p.recent.iter().collect();
        json_array(&mut out, "events", &events, |o, e| {
            let _ = write!(o, "{{\"t\":{},\"worker\":", millis(e.at));
            match e.worker {
                Some(k) => {
                    let _ = write!(o, "{}", k.0);
                }
                None => o.push_str("null"),
            }
            o.push_str(",\"pid\":");
            match e.pid {
                Some(pid) => {
                    let _ = write!(o, "{pid}");
                }
                None => o.push_str("null"),
            }
            o.push_str(",\"kind\":");
            json_string(o, notice_kind(&e.notice));
            o.push_str(",\"reason\":");
            json_string(o, &notice_reason(&e.notice));
            o.push_str(",\"message\":");
            json_string(o, &e.notice.to_string());
            o.push('}');
        });
        out.push('}');
    }
    out.push_str("]}\n");
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cumulative(per_bucket: &[u64]) -> Vec<u64> {
        let mut total = 0;
        per_bucket
            .iter()
            .map(|n| {
                total += n;
                total
            })
            .collect()
    }

    #[test]
    fn quantiles_are_interpolated_inside_their_bucket() {
        // 100 observations: 50 under 1 ms, 49 in (5 ms, 10 ms], 1 in (0.5 s, 1 s].
        let mut per = vec![0u64; BUCKETS.len() + 1];
        per[0] = 50;
        per[2] = 49;
        per[8] = 1;
        let c = cumulative(&per);
        assert_eq!(quantile(&c, 0.5), Some(0.001));
        let p99 = quantile(&c, 0.99).unwrap();
        assert!((p99 - 0.01).abs() < 1e-12, "{p99}");
        let max = quantile(&c, 1.0).unwrap();
        assert!((max - 1.0).abs() < 1e-12, "{max}");
        // Half way through the first bucket.
        let mut per = vec![0u64; BUCKETS.len() + 1];
        per[0] = 2;
        assert_eq!(quantile(&cumulative(&per), 0.5), Some(0.0005));
        // Everything beyond the last bound: the last bound.
        let mut per = vec![0u64; BUCKETS.len() + 1];
        per[BUCKETS.len()] = 3;
        assert_eq!(quantile(&cumulative(&per), 0.99), Some(10.0));
        // Nothing observed, or nonsense.
        assert_eq!(quantile(&vec![0; BUCKETS.len() + 1], 0.5), None);
        assert_eq!(quantile(&[], 0.5), None);
        assert_eq!(quantile(&c, f64::NAN), None);
        assert_eq!(quantile(&c, 2.0), None);
    }

    fn report(name: &str, accepted: u64, per_bucket: &[u64]) -> PoolReport {
        let config = crate::config::parse(
            &format!(
                "[[listen]]\naddress = \"127.0.0.1:0\"\nprotocol = \"http\"\n\
                 [pools.{name}]\nservers = [\"127.0.0.1:9\"]\n"
            ),
            "t.toml",
        )
        .unwrap();
        let empty = HistogramSnapshot {
            cumulative: vec![0; BUCKETS.len() + 1],
            sum: 0.0,
        };
        let mut per = per_bucket.to_vec();
        per.resize(BUCKETS.len() + 1, 0);
        PoolReport {
            info: crate::status::collect::PoolInfo::of(&config.pools[0]),
            slots: crate::pool::slots::SlotStats {
                in_flight: 1,
                queued: 2,
                accepting_workers: 1,
            },
            ages: crate::pool::slots::SlotAges::default(),
            requests: crate::pool::requests::RequestSnapshot {
                accepted,
                queue_timeouts: 1,
                ..Default::default()
            },
            queue_wait: empty.clone(),
            connect: empty.clone(),
            first_byte: empty,
            total: HistogramSnapshot {
                cumulative: cumulative(&per),
                sum: 0.0,
            },
            supervisor: None,
            servers: Vec::new(),
            recent: Arc::default(),
            listen: None,
        }
    }

    #[test]
    fn rings_keep_ten_minutes_and_percentiles_are_per_interval() {
        let h = History::default();
        let t0 = UNIX_EPOCH + Duration::from_secs(1_000);
        h.record(&[report("a", 0, &[])], t0);
        h.record(&[report("a", 10, &[10])], t0 + SAMPLE_EVERY);
        // Ten more, all slower: the interval's median is theirs, not the lifetime's.
        h.record(
            &[report("a", 20, &[10, 0, 0, 0, 0, 10])],
            t0 + SAMPLE_EVERY * 2,
        );
        let s = h.samples("a");
        assert_eq!(s.len(), 3);
        assert_eq!((s[0].p50, s[0].p99), (None, None));
        assert_eq!(s[1].p50, Some(0.0005));
        assert!(s[2].p50.unwrap() > 0.05, "{:?}", s[2]);
        assert_eq!(
            (s[2].accepted, s[2].failed, s[2].queued, s[2].in_flight),
            (20, 1, 2, 1)
        );
        assert_eq!(s[2].at_ms, 1_004_000);
        let json = json(&h, &[report("a", 20, &[])], t0);
        assert!(
            json.starts_with("{\"every\":2,\"keep\":300,\"now\":1000000,\"pools\":[{\"pool\":\"a\",\"t\":[1000000,1002000,1004000],\"accepted\":[0,10,20]"),
            "{json}"
        );
        assert!(json.contains("\"p50\":[null,0.0005,"), "{json}");
        assert!(json.ends_with(",\"events\":[]}]}\n"), "{json}");
        for i in 0..KEEP + 5 {
            h.record(&[report("a", 20, &[])], t0 + SAMPLE_EVERY * (3 + i as u32));
        }
        assert_eq!(h.samples("a").len(), KEEP);
        // A pool gone after a reload goes; a new one starts empty.
        h.record(&[report("b", 0, &[])], t0);
        assert!(h.samples("a").is_empty());
        assert_eq!(h.samples("b").len(), 1);
    }

    #[test]
    fn deltas_restart_when_counters_do() {
        let a = HistogramSnapshot {
            cumulative: vec![1, 2, 3],
            sum: 0.0,
        };
        let b = HistogramSnapshot {
            cumulative: vec![1, 4, 7],
            sum: 0.0,
        };
        assert_eq!(delta(&b, Some(&a)), vec![0, 2, 4]);
        assert_eq!(delta(&a, Some(&b)), vec![1, 2, 3], "went down: all of now");
        assert_eq!(delta(&a, None), vec![1, 2, 3]);
    }
}
