//! `php_children` on a direct pool (ARCHITECTURE.md "Direct pools"; docs/pools.md): php-fpm's
//! own process model under corral. Real nginx with the shipped conf/nginx/php-fpm-direct.conf
//! in front; corral binds the listener and spawns php-cgi parents with it as fd 0, whose
//! children accept nginx's connections and share one OPcache. corral counts the children
//! busy/idle from the kernel, recycles one child over `max_memory` between its requests,
//! kills one stuck past `request_timeout`, retires a whole group on reload without cutting
//! a request, and (for gateway pools too) no child outlives a SIGKILLed corral.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing,
    missing_docs
)]

mod support;

use std::thread;
use std::time::Duration;

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use tokio::time::Instant;

use support::direct::{
    assert_all_ok, children_of, config_sized, field, get, parent_of, pid_in, Load, Site, POLL, WAIT,
};
use support::front::curl;
use support::peers::write_file;

const STATIC: &str = "mode = \"static\"\nmax = 1";

/// A static direct pool of `groups` php-cgi parents of `children` each, all children idle.
fn site(groups: u32, children: u32, extra: &str) -> Site {
    let sizing = format!("mode = \"static\"\nmax = {groups}");
    let site = Site::start_sized(&sizing, &format!("php_children = {children}\n{extra}"));
    let all = u64::from(groups * children);
    site.wait_status(|s| field(s, "idle processes") == Some(all));
    site
}

/// The php-cgi children of corral's php-cgi parents.
fn grandchildren(site: &Site) -> Vec<u32> {
    site.workers().into_iter().flat_map(children_of).collect()
}

fn signal_corral(site: &Site, sig: Signal) {
    kill(Pid::from_raw(site.corral.pid() as i32), sig).unwrap();
}

#[test]
fn hello_is_served_by_a_child_of_corrals_parent_and_the_attack_urls_are_not() {
    let site = site(1, 3, "");
    let parents = site.workers();
    assert_eq!(parents.len(), 1, "one php-cgi parent");
    assert_eq!(children_of(parents[0]).len(), 3, "forking three children");
    let r = curl(&site.url("/hello.php"), &[]);
    assert_eq!(r.status, 200, "{r:?}\n{}", site.nginx.error_log());
    assert!(r.text().contains("method=GET"), "{r:?}");
    let child = pid_in(&r.text());
    assert_eq!(parent_of(child), Some(parents[0]), "served by a child");
    site.assert_refuses_attack_urls();
}

#[test]
fn status_counts_children_busy_and_idle_not_parents() {
    let site = site(2, 2, "");
    let s = site.status();
    assert_eq!(field(&s, "total processes"), Some(4), "{s}");
    assert_eq!(field(&s, "active processes"), Some(0), "{s}");
    let url = site.url("/wait.php");
    let held: Vec<_> = (0..3)
        .map(|_| {
            let url = url.clone();
            thread::spawn(move || curl(&url, &[]))
        })
        .collect();
    let s = site.wait_status(|s| field(s, "active processes") == Some(3));
    assert_eq!(field(&s, "idle processes"), Some(1), "{s}");
    assert_eq!(field(&s, "total processes"), Some(4), "{s}");
    std::fs::write(site.dir.path().join("root/release"), "").unwrap();
    for h in held {
        let r = h.join().unwrap();
        assert_eq!(r.status, 200, "{r:?}");
    }
    site.wait_status(|s| field(s, "idle processes") == Some(4));
}

/// Every child is over a 1 MiB `max_memory`: each is sent SIGTERM once seen in accept, and
/// its parent (the same one throughout) forks a replacement. A request running in an
/// over-limit child is not cut short.
#[test]
fn a_child_over_max_memory_is_replaced_by_its_parent_between_requests() {
    let site = site(1, 2, "max_memory = \"1M\"");
    let parent = site.workers();
    let first = grandchildren(&site);
    let url = site.url("/nap.php");
    let napping = thread::spawn(move || curl(&url, &[]));
    let port = site.nginx.ports[0];
    let deadline = Instant::now() + WAIT;
    loop {
        let (code, body) = get(port, "/hello.php");
        assert_eq!(code, 200, "{body}");
        let s = site.status();
        let now = grandchildren(&site);
        if field(&s, "recycled max memory").unwrap_or(0) >= 2
            && !now.iter().any(|p| first.contains(p))
        {
            break;
        }
        assert!(Instant::now() < deadline, "never recycled:\n{s}");
        thread::sleep(Duration::from_millis(50));
    }
    let r = napping.join().unwrap();
    assert_eq!(r.status, 200, "{r:?}");
    let slept: f64 = r.text().trim_start_matches("slept ").parse().unwrap();
    assert!(slept >= 0.79, "the nap was cut short: {}", r.text());
    assert_eq!(site.workers(), parent, "the group went on");
    assert_eq!(field(&site.status(), "crashes"), Some(0));
}

