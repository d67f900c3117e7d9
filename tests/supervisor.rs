//! Pools that corral spawns itself, with real php-cgi: recycling after `max_requests` with no
//! failed request, a worker killed mid-request, `request_timeout`, on-demand and dynamic
//! sizing, a graceful stop under load, and no interpreter left behind when corral is killed.

mod support;

use std::path::Path;
use std::thread;
use std::time::Duration;

use support::server::{http, Corral};
use support::sync1::{assert_backoff_doubles, children, gaps};
use support::{alive, eventually, peers};

/// A config with one http listener and one spawned php-cgi pool described by `pool`.
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

[pools.php]
command = ["php-cgi"]
{pool}

[[contexts]]
pool = "php"
root = "{root}"
"#,
        run = run.display(),
        root = root.display()
    )
}

fn site(dir: &Path) {
    peers::write_file(dir, "pid.php", "<?php echo getmypid();");
    peers::write_file(
        dir,
        "sleep.php",
        "<?php file_put_contents(__DIR__ . '/started', getmypid()); \
         if (isset($_GET['hold'])) { for ($i = 0; $i < 3000 && !file_exists(__DIR__ . '/go'); \
         $i++) { usleep(10000); clearstatcache(); } } \
         usleep((int)($_GET['ms'] ?? 100) * 1000); echo getmypid();",
    );
}

/// A temp dir with the test site and a corral serving it from a spawned php-cgi pool set up
/// by `pool`; `edit` may change the generated config (another command, say).
fn spawned(pool: &str, edit: impl FnOnce(String) -> String) -> (tempfile::TempDir, Corral) {
    let dir = peers::shared_dir();
    site(dir.path());
    let corral = Corral::start(&edit(config(&dir.path().join("run"), dir.path(), pool)), 1);
    (dir, corral)
}

/// The summed PSS of the process trees of `pids`.
fn pss_of(pids: &[u32]) -> u64 {
    pids.iter()
        .filter_map(|&p| corral::process::process_tree_pss(p).ok())
        .map(|m| m.bytes())
        .sum()
}

#[test]
fn workers_are_recycled_after_max_requests_without_a_failed_request() {
    let (_dir, corral) = spawned(
        "mode = \"static\"\nmin = 2\nmax = 2\nmax_requests = 5\nmax_requests_jitter = 0",
        |c| c,
    );
    let addr = corral.http_addr();
    let mut pids = std::collections::BTreeMap::<String, usize>::new();
    for _ in 0..40 {
        let r = http(addr, "GET", "/pid.php", &[], b"");
        assert_eq!(r.status, 200, "{}", corral.log());
        *pids.entry(r.text()).or_default() += 1;
    }
    // Every worker served at most its budget, so 40 requests needed at least 8 workers.
    assert!(pids.len() >= 8, "{pids:?}");
    assert!(pids.values().all(|&n| n <= 5), "{pids:?}");
    assert!(corral.wait_log("reached max_requests"));
    // Recycled workers are reaped: corral keeps its two (plus at most one replacement).
    assert!(eventually(Duration::from_secs(5), || children(
        corral.pid()
    )
    .len()
        <= 3));
}

#[test]
fn a_worker_killed_mid_request_fails_that_request_only_and_is_replaced() {
    let (dir, corral) = spawned("mode = \"static\"\nmin = 1\nmax = 1", |c| c);
    let addr = corral.http_addr();
    let pid: u32 = http(addr, "GET", "/pid.php", &[], b"")
        .text()
        .parse()
        .unwrap();
    let slow = thread::spawn(move || http(addr, "GET", "/sleep.php?hold&ms=0", &[], b""));
    // The script writes this file when it starts, so the kill lands mid-request.
    let started = dir.path().join("started");
    assert!(eventually(Duration::from_secs(5), || started.exists()));
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid as i32),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    let r = slow.join().unwrap();
    assert_eq!(r.status, 502, "{}", corral.log());
    // A replacement answers.
    let mut new_pid = None;
    assert!(eventually(Duration::from_secs(10), || {
        let r = http(addr, "GET", "/pid.php", &[], b"");
        if r.status == 200 {
            new_pid = Some(r.text());
        }
        r.status == 200
    }));
    assert_ne!(new_pid.unwrap(), pid.to_string());
    // corral saw the kill for what it was (by then the failed request is no longer
    // counted in flight: its failure came first and marked the worker broken).
    assert!(
        corral.wait_log("worker 0 killed by signal SIGKILL unexpectedly"),
        "{}",
        corral.log()
    );
}

