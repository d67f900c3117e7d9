//! Worker mode's execution time limit (max_execution_time, here 1 s set by the worker
//! script): each request gets the whole limit afresh, however much CPU time the requests
//! before it spent, and a request that runs past it is answered 500 and its worker replaced.
//! Real PHP (libphp8.2-embed). The worker leaves a request's timer running after its end
//! and re-arms it at the next start (workers/php/src/sapi.c): these are the cases that
//! would break if a start did not replace the timer, or if it fired between requests.

mod support;

use support::native::NativeSite;
use support::peers::{shared_dir, write_file};

/// The worker script: a 1 s limit, then a handler that spends `ms` milliseconds of CPU time
/// (the process's, as the limit counts it: on a busy machine wall time says little).
const WORKER: &str = r#"<?php
function cpu_ms(): float {
    $u = getrusage();
    return ($u['ru_utime.tv_sec'] + $u['ru_stime.tv_sec']) * 1000
        + ($u['ru_utime.tv_usec'] + $u['ru_stime.tv_usec']) / 1000;
}
set_time_limit(1);
while (corral_handle_request(function () {
    $until = cpu_ms() + (int) ($_GET['ms'] ?? 0);
    $n = 0;
    while (cpu_ms() < $until) { $n++; }
    echo 'done ', getmypid();
})) {}
"#;

fn site() -> NativeSite {
    let dir = shared_dir();
    let root = dir.path().join("www");
    std::fs::create_dir_all(&root).unwrap();
    write_file(&root, "worker.php", WORKER);
    NativeSite::start(
        dir,
        "app",
        "worker_script = \"ROOT/worker.php\"\nmax = 1",
        "index = [\"worker.php\"]\nfront_controller = \"/worker.php\"",
    )
}

fn pid_of(answer: &str) -> String {
    answer.strip_prefix("done ").unwrap_or(answer).to_owned()
}

#[test]
fn each_request_gets_the_whole_limit_afresh() {
    let site = site();
    let first = pid_of(&site.ok("/?ms=0"));
    // Six requests of 0.3 s each: 1.8 s of CPU time in one worker, each well within 1 s.
    for i in 0..6 {
        let r = site.get("/?ms=300");
        assert_eq!(
            (r.status, pid_of(&r.text())),
            (200, first.clone()),
            "request {i}\n{}",
            site.corral.log()
        );
        // An idle gap between requests spends none of the next one's time either.
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
}

#[test]
fn a_request_past_the_limit_is_answered_500_and_its_worker_replaced() {
    let site = site();
    let first = pid_of(&site.ok("/?ms=0"));
    // Well within the limit each, not together: the second has all of it again.
    assert_eq!(pid_of(&site.ok("/?ms=800")), first);
    assert_eq!(pid_of(&site.ok("/?ms=800")), first);
    let r = site.get("/?ms=3000");
    assert_eq!(r.status, 500, "{}\n{}", r.text(), site.corral.log());
    assert!(
        site.corral.wait_log("Maximum execution time"),
        "{}",
        site.corral.log()
    );
    let next = pid_of(&site.ok("/?ms=0"));
    assert_ne!(next, first, "a fresh worker serves");
}
