//! Direct pools (`accept = "direct"`, ARCHITECTURE.md "Direct pools"): real nginx with the
//! shipped conf/nginx/php-fpm-direct.conf in front of a corral whose php-cgi workers accept
//! nginx's connections on the pool's listener themselves. corral supervises (spawn, respawn,
//! max_requests, reload, rolling restart) and reports (busy/idle, listen queue) but carries
//! no request.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing,
    missing_docs
)]

mod support;

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::Duration;

use tokio::time::Instant;

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use support::direct::{
    assert_all_ok, config, field, get, parent_of, pid_in, Load, Site, POLL, WAIT,
};
use support::front::curl;
use support::peers::{shared_dir, write_file};

/// Connected Unix sockets on `path` (state 03 in /proc/net/unix), by inode.
fn connected_on(path: &Path) -> Vec<String> {
    let table = std::fs::read_to_string("/proc/net/unix").unwrap();
    let path = path.to_string_lossy();
    table
        .lines()
        .filter_map(|line| {
            let f: Vec<&str> = line.split_whitespace().collect();
            (f.len() >= 8 && f[5] == "03" && f[7] == path).then(|| f[6].to_owned())
        })
        .collect()
}

/// The socket inodes process `pid` holds open.
fn socket_inodes(pid: u32) -> Vec<String> {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .flatten()
        .filter_map(|e| std::fs::read_link(e.path()).ok())
        .filter_map(|l| {
            let l = l.to_string_lossy().into_owned();
            l.strip_prefix("socket:[")?
                .strip_suffix(']')
                .map(str::to_owned)
        })
        .collect()
}

#[test]
fn get_and_post_are_served_by_corrals_children_with_no_connection_through_corral() {
    let site = Site::start(2, "");
    let r = curl(&site.url("/hello.php"), &[]);
    assert_eq!(r.status, 200, "{r:?}\n{}", site.nginx.error_log());
    assert!(r.text().starts_with("hello pid="), "{r:?}");
    assert!(r.text().contains("method=GET"), "{r:?}");
    let pid = pid_in(&r.text());
    assert_eq!(
        parent_of(pid),
        Some(site.corral.pid()),
        "a worker corral spawned"
    );
    let body = site.dir.path().join("body");
    std::fs::write(&body, "x".repeat(200_000)).unwrap();
    let arg = format!("@{}", body.display());
    let r = curl(&site.url("/hello.php"), &["--data-binary", &arg]);
    assert_eq!(r.status, 200, "{r:?}");
    assert!(r.text().contains("method=POST body=200000"), "{r:?}");
    assert_eq!(parent_of(pid_in(&r.text())), Some(site.corral.pid()));

    // While a request is held in a worker, its connection is php-cgi's, not corral's.
    let url = site.url("/wait.php");
    let held = thread::spawn(move || curl(&url, &[]));
    site.wait_status(|s| field(s, "active processes") == Some(1));
    let socket = site.dir.path().join("www.sock");
    let connected = connected_on(&socket);
    assert_eq!(connected.len(), 1, "one accepted connection, nginx's");
    let mine = socket_inodes(site.corral.pid());
    assert!(
        !connected.iter().any(|c| mine.contains(c)),
        "corral holds no accepted connection"
    );
    std::fs::write(site.dir.path().join("root/release"), "").unwrap();
    let r = held.join().unwrap();
    assert_eq!(r.status, 200, "{r:?}");
    assert!(r.text().starts_with("released "), "{r:?}");
    // corral's own request counters never moved.
    let s = site.status();
    assert_eq!(field(&s, "accepted conn"), Some(0), "{s}");
}

