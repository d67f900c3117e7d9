//! `corral restart-workers` on idle native pools, over and over: every old process (the
//! fork template and its workers, or the spawned workers) must be gone long before
//! `kill_timeout` (30 s here), that is, each worker ended on corral's SIGTERM and was not
//! killed. The real corral, corral-php-worker (spawned and preloaded) and corral-wsgi-worker
//! (preloaded) with real PHP and Python.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing,
    missing_docs
)]
// Wall-clock waits of real processes: there is no tokio clock to take here.
#![allow(clippy::disallowed_types)]

mod support;

use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, Instant};

use support::native::{worker, wsgi_worker};
use support::server::{http, Corral};

const ROUNDS: usize = 5;
/// Far under the 30 s kill_timeout, far over what an idle stop and a new worker's start
/// take even on a loaded machine.
const WITHIN: Duration = Duration::from_secs(10);

/// The pids (with their start times) of the processes running `exe` under `root`.
fn processes(root: u32, exe: &Path) -> BTreeMap<u32, String> {
    let mut found = BTreeMap::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|p| p.parse::<u32>().ok())
        else {
            continue;
        };
        if std::fs::read_link(format!("/proc/{pid}/exe"))
            .ok()
            .as_deref()
            != Some(exe)
        {
            continue;
        }
        let (Some(start), true) = (start_time(pid), descends(pid, root)) else {
            continue;
        };
        found.insert(pid, start);
    }
    found
}

/// Field 22 of /proc/PID/stat (after the parenthesised name), unless a zombie.
fn start_time(pid: u32) -> Option<String> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let fields: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
    (fields.first() != Some(&"Z")).then(|| fields.get(19).map(|s| s.to_string()))?
}

fn parent(pid: u32) -> Option<u32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat.rsplit_once(')')?
        .1
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()
}

/// Whether `pid` is `root`'s child or grandchild.
fn descends(pid: u32, root: u32) -> bool {
    let up = parent(pid);
    up == Some(root) || up.and_then(parent) == Some(root)
}

