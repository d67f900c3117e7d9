//! What a root corral gives its workers and keeps from them, on the real binary with real
//! php-cgi and the embedded WSGI launcher: the workers' user (nobody when none is set),
//! file modes under a wide-open umask, refusing an unsafe runtime directory, not following
//! a link planted where the launcher goes, and no inherited descriptor or corral variable
//! reaching a worker.
//!
//! These tests need root, as CI runs them: only a root corral switches users.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing,
    missing_docs
)]

mod support;

use std::collections::BTreeSet;
use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::thread;
use std::time::Duration;

use support::peers::{shared_dir, write_file};
use support::server::{http, Corral};

/// Prints the uid the script runs as, from the kernel's view.
const WHO_PHP: &str =
    "<?php preg_match('/^Uid:\\s+(\\d+)/m', file_get_contents('/proc/self/status'), $m); \
     echo $m[1];";

/// Prints `uid gid [groups]` of the script's process (real ids), from the kernel's view.
const IDS_PHP: &str = "<?php $s = file_get_contents('/proc/self/status'); \
     preg_match('/^Uid:\\s+(\\d+)/m', $s, $u); preg_match('/^Gid:\\s+(\\d+)/m', $s, $g); \
     preg_match('/^Groups:(.*)$/m', $s, $x); echo $u[1], ' ', $g[1], ' [', trim($x[1]), ']';";

fn require_root() {
    assert!(
        nix::unistd::Uid::effective().is_root(),
        "these tests check what a root corral does with its workers; run them as root as CI does"
    );
}

fn nobody() -> nix::unistd::User {
    nix::unistd::User::from_name("nobody").unwrap().unwrap()
}

/// One http listener in front of a php-cgi pool of one worker; `server` and `pool` are
/// added to their sections.
fn php_config(dir: &Path, server: &str, pool: &str) -> String {
    format!(
        r#"
[server]
runtime_dir = "{run}"
kill_timeout = "2s"
{server}

[[listen]]
address = "127.0.0.1:0"
protocol = "http"

[pools.php]
command = ["php-cgi", "-n"]
mode = "static"
max = 1
{pool}

[[contexts]]
pool = "php"
root = "{root}"
"#,
        run = dir.join("run").display(),
        root = dir.display(),
    )
}

/// Polls `check` every 20 ms for up to 10 s.
fn eventually<T>(what: &str, mut check: impl FnMut() -> Option<T>) -> T {
    for _ in 0..500 {
        if let Some(v) = check() {
            return v;
        }
        thread::sleep(Duration::from_millis(20));
    }
    panic!("{what} within 10 s");
}

/// The live child of `parent` whose command name is `comm`.
fn child_named(parent: u32, comm: &str) -> Option<u32> {
    std::fs::read_dir("/proc")
        .ok()?
        .flatten()
        .find_map(|entry| {
            let pid: u32 = entry.file_name().to_str()?.parse().ok()?;
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
            let (head, rest) = stat.rsplit_once(')')?;
            let fields: Vec<&str> = rest.split_whitespace().collect();
            let name = head.split_once('(')?.1;
            (name == comm && fields[0] != "Z" && fields[1] == parent.to_string()).then_some(pid)
        })
}

/// The open descriptor numbers of `pid`.
fn fd_names(pid: u32) -> BTreeSet<String> {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect()
}