#[test]
fn a_killed_worker_is_replaced_and_max_requests_recycles_without_a_crash() {
    let site = Site::start(2, "max_requests = 5");
    let port = site.nginx.ports[0];
    let mut pids = std::collections::BTreeSet::new();
    for _ in 0..30 {
        let (code, body) = get(port, "/hello.php");
        assert_eq!(code, 200, "{body}");
        pids.insert(pid_in(&body));
    }
    // 30 requests over 2 workers that exit after 5: at least 6 processes served.
    assert!(
        pids.len() >= 6,
        "recycled by PHP_FCGI_MAX_REQUESTS: {pids:?}"
    );
    for p in &pids {
        // A recycled worker may be gone already; a live one is corral's child.
        assert!(
            parent_of(*p).is_none_or(|pp| pp == site.corral.pid()),
            "{p}"
        );
    }
    let s = site.wait_status(|s| field(s, "idle processes") == Some(2));
    assert_eq!(
        field(&s, "crashes"),
        Some(0),
        "exits after max_requests are no crash:\n{s}\n{}",
        site.corral.log()
    );
    // Each worker that left wrote its record, with php-cgi's own count: its budget.
    let counted = |log: &str| -> Vec<u64> {
        records(log)
            .iter()
            .filter_map(|l| {
                l.split("requests=")
                    .nth(1)?
                    .split_whitespace()
                    .next()?
                    .parse()
                    .ok()
            })
            .collect()
    };
    let deadline = Instant::now() + WAIT;
    while counted(&site.corral.log()).len() < 4 {
        assert!(
            Instant::now() < deadline,
            "no records:\n{}",
            site.corral.log()
        );
        thread::sleep(POLL);
    }
    let log = site.corral.log();
    assert!(counted(&log).iter().all(|n| *n >= 5), "{log}");
    assert!(
        records(&log)
            .iter()
            .all(|l| l.contains("cpu_ms=") && l.contains("busy_percent=")),
        "{log}"
    );

    let before = site.workers();
    assert_eq!(before.len(), 2, "{before:?}");
    kill(Pid::from_raw(before[0] as i32), Signal::SIGKILL).unwrap();
    let deadline = Instant::now() + WAIT;
    loop {
        let now = site.workers();
        if now.len() == 2 && !now.contains(&before[0]) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "not replaced: {now:?}\n{}",
            site.corral.log()
        );
        thread::sleep(POLL);
    }
    for _ in 0..10 {
        let (code, body) = get(port, "/hello.php");
        assert_eq!(code, 200, "{body}");
    }
    let s = site.status();
    assert_eq!(field(&s, "crashes"), Some(1), "the SIGKILL is one:\n{s}");
    // Its record cannot say how many requests it served.
    let pid = format!("pid={} ", before[0]);
    let log = site.corral.log();
    let killed: Vec<_> = records(&log)
        .into_iter()
        .filter(|l| l.contains(&pid))
        .collect();
    assert_eq!(killed.len(), 1, "{log}");
    assert!(killed[0].contains("requests=unknown"), "{}", killed[0]);
    assert!(
        killed[0].contains("exit=killed by signal SIGKILL"),
        "{}",
        killed[0]
    );
}

/// The per-worker records in corral's log (a direct pool has no per-request access log).
fn records(log: &str) -> Vec<&str> {
    log.lines()
        .filter(|l| l.contains("direct worker record"))
        .collect()
}

/// A worker over `max_memory` (sampled every second from its PSS) is replaced: the
/// replacement first, then the old one stops once it is back in accept, so requests go on.
#[test]
fn a_worker_over_max_memory_is_replaced_and_requests_go_on() {
    let site = Site::start(1, "max_memory = \"1M\"");
    let port = site.nginx.ports[0];
    let first = site.workers();
    let deadline = Instant::now() + WAIT;
    loop {
        let (code, body) = get(port, "/hello.php");
        assert_eq!(code, 200, "{body}");
        let s = site.status();
        if field(&s, "recycled max memory").unwrap_or(0) >= 1
            && !site.workers().iter().any(|p| first.contains(p))
        {
            break;
        }
        assert!(Instant::now() < deadline, "never recycled:\n{s}");
        thread::sleep(Duration::from_millis(50));
    }
}

