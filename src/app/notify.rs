//! systemd's `Type=notify` from the running corral: READY=1 once every pool has its floor of
//! workers, then STATUS= lines and the watchdog.

use std::collections::HashMap;
use std::sync::Arc;

use crate::config::{Backend, Config};
use crate::gateway::Gateway;

/// How often `STATUS=` is sent to systemd while serving.
const NOTIFY_STATUS_EVERY: std::time::Duration = std::time::Duration::from_secs(5);

/// For each pool (by name), the workers it must have ready before corral is ready: its
/// `min` (0 for pools of running servers and on-demand pools); and how long to wait at most.
pub(super) fn ready_wait(config: &Config) -> (HashMap<String, usize>, std::time::Duration) {
    let mut wait = std::time::Duration::from_secs(1);
    let floors = config
        .pools
        .iter()
        .map(|p| {
            if let Backend::Spawned(spawn) = &p.backend {
                wait = wait.max(spawn.start_timeout + std::time::Duration::from_secs(1));
            }
            let floor = crate::pool::state::PoolSpec::from_config(p, config.server.kill_timeout)
                .map_or(0, |s| s.floor());
            (p.name.clone(), floor)
        })
        .collect();
    (floors, wait)
}

/// One line for systemd's `STATUS=`: what `systemctl status` shows. A pool that has never
/// had a worker ready although it tried is named with its latest failure, since its clients
/// get 503s while spawns are retried.
pub(super) fn status_line(gateway: &Gateway) -> String {
    let (mut workers, mut busy, mut queued, mut served) = (0, 0, 0, 0);
    let mut failing = String::new();
    for pool in gateway.current().pools.iter() {
        let slots = pool.slots.stats();
        workers += slots.accepting_workers;
        busy += slots.in_flight;
        queued += slots.queued;
        served += pool.requests.snapshot().accepted;
        if let Some(rx) = &pool.status {
            let published = rx.borrow();
            if let Some(why) =
                crate::pool::driver::never_started(&published.status, &published.recent)
            {
                failing.push_str(&format!(
                    "; pool {} never started a worker: {}",
                    pool.name,
                    why.replace('\n', " ")
                ));
            }
        }
    }
    format!(
        "{workers} workers accepting, {busy} requests in flight, {queued} queued, {served} served{failing}"
    )
}

/// Sends READY=1 once every pool has its floor of ready workers (or the wait is over, with
/// a warning: a pool that cannot start must not keep systemd waiting forever), then STATUS=
/// every few seconds and WATCHDOG=1 as asked, until aborted.
pub(super) async fn notify_loop(
    notifier: Arc<crate::systemd::Notifier>,
    gateway: Arc<Gateway>,
    (floors, wait): (HashMap<String, usize>, std::time::Duration),
) {
    let deadline = tokio::time::Instant::now() + wait;
    loop {
        let generation = gateway.current();
        let short = generation
            .pools
            .iter()
            .find(|p| p.ready_workers() < floors.get(&*p.name).copied().unwrap_or(0))
            .map(|p| Arc::clone(&p.name));
        match short {
            None => break,
            Some(name) if tokio::time::Instant::now() >= deadline => {
                tracing::warn!(pool = %name, "not every pool has its min workers ready; telling systemd we are ready anyway");
                break;
            }
            Some(_) => tokio::time::sleep(std::time::Duration::from_millis(20)).await,
        }
    }
    notifier.notify(&format!("READY=1\nSTATUS={}", status_line(&gateway)));
    tracing::info!("ready (told systemd)");
    let mut status = tokio::time::interval(NOTIFY_STATUS_EVERY);
    let watchdog_every = notifier.watchdog_interval();
    let mut watchdog = tokio::time::interval(watchdog_every.unwrap_or(NOTIFY_STATUS_EVERY));
    loop {
        tokio::select! {
            _ = status.tick() => notifier.notify(&format!("STATUS={}", status_line(&gateway))),
            _ = watchdog.tick(), if watchdog_every.is_some() => notifier.notify("WATCHDOG=1"),
        }
    }
}
