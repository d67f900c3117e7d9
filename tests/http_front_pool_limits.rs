//! A pool's limits as the `http` listener answers them, in front of a threaded flup WSGI app:
//! `max_conns` counted at the backend, queue overflow into 503 with Retry-After at once,
//! `queue_timeout`, and a hanging backend answered with 504.

mod support;

use std::thread;
use std::time::Duration;

use support::http_front::{config, flup};
use support::peers;
use support::server::{http, Corral};
use support::weak::AT_ONCE;
use tokio::time::Instant;

/// Fires `n` GETs of `path` at once and returns their statuses and Retry-After values.
fn burst(addr: std::net::SocketAddr, path: &'static str, n: usize) -> Vec<(u16, Option<String>)> {
    let handles: Vec<_> = (0..n)
        .map(|_| {
            thread::spawn(move || {
                let r = http(addr, "GET", path, &[], b"");
                (r.status, r.header("retry-after").map(str::to_owned))
            })
        })
        .collect();
    handles.into_iter().map(|h| h.join().unwrap()).collect()
}

#[test]
fn max_conns_holds_exactly_at_the_backend() {
    let dir = peers::shared_dir();
    let app = flup(dir.path());
    let corral = Corral::start(
        &config(
            dir.path(),
            &format!(
                "servers = [\"unix:{}\"]\nconcurrency = 8\nmax_conns = 3\nqueue_size = 64",
                app.socket.display()
            ),
            "",
        ),
        1,
    );
    let addr = corral.http_addr();
    let statuses = burst(addr, "/slow", 12);
    assert!(statuses.iter().all(|(s, _)| *s == 200), "{statuses:?}");
    let most = http(addr, "GET", "/max", &[], b"");
    assert_eq!(
        most.text(),
        "3",
        "the backend saw more than max_conns at once"
    );
}

#[test]
fn a_full_queue_answers_503_with_retry_after_at_once() {
    let dir = peers::shared_dir();
    let app = flup(dir.path());
    let corral = Corral::start(
        &config(
 dir.path(),
            &format!(
                "servers = [\"unix:{}\"]\nconcurrency = 1\nmax_conns = 1\nqueue_size = 1\nqueue_timeout = \"10s\"",
                app.socket.display()
            ),
            "\n[status]\naddress = \"127.0.0.1:0\"",
        ),
        1,
    );
    let (addr, status) = (corral.http_addr(), corral.status_ready_addr());
    let entered = dir.path().join("entered");
    let queued = || {
        let text = http(status, "GET", "/status", &[], b"").text();
        text.lines()
            .find_map(|l| l.strip_prefix("listen queue:"))
            .map(|v| v.trim().to_owned())
            .unwrap_or_else(|| panic!("no listen queue in:\n{text}"))
    };
    let hold = move || thread::spawn(move || http(addr, "GET", "/hold", &[], b""));
    // One request holds the only slot (it is inside the app), one waits in the queue.
    let first = hold();
    assert!(
        support::eventually(Duration::from_secs(10), || entered.exists()),
        "the first request never reached the app\n{}",
        corral.log()
    );
    let second = hold();
    assert!(
        support::eventually(Duration::from_secs(10), || queued() == "1"),
        "the second request never queued\n{}",
        corral.log()
    );
    // The queue is full and stays full (the slot is held until the gate opens): the next ones
    // are refused at once, long before the 10 s queue_timeout that would refuse them anyway.
    for _ in 0..2 {
        let started = Instant::now();
        let r = http(addr, "GET", "/hold", &[], b"");
        let took = started.elapsed();
        assert_eq!(r.status, 503, "{}", corral.log());
        assert_eq!(r.header("retry-after"), Some("1"));
        assert!(took < AT_ONCE, "a 503 for a full queue took {took:?}");
    }
    assert!(corral.wait_log("the queue is full"), "{}", corral.log());
    assert_eq!(queued(), "1", "a refused request stayed in the queue");
    std::fs::write(dir.path().join("gate"), b"").unwrap();
    for held in [first, second] {
        let r = held.join().unwrap();
        assert_eq!((r.status, r.text().as_str()), (200, "held"));
    }
    assert_eq!(
        std::fs::read_to_string(&entered).unwrap(),
        "xx",
        "only the two admitted requests reached the app"
    );
}

#[test]
fn queue_timeout_answers_503() {
    let dir = peers::shared_dir();
    let app = flup(dir.path());
    let corral = Corral::start(
        &config(
 dir.path(),
            &format!(
                "servers = [\"unix:{}\"]\nconcurrency = 1\nmax_conns = 1\nqueue_size = 8\nqueue_timeout = \"100ms\"",
                app.socket.display()
            ),
            "",
        ),
        1,
    );
    let statuses = burst(corral.http_addr(), "/slow", 3);
    assert_eq!(
        statuses.iter().filter(|(s, _)| *s == 200).count(),
        1,
        "{statuses:?}"
    );
    assert_eq!(
        statuses.iter().filter(|(s, _)| *s == 503).count(),
        2,
        "{statuses:?}"
    );
    assert!(
        corral.wait_log("no slot came free within the queue timeout"),
        "{}",
        corral.log()
    );
}

#[test]
fn a_hanging_backend_is_answered_504() {
    let dir = peers::shared_dir();
    // Accepts connections and never answers.
    let socket = dir.path().join("hang.sock");
    let listener = std::os::unix::net::UnixListener::bind(&socket).unwrap();
    // Every connection is held open until the test process ends.
    thread::spawn(move || {
        let mut held = Vec::new();
        for s in listener.incoming() {
            held.push(s);
        }
    });
    let corral = Corral::start(
        &config(
            dir.path(),
            &format!(
                "servers = [\"unix:{}\"]\nfirst_byte_timeout = \"300ms\"\nrequest_timeout = \"2s\"",
                socket.display()
            ),
            "",
        ),
        1,
    );
    let r = http(corral.http_addr(), "GET", "/anything", &[], b"");
    assert_eq!(r.status, 504, "{}", corral.log());
}