/// A client loop runs through a rolling restart and three reloads that change the pool (a new
/// pool each time, on the same socket): every request succeeds.
#[test]
fn restart_workers_and_three_reloads_lose_no_request() {
    let site = Site::start(2, "");
    let load = Load::start(site.nginx.ports[0], "/hello.php", 3, Duration::ZERO);
    thread::sleep(Duration::from_millis(300));
    let first = site.workers();
    kill(Pid::from_raw(site.corral.pid() as i32), Signal::SIGUSR2).unwrap();
    let second = site.wait_replaced(&first, 2);
    thread::sleep(Duration::from_millis(300));
    // Changed pools, reload after reload: each a new pool on the very socket the old one's
    // workers accept on.
    let file = site.dir.path().join("corral.toml");
    let mut old = second;
    for (n, max) in [3, 2, 3].into_iter().enumerate() {
        std::fs::write(&file, config(site.dir.path(), max, "")).unwrap();
        kill(Pid::from_raw(site.corral.pid() as i32), Signal::SIGHUP).unwrap();
        assert!(
            site.corral_reloads(n + 1),
            "reload {n} not applied:\n{}",
            site.corral.log()
        );
        old = site.wait_replaced(&old, 2);
        // The new pool's size (not its idle count: the clients keep workers busy, and on a
        // loaded machine all of them may never be seen in accept at once).
        site.wait_status(|s| field(s, "total processes") == Some(u64::from(max)));
        thread::sleep(Duration::from_millis(300));
    }
    load.reached(51);
    assert_all_ok(&load.finish(), &site, 51);
}

/// Under a load that keeps the accept queue full, a worker is never seen blocked in accept
/// (each accept returns at once). A restart must still not SIGKILL it mid-request at
/// `kill_timeout`: after half of it the worker gets SIGTERM anyway, finishes the request it
/// holds and exits 0, and every client request succeeds.
#[test]
fn a_worker_never_seen_in_accept_still_leaves_between_requests() {
    let site = Site::start(1, "");
    write_file(
        &site.dir.path().join("root"),
        "slow.php",
        "<?php usleep(20000); echo 'slow pid=', getmypid(), \"\\n\";",
    );
    let port = site.nginx.ports[0];
    let stop = Arc::new(AtomicBool::new(false));
    let results = Arc::new(Mutex::new(Vec::new()));
    let clients: Vec<_> = (0..6)
        .map(|_| {
            let (stop, results) = (Arc::clone(&stop), Arc::clone(&results));
            thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    let r = get(port, "/slow.php");
                    results.lock().unwrap().push(r);
                }
            })
        })
        .collect();
    thread::sleep(Duration::from_millis(300));
    let old = site.workers();
    kill(Pid::from_raw(site.corral.pid() as i32), Signal::SIGUSR2).unwrap();
    let deadline = Instant::now() + WAIT;
    while site.workers().iter().any(|p| old.contains(p)) {
        assert!(Instant::now() < deadline, "the old worker never left");
        thread::sleep(POLL);
    }
    stop.store(true, Ordering::Relaxed);
    for c in clients {
        c.join().unwrap();
    }
    let results = results.lock().unwrap();
    let failed: Vec<_> = results.iter().filter(|(c, _)| *c != 200).collect();
    assert!(
        failed.is_empty(),
        "{} of {} failed: {:?}\n{}",
        failed.len(),
        results.len(),
        failed.first(),
        site.nginx.error_log()
    );
    let s = site.status();
    assert_eq!(field(&s, "kill timeouts"), Some(0), "{s}");
    let pid = format!("pid={} ", old[0]);
    let deadline = Instant::now() + WAIT;
    loop {
        let log = site.corral.log();
        if let Some(line) = records(&log).into_iter().find(|l| l.contains(&pid)) {
            assert!(line.contains("exit=exited with code 0"), "{line}");
            break;
        }
        assert!(Instant::now() < deadline, "no record for {pid}:\n{log}");
        thread::sleep(POLL);
    }
}

/// A worker is asked to stop only once it is back in accept: php-cgi's SIGTERM handler
/// would cut short the script's own blocking calls (a sleep, a database read), so a restart
/// that signalled a busy worker would change what its request answers.
#[test]
fn a_busy_worker_is_signalled_only_once_its_request_is_done() {
    let site = Site::start(1, "");
    let old = site.workers();
    let url = site.url("/nap.php");
    let napping = thread::spawn(move || curl(&url, &[]));
    site.wait_status(|s| field(s, "active processes") == Some(1));
    kill(Pid::from_raw(site.corral.pid() as i32), Signal::SIGUSR2).unwrap();
    let r = napping.join().unwrap();
    assert_eq!(r.status, 200, "{r:?}");
    let slept: f64 = r.text().trim_start_matches("slept ").parse().unwrap();
    assert!(slept >= 0.79, "the nap was cut short: {}", r.text());
    let deadline = Instant::now() + WAIT;
    while site.workers().iter().any(|p| old.contains(p)) {
        assert!(Instant::now() < deadline, "the old worker never left");
        thread::sleep(POLL);
    }
}