/// A child that holds one connection past `request_timeout` is killed (nginx answers 502);
/// its parent forks another and the group goes on serving.
#[test]
fn a_child_past_request_timeout_is_killed_and_its_group_goes_on() {
    let site = site(1, 2, "request_timeout = \"1s\"");
    write_file(
        &site.dir.path().join("root"),
        "stuck.php",
        "<?php sleep(30); echo 'late';",
    );
    let parent = site.workers();
    let started = Instant::now();
    let r = curl(&site.url("/stuck.php"), &[]);
    assert_eq!(r.status, 502, "{r:?}");
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "{:?}",
        started.elapsed()
    );
    let s = site.wait_status(|s| field(s, "idle processes") == Some(2));
    assert_eq!(field(&s, "request timeouts"), Some(1), "{s}");
    assert_eq!(site.workers(), parent, "the parent was not replaced");
    assert_eq!(get(site.nginx.ports[0], "/hello.php").0, 200);
    // Children serving request after request are never taken for stuck ones.
    let port = site.nginx.ports[0];
    let until = Instant::now() + Duration::from_millis(2500);
    while Instant::now() < until {
        assert_eq!(get(port, "/hello.php").0, 200);
    }
    assert_eq!(field(&site.status(), "request timeouts"), Some(1));
}

/// A group is retired without cutting a request: a restart while a child naps lets the nap
/// run its full length (php-cgi's parent, sent SIGTERM, would pass it to every child and
/// cut the nap short).
#[test]
fn a_retired_group_lets_its_busy_child_finish_its_request() {
    let site = site(1, 2, "");
    let old = site.workers();
    let url = site.url("/nap.php");
    let napping = thread::spawn(move || curl(&url, &[]));
    site.wait_status(|s| field(s, "active processes") == Some(1));
    signal_corral(&site, Signal::SIGUSR2);
    let r = napping.join().unwrap();
    assert_eq!(r.status, 200, "{r:?}");
    let slept: f64 = r.text().trim_start_matches("slept ").parse().unwrap();
    assert!(slept >= 0.79, "the nap was cut short: {}", r.text());
    let deadline = Instant::now() + WAIT;
    while site.workers().iter().any(|p| old.contains(p)) {
        assert!(Instant::now() < deadline, "the old group never left");
        thread::sleep(POLL);
    }
    let s = site.wait_status(|s| field(s, "idle processes") == Some(2));
    assert_eq!(field(&s, "kill timeouts"), Some(0), "{s}");
}

/// Clients loop through a rolling restart and two reloads that change the pool (each a new
/// generation of groups on the same socket): every request succeeds.
#[test]
fn restart_workers_and_reloads_under_load_lose_no_request() {
    let site = site(2, 2, "");
    let load = Load::start(site.nginx.ports[0], "/hello.php", 4, Duration::ZERO);
    load.served(50);
    let first = site.workers();
    signal_corral(&site, Signal::SIGUSR2);
    let mut old = site.wait_replaced(&first, 2);
    let file = site.dir.path().join("corral.toml");
    for (n, groups) in [3u32, 2].into_iter().enumerate() {
        load.served(50);
        let sizing = format!("mode = \"static\"\nmax = {groups}");
        std::fs::write(
            &file,
            config_sized(site.dir.path(), &sizing, "php_children = 2"),
        )
        .unwrap();
        signal_corral(&site, Signal::SIGHUP);
        assert!(
            site.corral_reloads(n + 1),
            "reload {n}:\n{}",
            site.corral.log()
        );
        old = site.wait_replaced(&old, groups as usize);
        site.wait_status(|s| field(s, "total processes") == Some(u64::from(groups * 2)));
    }
    load.served(50);
    assert_all_ok(&load.finish(), &site, 0);
    let s = site.status();
    assert_eq!(field(&s, "kill timeouts"), Some(0), "{s}");
}

