//! Reforking (`refork_after`, docs/pools.md "Reforking"): a warmed worker of the current
//! template is promoted to be the template the next workers are forked from, so what the
//! app loaded and built while serving is shared copy-on-write by the workers that follow.
//!
//! The steps, all driven from here:
//! 1. A worker forked from the current template (generation `g`) that is ready, not due for
//!    recycling and has served `refork_after[g]` requests is chosen; the slot table stops
//!    giving it requests and its kept connections are dropped.
//! 2. Once its last request has finished, corral writes `promote` on the worker's own
//!    control socket (handed to it at its fork) and sends it `PROMOTE_SIGNAL`. The worker,
//!    idle and outside any request, closes its listening socket and becomes a template
//!    speaking the preloader's protocol on that socket.
//! 3. The state machine is told the worker left (an exit after serving, replaced without
//!    backoff); its replacement, and every worker after it, is asked of the new template.
//! 4. When the new template says `ready`, the workers of older templates are replaced one at
//!    a time, new before old, as a rolling restart replaces them: no request fails.
//!
//! The old template retires (SIGTERM) once its last worker is gone, as after a rolling
//! restart: the promoted template cleared its parent-death signal, so it is orphaned and
//! serves on; it still exits when corral's end of its control socket closes (corral gone).
//! Until then the old template is the fallback: when a promoted template fails, new
//! workers come from the old one again (after it retired, from a fresh preloader); after
//! `MAX_FAILURES` failures in a row reforking stops for the pool's life.

use std::io;
use std::os::fd::OwnedFd;

use tokio::time::Instant;

use super::{Driver, Report};
use crate::pool::preloader::Preloader;
use crate::pool::state::{ExitKind, PoolEvent, WorkerKey, WorkerState};
use crate::process::preload::{control_pair, signal_promote, Control};

/// Promoted templates that may fail in a row before reforking stops.
pub(super) const MAX_FAILURES: u32 = 3;

/// A promotion under way.
#[derive(Debug)]
pub(super) struct Promotion {
    /// The worker being promoted.
    key: WorkerKey,
    /// Its template's number (it was forked from it).
    from: u64,
    /// Its number as a template, once it was told to become one.
    template: Option<u64>,
    /// When it was taken out of rotation.
    since: Instant,
}

impl Driver {
    /// The control socket pair for a new forked worker when the pool reforks: corral's end,
    /// and the end the preloader passes to the worker.
    pub(super) fn worker_channel(&self) -> io::Result<(Option<Control>, Option<OwnedFd>)> {
        if self.state.spec().recycle.refork_after.is_empty() {
            return Ok((None, None));
        }
        let (ours, theirs) = control_pair()?;
        Ok((Some(Control::new(ours)?), Some(theirs)))
    }

    /// Every tick: starts a promotion when one is due, and keeps a worker being drained
    /// free of kept connections (one given back after the first drop is dropped too).
    pub(super) fn refork_tick(&mut self) -> bool {
        if let Some(p) = &self.promotion {
            if p.template.is_none() {
                if let Some(w) = self.workers.get(&p.key) {
                    self.connections.forget(&w.address);
                }
            }
            return false;
        }
        let steps = self.state.spec().recycle.refork_after;
        if steps.is_empty() || self.refork_failures >= MAX_FAILURES {
            return false;
        }
        let Some((current, generation)) = self.preload.as_ref().and_then(|p| {
            let n = p.current?;
            let t = p.all.get(&n).filter(|t| t.ready && !t.stopping)?;
            Some((n, t.generation))
        }) else {
            return false;
        };
        let Some(after) = steps.after(generation) else {
            return false;
        };
        let status = self.state.status(self.now());
        if status.stopping {
            return false;
        }
        // The most served first: the warmest worker.
        let chosen = status
            .workers
            .iter()
            .filter(|s| matches!(s.state, WorkerState::Idle | WorkerState::Busy))
            .filter(|s| s.accepting && s.served >= after)
            .filter(|s| {
                self.workers.get(&s.key).is_some_and(|w| {
                    w.preloader == Some(current) && w.pid != 0 && w.channel.is_some()
                })
            })
            .max_by_key(|s| s.served)
            .map(|s| s.key);
        let Some(key) = chosen else {
            return false;
        };
        let Some(w) = self.workers.get(&key) else {
            return false;
        };
        tracing::info!(pool = %self.name, %key, pid = w.pid, generation, after, "promoting a worker to be the template once it is idle");
        self.slots.set_accepting(w.id, false);
        self.connections.forget(&w.address);
        let drained = self.slots.watch_drain(w.id);
        self.promotion = Some(Promotion {
            key,
            from: current,
            template: None,
            since: Instant::now(),
        });
        if drained {
            return self.promote();
        }
        false
    }

    /// Workers whose last request finished: the one being promoted goes on.
    pub(super) fn promotion_drained(&mut self, drained: &[crate::pool::slots::WorkerId]) -> bool {
        let waiting = self
            .promotion
            .as_ref()
            .filter(|p| p.template.is_none())
            .and_then(|p| self.workers.get(&p.key))
            .is_some_and(|w| drained.contains(&w.id));
        if waiting {
            return self.promote();
        }
        false
    }