fn mode(path: &Path) -> u32 {
    std::fs::symlink_metadata(path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .permissions()
        .mode()
        & 0o7777
}

/// The real uid and gid in `/proc/PID/status`.
fn ids_of(pid: u32) -> (u32, u32) {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let id = |key: &str| -> u32 {
        let line = status.lines().find(|l| l.starts_with(key)).unwrap();
        line.split_whitespace().nth(1).unwrap().parse().unwrap()
    };
    (id("Uid:"), id("Gid:"))
}

/// A Debian system user other than nobody, and its primary group: `daemon` (1:1) and
/// `www-data` (33:33) are in every Debian base image.
fn user(name: &str) -> nix::unistd::User {
    nix::unistd::User::from_name(name)
        .unwrap()
        .unwrap_or_else(|| panic!("no user {name} on this system"))
}

fn group(name: &str) -> u32 {
    nix::unistd::Group::from_name(name)
        .unwrap()
        .unwrap_or_else(|| panic!("no group {name} on this system"))
        .gid
        .as_raw()
}

/// ARCHITECTURE.md invariant 9, end to end: a root corral runs workers as nobody (group
/// nogroup) when no user is set, else as the pool's user or `[server]`'s (the pool's wins),
/// in the configured group or else that user's primary group, with no supplementary group;
/// only `user = "root"` gives root.
#[test]
fn workers_run_as_nobody_by_default_and_as_the_configured_user() {
    require_root();
    let (daemon, www) = (user("daemon"), user("www-data"));
    let uid = |u: &nix::unistd::User| u.uid.as_raw();
    let gid = |u: &nix::unistd::User| u.gid.as_raw();
    let nobody = nobody();
    let cases: &[(&str, &str, u32, u32)] = &[
        ("", "", uid(&nobody), group("nogroup")),
        ("", "user = \"nobody\"", uid(&nobody), gid(&nobody)),
        ("user = \"nobody\"", "", uid(&nobody), gid(&nobody)),
        ("", "user = \"daemon\"", uid(&daemon), gid(&daemon)),
        ("user = \"www-data\"", "", uid(&www), gid(&www)),
        (
            "user = \"www-data\"",
            "user = \"daemon\"",
            uid(&daemon),
            gid(&daemon),
        ),
        (
            "",
            "user = \"daemon\"\ngroup = \"www-data\"",
            uid(&daemon),
            group("www-data"),
        ),
        (
            "group = \"www-data\"",
            "user = \"daemon\"",
            uid(&daemon),
            group("www-data"),
        ),
        ("", "group = \"www-data\"", uid(&nobody), group("www-data")),
        ("", "user = \"root\"", 0, 0),
    ];
    for &(server, pool, uid, gid) in cases {
        let what = format!("[server] {server:?}, pool {pool:?}");
        let dir = shared_dir();
        write_file(dir.path(), "ids.php", IDS_PHP);
        let corral = Corral::start(&php_config(dir.path(), server, pool), 1);
        let r = http(corral.http_addr(), "GET", "/ids.php", &[], b"");
        assert_eq!(r.status, 200, "{what}: {}", corral.log());
        assert_eq!(r.text(), format!("{uid} {gid} []"), "{what}");
        let worker = eventually("the php-cgi worker", || {
            child_named(corral.pid(), "php-cgi")
        });
        assert_eq!(ids_of(worker), (uid, gid), "{what}");
        // Logged before the pool starts, so before the answer: its absence is final.
        let warning = "neither the pool nor [server] sets `user`";
        if !server.contains("user") && !pool.contains("user") {
            assert!(corral.wait_log(warning), "{what}: {}", corral.log());
        } else {
            assert!(!corral.log().contains(warning), "{what}: {}", corral.log());
        }
    }
}

#[test]
fn modes_are_private_under_a_wide_open_umask() {
    require_root();
    // php-cgi gets its socket as fd 0 and opens nothing in the runtime dir: 0700.
    let dir = shared_dir();
    write_file(dir.path(), "who.php", WHO_PHP);
    let front = dir.path().join("front.sock");
    let config = php_config(dir.path(), "", "").replace(
        "[pools.php]",
        &format!(
            "[[listen]]\naddress = \"unix:{}\"\nprotocol = \"fastcgi\"\nmode = \"0640\"\n\n\
             [pools.php]",
            front.display()
        ),
    );
    let corral = Corral::start_after(&config, 2, "umask 000", &[]);
    let run = dir.path().join("run");
    assert_eq!(mode(&run), 0o700);
    // A socket is bound under corral's own 077 umask (0700) and made 0600 before its worker
    // starts: looked at in between, it is 0700 for a moment, so the test waits for 0600 and
    // fails if any socket stays otherwise.
    eventually("every worker socket at 0600", || {
        let found: Vec<_> = std::fs::read_dir(&run)
            .unwrap()
            .flatten()
            .map(|e| e.path())
            .filter(|p| std::fs::symlink_metadata(p).is_ok_and(|m| m.file_type().is_socket()))
            .collect();
        let private = |s: &PathBuf| {
            std::fs::symlink_metadata(s).is_ok_and(|m| m.permissions().mode() & 0o7777 == 0o600)
        };
        (!found.is_empty() && found.iter().all(private)).then_some(())
    });
    assert_eq!(mode(&front), 0o640);
    let r = http(corral.http_addr(), "GET", "/who.php", &[], b"");
    assert_eq!(r.status, 200, "{}", corral.log());
    drop(corral);

    // The WSGI launcher is read by its nobody worker: search-only 0711, the file 0644.
    let dir = shared_dir();
    let config = format!(
        "[server]\nruntime_dir = \"{}/run\"\n[[listen]]\naddress = \"127.0.0.1:0\"\n\
         protocol = \"http\"\n[pools.demo]\napp = \"wsgi:corral_demo:application\"\n\
         mode = \"static\"\nmax = 1\n",
        dir.path().display()
    );
    let corral = Corral::start_after(&config, 1, "umask 000", &[]);
    let run = dir.path().join("run");
    assert_eq!(mode(&run), 0o711);
    assert_eq!(mode(&run.join("corral-wsgi.py")), 0o644);
    let r = http(corral.http_addr(), "GET", "/", &[], b"");
    assert_eq!(r.status, 200, "{}", corral.log());
}

/// Runs `corral run` on `config` and expects it to refuse at once.
fn refused(config: &str, reason: &str) {
    let file = support::config_file(config);
    let mut cmd = Command::new(support::CORRAL);
    cmd.args(["run", "-c"]).arg(file.path());
    let out = support::run(cmd, Duration::from_secs(15));
    assert_eq!(out.code, Some(78), "{out:?}");
    assert!(out.stderr.contains("refusing to start: "), "{}", out.stderr);
    assert!(out.stderr.contains(reason), "{reason:?} in {}", out.stderr);
}

#[test]
fn an_unsafe_runtime_dir_is_refused() {
    require_root();
    let dir = tempfile::tempdir().unwrap();
    let run = dir.path().join("run");
    let config = php_config(dir.path(), "", "").replace("\"static\"", "\"ondemand\"");

    let real = dir.path().join("real");
    std::fs::create_dir(&real).unwrap();
    std::os::unix::fs::symlink(&real, &run).unwrap();
    refused(&config, "is a symbolic link");
    std::fs::remove_file(&run).unwrap();

    std::fs::create_dir(&run).unwrap();
    std::fs::set_permissions(&run, std::fs::Permissions::from_mode(0o1777)).unwrap();
    refused(
        &config,
        "has mode 1777: writable by its group or by everyone",
    );
    std::fs::set_permissions(&run, std::fs::Permissions::from_mode(0o770)).unwrap();
    refused(&config, "has mode 0770: writable by its group");

    std::fs::set_permissions(&run, std::fs::Permissions::from_mode(0o700)).unwrap();
    let nobody = nobody();
    std::os::unix::fs::chown(&run, Some(nobody.uid.as_raw()), None).unwrap();
    refused(
        &config,
        &format!("belongs to uid {}, neither corral's user", nobody.uid),
    );
    // Nothing was changed in what was refused.
    let meta = std::fs::metadata(&run).unwrap();
    assert_eq!(
        (meta.uid(), meta.mode() & 0o7777),
        (nobody.uid.as_raw(), 0o700)
    );
}

#[test]
fn a_runtime_dir_under_a_directory_others_may_write_in_is_refused_and_tmp_gets_advice() {
    require_root();
    let dir = tempfile::tempdir().unwrap();
    // Anyone could rename open/run away and put their own in its place.
    let open = dir.path().join("open");
    std::fs::create_dir(&open).unwrap();
    std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o777)).unwrap();
    let config = php_config(&open, "", "").replace("\"static\"", "\"ondemand\"");
    refused(
        &config,
        &format!(
            "is inside {}, which has mode 0777: writable by its group or by everyone",
            open.display()
        ),
    );
    assert!(!open.join("run").exists(), "nothing was created");
    // Sticky and root's, as /tmp: accepted.
    std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o1777)).unwrap();
    let corral = Corral::start(&config, 1);
    drop(corral);

    // runtime_dir = "/tmp": a directory of its own is the advice, never `chmod go-w /tmp`.
    let config = php_config(dir.path(), "", "")
        .replace(&format!("{}/run", dir.path().display()), "/tmp")
        .replace("\"static\"", "\"ondemand\"");
    assert!(config.contains("runtime_dir = \"/tmp\""), "{config}");
    refused(
        &config,
        "set server.runtime_dir to a directory of corral's own, such as /run/corral",
    );
    let file = support::config_file(&config);
    let mut cmd = Command::new(support::CORRAL);
    cmd.args(["run", "-c"]).arg(file.path());
    let out = support::run(cmd, Duration::from_secs(15));
    assert!(!out.stderr.contains("chmod go-w /tmp"), "{}", out.stderr);
}

