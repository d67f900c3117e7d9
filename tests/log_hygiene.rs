//! What peers can put in corral's log: a PHP script that floods its stderr (both ways PHP has:
//! `error_log`, which php-cgi sends as FastCGI STDERR records, and writes to `php://stderr`
//! (php-cgi has no `STDERR` constant), which go to the worker's stderr pipe) leaves a bounded log that counts what it
//! suppressed; a request path with ESC, CR and LF in it is logged escaped, so it can
//! neither colour the operator's terminal nor forge a log line; and a log reader that goes
//! away (a pipe to a logger that died) stops neither serving nor a clean stop.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing,
    missing_docs
)]

mod support;

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::Duration;

use support::peers::{shared_dir, write_file};
use support::server::{http, Corral};

/// Lines the flood script writes to each of its two stderr paths.
const FLOOD: usize = 10_000;

fn site() -> (Corral, tempfile::TempDir) {
    let (config, dir) = site_config();
    (Corral::start(&config, 1), dir)
}

fn site_config() -> (String, tempfile::TempDir) {
    let dir = shared_dir();
    let root = dir.path().join("www");
    std::fs::create_dir(&root).unwrap();
    write_file(
        &root,
        "flood.php",
        &format!(
            "<?php $err = fopen('php://stderr', 'w'); \
             for ($i = 0; $i < {FLOOD}; $i++) {{ error_log(\"flood-log $i\"); \
             fwrite($err, \"flood-raw $i\\n\"); }} echo 'flooded';"
        ),
    );
    let config = format!(
        r#"
[server]
runtime_dir = "{run}"

[[listen]]
address = "127.0.0.1:0"
protocol = "http"

[pools.php]
command = ["php-cgi", "-d", "log_errors=1", "-d", "display_errors=0"]
mode = "static"
max = 1

[[contexts]]
root = "{root}"
pool = "php"
"#,
        run = dir.path().join("run").display(),
        root = root.display(),
    );
    (config, dir)
}

/// Asks for the missing script `/{tag}.php` and waits for the line naming it.
fn marker(corral: &Corral, tag: &str) {
    let r = http(corral.http_addr(), "GET", &format!("/{tag}.php"), &[], b"");
    assert_eq!(r.status, 404, "{}", r.text());
    assert!(corral.wait_log(tag), "no marker line:\n{}", corral.log());
}

/// The counts in the "suppressed N lines" lines that contain `marker`.
fn suppressed(log: &str, marker: &str) -> u64 {
    log.lines()
        .filter(|l| l.contains(marker))
        .filter_map(|l| {
            let at = l.find("suppressed ")? + "suppressed ".len();
            l[at..].split_whitespace().next()?.parse::<u64>().ok()
        })
        .sum()
}

#[test]
fn a_stderr_flood_leaves_a_bounded_log_with_the_suppressed_count() {
    let (corral, _dir) = site();
    let r = http(corral.http_addr(), "GET", "/flood.php", &[], b"");
    assert_eq!(r.status, 200, "{}\n{}", r.text(), corral.log());
    assert_eq!(r.text(), "flooded");
    assert!(
        corral.wait_log("worker output over"),
        "no report of suppressed worker lines:\n{}",
        corral.log()
    );
    assert!(
        corral.wait_log("backend stderr over"),
        "no report of suppressed stderr records:\n{}",
        corral.log()
    );
    // The worker's last report is due one quiet second after the flood: wait until every
    // raw line is logged or counted...
    let accounted = || {
        let log = corral.log();
        log.lines().filter(|l| l.contains("flood-raw")).count() as u64
            + suppressed(&log, "worker output over")
    };
    assert!(
        support::eventually(Duration::from_secs(10), || accounted() >= FLOOD as u64),
        "{} of {FLOOD} raw lines logged or counted:\n{}",
        accounted(),
        corral.log()
    );
    // ...then for a line caused after the flood, so that a line too many would be in.
    marker(&corral, "after-the-flood");
    let log = corral.log();
    let raw = log.lines().filter(|l| l.contains("flood-raw")).count();
    let records = log.lines().filter(|l| l.contains("flood-log")).count();
    // 100 lines a second per stream: a flood of a few seconds logs a few hundred.
    assert!(raw > 0 && raw <= 1000, "{raw} worker stderr lines logged");
    assert!(
        records > 0 && records <= 1000,
        "{records} stderr records logged"
    );
    assert!(
        log.lines().count() < 3000,
        "{} log lines",
        log.lines().count()
    );
    // Every raw line is either logged or counted.
    let raw_suppressed = suppressed(&log, "worker output over");
    assert_eq!(
        raw as u64 + raw_suppressed,
        FLOOD as u64,
        "logged {raw} + suppressed {raw_suppressed}"
    );
    assert!(suppressed(&log, "backend stderr over") > 0);
}

#[test]
fn a_request_path_with_control_bytes_is_logged_escaped() {
    let (corral, _dir) = site();
    // CR and LF in a path are refused before anything logs the path; a missing script's
    // 404 names it, with ESC, BS and DEL in it.
    let target = "/%1b[31mred%08%7fx.php";
    let r = http(corral.http_addr(), "GET", target, &[], b"");
    assert_eq!(r.status, 404, "{}", r.text());
    assert!(
        corral.wait_log("red"),
        "the path was not logged:\n{}",
        corral.log()
    );
    // Whatever else that request logs is in before a later request's line.
    marker(&corral, "after-the-path");
    let log = corral.log();
    assert!(
        !log.contains('\u{1b}'),
        "a raw ESC reached the log:\n{log:?}"
    );
    assert!(
        !log.chars().any(|c| c.is_control() && c != '\n'),
        "a raw control character reached the log:\n{log:?}"
    );
    assert!(log.contains("\\x1b[31mred\\x08\\x7fx.php"), "{log}");
}

#[test]
fn a_log_reader_that_goes_away_stops_neither_serving_nor_a_clean_stop() {
    let (config, dir) = site_config();
    let file = dir.path().join("corral.toml");
    std::fs::write(&file, config).unwrap();
    let mut child = KillOnDrop(
        Command::new(support::CORRAL)
            .args(["run", "-c"])
            .arg(&file)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let mut lines = BufReader::new(child.0.stderr.take().unwrap()).lines();
    let addr = loop {
        let line = lines.next().expect("corral logged its listener").unwrap();
        if let Some(at) = line.find("listener=") {
            break line[at + "listener=".len()..]
                .split_whitespace()
                .next()
                .unwrap()
                .parse()
                .unwrap();
        }
    };
    // The reader goes away: from here on every log line corral writes fails with EPIPE.
    drop(lines);
    let r = http(addr, "GET", "/missing.php", &[], b"");
    assert_eq!(r.status, 404, "{}", r.text());
    let r = http(addr, "GET", "/flood.php", &[], b"");
    assert_eq!(r.text(), "flooded");
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child.0.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    let outcome = support::wait(&mut child.0, Duration::from_secs(10));
    assert_eq!(
        outcome.map(|s| s.code()),
        Some(Some(0)),
        "corral did not stop cleanly on SIGTERM with its log pipe closed"
    );
}

/// A child killed and reaped when dropped (a no-op once it was reaped).
struct KillOnDrop(std::process::Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}
