//! `corral convert php-fpm`: Debian's own php-fpm.conf and www.conf (from the php8.2-fpm
//! package scripts/setup-peers.sh installs) convert into a configuration `corral check`
//! accepts and that serves PHP through corral; a multi-pool configuration with relative
//! `include` globs and `$pool` maps each directive as asserted; what php-fpm would refuse is
//! an error naming FILE:LINE. How `pm` becomes a group of php-cgi children, or separate
//! workers, is tested in tests/convert_phpfpm_groups.rs.

mod support;

use std::path::{Path, PathBuf};

use support::convert::{
    assert_checks, assert_line, assert_refused, convert, converted, keys, pool_table, run_moved,
};
use support::fastcgi::{fastcgi_status, nginx_params};
use support::front::Nginx;
use support::peers::{shared_dir, write_file};
use support::server::http;

const DEBIAN_CONF: &str = "/etc/php/8.2/fpm/php-fpm.conf";
const DEBIAN_POOL: &str = "/etc/php/8.2/fpm/pool.d/www.conf";
const DEBIAN_SOCKET: &str = "/run/php/php8.2-fpm.sock";

/// Every directive (not a comment, not a section) of the file.
fn directives(path: &str) -> Vec<String> {
    std::fs::read_to_string(path)
        .unwrap()
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with(';') && !l.starts_with('['))
        .map(|l| l.split('=').next().unwrap().trim().to_owned())
        .collect()
}

#[test]
fn debians_php_fpm_conf_converts_into_a_configuration_corral_check_accepts() {
    let toml = converted(&[DEBIAN_CONF]);
    assert_checks(&toml);
    // The include was followed: www.conf's pool is here.
    assert!(
        toml.contains("include = /etc/php/8.2/fpm/pool.d/*.conf read 1 file(s)"),
        "{toml}"
    );
    assert_line(&toml, "[pools.www]");
    assert_line(&toml, &format!("address = \"unix:{DEBIAN_SOCKET}\""));
    assert_line(&toml, "protocol = \"fastcgi\"");
    assert_line(&toml, "owner = \"www-data\"");
    assert_line(&toml, "group = \"www-data\"");
    assert_line(&toml, "mode = \"0660\"");
    // php-fpm's own php.ini and conf.d, which php-cgi would not read otherwise.
    assert_line(
        &toml,
        "command = [\"php-cgi\", \"-c\", \"/etc/php/8.2/fpm/php.ini\"]",
    );
    assert_line(
        &toml,
        "env = { PHP_INI_SCAN_DIR = \"/etc/php/8.2/fpm/conf.d\" }",
    );
    // pm = dynamic, pm.max_children = 5: one php-cgi parent whose 5 children share its
    // OPcache, all forked at start (tests/convert_phpfpm_groups.rs has the mapping).
    let www = pool_table(&toml, "www");
    assert_line(www, "mode = \"static\"");
    assert_line(www, "max = 1");
    assert_line(www, "php_children = 5");
    for key in ["min", "spare_min", "spare_max"] {
        assert!(!keys(www).contains(&key), "{key} in:\n{www}");
    }
    for spare in [
        "pm.start_servers = 2: not mapped",
        "pm.min_spare_servers = 1: not mapped",
        "pm.max_spare_servers = 3: not mapped",
    ] {
        assert!(www.contains(spare), "{spare} not in:\n{www}");
    }
    assert_line(&toml, "user = \"www-data\"");
    assert_line(&toml, &format!("listen = \"unix:{DEBIAN_SOCKET}\""));
    assert_line(&toml, "root = \"/var/www/html\"");
    assert_line(&toml, "extension = \"phar\"");
    let somaxconn = std::fs::read_to_string("/proc/sys/net/core/somaxconn").unwrap();
    assert_line(&toml, &format!("backlog = {}", somaxconn.trim()));
    // Every directive Debian sets is named in the output, mapped or commented.
    for file in [DEBIAN_CONF, DEBIAN_POOL] {
        for d in directives(file) {
            if d == "include" {
                continue;
            }
            assert!(
                toml.contains(&format!("# {d}"))
                    || toml.contains(&format!(" {d} = "))
                    || toml.contains(&format!("# {d} =")),
                "{file}: {d} is neither mapped nor commented:\n{toml}"
            );
        }
    }
    assert!(
        toml.contains("pid = /run/php/php8.2-fpm.pid: not mapped: corral keeps its pid file"),
        "{toml}"
    );
    assert!(
        toml.contains("php-fpm.conf:26 error_log = /var/log/php8.2-fpm.log: not mapped"),
        "{toml}"
    );
    assert!(
        toml.contains("www.conf:"),
        "comments name the file and line:\n{toml}"
    );
    // The pool file alone converts the same pool, php.ini found beside its pool.d.
    let alone = converted(&[DEBIAN_POOL]);
    assert_checks(&alone);
    assert_line(&alone, "[pools.www]");
    assert_line(
        &alone,
        "command = [\"php-cgi\", \"-c\", \"/etc/php/8.2/fpm/php.ini\"]",
    );
    let own = converted(&[DEBIAN_CONF, "--php-ini", "none"]);
    assert_checks(&own);
    assert_line(&own, "command = [\"php-cgi\"]");
    assert!(!own.contains("PHP_INI_SCAN_DIR"), "{own}");
}

