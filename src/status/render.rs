//! The status page as text and JSON, from one list of fields per pool and per worker, so
//! both formats always say the same thing.
//!
//! Field names are php-fpm's where the concept is the same (`accepted conn`, `listen queue`,
//! `idle processes`, ...), so readers of php-fpm's page find their way; JSON keys are the same
//! labels, as php-fpm's `?json` does. corral's own fields follow in the same style. Text lines
//! are `label:` padded to 22 columns and the value, blocks of workers are separated by a line
//! of `*`, and pools by a blank line.

use std::fmt::Write as _;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::front::backlog::Backlog;
use crate::pool::requests::{BackendErrorKind, HistogramSnapshot, BUCKETS};
use crate::pool::slots::WorkerCounts;
use crate::pool::state::{RecycleReason, WorkerState, WorkerStatus};
use crate::status::collect::PoolReport;

/// One field value.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    /// A count.
    Int(u64),
    /// Seconds and other fractions.
    Float(f64),
    /// Text.
    Str(String),
    /// Yes or no.
    Bool(bool),
    /// A wall-clock time, in seconds since the epoch: text shows it as php-fpm does
    /// (`30/Nov/2026:08:00:00 +0000`), JSON as the number.
    Time(u64),
    /// A histogram's cumulative counts at each finite bound, in seconds (its `+Inf` bucket
    /// is its count): text `0.001:3 0.005:4 ...`, JSON `[[0.001,3],[0.005,4],...]`.
    Buckets(Vec<(f64, u64)>),
    /// Absent (text `-`, JSON `null`).
    None,
}

fn int(n: usize) -> Value {
    Value::Int(u64::try_from(n).unwrap_or(u64::MAX))
}

fn secs(d: Duration) -> Value {
    Value::Float(d.as_secs_f64())
}

fn age(d: Option<Duration>) -> Value {
    d.map_or(Value::None, secs)
}

fn buckets(h: &HistogramSnapshot) -> Value {
    Value::Buckets(
        BUCKETS
            .iter()
            .copied()
            .zip(h.cumulative.iter().copied())
            .collect(),
    )
}

/// A pool's fields, in the order the page lists them.
/// Requests waiting: corral's queue, or for a direct pool the kernel's accept queue of its
/// listener (null when the kernel could not be asked).
fn listen_queue(p: &PoolReport) -> Value {
    match (&p.info.direct, &p.listen) {
        (None, _) => int(p.slots.queued),
        (Some(_), Some(b)) => b.queued.map_or(Value::None, Value::Int),
        (Some(_), None) => Value::None,
    }
}

/// The most that may wait: `queue_size`, or a direct pool's listen backlog.
fn listen_queue_len(p: &PoolReport) -> Value {
    match (&p.info.direct, &p.listen) {
        (None, _) => Value::Int(u64::from(p.info.queue_size)),
        (Some(_), Some(b)) => b.max.map_or(Value::None, Value::Int),
        (Some(_), None) => Value::None,
    }
}