#[test]
fn request_timeout_answers_504_and_replaces_the_worker() {
    let (_dir, corral) = spawned("mode = \"static\"\nmin = 1\nmax = 1\nrequest_timeout = \"500ms\"\nfirst_byte_timeout = \"500ms\"", |c| c);
    let addr = corral.http_addr();
    let before = http(addr, "GET", "/pid.php", &[], b"").text();
    let r = http(addr, "GET", "/sleep.php?hold&ms=0", &[], b"");
    assert_eq!(r.status, 504, "{}", corral.log());
    let mut after = String::new();
    assert!(
        eventually(Duration::from_secs(10), || {
            let r = http(addr, "GET", "/pid.php", &[], b"");
            after = r.text();
            r.status == 200 && after != before
        }),
        "{}",
        corral.log()
    );
    let old: u32 = before.parse().unwrap();
    assert!(eventually(Duration::from_secs(5), || !alive(old)));
}

#[test]
fn an_ondemand_pool_starts_on_the_first_request_and_goes_back_to_zero() {
    let dir = peers::shared_dir();
    site(dir.path());
    let notify = dir.path().join("notify.sock");
    let socket = std::os::unix::net::UnixDatagram::bind(&notify).unwrap();
    let notify = notify.display().to_string();
    let corral = Corral::start_after(
        &config(
            &dir.path().join("run"),
            dir.path(),
            "mode = \"ondemand\"\nmax = 2\nidle_timeout = \"1s\"",
        ),
        1,
        "",
        &[("NOTIFY_SOCKET", notify.as_str())],
    );
    // Ready (the pool has started, with its `min` of 0 workers), and none spawned.
    support::notify_until(&socket, "READY=1", Duration::from_secs(20));
    assert!(children(corral.pid()).is_empty(), "{}", corral.log());
    let r = http(corral.http_addr(), "GET", "/pid.php", &[], b"");
    assert_eq!(r.status, 200, "{}", corral.log());
    assert!(!children(corral.pid()).is_empty());
    assert!(
        eventually(Duration::from_secs(5), || children(corral.pid()).is_empty()),
        "{}",
        corral.log()
    );
}

#[test]
fn a_dynamic_pool_grows_under_load_and_shrinks_to_min_when_idle() {
    let (_dir, corral) = spawned(
        "mode = \"dynamic\"\nmin = 1\nmax = 4\nspare_min = 1\nspare_max = 1\nidle_timeout = \"1s\"",
        |c| c,
    );
    let addr = corral.http_addr();
    let load: Vec<_> = (0..8)
        .map(|_| thread::spawn(move || http(addr, "GET", "/sleep.php?ms=400", &[], b"").status))
        .collect();
    // Sampled until the last of the 8 requests (400 ms each, against one worker) is done.
    let mut most = 0;
    let mut peak_pss = 0;
    let done = eventually(Duration::from_secs(20), || {
        let workers = children(corral.pid());
        most = most.max(workers.len());
        peak_pss = peak_pss.max(pss_of(&workers));
        load.iter().all(thread::JoinHandle::is_finished)
    });
    assert!(done, "the load did not finish\n{}", corral.log());
    assert!(load.into_iter().all(|h| h.join().unwrap() == 200));
    assert!(most >= 2, "the pool never grew: {most}\n{}", corral.log());
    assert!(
        eventually(Duration::from_secs(6), || children(corral.pid()).len() == 1),
        "{:?}\n{}",
        children(corral.pid()),
        corral.log()
    );
    // The memory went with the workers.
    let rest_pss = pss_of(&children(corral.pid()));
    assert!(
        rest_pss < peak_pss,
        "PSS {rest_pss} at rest, {peak_pss} at peak"
    );
}

