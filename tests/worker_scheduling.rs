//! `scheduling_policy` with real workers: every process a pool runs, the ones its worker
//! forks included (a php-cgi parent's children, the native PHP worker's fork template and
//! the workers forked from it), is under `SCHED_BATCH` by default and under `SCHED_OTHER`
//! when the pool asks for `other`; each answers requests under it (docs/pools.md, "The
//! supervisor"; decision 31).

mod support;

use std::time::Duration;

use support::server::{http, Corral};
use support::{eventually, native, peers};

/// `SCHED_OTHER` and `SCHED_BATCH` as /proc/PID/stat's `policy` field gives them.
const OTHER: u32 = 0;
const BATCH: u32 = 3;

/// Field 41 of /proc/PID/stat (`policy`), `None` once the process is gone.
fn policy(pid: u32) -> Option<u32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The fields after the command name start at field 3 (state).
    let fields: Vec<&str> = stat.rsplit_once(") ")?.1.split(' ').collect();
    fields.get(41 - 3)?.parse().ok()
}

/// Every live process under `root` (not `root` itself), with its command line.
fn descendants(root: u32) -> Vec<(u32, String)> {
    let mut found = Vec::new();
    let mut parents = vec![root];
    while let Some(parent) = parents.pop() {
        for child in corral::process::php_children::children_of(parent) {
            let cmdline = std::fs::read(format!("/proc/{child}/cmdline")).unwrap_or_default();
            let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
            found.push((child, cmdline));
            parents.push(child);
        }
    }
    found
}

#[test]
fn workers_and_what_they_fork_run_under_the_pools_policy() {
    let dir = peers::shared_dir();
    peers::write_file(dir.path(), "pid.php", "<?php echo getmypid();");
    let run = dir.path().join("run");
    let root = dir.path();
    let worker = native::worker();
    // Each pool is told apart by a php-cgi option only it passes, or by its program.
    let config = format!(
        r#"
[server]
runtime_dir = "{run}"
grace = "2s"
kill_timeout = "2s"
log_level = "debug"

[[listen]]
address = "127.0.0.1:0"
protocol = "http"

[pools.cgi]
command = ["php-cgi", "-d", "memory_limit=71M"]
mode = "static"
max = 2

[pools.other]
command = ["php-cgi", "-d", "memory_limit=72M"]
mode = "static"
max = 1
scheduling_policy = "other"

[pools.children]
command = ["php-cgi", "-d", "memory_limit=73M"]
mode = "static"
max = 1
php_children = 2

[pools.native]
worker = "native"
worker_path = "{worker}"
mode = "static"
max = 2

[[contexts]]
host = "cgi"
pool = "cgi"
root = "{root}"

[[contexts]]
host = "other"
pool = "other"
root = "{root}"

[[contexts]]
host = "children"
pool = "children"
root = "{root}"

[[contexts]]
host = "native"
pool = "native"
root = "{root}"
"#,
        run = run.display(),
        root = root.display(),
        worker = worker.display(),
    );
    let corral = Corral::start(&config, 1);

    // The process that answers each pool's request runs under the pool's policy.
    for (host, wanted) in [
        ("cgi", BATCH),
        ("other", OTHER),
        ("children", BATCH),
        ("native", BATCH),
    ] {
        let r = http(
            corral.http_addr(),
            "GET",
            "/pid.php",
            &[("Host", host)],
            b"",
        );
        assert_eq!(r.status, 200, "{host}: {}\n{}", r.text(), corral.log());
        let pid: u32 = r.text().trim().parse().expect("a pid");
        assert_eq!(policy(pid), Some(wanted), "{host}'s worker {pid}");
    }

    // And so does every process each pool runs: 2 php-cgi, 1 php-cgi, a php-cgi parent and
    // its 2 children, the native worker's fork template and its 2 workers.
    let expected = [("71M", 2), ("72M", 1), ("73M", 3), ("corral-php-worker", 3)];
    let mut tree = Vec::new();
    let complete = eventually(Duration::from_secs(10), || {
        tree = descendants(corral.pid());
        expected
            .iter()
            .all(|(marker, n)| tree.iter().filter(|(_, cmd)| cmd.contains(marker)).count() == *n)
    });
    assert!(complete, "not every worker is up: {tree:#?}");
    for (pid, cmd) in &tree {
        let wanted = if cmd.contains("72M") { OTHER } else { BATCH };
        if let Some(got) = policy(*pid) {
            assert_eq!(got, wanted, "{pid} {cmd}");
        }
    }
}
