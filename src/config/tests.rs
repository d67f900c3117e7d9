//! Tests of the whole parse → validate pipeline: defaults resolved, every rule reported at the
//! right place, all errors collected. The front side's keys are tested in `tests/front.rs`,
//! app pools' in `tests/apps.rs`, contexts' in `tests/contexts.rs`, with the helpers here.

use std::time::Duration;

use super::*;

mod apps;
mod contexts;
mod front;

/// A listener and a pool: the smallest valid file.
/// (The context comes first so that tests can append keys to the pool.)
pub(super) const MINIMAL: &str = r#"
[[contexts]]
root = "/var/www/html"
pool = "php"

[[listen]]
address = "127.0.0.1:8080"
protocol = "http"

[pools.php]
command = ["php-cgi"]
"#;

fn ok(src: &str) -> Config {
    match parse(src, "t.toml") {
        Ok(c) => c,
        Err(errors) => panic!(
            "expected a valid config, got:\n{}",
            errors
                .iter()
                .map(|e| e.to_string() + "\n")
                .collect::<String>()
        ),
    }
}

/// Asserts that some error contains `message` and sits where `needle` first occurs.
fn expect_error(src: &str, needle: &str, message: &str) {
    let offset = src
        .find(needle)
        .unwrap_or_else(|| panic!("{needle:?} not in source"));
    let line = src[..offset].matches('\n').count() + 1;
    let column = src[..offset]
        .rfind('\n')
        .map_or(offset, |nl| offset - nl - 1)
        + 1;
    let errors = parse(src, "t.toml").expect_err("expected errors");
    assert!(
        errors.iter().any(|e| e.line() == Some(line)
            && e.column() == Some(column)
            && e.message().contains(message)),
        "no error {message:?} at {line}:{column}; got:\n{}",
        errors
            .iter()
            .map(|e| e.to_string() + "\n")
            .collect::<String>()
    );
}

fn spawn(p: &PoolConfig) -> &SpawnConfig {
    match &p.backend {
        Backend::Spawned(s) => s,
        Backend::External { .. } => panic!("pool {} is external", p.name),
    }
}

#[test]
fn minimal_file_gets_php_fpm_like_defaults() {
    let c = ok(MINIMAL);
    assert_eq!(c.server.runtime_dir, PathBuf::from("/run/corral"));
    assert_eq!(c.server.grace, Duration::from_secs(30));
    assert_eq!(c.server.kill_timeout, Duration::from_secs(10));
    assert_eq!(c.server.log_level, LogLevel::Info);
    assert_eq!(c.listeners[0].backlog, 511);
    assert_eq!(c.listeners[0].forwarded, None);
    assert!(c.status.is_none());
    let p = &c.pools[0];
    assert_eq!(p.protocol, BackendProtocol::Fastcgi);
    assert_eq!((p.concurrency, p.max_conns, p.queue_size), (1, 5, 128));
    assert_eq!(p.queue_timeout, Duration::from_secs(5));
    assert_eq!(p.connect_timeout, Duration::from_secs(5));
    assert_eq!(p.first_byte_timeout, Duration::from_secs(60));
    assert_eq!(p.request_timeout, Duration::from_secs(300));
    let s = spawn(p);
    assert_eq!(s.program, Program::Command(vec!["php-cgi".into()]));
    assert_eq!(
        s.sizing,
        Sizing::Dynamic {
            min: 1,
            max: 5,
            spare_min: 1,
            spare_max: 3,
            idle_timeout: Duration::from_secs(10)
        }
    );
    assert_eq!(
        s.recycle,
        Recycle {
            max_requests: None,
            max_requests_jitter: 0,
            max_memory: None,
            max_lifetime: None,
            max_pool_memory: None,
            max_surge: None,
            refork_after: crate::config::ReforkSteps::NONE,
        }
    );
    assert_eq!(s.start_timeout, Duration::from_secs(30));
    assert_eq!(c.contexts.len(), 1);
    let ctx = &c.contexts[0];
    assert_eq!((ctx.prefix.as_str(), ctx.pool.as_str()), ("/", "php"));
    assert_eq!(ctx.max_conns, 5);
    assert!(!ctx.allow_php_value && !ctx.static_files);
    assert_eq!(
        ctx.index,
        ["index.php"],
        "a root brings the php-fpm-like index"
    );
}