#[test]
fn sigterm_under_load_completes_every_accepted_request() {
    let (dir, corral) = spawned("mode = \"static\"\nmin = 2\nmax = 2", |c| {
        c.replace(
            "[[listen]]",
            "[status]\naddress = \"127.0.0.1:0\"\n\n[[listen]]",
        )
    });
    let addr = corral.http_addr();
    let status = corral.status_ready_addr();
    // Each holds its worker until the test writes `go`.
    let load: Vec<_> = (0..6)
        .map(|_| thread::spawn(move || http(addr, "GET", "/sleep.php?hold&ms=0", &[], b"").status))
        .collect();
    // All six are corral's: two in flight on the two workers, four in the queue.
    let counter = |name| support::server::pool_counter(status, "php", name);
    assert!(
        eventually(Duration::from_secs(10), || counter("in flight")
            + counter("listen queue")
            == 6),
        "{}",
        corral.log()
    );
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(corral.pid() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    // The stop has begun with all six still in flight or queued; then they may finish.
    assert!(
        corral.wait_log("stopping: no longer accepting"),
        "{}",
        corral.log()
    );
    std::fs::write(dir.path().join("go"), "").unwrap();
    let statuses: Vec<u16> = load.into_iter().map(|h| h.join().unwrap()).collect();
    assert!(
        statuses.iter().all(|&s| s == 200),
        "{statuses:?}\n{}",
        corral.log()
    );
    assert!(
        corral.wait_log("pool stopped: every worker reaped"),
        "{}",
        corral.log()
    );
}

#[test]
fn kill_9_of_corral_leaves_no_interpreter_behind() {
    let (_dir, corral) = spawned("mode = \"static\"\nmin = 3\nmax = 3", |c| c);
    assert!(eventually(Duration::from_secs(5), || children(
        corral.pid()
    )
    .len()
        == 3));
    let workers = children(corral.pid());
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(corral.pid() as i32),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    assert!(
        eventually(Duration::from_secs(2), || workers
            .iter()
            .all(|&p| !alive(p))),
        "still alive: {:?}",
        workers.iter().filter(|&&p| alive(p)).collect::<Vec<_>>()
    );
}

/// Each request compiles a new 1 MB script that OPcache keeps in its shared memory for the
/// life of the process: php-cgi's memory grows request after request, as a leaking app's
/// would (`peers::leaking_php`).
#[test]
fn a_leaking_worker_is_recycled_by_max_memory_while_requests_succeed() {
    let dir = peers::shared_dir();
    peers::write_file(
        dir.path(),
        "leak.php",
        &peers::leaking_php("leak", 20000, 20),
    );
    // OPcache skips files younger than file_update_protection (2 s): turn that off so
    // every fresh script stays cached.
    let corral = Corral::start(
        &config(
            &dir.path().join("run"),
            dir.path(),
            "mode = \"static\"\nmin = 1\nmax = 1\nmax_memory = \"48MiB\"",
        )
        .replace(
            r#"command = ["php-cgi"]"#,
            r#"command = ["php-cgi", "-d", "opcache.file_update_protection=0"]"#,
        ),
        1,
    );
    let addr = corral.http_addr();
    let mut pids = std::collections::BTreeSet::new();
    // Back to back until another worker answers (each request grows the first by 1 MB).
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    let mut n = 0;
    while pids.len() < 2 && tokio::time::Instant::now() < deadline {
        let r = http(addr, "GET", &format!("/leak.php?n={n}"), &[], b"");
        assert_eq!(r.status, 200, "request {n}: {}", corral.log());
        pids.insert(r.text());
        n += 1;
    }
    assert!(pids.len() > 1, "never recycled: {pids:?}\n{}", corral.log());
    assert!(corral.wait_log("exceeded max_memory"), "{}", corral.log());
}

#[test]
fn lsphp_workers_are_spawned_on_their_socket_and_serve() {
    let (_dir, corral) = spawned(
        "protocol = \"lsapi\"\nmode = \"static\"\nmin = 1\nmax = 1",
        |c| {
            c.replace(
                r#"command = ["php-cgi"]"#,
                &format!(r#"command = ["{}", "-n"]"#, peers::LSPHP),
            )
        },
    );
    let addr = corral.http_addr();
    let mut pids = std::collections::BTreeSet::new();
    for _ in 0..10 {
        let r = http(addr, "GET", "/pid.php", &[], b"");
        assert_eq!(r.status, 200, "{}", corral.log());
        pids.insert(r.text());
    }
    // Persistent connections: the same lsphp process serves request after request.
    assert_eq!(pids.len(), 1, "{pids:?}");
}

#[test]
fn a_crashing_command_is_throttled_not_hot_looped() {
    let (_dir, corral) = spawned(
        "mode = \"static\"\nmin = 1\nmax = 1\nqueue_timeout = \"200ms\"",
        |c| {
            c.replace(
                r#"command = ["php-cgi"]"#,
                r#"command = ["sh", "-c", "exit 3"]"#,
            )
        },
    );
    assert!(corral.wait_log("spawns are throttled"), "{}", corral.log());
    // Requests meanwhile get a clear 503, not a hang.
    let r = http(corral.http_addr(), "GET", "/pid.php", &[], b"");
    assert_eq!(r.status, 503);
    // Six crashes: the five gaps from a crash to the next spawn are the backoff, doubling
    // from 100 ms (100, 200, 400, 800, 1600 ms; a gap may only be longer, by up to the
    // periodic check's step, or by a loaded machine).
    assert!(
        corral.wait_count("exited with code 3", 6, Duration::from_secs(20)),
        "{}",
        corral.log()
    );
    let log = corral.log();
    let pairs: Vec<(String, String)> = (0..5)
        .map(|n| {
            (
                format!("worker {n} exited with code 3"),
                format!("worker started pool=php key=worker {}", n + 1),
            )
        })
        .collect();
    assert_backoff_doubles(&gaps(&log, &pairs), 0.1, &log);
    // Not thousands of spawns either: one per crash, none between.
    let spawns = corral.count_log("worker started pool=php key=");
    let crashes = corral.count_log("exited with code 3");
    assert!(
        spawns <= crashes + 1,
        "{spawns} spawns for {crashes} crashes"
    );
}

#[test]
fn sigint_stops_at_once_and_takes_the_workers_along() {
    let (dir, corral) = spawned("mode = \"static\"\nmin = 2\nmax = 2", |c| {
        c.replace(r#"grace = "5s""#, r#"grace = "30s""#)
    });
    let addr = corral.http_addr();
    let slow = thread::spawn(move || http(addr, "GET", "/sleep.php?hold&ms=0", &[], b"").status);
    let started = dir.path().join("started");
    assert!(eventually(Duration::from_secs(5), || started.exists()));
    let workers = children(corral.pid());
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(corral.pid() as i32),
        nix::sys::signal::Signal::SIGINT,
    )
    .unwrap();
    // Well before the 30 s grace and the end of the held request: the fast stop does not
    // wait.
    assert!(
        corral.wait_log("pool stopped: every worker reaped"),
        "{}",
        corral.log()
    );
    assert!(eventually(Duration::from_secs(3), || workers
        .iter()
        .all(|&p| !alive(p))));
    drop(slow);
}

#[test]
fn sigusr2_under_load_replaces_every_worker_without_a_failed_request() {
    let (_dir, corral) = spawned("mode = \"static\"\nmin = 3\nmax = 3", |c| c);
    let addr = corral.http_addr();
    assert!(eventually(Duration::from_secs(10), || children(
        corral.pid()
    )
    .len()
        == 3));
    let before: std::collections::BTreeSet<u32> = children(corral.pid()).into_iter().collect();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let served = std::sync::Arc::new(std::sync::atomic::AtomicU32::new(0));
    let load: Vec<_> = (0..4)
        .map(|_| {
            let stop = std::sync::Arc::clone(&stop);
            let served = std::sync::Arc::clone(&served);
            thread::spawn(move || {
                let (mut ok, mut failed) = (0u32, Vec::new());
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    let r = http(addr, "GET", "/sleep.php?ms=10", &[], b"");
                    if r.status == 200 {
                        ok += 1;
                        served.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    } else {
                        failed.push(r.status);
                    }
                }
                (ok, failed)
            })
        })
        .collect();
    let served_now = || served.load(std::sync::atomic::Ordering::Relaxed);
    // The load runs before the signal, and goes on after the last worker was replaced.
    assert!(
        eventually(Duration::from_secs(10), || served_now() >= 20),
        "{}",
        corral.log()
    );
    let at_signal = served_now();
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(corral.pid() as i32),
        nix::sys::signal::Signal::SIGUSR2,
    )
    .unwrap();
    // Every worker is replaced, while the load goes on.
    let replaced = eventually(Duration::from_secs(20), || {
        let now = children(corral.pid());
        now.len() == 3 && now.iter().all(|p| !before.contains(p))
    });
    let at_replaced = served_now();
    let went_on = eventually(Duration::from_secs(10), || served_now() >= at_replaced + 20);
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let (mut ok, mut failed) = (0, Vec::new());
    for t in load {
        let (o, f) = t.join().unwrap();
        ok += o;
        failed.extend(f);
    }
    assert!(
        replaced,
        "old workers {before:?}, now {:?}\n{}",
        children(corral.pid()),
        corral.log()
    );
    assert!(failed.is_empty(), "failed: {failed:?}\n{}", corral.log());
    assert!(
        went_on && at_replaced > at_signal,
        "served {at_signal} before the signal, {at_replaced} by the replacement, {ok} in all"
    );
    assert!(corral.wait_log("rolling restart"));
}

