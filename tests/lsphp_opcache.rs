//! lsphp spawned by corral with OPcache loaded through the pool's `command` (`-c` with a
//! php.ini saying `zend_extension=…/opcache.so` and `opcache.enable=1`, the build
//! scripts/build-lsphp.sh caches beside the binary; lsphp takes no `-d` options) really runs
//! with OPcache on; with no php.ini it does not, so the check tells the two apart. corral
//! spawns each lsphp worker as a process of its own (no `LSAPI_CHILDREN`), so each worker
//! has its own OPcache.

mod support;

use std::path::Path;

use support::peers;
use support::server::{http, Corral};

const OPCACHE_ON: &str = "<?php var_export(function_exists('opcache_get_status') \
                          && opcache_get_status(false) !== false);";

/// A corral serving `dir` from a static pool of two lsphp workers run with `args`.
fn lsphp_pool(dir: &Path, args: &[&str]) -> Corral {
    let mut command = format!("{:?}", peers::LSPHP);
    for a in args {
        command.push_str(&format!(", {a:?}"));
    }
    Corral::start(
        &format!(
            r#"
[server]
runtime_dir = "{run}"
log_level = "debug"

[[listen]]
address = "127.0.0.1:0"
protocol = "http"

[pools.php]
protocol = "lsapi"
command = [{command}]
mode = "static"
min = 2
max = 2

[[contexts]]
pool = "php"
root = "{root}"
"#,
            run = dir.join("run").display(),
            root = dir.display()
        ),
        1,
    )
}

fn opcache_on(dir: &Path, corral: &Corral) -> String {
    peers::write_file(dir, "opcache.php", OPCACHE_ON);
    let r = http(corral.http_addr(), "GET", "/opcache.php", &[], b"");
    assert_eq!(r.status, 200, "{}", corral.log());
    r.text()
}

#[test]
fn lsphp_has_opcache_on_when_the_pool_loads_it() {
    assert!(
        Path::new(peers::LSPHP_OPCACHE).is_file(),
        "no {}: run scripts/build-lsphp.sh",
        peers::LSPHP_OPCACHE
    );
    let dir = peers::shared_dir();
    let ini = peers::write_file(
        dir.path(),
        "php.ini",
        &format!(
            "zend_extension={}\nopcache.enable=1\n",
            peers::LSPHP_OPCACHE
        ),
    );
    let corral = lsphp_pool(dir.path(), &["-c", &ini.display().to_string()]);
    assert_eq!(opcache_on(dir.path(), &corral), "true", "{}", corral.log());
    // A second script compiled and served from the cache alike; hello world still answers.
    peers::write_file(dir.path(), "hello.php", "<?php echo 'Hello';");
    for _ in 0..4 {
        let r = http(corral.http_addr(), "GET", "/hello.php", &[], b"");
        assert_eq!((r.status, r.text().as_str()), (200, "Hello"));
    }
}

#[test]
fn lsphp_has_no_opcache_unless_the_pool_loads_it() {
    let dir = peers::shared_dir();
    let corral = lsphp_pool(dir.path(), &["-n"]);
    assert_eq!(opcache_on(dir.path(), &corral), "false", "{}", corral.log());
}
