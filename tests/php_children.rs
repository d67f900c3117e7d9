//! `php_children = N` with real php-cgi: each worker is one php-cgi parent forking N
//! children that share its OPcache (ARCHITECTURE.md, "Shared OPcache"). A script one child
//! compiled is cached for another; status lists the children; `max_requests` recycles
//! children under load with no failed request; a killed child is replaced by its parent;
//! `max_memory` acts on the largest child. The memory comparison on WordPress pages is in
//! tests/app_wordpress.rs.

mod support;

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::thread;
use std::time::Duration;

use support::server::{http, Corral};
use support::{alive, eventually, peers};

/// A config with an http listener, a status listener and one php-cgi pool set up by `pool`.
fn config(run: &Path, root: &Path, pool: &str) -> String {
    format!(
        r#"
[server]
runtime_dir = "{run}"
grace = "5s"
kill_timeout = "2s"
log_level = "debug"

[[listen]]
address = "127.0.0.1:0"
protocol = "http"

[status]
address = "127.0.0.1:0"

[pools.php]
command = ["php-cgi", "-d", "opcache.file_update_protection=0"]
{pool}

[[contexts]]
pool = "php"
root = "{root}"
"#,
        run = run.display(),
        root = root.display()
    )
}

/// A corral serving the test scripts from a pool set up by `pool`. Stopped gracefully when
/// dropped (see [`Stopped`]).
struct Site {
    dir: tempfile::TempDir,
    corral: Corral,
}

fn site(pool: &str) -> Site {
    let dir = peers::shared_dir();
    peers::write_file(dir.path(), "pid.php", "<?php echo getmypid();");
    // Says it holds its process (the marker file `held`), then holds it until the test
    // creates `gate`, so that a concurrent request goes to another one.
    peers::write_file(
        dir.path(),
        "hold.php",
        "<?php file_put_contents(__DIR__ . '/held', getmypid()); \
         for ($i = 0; $i < 3000 && !file_exists(__DIR__ . '/gate'); $i++) { usleep(10000); } \
         echo getmypid();",
    );
    // Which scripts this process's OPcache holds, by base name.
    peers::write_file(
        dir.path(),
        "cached.php",
        "<?php $s = opcache_get_status(true); echo getmypid(), \"\\n\"; \
         foreach (array_keys($s['scripts'] ?? []) as $f) echo basename($f), \"\\n\";",
    );
    let corral = Corral::start(&config(&dir.path().join("run"), dir.path(), pool), 1);
    Site { dir, corral }
}

impl Drop for Site {
    /// A graceful stop: corral sends SIGTERM to each php-cgi parent, which passes it to its
    /// children. (A SIGKILL of corral takes them down too, through the parent's SIGTERM
    /// parent-death signal: tests/direct_children.rs checks it.)
    fn drop(&mut self) {
        self.corral.signal(nix::sys::signal::Signal::SIGTERM);
        let gone = eventually(Duration::from_secs(10), || !alive(self.corral.pid()));
        assert!(gone || thread::panicking(), "corral did not stop");
    }
}

/// Pids of the live processes whose parent is `parent`.
fn children(parent: u32) -> Vec<u32> {
    corral::process::php_children::children_of(parent)
        .into_iter()
        .filter(|&p| alive(p))
        .collect()
}

/// The one php-cgi process corral spawned (the parent).
fn parent(corral: &Corral) -> u32 {
    let mut parents = Vec::new();
    assert!(
        eventually(Duration::from_secs(10), || {
            parents = children(corral.pid());
            parents.len() == 1
        }),
        "{parents:?}\n{}",
        corral.log()
    );
    parents[0]
}

/// Runs `hold.php` on one process until `then` has run; returns the holder's pid and what
/// `then` returned.
fn while_held<T: Send>(site: &Site, then: impl FnOnce() -> T + Send) -> (String, T) {
    let addr = site.corral.http_addr();
    let held = site.dir.path().join("held");
    let gate = site.dir.path().join("gate");
    let _ = std::fs::remove_file(&held);
    let _ = std::fs::remove_file(&gate);
    thread::scope(|s| {
        let holder = s.spawn(move || http(addr, "GET", "/hold.php", &[], b""));
        assert!(eventually(Duration::from_secs(10), || held.exists()));
        let out = then();
        std::fs::write(&gate, "").unwrap();
        let r = holder.join().unwrap();
        assert_eq!(r.status, 200, "{}", site.corral.log());
        (r.text(), out)
    })
}

/// `cached.php`'s answer: the pid that ran it and the scripts in its OPcache.
fn cached(site: &Site) -> (String, BTreeSet<String>) {
    let r = http(site.corral.http_addr(), "GET", "/cached.php", &[], b"");
    assert_eq!(r.status, 200, "{}", site.corral.log());
    let text = r.text();
    let mut lines = text.lines();
    let pid = lines.next().unwrap_or_default().to_owned();
    (pid, lines.map(str::to_owned).collect())
}

/// The `children:` line of the status page's first worker, as pids.
fn status_children(site: &Site) -> Vec<u32> {
    let status = site.corral.status_ready_addr();
    let r = http(status, "GET", "/status?full", &[], b"");
    assert_eq!(r.status, 200, "{}", r.text());
    let text = r.text();
    let line = text
        .lines()
        .find(|l| l.starts_with("children:"))
        .unwrap_or_else(|| panic!("no children line in:\n{text}"));
    line.trim_start_matches("children:")
        .split_whitespace()
        .filter_map(|p| p.parse().ok())
        .collect()
}