#[test]
fn stop_restart_workers_and_status_find_corral_through_its_config() {
    let dir = peers::shared_dir();
    site(dir.path());
    let config = config(
        &dir.path().join("run"),
        dir.path(),
        "mode = \"static\"\nmin = 2\nmax = 2",
    )
    .replace(
        "[[listen]]",
        "[status]\naddress = \"127.0.0.1:0\"\n\n[[listen]]",
    );
    let corral = Corral::start(&config, 1);
    // The status listener's port is only known from the log; `corral status` reads the
    // file, so give it the real address.
    let status = corral.status_ready_addr();
    let file = support::config_file(&config.replace(
        "[status]\naddress = \"127.0.0.1:0\"",
        &format!("[status]\naddress = \"{status}\""),
    ));
    let path = file.path().to_str().unwrap();
    let pid_file = dir.path().join("run/corral.pid");
    assert_eq!(
        std::fs::read_to_string(&pid_file).unwrap().trim(),
        corral.pid().to_string()
    );
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(
        std::fs::metadata(&pid_file).unwrap().permissions().mode() & 0o777,
        0o600
    );
    assert!(eventually(Duration::from_secs(10), || children(
        corral.pid()
    )
    .len()
        == 2));

    let out = support::corral(&["status", "-c", path]);
    assert_eq!(out.code, Some(0), "{out:?}");
    assert!(
        out.stdout.contains("pool:                 php"),
        "{}",
        out.stdout
    );
    let out = support::corral(&["status", "--full", "-c", path]);
    assert!(out.stdout.contains("pid:"), "{}", out.stdout);

    let before: Vec<u32> = children(corral.pid());
    let out = support::corral(&["restart-workers", "-c", path]);
    assert_eq!(out.code, Some(0), "{out:?}");
    assert!(eventually(Duration::from_secs(20), || {
        let now = children(corral.pid());
        now.len() == 2 && now.iter().all(|p| !before.contains(p))
    }));

    let out = support::corral(&["stop", "-c", path]);
    assert_eq!(out.code, Some(0), "{out:?}");
    assert!(out.stdout.contains("stopped"), "{}", out.stdout);
    assert!(!alive(corral.pid()), "corral exited");
    assert!(!pid_file.exists(), "the pid file went with it");
    // Nothing runs now: the commands say so, with EX_UNAVAILABLE.
    let out = support::corral(&["stop", "-c", path]);
    assert_eq!(out.code, Some(69), "{out:?}");
    assert!(out.stderr.contains("not running"), "{}", out.stderr);
}
