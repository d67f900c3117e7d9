//! The status page in the OpenMetrics text format (which Prometheus also reads): every name
//! starts with `corral_`, every sample but the start time, the connection and the accept
//! queue families carries `pool="NAME"` (connections carry `listeners="front"` or `"status"`,
//! accept queues `listener="ADDRESS"` and `protocol`), counters end in `_total`, and the
//! exposition ends with `# EOF`.
//!
//! Families are written one at a time across all pools, because OpenMetrics requires each
//! family's samples to be together.

use std::fmt::Write as _;
use std::time::{SystemTime, UNIX_EPOCH};

use crate::front::backlog::Backlog;
use crate::front::limits::AdmissionSnapshot;
use crate::pool::requests::{BackendErrorKind, HistogramSnapshot, RequestSnapshot, BUCKETS};
use crate::status::collect::PoolReport;
use crate::status::render::{state_name, WORKER_STATES};

/// The content type of [`render`]'s output.
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// One sample: extra labels after `pool`, and the value.
type Sample = (Vec<(&'static str, String)>, f64);

struct Writer {
    out: String,
}

impl Writer {
    /// A family: `# TYPE` and `# HELP`, then each pool's samples. `suffix` is appended to
    /// the family name in samples (`_total` for counters).
    fn family(
        &mut self,
        pools: &[PoolReport],
        name: &str,
        kind: &str,
        help: &str,
        suffix: &str,
        samples: impl Fn(&PoolReport) -> Vec<Sample>,
    ) {
        let _ = writeln!(self.out, "# TYPE corral_{name} {kind}");
        let _ = writeln!(self.out, "# HELP corral_{name} {help}");
        for p in pools {
            for (labels, value) in samples(p) {
                let _ = write!(self.out, "corral_{name}{suffix}{{pool=");
                label_value(&mut self.out, &p.info.name);
                for (k, v) in &labels {
                    let _ = write!(self.out, ",{k}=");
                    label_value(&mut self.out, v);
                }
                let _ = writeln!(self.out, "}} {}", number(value));
            }
        }
    }

    fn gauge(
        &mut self,
        pools: &[PoolReport],
        name: &str,
        help: &str,
        f: impl Fn(&PoolReport) -> f64,
    ) {
        self.family(pools, name, "gauge", help, "", |p| vec![(Vec::new(), f(p))]);
    }

    fn counter(
        &mut self,
        pools: &[PoolReport],
        name: &str,
        help: &str,
        f: impl Fn(&RequestSnapshot) -> u64,
    ) {
        self.family(pools, name, "counter", help, "_total", |p| {
            vec![(Vec::new(), f(&p.requests) as f64)]
        });
    }

    fn histogram(
        &mut self,
        pools: &[PoolReport],
        name: &str,
        help: &str,
        f: impl Fn(&PoolReport) -> &HistogramSnapshot,
    ) {
        let _ = writeln!(self.out, "# TYPE corral_{name} histogram");
        let _ = writeln!(self.out, "# UNIT corral_{name} seconds");
        let _ = writeln!(self.out, "# HELP corral_{name} {help}");
        for p in pools {
            let h = f(p);
            let bounds = BUCKETS
                .iter()
                .map(|b| number(*b))
                .chain(std::iter::once("+Inf".to_owned()));
            for (le, n) in bounds.zip(&h.cumulative) {
                let _ = write!(self.out, "corral_{name}_bucket{{pool=");
                label_value(&mut self.out, &p.info.name);
                let _ = writeln!(self.out, ",le=\"{le}\"}} {n}");
            }
            for (suffix, value) in [("count", h.count() as f64), ("sum", h.sum)] {
                let _ = write!(self.out, "corral_{name}_{suffix}{{pool=");
                label_value(&mut self.out, &p.info.name);
                let _ = writeln!(self.out, "}} {}", number(value));
            }
        }
    }
}

/// A number as OpenMetrics writes it (integers without a fraction).
fn number(x: f64) -> String {
    if x.is_nan() {
        "NaN".to_owned()
    } else if x.fract() == 0.0 && x.abs() < 1e15 {
        format!("{x:.0}")
    } else {
        format!("{x}")
    }
}

/// A quoted label value with `\`, `"` and newlines escaped.
fn label_value(out: &mut String, v: &str) {
    out.push('"');
    for c in v.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
    out.push('"');
}

/// A connection family: name, type, help, and its value in one table.
type ConnectionFamily = (
    &'static str,
    &'static str,
    &'static str,
    fn(&AdmissionSnapshot) -> u64,
);

/// The connection families: one sample per table, labelled by its listeners.
fn connections(out: &mut String, tables: &[AdmissionSnapshot]) {
    let families: [ConnectionFamily; 4] = [
        ("connections", "gauge", "Open connections.", |t| {
            t.open as u64
        }),
        (
            "max_connections",
            "gauge",
            "Cap on open connections.",
            |t| t.max as u64,
        ),
        (
            "connections_evicted",
            "counter",
            "Idle connections closed to make room under a connection cap.",
            |t| t.evicted,
        ),
        (
            "connections_refused",
            "counter",
            "Connections refused beyond a cap while every counted one was busy.",
            |t| t.refused,
        ),
    ];
    for (name, kind, help, value) in families {
        let suffix = if kind == "counter" { "_total" } else { "" };
        let _ = writeln!(out, "# TYPE corral_{name} {kind}");
        let _ = writeln!(out, "# HELP corral_{name} {help}");
        for t in tables {
            let _ = write!(out, "corral_{name}{suffix}{{listeners=");
            label_value(out, t.name);
            let _ = writeln!(out, "}} {}", value(t));
        }
    }
}

/// The front listeners' kernel accept queues: one sample per listener, labelled by its
/// address and protocol (none where the kernel could not be asked).
fn accept_queues(out: &mut String, listeners: &[Backlog]) {
    type Family = (&'static str, &'static str, fn(&Backlog) -> Option<u64>);
    let families: [Family; 2] = [
        (
            "listener_accept_queue",
            "Connections the kernel completed that corral has not accepted yet.",
            |l| l.queued,
        ),
        (
            "listener_accept_queue_max",
            "The most connections the listener's accept queues hold (its backlog).",
            |l| l.max,
        ),
    ];
    for (name, help, value) in families {
        let _ = writeln!(out, "# TYPE corral_{name} gauge");
        let _ = writeln!(out, "# HELP corral_{name} {help}");
        for l in listeners {
            let Some(v) = value(l) else { continue };
            let _ = write!(out, "corral_{name}{{listener=");
            label_value(out, &l.address);
            let _ = write!(out, ",protocol=");
            label_value(out, l.protocol);
            let _ = writeln!(out, "}} {v}");
        }
    }
}

/// The exposition for `pools`, the connection tables and the front listeners.
pub fn render(
    pools: &[PoolReport],
    started: SystemTime,
    tables: &[AdmissionSnapshot],
    listeners: &[Backlog],
) -> String {
    let mut w = Writer { out: String::new() };
    let start = started
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .as_secs_f64();
    w.family(
        pools,
        "pool",
        "info",
        "A configured pool: its backend protocol and process manager.",
        "_info",
        |p| {
            vec![(
                vec![
                    ("protocol", p.info.protocol.to_owned()),
                    ("mode", p.info.mode.to_owned()),
                ],
                1.0,
            )]
        },
    );
    // One process, one start: this family alone has no pool label.
    w.out.push_str(
        "# TYPE corral_start_time_seconds gauge\n\
         # HELP corral_start_time_seconds When corral started serving, in seconds since the epoch.\n",
    );
    let _ = writeln!(w.out, "corral_start_time_seconds {}", number(start));
    w.gauge(
        pools,
        "max_workers",
        "Configured most workers (servers, for an external pool).",
        |p| p.info.max_workers.into(),
    );
    w.gauge(
        pools,
        "max_conns",
        "Configured cap on concurrent backend requests.",
        |p| p.info.max_conns.into(),
    );
    w.gauge(
        pools,
        "queue_size",
        "Configured most requests that may wait for a slot.",
        |p| p.info.queue_size.into(),
    );
    w.gauge(
        pools,
        "queue_timeout_seconds",
        "Configured longest wait for a slot.",
        |p| p.info.queue_timeout.as_secs_f64(),
    );
    w.gauge(pools, "in_flight", "Requests holding a slot now.", |p| {
        p.slots.in_flight as f64
    });
    w.gauge(
        pools,
        "queue_length",
        "Requests waiting for a slot now (php-fpm's listen queue).",
        |p| p.slots.queued as f64,
    );
    w.gauge(
        pools,
        "oldest_in_flight_seconds",
        "How long the oldest request in flight has held its slot (0 when none is).",
        |p| p.ages.oldest_in_flight.map_or(0.0, |d| d.as_secs_f64()),
    );
    w.gauge(
        pools,
        "oldest_queued_seconds",
        "How long the oldest waiting request has waited for a slot (0 when none waits).",
        |p| p.ages.oldest_queued.map_or(0.0, |d| d.as_secs_f64()),
    );
    w.gauge(
        pools,
        "queue_length_max",
        "Most requests ever waiting at once.",
        |p| p.requests.max_queued as f64,
    );
    w.gauge(
        pools,
        "in_flight_max",
        "Most requests ever holding a slot at once.",
        |p| p.requests.max_in_flight as f64,
    );
    w.counter(
        pools,
        "requests_accepted",
        "Requests that got a slot (php-fpm's accepted conn).",
        |r| r.accepted,
    );
    w.counter(
        pools,
        "requests_queued",
        "Requests that had to wait for a slot.",
        |r| r.queued_total,
    );
    w.counter(
        pools,
        "saturations",
        "Times every slot was busy and requests began to queue (php-fpm's max children reached).",
        |r| r.saturated,
    );
    w.family(
        pools,
        "requests_rejected",
        "counter",
        "Requests refused without a backend response, by reason.",
        "_total",
        |p| {
            let r = &p.requests;
            [
                ("queue_full", r.rejected_queue_full),
                ("queue_timeout", r.queue_timeouts),
                ("stopping", r.rejected_closed),
                ("front_gone", r.front_gone),
            ]
            .into_iter()
            .map(|(reason, n)| (vec![("reason", reason.to_owned())], n as f64))
            .collect()
        },
    );
    w.family(
        pools,
        "backend_errors",
        "counter",
        "Failed backend exchanges, by kind.",
        "_total",
        |p| {
            BackendErrorKind::ALL
                .iter()
                .zip(p.requests.backend_errors)
                .map(|(k, n)| (vec![("kind", k.name().to_owned())], n as f64))
                .collect()
        },
    );
    w.family(
        pools,
        "requests_resent",
        "counter",
        "Requests sent once more on a new connection after their kept connection was lost before the answer.",
        "_total",
        |p| vec![(Vec::new(), p.requests.resent as f64)],
    );
    w.family(
        pools,
        "workers",
        "gauge",
        "Workers (servers, for an external pool) by state.",
        "",
        |p| match &p.supervisor {
            Some(_) => WORKER_STATES
                .iter()
                .map(|s| {
                    (
                        vec![("state", state_name(*s).to_lowercase())],
                        p.workers_in(*s) as f64,
                    )
                })
                .collect(),
            None => {
                let c = p.processes();
                vec![
                    (vec![("state", "idle".to_owned())], c.idle as f64),
                    (vec![("state", "busy".to_owned())], c.active as f64),
                    (
                        vec![("state", "not_accepting".to_owned())],
                        (c.total - c.idle - c.active) as f64,
                    ),
                ]
            }
        },
    );
    let spawned: Vec<PoolReport> = pools
        .iter()
        .filter(|p| p.supervisor.is_some())
        .cloned()
        .collect();
    let counters = |p: &PoolReport| {
        p.supervisor
            .as_ref()
            .map(|s| s.counters)
            .unwrap_or_default()
    };
    w.family(
        &spawned,
        "worker_recycles",
        "counter",
        "Workers recycled, by reason.",
        "_total",
        |p| {
            let r = counters(p).recycled;
            [
                ("max_requests", r.max_requests),
                ("max_memory", r.max_memory),
                ("max_pool_memory", r.max_pool_memory),
                ("max_lifetime", r.max_lifetime),
                ("rolling", r.rolling),
                ("suspect", r.suspect),
            ]
            .into_iter()
            .map(|(reason, n)| (vec![("reason", reason.to_owned())], n as f64))
            .collect()
        },
    );
    w.family(
        &spawned,
        "worker_spawns",
        "counter",
        "Workers started.",
        "_total",
        |p| vec![(Vec::new(), counters(p).spawned as f64)],
    );
    w.family(
        &spawned,
        "reforks",
        "counter",
        "Reforks (refork_after): promoted templates that became ready, the older workers then replaced.",
        "_total",
        |p| vec![(Vec::new(), counters(p).reforks as f64)],
    );
    w.family(
        &spawned,
        "worker_crashes",
        "counter",
        "Workers that exited without being asked to.",
        "_total",
        |p| vec![(Vec::new(), counters(p).crashed as f64)],
    );
    w.family(
        &spawned,
        "worker_kills",
        "counter",
        "Workers killed, by reason.",
        "_total",
        |p| {
            let c = counters(p);
            [
                ("start_timeout", c.start_timeouts),
                ("request_timeout", c.request_timeouts),
                ("kill_timeout", c.kill_timeouts),
                ("refused", c.refused),
            ]
            .into_iter()
            .map(|(reason, n)| (vec![("reason", reason.to_owned())], n as f64))
            .collect()
        },
    );
    // The pool's memory budget (`max_pool_memory`): the sampled sum beside its limit.
    let budgeted: Vec<PoolReport> = spawned
        .iter()
        .filter(|p| p.info.max_pool_memory.is_some())
        .cloned()
        .collect();
    w.family(
        &budgeted,
        "pool_memory_bytes",
        "gauge",
        "PSS summed over the pool's workers at the last sample.",
        "",
        |p| {
            let total = p.supervisor.as_ref().and_then(|s| s.memory_total);
            total.map_or_else(Vec::new, |b| vec![(Vec::new(), b as f64)])
        },
    );
    w.family(
        &budgeted,
        "max_pool_memory_bytes",
        "gauge",
        "The pool's memory budget (max_pool_memory).",
        "",
        |p| {
            let budget = p.info.max_pool_memory.unwrap_or(0);
            vec![(Vec::new(), budget as f64)]
        },
    );
    w.family(
        &spawned,
        "throttled",
        "gauge",
        "1 while spawns are throttled by a crash loop.",
        "",
        |p| {
            let on = p.supervisor.as_ref().is_some_and(|s| s.throttled);
            vec![(Vec::new(), if on { 1.0 } else { 0.0 })]
        },
    );
    w.histogram(
        pools,
        "queue_wait_seconds",
        "Time from asking for a slot to having one.",
        |p| &p.queue_wait,
    );
    w.histogram(
        pools,
        "connect_seconds",
        "Time from having a slot to having a backend connection.",
        |p| &p.connect,
    );
    w.histogram(
        pools,
        "first_byte_seconds",
        "Time from sending the request to the backend's response head.",
        |p| &p.first_byte,
    );
    w.histogram(
        pools,
        "request_seconds",
        "Time from asking for a slot to the end of the response body (clean ends only).",
        |p| &p.total,
    );
    connections(&mut w.out, tables);
    accept_queues(&mut w.out, listeners);
    w.out.push_str("# EOF\n");
    w.out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_and_labels_are_written_as_openmetrics_wants() {
        assert_eq!(number(3.0), "3");
        assert_eq!(number(0.25), "0.25");
        let mut s = String::new();
        label_value(&mut s, "a\"b\\c\nd");
        assert_eq!(s, r#""a\"b\\c\nd""#);
    }
}
