//! The access log and the slow-request log, with a real php-cgi pool: one line per request
//! with its status, worker pid and timing split, in text and JSON (a client gone before the
//! answer's head: 499, aborted); a logrotate-style rename
//! plus SIGUSR1 moves new lines to the new file and loses none; the slow log gets only the
//! requests over its threshold.

mod support;

use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::Duration;

use nix::sys::signal::Signal;
use support::peers;
use support::server::{http, Corral};
use tokio::time::Instant;

fn config(run: &Path, root: &Path, server: &str) -> String {
    format!(
        r#"
[server]
runtime_dir = "{run}"
{server}

[[listen]]
address = "127.0.0.1:0"
protocol = "http"

[pools.php]
command = ["php-cgi"]
mode = "static"
min = 1
max = 1

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
    peers::write_file(dir, "gone.php", "<?php http_response_code(404); echo 'no';");
    peers::write_file(
        dir,
        "sleep.php",
        "<?php usleep((int)($_GET['ms'] ?? 100) * 1000); echo 'slept';",
    );
}

/// The lines of `path` before the first that contains `marker`, once that one is written:
/// a request sent after the others, so that every line they would cause is in by then.
fn lines_before(path: &Path, marker: &str) -> Vec<String> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let text = std::fs::read_to_string(path).unwrap_or_default();
        let lines: Vec<String> = text.lines().map(str::to_owned).collect();
        if let Some(at) = lines.iter().position(|l| l.contains(marker)) {
            return lines[..at].to_vec();
        }
        assert!(
            Instant::now() < deadline,
            "no line with {marker:?} in {}:\n{text}",
            path.display()
        );
        thread::sleep(Duration::from_millis(20));
    }
}

/// The value after `key=` in a text line.
fn field<'a>(line: &'a str, key: &str) -> &'a str {
    line.split(' ')
        .find_map(|w| w.strip_prefix(key))
        .unwrap_or_else(|| panic!("no {key} in {line}"))
}

#[test]
fn every_request_has_one_text_line_with_its_status_worker_and_timings() {
    let dir = peers::shared_dir();
    site(dir.path());
    let log = dir.path().join("access.log");
    let server = format!("access_log = \"{}\"", log.display());
    let corral = Corral::start(&config(&dir.path().join("run"), dir.path(), &server), 1);
    let addr = corral.http_addr();
    let pid = http(addr, "GET", "/pid.php", &[], b"").text();
    let mut expected = vec![(200, "/pid.php".to_owned())];
    for i in 0..10 {
        let target = format!("/pid.php?i={i}");
        assert_eq!(
            http(addr, "GET", &target, &[("User-Agent", "tester \"x\"")], b"").status,
            200
        );
        expected.push((200, target));
    }
    assert_eq!(http(addr, "GET", "/gone.php", &[], b"").status, 404);
    expected.push((404, "/gone.php".to_owned()));
    // Refused by the script guard before any worker: still one line, with no worker pid.
    assert_eq!(http(addr, "GET", "/missing.php", &[], b"").status, 404);
    expected.push((404, "/missing.php".to_owned()));
    // Sent last: a line too many or a doubled one would be in before its line.
    assert_eq!(http(addr, "GET", "/pid.php?marker", &[], b"").status, 200);
    let lines = lines_before(&log, "/pid.php?marker ");
    assert_eq!(lines.len(), expected.len(), "{lines:#?}");
    for (line, (status, target)) in lines.iter().zip(&expected) {
        assert!(
            line.contains(&format!("\"GET {target} HTTP/1.1\" {status} ")),
            "{line}"
        );
        assert_eq!(field(line, "pool="), "php");
        for key in ["queue=", "connect=", "head=", "total="] {
            let secs: f64 = field(line, key).parse().unwrap();
            assert!((0.0..10.0).contains(&secs), "{key}{secs} in {line}");
        }
    }
    assert_eq!(field(&lines[0], "pid="), pid, "the worker that served it");
    assert!(
        lines[0].contains(&format!(" {} \"-\" \"-\" ", pid.len())),
        "bytes sent: {}",
        lines[0]
    );
    assert!(lines[1].contains("\"tester \\\"x\\\"\""), "{}", lines[1]);
    assert_eq!(field(lines.last().unwrap(), "pid="), "-");
}

