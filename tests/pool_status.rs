//! What the status page says about a pool after light use, with a real php-cgi pool:
//! `max children reached` counts only waits at the pool's limit (as php-fpm counts spawns it
//! could not make), not a request waiting for an on-demand pool's first worker.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing,
    missing_docs
)]

mod support;

use std::path::Path;
use std::thread;

use support::peers;
use support::server::{http, Corral};

fn config(run: &Path, root: &Path, pool: &str) -> String {
    format!(
        r#"
[server]
runtime_dir = "{run}"
grace = "2s"
kill_timeout = "2s"

[[listen]]
address = "127.0.0.1:0"
protocol = "http"

[status]
address = "127.0.0.1:0"

[pools.php]
{pool}
queue_timeout = "20s"

[[contexts]]
pool = "php"
root = "{root}"
"#,
        run = run.display(),
        root = root.display()
    )
}

/// The value of `label:` in the text page (its first occurrence).
fn field(text: &str, label: &str) -> Option<String> {
    let prefix = format!("{label}:");
    text.lines()
        .find(|l| l.starts_with(&prefix))
        .map(|l| l[prefix.len()..].trim().to_owned())
}

#[test]
fn max_children_reached_counts_only_waits_at_the_limit() {
    let dir = peers::shared_dir();
    peers::write_file(dir.path(), "pid.php", "<?php echo getmypid();");
    peers::write_file(
        dir.path(),
        "sleep.php",
        "<?php usleep(500000); echo getmypid();",
    );
    let pool = "command = [\"php-cgi\"]\nmode = \"ondemand\"\nmax = 2";
    let corral = Corral::start(&config(&dir.path().join("run"), dir.path(), pool), 1);
    let status = corral.status_ready_addr();
    let page = || http(status, "GET", "/status", &[], b"").text();

    // One request to the empty pool: it waits for the first worker, at no limit.
    let r = http(corral.http_addr(), "GET", "/pid.php", &[], b"");
    assert_eq!(r.status, 200, "{}", corral.log());
    let text = page();
    assert_eq!(
        field(&text, "accepted conn").as_deref(),
        Some("1"),
        "{text}"
    );
    assert_eq!(field(&text, "queued total").as_deref(), Some("1"), "{text}");
    assert_eq!(
        field(&text, "max children reached").as_deref(),
        Some("0"),
        "{text}"
    );

    // Three at once for two workers: the third waits at the limit, which counts.
    let addr = corral.http_addr();
    let all: Vec<_> = (0..3)
        .map(|_| thread::spawn(move || http(addr, "GET", "/sleep.php", &[], b"").status))
        .collect();
    for t in all {
        assert_eq!(t.join().unwrap(), 200, "{}", corral.log());
    }
    let text = page();
    let reached: u64 = field(&text, "max children reached")
        .unwrap()
        .parse()
        .unwrap();
    assert_eq!(reached, 1, "{text}");
}
