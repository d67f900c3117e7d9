//! `corral convert php-fpm` maps every process manager to one php-cgi parent whose children
//! share its OPcache (`max = 1`, `php_children = pm.max_children`), as php-fpm's children
//! share their master's: `static` and `dynamic` as a static group (all children forked at
//! start, never more processes than php-fpm's peak), `ondemand` as an ondemand group. Above
//! `MAX_PHP_CHILDREN` each stays separate workers. Every output passes `corral check`, and a
//! converted ondemand pool is run with real php-cgi behind corral's http listener.

mod support;

use std::path::Path;
use std::time::Duration;

use corral::config::MAX_PHP_CHILDREN;
use support::convert::{
    assert_checks, assert_line, assert_refused, converted, keys, pool_table, run_moved,
};
use support::peers::{shared_dir, write_file};
use support::server::http;
use support::{alive, eventually, live_children};

/// php-fpm's pool `[www]` with `pm_lines` (one directive a line, starting at line 4 of the
/// file), converted and accepted by `corral check`; the file's path and the `[pools.www]`
/// table.
fn www(dir: &Path, name: &str, pm_lines: &str) -> (String, String) {
    let conf = dir.join(format!("{name}.conf"));
    std::fs::write(
        &conf,
        format!("[www]\nuser = www-data\nlisten = /run/x.sock\n{pm_lines}"),
    )
    .unwrap();
    let toml = converted(&[conf.to_str().unwrap()]);
    assert_checks(&toml);
    (
        conf.display().to_string(),
        pool_table(&toml, "www").to_owned(),
    )
}

/// The comment of the line setting `key` in `table`.
#[track_caller]
fn comment<'t>(table: &'t str, key: &str) -> &'t str {
    let prefix = format!("{key} = ");
    table
        .lines()
        .find(|l| l.starts_with(&prefix))
        .and_then(|l| l.split_once(" # "))
        .map(|(_, c)| c)
        .unwrap_or_else(|| panic!("no commented {key} in:\n{table}"))
}

/// A group's keys, in the order the converter writes them.
const GROUP: [&str; 7] = [
    "command",
    "mode",
    "max",
    "php_children",
    "max_requests",
    "user",
    "group",
];

#[track_caller]
fn assert_per_child_max_requests(table: &str) {
    assert_line(table, "max_requests = 500");
    assert!(
        comment(table, "max_requests")
            .starts_with("pm.max_requests, per child: corral replaces the whole group"),
        "{table}"
    );
}

#[test]
fn a_static_pool_becomes_one_group_of_children_within_php_cgis_bound() {
    let dir = tempfile::tempdir().unwrap();
    let (_, group) = www(
        dir.path(),
        "static",
        "pm = static\npm.max_children = 8\npm.max_requests = 500\npm.start_servers = 3\n\
         request_terminate_timeout = 30s\n",
    );
    assert_eq!(keys(&group)[..GROUP.len()], GROUP, "{group}");
    assert_eq!(keys(&group)[GROUP.len()..], ["request_timeout"], "{group}");
    assert_line(&group, "mode = \"static\"");
    assert_eq!(comment(&group, "mode"), "pm", "{group}");
    assert_line(&group, "max = 1");
    assert_line(&group, "php_children = 8");
    assert!(
        comment(&group, "php_children").contains("they share its OPcache"),
        "{group}"
    );
    assert_per_child_max_requests(&group);
    assert!(
        group.contains(
            "static.conf:7 pm.start_servers = 3: not mapped: php-fpm ignores it in a static pool"
        ),
        "{group}"
    );
    // A stuck child: its group is replaced, the other children finishing first.
    assert_line(&group, "request_timeout = \"30s\"");
    assert!(
        comment(&group, "request_timeout")
            .contains("the group is replaced, stopped once its other children's requests are done"),
        "{group}"
    );
}

