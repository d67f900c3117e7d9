//! Contexts end to end: their rules, the listeners and pools they must reach, and the root a
//! PHP pool's context needs.

use super::*;

#[test]
fn context_rules() {
    let src = r#"
[[listen]]
address = "127.0.0.1:8080"
protocol = "http"

[[listen]]
address = "[::1]:8081"
protocol = "http"

[pools.php]
command = ["php-cgi"]
max = 2

[pools.idle]
command = ["php-cgi"]

[[contexts]]
listen = "127.0.0.1:8080"
prefix = "/app/../etc"
extension = "p.h.p"
host = "example.com:80"
index = ["../x"]
params = { "HTTP-X" = "1" }
static_files = true
pool = "php"
max_conns = 0

[[contexts]]
listen = "127.0.0.1:8080"
prefix = "/app/../etc"
extension = "p.h.p"
host = "EXAMPLE.com:80"
pool = "php"
max_conns = 3

[[contexts]]
prefix = "/x"
pool = "missing"
"#;
    expect_error(src, "\"/app/../etc\"", "has a '.' or '..' segment");
    expect_error(src, "\"p.h.p\"", "may only hold letters, digits");
    expect_error(src, "\"example.com:80\"", "must not include a port");
    expect_error(src, "[\"../x\"]", "index needs a root");
    expect_error(src, "\"../x\"", "must be a plain file name");
    expect_error(src, "\"HTTP-X\"", "params name \"HTTP-X\" is not valid");
    expect_error(src, "true", "static_files = true needs a root");
    expect_error(src, "0\n\n[[contexts]]", "max_conns must be at least 1");
    expect_error(
        src,
        "3\n",
        "max_conns 3 is more than pool \"php\" allows (2)",
    );
    expect_error(
        src,
        "[[contexts]]\nlisten = \"127.0.0.1:8080\"\nprefix = \"/app/../etc\"\nextension = \"p.h.p\"\nhost = \"EX",
        "matches exactly the requests the context on line 17 matches",
    );
    expect_error(src, "\"missing\"", "pool \"missing\" is not defined");
    expect_error(
        src,
        "idle]",
        "pool \"idle\" is not used by any [[contexts]]",
    );
}

#[test]
fn unreachable_listener_and_unknown_listen() {
    let src = r#"
[[listen]]
address = "127.0.0.1:8080"
protocol = "http"

[[listen]]
address = "127.0.0.1:8081"
protocol = "http"

[pools.php]
command = ["php-cgi"]

[[contexts]]
listen = "127.0.0.1:8080"
pool = "php"
"#;
    expect_error(
        src,
        "\"127.0.0.1:8081\"",
        "no context serves listener 127.0.0.1:8081",
    );
    let bad = src.replace("listen = \"127.0.0.1:8080\"", "listen = \"127.0.0.1:9\"");
    expect_error(
        &bad,
        "\"127.0.0.1:9\"",
        "is not the address of any [[listen]] (they are: 127.0.0.1:8080, 127.0.0.1:8081)",
    );
}

#[test]
fn many_pools_need_contexts() {
    let src = "[[listen]]\naddress = \"127.0.0.1:8080\"\nprotocol = \"http\"\n\
               [pools.one]\ncommand = [\"x\"]\n[pools.two]\ncommand = [\"x\"]\n";
    let errors = parse(src, "t.toml").unwrap_err();
    assert!(errors.iter().any(|e| e.message()
        == "2 pools are configured but no [[contexts]] says which requests go to which pool"));
}

#[test]
fn a_php_pool_needs_a_context_with_a_root() {
    // No [[contexts]]: the implicit catch-all would have no root to check scripts against.
    let errors = parse(
        r#"
[[listen]]
address = "127.0.0.1:8080"
protocol = "http"
[pools.php]
command = ["/usr/bin/php-cgi8.2"]
"#,
        "t.toml",
    )
    .unwrap_err();
    assert!(
        errors.iter().any(|e| e.to_string().contains("runs PHP")),
        "{errors:?}"
    );
    // An explicit context without one is refused at its pool key.
    let errors = parse(
        r#"
[[listen]]
address = "127.0.0.1:8080"
protocol = "http"
[pools.php]
command = ["/usr/bin/env", "-i", "PHPRC=/etc/php", "php-cgi"]
[[contexts]]
pool = "php"
"#,
        "t.toml",
    )
    .unwrap_err();
    assert!(
        errors
            .iter()
            .any(|e| e.to_string().contains("needs a root")),
        "{errors:?}"
    );
    // Any other program may run behind an application mount.
    ok(r#"
[[listen]]
address = "127.0.0.1:8080"
protocol = "http"
[pools.app]
command = ["python3", "app.py"]
"#);
}
