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
use std::time::Duration;

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
    // Says it started (a marker file named by `?tag=`), then holds its worker until the
    // test creates `gate`.
    peers::write_file(
        dir.path(),
        "hold.php",
        "<?php file_put_contents(__DIR__ . '/started-' . basename($_GET['tag']), getmypid()); \
         for ($i = 0; $i < 3000 && !file_exists(__DIR__ . '/gate'); $i++) { usleep(10000); } \
         echo getmypid();",
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

    // Three at once for two workers: the third waits at the limit, which counts. Both
    // workers are held (each request said it started) before the third is sent, and until
    // the status page shows it queued.
    let addr = corral.http_addr();
    let hold = |tag: &'static str| {
        thread::spawn(move || http(addr, "GET", &format!("/hold.php?tag={tag}"), &[], b"").status)
    };
    let mut all = vec![hold("a"), hold("b")];
    let started = |tag: &str| dir.path().join(format!("started-{tag}")).exists();
    assert!(
        support::eventually(Duration::from_secs(20), || started("a") && started("b")),
        "two workers never ran hold.php:\n{}",
        corral.log()
    );
    all.push(hold("c"));
    assert!(
        support::eventually(Duration::from_secs(10), || field(&page(), "listen queue")
            .as_deref()
            == Some("1")),
        "the third request never queued:\n{}\n{}",
        page(),
        corral.log()
    );
    assert!(!started("c"));
    std::fs::write(dir.path().join("gate"), "").unwrap();
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

/// A pool whose interpreter is missing never starts a worker: spawns are retried with
/// backoff while its clients get 503s. The status page (text and JSON) and systemd's
/// STATUS= line say so with the reason, and no failed spawn leaves its socket behind.
#[test]
fn a_pool_whose_interpreter_is_missing_says_it_never_started() {
    let dir = peers::shared_dir();
    let missing = dir.path().join("bin/php-cgi9");
    let pool = format!(
        "command = [\"{}\"]\nmode = \"static\"\nmax = 2\nstart_timeout = \"2s\"",
        missing.display()
    );
    let notify = dir.path().join("notify.sock");
    let socket = std::os::unix::net::UnixDatagram::bind(&notify).unwrap();
    let run = dir.path().join("run");
    let corral = Corral::start_after(
        &config(&run, dir.path(), &pool),
        1,
        "",
        &[("NOTIFY_SOCKET", notify.display().to_string().as_str())],
    );
    let status = corral.status_ready_addr();
    let page = |target: &str| http(status, "GET", target, &[], b"").text();
    assert!(
        support::eventually(Duration::from_secs(10), || field(
            &page("/status"),
            "never started"
        )
        .as_deref()
            == Some("yes")),
        "{}\n{}",
        page("/status"),
        corral.log()
    );
    let text = page("/status");
    assert_eq!(
        field(&text, "workers started").as_deref(),
        Some("0"),
        "{text}"
    );
    let failure = field(&text, "start failure").unwrap();
    assert!(
        failure.contains("php-cgi9") && failure.contains("No such file"),
        "{text}"
    );
    let json = page("/status?json");
    assert!(json.contains("\"never started\":true"), "{json}");
    assert!(json.contains("php-cgi9"), "{json}");
    // READY=1 comes once the wait for the pool's workers is over, with the pool named.
    let seen = support::notify_until(&socket, "never started a worker", Duration::from_secs(20));
    let line = seen.last().unwrap();
    assert!(
        line.contains("pool php never started a worker") && line.contains("php-cgi9"),
        "{line}"
    );
    // Several spawns failed by now; none left its socket.
    let spawns: u64 = field(&text, "spawn failures").unwrap().parse().unwrap();
    assert!(spawns >= 2, "{text}");
    let left: Vec<_> = std::fs::read_dir(&run)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".sock"))
        .collect();
    assert!(left.is_empty(), "sockets left in the runtime dir: {left:?}");
}
