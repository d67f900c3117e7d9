//! Asking a worker of corral's launchers for its thread stacks, without ptrace: the WSGI and
//! Rack launchers (`src/launchers/`) write every thread's stack to stderr on [`STACK_SIGNAL`]
//! and end the dump with the line `corral-stacks: end of pid PID`. corral already reads each
//! worker's stderr ([`super::output`]); while a dump is asked for, the lines of that stream are
//! also collected here (bounded by [`MAX_LINES`] and [`MAX_BYTES`], and logged past the
//! output rate limit, so a dump is never cut by it) until the end line or a deadline.
//!
//! A forked worker (`preload = true`) writes on its preloader's stderr, so the lines are
//! collected from the stream of the worker's own pid or of its parent's (where what another
//! worker of the same preloader writes during that second is collected too; the end line
//! names the pid that wrote it, so the dump's end is never taken from another worker). ARCHITECTURE.md,
//! "Stacks of a stuck worker".

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use tokio::sync::oneshot;

/// The signal the launchers dump their stacks on. Not SIGTERM/SIGINT (stop), SIGQUIT (a
/// worker without a handler would exit), SIGTTIN (stops a process by default, which would
/// hang a slow request), nor SIGUSR1 (apps written for Unicorn or Puma may trap it to reopen
/// their logs). corral's own SIGUSR2 (rolling restart) is sent to corral, never to workers.
pub const STACK_SIGNAL: Signal = Signal::SIGUSR2;

/// The start of the line that ends a dump, followed by the pid that wrote it.
pub const END_PREFIX: &str = "corral-stacks: end of pid ";

/// Longest wait for a dump's end line: a worker past `request_timeout` is killed then, and a
/// slow-log entry is written with what came by then.
pub const ASK_BOUND: Duration = Duration::from_secs(1);

/// Most lines kept of one dump (the rest are logged but not kept).
pub const MAX_LINES: usize = 400;
/// Most bytes kept of one dump.
pub const MAX_BYTES: usize = 64 * 1024;

/// Why a worker's stacks could not be asked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NoStacks {
    /// A dump of it is being collected already (it ends within its own bound).
    Busy,
    /// It could not be signalled: it is gone.
    Gone,
}

/// What a worker said when asked for its stacks.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Stacks {
    /// The lines of the dump (escaped as logged), at most [`MAX_LINES`].
    pub lines: Vec<String>,
    /// Whether the end line came before the deadline (else `lines` is what came by then).
    pub complete: bool,
    /// Lines dropped past [`MAX_LINES`] or [`MAX_BYTES`].
    pub dropped: usize,
}

#[derive(Debug)]
struct Collecting {
    /// The streams read for it: the worker's own pid, its parent's, and for a worker of a
    /// promoted template the preloader's stream that template writes on.
    readers: Vec<u32>,
    stacks: Stacks,
    bytes: usize,
    done: Option<oneshot::Sender<Stacks>>,
}

/// The dumps being collected for one pool's workers, shared by the pool's stderr readers
/// and whoever asks.
#[derive(Debug, Default)]
pub struct StackDumps {
    asked: Mutex<HashMap<u32, Collecting>>,
    /// Promoted templates (reforking) and the pid whose stderr stream they write on: the
    /// preloader corral started, which may be gone while they serve on.
    origins: Mutex<HashMap<u32, u32>>,
}

impl StackDumps {
    /// Called by the stderr reader of process `reader` for every `line` (without its line
    /// end, escaped as logged): true when a dump is being collected from that stream, so the
    /// line should be logged past the rate limit.
    pub fn line(&self, reader: u32, line: &str) -> bool {
        let Ok(mut asked) = self.asked.lock() else {
            return false;
        };
        if asked.is_empty() {
            return false;
        }
        let ended = line
            .strip_prefix(END_PREFIX)
            .and_then(|pid| pid.trim().parse::<u32>().ok());
        if let Some(pid) = ended {
            if let Some(mut c) = asked.remove(&pid) {
                c.stacks.complete = true;
                if let Some(done) = c.done.take() {
                    let _ = done.send(c.stacks);
                }
                return true;
            }
        }
        let mut collecting = false;
        for c in asked.values_mut().filter(|c| c.readers.contains(&reader)) {
            collecting = true;
            if c.stacks.lines.len() >= MAX_LINES || c.bytes + line.len() > MAX_BYTES {
                c.stacks.dropped += 1;
            } else {
                c.bytes += line.len();
                c.stacks.lines.push(line.to_owned());
            }
        }
        collecting
    }

    /// Template `template`, promoted from a worker (reforking), writes on the stderr stream
    /// of `origin`, the preloader corral started; its workers' dumps are read there.
    pub fn set_origin(&self, template: u32, origin: u32) {
        if let Ok(mut o) = self.origins.lock() {
            o.insert(template, origin);
        }
    }

