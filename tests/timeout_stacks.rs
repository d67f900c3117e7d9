//! A hard timeout that tells why: a real WSGI or Rack worker past `request_timeout` is asked
//! for its thread stacks (SIGUSR2 to corral's launcher, no ptrace) before it is killed, so
//! the log shows the stack naming the blocking line of the app before the kill line, and the
//! client still gets its 504 within `request_timeout` plus the one-second bound on the dump;
//! a worker whose app ignores the signal is killed once that bound has passed.
//! A request over `slow_threshold` has its stack in the slow log and completes normally.

mod support;

use std::path::Path;
use std::time::Duration;

use tokio::time::Instant;

use support::peers::{shared_dir, write_file};
use support::server::{http, Corral};

/// Blocks on the marked lines: a sleep, a read from a socket that never sends, a slow
/// answer; `/pid` answers the worker's pid.
const WSGI_APP: &str = r#"import os, socket, time

def application(environ, start_response):
    path = environ.get("PATH_INFO")
    if path == "/sleep":
        time.sleep(60)  # BLOCK-SLEEP
    elif path == "/recv":
        quiet, _peer = socket.socketpair()
        quiet.recv(1)  # BLOCK-RECV
    elif path == "/slow":
        time.sleep(1.5)  # BLOCK-SLOW
    start_response("200 OK", [("Content-Type", "text/plain")])
    return [str(os.getpid()).encode()]
"#;

const RACK_APP: &str = r#"def blocked
  sleep 60 # BLOCK-SLEEP
end

run lambda { |env|
  blocked if env['PATH_INFO'] == '/sleep'
  [200, { 'content-type' => 'text/plain' }, [Process.pid.to_s]]
}
"#;

const REQUEST_TIMEOUT: Duration = Duration::from_secs(2);
/// The longest corral waits for a dump before it kills anyway.
const DUMP_BOUND: Duration = Duration::from_secs(1);

/// The 1-based number of the line of `text` holding `marker`.
fn line_of(text: &str, marker: &str) -> usize {
    text.lines()
        .position(|l| l.contains(marker))
        .map(|i| i + 1)
        .unwrap_or_else(|| panic!("no {marker} in the app"))
}

fn config(run: &Path, dir: &Path, app: &str, pool: &str, server: &str) -> String {
    support::site_config(
        run,
        &format!(
            "app = \"{app}\"\ncwd = \"{}\"\nmode = \"static\"\nmin = 1\nmax = 1\n\
             request_timeout = \"2s\"\n{pool}",
            dir.display()
        ),
    )
    .replacen("[server]\n", &format!("[server]\n{server}\n"), 1)
}

/// Sends `path`, expects a 504 in time, and returns the log up to the kill notice, which
/// must come after the worker's stack naming `site` (`app.py", line N` or `config.ru:N`).
fn timed_out_with_stack(corral: &Corral, path: &str, site: &str) -> String {
    let addr = corral.http_addr();
    let pid = http(addr, "GET", "/pid", &[], b"").text();
    let started = Instant::now();
    let r = http(addr, "GET", path, &[], b"");
    let took = started.elapsed();
    assert_eq!(r.status, 504, "{}", corral.log());
    assert!(
        took < REQUEST_TIMEOUT + DUMP_BOUND,
        "the 504 took {took:?}:\n{}",
        corral.log()
    );
    let kill = "exceeded request_timeout and was killed";
    assert!(corral.wait_log(kill), "{}", corral.log());
    let log = corral.log();
    let before_kill = &log[..log.find(kill).unwrap()];
    let stack_line = before_kill
        .lines()
        .find(|l| l.contains(site))
        .unwrap_or_else(|| panic!("no stack line with {site:?} before the kill:\n{log}"));
    // Logged as the worker's stderr, with the worker (or, forked, its preloader) named.
    assert!(
        stack_line.contains("stream=\"stderr\"") || stack_line.contains("stream=stderr"),
        "{stack_line}"
    );
    assert!(
        before_kill.contains(&format!("pid={pid}")),
        "the worker {pid} is not named before the kill:\n{log}"
    );
    assert!(
        before_kill.contains("the worker's stacks at request_timeout are logged above"),
        "the dump did not end before the kill:\n{log}"
    );
    log
}

/// The WSGI app in a pool with `pool` (extra keys): the request to `path`, blocked on the
/// line marked `marker`, times out with that line in the stack logged before the kill. The
/// directory goes with corral, which serves from it.
fn wsgi_timed_out(pool: &str, path: &str, marker: &str) -> (Corral, tempfile::TempDir) {
    let dir = shared_dir();
    let app = write_file(dir.path(), "app.py", WSGI_APP);
    let corral = Corral::start(
        &config(
            &dir.path().join("run"),
            dir.path(),
            "wsgi:app:application",
            pool,
            "",
        ),
        1,
    );
    let site = format!(
        "{}\", line {} in application",
        app.display(),
        line_of(WSGI_APP, marker)
    );
    timed_out_with_stack(&corral, path, &site);
    (corral, dir)
}

#[test]
fn a_wsgi_handler_blocked_in_sleep_is_dumped_then_killed() {
    wsgi_timed_out("", "/sleep", "BLOCK-SLEEP");
}

