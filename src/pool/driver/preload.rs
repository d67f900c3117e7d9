//! Preload and fork (ARCHITECTURE.md, "Preload and fork"): the driver's side of a pool whose
//! workers its preloader forks: asking for a fork, following the preloader's events
//! (`ready`, `forked`, `exited`), its deadlines, and renewing, retiring and stopping it.

use super::*;

/// Preload and fork (ARCHITECTURE.md, "Preload and fork"): workers of a `preload = true`
/// pool are forked by the pool's preloader instead of spawned.
impl Driver {
    /// The socket path worker `key` listens on, its directory prepared.
    pub(super) fn socket_path(&self, key: WorkerKey) -> Result<PathBuf, String> {
        let dir = self.template.identity().and_then(|id| {
            crate::runtime_dir::worker_socket_dir(
                &self.runtime_dir,
                &self.name,
                self.template.handoff,
                id.as_ref(),
            )
        });
        match dir {
            Ok(dir) => Ok(dir.join(format!("{}-{}.sock", self.socket_tag, key.0))),
            Err(e) => Err(format!("cannot prepare the worker socket's directory: {e}")),
        }
    }

    /// Binds worker `key`'s socket and asks the current preloader (started if there is none)
    /// to fork a worker on it, now or once the app is loaded. A failure here is a failed
    /// spawn, which the state machine backs off from like any other.
    pub(super) fn fork(&mut self, key: WorkerKey) {
        let bound = self.socket_path(key).and_then(|path| {
            bind_worker_socket(&WorkerSocket::Unix(path.clone()))
                .map(|(address, listener)| (path, address, listener))
                .map_err(|e| e.to_string())
        });
        let (path, address, listener) = match bound {
            Ok(bound) => bound,
            Err(reason) => {
                self.feed(PoolEvent::SpawnFailed { key, reason });
                return;
            }
        };
        let reports = self.reports_tx.clone();
        let timeouts = (
            self.state.spec().start_timeout,
            self.state.spec().kill_timeout,
        );
        let Some(preload) = self.preload.as_mut() else {
            return;
        };
        let started = preload.current_or_start(&self.template, timeouts, move |n, ev| {
            let _ = reports.send(Report::Preloader(n, ev));
        });
        let n = match started {
            Ok(n) => n,
            Err(e) => {
                let _ = std::fs::remove_file(&path);
                let reason = format!("cannot start the preloader: {e}");
                self.feed(PoolEvent::SpawnFailed { key, reason });
                return;
            }
        };
        // A pool that reforks gives each worker a control socket of its own, through which
        // it may later be told to become the template (`refork.rs`).
        let (channel, theirs) = match self.worker_channel() {
            Ok(pair) => pair,
            Err(e) => {
                let _ = std::fs::remove_file(&path);
                let reason = format!("cannot make the worker's control socket: {e}");
                self.feed(PoolEvent::SpawnFailed { key, reason });
                return;
            }
        };
        let budget = self.state.slot_budget(key);
        let id = self
            .slots
            .add_worker(self.concurrency, address.clone(), budget);
        self.by_id.insert(id, key);
        self.workers.insert(
            key,
            Worker {
                id,
                pid: 0,
                address,
                socket_file: Some(path),
                tree: Vec::new(),
                memory: MemoryWatch::default(),
                preloader: Some(n),
                exit_status: None,
                asked: Instant::now(),
                channel,
                task: None,
            },
        );
        if self.state.spec().recycle.max_memory.is_some() {
            self.slots.check_memory_in(id, Some(1));
        }
        let Some(pre) = self.preload.as_mut().and_then(|p| p.all.get_mut(&n)) else {
            return;
        };
        pre.workers.insert(key);
        if !pre.ready {
            pre.pending.push((key, listener, theirs));
            return;
        }
        // On failure its exit (the task reaps it) fails this worker as a spawn.
        pre.fork_or_kill(&self.name, key, listener, theirs);
    }

