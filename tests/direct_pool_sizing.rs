//! Dynamic and ondemand direct pools (`accept = "direct"`, ARCHITECTURE.md "Direct pools"):
//! corral sees none of their requests, so it sizes them from the kernel's view (a worker
//! blocked in accept is idle, the listening socket's accept queue is the demand). Real nginx
//! with the shipped snippet in front, real php-cgi behind, clients running while the pool
//! grows and shrinks: every request is answered 200.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing,
    missing_docs
)]

mod support;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::thread;
use std::time::Duration;

use tokio::time::Instant;

use support::direct::{assert_all_ok, field, parent_of, pid_in, Load, Site, POLL, WAIT};
use support::front::curl;
use support::peers::write_file;

/// Polls corral's children until `done` holds, keeping the largest count seen.
fn watch_workers(site: &Site, most: &AtomicUsize, done: impl Fn(usize) -> bool) -> bool {
    let deadline = Instant::now() + WAIT;
    loop {
        let n = site.workers().len();
        most.fetch_max(n, Ordering::Relaxed);
        if done(n) {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        thread::sleep(POLL);
    }
}

fn slow_page(site: &Site) {
    write_file(
        &site.dir.path().join("root"),
        "slow.php",
        "<?php usleep(20000); echo 'slow pid=', getmypid(), \"\\n\";",
    );
}

/// An ondemand pool has no worker until a connection waits on its socket: corral sees it
/// there without accepting it, starts a worker, and that worker takes the connection. An
/// idle worker is retired after `idle_timeout`.
#[test]
fn ondemand_starts_a_worker_for_a_waiting_connection_and_retires_it_when_idle() {
    let site = Site::start_sized("mode = \"ondemand\"\nmax = 3\nidle_timeout = \"1s\"", "");
    let s = site.wait_status(|s| field(s, "total processes") == Some(0));
    assert_eq!(field(&s, "listen queue len"), Some(511), "bound: {s}");
    assert!(site.workers().is_empty(), "{:?}", site.workers());

    let r = curl(&site.url("/hello.php"), &[]);
    assert_eq!(
        r.status,
        200,
        "{r:?}\n{}\n{}",
        site.nginx.error_log(),
        site.corral.log()
    );
    let pid = pid_in(&r.text());
    assert_eq!(
        parent_of(pid),
        Some(site.corral.pid()),
        "a worker corral started"
    );
    // Served again by the same worker while it is not idle for long.
    let r = curl(&site.url("/hello.php"), &[]);
    assert_eq!(pid_in(&r.text()), pid, "{r:?}");

    let most = AtomicUsize::new(0);
    assert!(
        watch_workers(&site, &most, |n| n == 0),
        "the idle worker was never retired:\n{}",
        site.status()
    );
    let s = site.wait_status(|s| field(s, "total processes") == Some(0));
    assert!(field(&s, "retired idle").unwrap_or(0) >= 1, "{s}");
    assert_eq!(field(&s, "crashes"), Some(0), "{s}");
    // And it starts again.
    let r = curl(&site.url("/hello.php"), &[]);
    assert_eq!(r.status, 200, "{r:?}");
    assert_ne!(pid_in(&r.text()), pid);
}

/// Under load an ondemand pool grows toward `max` (never past it), and once the load is
/// gone it shrinks back to no worker; no request fails on the way up or down.
#[test]
fn ondemand_grows_under_load_and_shrinks_back_with_no_failed_request() {
    let site = Site::start_sized("mode = \"ondemand\"\nmax = 4\nidle_timeout = \"1s\"", "");
    site.wait_status(|s| field(s, "total processes") == Some(0));
    slow_page(&site);
    let port = site.nginx.ports[0];
    let load = Load::start(port, "/slow.php", 6, Duration::ZERO);
    let most = AtomicUsize::new(0);
    let grew = watch_workers(&site, &most, |n| n >= 4);
    thread::sleep(Duration::from_millis(500));
    watch_workers(&site, &most, |_| true);
    load.reached(50);
    let busy = load.finish();
    assert!(grew, "never grew to 4: at most {most:?}\n{}", site.status());
    assert!(most.load(Ordering::Relaxed) <= 4, "past max: {most:?}");
    assert_all_ok(&busy, &site, 50);

    // A light client keeps going while the pool shrinks. The kernel hands connections to
    // the workers in accept in turn, so with a request every 600 ms each of three or four
    // workers gets one less often than idle_timeout (1 s), and they retire one by one.
    let light = Load::start(port, "/hello.php", 1, Duration::from_millis(600));
    let shrank = watch_workers(&site, &AtomicUsize::new(0), |n| n <= 2);
    thread::sleep(Duration::from_secs(1));
    light.reached(3);
    let results = light.finish();
    assert!(shrank, "never shrank:\n{}", site.status());
    assert_all_ok(&results, &site, 3);
    let most = AtomicUsize::new(0);
    assert!(
        watch_workers(&site, &most, |n| n == 0),
        "not back to no worker:\n{}",
        site.status()
    );
    assert_eq!(field(&site.status(), "crashes"), Some(0));
}

/// A dynamic pool keeps `spare_min` idle workers by the kernel's view: a worker held in a
/// request is busy, so a spare is started. Under load it grows, and after the load it
/// shrinks back to `min`, with every request answered.
#[test]
fn dynamic_keeps_a_spare_grows_under_load_and_shrinks_to_min() {
    let sizing = "mode = \"dynamic\"\nmin = 1\nmax = 5\nspare_min = 1\nspare_max = 2\n\
                  idle_timeout = \"1s\"";
    let site = Site::start_sized(sizing, "");
    let s = site.wait_status(|s| {
        field(s, "total processes") == Some(1) && field(s, "idle processes") == Some(1)
    });
    assert_eq!(field(&s, "active processes"), Some(0), "{s}");

    // One request held: its worker is busy in the kernel's view, so a spare is started.
    let url = site.url("/wait.php");
    let held = thread::spawn(move || curl(&url, &[]));
    site.wait_status(|s| {
        field(s, "active processes") == Some(1)
            && field(s, "idle processes") == Some(1)
            && field(s, "total processes") == Some(2)
    });
    std::fs::write(site.dir.path().join("root/release"), "").unwrap();
    assert_eq!(held.join().unwrap().status, 200);

    slow_page(&site);
    let port = site.nginx.ports[0];
    let load = Load::start(port, "/slow.php", 6, Duration::ZERO);
    let most = AtomicUsize::new(0);
    let grew = watch_workers(&site, &most, |n| n >= 4);
    load.reached(50);
    let busy = load.finish();
    assert!(
        grew,
        "never grew past 3: at most {most:?}\n{}",
        site.status()
    );
    assert!(most.load(Ordering::Relaxed) <= 5, "past max: {most:?}");
    assert_all_ok(&busy, &site, 50);

    let light = Load::start(port, "/hello.php", 1, Duration::from_millis(30));
    let shrank = watch_workers(&site, &AtomicUsize::new(0), |n| n <= 2);
    light.reached(5);
    let results = light.finish();
    assert!(shrank, "never shrank:\n{}", site.status());
    assert_all_ok(&results, &site, 5);
    let s = site.wait_status(|s| field(s, "total processes") == Some(1));
    assert!(field(&s, "retired idle").unwrap_or(0) >= 2, "{s}");
    assert_eq!(field(&s, "crashes"), Some(0), "{s}");
}