pub fn pool_fields(
    p: &PoolReport,
    started: SystemTime,
    now: SystemTime,
) -> Vec<(&'static str, Value)> {
    let r = &p.requests;
    let procs = p.processes();
    let since = now.duration_since(started).unwrap_or_default();
    let epoch = started
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .as_secs();
    let mut f = vec![
        ("pool", Value::Str(p.info.name.clone())),
        ("process manager", Value::Str(p.info.mode.to_owned())),
        ("start time", Value::Time(epoch)),
        ("start since", Value::Int(since.as_secs())),
        ("accepted conn", Value::Int(r.accepted)),
        ("listen queue", listen_queue(p)),
        ("max listen queue", int(r.max_queued)),
        ("listen queue len", listen_queue_len(p)),
        ("idle processes", int(procs.idle)),
        ("active processes", int(procs.active)),
        ("total processes", int(procs.total)),
        ("max active processes", int(r.max_in_flight)),
        ("max children reached", Value::Int(r.saturated)),
        // corral's own, configured limits beside live values.
        ("protocol", Value::Str(p.info.protocol.to_owned())),
        (
            "min workers",
            p.info
                .min_workers
                .map_or(Value::None, |n| Value::Int(n.into())),
        ),
        ("max workers", Value::Int(p.info.max_workers.into())),
        ("concurrency", Value::Int(p.info.concurrency.into())),
        ("max conns", Value::Int(p.info.max_conns.into())),
        ("in flight", int(p.slots.in_flight)),
        // Saturation: how long the oldest request has held its slot, and waited for one.
        ("oldest in flight", age(p.ages.oldest_in_flight)),
        ("oldest queued", age(p.ages.oldest_queued)),
        ("queue timeout", secs(p.info.queue_timeout)),
        ("queued total", Value::Int(r.queued_total)),
        ("rejected queue full", Value::Int(r.rejected_queue_full)),
        ("queue timeouts", Value::Int(r.queue_timeouts)),
        ("rejected stopping", Value::Int(r.rejected_closed)),
        // Waited for a slot, then dropped unsent: the front had closed meanwhile.
        ("front gone while queued", Value::Int(r.front_gone)),
        // Time from asking for a slot to having one, every request that got one.
        ("queue wait count", Value::Int(p.queue_wait.count())),
        ("queue wait sum", Value::Float(p.queue_wait.sum)),
        ("queue wait buckets", buckets(&p.queue_wait)),
        ("backend errors", Value::Int(r.backend_errors_total())),
    ];
    for (kind, n) in BackendErrorKind::ALL.iter().zip(r.backend_errors) {
        f.push((backend_error_label(*kind), Value::Int(n)));
    }
    // Requests a lost kept connection made corral send again (ARCHITECTURE.md invariant 6).
    f.push(("requests resent", Value::Int(r.resent)));
    if let Some(s) = &p.supervisor {
        for state in WORKER_STATES {
            f.push((state_label(state), int(p.workers_in(state))));
        }
        let c = &s.counters;
        let failure = crate::pool::driver::never_started(s, &p.recent);
        f.extend([
            ("spawned", Value::Int(c.spawned)),
            ("workers started", Value::Int(c.ready)),
            ("never started", Value::Bool(failure.is_some())),
            ("start failure", failure.map_or(Value::None, Value::Str)),
            ("spawn failures", Value::Int(c.spawn_failed)),
            ("crashes", Value::Int(c.crashed)),
            ("consecutive crashes", Value::Int(s.crashes.into())),
            ("throttled", Value::Bool(s.throttled)),
            ("throttle episodes", Value::Int(c.throttled)),
            ("start timeouts", Value::Int(c.start_timeouts)),
            ("request timeouts", Value::Int(c.request_timeouts)),
            ("kill timeouts", Value::Int(c.kill_timeouts)),
            ("refused connections", Value::Int(c.refused)),
            ("retired idle", Value::Int(c.retired_idle)),
            ("recycled", Value::Int(c.recycled.total())),
            ("recycled max requests", Value::Int(c.recycled.max_requests)),
            ("recycled max memory", Value::Int(c.recycled.max_memory)),
            (
                "recycled max pool memory",
                Value::Int(c.recycled.max_pool_memory),
            ),
            ("recycled max lifetime", Value::Int(c.recycled.max_lifetime)),
            ("recycled rolling", Value::Int(c.recycled.rolling)),
            ("recycled suspect", Value::Int(c.recycled.suspect)),
            ("reforks", Value::Int(c.reforks)),
            // The pool's memory beside its budget, and the rolling restart's bound.
            (
                "pool memory",
                s.memory_total.map_or(Value::None, Value::Int),
            ),
            (
                "max pool memory",
                p.info.max_pool_memory.map_or(Value::None, Value::Int),
            ),
            (
                "max surge",
                p.info
                    .max_surge
                    .map_or(Value::None, |n| Value::Int(n.into())),
            ),
            ("stopping", Value::Bool(s.stopping)),
        ]);
    }
    f
}

