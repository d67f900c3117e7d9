//! Sampling the processes a benchmark is about (`--pid`): CPU time from `/proc/PID/stat`
//! (utime + stime, before and after the run) and the largest VmRSS seen from
//! `/proc/PID/status` while it ran.

use std::time::Duration;

use tokio::sync::oneshot;
use tokio::task::JoinHandle;

/// Clock ticks per second of the times in `/proc/PID/stat` (USER_HZ, 100 on every Linux
/// architecture corral runs on).
const TICKS_PER_SECOND: f64 = 100.0;
/// Shortest run whose CPU percentage is reported.
const MIN_CPU_RUN: Duration = Duration::from_secs(1);
/// How often memory is sampled.
const EVERY: Duration = Duration::from_millis(100);

/// What one process used during a run.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) struct Usage {
    /// The process.
    pub pid: u32,
    /// CPU time over the run as a percentage of one core; `None` if it could not be read.
    pub cpu_percent: Option<f64>,
    /// The largest VmRSS seen, in KiB.
    pub rss_kib_max: Option<u64>,
}

/// utime + stime of `pid`, in ticks.
fn cpu_ticks(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name may hold spaces and parentheses: fields count from the last ')'.
    let (_, rest) = stat.rsplit_once(')')?;
    let mut fields = rest.split_whitespace();
    // After ')' come state (field 3) ... utime (14) and stime (15).
    let utime: u64 = fields.nth(11)?.parse().ok()?;
    let stime: u64 = fields.next()?.parse().ok()?;
    Some(utime + stime)
}

/// VmRSS of `pid`, in KiB.
fn rss_kib(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

/// A sampling in progress.
pub(super) struct Sampler {
    pids: Vec<u32>,
    start_ticks: Vec<Option<u64>>,
    stop: Option<oneshot::Sender<()>>,
    task: Option<JoinHandle<Vec<Option<u64>>>>,
}

impl Sampler {
    /// Reads the CPU times now and starts sampling memory.
    pub fn start(pids: &[u32]) -> Sampler {
        if pids.is_empty() {
            return Sampler {
                pids: Vec::new(),
                start_ticks: Vec::new(),
                stop: None,
                task: None,
            };
        }
        let start_ticks = pids.iter().map(|&p| cpu_ticks(p)).collect();
        let (stop, mut stopped) = oneshot::channel();
        let watched = pids.to_vec();
        let task = tokio::spawn(async move {
            let mut max: Vec<Option<u64>> = vec![None; watched.len()];
            loop {
                for (m, &pid) in max.iter_mut().zip(&watched) {
                    if let Some(now) = rss_kib(pid) {
                        *m = Some(m.map_or(now, |m| m.max(now)));
                    }
                }
                tokio::select! {
                    _ = &mut stopped => return max,
                    () = tokio::time::sleep(EVERY) => {}
                }
            }
        });
        Sampler {
            pids: pids.to_vec(),
            start_ticks,
            stop: Some(stop),
            task: Some(task),
        }
    }

    /// Stops sampling and gives each process's usage over `elapsed`.
    pub async fn finish(mut self, elapsed: Duration) -> Vec<Usage> {
        let end_ticks: Vec<Option<u64>> = self.pids.iter().map(|&p| cpu_ticks(p)).collect();
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        let rss = match self.task.take() {
            Some(task) => task.await.unwrap_or_default(),
            None => Vec::new(),
        };
        let seconds = elapsed.as_secs_f64().max(f64::MIN_POSITIVE);
        self.pids
            .iter()
            .enumerate()
            .map(|(i, &pid)| {
                let start = self.start_ticks.get(i).copied().flatten();
                let end = end_ticks.get(i).copied().flatten();
                // Ticks are 10 ms: a shorter run would give a meaningless percentage.
                let cpu_percent = start
                    .zip(end)
                    .filter(|_| elapsed >= MIN_CPU_RUN)
                    .map(|(s, e)| e.saturating_sub(s) as f64 / TICKS_PER_SECOND / seconds * 100.0);
                Usage {
                    pid,
                    cpu_percent,
                    rss_kib_max: rss.get(i).copied().flatten(),
                }
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_its_own_process() {
        let me = std::process::id();
        assert!(cpu_ticks(me).is_some());
        assert!(rss_kib(me).is_some_and(|kib| kib > 0));
        assert_eq!(cpu_ticks(u32::MAX), None);
    }
}
