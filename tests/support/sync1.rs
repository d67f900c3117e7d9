//! Helpers of the tests that wait on events rather than time (branch sync1): children of a
//! process from /proc, the timestamps of corral's log lines and the gaps between them (a
//! backoff seen growing), the memory readings `max_memory` acted on, as corral logged them,
//! and a load of tagged requests that counts what failed.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::Duration;

use super::server::parse_response;

/// Seconds since midnight (UTC) of a corral log line's timestamp
/// (`2026-12-01T22:49:17.962294Z ...`).
pub fn logged_at(line: &str) -> f64 {
    let time = line
        .split_whitespace()
        .next()
        .and_then(|t| t.split_once('T'))
        .map(|(_, t)| t.trim_end_matches('Z'))
        .unwrap_or_else(|| panic!("no timestamp in {line:?}"));
    let parts: Vec<f64> = time.split(':').map(|p| p.parse().unwrap()).collect();
    parts[0] * 3600.0 + parts[1] * 60.0 + parts[2]
}

/// For each `(from, to)`: the seconds from the first line of `log` containing `from` to the
/// first containing `to` (across midnight too). Panics when a line is missing.
pub fn gaps(log: &str, pairs: &[(String, String)]) -> Vec<f64> {
    let at = |needle: &str| {
        let line = log
            .lines()
            .find(|l| l.contains(needle))
            .unwrap_or_else(|| panic!("no {needle:?} in:\n{log}"));
        logged_at(line)
    };
    pairs
        .iter()
        .map(|(from, to)| (at(to) - at(from)).rem_euclid(86_400.0))
        .collect()
}

/// Asserts that gap `k` is at least `base` doubled `k` times (5% off for the clocks): a
/// backoff that grows. A loaded machine only makes gaps longer.
pub fn assert_backoff_doubles(gaps: &[f64], base: f64, log: &str) {
    eprintln!("gaps (s): {gaps:?}");
    for (k, gap) in gaps.iter().enumerate() {
        let backoff = base * f64::from(1u32 << k);
        assert!(
            *gap >= backoff * 0.95,
            "gap {k} is {gap:.3} s, shorter than its {backoff} s backoff: {gaps:?}\n{log}"
        );
    }
}

/// One reading of a worker's memory that `max_memory` acted on, from corral's debug log;
/// shown as `REQUESTS:BYTES`, with `(sample)` for the once-a-second sample.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct MemoryReading {
    /// The requests the worker had been given by then.
    pub requests: u64,
    /// PSS of its process tree, in bytes.
    pub bytes: u64,
    /// Taken after a request (while the worker was held for it); otherwise the
    /// once-a-second sample, which corral logs only over the limit.
    pub after_request: bool,
}

impl std::fmt::Debug for MemoryReading {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let sample = if self.after_request { "" } else { " (sample)" };
        write!(f, "{}:{}{sample}", self.requests, self.bytes)
    }
}

/// corral's readings of the worker with pid `pid` in `log`, in order (lines `memory read
/// after a request` and `memory sample over max_memory`, written at `log_level = "debug"`).
pub fn memory_readings(log: &str, pid: u32) -> Vec<MemoryReading> {
    let field = |line: &str, name: &str| -> Option<u64> {
        let (_, rest) = line.split_once(&format!(" {name}="))?;
        rest.split_whitespace().next()?.parse().ok()
    };
    log.lines()
        .filter_map(|line| {
            let after_request = line.contains("memory read after a request");
            if !after_request && !line.contains("memory sample over max_memory") {
                return None;
            }
            (field(line, "pid")? == u64::from(pid)).then_some(())?;
            Some(MemoryReading {
                requests: field(line, "requests")?,
                bytes: field(line, "bytes")?,
                after_request,
            })
        })
        .collect()
}