#[test]
fn a_dynamic_pool_becomes_one_group_forked_at_start_and_its_spare_settings_are_noted() {
    let dir = tempfile::tempdir().unwrap();
    let (conf, group) = www(
        dir.path(),
        "dynamic",
        "pm = dynamic\npm.max_children = 6\npm.start_servers = 2\npm.min_spare_servers = 1\n\
         pm.max_spare_servers = 3\npm.max_requests = 500\npm.max_spawn_rate = 8\n\
         pm.process_idle_timeout = 5s\n",
    );
    assert_eq!(keys(&group), GROUP, "{group}");
    assert_line(&group, "mode = \"static\"");
    assert_line(&group, "max = 1");
    assert_line(&group, "php_children = 6");
    // Why, on the lines themselves: all forked at start, a shared OPcache, php-fpm's peak.
    assert!(
        comment(&group, "mode") == "pm = dynamic: the group's children are all forked at start",
        "{group}"
    );
    assert_eq!(
        comment(&group, "max"),
        "one php-cgi parent, whose children (php_children) take the requests",
        "{group}"
    );
    let children = comment(&group, "php_children");
    for why in [
        "pm.max_children: forked by that parent, they share its OPcache as php-fpm's children share their master's",
        "never more processes than php-fpm's peak",
    ] {
        assert!(children.contains(why), "{why} not in:\n{group}");
    }
    assert_per_child_max_requests(&group);
    // The spare settings have no equivalent, each said at its line.
    let forks_all = "not mapped: php-cgi's parent forks all its children at once, so the pool runs pm.max_children processes from the start: as many as php-fpm at full load, never more";
    for (line, directive) in [
        (6, "pm.start_servers = 2"),
        (7, "pm.min_spare_servers = 1"),
        (8, "pm.max_spare_servers = 3"),
    ] {
        let note = format!("# {conf}:{line} {directive}: {forks_all}");
        assert!(group.contains(&note), "{note} not in:\n{group}");
    }
    assert!(
        group.contains(
            "pm.max_spawn_rate = 8: not mapped: php-cgi's parent forks all its children at once"
        ),
        "{group}"
    );
    assert!(
        group.contains("pm.process_idle_timeout = 5s: not mapped: php-fpm uses it in ondemand pools only; this pool's group of children runs from start to stop"),
        "{group}"
    );
    // No pm.start_servers: php-fpm's own default is named.
    let (_, group) = www(
        dir.path(),
        "default-start",
        "pm = dynamic\npm.max_children = 6\npm.min_spare_servers = 2\npm.max_spare_servers = 4\n",
    );
    assert_line(&group, "php_children = 6");
    assert!(
        group.contains(&format!(
            "# pm.start_servers not set (php-fpm starts 3): {forks_all}"
        )),
        "{group}"
    );
    // php-fpm's own checks on them still hold, at their lines.
    let pool = "[www]\nuser = www-data\nlisten = /run/x.sock\npm = dynamic\npm.max_children = 6\n";
    assert_refused(
        format!("{pool}pm.min_spare_servers = 1\npm.max_spare_servers = 3\npm.start_servers = 5\n")
            .as_bytes(),
        8,
        "pm.start_servers(5) must not be less than pm.min_spare_servers(1) and not greater than pm.max_spare_servers(3)",
    );
    assert_refused(
        format!("{pool}pm.min_spare_servers = 3\npm.max_spare_servers = 2\n").as_bytes(),
        7,
        "pm.max_spare_servers(2) must not be less than pm.min_spare_servers(3)",
    );
    assert_refused(
        format!("{pool}pm.min_spare_servers = 0\npm.max_spare_servers = 2\n").as_bytes(),
        6,
        "must be positive values",
    );
}

#[test]
fn an_ondemand_pool_becomes_one_group_started_by_the_first_request() {
    let dir = tempfile::tempdir().unwrap();
    let (conf, group) = www(
        dir.path(),
        "ondemand",
        "pm = ondemand\npm.max_children = 4\npm.process_idle_timeout = 20s\n\
         pm.max_requests = 500\npm.min_spare_servers = 1\n",
    );
    assert_eq!(
        keys(&group),
        [
            "command",
            "mode",
            "max",
            "php_children",
            "idle_timeout",
            "max_requests",
            "user",
            "group"
        ],
        "{group}"
    );
    assert_line(&group, "mode = \"ondemand\"");
    assert_line(&group, "max = 1");
    assert_line(&group, "php_children = 4");
    assert_line(&group, "idle_timeout = \"20s\"");
    assert!(
        comment(&group, "mode").starts_with("pm = ondemand: the group starts at the first request and stops after idle_timeout, so an idle pool costs no process"),
        "{group}"
    );
    assert!(
        comment(&group, "php_children").contains("they share its OPcache"),
        "{group}"
    );
    assert_per_child_max_requests(&group);
    let note = format!(
        "# {conf}:8 pm.min_spare_servers = 1: not mapped: php-fpm ignores it in an ondemand pool"
    );
    assert!(group.contains(&note), "{note} not in:\n{group}");
    // php-fpm's default idle timeout.
    let (_, group) = www(
        dir.path(),
        "default-idle",
        "pm = ondemand\npm.max_children = 4\n",
    );
    assert_line(&group, "idle_timeout = \"10s\"");
    assert_line(&group, "php_children = 4");
}