/// A client that goes away while its request runs in the worker, before the answer's head:
/// its line says 499 and aborted (nginx's code for a client that closed), with the worker
/// it reached, and the next request is logged as usual.
#[test]
fn a_client_that_closes_before_the_head_gets_a_499_aborted_line() {
    let dir = peers::shared_dir();
    site(dir.path());
    let log = dir.path().join("access.log");
    let server = format!("access_log = \"{}\"", log.display());
    let corral = Corral::start(&config(&dir.path().join("run"), dir.path(), &server), 1);
    let addr = corral.http_addr();
    let pid = http(addr, "GET", "/pid.php", &[], b"").text();
    // Says it started, then holds the worker.
    peers::write_file(
        dir.path(),
        "held.php",
        "<?php file_put_contents(__DIR__ . '/held-started', '1'); usleep(1500000); echo 'held';",
    );
    let mut client = std::net::TcpStream::connect(addr).unwrap();
    std::io::Write::write_all(
        &mut client,
        b"GET /held.php HTTP/1.1\r\nHost: localhost\r\n\r\n",
    )
    .unwrap();
    // Gone once the worker runs the request.
    let started = support::eventually(Duration::from_secs(10), || {
        dir.path().join("held-started").exists()
    });
    assert!(
        started,
        "the request never reached the worker\n{}",
        corral.log()
    );
    drop(client);
    assert_eq!(http(addr, "GET", "/pid.php?marker", &[], b"").status, 200);
    let lines = lines_before(&log, "/pid.php?marker ");
    let line = lines
        .iter()
        .find(|l| l.contains("/held.php"))
        .unwrap_or_else(|| panic!("no line for the abandoned request: {lines:#?}"));
    assert!(
        line.contains("\"GET /held.php HTTP/1.1\" 499 ") && line.ends_with(" aborted"),
        "{line}"
    );
    assert_eq!(field(line, "pid="), pid, "the worker it reached");
}