fn backend_error_label(kind: BackendErrorKind) -> &'static str {
    match kind {
        BackendErrorKind::Connect => "backend errors connect",
        BackendErrorKind::Io => "backend errors io",
        BackendErrorKind::Protocol => "backend errors protocol",
        BackendErrorKind::Refused => "backend errors refused",
        BackendErrorKind::Timeout => "backend errors timeout",
    }
}

/// Every worker state, in the order the page lists them.
pub const WORKER_STATES: [WorkerState; 8] = [
    WorkerState::Starting,
    WorkerState::Booting,
    WorkerState::Idle,
    WorkerState::Busy,
    WorkerState::Draining,
    WorkerState::Retiring,
    WorkerState::Stopping,
    WorkerState::Killed,
];

fn state_label(state: WorkerState) -> &'static str {
    match state {
        WorkerState::Starting => "workers starting",
        WorkerState::Booting => "workers booting",
        WorkerState::Idle => "workers idle",
        WorkerState::Busy => "workers busy",
        WorkerState::Draining => "workers draining",
        WorkerState::Retiring => "workers retiring",
        WorkerState::Stopping => "workers stopping",
        WorkerState::Killed => "workers killed",
    }
}

/// A worker state's name (php-fpm capitalises its states the same way).
pub fn state_name(state: WorkerState) -> &'static str {
    match state {
        WorkerState::Starting => "Starting",
        WorkerState::Booting => "Booting",
        WorkerState::Idle => "Idle",
        WorkerState::Busy => "Busy",
        WorkerState::Draining => "Draining",
        WorkerState::Retiring => "Retiring",
        WorkerState::Stopping => "Stopping",
        WorkerState::Killed => "Killed",
    }
}

fn recycle_name(reason: RecycleReason) -> &'static str {
    match reason {
        RecycleReason::MaxRequests => "max requests",
        RecycleReason::MaxMemory => "max memory",
        RecycleReason::MaxPoolMemory => "max pool memory",
        RecycleReason::MaxLifetime => "max lifetime",
        RecycleReason::Rolling => "rolling restart",
        RecycleReason::Suspect => "suspect",
    }
}

/// A spawned worker's fields.
pub fn worker_fields(w: &WorkerStatus) -> Vec<(&'static str, Value)> {
    vec![
        ("worker", Value::Int(w.key.0)),
        ("pid", w.pid.map_or(Value::None, |p| Value::Int(p.into()))),
        ("state", Value::Str(state_name(w.state).to_owned())),
        ("start since", Value::Int(w.age.as_secs())),
        ("requests", Value::Int(w.served)),
        ("in flight", int(w.in_flight)),
        ("accepting", Value::Bool(w.accepting)),
        ("memory", w.memory.map_or(Value::None, Value::Int)),
        (
            "recycle",
            w.recycle
                .map_or(Value::None, |r| Value::Str(recycle_name(r).to_owned())),
        ),
        ("children", children(&w.children)),
    ]
}

/// A worker's child pids, space-separated (`-` when it has none).
fn children(pids: &[u32]) -> Value {
    if pids.is_empty() {
        return Value::None;
    }
    let text: Vec<String> = pids.iter().map(u32::to_string).collect();
    Value::Str(text.join(" "))
}