    /// The worker being promoted is idle: tells it to become the template, makes it the
    /// current one, and tells the state machine that the worker left.
    fn promote(&mut self) -> bool {
        let Some((key, from)) = self.promotion.as_ref().map(|p| (p.key, p.from)) else {
            return false;
        };
        let Some(w) = self.workers.get_mut(&key) else {
            self.promotion = None;
            return false;
        };
        let pid = w.pid;
        let Some(channel) = w.channel.take() else {
            self.promotion = None;
            return false;
        };
        self.connections.forget(&w.address);
        if let Err(e) = channel.send_promote().and_then(|()| signal_promote(pid)) {
            tracing::warn!(pool = %self.name, %key, pid, error = %e, "cannot promote the worker; it serves on");
            self.slots.set_accepting(w.id, true);
            self.promotion = None;
            self.refork_failures += 1;
            return false;
        }
        // From here the process is a template, not a worker: its worker task (readiness,
        // exit) ends; the template's own task watches it.
        if let Some(task) = w.task.take() {
            task.abort();
        }
        w.exit_status = None;
        let reports = self.reports_tx.clone();
        let timeouts = (
            self.state.spec().start_timeout,
            self.state.spec().kill_timeout,
        );
        let Some(preload) = self.preload.as_mut() else {
            return false;
        };
        let promoted = preload.promoted(pid, channel, from, timeouts, move |n, ev| {
            let _ = reports.send(Report::Preloader(n, ev));
        });
        let waited = self.promotion.as_ref().map(|p| p.since.elapsed());
        match promoted {
            Ok(n) => {
                if let Some(t) = self.preload.as_ref().and_then(|p| p.all.get(&n)) {
                    self.tail.stacks.set_origin(pid, t.origin);
                }
                tracing::info!(pool = %self.name, %key, pid, template = n, drained_ms = waited.unwrap_or_default().as_secs_f64() * 1000.0, "worker promoted: new workers are forked from it");
                if let Some(p) = self.promotion.as_mut() {
                    p.template = Some(n);
                }
            }
            Err(e) => {
                // Its pidfd cannot be opened: it is gone already. Its end is reported as
                // the worker's below.
                tracing::warn!(pool = %self.name, %key, pid, error = %e, "the promoted worker cannot be watched");
                self.promotion = None;
                self.refork_failures += 1;
            }
        }
        // The worker left the pool after serving: replaced at once, without backoff.
        self.handle(PoolEvent::Exited {
            key,
            status: ExitKind::Code(0),
        })
    }

    /// The worker being promoted is being stopped or killed by the state machine (recycled,
    /// timed out, the pool stopping) before it was told: the promotion is off.
    pub(super) fn abort_promotion(&mut self, key: WorkerKey, why: &str) {
        if self
            .promotion
            .as_ref()
            .is_some_and(|p| p.key == key && p.template.is_none())
        {
            tracing::info!(pool = %self.name, %key, "promotion called off: {why}");
            self.promotion = None;
        }
    }

    /// Promoted template `n` is ready and has its first workers asked of it: the workers of
    /// every older template are replaced, one at a time, new before old.
    pub(super) fn reforked(&mut self, n: u64) {
        if self.promotion.as_ref().and_then(|p| p.template) == Some(n) {
            self.promotion = None;
        }
        self.refork_failures = 0;
        let old: Vec<WorkerKey> = self
            .workers
            .iter()
            .filter(|(_, w)| w.preloader.is_some_and(|p| p != n))
            .map(|(k, _)| *k)
            .collect();
        let generation = self
            .preload
            .as_ref()
            .and_then(|p| p.all.get(&n))
            .map_or(0, |t| t.generation);
        tracing::info!(pool = %self.name, template = n, generation, replacing = old.len(), "refork: the new template is ready; older workers are replaced one at a time");
        self.state.count_refork();
        self.feed(PoolEvent::RollingRestartOf { keys: old });
    }

    /// Template `n` (removed) is gone: a promoted one that was not asked to stop counts as a
    /// failed refork; the template it came from may now retire.
    pub(super) fn template_gone(&mut self, n: u64, pre: &Preloader) {
        if self.promotion.as_ref().and_then(|p| p.template) == Some(n) {
            self.promotion = None;
        }
        let Some(parent) = pre.parent else {
            return;
        };
        self.tail.stacks.forget_origin(pre.pid);
        if !pre.stopping {
            self.refork_failures += 1;
            let fallback = self.preload.as_ref().and_then(|p| p.current);
            tracing::error!(pool = %self.name, pid = pre.pid, template = n, ?fallback, failures = self.refork_failures, "a promoted template ended; new workers come from the template before it");
            if self.refork_failures >= MAX_FAILURES {
                tracing::error!(pool = %self.name, failures = self.refork_failures, "promoted templates keep failing: reforking stops for this pool");
            }
        }
        self.retire_preloader_if_done(parent);
    }
}
