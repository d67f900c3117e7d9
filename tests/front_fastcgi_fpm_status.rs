//! php-fpm's status and ping paths through corral's FastCGI listener: monitoring set up for
//! php-fpm (an nginx `location ~ ^/(status|ping)$` with `fastcgi_pass`, as Netdata, Zabbix
//! and exporter guides have it) asks the pool's socket for `pm.status_path` and `ping.path`;
//! with `status_path` and `ping_path` on the listener corral answers them itself, in
//! php-fpm's formats, while every other request still goes to real php-cgi workers.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing,
    missing_docs
)]

mod support;

use support::front::{curl, Corral, Nginx};
use support::peers::{shared_dir, write_file};

#[test]
fn nginx_gets_php_fpm_status_json_and_pong_from_corral() {
    let dir = shared_dir();
    let root = dir.path().join("www");
    std::fs::create_dir(&root).unwrap();
    write_file(&root, "hello.php", "<?php echo 'hello';");
    let socket = dir.path().join("php.sock");
    let config = format!(
        r#"
[server]
runtime_dir = "{dir}/run"

[[listen]]
address = "unix:{socket}"
protocol = "fastcgi"
status_path = "/status"
ping_path = "/ping"

[pools.www]
command = ["php-cgi"]
mode = "static"
max = 2

[[contexts]]
root = "{root}"
pool = "www"
"#,
        dir = dir.path().display(),
        socket = socket.display(),
        root = root.display(),
    );
    let corral = Corral::start(dir.path(), &config, &socket);
    let server = format!(
        "    root {root};\n\
         \x20   location ~ ^/(status|ping)$ {{\n      include /etc/nginx/fastcgi_params;\n      \
         fastcgi_param SCRIPT_FILENAME $document_root$fastcgi_script_name;\n      \
         fastcgi_pass unix:{sock};\n    }}\n\
         \x20   location ~ \\.php$ {{\n      include /etc/nginx/fastcgi_params;\n      \
         fastcgi_param SCRIPT_FILENAME $document_root$fastcgi_script_name;\n      \
         fastcgi_pass unix:{sock};\n    }}",
        root = root.display(),
        sock = socket.display(),
    );
    let nginx = Nginx::start(dir.path(), "", &[server]);
    let url = |p: &str| format!("{}{p}", nginx.url(0));

    let r = curl(&url("/hello.php"), &[]);
    assert_eq!(
        (r.status, r.text().as_str()),
        (200, "hello"),
        "{}",
        corral.log()
    );

    let r = curl(&url("/ping"), &[]);
    assert_eq!(r.status, 200, "{}", nginx.error_log());
    assert_eq!(r.text().trim(), "pong");

    // php-fpm's plain text, with its field names and the request just served counted.
    let r = curl(&url("/status"), &[]);
    assert_eq!(r.status, 200);
    let text = r.text();
    for field in [
        "pool:",
        "process manager:",
        "accepted conn:",
        "idle processes:",
    ] {
        assert!(text.contains(field), "{field} missing:\n{text}");
    }
    assert!(text.contains("pool:                 www"), "{text}");
    let accepted = |t: &str| -> u64 {
        t.lines()
            .find_map(|l| l.strip_prefix("accepted conn:"))
            .and_then(|v| v.trim().parse().ok())
            .unwrap()
    };
    assert!(accepted(&text) >= 1, "{text}");

    let r = curl(&url("/status?json"), &[]);
    assert_eq!(r.status, 200);
    assert_eq!(r.header("content-type"), Some("application/json"));
    assert!(
        r.text().starts_with('{') && r.text().contains("\"pool\":\"www\""),
        "{}",
        r.text()
    );

    // The page for people carries the status listener's security headers, from the same
    // constant (src/status/html.rs).
    let r = curl(&url("/status?html"), &[]);
    assert_eq!(r.status, 200);
    let csp = r.header("content-security-policy").unwrap_or_default();
    assert!(
        csp.contains("frame-ancestors 'none'") && csp.contains("default-src 'none'"),
        "{csp:?}"
    );
    assert_eq!(r.header("x-frame-options"), Some("DENY"));
    assert_eq!(r.header("x-content-type-options"), Some("nosniff"));

    let r = curl(&url("/status?full"), &[]);
    assert!(r.text().contains("pid:"), "{}", r.text());
    // Answered by corral, not by a worker: the status requests were not accepted by the pool.
    let r = curl(&url("/status"), &[]);
    assert_eq!(accepted(&r.text()), accepted(&text), "{}", r.text());
}
