//! `php_children = N` with real php-cgi: each worker is one php-cgi parent forking N
//! children that share its OPcache (ARCHITECTURE.md, "Shared OPcache"). A script one child
//! compiled is cached for another; status lists the children; one request at a time goes
//! to each child in turn, each keeping one of corral's connections; `max_requests`
//! replaces the group under load with no failed request; a killed child is replaced by its
//! parent; `max_memory` acts on the largest child; corral's serving threads run under
//! SCHED_BATCH while every php-cgi process keeps the default policy. The memory comparison on WordPress
//! pages is in tests/app_wordpress.rs.

mod support;

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::thread;
use std::time::Duration;

use support::server::{http, Corral};
use support::{alive, eventually, live_children, peers, thread_policies};

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

/// The one php-cgi process corral spawned (the parent).
fn parent(corral: &Corral) -> u32 {
    let mut parents = Vec::new();
    assert!(
        eventually(Duration::from_secs(10), || {
            parents = live_children(corral.pid());
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

/// php-fpm's `idle processes`, `active processes` and `total processes` on the status page.
fn process_counts(site: &Site) -> [u64; 3] {
    let status = site.corral.status_ready_addr();
    let text = http(status, "GET", "/status", &[], b"").text();
    ["idle processes", "active processes", "total processes"].map(|name| {
        text.lines()
            .find_map(|l| {
                let (k, v) = l.split_once(':')?;
                (k.trim() == name).then(|| v.trim().parse().ok())?
            })
            .unwrap_or_else(|| panic!("no {name} in:\n{text}"))
    })
}

#[test]
fn a_script_one_child_compiled_is_cached_for_another_and_status_lists_the_children() {
    let shared = site("mode = \"static\"\nmax = 1\nphp_children = 3");
    let parent = parent(&shared.corral);
    let mut kids = Vec::new();
    assert!(
        eventually(Duration::from_secs(5), || {
            kids = live_children(parent);
            kids.len() == 3
        }),
        "{kids:?}\n{}",
        shared.corral.log()
    );
    assert_eq!(status_children(&shared), kids);
    // php-fpm's fields count the children, as php-fpm counts its own: 3 idle, then 1 of 3
    // busy while hold.php runs.
    assert_eq!(process_counts(&shared), [3, 0, 3]);
    // hold.php is compiled by the child that runs it; cached.php, sent meanwhile, runs in
    // another child, whose OPcache already lists hold.php.
    let (holder, (counts, (other, scripts))) =
        while_held(&shared, || (process_counts(&shared), cached(&shared)));
    assert_eq!(
        counts,
        [2, 1, 3],
        "idle, active, total while one child holds"
    );
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
fn one_request_at_a_time_goes_to_each_child_in_turn_over_one_kept_connection_each() {
    let site = site("mode = \"static\"\nmax = 1\nphp_children = 3");
    let addr = site.corral.http_addr();
    let parent = parent(&site.corral);
    let pids: Vec<String> = (0..21)
        .map(|_| {
            let r = http(addr, "GET", "/pid.php", &[], b"");
            assert_eq!(r.status, 200, "{}", site.corral.log());
            r.text()
        })
        .collect();
    // As behind php-fpm, whose idle children take turns from accept, the one waiting
    // longest first: here each child holds a kept connection of corral's, and the
    // connections are taken in turn (decision 46). Newest first, one child ran all 21.
    let turn: BTreeSet<&String> = pids.iter().take(3).collect();
    assert_eq!(turn.len(), 3, "{pids:?}");
    for (i, pid) in pids.iter().enumerate() {
        assert_eq!(pid, &pids[i % 3], "request {i} out of turn: {pids:?}");
    }
    let kids = live_children(parent);
    for pid in turn {
        let child: u32 = pid.parse().unwrap();
        assert!(kids.contains(&child), "{child} is not one of {kids:?}");
        // Idle, each child still holds its one connection: a socket besides its fd 0.
        let sockets = std::fs::read_dir(format!("/proc/{child}/fd"))
            .unwrap()
            .flatten()
            .filter(|e| e.file_name() != "0")
            .filter(|e| {
                std::fs::read_link(e.path())
                    .is_ok_and(|t| t.to_string_lossy().starts_with("socket:"))
            })
            .count();
        assert_eq!(sockets, 1, "child {child} holds no kept connection");
    }
}

#[test]
fn the_group_is_replaced_after_max_requests_per_child_under_load_without_a_failed_request() {
    // 5 per child, 2 children: corral replaces the group after 10 requests, new group
    // first. The children never exit on their own, so no kept connection closes under a
    // request: a POST (which may not be sent twice) never fails, nor is anything resent.
    let site = site(
        "mode = \"static\"\nmax = 1\nphp_children = 2\nmax_requests = 5\nmax_requests_jitter = 0",
    );
    peers::write_file(
        site.dir.path(),
        "family.php",
        "<?php echo getmypid(), ' ', posix_getppid(), ' ', strlen(file_get_contents('php://input'));",
    );
    let addr = site.corral.http_addr();
    let first = parent(&site.corral);
    // Four clients until the first group is gone and a while after (the supervisor
    // counts requests on its 100 ms tick, so the group serves on past its budget until
    // then, and until its replacement is ready).
    let corral_pid = site.corral.pid();
    let answers: Vec<(u16, String)> = thread::scope(|s| {
        let threads: Vec<_> = (0..4)
            .map(|t| {
                s.spawn(move || {
                    let mut out = Vec::new();
                    let mut after = 0;
                    for i in 0..3000 {
                        let r = if (t + i) % 2 == 0 {
                            http(addr, "POST", "/family.php", &[], b"0123456789")
                        } else {
                            http(addr, "GET", "/family.php", &[], b"")
                        };
                        out.push((r.status, r.text()));
                        if i % 10 == 0 && !live_children(corral_pid).contains(&first) {
                            after += 1;
                        }
                        if after > 5 {
                            break;
                        }
                    }
                    out
                })
            })
            .collect();
        threads
            .into_iter()
            .flat_map(|t| t.join().unwrap())
            .collect()
    });
    let log = site.corral.log();
    let failed: Vec<_> = answers.iter().filter(|(s, _)| *s != 200).collect();
    assert!(failed.is_empty(), "{failed:?}\n{log}");
    assert!(!log.contains("kept connection lost"), "{log}");
    // Children per parent: each group kept the two it forked.
    let mut groups = BTreeMap::<String, BTreeSet<String>>::new();
    for (_, text) in &answers {
        let mut f = text.split(' ');
        let (child, parent) = (f.next().unwrap_or_default(), f.next().unwrap_or_default());
        let body: usize = f.next().and_then(|b| b.parse().ok()).unwrap_or(usize::MAX);
        assert!(body == 0 || body == 10, "{text}");
        groups
            .entry(parent.to_owned())
            .or_default()
            .insert(child.to_owned());
    }
    assert!(
        groups.len() >= 2,
        "the group was never replaced: {groups:?}\n{log}"
    );
    assert!(groups.values().all(|c| c.len() <= 2), "{groups:?}");
    assert!(log.contains("reached max_requests"), "{log}");
    let one_parent = || live_children(corral_pid).len() == 1;
    assert!(eventually(Duration::from_secs(10), one_parent));
}

#[test]
fn a_killed_child_is_replaced_by_its_parent_and_no_request_fails_after() {
    let site = site("mode = \"static\"\nmax = 1\nphp_children = 2");
    let addr = site.corral.http_addr();
    let parent = parent(&site.corral);
    // Both children serve; the one that held a request is killed once idle.
    let (holder, other) = while_held(&site, || http(addr, "GET", "/pid.php", &[], b""));
    assert_ne!(holder, other.text());
    let before = live_children(parent);
    let victim: u32 = holder.parse().unwrap();
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(victim as i32),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    assert!(
        eventually(Duration::from_secs(5), || {
            let now = live_children(parent);
            now.len() == 2 && !now.contains(&victim)
        }),
        "the parent did not fork a replacement: {before:?} -> {:?}",
        live_children(parent)
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
        live_children(site.corral.pid()),
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
        !live_children(site.corral.pid()).contains(&first)
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

#[test]
fn a_request_past_request_timeout_retires_the_group_and_its_other_child_finishes() {
    let site = site("mode = \"static\"\nmax = 1\nphp_children = 2\nrequest_timeout = \"2s\"");
    peers::write_file(
        site.dir.path(),
        "sleep.php",
        "<?php usleep((int) $_GET['ms'] * 1000); echo getmypid();",
    );
    let addr = site.corral.http_addr();
    let first = parent(&site.corral);
    let (stuck, other) = thread::scope(|s| {
        let stuck = s.spawn(|| http(addr, "GET", "/sleep.php?ms=6000", &[], b""));
        thread::sleep(Duration::from_millis(1200));
        // On the other child from 1.2 s to 2.7 s: across the first one's timeout (at 2 s),
        // within its own.
        let other = s.spawn(|| http(addr, "GET", "/sleep.php?ms=1500", &[], b""));
        (stuck.join().unwrap(), other.join().unwrap())
    });
    let log = site.corral.log();
    assert_eq!(stuck.status, 504, "{log}");
    // A kill of the group would have taken this request with it (a 502).
    assert_eq!(other.status, 200, "{log}");
    assert!(log.contains("exceeded request_timeout"), "{log}");
    // The group is replaced, and the next requests are served by the new one.
    assert!(
        eventually(Duration::from_secs(10), || {
            let now = live_children(site.corral.pid());
            now.len() == 1 && !now.contains(&first)
        }),
        "{}",
        site.corral.log()
    );
    for _ in 0..3 {
        let r = http(addr, "GET", "/pid.php", &[], b"");
        assert_eq!(r.status, 200, "{}", site.corral.log());
    }
}

/// Where the workers are local, corral's serving threads run under `SCHED_BATCH` by default
/// (`[server] sched_batch`, decision 45), and the php-cgi parent and the children it forks
/// keep Linux's default policy: they are forked on the control runtime's thread, which keeps
/// the policy corral started with. Read from /proc after requests on both children.
#[test]
fn serving_threads_are_batch_and_every_php_process_keeps_the_default_policy() {
    let site = site("php_children = 2");
    let _ = cached(&site);
    let corral = thread_policies(site.corral.pid());
    let serving: Vec<_> = corral
        .iter()
        .filter(|(name, _)| name.starts_with("corral-serve-"))
        .collect();
    assert!(!serving.is_empty(), "{corral:?}");
    for (name, policy) in &serving {
        assert_eq!(*policy, 3, "{name} is not SCHED_BATCH: {corral:?}");
    }
    let main = corral.iter().find(|(name, _)| name == "corral");
    assert!(
        main.is_some_and(|(_, p)| *p == 0),
        "the main thread keeps the default: {corral:?}"
    );
    let parent = parent(&site.corral);
    let mut php = Vec::new();
    assert!(
        eventually(Duration::from_secs(10), || {
            php = live_children(parent);
            php.len() == 2
        }),
        "{php:?}"
    );
    php.push(parent);
    for pid in php {
        let threads = thread_policies(pid);
        assert!(!threads.is_empty(), "php-cgi {pid} is gone");
        for (name, policy) in threads {
            assert_eq!(policy, 0, "php-cgi {pid} ({name}) left the default policy");
        }
    }
}