    /// Handles what preloader `n`'s task reports.
    pub(super) fn on_preloader(&mut self, n: u64, event: PreloaderEvent) -> bool {
        match event {
            PreloaderEvent::Ready => {
                let Some(pre) = self.preload.as_mut().and_then(|p| p.all.get_mut(&n)) else {
                    return false;
                };
                pre.ready = true;
                if pre.parent.is_some() {
                    tracing::info!(pool = %self.name, pid = pre.pid, forks = pre.pending.len(), generation = pre.generation, "promoted template ready");
                } else {
                    tracing::info!(pool = %self.name, pid = pre.pid, forks = pre.pending.len(), "preloader loaded the app");
                }
                for (key, listener, channel) in std::mem::take(&mut pre.pending) {
                    if !pre.fork_or_kill(&self.name, key, listener, channel) {
                        break;
                    }
                }
                if let Some(parent) = pre.parent {
                    self.reforked(n);
                    // The template it was promoted from may retire now (held while this
                    // one was on its way: retire_preloader_if_done).
                    self.retire_preloader_if_done(parent);
                }
                false
            }
            PreloaderEvent::Forked { key, pid } => self.forked(n, key, pid),
            PreloaderEvent::Exited { pid, exit } => {
                let w = self
                    .workers
                    .values_mut()
                    .find(|w| w.pid == pid && w.preloader == Some(n));
                if let Some(tx) = w.and_then(|w| w.exit_status.take()) {
                    let _ = tx.send(exit);
                } else if let Some(preload) = self.preload.as_mut() {
                    // A template promoted from one of its workers.
                    let child = preload
                        .all
                        .values_mut()
                        .find(|t| t.pid == pid && t.parent == Some(n));
                    if let Some(tx) = child.and_then(|t| t.status.take()) {
                        let _ = tx.send(exit);
                    }
                }
                false
            }
            PreloaderEvent::Broken(reason) => {
                let Some(preload) = self.preload.as_mut() else {
                    return false;
                };
                preload.fall_back(n);
                match preload.all.get(&n) {
                    Some(pre) if pre.stopping => {
                        tracing::debug!(pool = %self.name, pid = pre.pid, %reason, "stopping preloader");
                    }
                    Some(pre) => {
                        tracing::error!(pool = %self.name, pid = pre.pid, %reason, "preloader killed: its workers are replaced");
                    }
                    None => {}
                }
                false
            }
            PreloaderEvent::Gone(exit) => self.preloader_gone(n, exit),
        }
    }

    /// Preloader `n` says it forked worker `key` as `pid`. Believed only when `pid` is a
    /// child of that preloader and `key` one it was asked for and has no pid yet: a pid from
    /// a preloader is peer bytes, and corral signals what it names.
    pub(super) fn forked(&mut self, n: u64, key: WorkerKey, pid: u32) -> bool {
        let Some(pre) = self.preload.as_ref().and_then(|p| p.all.get(&n)) else {
            return false;
        };
        let expected = pre.workers.contains(&key)
            && self
                .workers
                .get(&key)
                .is_some_and(|w| w.pid == 0 && w.preloader == Some(n));
        let child = parent_of(pid).is_ok_and(|ppid| ppid == pre.pid);
        if !expected || !child {
            tracing::error!(pool = %self.name, pid = pre.pid, %key, worker = pid, expected, child, "preloader named a worker it was not asked for, or not its child; killing it");
            pre.signal(&self.name, StopSignal::Kill);
            return false;
        }
        let preloader = pre.pid;
        let Some(w) = self.workers.get_mut(&key) else {
            return false;
        };
        w.pid = pid;
        w.tree = vec![pid];
        let (tx, rx) = tokio::sync::oneshot::channel();
        w.exit_status = Some(tx);
        let took = w.asked.elapsed();
        let address = w.address.clone();
        self.slots.set_pid(w.id, pid);
        tracing::info!(pool = %self.name, %key, pid, preloader, fork_ms = took.as_secs_f64() * 1000.0, "worker forked");
        let pidfd = PidFd::open(pid);
        let reports = self.reports_tx.clone();
        let start_timeout = self.state.spec().start_timeout;
        let health = self.health.clone();
        let task = tokio::spawn(async move {
            let deadline = Instant::now() + start_timeout;
            // No pidfd: the worker is gone already (ESRCH) or cannot be watched; either
            // way it is reported as ended rather than waited on forever.
            if let Ok(pidfd) = pidfd {
                let ready = async {
                    wait_listening(&address, start_timeout).await.is_ok()
                        && match &health {
                            // Its exit ends the select below, which drops this check.
                            Some(probe) => probe
                                .until_healthy(&address, deadline, || false)
                                .await
                                .is_ok(),
                            None => true,
                        }
                };
                tokio::select! {
                    ready = ready => {
                        if ready {
                            let _ = reports.send(Report::Ready(key));
                        }
                        pidfd.exited().await;
                    }
                    () = pidfd.exited() => {}
                }
            }
            let status = match tokio::time::timeout(FORKED_STATUS_WAIT, rx).await {
                Ok(Ok(status)) => status,
                // The preloader did not say (it died with its workers): as a wait error.
                _ => ExitKind::Signal(libc_sigkill()),
            };
            let _ = reports.send(Report::Exited(key, status));
        });
        if let Some(w) = self.workers.get_mut(&key) {
            w.task = Some(task.abort_handle());
        }
        self.feed(PoolEvent::Spawned { key, pid });
        false
    }