/// corral sees no request of a direct pool, but a worker that holds the same connection
/// past `request_timeout` without going back to accept is stuck in one request: it is
/// killed and replaced, and the request fails (502 from nginx) instead of hanging.
#[test]
fn a_request_past_request_timeout_kills_its_worker() {
    let site = Site::start(1, "request_timeout = \"1s\"");
    write_file(
        &site.dir.path().join("root"),
        "stuck.php",
        "<?php sleep(30); echo 'late';",
    );
    let old = site.workers();
    let started = Instant::now();
    let r = curl(&site.url("/stuck.php"), &[]);
    assert_eq!(r.status, 502, "{r:?}");
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "{:?}",
        started.elapsed()
    );
    let s = site.wait_status(|s| field(s, "idle processes") == Some(1));
    assert_eq!(field(&s, "request timeouts"), Some(1), "{s}");
    assert!(!site.workers().iter().any(|p| old.contains(p)), "replaced");
    let r = curl(&site.url("/hello.php"), &[]);
    assert_eq!(r.status, 200, "{r:?}");
    // A worker that serves request after request is never taken for a stuck one.
    let port = site.nginx.ports[0];
    let until = Instant::now() + Duration::from_millis(2500);
    while Instant::now() < until {
        assert_eq!(get(port, "/hello.php").0, 200);
    }
    assert_eq!(field(&site.status(), "request timeouts"), Some(1));
}

#[test]
fn the_shipped_snippet_runs_no_upload_and_serves_no_dotfile() {
    let site = Site::start(1, "");
    site.assert_refuses_attack_urls();
    // PATH_INFO still reaches a real script.
    let r = curl(&site.url("/hello.php/extra"), &[]);
    assert_eq!(r.status, 200, "{r:?}");
}

#[test]
fn status_shows_busy_and_idle_workers_and_the_kernels_listen_queue() {
    let site = Site::start(2, "");
    let s = site.status();
    assert_eq!(field(&s, "active processes"), Some(0), "{s}");
    assert_eq!(field(&s, "listen queue"), Some(0), "{s}");
    assert_eq!(field(&s, "listen queue len"), Some(511), "{s}");
    // Two requests hold both workers; a third waits in the kernel's accept queue.
    let held: Vec<_> = (0..3)
        .map(|_| {
            let url = site.url("/wait.php");
            thread::spawn(move || curl(&url, &[]))
        })
        .collect();
    let s = site.wait_status(|s| {
        field(s, "active processes") == Some(2) && field(s, "listen queue") == Some(1)
    });
    assert_eq!(field(&s, "idle processes"), Some(0), "{s}");
    // Per worker too, in corral's own fields.
    assert_eq!(s.matches("state:                Busy").count(), 2, "{s}");
    std::fs::write(site.dir.path().join("root/release"), "").unwrap();
    for h in held {
        let r = h.join().unwrap();
        assert_eq!(r.status, 200, "{r:?}");
    }
    site.wait_status(|s| {
        field(s, "idle processes") == Some(2) && field(s, "listen queue") == Some(0)
    });
}

#[test]
fn corral_check_says_what_a_direct_pool_gives_up() {
    let dir = shared_dir();
    let file = dir.path().join("c.toml");
    std::fs::write(&file, config(dir.path(), 2, "")).unwrap();
    let out = std::process::Command::new(support::CORRAL)
        .args(["check", "-c"])
        .arg(&file)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    assert!(
        text.contains("corral cannot inspect its requests"),
        "{text}"
    );
    assert!(text.contains("conf/nginx/php-fpm-direct.conf"), "{text}");
}
