//! The front side of a configuration end to end: listeners' limits and timeouts, php-fpm's
//! status and ping paths, a context's front controller, sendfile directories and
//! X-Accel-Redirect.

use std::time::Duration;

use super::*;

#[test]
fn front_limits_default_and_listeners_inherit_the_server_timeouts() {
    let c = ok(MINIMAL);
    assert_eq!(c.server.max_connections, None);
    assert_eq!(c.server.threads, None);
    assert_eq!(c.server.front_timeouts, FrontTimeouts::default());
    let l = &c.listeners[0];
    assert_eq!(l.max_connections_per_client, Some(128));
    assert_eq!(l.timeouts.header, Duration::from_secs(10));
    assert_eq!(l.timeouts.idle, Duration::from_secs(60));
    assert_eq!(l.timeouts.body, Duration::from_secs(30));

    let c = ok(r#"
[server]
max_connections = 5000
header_timeout = "4s"
body_timeout = "1m"

[[listen]]
address = "127.0.0.1:8080"
protocol = "http"
idle_timeout = "5s"
max_connections_per_client = 0

[[listen]]
address = "127.0.0.1:8081"
protocol = "fastcgi"
header_timeout = "2s"
max_connections_per_client = 16

[pools.php]
command = ["php-cgi"]

[[contexts]]
pool = "php"
root = "/var/www/html"
"#);
    assert_eq!(c.server.max_connections, Some(5000));
    let (a, b) = (&c.listeners[0], &c.listeners[1]);
    assert_eq!(a.max_connections_per_client, None);
    assert_eq!(
        a.timeouts,
        FrontTimeouts {
            header: Duration::from_secs(4),
            idle: Duration::from_secs(5),
            body: Duration::from_secs(60),
            send: Duration::from_secs(60),
            body_total: Duration::from_secs(3600),
        }
    );
    assert_eq!(b.max_connections_per_client, Some(16));
    assert_eq!(b.timeouts.header, Duration::from_secs(2));
    assert_eq!(b.timeouts.idle, Duration::from_secs(60));
}

#[test]
fn php_fpm_status_and_ping_paths_are_for_fastcgi_listeners() {
    let c = ok(r#"
[[listen]]
address = "unix:/run/corral/php.sock"
protocol = "fastcgi"
status_path = "/fpm-status"
ping_path = "/ping"
[pools.app]
servers = ["127.0.0.1:9000"]
"#);
    assert_eq!(c.listeners[0].status_path.as_deref(), Some("/fpm-status"));
    assert_eq!(c.listeners[0].ping_path.as_deref(), Some("/ping"));
    let src = r#"
[[listen]]
address = "127.0.0.1:8080"
protocol = "http"
status_path = "/status"
[[listen]]
address = "unix:/run/corral/php.sock"
protocol = "fastcgi"
ping_path = "ping?x"
[pools.app]
servers = ["127.0.0.1:9000"]
"#;
    expect_error(
        src,
        "\"/status\"",
        "status_path applies to fastcgi listeners only",
    );
    expect_error(src, "\"ping?x\"", "must be a path starting with '/'");
}

#[test]
fn front_limits_are_checked_where_written() {
    let src = r#"
[server]
max_connections = 0
idle_timeout = "0s"

[[listen]]
address = "127.0.0.1:8080"
protocol = "http"
header_timeout = "soon"
body_timeout = "0ms"

[pools.php]
command = ["php-cgi"]
"#;
    expect_error(src, "0\nidle", "max_connections must be at least 1");
    let threads = "[server]\nthreads = 0\n\n[pools.php]\ncommand = [\"php-cgi\"]\n";
    expect_error(threads, "0\n", "threads must be from 1 to 1024");
    let two = ok(&format!("[server]\nthreads = 2\n{MINIMAL}"));
    assert_eq!(two.server.threads, Some(2));
    let per = ok(&format!("[server]\nscheduler = \"per-thread\"\n{MINIMAL}"));
    assert_eq!(per.server.scheduler, crate::config::Scheduler::PerThread);
    let stealing = ok(&format!(
        "[server]\nscheduler = \"work-stealing\"\n{MINIMAL}"
    ));
    assert_eq!(
        stealing.server.scheduler,
        crate::config::Scheduler::WorkStealing
    );
    assert!(
        !per.server.pin_threads,
        "pin_threads is off unless asked for"
    );
    let pinned = ok(&format!("[server]\npin_threads = true\n{MINIMAL}"));
    assert!(pinned.server.pin_threads);
    let stealing_pinned =
        format!("[server]\nscheduler = \"work-stealing\"\npin_threads = true\n{MINIMAL}");
    expect_error(
        &stealing_pinned,
        "true",
        "pin_threads pins the serving threads of scheduler = \"per-thread\"",
    );
    let unpinned_stealing = ok(&format!(
        "[server]\nscheduler = \"work-stealing\"\npin_threads = false\n{MINIMAL}"
    ));
    assert!(!unpinned_stealing.server.pin_threads);
    assert_eq!(
        per.server.sched_batch, None,
        "sched_batch left to the default"
    );
    let stealing_batch =
        format!("[server]\nscheduler = \"work-stealing\"\nsched_batch = true\n{MINIMAL}");
    expect_error(
        &stealing_batch,
        "true",
        "sched_batch applies to the serving threads of scheduler = \"per-thread\"",
    );
    let stealing_normal = ok(&format!(
        "[server]\nscheduler = \"work-stealing\"\nsched_batch = false\n{MINIMAL}"
    ));
    assert_eq!(stealing_normal.server.sched_batch, Some(false));
    let bad = format!("[server]\nscheduler = \"fibers\"\n{MINIMAL}");
    expect_error(&bad, "\"fibers\"", "unknown variant");
    expect_error(src, "\"0s\"", "idle_timeout must be greater than zero");
    expect_error(src, "\"soon\"", "is not valid");
    expect_error(src, "\"0ms\"", "body_timeout must be greater than zero");
}

#[test]
fn front_controller_is_a_script_in_the_root() {
    let c = ok(&MINIMAL.replace(
        "pool = \"php\"\n\n[[listen]]",
        "pool = \"php\"\nfront_controller = \"/app/index.php\"\n\n[[listen]]",
    ));
    assert_eq!(
        c.contexts[0].front_controller.as_deref(),
        Some("/app/index.php")
    );
    assert_eq!(ok(MINIMAL).contexts[0].front_controller, None);
    for (value, message) in [
        ("index.php", "must be an absolute path in the root"),
        ("/../index.php", "has an empty, '.', '..' or hidden segment"),
        (
            "/a/./index.php",
            "has an empty, '.', '..' or hidden segment",
        ),
        ("//index.php", "has an empty, '.', '..' or hidden segment"),
        (
            "/.hidden/index.php",
            "has an empty, '.', '..' or hidden segment",
        ),
        ("/index.php/", "has an empty, '.', '..' or hidden segment"),
        (
            "/index.html",
            "must end in the context's script extension \".php\"",
        ),
        (
            "/index.php.txt",
            "must end in the context's script extension",
        ),
        ("/.php", "has an empty, '.', '..' or hidden segment"),
        ("/index%2ephp", "must be a plain file path"),
        ("/index.php?x=1", "must be a plain file path"),
    ] {
        let src = MINIMAL.replace(
            "pool = \"php\"\n\n[[listen]]",
            &format!("pool = \"php\"\nfront_controller = {value:?}\n\n[[listen]]"),
        );
        expect_error(&src, &format!("{value:?}"), message);
    }
}

#[test]
fn front_controller_needs_a_root_no_extension_and_an_http_listener() {
    let src = r#"
[[listen]]
address = "127.0.0.1:8080"
protocol = "http"

[[listen]]
address = "unix:/tmp/corral-t/php.sock"
protocol = "fastcgi"

[pools.app]
servers = ["127.0.0.1:9000"]

[[contexts]]
prefix = "/a"
pool = "app"
front_controller = "/no-root.php"

[[contexts]]
prefix = "/b"
root = "/srv/b"
extension = "php"
pool = "app"
front_controller = "/with-extension.php"

[[contexts]]
listen = "unix:/tmp/corral-t/php.sock"
root = "/srv/c"
pool = "app"
front_controller = "/on-fastcgi.php"
"#;
    expect_error(src, "\"/no-root.php\"", "front_controller needs a root");
    expect_error(
        src,
        "\"/with-extension.php\"",
        "routes only paths naming a .php script to this context",
    );
    expect_error(
        src,
        "\"/on-fastcgi.php\"",
        "front_controller applies on an http listener only",
    );
}

#[test]
fn sendfile_dirs_and_accel_redirect_are_clean_absolute_directories() {
    let with = |keys: &str| {
        MINIMAL.replace(
            "pool = \"php\"\n\n[[listen]]",
            &format!("pool = \"php\"\n{keys}\n\n[[listen]]"),
        )
    };
    let c = ok(&with(
        "sendfile_dirs = [\"/srv/private\"]\n\
         accel_redirect = { \"/p/\" = \"/srv/p\", \"/p/deeper/\" = \"/srv/deep/\" }",
    ));
    let ctx = &c.contexts[0];
    assert_eq!(ctx.sendfile_dirs, [PathBuf::from("/srv/private")]);
    // Longest prefix first.
    assert_eq!(
        ctx.accel_redirect,
        [
            ("/p/deeper/".to_owned(), PathBuf::from("/srv/deep/")),
            ("/p/".to_owned(), PathBuf::from("/srv/p")),
        ]
    );
    let none = ok(MINIMAL);
    assert!(
        none.contexts[0].sendfile_dirs.is_empty() && none.contexts[0].accel_redirect.is_empty()
    );

    for (keys, needle, message) in [
        (
            "sendfile_dirs = [\"srv\"]",
            "\"srv\"",
            "must be an absolute path",
        ),
        (
            "sendfile_dirs = [\"/srv/../etc\"]",
            "\"/srv/../etc\"",
            "has a '.' or '..' segment",
        ),
        (
            "sendfile_dirs = [\"/\"]",
            "\"/\"",
            "would let a backend send any file",
        ),
        (
            "accel_redirect = { \"/p\" = \"/srv\" }",
            "\"/p\"",
            "must be a URI path that starts and ends with '/'",
        ),
        (
            "accel_redirect = { \"p/\" = \"/srv\" }",
            "\"p/\"",
            "must be a URI path",
        ),
        (
            "accel_redirect = { \"/a/../\" = \"/srv\" }",
            "\"/a/../\"",
            "without '.' or '..' segments",
        ),
        (
            "accel_redirect = { \"/%2e/\" = \"/srv\" }",
            "\"/%2e/\"",
            "must be a URI path",
        ),
        (
            "accel_redirect = { \"/p/\" = \"srv\" }",
            "\"srv\"",
            "must be an absolute path",
        ),
        (
            "accel_redirect = { \"/p/\" = \"/srv/./x\" }",
            "\"/srv/./x\"",
            "has a '.' or '..' segment",
        ),
    ] {
        expect_error(&with(keys), needle, message);
    }
}