#[test]
fn links_planted_where_the_launcher_is_written_are_not_followed() {
    require_root();
    let dir = shared_dir();
    let run = dir.path().join("run");
    std::fs::create_dir(&run).unwrap();
    std::fs::set_permissions(&run, std::fs::Permissions::from_mode(0o700)).unwrap();
    let target = write_file(dir.path(), "target", "precious");
    // Reading through a link to a FIFO would hang corral before it listens.
    let fifo = dir.path().join("fifo");
    nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
    std::os::unix::fs::symlink(&fifo, run.join("corral-wsgi.py")).unwrap();
    let config = format!(
        "[server]\nruntime_dir = \"{}\"\n[[listen]]\naddress = \"127.0.0.1:0\"\n\
         protocol = \"http\"\n[pools.demo]\napp = \"wsgi:corral_demo:application\"\n\
         mode = \"static\"\nmax = 1\n",
        run.display()
    );
    // Links at the predictable temporary names (corral's pid is the shell's `$$`, kept
    // across `exec`), the old one and the current one: writing through either would
    // overwrite the target.
    let plant = format!(
        "for n in .corral-wsgi.py.$$ .corral-wsgi.py.$$.tmp; do ln -s {} {}/$n; done",
        target.display(),
        run.display()
    );
    let corral = Corral::start_after(&config, 1, &plant, &[]);
    let r = http(corral.http_addr(), "GET", "/", &[], b"");
    assert_eq!(r.status, 200, "{}", corral.log());
    assert_eq!(std::fs::read_to_string(&target).unwrap(), "precious");
    assert!(std::fs::symlink_metadata(&fifo)
        .unwrap()
        .file_type()
        .is_fifo());
    let launcher = std::fs::symlink_metadata(run.join("corral-wsgi.py")).unwrap();
    assert!(launcher.file_type().is_file(), "{launcher:?}");
    assert_eq!(launcher.uid(), 0);
    assert_eq!(launcher.mode() & 0o7777, 0o644);
}