#[test]
fn json_lines_parse_and_carry_the_timing_split() {
    let dir = peers::shared_dir();
    site(dir.path());
    let log = dir.path().join("access.json");
    let server = format!(
        "access_log = \"{}\"\naccess_log_format = \"json\"",
        log.display()
    );
    let corral = Corral::start(&config(&dir.path().join("run"), dir.path(), &server), 1);
    for i in 0..5 {
        http(
            corral.http_addr(),
            "GET",
            &format!("/pid.php?q=%22{i}%5C"),
            &[],
            b"",
        );
    }
    // A user agent with a C1 control (NEL), U+2028, an invalid byte and the literal text
    // `\xff`: escaped, and the invalid byte told apart from the text once decoded.
    {
        use std::io::{Read, Write};
        let mut s = std::net::TcpStream::connect(corral.http_addr()).unwrap();
        s.write_all(
            b"GET /pid.php?q=ua HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\
              User-Agent: a\xc2\x85b\xe2\x80\xa8c\xffd\\xffe\r\n\r\n",
        )
        .unwrap();
        let mut answer = Vec::new();
        s.read_to_end(&mut answer).unwrap();
        assert!(answer.starts_with(b"HTTP/1.1 200"), "{answer:?}");
    }
    // Sent last: a line too many or a doubled one would be in before its line.
    http(corral.http_addr(), "GET", "/pid.php?q=marker", &[], b"");
    let lines = lines_before(&log, "/pid.php?q=marker\"");
    assert_eq!(lines.len(), 6, "{lines:#?}");
    let last = lines.last().unwrap();
    assert!(
        !last.contains('\u{85}') && !last.contains('\u{2028}'),
        "{last:?}"
    );
    // Parsed by a JSON parser we did not write.
    let check = "import json, sys\n\
                 lines = sys.stdin.read().splitlines()\n\
                 ua = json.loads(lines[-1])['user_agent']\n\
                 assert ua == 'a\\x85b\\u2028c\\\\xffd\\\\\\\\xffe', repr(ua)\n\
                 for line in lines:\n\
                 \x20   r = json.loads(line)\n\
                 \x20   assert r['status'] == 200 and r['pool'] == 'php', r\n\
                 \x20   assert r['worker_pid'] > 0 and r['bytes'] > 0, r\n\
                 \x20   assert all(r[k] >= 0 for k in ('queue_ms', 'connect_ms', 'head_ms', 'total_ms')), r\n\
                 \x20   assert r['uri'].startswith('/pid.php?q='), r\n\
                 print('ok')\n";
    let mut python = Command::new("python3")
        .args(["-c", check])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    use std::io::Write;
    python
        .stdin
        .take()
        .unwrap()
        .write_all(lines.join("\n").as_bytes())
        .unwrap();
    let out = python.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "{}\n{lines:#?}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn a_rename_and_sigusr1_move_new_lines_to_a_new_file_and_lose_none() {
    let dir = peers::shared_dir();
    site(dir.path());
    let log = dir.path().join("access.log");
    let rotated = dir.path().join("access.log.1");
    let server = format!("access_log = \"{}\"", log.display());
    let corral = Arc::new(Corral::start(
        &config(&dir.path().join("run"), dir.path(), &server),
        1,
    ));
    let sent = Arc::new(AtomicUsize::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let load = {
        let (corral, sent, stop) = (Arc::clone(&corral), Arc::clone(&sent), Arc::clone(&stop));
        thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                assert_eq!(
                    http(corral.http_addr(), "GET", "/pid.php", &[], b"").status,
                    200
                );
                sent.fetch_add(1, Ordering::Relaxed);
            }
        })
    };
    // Each step waits for requests answered since the last one, not for time: some before
    // the rename, some between it and the reopen (still written to the renamed file), some
    // after the reopen.
    let answered = |more: usize| {
        let from = sent.load(Ordering::Relaxed);
        assert!(
            support::eventually(Duration::from_secs(20), || sent.load(Ordering::Relaxed)
                >= from + more),
            "the load stalled at {from}:\n{}",
            corral.log()
        );
    };
    answered(20);
    std::fs::rename(&log, &rotated).unwrap();
    answered(10);
    corral.signal(Signal::SIGUSR1);
    assert!(corral.wait_log("request logs reopened"), "{}", corral.log());
    answered(20);
    stop.store(true, Ordering::Relaxed);
    load.join().unwrap();
    let sent = sent.load(Ordering::Relaxed);
    let count = |p: &Path| {
        std::fs::read_to_string(p)
            .unwrap_or_default()
            .lines()
            .count()
    };
    // One more request after the load: once its line is in the new file, every line of the
    // load is written somewhere, and a line still going to the old file would be there.
    assert_eq!(
        http(corral.http_addr(), "GET", "/pid.php?marker", &[], b"").status,
        200
    );
    let after = lines_before(&log, "/pid.php?marker ").len();
    let old = count(&rotated);
    assert!(old > 0 && after > 0, "old {old}, new {after}");
    assert_eq!(old + after, sent, "a line lost or doubled");
    // The old file stopped growing once reopened: the marker went to the new one only.
    assert!(
        !std::fs::read_to_string(&rotated)
            .unwrap()
            .contains("/pid.php?marker"),
        "a line after the reopen went to the old file"
    );
    assert_eq!(count(&log), after + 1);
}

#[test]
fn the_slow_log_gets_only_requests_over_its_threshold() {
    let dir = peers::shared_dir();
    site(dir.path());
    let slow = dir.path().join("slow.log");
    let server = format!(
        "slow_log = \"{}\"\nslow_threshold = \"250ms\"",
        slow.display()
    );
    let corral = Corral::start(&config(&dir.path().join("run"), dir.path(), &server), 1);
    let addr = corral.http_addr();
    for _ in 0..5 {
        http(addr, "GET", "/sleep.php?ms=1", &[], b"");
    }
    for _ in 0..2 {
        assert_eq!(http(addr, "GET", "/sleep.php?ms=400", &[], b"").status, 200);
    }
    for _ in 0..5 {
        http(addr, "GET", "/sleep.php?ms=1", &[], b"");
    }
    // A slow one last: once its line is in, a fast one logged by mistake would be too.
    assert_eq!(
        http(addr, "GET", "/sleep.php?ms=400&marker", &[], b"").status,
        200
    );
    let lines = lines_before(&slow, "/sleep.php?ms=400&marker ");
    assert_eq!(lines.len(), 2, "{lines:#?}");
    for line in &lines {
        assert!(line.contains("/sleep.php?ms=400"), "{line}");
        let head: f64 = field(line, "head=").parse().unwrap();
        assert!(head >= 0.35, "the time went to the backend: {line}");
    }
}
