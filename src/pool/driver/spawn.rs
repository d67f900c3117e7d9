//! Spawning one worker of a pool that neither preloads (`preload.rs` forks those) nor
//! shares a listener (`direct.rs`): its socket bound, the process started, its slot added,
//! and the task that owns its `Child`, waits until it is ready (and healthy, with a health
//! check), then for its exit, and reports both.

use super::*;

impl Driver {
    pub(super) fn spawn(&mut self, key: WorkerKey) {
        if self.is_direct() {
            self.spawn_direct(key);
            return;
        }
        if self.preload.is_some() {
            self.fork(key);
            return;
        }
        let path = match self.socket_path(key) {
            Ok(path) => path,
            Err(reason) => {
                self.feed(PoolEvent::SpawnFailed { key, reason });
                return;
            }
        };
        let mut spec = self.template.clone();
        spec.socket = WorkerSocket::Unix(path.clone());
        if let Some(group) = &spec.php_children {
            spec.php_children = Some(process::php_children::kept(group));
        }
        match spawn_worker(&spec) {
            Ok(mut spawned) => {
                let pid = spawned.pid;
                let budget = self.state.slot_budget(key);
                let id = self
                    .slots
                    .add_worker(self.concurrency, spawned.address.clone(), budget);
                self.slots.set_pid(id, pid);
                tracing::info!(pool = %self.name, %key, pid, "worker started");
                self.by_id.insert(id, key);
                self.workers.insert(
                    key,
                    Worker {
                        id,
                        pid,
                        address: spawned.address.clone(),
                        socket_file: Some(path),
                        tree: vec![pid],
                        memory: MemoryWatch::default(),
                        preloader: None,
                        exit_status: None,
                        asked: Instant::now(),
                        channel: None,
                        task: None,
                    },
                );
                if self.state.spec().recycle.max_memory.is_some() {
                    // Measured after its first request, then as its growth says.
                    self.slots.check_memory_in(id, Some(1));
                }
                let reports = self.reports_tx.clone();
                let start_timeout = self.state.spec().start_timeout;
                let address = spawned.address.clone();
                let health = self.health.clone();
                tokio::spawn(async move {
                    let deadline = Instant::now() + start_timeout;
                    // Not ready in time is the state machine's to judge (it kills the
                    // worker); an early exit is reported by the wait below.
                    let mut ready = wait_ready(&address, &mut spawned.child, start_timeout)
                        .await
                        .is_ok();
                    if let (true, Some(probe)) = (ready, health) {
                        let child = &mut spawned.child;
                        let gone = || !matches!(child.try_wait(), Ok(None));
                        ready = probe.until_healthy(&address, deadline, gone).await.is_ok();
                    }
                    report_ready_and_exit(&reports, key, ready, &mut spawned.child).await;
                });
                self.feed(PoolEvent::Spawned { key, pid });
            }
            Err(e) => {
                let reason = e.to_string();
                self.feed(PoolEvent::SpawnFailed { key, reason });
            }
        }
    }
}

pub(super) fn libc_sigkill() -> i32 {
    nix::sys::signal::Signal::SIGKILL as i32
}

/// How the task that owns a spawned worker's `Child` ends: it reports `Ready` if the worker
/// became ready, then waits for the exit and reports it.
pub(super) async fn report_ready_and_exit(
    reports: &mpsc::UnboundedSender<Report>,
    key: WorkerKey,
    ready: bool,
    child: &mut tokio::process::Child,
) {
    if ready {
        let _ = reports.send(Report::Ready(key));
    }
    let status = match child.wait().await {
        Ok(status) => ExitKind::of(status),
        // Waiting failed (ECHILD: someone else reaped it); it is gone.
        Err(_) => ExitKind::Signal(libc_sigkill()),
    };
    let _ = reports.send(Report::Exited(key, status));
}