#[test]
fn a_worker_gets_fds_0_1_2_only_and_no_corral_environment() {
    require_root();
    let dir = shared_dir();
    write_file(dir.path(), "who.php", WHO_PHP);
    // fd 7 is opened by the shell without close-on-exec and inherited by corral.
    let corral = Corral::start_after(
        &php_config(dir.path(), "", "env = { APP_ENV = \"test\" }"),
        1,
        "exec 7</etc/hostname",
        &[("CORRAL_SECRET", "x")],
    );
    let own: BTreeSet<String> = fd_names(corral.pid());
    assert!(own.contains("7"), "the test's fd 7 reached corral: {own:?}");
    let environ = std::fs::read(format!("/proc/{}/environ", corral.pid())).unwrap();
    assert!(String::from_utf8_lossy(&environ).contains("CORRAL_SECRET=x"));

    // Checked before any request: once php-cgi has served one it keeps corral's
    // connection open (FCGI_KEEP_CONN) on fd 3. The readiness probe's connection closes
    // soon after the worker starts, so the set is polled until it is exactly 0, 1, 2,
    // which an inherited descriptor, open for the worker's whole life, would prevent.
    let worker = eventually("the php-cgi worker", || {
        child_named(corral.pid(), "php-cgi")
    });
    let expected: BTreeSet<String> = ["0", "1", "2"].into_iter().map(String::from).collect();
    let mut last = BTreeSet::new();
    for _ in 0..250 {
        last = fd_names(worker);
        if last == expected {
            break;
        }
        thread::sleep(Duration::from_millis(20));
    }
    let targets: Vec<_> = last
        .iter()
        .map(|fd| std::fs::read_link(format!("/proc/{worker}/fd/{fd}")))
        .collect();
    assert_eq!(last, expected, "{targets:?}");
    let fd0 = std::fs::read_link(format!("/proc/{worker}/fd/0")).unwrap();
    assert!(fd0.to_string_lossy().starts_with("socket:"), "{fd0:?}");

    let r = http(corral.http_addr(), "GET", "/who.php", &[], b"");
    assert_eq!(r.status, 200, "{}", corral.log());

    let environ = std::fs::read(format!("/proc/{worker}/environ")).unwrap();
    let names: BTreeSet<String> = environ
        .split(|b| *b == 0)
        .filter(|v| !v.is_empty())
        .map(|v| {
            String::from_utf8_lossy(v)
                .split('=')
                .next()
                .unwrap()
                .to_owned()
        })
        .collect();
    let expected: BTreeSet<String> = ["APP_ENV", "PATH", "PHP_FCGI_MAX_REQUESTS"]
        .into_iter()
        .map(String::from)
        .collect();
    assert_eq!(names, expected);
}

