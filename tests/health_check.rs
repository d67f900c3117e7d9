//! Health-gated workers with a real WSGI app: with `health_check = "/healthz"`, a worker
//! whose check fails for the first 2 s of its life gets no user request before it passes
//! (the app records every request it serves, with its age and its check's verdict), at
//! start and across a reload; a reload to workers that never pass is refused with the
//! check's answer, and the running generation serves on.

mod support;

use std::path::Path;
use std::thread;
use std::time::Duration;

use support::peers::{shared_dir, write_file};
use support::server::{http, Corral};

/// Fails its health check for the first `WARMUP` seconds after its import (each worker
/// imports the app itself: `preload = false`), and appends one line per request to
/// `served.log`: `health|user PID AGE RELEASE`.
const APP: &str = r#"
import os, time

START = time.time()
WARMUP = float(os.environ.get("WARMUP", "2"))
HERE = os.path.dirname(os.path.abspath(__file__))

def application(environ, start_response):
    age = time.time() - START
    check = environ.get("PATH_INFO") == "/healthz"
    kind = "health" if check else "user"
    with open(os.path.join(HERE, "served.log"), "a") as f:
        f.write("%s %d %.3f %s %s\n" % (kind, os.getpid(), age, os.environ["RELEASE"],
                                        environ.get("HTTP_USER_AGENT", "")))
    if check and age < WARMUP:
        start_response("503 Service Unavailable", [("Content-Type", "text/plain")])
        return [b"warming up"]
    start_response("200 OK", [("Content-Type", "text/plain")])
    return [("%s %d %.3f" % (os.environ["RELEASE"], os.getpid(), age)).encode()]
"#;

fn config(run: &Path, dir: &Path, release: &str, warmup: &str, start_timeout: &str) -> String {
    support::site_config(
        run,
        &format!(
            "app = \"wsgi:app:application\"\ncwd = \"{}\"\npreload = false\n\
             mode = \"static\"\nmin = 1\nmax = 1\nqueue_timeout = \"10s\"\n\
             start_timeout = \"{start_timeout}\"\nhealth_check = \"/healthz\"\n\
             health_timeout = \"1s\"\n\
             env = {{ RELEASE = \"{release}\", WARMUP = \"{warmup}\" }}",
            dir.display()
        ),
    )
}

/// One line of `served.log`.
#[derive(Debug)]
struct Served {
    health: bool,
    pid: u32,
    age: f64,
    release: String,
    agent: String,
}

fn served(dir: &Path) -> Vec<Served> {
    std::fs::read_to_string(dir.join("served.log"))
        .unwrap_or_default()
        .lines()
        .map(|l| {
            let f: Vec<&str> = l.split(' ').collect();
            Served {
                health: f[0] == "health",
                pid: f[1].parse().unwrap(),
                age: f[2].parse().unwrap(),
                release: f[3].to_owned(),
                agent: f.get(4).copied().unwrap_or_default().to_owned(),
            }
        })
        .collect()
}

/// Asserts that every user request the app served reached a worker that had passed its
/// health check before (a 200 to /healthz: logged at an age of 2 s or more).
fn assert_no_cold_request(dir: &Path, warmup: f64) {
    let log = served(dir);
    let mut passed = std::collections::HashSet::new();
    for s in &log {
        if s.health {
            assert_eq!(s.agent, "corral-health-check", "{s:?}");
            if s.age >= warmup {
                passed.insert(s.pid);
            }
        } else {
            assert!(
                passed.contains(&s.pid) && s.age >= warmup,
                "a user request reached worker {} at age {:.3}s, before it passed its health \
                 check: {log:#?}",
                s.pid,
                s.age
            );
        }
    }
}

#[test]
fn a_worker_gets_no_user_request_before_its_health_check_passes() {
    let dir = shared_dir();
    write_file(dir.path(), "app.py", APP);
    let run = dir.path().join("run");
    let corral = Corral::start(&config(&run, dir.path(), "1", "2", "15s"), 1);
    let addr = corral.http_addr();
    // Requests from the very start, while the only worker is failing its checks: they wait
    // in the queue until it passes, then it serves them.
    let clients: Vec<_> = (0..3)
        .map(|_| thread::spawn(move || http(addr, "GET", "/", &[], b"")))
        .collect();
    for c in clients {
        let r = c.join().unwrap();
        assert_eq!(r.status, 200, "{}\n{}", r.text(), corral.log());
    }
    assert_no_cold_request(dir.path(), 2.0);
    let log = served(dir.path());
    assert!(
        log.iter().any(|s| s.health && s.age < 2.0),
        "the worker was checked while warming up: {log:#?}"
    );
    assert_eq!(log.iter().filter(|s| !s.health).count(), 3, "{log:#?}");
    assert!(
        corral.wait_log("worker passed its health check"),
        "{}",
        corral.log()
    );

    // A reload to release 2: its worker warms up for 2 s too, and the switch waits for it.
    // Requests during the reload are all answered, by release 1 until release 2 passed.
    std::fs::write(
        corral.config_path(),
        config(&run, dir.path(), "2", "2", "15s"),
    )
    .unwrap();
    let path = corral.config_path().display().to_string();
    let reload = thread::spawn(move || support::corral(&["reload", "-c", &path]));
    let mut releases = Vec::new();
    while !reload.is_finished() {
        let r = http(addr, "GET", "/", &[], b"");
        assert_eq!(r.status, 200, "{}\n{}", r.text(), corral.log());
        releases.push(r.text().split(' ').next().unwrap_or_default().to_owned());
    }
    let out = reload.join().unwrap();
    assert_eq!(out.code, Some(0), "{out:?}\n{}", corral.log());
    let r = http(addr, "GET", "/", &[], b"");
    assert!(r.text().starts_with("2 "), "{}", r.text());
    // Release 1 answered until release 2 had passed its checks, then release 2 alone.
    let switched = releases
        .iter()
        .position(|r| r == "2")
        .unwrap_or(releases.len());
    assert!(switched > 0, "release 2 answered at once");
    assert!(
        releases[switched..].iter().all(|r| r == "2")
            && releases[..switched].iter().all(|r| r == "1"),
        "answers during the reload, in order: {} of release 1, then {:?}",
        switched,
        &releases[switched..]
    );
    assert!(
        served(dir.path())
            .iter()
            .any(|s| s.health && s.release == "2" && s.age < 2.0),
        "release 2 was checked while warming up"
    );
    assert_no_cold_request(dir.path(), 2.0);
}

