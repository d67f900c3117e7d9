//! Reloading the configuration while corral serves (SIGHUP, `corral reload`), with real
//! php-cgi pools spawned by corral: reloads under load fail no request and end on the newest
//! generation, a broken file leaves the running configuration serving and is reported with
//! file:line:column, listeners are added and removed, and a pool removed with requests in
//! flight lets them finish.

mod support;

use std::io::{Read, Write};
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::Duration;
use tokio::time::Instant;

use nix::sys::signal::Signal;
use support::peers;
use support::server::{http, Corral};

const RELOADED: &str = "reloaded: the new configuration serves";

/// A configuration with an http listener (plus `extra` blocks) and a spawned php-cgi pool of
/// `workers` whose environment has `GEN = gen`.
fn config(run: &Path, root: &Path, workers: u32, gen: u32, extra: &str) -> String {
    format!(
        r#"
[server]
runtime_dir = "{run}"
grace = "10s"
kill_timeout = "2s"

[[listen]]
address = "127.0.0.1:0"
protocol = "http"

{extra}

[pools.php]
command = ["php-cgi"]
mode = "static"
min = {workers}
max = {workers}
env = {{ GEN = "{gen}" }}

[[contexts]]
pool = "php"
root = "{root}"
"#,
        run = run.display(),
        root = root.display()
    )
}

fn site(dir: &Path) {
    peers::write_file(dir, "gen.php", "<?php echo getenv('GEN'), ' ', getmypid();");
    peers::write_file(
        dir,
        "sleep.php",
        "<?php if (isset($_GET['tag'])) { $tag = basename($_GET['tag']); \
         touch(__DIR__ . '/started-' . $tag); \
         for ($i = 0; $i < 3000 && !file_exists(__DIR__ . '/go-' . $tag); $i++) { \
         usleep(10000); clearstatcache(); } } \
         usleep((int)($_GET['ms'] ?? 100) * 1000); echo getenv('GEN'), ' done';",
    );
}

/// Rewrites corral's configuration file and sends SIGHUP; waits until the `n`th reload is
/// logged and gives how long it took from the signal.
fn reload(corral: &Corral, text: &str, n: usize) -> Duration {
    std::fs::write(corral.config_path(), text).unwrap();
    let sent = Instant::now();
    corral.signal(Signal::SIGHUP);
    assert!(
        corral.wait_count(RELOADED, n, Duration::from_secs(30)),
        "reload {n} not applied:\n{}",
        corral.log()
    );
    sent.elapsed()
}

/// The GEN a request to /gen.php answers with, or the failure.
fn generation(corral: &Corral) -> Result<u32, String> {
    let r = http(corral.http_addr(), "GET", "/gen.php", &[], b"");
    if r.status != 200 {
        return Err(format!("{} {}", r.status, r.text()));
    }
    r.text()
        .split(' ')
        .next()
        .and_then(|g| g.parse().ok())
        .ok_or_else(|| format!("unexpected body {:?}", r.text()))
}

/// php-cgi workers whose parent is corral.
fn workers(corral: &Corral) -> usize {
    support::sync1::children(corral.pid()).len()
}

/// Requests served between two reloads, at least: the load goes on across every one.
const PER_RELOAD: u64 = 10;