/// `corral run -c FILE` as `nobody` (the file made readable first), through setpriv.
fn as_nobody(config: &str) -> support::Outcome {
    let file = support::config_file(config);
    std::fs::set_permissions(file.path(), std::fs::Permissions::from_mode(0o644)).unwrap();
    let mut cmd = Command::new("setpriv");
    cmd.args(["--reuid=nobody", "--regid=nogroup", "--clear-groups", "--"])
        .arg(support::CORRAL)
        .args(["run", "-c"])
        .arg(file.path());
    support::run(cmd, Duration::from_secs(15))
}

#[test]
fn a_corral_that_is_not_root_names_the_path_the_cause_and_the_fix() {
    require_root();
    let dir = shared_dir();
    // A runtime directory root made, which nobody cannot write in.
    let rootrun = dir.path().join("rootrun");
    std::fs::create_dir(&rootrun).unwrap();
    std::fs::set_permissions(&rootrun, std::fs::Permissions::from_mode(0o755)).unwrap();
    let config = php_config(dir.path(), "", "").replace(
        &format!("{}/run", dir.path().display()),
        &rootrun.display().to_string(),
    );
    let out = as_nobody(&config);
    assert_ne!(out.code, Some(0), "{out:?}");
    for needed in [
        format!(
            "the runtime directory {} belongs to root",
            rootrun.display()
        ),
        "corral runs as nobody (uid 65534)".to_owned(),
        "run corral as root, or set server.runtime_dir to a directory of corral's own".to_owned(),
    ] {
        assert!(out.stderr.contains(&needed), "{needed:?} in {}", out.stderr);
    }

    // A socket owner only root may give.
    let front = dir.path().join("front.sock");
    let config = php_config(dir.path(), "", "").replace(
        "[pools.php]",
        &format!(
            "[[listen]]\naddress = \"unix:{}\"\nprotocol = \"fastcgi\"\nowner = \"www-data\"\n\n\
             [pools.php]",
            front.display()
        ),
    );
    let out = as_nobody(&config);
    assert_ne!(out.code, Some(0), "{out:?}");
    let needed = format!(
        "cannot give {} the owner `www-data`: only root may give a file to another user, and \
         corral runs as nobody (uid 65534); run corral as root, or remove `owner`",
        front.display()
    );
    assert!(out.stderr.contains(&needed), "{needed:?} in {}", out.stderr);

    // A pool's user that cannot be applied is said, not ignored.
    let config = php_config(dir.path(), "", "user = \"www-data\"");
    let setup = "chmod 644 \"$1\"\n\
                 exec setpriv --reuid=nobody --regid=nogroup --clear-groups -- \"$0\" run -c \"$1\"";
    let corral = Corral::start_after(&config, 1, setup, &[]);
    assert!(
        corral.wait_log(
            "corral is not root (it runs as nobody), so pool php's `user = \"www-data\"` cannot \
             be applied: its workers run as nobody; start corral as root to run them as \
             www-data, or remove `user`"
        ),
        "{}",
        corral.log()
    );
}

#[test]
fn each_pool_sharing_its_workers_user_with_another_is_warned() {
    require_root();
    let dir = shared_dir();
    let config = php_config(dir.path(), "", "")
        + "\n[pools.two]\ncommand = [\"php-cgi\", \"-n\"]\nmode = \"static\"\nmax = 1\n\
           \n[[contexts]]\npool = \"two\"\nprefix = \"/two\"\nroot = \"/tmp\"\n";
    let corral = Corral::start(&config, 1);
    for line in [
        "pool php's workers run as nobody, as do pool(s) two",
        "pool two's workers run as nobody, as do pool(s) php",
    ] {
        assert!(corral.wait_log(line), "{line:?} in {}", corral.log());
    }
    drop(corral);
    // Each under a user of its own: no such warning.
    let config = php_config(dir.path(), "", "user = \"nobody\"")
        + "\n[pools.two]\ncommand = [\"php-cgi\", \"-n\"]\nmode = \"static\"\nmax = 1\n\
           user = \"www-data\"\n\n[[contexts]]\npool = \"two\"\nprefix = \"/two\"\n\
           root = \"/tmp\"\n";
    let corral = Corral::start(&config, 1);
    assert!(corral.wait_log("worker started"));
    assert!(!corral.log().contains("as do pool(s)"), "{}", corral.log());
}
