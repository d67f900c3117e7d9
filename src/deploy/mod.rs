//! Deployment error resistance: a reload switches to its new pools only once each has its
//! `min` workers ready (and healthy, with `health_check`); a pool that cannot get there (a
//! spawn that fails, a worker or preloader that exits, one that misses `start_timeout` or
//! its health check) refuses the reload, and the running generation keeps serving.
//! ARCHITECTURE.md, "Generations and reload".
//!
//! The outcome of every reload is kept for `/status` ([`LastReload`]) and written to
//! `RUNTIME_DIR/reload.result` ([`RESULT_FILE`]), which `corral reload` waits on to exit
//! non-zero with the reason.

pub mod links;

use std::collections::HashMap;
use std::io::{self, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use crate::error::StartupError;
use crate::gateway::Pool;
use crate::pool::driver::Published;
use crate::pool::state::Notice;

/// Where the outcome of the latest reload is written, in the runtime directory.
pub const RESULT_FILE: &str = "reload.result";
/// Stderr lines of the failed pool quoted in a refusal.
const QUOTED_LINES: usize = 8;
/// How long a refusal waits for the failed process's stderr to be read to its end.
const LAST_WORDS: Duration = Duration::from_secs(1);

/// Why a reload's new pool could not take over.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    /// The pool.
    pub pool: String,
    /// What went wrong, as the pool's driver logged it.
    pub reason: String,
    /// The last stderr lines of the pool's processes, oldest first.
    pub stderr: Vec<String>,
}

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "pool {}: {}", self.pool, self.reason)?;
        if !self.stderr.is_empty() {
            write!(f, "; its last stderr lines: {}", self.stderr.join(" | "))?;
        }
        Ok(())
    }
}

/// Why a reload did not apply.
#[derive(Debug, thiserror::Error)]
pub enum ReloadError {
    /// Writing the launchers, building the pools or binding a listener failed.
    #[error("{0}")]
    Startup(#[from] StartupError),
    /// A new pool could not get its workers up.
    #[error("{0}")]
    Refused(Refusal),
}

/// What the latest reload came to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// The new configuration serves, as this generation.
    Applied {
        /// Its number.
        generation: u64,
    },
    /// The running configuration keeps serving.
    Failed {
        /// Why (with [`Refusal`]'s pool and stderr when a pool refused).
        reason: String,
        /// The pool that refused, if one did.
        pool: Option<String>,
    },
}

/// One reload's outcome, numbered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    /// Reloads finished since corral started, this one included.
    pub number: u64,
    /// When it finished.
    pub at: SystemTime,
    /// What it came to.
    pub outcome: Outcome,
}

/// The latest reload's outcome, for the status page.
#[derive(Debug, Default)]
pub struct LastReload(Mutex<Option<Record>>);

impl LastReload {
    /// Records `outcome` as the latest; returns the record.
    pub fn record(&self, outcome: Outcome) -> Record {
        let mut last = self.0.lock().unwrap_or_else(|e| e.into_inner());
        let record = Record {
            number: last.as_ref().map_or(1, |r| r.number + 1),
            at: SystemTime::now(),
            outcome,
        };
        *last = Some(record.clone());
        record
    }

    /// The latest record, if a reload happened.
    pub fn get(&self) -> Option<Record> {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }
}

