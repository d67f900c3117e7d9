//! ARCHITECTURE.md invariant 15 end to end: status never waits on a worker or a driver.
//!
//! Two pools held at start until the test opens a gate: an SCGI app (the `scgi` package)
//! that binds its `{socket}` only after the gate, so its driver is waiting for a worker that
//! does not accept yet, and a WSGI app that blocks at import, so its preloader is loading
//! it and no worker is forked. While both are held there, every status page (text,
//! `?full`, JSON, OpenMetrics, `/ping`) answers at once and shows no worker started; once
//! the gate opens they start and serve.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing,
    missing_docs
)]

mod support;

use std::path::Path;
use std::time::Duration;

use support::invariants::{field, status_text, timed_http, wait_file};
use support::peers::{shared_dir, write_file};
use support::server::{http, Corral};

/// What "at once" allows on a loaded machine; the apps stay blocked until the gate opens.
const AT_ONCE: Duration = Duration::from_secs(2);

/// A WSGI module that, at import, leaves `importing-NAME` behind and waits for `gate`.
fn slow_app(dir: &Path, name: &str) -> String {
    format!(
        r#"import os, time
open(os.path.join({dir:?}, "importing-{name}"), "w").close()
while not os.path.exists(os.path.join({dir:?}, "gate")):
    time.sleep(0.01)

def application(environ, start_response):
    start_response("200 OK", [("Content-Type", "text/plain")])
    return [b"{name} served"]
"#,
        dir = dir.display().to_string(),
    )
}

/// A shell that leaves `importing-direct` behind, waits for `gate`, and only then runs
/// php-cgi binding the socket corral named (`{socket}`), so corral's driver waits for a
/// worker that does not accept yet.
fn slow_php_command(dir: &Path) -> String {
    format!(
        r#"["/bin/sh", "-c", "touch {dir}/importing-direct; while [ ! -e {dir}/gate ]; do sleep 0.01; done; exec php-cgi -b \"$0\"", "{{socket}}"]"#,
        dir = dir.display()
    )
}

#[test]
fn status_answers_while_workers_are_spawning_or_preloading() {
    let dir = shared_dir();
    std::fs::create_dir_all(dir.path().join("www/direct")).unwrap();
    write_file(
        &dir.path().join("www/direct"),
        "index.php",
        "<?php echo 'direct served';",
    );
    write_file(
        dir.path(),
        "preloaded.py",
        &slow_app(dir.path(), "preloaded"),
    );
    let config = format!(
        r#"
[server]
runtime_dir = "{run}"
grace = "1s"
kill_timeout = "1s"

[[listen]]
address = "127.0.0.1:0"
protocol = "http"

[status]
address = "127.0.0.1:0"

[pools.direct]
command = {php}
mode = "static"
max = 1
start_timeout = "120s"

[pools.preloaded]
app = "wsgi:preloaded:application"
cwd = "{dir}"
mode = "static"
max = 1
start_timeout = "120s"

[[contexts]]
prefix = "/direct"
root = "{www}"
pool = "direct"

[[contexts]]
prefix = "/preloaded"
pool = "preloaded"
"#,
        run = dir.path().join("run").display(),
        dir = dir.path().display(),
        php = slow_php_command(dir.path()),
        www = dir.path().join("www").display(),
    );
    let corral = Corral::start(&config, 1);
    let status = corral.status_ready_addr();
    // Both apps are importing: the worker and the preloader are held there.
    for name in ["direct", "preloaded"] {
        assert!(
            wait_file(
                &dir.path().join(format!("importing-{name}")),
                Duration::from_secs(30)
            ),
            "{name} never began to import:\n{}",
            corral.log()
        );
    }
    for round in 0..5 {
        for target in [
            "/status",
            "/status?full",
            "/status?json",
            "/status?pool=direct&full",
            "/status?pool=preloaded&full",
            "/metrics",
            "/ping",
        ] {
            let (r, took) = timed_http(status, "GET", target, &[], b"");
            assert_eq!(r.status, 200, "{target}: {}", r.text());
            assert!(
                took < AT_ONCE,
                "round {round}: {target} took {took:?} while the pools were starting"
            );
        }
        for pool in ["preloaded", "direct"] {
            let text = status_text(status, pool, false);
            assert_eq!(
                field(&text, "workers started"),
                Some("0"),
                "{pool} while its app is held at import:\n{text}"
            );
            assert_eq!(field(&text, "workers idle"), Some("0"), "{pool}:\n{text}");
            // The direct worker is spawned and not accepting yet; the preloaded one waits
            // for the preloader to fork it.
            let held = if pool == "direct" {
                "workers booting"
            } else {
                "workers starting"
            };
            assert_eq!(field(&text, held), Some("1"), "{pool}:\n{text}");
        }
    }
    // The gate opens: both pools start and serve, and status says so.
    assert!(
        !dir.path().join("gate").exists(),
        "the apps were never held"
    );
    std::fs::write(dir.path().join("gate"), "").unwrap();
    for pool in ["direct", "preloaded"] {
        assert!(
            support::eventually(Duration::from_secs(60), || field(
                &status_text(status, pool, false),
                "workers started"
            ) == Some("1")),
            "{pool} never started:\n{}",
            corral.log()
        );
        let target = if pool == "direct" {
            "/direct/index.php"
        } else {
            "/preloaded/x"
        };
        let r = http(corral.http_addr(), "GET", target, &[], b"");
        assert_eq!(r.status, 200, "{pool}: {}\n{}", r.text(), corral.log());
        assert_eq!(r.text(), format!("{pool} served"));
    }
}
