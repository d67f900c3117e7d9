//! Readiness against liveness at a graceful stop, with a real php-cgi pool: `/ready` on the
//! status listener answers 200 while corral serves and 503 from the moment SIGTERM arrives,
//! while `/ping` keeps answering 200, through `shutdown_delay` (during which the front
//! listener still accepts and requests are served) and through the drain that follows.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing,
    missing_docs
)]

mod support;

use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::thread;
use std::time::Duration;

use nix::sys::signal::Signal;
use tokio::time::Instant;

use support::server::{http, Corral};
use support::{eventually, peers};

fn config(run: &Path, root: &Path, delay: &str) -> String {
    format!(
        r#"
[server]
runtime_dir = "{run}"
grace = "20s"
kill_timeout = "2s"
shutdown_delay = "{delay}"

[[listen]]
address = "127.0.0.1:0"
protocol = "http"

[status]
address = "127.0.0.1:0"

[pools.php]
command = ["php-cgi"]
mode = "static"
max = 1

[[contexts]]
pool = "php"
root = "{root}"
"#,
        run = run.display(),
        root = root.display()
    )
}

fn status_of(addr: SocketAddr, target: &str) -> (u16, String) {
    let r = http(addr, "GET", target, &[], b"");
    (r.status, r.text())
}

/// Starts corral with `delay` and waits until its one worker answers.
fn start(dir: &Path, delay: &str) -> (Corral, SocketAddr) {
    peers::write_file(dir, "pid.php", "<?php echo getmypid();");
    // Says it started (a marker file), then holds its worker until the test creates `gate`.
    peers::write_file(
        dir,
        "hold.php",
        "<?php file_put_contents(__DIR__ . '/started', getmypid()); \
         for ($i = 0; $i < 3000 && !file_exists(__DIR__ . '/gate'); $i++) { usleep(10000); } \
         echo 'held';",
    );
    let corral = Corral::start(&config(&dir.join("run"), dir, delay), 1);
    let status = corral.status_ready_addr();
    let r = http(corral.http_addr(), "GET", "/pid.php", &[], b"");
    assert_eq!(r.status, 200, "{}", corral.log());
    assert_eq!(status_of(status, "/ready"), (200, "ready\n".to_owned()));
    assert_eq!(status_of(status, "/ping"), (200, "pong\n".to_owned()));
    (corral, status)
}

#[test]
fn during_shutdown_delay_ready_fails_while_ping_and_requests_are_served() {
    let dir = peers::shared_dir();
    let (mut corral, status) = start(dir.path(), "4s");
    let http_addr = corral.http_addr();
    let signalled = Instant::now();
    corral.signal(Signal::SIGTERM);
    assert!(
        eventually(Duration::from_secs(2), || status_of(status, "/ready").0
            == 503),
        "/ready never turned 503 after SIGTERM:\n{}",
        corral.log()
    );
    assert_eq!(status_of(status, "/ready").1, "stopping\n");
    assert_eq!(status_of(status, "/ping"), (200, "pong\n".to_owned()));
    // /ready answers any Host, as /ping does: a load balancer probes by address.
    let r = http(status, "GET", "/ready", &[("Host", "lb.example")], b"");
    assert_eq!(r.status, 503);
    // Still accepting and serving: new connections get their answers.
    for _ in 0..3 {
        let r = http(http_addr, "GET", "/pid.php", &[], b"");
        assert_eq!(r.status, 200, "{}", corral.log());
    }
    assert!(
        signalled.elapsed() < Duration::from_secs(4),
        "the checks took longer than the delay; they proved nothing"
    );
    assert!(corral.wait_log("still accepting for shutdown_delay"));
    assert!(
        corral.wait_exited(Duration::from_secs(15)),
        "corral did not exit:\n{}",
        corral.log()
    );
    assert!(
        signalled.elapsed() >= Duration::from_secs(4),
        "corral stopped before shutdown_delay was over"
    );
    let log = corral.log();
    let delay = log.find("still accepting for shutdown_delay").unwrap();
    let drain = log.find("no longer accepting").expect("the drain began");
    assert!(delay < drain, "{log}");
}

#[test]
fn ready_fails_at_sigterm_and_ping_answers_through_the_drain() {
    let dir = peers::shared_dir();
    let (mut corral, status) = start(dir.path(), "0s");
    let http_addr = corral.http_addr();
    // A request in flight keeps the drain going until the test lets it finish.
    let held = thread::spawn(move || http(http_addr, "GET", "/hold.php", &[], b""));
    assert!(
        eventually(Duration::from_secs(10), || dir
            .path()
            .join("started")
            .exists()),
        "hold.php never ran:\n{}",
        corral.log()
    );
    corral.signal(Signal::SIGTERM);
    assert!(
        corral.wait_log("no longer accepting"),
        "the drain never began:\n{}",
        corral.log()
    );
    assert_eq!(status_of(status, "/ready"), (503, "stopping\n".to_owned()));
    assert_eq!(status_of(status, "/ping"), (200, "pong\n".to_owned()));
    // The status page answers too, with the request still in flight.
    let (code, page) = status_of(status, "/status");
    assert_eq!(code, 200);
    assert!(page.contains("in flight:            1"), "{page}");
    // The front listener is closed: a new connection is refused.
    assert!(
        eventually(Duration::from_secs(5), || TcpStream::connect(http_addr)
            .is_err()),
        "the front listener still accepts during the drain"
    );
    std::fs::write(dir.path().join("gate"), "").unwrap();
    let r = held.join().unwrap();
    assert_eq!(
        (r.status, r.text()),
        (200, "held".to_owned()),
        "{}",
        corral.log()
    );
    assert!(
        corral.wait_exited(Duration::from_secs(15)),
        "corral did not exit:\n{}",
        corral.log()
    );
}
