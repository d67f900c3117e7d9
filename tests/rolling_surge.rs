//! `max_surge` with real php-cgi workers: during `corral restart-workers` the number of live
//! workers (corral's child processes, polled from /proc) never exceeds the pool's size plus
//! `max_surge`, every request sent meanwhile succeeds, and every worker is replaced.

mod support;

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::Duration;

use support::peers::{shared_dir, write_file};
use support::server::Corral;
use support::sync1::{children, try_get};

const SIZE: usize = 3;
const TIMEOUT: Duration = Duration::from_secs(20);

/// Runs a rolling restart of a static pool of [`SIZE`] php-cgi workers with `max_surge`
/// under a client loop; the most live workers seen.
fn restart_with(max_surge: u32) -> usize {
    let dir = shared_dir();
    write_file(
        dir.path(),
        "index.php",
        "<?php usleep(2000); echo getmypid();",
    );
    let text = support::site_config(
        &dir.path().join("run"),
        &format!(
            "command = [\"php-cgi\"]\nmode = \"static\"\nmax = {SIZE}\nmax_surge = {max_surge}"
        ),
    )
    .replace(
        "pool = \"site\"\n",
        &format!("pool = \"site\"\nroot = \"{}\"\n", dir.path().display()),
    );
    let corral = Corral::start(&text, 1);
    let pid = corral.pid();
    assert!(
        support::eventually(TIMEOUT, || children(pid).len() == SIZE),
        "{}",
        corral.log()
    );
    let old: BTreeSet<u32> = children(pid).into_iter().collect();
    let status = try_get(corral.status_ready_addr(), "/status?json", TIMEOUT).unwrap();
    assert!(
        status.1.contains(&format!("\"max surge\":{max_surge}")),
        "{status:?}"
    );
    let stop = Arc::new(AtomicBool::new(false));
    // Live workers, polled as fast as /proc can be read.
    let peak = Arc::new(AtomicUsize::new(0));
    let poller = {
        let (stop, peak) = (Arc::clone(&stop), Arc::clone(&peak));
        thread::spawn(move || {
            while !stop.load(Ordering::SeqCst) {
                peak.fetch_max(children(pid).len(), Ordering::SeqCst);
            }
        })
    };
    // Two clients, so that old workers are often busy when their turn comes.
    let failures = Arc::new(Mutex::new(Vec::new()));
    let served = Arc::new(AtomicUsize::new(0));
    let clients: Vec<_> = (0..2)
        .map(|_| {
            let (stop, failures, served) = (
                Arc::clone(&stop),
                Arc::clone(&failures),
                Arc::clone(&served),
            );
            let addr = corral.http_addr();
            thread::spawn(move || {
                while !stop.load(Ordering::SeqCst) {
                    match try_get(addr, "/index.php", TIMEOUT) {
                        Ok((200, _)) => {}
                        other => failures.lock().unwrap().push(format!("{other:?}")),
                    }
                    served.fetch_add(1, Ordering::SeqCst);
                }
            })
        })
        .collect();
    assert!(support::eventually(TIMEOUT, || served
        .load(Ordering::SeqCst)
        > 20));
    let path = corral.config_path().display().to_string();
    let out = support::corral(&["restart-workers", "-c", &path]);
    assert_eq!(out.code, Some(0), "{out:?}");
    // Done once every old worker is gone and the pool is back at its size.
    assert!(
        support::eventually(TIMEOUT, || {
            old.iter().all(|&p| !support::alive(p)) && children(pid).len() == SIZE
        }),
        "{}",
        corral.log()
    );
    let before = served.load(Ordering::SeqCst);
    assert!(support::eventually(TIMEOUT, || served
        .load(Ordering::SeqCst)
        > before + 20));
    stop.store(true, Ordering::SeqCst);
    poller.join().unwrap();
    for c in clients {
        c.join().unwrap();
    }
    let failures = failures.lock().unwrap();
    assert!(failures.is_empty(), "{failures:?}\n{}", corral.log());
    let now: BTreeSet<u32> = children(pid).into_iter().collect();
    assert!(now.is_disjoint(&old), "{now:?} {old:?}");
    assert_eq!(
        corral.count_log("of a rolling restart"),
        SIZE,
        "{}",
        corral.log()
    );
    let peak = peak.load(Ordering::SeqCst);
    eprintln!(
        "max_surge {max_surge}: at most {peak} live workers, {} requests",
        served.load(Ordering::SeqCst)
    );
    peak
}

#[test]
fn max_surge_0_never_runs_more_workers_than_the_pool_has() {
    let peak = restart_with(0);
    assert!(peak <= SIZE, "{peak} live workers");
}

#[test]
fn max_surge_2_runs_at_most_two_above_the_pool() {
    let peak = restart_with(2);
    assert!(peak <= SIZE + 2, "{peak} live workers");
}