#[test]
fn ten_reloads_under_load_fail_nothing_and_end_on_the_newest_generation() {
    let dir = peers::shared_dir();
    site(dir.path());
    let run = dir.path().join("run");
    let corral = Corral::start(&config(&run, dir.path(), 4, 0, ""), 1);
    assert_eq!(generation(&corral), Ok(0));
    let corral = Arc::new(corral);
    let stop = Arc::new(AtomicBool::new(false));
    let served = Arc::new(AtomicU64::new(0));
    // Three clients request back to back from before the first reload to after the last.
    let load: Vec<_> = (0..3)
        .map(|_| {
            let (corral, stop, served) =
                (Arc::clone(&corral), Arc::clone(&stop), Arc::clone(&served));
            thread::spawn(move || {
                let mut failed = Vec::new();
                while !stop.load(Ordering::Relaxed) {
                    match generation(&corral) {
                        Ok(_) => {
                            served.fetch_add(1, Ordering::Relaxed);
                        }
                        Err(e) => failed.push(e),
                    }
                }
                failed
            })
        })
        .collect();
    let served_now = || served.load(Ordering::Relaxed);
    let mut took = Vec::new();
    let mut per_reload = Vec::new();
    for gen in 1..=10u32 {
        // The load has served its share since the last reload.
        let since = served_now();
        assert!(
            support::eventually(Duration::from_secs(20), || served_now()
                >= since + PER_RELOAD),
            "the load stalled before reload {gen}\n{}",
            corral.log()
        );
        // And one request is in flight on the old generation when the signal goes, held
        // (by a file) until the new generation serves.
        let tag = format!("g{gen}");
        let marker = dir.path().join(format!("started-{tag}"));
        let straddling = {
            let corral = Arc::clone(&corral);
            thread::spawn(move || {
                http(
                    corral.http_addr(),
                    "GET",
                    &format!("/sleep.php?ms=0&tag={tag}"),
                    &[],
                    b"",
                )
            })
        };
        assert!(
            support::eventually(Duration::from_secs(10), || marker.exists()),
            "{}",
            corral.log()
        );
        // Each reload changes the pool's environment, and every other one its size too.
        let workers = if gen % 2 == 0 { 4 } else { 3 };
        took.push(reload(
            &corral,
            &config(&run, dir.path(), workers, gen, ""),
            gen as usize,
        ));
        std::fs::write(dir.path().join(format!("go-g{gen}")), "").unwrap();
        let r = straddling.join().unwrap();
        assert_eq!(
            (r.status, r.text()),
            (200, format!("{} done", gen - 1)),
            "the request in flight across reload {gen}\n{}",
            corral.log()
        );
        per_reload.push(served_now() - since);
    }
    // Within a few seconds of the last reload every answer comes from generation 10.
    let deadline = Instant::now() + Duration::from_secs(5);
    let mut newest_in_a_row = 0;
    while newest_in_a_row < 20 && Instant::now() < deadline {
        match generation(&corral) {
            Ok(10) => newest_in_a_row += 1,
            _ => newest_in_a_row = 0,
        }
    }
    // The load goes on after the last reload, too.
    let last = served_now();
    let went_on = support::eventually(Duration::from_secs(20), || {
        served_now() >= last + PER_RELOAD
    });
    stop.store(true, Ordering::Relaxed);
    let mut failed = Vec::new();
    for t in load {
        failed.extend(t.join().unwrap());
    }
    let ok = served_now();
    assert!(failed.is_empty(), "failed: {failed:?}\n{}", corral.log());
    assert!(went_on, "the load stalled after the last reload");
    assert_eq!(newest_in_a_row, 20, "answers still from older generations");
    // The old generations' workers are gone: 4 php-cgi workers are left.
    assert!(
        support::eventually(Duration::from_secs(10), || workers(&corral) == 4),
        "old workers left behind: {}\n{}",
        workers(&corral),
        corral.log()
    );
    took.sort();
    eprintln!(
        "reload latency (SIGHUP to the new generation serving, php-cgi pool of 3-4): \
         min {:?}, median {:?}, max {:?}; {ok} requests served by the load, per reload \
         interval {per_reload:?}",
        took[0],
        took[took.len() / 2],
        took[took.len() - 1]
    );
}