    /// Preloader `n` has exited: workers it was asked for but never forked failed to spawn;
    /// those it forked get SIGKILL now (their parent-death signal does the same), and their
    /// pidfds report them gone, after which the state machine replaces them.
    pub(super) fn preloader_gone(&mut self, n: u64, exit: ExitKind) -> bool {
        let Some(preload) = self.preload.as_mut() else {
            return false;
        };
        preload.fall_back(n);
        let Some(pre) = preload.all.remove(&n) else {
            return false;
        };
        self.template_gone(n, &pre);
        if pre.stopping {
            tracing::info!(pool = %self.name, pid = pre.pid, %exit, "preloader stopped");
        } else {
            tracing::warn!(pool = %self.name, pid = pre.pid, %exit, workers = pre.workers.len(), "preloader exited");
        }
        let mut stopped = false;
        for key in pre.workers {
            match self.workers.get(&key).map(|w| w.pid) {
                Some(0) => {
                    let reason = format!("the preloader {} {exit} before forking it", pre.pid);
                    stopped |= self.handle(PoolEvent::SpawnFailed { key, reason });
                }
                Some(pid) => {
                    let _ = process::signal_group(pid, StopSignal::Kill);
                    // No status will come from a dead preloader: let the worker's task
                    // report its end as soon as its pidfd says so.
                    if let Some(w) = self.workers.get_mut(&key) {
                        w.exit_status = None;
                    }
                }
                None => {}
            }
        }
        stopped
    }

    /// Kills a preloader that holds a fork request longer than `start_timeout` (counted
    /// from the request, so a slow app load counts too): the state machine cannot kill a
    /// worker that has no pid yet, and the preloader's exit fails the request as a spawn.
    pub(super) fn check_fork_deadlines(&mut self) {
        let limit = self.state.spec().start_timeout;
        let late: HashSet<u64> = self
            .workers
            .values()
            .filter(|w| w.pid == 0 && w.asked.elapsed() > limit)
            .filter_map(|w| w.preloader)
            .collect();
        let Some(preload) = self.preload.as_mut() else {
            return;
        };
        for n in late {
            if let Some(pre) = preload.all.get_mut(&n).filter(|p| !p.stopping && !p.killed) {
                tracing::error!(pool = %self.name, pid = pre.pid, ?limit, "preloader did not fork a worker within start_timeout; killing it");
                pre.killed = true;
                pre.signal(&self.name, StopSignal::Kill);
            }
        }
    }

    /// A rolling restart forks its replacements from a fresh preloader, which loads the
    /// app's code as it is now; the old one stops once its last worker is gone.
    pub(super) fn renew_preloader(&mut self) {
        let Some(preload) = self.preload.as_mut() else {
            return;
        };
        if let Some(old) = preload.current.take() {
            self.retire_preloader_if_done(old);
        }
    }

    /// Worker `key` of preloader `n` is forgotten.
    pub(super) fn forget_forked(&mut self, n: u64, key: WorkerKey) {
        if let Some(pre) = self.preload.as_mut().and_then(|p| p.all.get_mut(&n)) {
            pre.workers.remove(&key);
            pre.pending.retain(|(k, _, _)| *k != key);
        }
        self.retire_preloader_if_done(n);
    }

    /// Stops preloader `n` when it is no longer the current one, has no worker left, and
    /// no template promoted from one of its workers is still on its way: until that one
    /// says it is ready it has not yet cleared its parent-death signal, and `n`'s exit
    /// would kill it (a promoted worker slow to take its promotion, under load).
    pub(super) fn retire_preloader_if_done(&mut self, n: u64) {
        let Some(preload) = self.preload.as_mut() else {
            return;
        };
        if preload.current == Some(n) {
            return;
        }
        let promoting = preload
            .all
            .values()
            .any(|t| t.parent == Some(n) && !t.ready && !t.stopping);
        if promoting {
            return;
        }
        if let Some(pre) = preload.all.get_mut(&n) {
            if pre.workers.is_empty() && !pre.stopping {
                pre.stopping = true;
                pre.signal(&self.name, StopSignal::Term);
            }
        }
    }

    /// After the pool stopped (every worker reaped): SIGTERM every preloader, SIGKILL after
    /// `kill_timeout`, and wait until each is reaped.
    pub(super) async fn stop_preloaders(&mut self) {
        let Some(preload) = self.preload.as_mut() else {
            return;
        };
        preload.current = None;
        for pre in preload.all.values_mut() {
            pre.stopping = true;
            pre.signal(&self.name, StopSignal::Term);
        }
        let deadline = Instant::now() + self.state.spec().kill_timeout;
        let mut killed = false;
        while self.preload.as_ref().is_some_and(|p| !p.all.is_empty()) {
            let report = tokio::select! {
                report = self.reports.recv() => report,
                () = tokio::time::sleep_until(deadline), if !killed => {
                    killed = true;
                    if let Some(preload) = self.preload.as_ref() {
                        for pre in preload.all.values() {
                            pre.signal(&self.name, StopSignal::Kill);
                        }
                    }
                    continue;
                }
            };
            match report {
                Some(Report::Preloader(n, PreloaderEvent::Gone(exit))) => {
                    let _ = self.preloader_gone(n, exit);
                }
                // A promoted template's status, reported by the template it came from.
                Some(Report::Preloader(n, event @ PreloaderEvent::Exited { .. })) => {
                    let _ = self.on_preloader(n, event);
                }
                Some(_) => {}
                None => return,
            }
        }
    }
}
