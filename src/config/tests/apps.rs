//! App pools end to end: the launchers' interpreters (`python`, `virtualenv`, `ruby`), what an
//! app pool may speak, and `php_children`.

use super::*;

/// An http listener in front of one app pool named `app`, so tests can append pool keys.
const APP_POOL: &str = r#"
[[contexts]]
pool = "app"

[[listen]]
address = "127.0.0.1:8080"
protocol = "http"

[pools.app]
"#;

#[test]
fn python_virtualenv_and_ruby_name_the_launchers_interpreter() {
    let program = |keys: &str| {
        spawn(&ok(&format!("{APP_POOL}{keys}")).pools[0])
            .program
            .clone()
    };
    let wsgi = |python: &str| Program::Wsgi {
        module: "app".into(),
        callable: "application".into(),
        python: python.into(),
        native: None,
    };
    assert_eq!(program("app = \"wsgi:app\"\n"), wsgi("python3"));
    assert_eq!(
        program("app = \"wsgi:app\"\npython = \"/srv/app/venv/bin/python\"\n"),
        wsgi("/srv/app/venv/bin/python")
    );
    assert_eq!(
        program("app = \"wsgi:app\"\npython = \"python3.11\"\n"),
        wsgi("python3.11")
    );
    // A virtualenv runs its own bin/python, with or without a trailing slash.
    for dir in ["/srv/app/venv", "/srv/app/venv/"] {
        assert_eq!(
            program(&format!("app = \"wsgi:app\"\nvirtualenv = \"{dir}\"\n")),
            wsgi("/srv/app/venv/bin/python")
        );
    }
    assert_eq!(
        program("app = \"rack:config.ru\"\nruby = \"/usr/bin/ruby3.1\"\n"),
        Program::Rack {
            rackup: "config.ru".into(),
            ruby: "/usr/bin/ruby3.1".into(),
        }
    );
}

#[test]
fn interpreter_keys_are_checked_where_written() {
    let src = format!("{APP_POOL}app = \"wsgi:app\"\npython = \"venv/bin/python\"\n");
    expect_error(
        &src,
        "\"venv/bin/python\"",
        "must be an absolute path or a program name",
    );
    let src = format!("{APP_POOL}app = \"wsgi:app\"\npython = \"/srv/venv/bin/\"\n");
    expect_error(&src, "\"/srv/venv/bin/\"", "names a directory");
    let src = format!("{APP_POOL}app = \"wsgi:app\"\npython = \"\"\n");
    expect_error(&src, "\"\"\n", "python must name an interpreter");
    let src = format!("{APP_POOL}app = \"wsgi:app\"\nvirtualenv = \"venv\"\n");
    expect_error(
        &src,
        "\"venv\"",
        "virtualenv \"venv\" must be an absolute path",
    );
    let src = format!("{APP_POOL}app = \"wsgi:app\"\nvirtualenv = \"/\"\n");
    expect_error(&src, "\"/\"", "is not a virtual environment");
    // Both: the later one is the one to remove.
    let src = format!(
        "{APP_POOL}app = \"wsgi:app\"\npython = \"/usr/bin/python3\"\nvirtualenv = \"/srv/venv\"\n"
    );
    expect_error(&src, "\"/srv/venv\"", "set python or virtualenv, not both");
    let src = format!("{APP_POOL}app = \"rack:config.ru\"\nruby = \"bin/ruby\"\n");
    expect_error(
        &src,
        "\"bin/ruby\"",
        "ruby \"bin/ruby\" must be an absolute path",
    );

    // Each key belongs to one kind of pool; elsewhere it would be ignored, so it is an error.
    let src = format!("{APP_POOL}app = \"rack:config.ru\"\npython = \"/usr/bin/python3\"\n");
    expect_error(
        &src,
        "\"/usr/bin/python3\"",
        "python applies to app = \"wsgi:...\" pools; pool \"app\" runs a Rack app",
    );
    let src = format!("{APP_POOL}app = \"wsgi:app\"\nruby = \"ruby3.1\"\n");
    expect_error(
        &src,
        "\"ruby3.1\"",
        "ruby applies to app = \"rack:...\" pools; pool \"app\" runs a WSGI app",
    );
    let src = format!("{APP_POOL}command = [\"php-cgi\"]\nvirtualenv = \"/srv/venv\"\n");
    expect_error(
        &src,
        "\"/srv/venv\"",
        "virtualenv applies to app = \"wsgi:...\" pools; pool \"app\" runs a command",
    );
    let src = format!("{APP_POOL}servers = [\"127.0.0.1:9000\"]\nruby = \"ruby\"\n");
    expect_error(&src, "\"ruby\"\n", "pool \"app\" uses external servers");
}