#[test]
fn a_reload_to_workers_that_never_pass_their_health_check_is_refused() {
    let dir = shared_dir();
    write_file(dir.path(), "app.py", APP);
    let run = dir.path().join("run");
    // Release 1 passes at once; release 2 never does within its start_timeout.
    let corral = Corral::start(&config(&run, dir.path(), "1", "0", "15s"), 1);
    let addr = corral.http_addr();
    let r = http(addr, "GET", "/", &[], b"");
    assert!(r.text().starts_with("1 "), "{}\n{}", r.text(), corral.log());
    std::fs::write(
        corral.config_path(),
        config(&run, dir.path(), "2", "3600", "2s"),
    )
    .unwrap();
    let path = corral.config_path().display().to_string();
    let out = support::corral(&["reload", "-c", &path]);
    assert_ne!(out.code, Some(0), "{out:?}\n{}", corral.log());
    assert!(
        out.stderr.contains("pool site") && out.stderr.contains("GET /healthz answered 503"),
        "{out:?}"
    );
    // Release 1 serves on; release 2 never got a user request.
    let r = http(addr, "GET", "/", &[], b"");
    assert!(r.text().starts_with("1 "), "{}", r.text());
    let log = served(dir.path());
    assert!(
        log.iter().any(|s| s.health && s.release == "2"),
        "release 2 was checked: {log:#?}"
    );
    assert!(
        !log.iter().any(|s| !s.health && s.release == "2"),
        "release 2 served a user request: {log:#?}"
    );
    let status = http(corral.status_ready_addr(), "GET", "/status?json", &[], b"").text();
    assert!(
        status.contains("\"applied\":false") && status.contains("answered 503"),
        "{status}"
    );
}

/// A php-cgi pool over FastCGI: the check runs the script the path names under the
/// context's root, and a user request sent while the checks fail waits in the queue until
/// one passes.
#[test]
fn a_php_cgi_worker_is_checked_over_fastcgi_and_serves_once_its_script_passes() {
    let dir = shared_dir();
    write_file(
        dir.path(),
        "health.php",
        "<?php $ok = file_exists(__DIR__ . '/healthy'); if (!$ok) { http_response_code(503); } \
         file_put_contents(__DIR__ . '/served.txt', ($ok ? 'health-ok' : 'health-fail') . \
         ' ' . $_SERVER['HTTP_USER_AGENT'] . \"\\n\", FILE_APPEND); echo $ok ? 'ok' : 'no';",
    );
    write_file(
        dir.path(),
        "index.php",
        "<?php file_put_contents(__DIR__ . '/served.txt', \"user\\n\", FILE_APPEND); echo 'hello';",
    );
    let config = format!(
        r#"
[server]
runtime_dir = "{run}"
grace = "5s"
kill_timeout = "2s"

[[listen]]
address = "127.0.0.1:0"
protocol = "http"

[pools.php]
command = ["php-cgi"]
mode = "static"
min = 1
max = 1
queue_timeout = "20s"
start_timeout = "20s"
health_check = "/health.php?from=corral"

[[contexts]]
pool = "php"
root = "{root}"
"#,
        run = dir.path().join("run").display(),
        root = dir.path().display(),
    );
    let corral = Corral::start(&config, 1);
    let log = || std::fs::read_to_string(dir.path().join("served.txt")).unwrap_or_default();
    let fails = || log().matches("health-fail").count();
    assert!(
        support::eventually(Duration::from_secs(10), || fails() >= 1),
        "the check ran the script:\n{}",
        corral.log()
    );
    assert!(
        log().contains("health-fail corral-health-check"),
        "{}",
        log()
    );
    let addr = corral.http_addr();
    let user = thread::spawn(move || http(addr, "GET", "/index.php", &[], b""));
    // The worker is checked again after the request was sent, and still has not served it.
    let seen = fails();
    assert!(
        support::eventually(Duration::from_secs(10), || fails() > seen + 1),
        "{}",
        corral.log()
    );
    assert!(
        !log().contains("user"),
        "served before it passed: {}",
        log()
    );
    std::fs::write(dir.path().join("healthy"), "").unwrap();
    let r = user.join().unwrap();
    assert_eq!(r.status, 200, "{}\n{}", r.text(), corral.log());
    assert_eq!(r.text(), "hello");
    let text = log();
    let passed = text.find("health-ok").expect("a check passed");
    assert!(text.find("user").is_some_and(|u| u > passed), "{text}");
}