/// An external server's fields: where it is, and whether it is up or out of rotation
/// since when (`max_fails` / `fail_timeout`).
pub fn server_fields(w: &WorkerCounts, now: SystemTime) -> Vec<(&'static str, Value)> {
    let state = match (w.down_for, w.accepting, w.in_flight) {
        (Some(_), _, _) => "Down",
        (None, false, _) => "Not accepting",
        (None, true, 0) => "Idle",
        (None, true, _) => "Busy",
    };
    let down_since = w.down_for.map_or(Value::None, |d| {
        let at = now.checked_sub(d).unwrap_or(UNIX_EPOCH);
        Value::Time(at.duration_since(UNIX_EPOCH).unwrap_or_default().as_secs())
    });
    vec![
        ("server", int(w.id.index)),
        ("address", Value::Str(w.address.to_string())),
        ("state", Value::Str(state.to_owned())),
        ("up", Value::Bool(w.down_for.is_none())),
        ("down since", down_since),
        ("requests", Value::Int(w.started)),
        ("in flight", int(w.in_flight)),
        ("accepting", Value::Bool(w.accepting)),
    ]
}

/// The per-worker rows of a pool.
pub fn rows(p: &PoolReport, now: SystemTime) -> Vec<Vec<(&'static str, Value)>> {
    match &p.supervisor {
        Some(s) => s.workers.iter().map(worker_fields).collect(),
        None => p.servers.iter().map(|w| server_fields(w, now)).collect(),
    }
}

/// The text page: one block per pool; with `full`, each followed by its worker rows.
pub fn text(pools: &[PoolReport], started: SystemTime, now: SystemTime, full: bool) -> String {
    let mut out = String::new();
    for (i, p) in pools.iter().enumerate() {
        if i > 0 {
            out.push('\n');
        }
        text_fields(&mut out, &pool_fields(p, started, now));
        if full {
            for row in rows(p, now) {
                out.push_str("\n************************\n");
                text_fields(&mut out, &row);
            }
        }
    }
    out
}