/// Waits until each of `pools` has its `min` workers (`floors`, by name) ready, or refuses
/// the reload for the first pool that cannot: one whose spawn failed, whose worker crashed
/// or missed `start_timeout` (its health check included), or that is still short when
/// `wait` has passed.
pub async fn gate(
    pools: &[Arc<Pool>],
    floors: &HashMap<String, usize>,
    wait: Duration,
) -> Result<(), Refusal> {
    let deadline = tokio::time::Instant::now() + wait;
    loop {
        let mut short = None;
        for pool in pools {
            let floor = floors.get(&*pool.name).copied().unwrap_or(0);
            if pool.ready_workers() >= floor {
                continue;
            }
            let Some(status) = &pool.status else {
                continue;
            };
            let published = status.borrow().clone();
            if let Some(reason) = failed_start(&published) {
                return Err(refusal(pool, &published, reason).await);
            }
            short = Some((pool, published, floor));
        }
        let Some((pool, published, floor)) = short else {
            return Ok(());
        };
        if tokio::time::Instant::now() >= deadline {
            let mut reason = format!(
                "{} of its {floor} min workers ready within start_timeout",
                pool.ready_workers()
            );
            if let Some(health) = &published.health_failure {
                reason.push_str(&format!(" (last {health})"));
            }
            return Err(refusal(pool, &published, reason).await);
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// The latest failed start of a pool that has started nothing since the reload began
/// (every new pool starts from zero counters), as its driver logged it.
fn failed_start(published: &Published) -> Option<String> {
    let c = &published.status.counters;
    if c.spawn_failed + c.crashed + c.start_timeouts == 0 {
        return None;
    }
    let latest = published.recent.iter().rev().find(|r| {
        matches!(
            r.notice,
            Notice::SpawnFailed { .. } | Notice::Crashed { .. } | Notice::StartTimedOut { .. }
        )
    });
    let mut reason = latest.map_or_else(
        || "a worker failed to start".to_owned(),
        |r| r.notice.to_string(),
    );
    if let (Some(health), Some(Notice::StartTimedOut { .. })) =
        (&published.health_failure, latest.map(|r| &r.notice))
    {
        reason.push_str(&format!(" (last {health})"));
    }
    Some(reason)
}

/// The refusal for `pool`, with its processes' last stderr lines once a failed process's
/// pipe has been read to its end (bounded by [`LAST_WORDS`]).
async fn refusal(pool: &Pool, published: &Published, reason: String) -> Refusal {
    let tail = &published.tail;
    let until = tokio::time::Instant::now() + LAST_WORDS;
    while tail.closed() == 0 && tokio::time::Instant::now() < until {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let lines = tail.lines();
    let skip = lines.len().saturating_sub(QUOTED_LINES);
    Refusal {
        pool: pool.name.to_string(),
        reason: reason.replace('\n', " "),
        stderr: lines.into_iter().skip(skip).collect(),
    }
}

/// Writes `record` to `RUNTIME_DIR/reload.result` (replacing it whole, through a temporary
/// file and a rename): its number on the first line, `applied GENERATION` or `refused` on
/// the second, the reason on the third.
pub fn write_result(runtime_dir: &Path, record: &Record) -> io::Result<()> {
    let path = runtime_dir.join(RESULT_FILE);
    let temporary = runtime_dir.join(format!("{RESULT_FILE}.new"));
    let _ = std::fs::remove_file(&temporary);
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .custom_flags(nix::libc::O_NOFOLLOW)
        .open(&temporary)?;
    let text = match &record.outcome {
        Outcome::Applied { generation } => format!("{}\napplied {generation}\n", record.number),
        Outcome::Failed { reason, .. } => {
            format!(
                "{}\nrefused\n{}\n",
                record.number,
                reason.replace('\n', " ")
            )
        }
    };
    file.write_all(text.as_bytes())?;
    std::fs::rename(&temporary, &path)
}

/// Removes a `reload.result` left by an earlier corral of this runtime directory: this one
/// numbers its reloads from 1 again, and `corral reload` must not take an old number for
/// the answer to its signal.
pub fn clear_result(runtime_dir: &Path) {
    match std::fs::remove_file(runtime_dir.join(RESULT_FILE)) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => {
            tracing::warn!(error = %e, "cannot remove the previous run's reload result");
        }
        _ => {}
    }
}

/// What `RUNTIME_DIR/reload.result` says: the reload number, and `Ok(generation)` or
/// `Err(reason)`. `None` when there is no such file (no reload finished yet).
pub fn read_result(runtime_dir: &Path) -> io::Result<Option<(u64, Result<u64, String>)>> {
    let path = runtime_dir.join(RESULT_FILE);
    let text = match std::fs::read_to_string(&path) {
        Ok(t) => t,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e),
    };
    let bad = || {
        io::Error::new(
            io::ErrorKind::InvalidData,
            format!("{} is not a reload result corral wrote", path.display()),
        )
    };
    let mut lines = text.lines();
    let number = lines.next().and_then(|n| n.parse().ok()).ok_or_else(bad)?;
    let verdict = lines.next().ok_or_else(bad)?;
    let result = match verdict.strip_prefix("applied ") {
        Some(g) => Ok(g.parse().map_err(|_| bad())?),
        None if verdict == "refused" => Err(lines.next().unwrap_or_default().to_owned()),
        None => return Err(bad()),
    };
    Ok(Some((number, result)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_result_file_reads_back_as_written_and_numbers_count_up() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(read_result(dir.path()).unwrap(), None);
        let last = LastReload::default();
        let record = last.record(Outcome::Applied { generation: 3 });
        write_result(dir.path(), &record).unwrap();
        assert_eq!(read_result(dir.path()).unwrap(), Some((1, Ok(3))));
        let record = last.record(Outcome::Failed {
            reason: "pool app: worker\nexited".to_owned(),
            pool: Some("app".to_owned()),
        });
        write_result(dir.path(), &record).unwrap();
        assert_eq!(
            read_result(dir.path()).unwrap(),
            Some((2, Err("pool app: worker exited".to_owned())))
        );
        std::fs::write(dir.path().join(RESULT_FILE), "x\n").unwrap();
        assert!(read_result(dir.path()).is_err());
        clear_result(dir.path());
        assert_eq!(read_result(dir.path()).unwrap(), None);
    }
}