/// Whether `readings` (of one worker, in order) show it stopped right after it passed
/// `limit`, having been given `served` requests: none once a reading showed it over (the
/// once-a-second sample may catch it during one), and read after its requests often enough
/// on the way (the first one, then gaps that at most double, and every request from 80% of
/// the limit). `Err` says what went wrong.
pub fn stopped_in_time(readings: &[MemoryReading], served: u64, limit: u64) -> Result<(), String> {
    let over = readings
        .iter()
        .position(|r| r.bytes > limit)
        .ok_or("no reading over the limit")?;
    if readings[over].requests != served {
        return Err(format!(
            "it was given {served} requests, {} when corral read it over the limit",
            readings[over].requests
        ));
    }
    let (mut read, mut allowed) = (0, 1);
    for r in readings[..over].iter().filter(|r| r.after_request) {
        let gap = r.requests.saturating_sub(read);
        if gap > allowed {
            return Err(format!(
                "{gap} requests unread before request {}",
                r.requests
            ));
        }
        allowed = if r.bytes >= limit / 5 * 4 { 1 } else { 2 * gap };
        read = r.requests;
    }
    let gap = served.saturating_sub(read);
    if gap > allowed {
        return Err(format!("its last {gap} requests went unread"));
    }
    Ok(())
}

/// One GET with `Connection: close`: the status code, or why there was none. Never panics,
/// so load threads can count failures.
pub fn try_get(addr: SocketAddr, target: &str, timeout: Duration) -> Result<(u16, String), String> {
    let mut s = TcpStream::connect_timeout(&addr, timeout).map_err(|e| format!("connect: {e}"))?;
    s.set_read_timeout(Some(timeout))
        .map_err(|e| e.to_string())?;
    s.set_write_timeout(Some(timeout))
        .map_err(|e| e.to_string())?;
    let head = format!("GET {target} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n");
    s.write_all(head.as_bytes())
        .map_err(|e| format!("write: {e}"))?;
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).map_err(|e| format!("read: {e}"))?;
    if !raw.starts_with(b"HTTP/1.1 ") {
        return Err(format!("no response: {:?}", String::from_utf8_lossy(&raw)));
    }
    let r = parse_response(&raw);
    Ok((r.status, r.text()))
}

/// Pids of the live (not zombie) processes whose parent is `parent`.
pub fn children(parent: u32) -> Vec<u32> {
    let mut out = Vec::new();
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return out;
    };
    for entry in entries.flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
            continue;
        };
        // The fields after the command name (which may hold spaces) start at the last ')'.
        let Some(rest) = stat.rsplit_once(')').map(|(_, r)| r) else {
            continue;
        };
        let fields: Vec<&str> = rest.split_whitespace().collect();
        if fields.first() != Some(&"Z") && fields.get(1) == Some(&parent.to_string().as_str()) {
            out.push(pid);
        }
    }
    out
}

/// Tiny xorshift so the killer picks workers without a dependency.
pub struct Rng(pub u64);

impl Rng {
    pub fn below(&mut self, n: usize) -> usize {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        (self.0 % n.max(1) as u64) as usize
    }
}

/// What a load run saw.
#[derive(Debug, Default)]
pub struct Load {
    pub ok: AtomicU64,
    pub failed: AtomicU64,
    pub errors: std::sync::Mutex<Vec<String>>,
    /// The target of every failed request, as sent (each is unique).
    pub failed_targets: std::sync::Mutex<Vec<String>>,
}

/// `threads` clients request `target` back to back until `stop` is set, each request with
/// a query of its own (`?c=CLIENT&n=SEQ`), so the access log tells them apart; each answer
/// that is not a 200 (or no answer) counts as failed.
pub fn run_load(
    addr: SocketAddr,
    target: &'static str,
    threads: usize,
    stop: &Arc<AtomicBool>,
    load: &Arc<Load>,
) -> Vec<thread::JoinHandle<()>> {
    (0..threads)
        .map(|client| {
            let stop = Arc::clone(stop);
            let load = Arc::clone(load);
            thread::spawn(move || {
                let mut seq = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    seq += 1;
                    let target = format!("{target}?c={client}&n={seq}");
                    match try_get(addr, &target, Duration::from_secs(20)) {
                        Ok((200, _)) => {
                            load.ok.fetch_add(1, Ordering::Relaxed);
                        }
                        other => {
                            load.failed.fetch_add(1, Ordering::Relaxed);
                            load.failed_targets.lock().unwrap().push(target);
                            let mut errors = load.errors.lock().unwrap();
                            if errors.len() < 20 {
                                errors.push(format!("{other:?}"));
                            }
                        }
                    }
                }
            })
        })
        .collect()
}
