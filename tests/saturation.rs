//! Saturation as every status format shows it, under a load that fills the queue of a real
//! php-cgi pool of one worker: the configured limits, the ages of the oldest request in
//! flight and of the oldest queued one, the front listener's kernel accept queue, the
//! queue-wait histogram, and the requests refused with the queue full or timed out in it; in
//! the text page, JSON, OpenMetrics and the HTML page (run in headless Chromium).

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing,
    missing_docs
)]

mod support;

use std::net::SocketAddr;
use std::path::Path;
use std::process::Command;
use std::thread;
use std::time::Duration;

use support::server::{http, Corral};
use support::{eventually, peers};

/// The listen backlog configured on the front listener.
const BACKLOG: u64 = 37;

fn config(run: &Path, root: &Path) -> String {
    format!(
        r#"
[server]
runtime_dir = "{run}"
grace = "2s"
kill_timeout = "2s"

[[listen]]
address = "127.0.0.1:0"
protocol = "http"
backlog = {BACKLOG}

[status]
address = "127.0.0.1:0"

[pools.php]
command = ["php-cgi"]
mode = "static"
max = 1
queue_size = 2
queue_timeout = "12s"

[[contexts]]
pool = "php"
root = "{root}"
"#,
        run = run.display(),
        root = root.display()
    )
}

fn get(status: SocketAddr, target: &str) -> String {
    let r = http(status, "GET", target, &[], b"");
    assert_eq!(r.status, 200, "{target}: {}", r.text());
    r.text()
}

/// The value of `label:` in a block of the text page.
fn field<'a>(block: &'a str, label: &str) -> Option<&'a str> {
    let prefix = format!("{label}:");
    block
        .lines()
        .find(|l| l.starts_with(&prefix))
        .map(|l| l[prefix.len()..].trim())
}

/// The text page's pool block and its listener block.
fn text_blocks(page: &str) -> (&str, &str) {
    let at = page
        .find("\nlistener:")
        .unwrap_or_else(|| panic!("no listener block in {page}"));
    (&page[..at], &page[at + 1..])
}

/// The raw JSON value after `"key":` (a number, `null`, or an array), in `json`.
fn json_value<'a>(json: &'a str, key: &str) -> Option<&'a str> {
    let at = json.find(&format!("\"{key}\":"))? + key.len() + 3;
    let rest = &json[at..];
    let end = if rest.starts_with('[') {
        rest.find("]]")
            .map(|i| i + 2)
            .or_else(|| rest.find(']').map(|i| i + 1))?
    } else {
        rest.find([',', '}'])?
    };
    Some(&rest[..end])
}

fn json_number(json: &str, key: &str) -> Option<f64> {
    json_value(json, key)?.parse().ok()
}

/// The value of the sample that starts with `series ` in an OpenMetrics exposition.
fn sample(metrics: &str, series: &str) -> Option<f64> {
    metrics
        .lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' '))
        .and_then(|v| v.parse().ok())
}

/// Runs headless Chromium on `url` and returns the DOM after its script ran a few rounds.
fn chromium_dom(url: &str) -> String {
    let profile = tempfile::tempdir().unwrap();
    let mut cmd = Command::new("/usr/bin/chromium");
    cmd.args([
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--disable-dev-shm-usage",
        "--virtual-time-budget=3000",
        "--dump-dom",
    ])
    .arg(format!("--user-data-dir={}", profile.path().display()))
    .arg(url);
    let out = support::run(cmd, Duration::from_secs(30));
    assert_eq!(out.code, Some(0), "chromium failed: {}", out.stderr);
    out.stdout
}

/// The text of the element with `id` in `dom`.
fn text_by_id<'a>(dom: &'a str, id: &str) -> Option<&'a str> {
    let start = dom.find(&format!("id=\"{id}\">"))? + id.len() + 6;
    let rest = &dom[start..];
    Some(&rest[..rest.find('<')?])
}