#[test]
fn a_broken_configuration_keeps_the_running_one_and_is_reported_with_its_position() {
    let dir = peers::shared_dir();
    site(dir.path());
    let run = dir.path().join("run");
    let corral = Corral::start(&config(&run, dir.path(), 1, 0, ""), 1);
    assert_eq!(generation(&corral), Ok(0));
    let broken = config(&run, dir.path(), 1, 1, "").replace("min = 1", "min = \"one\"");
    std::fs::write(corral.config_path(), &broken).unwrap();
    corral.signal(Signal::SIGHUP);
    assert!(corral.wait_log("reload refused"), "{}", corral.log());
    // The error names the file, line and column of the bad value.
    let line = broken
        .lines()
        .position(|l| l.contains("\"one\""))
        .map(|i| i + 1)
        .unwrap();
    let at = format!("{}:{line}:", corral.config_path().display());
    assert!(corral.log().contains(&at), "no {at} in\n{}", corral.log());
    // Still serving, from the running configuration.
    assert_eq!(generation(&corral), Ok(0));
    // And a good file afterwards is taken, as the first reload applied: the broken one
    // never was.
    reload(&corral, &config(&run, dir.path(), 1, 2, ""), 1);
    assert_eq!(generation(&corral), Ok(2));
    let log = corral.mark();
    assert_eq!(log.matches(RELOADED).count(), 1, "{log}");
    // A configuration that validates but cannot be set up (a listener that cannot be bound)
    // is refused whole: nothing of it serves.
    let blocker = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let taken = blocker.local_addr().unwrap();
    let extra = format!("[[listen]]\naddress = \"{taken}\"\nprotocol = \"http\"\n");
    std::fs::write(corral.config_path(), config(&run, dir.path(), 1, 3, &extra)).unwrap();
    corral.signal(Signal::SIGHUP);
    assert!(
        corral.wait_log("reload failed; the running configuration keeps serving"),
        "{}",
        corral.log()
    );
    assert_eq!(generation(&corral), Ok(2));
}

/// One HTTP/1.1 request over a Unix socket; the status code.
fn get_unix(path: &Path, target: &str) -> std::io::Result<u16> {
    let mut s = std::os::unix::net::UnixStream::connect(path)?;
    s.set_read_timeout(Some(Duration::from_secs(10)))?;
    write!(
        s,
        "GET {target} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n"
    )?;
    let mut raw = Vec::new();
    s.read_to_end(&mut raw)?;
    let head = String::from_utf8_lossy(&raw);
    Ok(head
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0))
}

#[test]
fn a_reload_adds_one_listener_and_removes_another() {
    let dir = peers::shared_dir();
    site(dir.path());
    let run = dir.path().join("run");
    let a = dir.path().join("a.sock");
    let b = dir.path().join("b.sock");
    let listen = |p: &Path| {
        format!(
            "[[listen]]\naddress = \"unix:{}\"\nprotocol = \"http\"\n",
            p.display()
        )
    };
    let corral = Corral::start(&config(&run, dir.path(), 1, 0, &listen(&a)), 2);
    assert_eq!(get_unix(&a, "/gen.php").unwrap(), 200);
    assert!(get_unix(&b, "/gen.php").is_err());
    let pid = http(corral.http_addr(), "GET", "/gen.php", &[], b"").text();
    reload(&corral, &config(&run, dir.path(), 1, 0, &listen(&b)), 1);
    // The pool did not change: the same worker serves, nothing was restarted.
    assert_eq!(
        http(corral.http_addr(), "GET", "/gen.php", &[], b"").text(),
        pid
    );
    assert!(corral.log().contains("pools_kept=1"), "{}", corral.log());
    assert_eq!(get_unix(&b, "/gen.php").unwrap(), 200, "{}", corral.log());
    // The removed listener closed, and its socket file is gone.
    assert!(
        support::eventually(Duration::from_secs(5), || !a.exists()),
        "{}",
        corral.log()
    );
    assert!(get_unix(&a, "/gen.php").is_err());
    // The TCP listener, unchanged, kept serving throughout.
    assert_eq!(generation(&corral), Ok(0));
}