fn text_fields(out: &mut String, fields: &[(&'static str, Value)]) {
    for (label, value) in fields {
        let key = format!("{label}:");
        let _ = write!(out, "{key:<22}");
        if key.len() >= 22 {
            out.push(' ');
        }
        match value {
            Value::Int(n) => {
                let _ = write!(out, "{n}");
            }
            Value::Float(x) => {
                let _ = write!(out, "{x}");
            }
            Value::Str(s) => out.push_str(s),
            Value::Bool(b) => out.push_str(if *b { "yes" } else { "no" }),
            Value::Time(t) => out.push_str(&http_log_time(*t)),
            Value::Buckets(b) => {
                for (i, (le, n)) in b.iter().enumerate() {
                    let sep = if i > 0 { " " } else { "" };
                    let _ = write!(out, "{sep}{le}:{n}");
                }
            }
            Value::None => out.push('-'),
        }
        out.push('\n');
    }
}

/// A front listener's fields: its kernel accept queues (`front::backlog`).
pub fn listener_fields(l: &Backlog) -> Vec<(&'static str, Value)> {
    let opt = |n: Option<u64>| n.map_or(Value::None, Value::Int);
    vec![
        ("listener", Value::Str(l.address.clone())),
        ("protocol", Value::Str(l.protocol.to_owned())),
        ("accept queues", int(l.queues)),
        ("accept queue", opt(l.queued)),
        ("accept queue len", opt(l.max)),
    ]
}

/// The front listeners' blocks of the text page, after the pools (each opened by a blank
/// line).
pub fn listeners_text(listeners: &[Backlog]) -> String {
    let mut out = String::new();
    for l in listeners {
        out.push('\n');
        text_fields(&mut out, &listener_fields(l));
    }
    out
}

/// The JSON page: with `single` (the request named one pool) php-fpm's shape, one object
/// with a `processes` array under `full`; otherwise `{"pools": [...], "listeners": [...]}`
/// of such objects, with each front listener's accept queues.
pub fn json(
    pools: &[PoolReport],
    listeners: &[Backlog],
    started: SystemTime,
    now: SystemTime,
    full: bool,
    single: bool,
) -> String {
    let mut out = String::new();
    if !single {
        out.push_str("{\"pools\":[");
    }
    for (i, p) in pools.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        out.push('{');
        json_fields(&mut out, &pool_fields(p, started, now));
        if full {
            out.push_str(",\"processes\":[");
            for (j, row) in rows(p, now).iter().enumerate() {
                if j > 0 {
                    out.push(',');
                }
                out.push('{');
                json_fields(&mut out, row);
                out.push('}');
            }
            out.push(']');
        }
        out.push('}');
    }
    if !single {
        out.push_str("],\"listeners\":[");
        for (i, l) in listeners.iter().enumerate() {
            if i > 0 {
                out.push(',');
            }
            out.push('{');
            json_fields(&mut out, &listener_fields(l));
            out.push('}');
        }
        out.push_str("]}");
    }
    out.push('\n');
    out
}

fn json_fields(out: &mut String, fields: &[(&'static str, Value)]) {
    for (i, (label, value)) in fields.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        json_string(out, label);
        out.push(':');
        match value {
            Value::Int(n) | Value::Time(n) => {
                let _ = write!(out, "{n}");
            }
            Value::Float(x) if x.is_finite() => {
                let _ = write!(out, "{x}");
            }
            Value::Float(_) | Value::None => out.push_str("null"),
            Value::Buckets(b) => {
                out.push('[');
                for (i, (le, n)) in b.iter().enumerate() {
                    let sep = if i > 0 { "," } else { "" };
                    let _ = write!(out, "{sep}[{le},{n}]");
                }
                out.push(']');
            }
            Value::Str(s) => json_string(out, s),
            Value::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
        }
    }
}

/// Writes `s` as a JSON string: quotes, backslashes and control characters escaped.
pub fn json_string(out: &mut String, s: &str) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if u32::from(c) < 0x20 || c == '\u{2028}' || c == '\u{2029}' => {
                let _ = write!(out, "\\u{:04x}", u32::from(c));
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

/// `secs` since the epoch as php-fpm's text page shows a time: `%d/%b/%Y:%H:%M:%S +0000`
/// (always UTC).
pub fn http_log_time(secs: u64) -> String {
    const MONTHS: [&str; 12] = [
        "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
    ];
    let days = i64::try_from(secs / 86_400).unwrap_or(0);
    let rem = secs % 86_400;
    let (y, m, d) = civil_from_days(days);
    let month = usize::try_from(m - 1)
        .ok()
        .and_then(|i| MONTHS.get(i))
        .copied()
        .unwrap_or("Jan");
    format!(
        "{d:02}/{month}/{y}:{:02}:{:02}:{:02} +0000",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

/// Year, month (1-12) and day of a day count since 1970-01-01 (the proleptic Gregorian
/// calendar, by the usual era arithmetic).
fn civil_from_days(z: i64) -> (i64, i64, i64) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    (y, m, d)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_read_like_php_fpm() {
        assert_eq!(http_log_time(0), "01/Jan/1970:00:00:00 +0000");
        // 2000-02-29 12:34:56 UTC.
        assert_eq!(http_log_time(951_827_696), "29/Feb/2000:12:34:56 +0000");
        // 2026-11-30 08:00:11 UTC.
        assert_eq!(http_log_time(1_796_025_611), "30/Nov/2026:08:00:11 +0000");
    }

    #[test]
    fn json_strings_are_escaped() {
        let mut s = String::new();
        json_string(&mut s, "a\"b\\c\nd\u{1}é");
        assert_eq!(s, r#""a\"b\\c\nd\u0001é""#);
    }

    #[test]
    fn long_labels_keep_a_space() {
        let mut s = String::new();
        text_fields(
            &mut s,
            &[
                ("pool", Value::Str("www".into())),
                ("max children reached", Value::Int(0)),
                ("recycled max lifetime", Value::None),
            ],
        );
        assert_eq!(
            s,
            "pool:                 www\nmax children reached: 0\nrecycled max lifetime: -\n"
        );
    }
}
