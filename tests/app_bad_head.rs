//! A response head the application wrote wrong is the application's error, not the worker's
//! (ARCHITECTURE.md, "The backend exchange"): PHP's `header()` lets control bytes 0x01 to 0x1f
//! through, so a script that reflects client input into a header would otherwise let any
//! client recycle a php-cgi worker (and its warm OPcache) per request.
//!
//! Real php-cgi behind the HTTP front, one worker: its pid must not change across many bad
//! heads, each bad head is a 502 with a log line naming the header, and good requests still
//! work in between.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing,
    missing_docs
)]

mod support;

use std::time::Duration;

use support::peers::{shared_dir, write_file};
use support::server::{http, Corral};

/// How many bad heads are sent; each used to cost a respawn.
const BAD_REQUESTS: usize = 30;

#[test]
fn a_control_byte_in_a_php_header_is_a_502_and_keeps_the_worker() {
    let dir = shared_dir();
    let root = dir.path().join("www");
    std::fs::create_dir_all(&root).unwrap();
    write_file(&root, "pid.php", "<?php echo getmypid();");
    // The value comes from the client, as a reflected header would.
    write_file(
        &root,
        "reflect.php",
        "<?php header('X-A: a' . chr((int)$_GET['c']) . 'b'); echo 'body';",
    );
    let config = format!(
        r#"
[server]
runtime_dir = "{run}"
grace = "2s"
kill_timeout = "2s"

[[listen]]
address = "127.0.0.1:0"
protocol = "http"

[pools.php]
command = ["php-cgi"]
mode = "static"
max = 1

[[contexts]]
root = "{root}"
pool = "php"
"#,
        run = dir.path().join("run").display(),
        root = root.display(),
    );
    let corral = Corral::start(&config, 1);
    let addr = corral.http_addr();
    let pid = || {
        let r = http(addr, "GET", "/pid.php", &[], b"");
        assert_eq!(r.status, 200, "{}", corral.log());
        r.text()
    };
    let first = pid();
    for i in 0..BAD_REQUESTS {
        // 0x01 to 0x1f, less CR and LF (which PHP itself refuses) and TAB (legal in a value).
        let c = [1u8, 2, 7, 8, 0x0b, 0x0c, 0x1b, 0x1f][i % 8];
        let r = http(addr, "GET", &format!("/reflect.php?c={c}"), &[], b"");
        assert_eq!(r.status, 502, "control byte {c:#x}: {}", corral.log());
        assert!(
            !r.text().contains("body"),
            "nothing of the bad response reaches the client"
        );
    }
    assert_eq!(
        pid(),
        first,
        "the worker was not recycled:\n{}",
        corral.log()
    );
    assert!(
        corral.wait_count(
            "invalid response head",
            BAD_REQUESTS,
            Duration::from_secs(10)
        ),
        "each bad head is logged:\n{}",
        corral.log()
    );
    assert!(
        corral
            .log()
            .contains(r#"value of CGI response header "X-A" holds a control byte"#),
        "the log line names the header:\n{}",
        corral.log()
    );
    assert!(
        !corral.log().contains("marked suspect"),
        "no worker was blamed:\n{}",
        corral.log()
    );
}