#[test]
fn a_pool_removed_by_a_reload_finishes_its_requests_in_flight() {
    let dir = peers::shared_dir();
    site(dir.path());
    let run = dir.path().join("run");
    let second = |gen: u32| {
        format!(
            r#"
[pools.other]
command = ["php-cgi"]
mode = "static"
min = 1
max = 1
env = {{ GEN = "{gen}" }}

[[contexts]]
pool = "other"
host = "other.test"
root = "{root}"
"#,
            root = dir.path().display()
        )
    };
    let status = "[status]\naddress = \"127.0.0.1:0\"\n";
    let with_other = format!("{}{}", config(&run, dir.path(), 1, 0, status), second(7));
    let corral = Arc::new(Corral::start(&with_other, 1));
    let status = corral.status_ready_addr();
    let host = [("Host", "other.test")];
    assert_eq!(
        http(corral.http_addr(), "GET", "/gen.php", &host, b"")
            .text()
            .split(' ')
            .next(),
        Some("7")
    );
    // A slow request to the pool that is about to go, and one queued behind it.
    let slow: Vec<_> = (0..2)
        .map(|n| {
            let corral = Arc::clone(&corral);
            thread::spawn(move || {
                let host = [("Host", "other.test")];
                let target = format!("/sleep.php?ms=0&tag=other{n}");
                http(corral.http_addr(), "GET", &target, &host, b"")
            })
        })
        .collect();
    let queued = || support::server::pool_counter(status, "other", "listen queue");
    let started = || {
        (0..2)
            .filter(|n| dir.path().join(format!("started-other{n}")).exists())
            .count()
    };
    assert!(
        support::eventually(Duration::from_secs(10), || started() == 1 && queued() == 1),
        "started {}, queued {}\n{}",
        started(),
        queued(),
        corral.log()
    );
    reload(&corral, &config(&run, dir.path(), 1, 0, ""), 1);
    // Both are let go once the pool is retired (each holds until its file exists).
    for n in 0..2 {
        std::fs::write(dir.path().join(format!("go-other{n}")), "").unwrap();
    }
    for t in slow {
        let r = t.join().unwrap();
        assert_eq!(r.status, 200, "{}\n{}", r.text(), corral.log());
        assert_eq!(r.text(), "7 done");
    }
    // The host now falls to the remaining context, and the old pool stops.
    let r = http(corral.http_addr(), "GET", "/gen.php", &host, b"");
    assert_eq!(r.text().split(' ').next(), Some("0"));
    assert!(corral.wait_log("retired pool stopped"), "{}", corral.log());
}

#[test]
fn corral_reload_validates_then_signals_the_running_corral() {
    let dir = peers::shared_dir();
    site(dir.path());
    let run = dir.path().join("run");
    let corral = Corral::start(&config(&run, dir.path(), 1, 0, ""), 1);
    let path = corral.config_path().display().to_string();
    std::fs::write(corral.config_path(), config(&run, dir.path(), 1, 5, "")).unwrap();
    let out = support::corral(&["reload", "-c", &path]);
    assert_eq!(out.code, Some(0), "{out:?}");
    assert!(out.stdout.contains("asked corral"), "{out:?}");
    assert!(
        corral.wait_count(RELOADED, 1, Duration::from_secs(30)),
        "{}",
        corral.log()
    );
    assert_eq!(generation(&corral), Ok(5));
    // A broken file is reported by the command itself, and nothing is signalled.
    std::fs::write(corral.config_path(), "[server\n").unwrap();
    let out = support::corral(&["reload", "-c", &path]);
    assert_ne!(out.code, Some(0), "{out:?}");
    assert!(out.stderr.contains(&format!("{path}:1:")), "{out:?}");
    // A good file afterwards is the second reload corral hears of: the broken one reached
    // it neither as a reload nor as a refused one.
    std::fs::write(corral.config_path(), config(&run, dir.path(), 1, 6, "")).unwrap();
    let out = support::corral(&["reload", "-c", &path]);
    assert_eq!(out.code, Some(0), "{out:?}");
    assert!(
        corral.wait_count(RELOADED, 2, Duration::from_secs(30)),
        "{}",
        corral.log()
    );
    assert_eq!(generation(&corral), Ok(6));
    assert_eq!(corral.count_log("reload requested"), 2, "{}", corral.log());
    corral.assert_absent_before("reload refused", "reloaded: the new configuration serves");
    assert_eq!(corral.count_log("reload refused"), 0, "{}", corral.log());
}
