//! scripts/build-pgo.sh's training load (`--train BINARY`), served by the binary this test was
//! built with: every run of it gets its requests answered with no error, through each front
//! listener and to each backend protocol. The load is what a profile-guided build optimises
//! for; a configuration key or a `corral bench` flag it uses going stale would otherwise go
//! unnoticed until someone builds a release with it. (The two release builds around the load
//! take minutes, and are not run here.)

mod support;

use std::process::Command;
use std::time::Duration;

#[test]
fn the_training_load_runs_clean_through_every_front_and_backend() {
    let mut cmd = Command::new("bash");
    cmd.arg(concat!(env!("CARGO_MANIFEST_DIR"), "/scripts/build-pgo.sh"))
        .args(["--train", support::CORRAL])
        .env("TRAIN_SECS", "1");
    let out = support::run(cmd, Duration::from_secs(240));
    assert_eq!(
        out.code,
        Some(0),
        "the training load failed:\n{}\n{}",
        out.stdout,
        out.stderr
    );
    // Each run prints one table row per concurrency level (1 and 16): target, c, requests,
    // req/s, five latencies, errors, body bytes.
    let rows: Vec<Vec<&str>> = out
        .stdout
        .lines()
        .map(|l| l.split_whitespace().collect::<Vec<_>>())
        .filter(|f| f.len() == 11 && f[1].parse::<u32>().is_ok())
        .collect();
    let runs = [
        "http GET /index.php, 1s per run, 1 round, warm-up 0s, kept connections",
        "http GET /index.php, 1s per run, 1 round, warm-up 0s, a connection per request",
        "http POST /index.php",
        "http GET /static/page.css",
        "http GET /app/some/path",
        "http GET /scgi/x",
        "http GET /lsapi/x",
        "fastcgi GET /index.php, 1s per run, 1 round, warm-up 0s, a connection per request",
        "fastcgi GET /index.php, 1s per run, 1 round, warm-up 0s, kept connections",
        "scgi GET /index.php",
    ];
    for run in runs {
        assert!(
            out.stdout.contains(&format!("corral bench: {run}")),
            "no run `{run}` in:\n{}",
            out.stdout
        );
    }
    assert_eq!(rows.len(), 2 * runs.len(), "{}", out.stdout);
    for row in &rows {
        let requests: u64 = row[2].parse().unwrap();
        assert!(requests > 0, "a level answered nothing: {row:?}");
        assert_eq!(row[9], "0", "a level had errors: {row:?}");
    }
    // The static file came back whole: its 1,700 bytes per request, not a 13-byte null answer.
    let static_rows = out
        .stdout
        .split("corral bench: http GET /static/page.css")
        .nth(1)
        .unwrap();
    let first = static_rows
        .lines()
        .map(|l| l.split_whitespace().collect::<Vec<_>>())
        .find(|f| f.len() == 11 && f[1].parse::<u32>().is_ok())
        .unwrap();
    let (requests, bytes): (u64, u64) = (first[2].parse().unwrap(), first[10].parse().unwrap());
    assert_eq!(bytes / requests, 1700, "{first:?}");
}