#[test]
fn a_full_queue_shows_in_every_status_format() {
    let dir = peers::shared_dir();
    peers::write_file(dir.path(), "pid.php", "<?php echo getmypid();");
    // Says it started (a marker file), then holds the worker until the test creates `gate`.
    peers::write_file(
        dir.path(),
        "hold.php",
        "<?php file_put_contents(__DIR__ . '/started', getmypid()); \
         for ($i = 0; $i < 3000 && !file_exists(__DIR__ . '/gate'); $i++) { usleep(10000); } \
         echo 'held';",
    );
    let corral = Corral::start(&config(&dir.path().join("run"), dir.path()), 1);
    let status = corral.status_ready_addr();
    let front = corral.http_addr();
    assert_eq!(http(front, "GET", "/pid.php", &[], b"").status, 200);
    let send = |target: &'static str| thread::spawn(move || http(front, "GET", target, &[], b""));

    // Idle: nothing in flight or queued, so no ages.
    let json = get(status, "/status?json");
    assert_eq!(
        json_value(&json, "oldest in flight"),
        Some("null"),
        "{json}"
    );
    assert_eq!(json_value(&json, "oldest queued"), Some("null"), "{json}");

    // The one worker held, two requests queued (queue_size 2), a third refused at once.
    let held = send("/hold.php");
    assert!(
        eventually(Duration::from_secs(10), || dir
            .path()
            .join("started")
            .exists()),
        "hold.php never ran:\n{}",
        corral.log()
    );
    let queued: Vec<_> = (0..2).map(|_| send("/pid.php")).collect();
    assert!(
        eventually(Duration::from_secs(10), || field(
            &get(status, "/status"),
            "listen queue"
        ) == Some("2")),
        "two requests never queued:\n{}",
        get(status, "/status")
    );
    let refused = http(front, "GET", "/pid.php", &[], b"");
    assert_eq!(refused.status, 503, "{}", refused.text());
    // Aged while the test looks: both ages grow.
    assert!(eventually(Duration::from_secs(5), || {
        json_number(&get(status, "/status?json"), "oldest queued").is_some_and(|a| a >= 0.2)
    }));

    let page = get(status, "/status");
    let (pool, listener) = text_blocks(&page);
    let in_flight: f64 = field(pool, "oldest in flight").unwrap().parse().unwrap();
    let queued_for: f64 = field(pool, "oldest queued").unwrap().parse().unwrap();
    assert!(queued_for >= 0.2, "{pool}");
    assert!(in_flight >= queued_for, "{pool}");
    assert_eq!(field(pool, "max workers"), Some("1"), "{pool}");
    assert_eq!(field(pool, "max conns"), Some("1"), "{pool}");
    assert_eq!(field(pool, "listen queue len"), Some("2"), "{pool}");
    assert_eq!(field(pool, "rejected queue full"), Some("1"), "{pool}");
    assert_eq!(field(listener, "protocol"), Some("http"), "{listener}");
    assert_eq!(field(listener, "listener"), Some(&*front.to_string()));
    let queues: u64 = field(listener, "accept queues").unwrap().parse().unwrap();
    assert!(queues >= 1, "{listener}");
    assert_eq!(field(listener, "accept queue"), Some("0"), "{listener}");
    assert_eq!(
        field(listener, "accept queue len"),
        Some(&*(BACKLOG * queues).to_string()),
        "{listener}"
    );

    let json = get(status, "/status?json&full");
    assert!(
        json_number(&json, "oldest in flight").unwrap() >= 0.2,
        "{json}"
    );
    assert!(
        json_number(&json, "oldest queued").unwrap() >= 0.2,
        "{json}"
    );
    assert_eq!(json_number(&json, "max workers"), Some(1.0), "{json}");
    assert_eq!(json_number(&json, "max conns"), Some(1.0), "{json}");
    assert_eq!(json_number(&json, "listen queue len"), Some(2.0), "{json}");
    assert_eq!(
        json_number(&json, "rejected queue full"),
        Some(1.0),
        "{json}"
    );
    assert!(json.contains("\"listeners\":[{\"listener\":"), "{json}");
    assert_eq!(json_number(&json, "accept queue"), Some(0.0), "{json}");
    assert_eq!(
        json_number(&json, "accept queue len"),
        Some((BACKLOG * queues) as f64),
        "{json}"
    );

    let metrics = get(status, "/metrics");
    let pool_label = "{pool=\"php\"}";
    let m = |name: &str| sample(&metrics, &format!("corral_{name}{pool_label}"));
    assert!(m("oldest_in_flight_seconds").unwrap() >= 0.2, "{metrics}");
    assert!(m("oldest_queued_seconds").unwrap() >= 0.2, "{metrics}");
    assert_eq!(m("max_workers"), Some(1.0));
    assert_eq!(m("max_conns"), Some(1.0));
    assert_eq!(m("queue_size"), Some(2.0));
    assert_eq!(
        sample(
            &metrics,
            "corral_requests_rejected_total{pool=\"php\",reason=\"queue_full\"}"
        ),
        Some(1.0),
        "{metrics}"
    );
    let listener_label = format!("{{listener=\"{front}\",protocol=\"http\"}}");
    assert_eq!(
        sample(
            &metrics,
            &format!("corral_listener_accept_queue{listener_label}")
        ),
        Some(0.0),
        "{metrics}"
    );
    assert_eq!(
        sample(
            &metrics,
            &format!("corral_listener_accept_queue_max{listener_label}")
        ),
        Some((BACKLOG * queues) as f64),
        "{metrics}"
    );

    // The page for people, while the queue is still full.
    let url = format!("http://{status}/status?html");
    let dom = chromium_dom(&url);
    let tile = |id: &str| text_by_id(&dom, id).unwrap_or_else(|| panic!("no #{id} in {dom}"));
    assert_eq!(tile("maxworkers-php"), "1");
    assert_eq!(tile("refused-php"), "1");
    assert_eq!(tile("gone-php"), "0", "no front went away while queued");
    for id in ["oldest-inflight-php", "oldest-queued-php"] {
        let age = tile(id);
        assert!(
            age.ends_with(" ms") || age.ends_with(" s"),
            "{id} reads {age:?}"
        );
    }
    assert_eq!(tile(&format!("accept-{front}")), "0");
    assert!(dom.contains("id=\"qwait-php\""), "{dom}");

    // Before the last request: what the histogram holds (the warm-up may have waited for
    // the worker to start).
    let (pool, _) = text_blocks(&page);
    let before = field(pool, "queue wait buckets").unwrap().to_owned();
    let count_before: u64 = field(pool, "queue wait count").unwrap().parse().unwrap();

    // The two queued requests time out in the queue.
    for t in queued {
        let r = t.join().unwrap();
        assert_eq!(r.status, 503, "{}", r.text());
    }
    // One more waits while the worker is held, then is served: its wait is in the histogram.
    let last = send("/pid.php");
    assert!(eventually(Duration::from_secs(5), || {
        json_number(&get(status, "/status?json"), "oldest queued").is_some_and(|a| a >= 0.3)
    }));
    std::fs::write(dir.path().join("gate"), "").unwrap();
    assert_eq!(held.join().unwrap().status, 200);
    assert_eq!(last.join().unwrap().status, 200);

    // Every format counts the timeouts and shows the last request's wait (over 0.3 s) in
    // the histogram's buckets, the timed-out ones not being counted there.
    let page = get(status, "/status");
    let (pool, _) = text_blocks(&page);
    assert_eq!(field(pool, "queue timeouts"), Some("2"), "{pool}");
    assert_eq!(field(pool, "oldest queued"), Some("-"), "{pool}");
    let count = count_before + 1;
    assert_eq!(field(pool, "queue wait count"), Some(&*count.to_string()));
    let buckets = field(pool, "queue wait buckets").unwrap();
    let at = |b: &str, le: &str| -> u64 {
        b.split(' ')
            .find_map(|x| x.strip_prefix(&format!("{le}:")))
            .unwrap_or_else(|| panic!("no {le} bucket in {b}"))
            .parse()
            .unwrap()
    };
    let short = at(&before, "0.25");
    assert_eq!(at(buckets, "0.25"), short, "{before} then {buckets}");
    assert_eq!(at(buckets, "10"), count, "{buckets}");
    let sum: f64 = field(pool, "queue wait sum").unwrap().parse().unwrap();
    assert!(sum >= 0.3, "{pool}");

    let json = get(status, "/status?json");
    assert_eq!(json_number(&json, "queue timeouts"), Some(2.0), "{json}");
    assert_eq!(json_number(&json, "queue wait count"), Some(count as f64));
    let b = json_value(&json, "queue wait buckets").unwrap();
    assert!(
        b.contains(&format!("[0.25,{short}]")) && b.contains(&format!("[10,{count}]")),
        "{b}"
    );

    let metrics = get(status, "/metrics");
    assert_eq!(
        sample(
            &metrics,
            "corral_requests_rejected_total{pool=\"php\",reason=\"queue_timeout\"}"
        ),
        Some(2.0),
        "{metrics}"
    );
    assert_eq!(
        sample(
            &metrics,
            "corral_queue_wait_seconds_bucket{pool=\"php\",le=\"0.25\"}"
        ),
        Some(short as f64),
        "{metrics}"
    );
    assert_eq!(
        sample(&metrics, "corral_oldest_queued_seconds{pool=\"php\"}"),
        Some(0.0),
        "{metrics}"
    );

    let dom = chromium_dom(&url);
    assert_eq!(text_by_id(&dom, "qtimeouts-php"), Some("2"), "{dom}");
    assert_eq!(text_by_id(&dom, "oldest-queued-php"), Some("-"), "{dom}");
    let table = &dom[dom.find("id=\"qwait-php\"").unwrap()..];
    assert!(
        table.contains(&format!("time queued ({count} requests")),
        "{table}"
    );
}