#[test]
fn design_sample_is_valid_and_read_as_written() {
    let c = ok(r#"
[server]
runtime_dir = "/run/corral"
user = "www-data"
group = "www-data"
grace = "30s"

[[listen]]
address = "127.0.0.1:8080"
protocol = "http"

[status]
address = "127.0.0.1:9180"

[pools.php]
protocol = "fastcgi"
command = ["php-cgi"]
mode = "dynamic"
min = 2
max = 16
concurrency = 1
max_conns = 16
queue_size = 128
queue_timeout = "5s"
request_timeout = "60s"
max_requests = 1000
max_memory = "256MiB"
max_lifetime = "1h"
idle_timeout = "30s"
env = { APP_ENV = "production" }

[[contexts]]
listen = "127.0.0.1:8080"
prefix = "/"
root = "/var/www/html"
index = ["index.php"]
pool = "php"
max_conns = 8
"#);
    let p = c.pool("php").unwrap();
    assert_eq!(p.request_timeout, Duration::from_secs(60));
    assert_eq!(p.first_byte_timeout, Duration::from_secs(60));
    let s = spawn(p);
    assert_eq!(s.user.as_deref(), Some("www-data"));
    assert_eq!(s.recycle.max_requests, Some(1000));
    assert_eq!(s.recycle.max_requests_jitter, 100);
    assert_eq!(s.recycle.max_memory, Some(256 << 20));
    assert_eq!(s.recycle.max_lifetime, Some(Duration::from_secs(3600)));
    assert_eq!(s.env.get("APP_ENV").map(String::as_str), Some("production"));
    assert_eq!(
        s.sizing,
        Sizing::Dynamic {
            min: 2,
            max: 16,
            spare_min: 1,
            spare_max: 3,
            idle_timeout: Duration::from_secs(30)
        }
    );
    let status = c.status.unwrap();
    assert_eq!(status.bind.address().to_string(), "127.0.0.1:9180");
    assert_eq!(c.contexts[0].listen, Some(c.listeners[0].bind.address()));
    assert_eq!(c.contexts[0].max_conns, 8);
}

#[test]
fn embedded_default_is_valid() {
    let c = parse(EMBEDDED, EMBEDDED_ORIGIN).unwrap();
    assert_eq!(c.pools[0].protocol, BackendProtocol::Lsapi);
    assert!(matches!(
        spawn(&c.pools[0]).program,
        Program::Wsgi { ref module, ref callable, ref python, native: None }
            if module == "corral_demo" && callable == "application" && python == DEFAULT_PYTHON
    ));
}

#[test]
fn annotated_example_is_valid() {
    ok(include_str!("../../conf/corral.toml"));
}

#[test]
fn spare_defaults_shrink_to_fit_a_small_max() {
    let c = ok(&format!("{MINIMAL}max = 1\n"));
    assert_eq!(
        spawn(&c.pools[0]).sizing,
        Sizing::Dynamic {
            min: 1,
            max: 1,
            spare_min: 1,
            spare_max: 1,
            idle_timeout: Duration::from_secs(10)
        }
    );
}

#[test]
fn static_and_ondemand_sizing() {
    let c = ok(&format!("{MINIMAL}mode = \"static\"\nmax = 4\nmin = 4\n"));
    assert_eq!(spawn(&c.pools[0]).sizing, Sizing::Static { workers: 4 });
    let c = ok(&format!("{MINIMAL}mode = \"ondemand\"\nmin = 0\n"));
    assert!(matches!(
        spawn(&c.pools[0]).sizing,
        Sizing::OnDemand { max: 5, .. }
    ));
}

#[test]
fn external_servers_and_apps() {
    let c = ok(r#"
[[listen]]
address = "unix:/run/corral/front.sock"
protocol = "fastcgi"
mode = "0600"
owner = "nginx"

[pools.ext]
servers = ["10.0.0.5:9000", "unix:/run/php/fpm.sock"]
concurrency = 8

[pools.rack]
app = "rack:config.ru"
protocol = "lsapi"

[[contexts]]
prefix = "/api"
pool = "ext"

[[contexts]]
pool = "rack"
"#);
    let ext = c.pool("ext").unwrap();
    assert_eq!(ext.max_conns, 16);
    assert!(matches!(&ext.backend, Backend::External { servers } if servers.len() == 2));
    let rack = c.pool("rack").unwrap();
    assert_eq!(rack.protocol, BackendProtocol::Lsapi);
    assert_eq!(
        spawn(rack).program,
        Program::Rack {
            rackup: "config.ru".into(),
            ruby: DEFAULT_RUBY.into(),
        }
    );
    match &c.listeners[0].bind {
        Bind::Unix { perms, .. } => {
            assert_eq!(perms.mode, 0o600);
            assert_eq!(perms.owner.as_deref(), Some("nginx"));
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn forwarded_trust() {
    let c = ok(&MINIMAL.replace(
        "protocol = \"http\"",
        "protocol = \"http\"\nforwarded = \"forwarded\"\ntrusted_proxies = [\"10.0.0.0/8\"]",
    ));
    let trust = c.listeners[0].forwarded.as_ref().unwrap();
    assert_eq!(trust.header, ForwardedHeader::Forwarded);
    assert_eq!(
        trust.trusted_proxies,
        vec![Cidr::parse("10.0.0.0/8").unwrap()]
    );
    let unix = MINIMAL
        .replace("127.0.0.1:8080", "unix:/run/corral/http.sock")
        .replace(
            "protocol = \"http\"",
            "protocol = \"http\"\nforwarded = \"x-forwarded\"",
        );
    assert!(ok(&unix).listeners[0].forwarded.is_some());
}

#[test]
fn server_and_socket_rules() {
    let src = r#"
[server]
runtime_dir = "relative/dir"
grace = "0s"
kill_timeout = "3"

[[listen]]
address = "127.0.0.1:8080"
protocol = "fastcgi"
owner = "www-data"
allow = ["10.0.0.1/8"]
trusted_proxies = ["10.0.0.0/8"]
backlog = 0

[[listen]]
address = "unix:/run/x.sock"
protocol = "http"
mode = "0999"
allow = ["127.0.0.1"]
trusted_proxies = ["127.0.0.1"]

[status]
address = "127.0.0.1:8080"

[pools.php]
command = ["php-cgi"]
"#;
    expect_error(src, "\"relative/dir\"", "must be an absolute path");
    expect_error(src, "\"0s\"", "grace must be greater than zero");
    expect_error(src, "\"3\"", "time unit needed");
    expect_error(src, "\"www-data\"", "owner applies to unix: sockets only");
    expect_error(src, "\"10.0.0.1/8\"", "did you mean 10.0.0.0/8");
    expect_error(src, "[\"10.0.0.0/8\"]", "apply to http listeners only");
    expect_error(src, "0\n\n[[listen]]", "backlog must be at least 1");
    expect_error(src, "\"0999\"", "not an octal permission");
    expect_error(
        src,
        "[\"127.0.0.1\"]\ntrusted",
        "allow applies to TCP sockets only",
    );
    expect_error(src, "[\"127.0.0.1\"]\n\n", "has no effect unless forwarded");
    expect_error(
        src,
        "\"127.0.0.1:8080\"\n\n[pools",
        "address 127.0.0.1:8080 is already used on line 8",
    );
}

#[test]
fn pool_rules() {
    let src = r#"
[[listen]]
address = "127.0.0.1:8080"
protocol = "http"

[pools.a]
command = ["php-cgi"]
min = 17
max = 4
spare_min = 3
spare_max = 2
max_requests = 100
max_requests_jitter = 100
first_byte_timeout = "10m"
max_conns = 21
env = { PHP_FCGI_MAX_REQUESTS = "500", "BAD=NAME" = "x" }
cwd = "www"

[pools.b]
app = "wsgi:my-app"
mode = "static"
min = 2
idle_timeout = "5s"

[pools.c]
mode = "ondemand"

[pools."d e"]
servers = []
command = ["x"]

[pools.f]
servers = ["db:9000"]
user = "nobody"
max_memory = "12XB"

[[contexts]]
pool = "a"
[[contexts]]
pool = "b"
[[contexts]]
pool = "c"
[[contexts]]
pool = "f"
"#;
    expect_error(src, "17", "pool \"a\": min 17 is greater than max 4");
    expect_error(
        src,
        "3\nspare_max",
        "spare_min 3 is greater than spare_max 2",
    );
    expect_error(
        src,
        "100\nfirst",
        "max_requests_jitter must be smaller than max_requests (100)",
    );
    expect_error(
        src,
        "\"10m\"",
        "first_byte_timeout is longer than request_timeout",
    );
    expect_error(
        src,
        "21",
        "max_conns 21 is more than 4 workers × concurrency 1",
    );
    expect_error(src, "\"500\"", "PHP_FCGI_MAX_REQUESTS must be unset or 0");
    expect_error(src, "\"BAD=NAME\"", "env name \"BAD=NAME\" is not valid");
    expect_error(src, "\"www\"", "cwd \"www\" must be an absolute path");
    expect_error(src, "\"wsgi:my-app\"", "is not wsgi:MODULE:CALLABLE");
    expect_error(src, "2\nidle", "a static pool runs exactly max (5) workers");
    expect_error(
        src,
        "\"5s\"",
        "idle_timeout does not apply to a static pool",
    );
    expect_error(src, "c]", "pool \"c\" runs nothing");
    expect_error(
        src,
        "\"d e\"",
        "pool name \"d e\" must be 1-32 ASCII letters",
    );
    expect_error(src, "[\"x\"]", "sets both servers and command");
    expect_error(src, "\"nobody\"", "user applies to pools corral spawns");
    expect_error(src, "\"12XB\"", "max_memory applies to pools corral spawns");
}

#[test]
fn empty_file_names_everything_missing() {
    let errors = parse("", "t.toml").unwrap_err();
    let text: Vec<String> = errors.iter().map(ToString::to_string).collect();
    assert_eq!(
        text,
        [
            "t.toml: no front listener is configured: add a [[listen]] block",
            "t.toml: no pool is configured: add a [pools.NAME] table",
        ]
    );
}

#[test]
fn first_stage_errors_are_located() {
    expect_error(
        "[pools.php]\nmax_childs = 5\n",
        "max_childs",
        "unknown field `max_childs`",
    );
    expect_error("[server]\nbogus = 1\n", "bogus", "unknown field `bogus`");
    expect_error(
        "[pools.php]\nmax = -1\n",
        "-1",
        "expected a whole number from 0 to 4294967295",
    );
    expect_error(
        "[pools.php]\nqueue_timeout = 5\n",
        "5",
        "expected a duration such as",
    );
    expect_error("x = [\n", "\n", "");
}