#[test]
fn debians_converted_configuration_serves_php_through_corral() {
    let dir = shared_dir();
    let root = dir.path().join("www");
    std::fs::create_dir(&root).unwrap();
    std::fs::set_permissions(&root, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    write_file(
        &root,
        "hello.php",
        "<?php echo 'hello from ', posix_getpwuid(posix_geteuid())['name'], ' with ', php_ini_loaded_file(), \"\\n\";",
    );
    let toml = converted(&[DEBIAN_CONF, "--root", root.to_str().unwrap()]);
    let socket = dir.path().join("php8.2-fpm.sock");
    let corral = run_moved(
        &toml,
        dir.path(),
        &[(DEBIAN_SOCKET, socket.display().to_string())],
        1,
    );
    let (status, body) = fastcgi_status(&socket, &nginx_params(&root, "/hello.php", "/hello.php"));
    let body = String::from_utf8_lossy(&body);
    assert_eq!(status, 200, "{body}\n{}", corral.log());
    // www.conf's user: the worker runs as www-data.
    assert!(
        body.contains("hello from www-data with /etc/php/8.2/fpm/php.ini\n"),
        "{body}\n{}",
        corral.log()
    );
    // The guard: a script outside --root is refused before any worker is asked, and a
    // missing one is 404.
    let (status, _) = fastcgi_status(
        &socket,
        &nginx_params(Path::new("/etc"), "/passwd.php", "/passwd.php"),
    );
    assert_eq!(status, 403);
    let (status, _) = fastcgi_status(
        &socket,
        &nginx_params(&root, "/missing.php", "/missing.php"),
    );
    assert_eq!(status, 404);
    // And through real nginx, with the location block Debian's default site has for
    // php-fpm, only its fastcgi_pass path moved.
    let nginx_dir = dir.path().join("nginx");
    std::fs::create_dir(&nginx_dir).unwrap();
    let server = format!(
        "root {root};\n\
         location ~ \\.php$ {{\n\
           fastcgi_split_path_info ^(.+?\\.php)(/.*)$;\n\
           try_files $fastcgi_script_name =404;\n\
           include /etc/nginx/fastcgi.conf;\n\
           fastcgi_pass unix:{socket};\n\
         }}\n",
        root = root.display(),
        socket = socket.display()
    );
    let nginx = Nginx::start(&nginx_dir, "", &[server]);
    let addr = format!("127.0.0.1:{}", nginx.ports[0]).parse().unwrap();
    let page = http(addr, "GET", "/hello.php", &[], b"");
    assert_eq!(page.status, 200, "{}\n{}", page.text(), nginx.error_log());
    assert!(
        page.text().contains("hello from www-data"),
        "{}",
        page.text()
    );
}

/// A php-fpm tree with two files of pools included through a relative glob.
fn multi_pool_tree(dir: &Path) -> PathBuf {
    std::fs::create_dir_all(dir.join("etc/pool.d")).unwrap();
    std::fs::create_dir_all(dir.join("log")).unwrap();
    let main = dir.join("etc/php-fpm.conf");
    std::fs::write(
        &main,
        "[global]\n\
         pid = run/php-fpm.pid\n\
         error_log = syslog\n\
         log_level = warning\n\
         emergency_restart_threshold = 10\n\
         emergency_restart_interval = 1m\n\
         process_control_timeout = 7s\n\
         daemonize = no\n\
         include = etc/pool.d/*.conf ; relative: taken from the prefix\n",
    )
    .unwrap();
    std::fs::write(
        dir.join("etc/pool.d/a-static.conf"),
        format!(
            "[site.a]\n\
             user = www-data\n\
             listen = {dir}/$pool.sock\n\
             listen.mode = 660\n\
             pm = static\n\
             pm.max_children = 3\n\
             pm.max_requests = 500\n\
             request_terminate_timeout = 30s\n\
             request_slowlog_timeout = 5s\n\
             slowlog = log/$pool.slow\n\
             access.log = log/$pool.access\n\
             access.format = \"%R - %u %t \\\"%m %r\\\" %s\"\n\
             pm.status_path = /fpm-status\n\
             ping.path = /fpm-ping\n\
             ping.response = alive\n\
             env[GREETING] = first\n\
             access.suppress_path[] = /fpm-ping\n\
             env[GREETING] = \"hello; world\"\n\
             env[FROM_ENV] = $CORRAL_TEST_FROM_ENV\n\
             php_value[memory_limit] = 64M\n\
             php_admin_value[error_reporting] = E_ALL & ~E_NOTICE\n\
             php_admin_value[error_log] = /var/log/$pool.php.log\n\
             php_flag[display_errors] = off\n\
             php_admin_flag[log_errors] = on\n\
             chdir = /\n\
             rlimit_files = 4096\n\
             catch_workers_output = yes\n\
             clear_env = no\n\
             security.limit_extensions = .php .php7\n",
            dir = dir.display()
        ),
    )
    .unwrap();
    std::fs::write(
        dir.join("etc/pool.d/b-ondemand.conf"),
        format!(
            "[b]\n\
             user = www-data\n\
             listen = {dir}/b.sock\n\
             pm = ondemand\n\
             pm.max_children = 4\n\
             pm.process_idle_timeout = 20s\n\
             [site.a]\n\
             pm.max_requests = 800 ; reopened pool: the later value wins\n",
            dir = dir.display()
        ),
    )
    .unwrap();
    main
}

#[test]
fn a_multi_pool_configuration_with_includes_and_pool_maps_every_directive() {
    let dir = shared_dir();
    let main = multi_pool_tree(dir.path());
    let d = dir.path().display();
    let prefix = dir.path().to_str().unwrap();
    let out = {
        let mut cmd = std::process::Command::new(support::CORRAL);
        cmd.args(["convert", "php-fpm", "--prefix", prefix])
            .arg(&main)
            .env("CORRAL_TEST_FROM_ENV", "copied");
        support::run(cmd, support::QUICK)
    };
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    let toml = out.stdout;
    assert_checks(&toml);
    // [global]
    assert_line(&toml, "log_level = \"warn\"");
    assert_line(&toml, "grace = \"7s\"");
    for d in [
        "emergency_restart_threshold = 10",
        "emergency_restart_interval = 1m",
        "daemonize = no",
        "error_log = syslog",
    ] {
        assert!(toml.contains(&format!("{d}: not mapped")), "{d}:\n{toml}");
    }
    assert!(toml.contains("pid = run/php-fpm.pid: not mapped"), "{toml}");
    // Pool site.a: renamed, $pool expanded, relative paths from the prefix.
    assert_line(&toml, "[pools.site_a]");
    assert!(
        toml.contains("php-fpm's pool [site.a] is named \"site_a\""),
        "{toml}"
    );
    assert_line(&toml, &format!("address = \"unix:{d}/site.a.sock\""));
    assert_line(&toml, "mode = \"0660\"");
    // pm = static: one php-cgi parent whose 3 children share its OPcache, as php-fpm's do.
    let a = pool_table(&toml, "site_a");
    assert_line(a, "mode = \"static\"");
    assert_line(a, "max = 1");
    assert_line(a, "php_children = 3");
    assert_line(a, "max_requests = 800");
    assert!(
        toml.contains("pm.max_requests = 500: not mapped: overridden by a later line"),
        "{toml}"
    );
    assert_line(&toml, "request_timeout = \"30s\"");
    assert_line(&toml, "slow_threshold = \"5s\"");
    assert_line(&toml, &format!("slow_log = \"{d}/log/site.a.slow\""));
    assert_line(&toml, &format!("access_log = \"{d}/log/site.a.access\""));
    assert!(
        toml.contains("access.format = %R - %u %t \"%m %r\" %s: not mapped"),
        "{toml}"
    );
    assert_line(&toml, "status_path = \"/fpm-status\"");
    assert_line(&toml, "ping_path = \"/fpm-ping\"");
    assert!(toml.contains("ping.response = alive: not mapped"), "{toml}");
    assert_line(
        &toml,
        "env = { GREETING = \"hello; world\", FROM_ENV = \"copied\" }",
    );
    assert_line(
        &toml,
        "command = [\"php-cgi\", \"-d\", \"memory_limit=64M\", \"-d\", \"display_errors=0\", \"-d\", \"error_reporting=E_ALL & ~E_NOTICE\", \"-d\", 'error_log=\"/var/log/site.a.php.log\"', \"-d\", \"log_errors=1\"]",
    );
    assert_line(&toml, "cwd = \"/\"");
    assert!(
        toml.contains("env[GREETING] = first: not mapped: overridden by a later line"),
        "{toml}"
    );
    assert!(
        toml.contains("access.suppress_path[] = /fpm-ping: not mapped"),
        "{toml}"
    );
    assert!(toml.contains("rlimit_files = 4096: not mapped"), "{toml}");
    assert!(
        toml.contains(
            "catch_workers_output = yes: not mapped: corral always logs workers' stdout and stderr"
        ),
        "{toml}"
    );
    assert!(
        toml.contains("clear_env = no: not mapped: corral always clears"),
        "{toml}"
    );
    assert_line(&toml, "extension = \"php7\"");
    assert!(
        !toml.contains("limit_extensions = .php .php7: not mapped"),
        "mapped, so not also commented:\n{toml}"
    );
    // Only pool b, with php-fpm's default .php .phar, has a .phar context.
    assert_eq!(toml.matches("extension = \"phar\"").count(), 1, "{toml}");
    // Pool b: ondemand, one group of 4 children started on demand.
    assert_line(&toml, &format!("address = \"unix:{d}/b.sock\""));
    let b = pool_table(&toml, "b");
    assert_line(b, "mode = \"ondemand\"");
    assert_line(b, "max = 1");
    assert_line(b, "php_children = 4");
    assert_line(b, "idle_timeout = \"20s\"");
}

#[test]
fn the_converted_multi_pool_configuration_runs_each_pool_with_its_php_values() {
    let dir = shared_dir();
    let main = multi_pool_tree(dir.path());
    let root = dir.path().join("www");
    std::fs::create_dir(&root).unwrap();
    std::fs::set_permissions(&root, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    write_file(&root, "ini.php", "<?php echo ini_get('memory_limit'), ' ', error_reporting(), ' ', ini_get('display_errors'), ' ', getenv('GREETING'), \"\\n\";");
    let toml = converted(&[
        "--prefix",
        dir.path().to_str().unwrap(),
        "--root",
        root.to_str().unwrap(),
        main.to_str().unwrap(),
    ]);
    // log_level = warning would hide the lines the harness waits for.
    let corral = run_moved(
        &toml,
        dir.path(),
        &[("log_level = \"warn\"", "log_level = \"info\"".to_owned())],
        2,
    );
    let a = dir.path().join("site.a.sock");
    let (status, body) = fastcgi_status(&a, &nginx_params(&root, "/ini.php", "/ini.php"));
    let body = String::from_utf8_lossy(&body);
    assert_eq!(status, 200, "{body}\n{}", corral.log());
    // E_ALL & ~E_NOTICE, evaluated by php-cgi as php-fpm's INI parser would.
    // php_flag[display_errors] = off is 0; env[GREETING] reaches the worker.
    assert!(body.contains("64M 32759 0 hello; world\n"), "{body}");
    let (status, body) = fastcgi_status(
        &dir.path().join("b.sock"),
        &nginx_params(&root, "/ini.php", "/ini.php"),
    );
    assert_eq!(
        status,
        200,
        "{}\n{}",
        String::from_utf8_lossy(&body),
        corral.log()
    );
    assert!(
        !String::from_utf8_lossy(&body).contains("64M"),
        "pool b has no php_value"
    );
    // php-fpm's status path on the pool's listener, answered by corral.
    let mut params = nginx_params(&root, "/fpm-status", "/fpm-status");
    params.retain(|(n, _)| *n != "SCRIPT_FILENAME");
    let (status, body) = fastcgi_status(&a, &params);
    let body = String::from_utf8_lossy(&body);
    assert_eq!(status, 200, "{body}");
    assert!(body.contains("accepted conn"), "{body}");
    drop(corral);
}

#[test]
fn tcp_listeners_get_their_allowed_clients() {
    let dir = tempfile::tempdir().unwrap();
    let conf = dir.path().join("tcp.conf");
    std::fs::write(
        &conf,
        "[local]\nuser = www-data\nlisten = 127.0.0.1:9011\nlisten.allowed_clients = 127.0.0.1, ::1\npm = static\npm.max_children = 1\n\
         [every]\nuser = www-data\nlisten = 9012\npm = static\npm.max_children = 1\n\
         [named]\nuser = www-data\nlisten = [::1]:9013\nlisten.owner = nobody\npm = static\npm.max_children = 1\n",
    )
    .unwrap();
    let toml = converted(&[conf.to_str().unwrap()]);
    assert_checks(&toml);
    assert_line(&toml, "address = \"127.0.0.1:9011\"");
    assert_line(&toml, "allow = [\"127.0.0.1/32\", \"::1/128\"]");
    assert_line(&toml, "address = \"0.0.0.0:9012\"");
    assert_line(&toml, "allow = [\"0.0.0.0/0\"]");
    assert_line(&toml, "address = \"[::1]:9013\"");
    assert!(
        toml.contains("listen.owner = nobody: not mapped: php-fpm uses it for unix sockets only"),
        "{toml}"
    );
    // A unix socket with only listen.owner: php-fpm's group is the owner's primary group.
    let conf = dir.path().join("owner.conf");
    std::fs::write(
        &conf,
        "[o]\nuser = www-data\nlisten = /run/o.sock\nlisten.owner = nobody\npm = static\npm.max_children = 1\n",
    )
    .unwrap();
    let toml = converted(&[conf.to_str().unwrap()]);
    assert_checks(&toml);
    assert_line(&toml, "owner = \"nobody\"");
    assert_line(&toml, "group = \"nogroup\"");
}

#[test]
fn what_php_fpm_would_refuse_is_an_error_naming_file_and_line() {
    let pool = "[www]\nuser = www-data\nlisten = /run/x.sock\npm = static\npm.max_children = 2\n";
    assert_refused(
        format!("{pool}pm.max_chidlren = 5\n").as_bytes(),
        6,
        "unknown entry 'pm.max_chidlren'",
    );
    assert_refused(
        format!("{pool}listen\n").as_bytes(),
        6,
        "expected `name = value`",
    );
    assert_refused(format!("{pool}user = a\0b\n").as_bytes(), 6, "NUL byte");
    assert_refused(format!("{pool}# comment\n").as_bytes(), 6, "use ';'");
    assert_refused(
        format!("{pool}chdir = \"/srv\n").as_bytes(),
        6,
        "not closed",
    );
    assert_refused(
        b"[www]\nuser = www-data\npm = static\npm.max_children = 2\n",
        1,
        "no listen address",
    );
    assert_refused(b"[www]\nlisten = /run/x.sock\npm = dynamic\npm.max_children = 2\npm.min_spare_servers = 3\npm.max_spare_servers = 3\n", 6, "cannot be greater than pm.max_children(2)");
    let mut huge = pool.as_bytes().to_vec();
    huge.extend_from_slice(b"chdir = ");
    huge.extend(std::iter::repeat_n(b'a', 100_000));
    assert_refused(&huge, 6, "longer than");
    // An include loop ends at php-fpm's depth.
    let dir = tempfile::tempdir().unwrap();
    let conf = dir.path().join("loop.conf");
    std::fs::write(&conf, format!("{pool}include = {}\n", conf.display())).unwrap();
    let out = convert(&[conf.to_str().unwrap()]);
    assert_eq!(out.code, Some(64));
    assert!(out.stderr.contains("include loop"), "{}", out.stderr);
    // A missing file.
    let out = convert(&[dir.path().join("missing.conf").to_str().unwrap()]);
    assert_eq!(out.code, Some(64));
    assert!(
        out.stderr.contains("missing.conf: cannot open"),
        "{}",
        out.stderr
    );
}
