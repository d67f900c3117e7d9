//! A direct pool with `php_children` (php-fpm's own process model, ARCHITECTURE.md "Direct
//! pools"): each worker corral spawns is a php-cgi parent with the pool's listening socket
//! as fd 0 and `PHP_FCGI_CHILDREN=N`; the parent creates the OPcache, forks N children that
//! accept the front server's connections and share it, and forks a new child whenever one
//! exits. corral supervises each child through the kernel, as it does a direct worker.
//!
//! What php-cgi 8.2 does with signals (measured with strace, `docs/pools.md`, "Direct pools"):
//! - the parent, on SIGTERM, SIGINT or SIGQUIT, sends SIGTERM to its process group and
//!   exits; a child in a request then finishes it, but the script's own blocking calls are
//!   cut short (a 1.5 s `usleep` returned after 0.3 s);
//! - the parent, on SIGUSR1, sets its shutdown flag and goes on waiting; every child it
//!   forks after that inherits the flag and exits at once, so the parent forks without
//!   end (182 forks in 0.7 s): never sent;
//! - a child, on SIGTERM or SIGUSR1, exits at once from accept (status 0), and the parent
//!   forks a replacement; in a request, the same cut-short as above;
//! - a stopped parent (SIGSTOP) forks nothing; its children serve on, and one that exits
//!   stays a zombie until the parent goes.
//!
//! So a group is retired without cutting a request: the parent is stopped, each child is
//! sent SIGTERM once it is seen blocked in accept (between two requests; after half of
//! `kill_timeout` anyway, as for a direct worker), and the parent is killed once no child
//! is left. `max_memory` and the hard request timeout apply to one child, whose parent forks
//! its replacement: a child over `max_memory` is sent SIGTERM once seen in accept, one
//! holding the same connection past `request_timeout` is killed.

use std::collections::HashMap;
use std::time::Duration;

use tokio::time::Instant;

use super::{Driver, WorkerKey};
use crate::pool::direct::{held_sockets, in_accept, serving};
use crate::pool::state::{ChildStop, PoolEvent};
use crate::process::{self, php_children::children_of};

/// How many ticks (100 ms) between two PSS readings of every child.
const MEMORY_EVERY: u32 = 10;

/// The children of a direct pool's php-cgi parents, as the driver follows them.
#[derive(Debug, Default)]
pub(super) struct Groups {
    /// `max_memory`, per child.
    max_memory: Option<u64>,
    /// Per child pid: the sockets it held when last looked at, and since when unchanged.
    held: HashMap<u32, (Vec<u64>, Instant)>,
    /// Children found over `max_memory`, sent SIGTERM once seen in accept.
    over: HashMap<u32, WorkerKey>,
    /// Groups being retired: when their parent was stopped, and the children signalled.
    retiring: HashMap<WorkerKey, Retiring>,
    ticks: u32,
}

#[derive(Debug)]
struct Retiring {
    since: Instant,
    signalled: Vec<u32>,
}

impl Groups {
    /// The groups of a pool whose children are recycled over `max_memory` bytes of PSS.
    pub(super) fn new(max_memory: Option<u64>) -> Groups {
        Groups {
            max_memory,
            ..Groups::default()
        }
    }
}

/// The children of parent `parent` that are alive (not zombies, not exiting).
pub(crate) fn live_children(parent: u32) -> Vec<u32> {
    children_of(parent)
        .into_iter()
        .filter(|&c| !process::is_exiting(c))
        .collect()
}

/// How many of `parent`'s live children are not blocked in accept (each holds a request,
/// or is between two), and how many there are.
pub(crate) fn busy_children(parent: u32) -> (usize, usize) {
    let children = live_children(parent);
    let busy = children
        .iter()
        .filter(|&&c| in_accept(c) == Some(false))
        .count();
    (busy, children.len())
}

/// Whether parent `parent` has forked its `n` children and every one of them has begun
/// serving (blocked in accept, or holding a connection it accepted).
pub(crate) fn group_serving(parent: u32, n: usize) -> bool {
    let children = live_children(parent);
    children.len() >= n && children.iter().all(|&c| serving(c))
}

fn signal(pid: u32, signal: nix::sys::signal::Signal) -> bool {
    let Ok(raw) = i32::try_from(pid) else {
        return false;
    };
    if raw <= 1 {
        return false;
    }
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(raw), signal).is_ok()
}

impl Driver {
    /// The parents' groups, for a direct pool with `php_children`.
    fn groups(&mut self) -> Option<&mut Groups> {
        self.direct.as_mut().and_then(|d| d.children.as_mut())
    }