/// What is known of `pid`, an old process still running: its state and signal masks, and
/// those of each of its threads (is a SIGTERM pending, blocked, caught?), where it waits
/// (wchan, the system call and its arguments, the kernel stack), and corral's log lines
/// that name it. Printed when the test fails, to tell a signal never sent from one lost.
fn describe(pid: u32, log: &str) -> String {
    let read = |path: String| {
        std::fs::read_to_string(&path)
            .unwrap_or_else(|e| format!("({path}: {e})"))
            .trim_end()
            .to_owned()
    };
    let mut out = format!("\n=== old process {pid} still runs ===\n");
    out += &format!(
        "cmdline: {}\n",
        read(format!("/proc/{pid}/cmdline")).replace('\0', " ")
    );
    let tasks: Vec<String> = std::fs::read_dir(format!("/proc/{pid}/task"))
        .map(|d| {
            d.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    for tid in tasks {
        let dir = format!("/proc/{pid}/task/{tid}");
        out += &format!("-- thread {tid}\n");
        for line in read(format!("{dir}/status")).lines() {
            let keep = ["Name", "State", "PPid", "Sig", "Shd", "Threads"];
            if keep.iter().any(|k| line.starts_with(k)) {
                out += &format!("  {line}\n");
            }
        }
        out += &format!("  wchan: {}\n", read(format!("{dir}/wchan")));
        out += &format!("  syscall: {}\n", read(format!("{dir}/syscall")));
        for line in read(format!("{dir}/stack")).lines() {
            out += &format!("  stack: {line}\n");
        }
    }
    out += &format!("fds: {}\n", fds(pid));
    out += &format!("corral's lines naming {pid} or its key:\n");
    let mut words = vec![format!("pid={pid}"), format!("worker={pid}")];
    // Its key ("worker 7"), from a line with both, names it in the notices.
    let key = log
        .lines()
        .filter(|l| l.contains(&words[0]))
        .find_map(|l| Some(l.split_once("key=")?.1.split_once(" pid=")?.0.to_owned()));
    if let Some(key) = key {
        words.extend([format!("key={key} "), format!(" {key} is ")]);
    }
    for line in log
        .lines()
        .filter(|l| words.iter().any(|w| l.contains(w.as_str())))
    {
        out += &format!("  {line}\n");
    }
    out
}

/// `pid`'s descriptors and what each is (`0=socket:[123]`).
fn fds(pid: u32) -> String {
    let Ok(dir) = std::fs::read_dir(format!("/proc/{pid}/fd")) else {
        return "(unreadable)".to_owned();
    };
    let mut fds: Vec<(u32, String)> = dir
        .flatten()
        .filter_map(|e| {
            let n = e.file_name().to_str()?.parse().ok()?;
            let to = std::fs::read_link(e.path()).ok()?;
            Some((n, to.display().to_string()))
        })
        .collect();
    fds.sort();
    fds.iter().map(|(n, to)| format!("{n}={to} ")).collect()
}

/// Restarts the workers ROUNDS times, each time while they are idle, and waits for every
/// old process to be gone.
fn restarts_promptly(c: &Corral, exe: &Path, target: &str, answer: &str) {
    for round in 0..ROUNDS {
        let r = http(c.http_addr(), "GET", target, &[], b"");
        assert_eq!((r.status, r.text().as_str()), (200, answer), "{}", c.log());
        // Idle: the workers are back in their waits.
        std::thread::sleep(Duration::from_millis(300));
        let old = processes(c.pid(), exe);
        assert!(
            !old.is_empty(),
            "round {round}: no worker found\n{}",
            c.log()
        );
        let at = Instant::now();
        let out = support::corral(&["restart-workers", "-c", c.config_path().to_str().unwrap()]);
        assert_eq!(out.code, Some(0), "{out:?}");
        loop {
            let left: Vec<u32> = old
                .iter()
                .filter(|(&pid, start)| start_time(pid).as_ref() == Some(*start))
                .map(|(&pid, _)| pid)
                .collect();
            if left.is_empty() {
                break;
            }
            if at.elapsed() >= WITHIN {
                let log = c.log();
                let found: String = left.iter().map(|&pid| describe(pid, &log)).collect();
                panic!("round {round}: an old worker still runs after {WITHIN:?}\n{found}\n{log}");
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }
    let r = http(c.http_addr(), "GET", target, &[], b"");
    assert_eq!((r.status, r.text().as_str()), (200, answer), "{}", c.log());
}

/// corral with one native pool `p` (`pool`: its own lines) and one context (`context`).
fn config(dir: &Path, pool: &str, context: &str) -> String {
    format!(
        r#"
[server]
runtime_dir = "{run}"
kill_timeout = "30s"
# What the driver did with each worker (asked to stop, signal sent), for a failure's report.
log_level = "debug"

[[listen]]
address = "127.0.0.1:0"
protocol = "http"

[pools.p]
worker = "native"
mode = "static"
min = 2
max = 2
{pool}

[[contexts]]
pool = "p"
{context}
"#,
        run = dir.join("run").display(),
    )
}

#[test]
fn idle_native_php_workers_stop_at_once_on_every_restart() {
    let exe = worker();
    for preload in [false, true] {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("www")).unwrap();
        std::fs::write(dir.path().join("www/index.php"), "<?php echo 'hi';").unwrap();
        let pool = format!("worker_path = \"{}\"\npreload = {preload}", exe.display());
        let root = format!("root = \"{}\"", dir.path().join("www").display());
        let c = Corral::start(&config(dir.path(), &pool, &root), 1);
        restarts_promptly(&c, &exe, "/index.php", "hi");
    }
}

#[test]
fn idle_native_wsgi_workers_stop_at_once_on_every_restart() {
    let exe = wsgi_worker();
    let dir = tempfile::tempdir().unwrap();
    let app = dir.path().join("app");
    std::fs::create_dir_all(&app).unwrap();
    std::fs::write(
        app.join("hello.py"),
        "def application(environ, start_response):\n    \
         start_response('200 OK', [('Content-Type', 'text/plain')])\n    \
         return [b'hello']\n",
    )
    .unwrap();
    let pool = format!(
        "app = \"wsgi:hello:application\"\nworker_path = \"{}\"\npython = \"/usr/bin/python3\"\n\
         cwd = \"{}\"\npreload = true",
        exe.display(),
        app.display()
    );
    let c = Corral::start(&config(dir.path(), &pool, "prefix = \"/\""), 1);
    restarts_promptly(&c, &exe, "/", "hello");
}
