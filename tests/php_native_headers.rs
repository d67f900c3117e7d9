//! Which request headers reach `$_SERVER` behind corral, compared across the three ways corral
//! runs PHP: the native worker's classic mode, its worker mode (`corral_handle_request`) and
//! php-cgi over FastCGI. A header whose name holds `_`, `.` or another byte outside
//! `[A-Za-z0-9-]` is left out by corral's CGI variables (PHP would turn `X.Dot` and `X_Dot`
//! into the same HTTP_X_DOT as `X-Dot`, so one could pass for the other, which nginx's
//! ignore_invalid_headers also prevents). The variables are built once, before the request
//! goes to any backend, so every mode must show the same keys: a worker that dropped or
//! mangled names on its own would differ from php-cgi here.

mod support;

use support::native::worker;
use support::peers::{shared_dir, write_file};
use support::server::{http, Corral};

/// Prints the request's HTTP_X_* keys with their values, sorted: the same text under php-cgi
/// and the native worker when both got the same variables.
const LIST: &str = "$x = array_filter($_SERVER, fn ($k) => str_starts_with($k, 'HTTP_X'), \
                    ARRAY_FILTER_USE_KEY); ksort($x); echo json_encode($x);";

#[test]
fn classic_worker_mode_and_php_cgi_receive_the_same_headers() {
    let dir = shared_dir();
    let www = dir.path().join("www");
    for mode in ["native", "worker", "cgi"] {
        std::fs::create_dir_all(www.join(mode)).unwrap();
        write_file(&www.join(mode), "x.php", &format!("<?php {LIST}"));
    }
    write_file(
        &www.join("worker"),
        "loop.php",
        &format!("<?php while (corral_handle_request(function () {{ {LIST} }})) {{}}"),
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

[pools.native]
worker = "native"
worker_path = "{worker}"
mode = "static"
max = 1

[pools.worker]
worker = "native"
worker_path = "{worker}"
worker_script = "{www}/worker/loop.php"
mode = "static"
max = 1

[pools.cgi]
command = ["php-cgi"]
mode = "static"
max = 1

[[contexts]]
prefix = "/native/"
root = "{www}"
pool = "native"

[[contexts]]
prefix = "/worker/"
root = "{www}"
pool = "worker"

[[contexts]]
prefix = "/cgi/"
root = "{www}"
pool = "cgi"
"#,
        run = dir.path().join("run").display(),
        worker = worker().display(),
        www = www.display(),
    );
    let corral = Corral::start(&config, 1);
    let headers = [
        ("X-Dash", "kept"),
        ("X.Dot", "dot"),
        ("X_Under", "under"),
        ("X~Tilde", "tilde"),
        ("X-Dot", "the real one"),
    ];
    let expected = r#"{"HTTP_X_DASH":"kept","HTTP_X_DOT":"the real one"}"#;
    for mode in ["native", "worker", "cgi"] {
        // Twice: worker mode keeps the keys of the request before (workers/php/src/keys.rs).
        for _ in 0..2 {
            let r = http(
                corral.http_addr(),
                "GET",
                &format!("/{mode}/x.php"),
                &headers,
                b"",
            );
            assert_eq!(
                (r.status, r.text().as_str()),
                (200, expected),
                "{mode}\n{}",
                corral.log()
            );
        }
    }
}