/// A php-cgi parent that dies on its own (here SIGKILL, as the OOM killer would) is a
/// crash, replaced by a new group; its children, which would serve on the socket with no
/// parent and no supervisor, are killed with it.
#[test]
fn a_parent_that_dies_takes_its_children_with_it_and_is_replaced() {
    let site = site(1, 2, "");
    let parent = site.workers();
    let kids = grandchildren(&site);
    assert_eq!(kids.len(), 2, "{kids:?}");
    kill(Pid::from_raw(parent[0] as i32), Signal::SIGKILL).unwrap();
    let left = all_gone(&kids);
    for p in &left {
        let _ = kill(Pid::from_raw(*p as i32), Signal::SIGKILL);
    }
    assert!(left.is_empty(), "orphans left serving: {left:?}");
    let s = site.wait_status(|s| field(s, "idle processes") == Some(2));
    assert_eq!(field(&s, "crashes"), Some(1), "{s}");
    assert_ne!(site.workers(), parent);
    assert_eq!(get(site.nginx.ports[0], "/hello.php").0, 200);
}

/// Waits until none of `pids` is alive (gone, or a zombie about to be reaped).
fn all_gone(pids: &[u32]) -> Vec<u32> {
    let deadline = Instant::now() + WAIT;
    loop {
        let left: Vec<u32> = pids
            .iter()
            .copied()
            .filter(|&p| support::alive(p))
            .collect();
        if left.is_empty() || Instant::now() >= deadline {
            return left;
        }
        thread::sleep(POLL);
    }
}

/// corral SIGKILLed: each php-cgi parent's parent-death signal (SIGTERM) makes it send
/// SIGTERM to its children before it exits, so no php-cgi is left running.
#[test]
fn no_php_cgi_outlives_a_sigkilled_corral_direct_pool() {
    let site = site(2, 2, "");
    let parents = site.workers();
    let kids = grandchildren(&site);
    assert_eq!(kids.len(), 4, "{kids:?}");
    signal_corral(&site, Signal::SIGKILL);
    let all: Vec<u32> = parents.iter().chain(&kids).copied().collect();
    let left = all_gone(&all);
    for p in &left {
        let _ = kill(Pid::from_raw(*p as i32), Signal::SIGKILL);
    }
    assert!(left.is_empty(), "left running: {left:?} of {all:?}");
}

/// The same for a gateway pool with `php_children`.
#[test]
fn no_php_cgi_outlives_a_sigkilled_corral_gateway_pool() {
    let dir = support::peers::shared_dir();
    write_file(dir.path(), "pid.php", "<?php echo getmypid();");
    let text = format!(
        "[server]\nruntime_dir = \"{run}\"\n[[listen]]\naddress = \"127.0.0.1:0\"\n\
         protocol = \"http\"\n[pools.php]\ncommand = [\"php-cgi\", \"-n\"]\n{STATIC}\n\
         php_children = 3\n[[contexts]]\npool = \"php\"\nroot = \"{root}\"\n",
        run = dir.path().join("run").display(),
        root = dir.path().display()
    );
    let corral = support::server::Corral::start(&text, 1);
    let r = support::server::http(corral.http_addr(), "GET", "/pid.php", &[], b"");
    assert_eq!(r.status, 200, "{}", r.text());
    let parents = children_of(corral.pid());
    assert_eq!(parents.len(), 1, "{parents:?}");
    let mut kids = Vec::new();
    assert!(
        support::eventually(WAIT, || {
            kids = children_of(parents[0]);
            kids.len() == 3
        }),
        "{kids:?}"
    );
    kill(Pid::from_raw(corral.pid() as i32), Signal::SIGKILL).unwrap();
    let all: Vec<u32> = parents.iter().chain(&kids).copied().collect();
    let left = all_gone(&all);
    for p in &left {
        let _ = kill(Pid::from_raw(*p as i32), Signal::SIGKILL);
    }
    assert!(left.is_empty(), "left running: {left:?} of {all:?}");
}