#[test]
fn a_wsgi_handler_blocked_in_a_socket_read_is_dumped_then_killed() {
    // A spawned worker this time (its own stderr), where the default forks from a preloader.
    let (corral, _dir) = wsgi_timed_out("preload = false", "/recv", "BLOCK-RECV");
    // The pool carries on with a new worker.
    assert!(
        support::eventually(Duration::from_secs(10), || http(
            corral.http_addr(),
            "GET",
            "/pid",
            &[],
            b""
        )
        .status
            == 200),
        "{}",
        corral.log()
    );
}

#[test]
fn a_rack_handler_blocked_in_sleep_is_dumped_then_killed() {
    let dir = shared_dir();
    write_file(dir.path(), "config.ru", RACK_APP);
    let corral = Corral::start(
        &config(
            &dir.path().join("run"),
            dir.path(),
            "rack:config.ru",
            "",
            "",
        ),
        1,
    );
    // Rack names the rackup file as the pool's `app` gives it, relative to `cwd`.
    let site = format!("config.ru:{}:in `sleep'", line_of(RACK_APP, "BLOCK-SLEEP"));
    let log = timed_out_with_stack(&corral, "/sleep", &site);
    // The interrupted thread's stack starts where the app was, not in the launcher's trap.
    let mut lines = log.lines().skip_while(|l| !l.contains("(main):"));
    let first = lines.nth(1).unwrap_or_default();
    assert!(first.contains(&site), "{first}\n{log}");
}

#[test]
fn a_worker_whose_app_ignores_the_stack_signal_is_killed_within_the_bound() {
    let dir = shared_dir();
    let app = WSGI_APP.replacen(
        "import os, socket, time\n",
        "import os, signal, socket, time\nsignal.signal(signal.SIGUSR2, signal.SIG_IGN)\n",
        1,
    );
    write_file(dir.path(), "app.py", &app);
    let corral = Corral::start(
        &config(
            &dir.path().join("run"),
            dir.path(),
            "wsgi:app:application",
            "",
            "",
        ),
        1,
    );
    let addr = corral.http_addr();
    let old = http(addr, "GET", "/pid", &[], b"").text();
    let started = Instant::now();
    assert_eq!(http(addr, "GET", "/sleep", &[], b"").status, 504);
    assert!(
        corral.wait_log("exceeded request_timeout and was killed"),
        "{}",
        corral.log()
    );
    let killed = started.elapsed();
    assert!(
        killed < REQUEST_TIMEOUT + DUMP_BOUND + Duration::from_secs(2),
        "killed after {killed:?}:\n{}",
        corral.log()
    );
    let log = corral.log();
    let kill = log.find("exceeded request_timeout and was killed").unwrap();
    let gave_up = log
        .find("the worker did not finish its stack dump within 1s")
        .unwrap_or_else(|| panic!("{log}"));
    assert!(gave_up < kill, "{log}");
    // Replaced: a new worker answers.
    assert!(
        support::eventually(Duration::from_secs(10), || {
            let r = http(addr, "GET", "/pid", &[], b"");
            r.status == 200 && r.text() != old
        }),
        "{}",
        corral.log()
    );
}

#[test]
fn a_request_over_slow_threshold_logs_its_stack_and_completes() {
    let dir = shared_dir();
    let app = write_file(dir.path(), "app.py", WSGI_APP);
    let slow = dir.path().join("slow.log");
    let corral = Corral::start(
        &config(
            &dir.path().join("run"),
            dir.path(),
            "wsgi:app:application",
            "",
            &format!(
                "slow_log = \"{}\"\nslow_threshold = \"500ms\"",
                slow.display()
            ),
        ),
        1,
    );
    let addr = corral.http_addr();
    let pid = http(addr, "GET", "/pid", &[], b"").text();
    let r = http(addr, "GET", "/slow", &[], b"");
    assert_eq!(r.status, 200, "{}", corral.log());
    // Answered by the same worker: asking for the stack did not kill it.
    assert_eq!(r.text(), pid, "{}", corral.log());
    let site = format!(
        "{}\", line {} in application",
        app.display(),
        line_of(WSGI_APP, "BLOCK-SLOW")
    );
    let mut text = String::new();
    assert!(
        support::eventually(Duration::from_secs(5), || {
            text = std::fs::read_to_string(&slow).unwrap_or_default();
            text.contains("GET /slow ")
        }),
        "no slow entry:\n{text}\n{}",
        corral.log()
    );
    let entry = &text[text.find("GET /slow ").unwrap()..];
    assert!(
        entry.contains(&format!("  | stacks of worker {pid} at slow_threshold:\n")),
        "{text}"
    );
    assert!(
        entry
            .lines()
            .any(|l| l.starts_with("  | ") && l.contains(&site)),
        "no {site:?} in the slow entry:\n{text}"
    );
    // The fast request has no entry, and the worker is still the one it was.
    assert!(!text.contains("GET /pid "), "{text}");
    assert_eq!(http(addr, "GET", "/pid", &[], b"").text(), pid);
    assert!(!corral.log().contains("exceeded request_timeout"));
}