    /// Carries on retiring group `key` (parent `pid`), held by the state machine's stop
    /// signal: stops the parent the first time, sends SIGTERM to each child seen in accept
    /// (or to all once `patience` has passed), and kills the parent once no child is left.
    /// Returns true once the parent has been killed (nothing more to hold).
    pub(super) fn retire_group(&mut self, key: WorkerKey, pid: u32, patience: Duration) -> bool {
        use nix::sys::signal::Signal;
        let name = std::sync::Arc::clone(&self.name);
        let Some(groups) = self.groups() else {
            return true;
        };
        let now = Instant::now();
        let retiring = groups.retiring.entry(key).or_insert_with(|| {
            // No replacement is forked from here on: an exiting child stays a zombie.
            if !signal(pid, Signal::SIGSTOP) {
                tracing::debug!(pool = %name, pid, "cannot stop the php-cgi parent (gone?)");
            }
            tracing::debug!(pool = %name, %key, pid, "retiring a php-cgi group: parent stopped, children leave between requests");
            Retiring {
                since: now,
                signalled: Vec::new(),
            }
        });
        let waited = now.duration_since(retiring.since) >= patience;
        let children = live_children(pid);
        for &c in &children {
            if retiring.signalled.contains(&c) {
                continue;
            }
            if in_accept(c) == Some(false) && !waited {
                continue;
            }
            if waited {
                tracing::debug!(pool = %name, pid = c, "a php-cgi child never seen in accept: signalling it mid-request");
            }
            signal(c, Signal::SIGTERM);
            retiring.signalled.push(c);
        }
        if !children.is_empty() {
            return false;
        }
        // Every child has left (zombies of the stopped parent): the parent goes, and with
        // it the zombies, which init reaps.
        groups.retiring.remove(&key);
        if let Err(e) = process::signal_group(pid, process::StopSignal::Kill) {
            tracing::warn!(pool = %name, pid, error = %e, "cannot kill the php-cgi parent");
        }
        true
    }

    /// The hard request timeout and `max_memory` of each child of each group. Returns
    /// whether the pool stopped (as [`Driver::handle`]).
    pub(super) fn check_children(&mut self, limit: Duration) -> bool {
        use nix::sys::signal::Signal;
        let parents: Vec<(WorkerKey, u32)> = self
            .workers
            .iter()
            .filter(|(_, w)| w.pid != 0)
            .map(|(k, w)| (*k, w.pid))
            .collect();
        let name = std::sync::Arc::clone(&self.name);
        let Some(groups) = self.groups() else {
            return false;
        };
        let now = Instant::now();
        groups.ticks = groups.ticks.wrapping_add(1);
        let measure = groups.max_memory.is_some() && groups.ticks % MEMORY_EVERY == 0;
        let mut events = Vec::new();
        let mut alive = Vec::new();
        for (key, parent) in parents {
            for child in live_children(parent) {
                alive.push(child);
                let idle = in_accept(child) != Some(false);
                if let (true, Some(max)) = (measure, groups.max_memory) {
                    // The child alone (php-cgi's children fork nothing): two small reads,
                    // not a walk over every process in /proc.
                    let pss = process::memory_of(child, &[child]).map(|u| u.bytes());
                    if pss.is_ok_and(|b| b > max) {
                        groups.over.insert(child, key);
                    }
                }
                if idle && groups.over.remove(&child).is_some() {
                    tracing::info!(pool = %name, %key, pid = child, "a php-cgi child is over max_memory: stopping it between requests (its parent forks another)");
                    signal(child, Signal::SIGTERM);
                    events.push((key, ChildStop::MaxMemory));
                }
                let sockets = if idle { None } else { held_sockets(child) };
                let Some(sockets) = sockets.filter(|s| !s.is_empty()) else {
                    groups.held.remove(&child);
                    continue;
                };
                match groups.held.get(&child) {
                    Some((same, since)) if *same == sockets => {
                        if now.duration_since(*since) >= limit {
                            tracing::warn!(pool = %name, %key, pid = child, "a php-cgi child has held the same connection past request_timeout: killing it (its parent forks another)");
                            signal(child, Signal::SIGKILL);
                            groups.held.remove(&child);
                            events.push((key, ChildStop::RequestTimeout));
                        }
                    }
                    _ => {
                        groups.held.insert(child, (sockets, now));
                    }
                }
            }
        }
        groups.held.retain(|c, _| alive.contains(c));
        groups.over.retain(|c, _| alive.contains(c));
        let mut stopped = false;
        for (key, reason) in events {
            stopped |= self.handle(PoolEvent::ChildStopped { key, reason });
        }
        stopped
    }

    /// Group `key` was reaped: forget it, and kill what is left of its process group.
    /// corral's own stop reaches every child before the parent goes, but a parent that died
    /// on its own leaves its children serving on the socket, supervised by nobody: its
    /// process group id cannot be reused while any of them lives.
    pub(super) fn group_exited(&mut self, key: WorkerKey, pid: u32) {
        if let Some(groups) = self.groups() {
            groups.retiring.remove(&key);
        }
        if pid > 1 {
            let _ = process::signal_group(pid, process::StopSignal::Kill);
        }
    }
}