    /// Template `template` is gone.
    pub fn forget_origin(&self, template: u32) {
        if let Ok(mut o) = self.origins.lock() {
            o.remove(&template);
        }
    }

    /// Whether any dump is being collected (a cheap test before a line is escaped).
    pub fn collecting(&self) -> bool {
        self.asked.lock().is_ok_and(|a| !a.is_empty())
    }

    /// Signals worker `pid` for its stacks and waits at most `bound` for the end of the dump:
    /// what it wrote (`complete` false when the bound passed first).
    pub async fn ask(&self, pid: u32, bound: Duration) -> Result<Stacks, NoStacks> {
        let worker = i32::try_from(pid)
            .ok()
            .filter(|&p| p > 1)
            .ok_or(NoStacks::Gone)?;
        let parent = super::preload::parent_of(pid).map_err(|_| NoStacks::Gone)?;
        // A worker of a promoted template (reforking) writes on the pipes of the preloader
        // corral started, the template's own ancestor: every ancestor below corral reads.
        let mut readers = vec![pid, parent];
        if let Some(origin) = self
            .origins
            .lock()
            .ok()
            .and_then(|o| o.get(&parent).copied())
        {
            readers.push(origin);
        }
        let (tx, rx) = oneshot::channel();
        {
            let mut asked = self.asked.lock().map_err(|_| NoStacks::Busy)?;
            if asked.contains_key(&pid) {
                return Err(NoStacks::Busy);
            }
            asked.insert(
                pid,
                Collecting {
                    readers,
                    stacks: Stacks::default(),
                    bytes: 0,
                    done: Some(tx),
                },
            );
        }
        // The worker alone, not its group: what it forked has no handler.
        if kill(Pid::from_raw(worker), STACK_SIGNAL).is_err() {
            self.forget(pid);
            return Err(NoStacks::Gone);
        }
        match tokio::time::timeout(bound, rx).await {
            Ok(Ok(stacks)) => Ok(stacks),
            _ => Ok(self.forget(pid).unwrap_or_default()),
        }
    }

    /// Stops collecting for `pid`; what was collected so far.
    fn forget(&self, pid: u32) -> Option<Stacks> {
        let mut asked = self.asked.lock().ok()?;
        asked.remove(&pid).map(|c| c.stacks)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_of_the_asked_streams_are_kept_until_the_end_line() {
        let dumps = StackDumps::default();
        let (tx, mut rx) = oneshot::channel();
        dumps.asked.lock().unwrap().insert(
            10,
            Collecting {
                readers: vec![10, 5],
                stacks: Stacks::default(),
                bytes: 0,
                done: Some(tx),
            },
        );
        assert!(!dumps.line(11, "another worker's line"));
        assert!(dumps.line(5, "  File \"app.py\", line 3 in app"));
        assert!(dumps.line(10, "Current thread 0x1"));
        // Another pid's end line ends nothing.
        assert!(dumps.line(10, "corral-stacks: end of pid 11"));
        assert!(rx.try_recv().is_err());
        assert!(dumps.line(10, "corral-stacks: end of pid 10"));
        let stacks = rx.try_recv().unwrap();
        assert!(stacks.complete);
        assert_eq!(
            stacks.lines,
            vec![
                "  File \"app.py\", line 3 in app".to_owned(),
                "Current thread 0x1".to_owned(),
                "corral-stacks: end of pid 11".to_owned(),
            ]
        );
        assert!(!dumps.line(10, "after the dump"));
    }

    #[test]
    fn a_dump_is_bounded() {
        let dumps = StackDumps::default();
        let (tx, _rx) = oneshot::channel();
        dumps.asked.lock().unwrap().insert(
            7,
            Collecting {
                readers: vec![7, 7],
                stacks: Stacks::default(),
                bytes: 0,
                done: Some(tx),
            },
        );
        for i in 0..MAX_LINES + 5 {
            dumps.line(7, &format!("frame {i}"));
        }
        let stacks = dumps.forget(7).unwrap();
        assert_eq!(stacks.lines.len(), MAX_LINES);
        assert_eq!(stacks.dropped, 5);
        assert!(!stacks.complete);
    }

    #[tokio::test]
    async fn asking_a_process_that_is_gone_gives_nothing() {
        let dumps = StackDumps::default();
        // Far above pid_max: kill fails with ESRCH.
        assert_eq!(
            dumps.ask(0x3fff_fff0, Duration::from_millis(50)).await,
            Err(NoStacks::Gone)
        );
        assert!(dumps.asked.lock().unwrap().is_empty());
    }
}