#[test]
fn a_script_one_child_compiled_is_cached_for_another_and_status_lists_the_children() {
    let shared = site("mode = \"static\"\nmax = 1\nphp_children = 3");
    let parent = parent(&shared.corral);
    let mut kids = Vec::new();
    assert!(
        eventually(Duration::from_secs(5), || {
            kids = children(parent);
            kids.len() == 3
        }),
        "{kids:?}\n{}",
        shared.corral.log()
    );
    assert_eq!(status_children(&shared), kids);
    // hold.php is compiled by the child that runs it; cached.php, sent meanwhile, runs in
    // another child, whose OPcache already lists hold.php.
    let (holder, (other, scripts)) = while_held(&shared, || cached(&shared));
    assert_ne!(holder, other, "the second request needs another child");
    for pid in [&holder, &other] {
        let pid: u32 = pid.parse().unwrap();
        assert!(kids.contains(&pid), "{pid} is not one of {kids:?}");
    }
    assert!(
        scripts.contains("hold.php"),
        "child {other} does not see child {holder}'s hold.php: {scripts:?}"
    );

    // The same two requests to separate workers: the second one's cache does not hold the
    // first one's script.
    let separate = site("mode = \"static\"\nmax = 3");
    let (holder, (other, scripts)) = while_held(&separate, || cached(&separate));
    assert_ne!(holder, other);
    assert!(
        !scripts.contains("hold.php"),
        "separate workers should not share: {scripts:?}"
    );
}

#[test]
fn children_are_recycled_after_max_requests_under_load_without_a_failed_request() {
    let site = site(
        "mode = \"static\"\nmax = 1\nphp_children = 2\nmax_requests = 5\nmax_requests_jitter = 0",
    );
    let addr = site.corral.http_addr();
    let parent = parent(&site.corral);
    let answers: Vec<(u16, String)> = thread::scope(|s| {
        let threads: Vec<_> = (0..4)
            .map(|_| {
                s.spawn(move || {
                    (0..40)
                        .map(|_| {
                            let r = http(addr, "GET", "/pid.php", &[], b"");
                            (r.status, r.text())
                        })
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        threads
            .into_iter()
            .flat_map(|t| t.join().unwrap())
            .collect()
    });
    let failed: Vec<_> = answers.iter().filter(|(s, _)| *s != 200).collect();
    assert!(failed.is_empty(), "{failed:?}\n{}", site.corral.log());
    let mut per_pid = BTreeMap::<&str, usize>::new();
    for (_, pid) in &answers {
        *per_pid.entry(pid.as_str()).or_default() += 1;
    }
    // 160 requests at 5 per child: at least 32 children, none over its budget.
    assert!(per_pid.len() >= 32, "{per_pid:?}");
    assert!(per_pid.values().all(|&n| n <= 5), "{per_pid:?}");
    // The parent forked them all: the group itself was never replaced.
    assert_eq!(children(site.corral.pid()), vec![parent]);
    assert!(eventually(Duration::from_secs(5), || children(parent)
        .len()
        == 2));
}

#[test]
fn a_killed_child_is_replaced_by_its_parent_and_no_request_fails_after() {
    let site = site("mode = \"static\"\nmax = 1\nphp_children = 2");
    let addr = site.corral.http_addr();
    let parent = parent(&site.corral);
    // Both children serve; the one that held a request is killed once idle.
    let (holder, other) = while_held(&site, || http(addr, "GET", "/pid.php", &[], b""));
    assert_ne!(holder, other.text());
    let before = children(parent);
    let victim: u32 = holder.parse().unwrap();
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(victim as i32),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    assert!(
        eventually(Duration::from_secs(5), || {
            let now = children(parent);
            now.len() == 2 && !now.contains(&victim)
        }),
        "the parent did not fork a replacement: {before:?} -> {:?}",
        children(parent)
    );
    for _ in 0..3 {
        let answers = thread::scope(|s| {
            let a = s.spawn(|| http(addr, "GET", "/pid.php", &[], b""));
            let b = s.spawn(|| http(addr, "GET", "/pid.php", &[], b""));
            [a.join().unwrap(), b.join().unwrap()]
        });
        for r in answers {
            assert_eq!(r.status, 200, "{}", site.corral.log());
            assert_ne!(r.text(), victim.to_string());
        }
    }
    assert_eq!(
        children(site.corral.pid()),
        vec![parent],
        "no group replaced"
    );
}

#[test]
fn max_memory_recycles_the_group_when_a_child_passes_it() {
    let site = site("mode = \"static\"\nmax = 1\nphp_children = 2\nmax_memory = \"48MiB\"");
    peers::write_file(
        site.dir.path(),
        "leak.php",
        &peers::leaking_php("children-leak", 20000, 20),
    );
    let addr = site.corral.http_addr();
    let first = parent(&site.corral);
    // Requests back to back until the group is replaced: each leaks into its child, and the
    // driver checks memory on its own schedule (after requests, and on its ticks).
    let mut n = 0;
    let replaced = support::eventually(Duration::from_secs(60), || {
        n += 1;
        let r = http(addr, "GET", &format!("/leak.php?n={n}"), &[], b"");
        assert_eq!(r.status, 200, "request {n}: {}", site.corral.log());
        !children(site.corral.pid()).contains(&first)
    });
    assert!(
        replaced,
        "never recycled after {n} requests:\n{}",
        site.corral.log()
    );
    assert!(site.corral.wait_log("exceeded max_memory"));
    let r = http(addr, "GET", "/pid.php", &[], b"");
    assert_eq!(r.status, 200, "{}", site.corral.log());
}