#[test]
fn above_php_cgis_bound_every_process_manager_stays_separate_workers() {
    let dir = tempfile::tempdir().unwrap();
    let spares = "pm.min_spare_servers = 1\npm.max_spare_servers = 3\n";
    for pm in ["static", "dynamic", "ondemand"] {
        let lines = |children: u32| {
            format!("pm = {pm}\npm.max_children = {children}\npm.max_requests = 500\n{spares}")
        };
        // The bound itself: one parent forks them all.
        let (_, group) = www(dir.path(), &format!("{pm}-at"), &lines(MAX_PHP_CHILDREN));
        assert_line(&group, "max = 1");
        assert_line(&group, &format!("php_children = {MAX_PHP_CHILDREN}"));
        // One more: separate workers, sized as php-fpm sized its children.
        let over = MAX_PHP_CHILDREN + 1;
        let (_, separate) = www(dir.path(), &format!("{pm}-over"), &lines(over));
        assert!(!separate.contains("php_children"), "{separate}");
        assert_line(&separate, &format!("max = {over}"));
        assert_eq!(comment(&separate, "max"), "pm.max_children", "{separate}");
        assert_line(&separate, &format!("mode = \"{pm}\""));
        assert_line(&separate, "max_requests = 500");
        assert!(
            comment(&separate, "max_requests").contains("so workers do not all recycle at once"),
            "{separate}"
        );
        let sizing: Vec<&str> = keys(&separate)
            .into_iter()
            .filter(|k| ["min", "spare_min", "spare_max", "idle_timeout"].contains(k))
            .collect();
        match pm {
            "dynamic" => {
                assert_eq!(sizing, ["min", "spare_min", "spare_max"], "{separate}");
                assert_line(&separate, "min = 1");
                assert_line(&separate, "spare_min = 1");
                assert_line(&separate, "spare_max = 3");
            }
            "ondemand" => {
                assert_eq!(sizing, ["idle_timeout"], "{separate}");
                assert_line(&separate, "idle_timeout = \"10s\"");
            }
            _ => assert!(sizing.is_empty(), "{separate}"),
        }
    }
}

/// The one php-cgi parent corral runs and its children, once it has forked all `n`.
#[track_caller]
fn group_of(corral: u32, n: usize, log: impl Fn() -> String) -> (u32, Vec<u32>) {
    let mut seen = (0, Vec::new());
    let formed = eventually(Duration::from_secs(10), || {
        let parents = live_children(corral);
        let [parent] = parents[..] else {
            return false;
        };
        seen = (parent, live_children(parent));
        seen.1.len() == n
    });
    assert!(formed, "{seen:?}\n{}", log());
    seen
}

#[test]
fn a_converted_ondemand_pool_starts_its_group_at_the_first_request_and_stops_it_when_idle() {
    let dir = shared_dir();
    let root = dir.path().join("www");
    std::fs::create_dir(&root).unwrap();
    std::fs::set_permissions(&root, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    write_file(&root, "pid.php", "<?php echo getmypid();");
    let conf = dir.path().join("od.conf");
    std::fs::write(
        &conf,
        format!(
            "[od]\nuser = www-data\nlisten = {}/od.sock\npm = ondemand\npm.max_children = 3\n\
             pm.process_idle_timeout = 2s\n",
            dir.path().display()
        ),
    )
    .unwrap();
    let toml = converted(&["--root", root.to_str().unwrap(), conf.to_str().unwrap()]);
    let od = pool_table(&toml, "od");
    assert_line(od, "mode = \"ondemand\"");
    assert_line(od, "php_children = 3");
    assert_line(od, "idle_timeout = \"2s\"");
    // The converted pool as it is, with corral's http listener beside the pool's FastCGI one.
    let toml = format!(
        "{toml}[[listen]]\naddress = \"127.0.0.1:0\"\nprotocol = \"http\"\n\n\
         [[contexts]]\nlisten = \"127.0.0.1:0\"\nroot = \"{}\"\npool = \"od\"\n",
        root.display()
    );
    let mut corral = run_moved(&toml, dir.path(), &[], 2);
    let addr = corral.http_addr();
    // Before the first request: no php-cgi at all (a static pool spawns at once).
    std::thread::sleep(Duration::from_secs(1));
    assert_eq!(live_children(corral.pid()), [], "{}", corral.log());
    assert!(!corral.log().contains("worker started"), "{}", corral.log());

    let page = http(addr, "GET", "/pid.php", &[], b"");
    assert_eq!(page.status, 200, "{}\n{}", page.text(), corral.log());
    // One php-cgi parent and its 3 children, one of which ran the script.
    let (parent, children) = group_of(corral.pid(), 3, || corral.log());
    let ran: u32 = page.text().trim().parse().expect("a pid");
    assert!(children.contains(&ran), "{ran} not in {children:?}");

    // Idle past pm.process_idle_timeout: the whole group is stopped.
    let gone = eventually(Duration::from_secs(15), || {
        live_children(corral.pid()).is_empty()
            && !alive(parent)
            && children.iter().all(|&c| !alive(c))
    });
    assert!(gone, "{:?}\n{}", live_children(corral.pid()), corral.log());
    // And the next request starts a new one.
    let page = http(addr, "GET", "/pid.php", &[], b"");
    assert_eq!(page.status, 200, "{}\n{}", page.text(), corral.log());
    let (again, children) = group_of(corral.pid(), 3, || corral.log());
    assert_ne!(again, parent);

    corral.signal(nix::sys::signal::Signal::SIGTERM);
    assert!(
        corral.wait_exited(Duration::from_secs(10)),
        "{}",
        corral.log()
    );
    assert!(
        eventually(Duration::from_secs(5), || !alive(again)
            && children.iter().all(|&c| !alive(c))),
        "php-cgi outlived corral"
    );
}