#[test]
fn an_app_pool_speaks_lsapi_one_request_at_a_time() {
    for app in ["wsgi:app", "rack:config.ru"] {
        let pool = &ok(&format!("{APP_POOL}app = \"{app}\"\n")).pools[0];
        assert_eq!(pool.protocol, BackendProtocol::Lsapi, "{app}");
        let pool = &ok(&format!(
            "{APP_POOL}app = \"{app}\"\nprotocol = \"lsapi\"\nconcurrency = 1\n"
        ))
        .pools[0];
        assert_eq!(
            (pool.protocol, pool.concurrency),
            (BackendProtocol::Lsapi, 1)
        );
        for other in ["scgi", "fastcgi"] {
            let src = format!("{APP_POOL}app = \"{app}\"\nprotocol = \"{other}\"\n");
            expect_error(
                &src,
                &format!("\"{app}\""),
                &format!("protocol = \"{other}\" cannot reach an app = ... pool"),
            );
        }
        // A second request would wait behind the kept connection the worker is serving.
        let src = format!("{APP_POOL}app = \"{app}\"\nconcurrency = 2\n");
        expect_error(&src, "2\n", "concurrency must be 1");
    }
}

#[test]
fn php_children_makes_each_worker_a_group_and_moves_max_requests_into_the_group() {
    let src = r#"
[[listen]]
address = "127.0.0.1:8080"
protocol = "http"

[pools.php]
command = ["php-cgi"]
mode = "static"
max = 2
php_children = 8
max_requests = 500
[[contexts]]
pool = "php"
root = "/srv/www"
"#;
    let c = ok(src);
    let p = &c.pools[0];
    assert_eq!(p.concurrency, 8, "a group takes one request per child");
    assert_eq!(p.max_conns, 16, "2 groups × 8 children");
    let s = spawn(p);
    // Per child, kept with the group (the pool state counts it per group, php-cgi per child
    // in a direct pool): not a per-worker budget.
    assert_eq!(s.recycle.max_requests, None);
    assert_eq!(
        s.php_children,
        Some(crate::config::PhpChildren {
            children: 8,
            max_requests: Some(500),
            max_requests_jitter: 50,
        })
    );
}

#[test]
fn php_children_rules() {
    let src = r#"
[[listen]]
address = "127.0.0.1:8080"
protocol = "http"

[pools.a]
command = ["php-cgi"]
php_children = 0

[pools.b]
command = ["php-cgi"]
php_children = 4
concurrency = 2

[pools.c]
app = "wsgi:app:application"
php_children = 3

[pools.d]
command = ["php-cgi"]
env = { PHP_FCGI_CHILDREN = "4" }
[[contexts]]
pool = "a"
[[contexts]]
pool = "b"
[[contexts]]
pool = "c"
[[contexts]]
pool = "d"
"#;
    expect_error(src, "0\n", "php_children must be between 1 and 256");
    expect_error(src, "2\n", "concurrency 2 differs from php_children 4");
    expect_error(src, "3\n", "php_children applies to a php-cgi pool");
    expect_error(src, "\"4\"", "use php_children");
}
