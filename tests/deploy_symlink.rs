//! Deploys by symlink swap, with real php-cgi and a real WSGI app: `current -> releases/1`
//! serves release 1; `ln -sfn releases/2 current && corral reload` (or, for an app pool,
//! `corral restart-workers`) serves release 2 while a client loop runs. Every answer is from
//! release 1 or 2 and none fails, a request in flight at the swap finishes on release 1, and
//! every request sent after `corral reload` returned is answered by release 2 (a php script,
//! a static file, a `php_children` pool, a WSGI app whose `cwd` is the link), by workers
//! started for it; a link to a release that is not there refuses the reload.

mod support;

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::Duration;

use support::peers::{shared_dir, write_file};
use support::server::Corral;
use support::sync1::try_get;

const TIMEOUT: Duration = Duration::from_secs(20);

/// A php release: `index.php` answers `release N PID`, `hold.php` marks that it started
/// and waits for the test's go-ahead (both marker files in `markers`), `version.txt` is a
/// static file.
fn php_release(base: &Path, n: u32, markers: &Path) {
    let dir = base.join(format!("releases/{n}"));
    std::fs::create_dir_all(&dir).unwrap();
    write_file(
        &dir,
        "index.php",
        &format!("<?php echo 'release {n} ', getmypid();"),
    );
    write_file(
        &dir,
        "hold.php",
        &format!(
            "<?php touch('{m}/started'); \
             for ($i = 0; $i < 2000 && !file_exists('{m}/go'); $i++) {{ usleep(10000); clearstatcache(); }} \
             echo 'release {n} ', getmypid();",
            m = markers.display()
        ),
    );
    write_file(&dir, "version.txt", &format!("release {n}"));
}

/// A WSGI release: `/` answers `release N PID`; `/?hold` marks that it started and waits
/// for the go-ahead first.
fn wsgi_release(base: &Path, n: u32, markers: &Path) {
    let dir = base.join(format!("releases/{n}"));
    std::fs::create_dir_all(&dir).unwrap();
    write_file(
        &dir,
        "app.py",
        &format!(
            r#"
import os, time

def application(environ, start_response):
    if environ.get("QUERY_STRING") == "hold":
        open("{m}/started", "w").close()
        for _ in range(2000):
            if os.path.exists("{m}/go"):
                break
            time.sleep(0.01)
    start_response("200 OK", [("Content-Type", "text/plain")])
    return [b"release {n} " + str(os.getpid()).encode()]
"#,
            m = markers.display()
        ),
    );
}

/// Where the held requests leave their marker files: writable by the workers, which run
/// as another user when the tests run as root.
fn markers_dir(base: &Path) -> PathBuf {
    let markers = base.join("markers");
    std::fs::create_dir_all(&markers).unwrap();
    let mode = std::os::unix::fs::PermissionsExt::from_mode(0o1777);
    std::fs::set_permissions(&markers, mode).unwrap();
    markers
}

/// Points `base/current` at `releases/N` in one rename, as `ln -sfn` does.
fn point_current(base: &Path, n: u32) {
    let next = base.join("current.next");
    let _ = std::fs::remove_file(&next);
    std::os::unix::fs::symlink(format!("releases/{n}"), &next).unwrap();
    std::fs::rename(&next, base.join("current")).unwrap();
}

fn config(run: &Path, pool: &str, context: &str) -> String {
    support::site_config(run, pool).replace(
        "pool = \"site\"\n",
        &format!("pool = \"site\"\n{context}\n"),
    )
}

/// The release and the pid of an answer `release N PID`.
fn parse(text: &str) -> Option<(u32, u32)> {
    let mut words = text.strip_prefix("release ")?.split(' ');
    let release = words.next()?.parse().ok()?;
    let pid = words.next().map_or(Some(0), |p| p.parse().ok())?;
    Some((release, pid))
}

/// What one request of the loop got: whether it was sent after the deploy returned, its
/// target, and its answer.
type Seen = (bool, String, Result<(u16, String), String>);

/// A client loop over `targets` until stopped; each answer with whether it was sent after
/// the deploy returned (`after` set).
struct Load {
    stop: Arc<AtomicBool>,
    after: Arc<AtomicBool>,
    seen: Arc<Mutex<Vec<Seen>>>,
    thread: Option<thread::JoinHandle<()>>,
}

impl Load {
    fn start(addr: SocketAddr, targets: &'static [&'static str]) -> Load {
        let stop = Arc::new(AtomicBool::new(false));
        let after = Arc::new(AtomicBool::new(false));
        let seen = Arc::new(Mutex::new(Vec::new()));
        let (s, a, w) = (Arc::clone(&stop), Arc::clone(&after), Arc::clone(&seen));
        let thread = thread::spawn(move || {
            let mut i = 0;
            while !s.load(Ordering::SeqCst) {
                let target = targets[i % targets.len()];
                i += 1;
                let sent_after = a.load(Ordering::SeqCst);
                let answer = try_get(addr, target, TIMEOUT);
                w.lock()
                    .unwrap()
                    .push((sent_after, target.to_owned(), answer));
            }
        });
        Load {
            stop,
            after,
            seen,
            thread: Some(thread),
        }
    }

    fn count(&self, after: bool) -> usize {
        self.seen
            .lock()
            .unwrap()
            .iter()
            .filter(|(a, _, _)| *a == after)
            .count()
    }

    fn wait_more(&self, after: bool, n: usize) {
        let target = self.count(after) + n;
        assert!(
            support::eventually(TIMEOUT, || self.count(after) >= target),
            "the load stalled"
        );
    }

    /// Stops the loop and checks every answer: 200 from release 1 or 2, and release 2 for
    /// every request sent after the deploy returned, from none of the `old` pids. Returns
    /// how many answers came from each release.
    fn finish(mut self, old: &BTreeSet<u32>, log: &str) -> (usize, usize) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            t.join().unwrap();
        }
        let seen = self.seen.lock().unwrap();
        let mut counts = (0, 0);
        for (after, target, answer) in seen.iter() {
            let parsed = match answer {
                Ok((200, text)) => parse(text),
                _ => None,
            };
            let Some((release, pid)) = parsed else {
                panic!("{target}: {answer:?} is not an answer of release 1 or 2\n{log}");
            };
            match release {
                1 => counts.0 += 1,
                2 => counts.1 += 1,
                _ => panic!("{target}: release {release}"),
            }
            if *after {
                assert_eq!(
                    release, 2,
                    "{target} sent after the deploy: {answer:?}\n{log}"
                );
                assert!(
                    !old.contains(&pid),
                    "{target}: answered by an old worker {pid}"
                );
            }
        }
        eprintln!("answers: {counts:?} (release 1, release 2)");
        counts
    }
}

/// Sends `target` on another thread, returning its answer when joined.
fn in_flight(
    addr: SocketAddr,
    target: &'static str,
) -> thread::JoinHandle<Result<(u16, String), String>> {
    thread::spawn(move || try_get(addr, target, TIMEOUT))
}

fn wait_file(path: &Path) {
    assert!(
        support::eventually(TIMEOUT, || path.exists()),
        "{} never appeared",
        path.display()
    );
}

/// The worker pids an answer loop of `n` requests sees.
fn pids(addr: SocketAddr, target: &str, n: usize) -> BTreeSet<u32> {
    (0..n)
        .filter_map(|_| try_get(addr, target, TIMEOUT).ok())
        .filter_map(|(_, text)| parse(&text))
        .map(|(_, pid)| pid)
        .collect()
}

/// Every worker pid on the pool's status page (`"pid":N` of the JSON page's worker rows).
fn status_pids(corral: &Corral) -> BTreeSet<u32> {
    let json = match try_get(corral.status_ready_addr(), "/status?json&full", TIMEOUT) {
        Ok((200, text)) => text,
        other => panic!("status: {other:?}"),
    };
    json.split("\"pid\":")
        .skip(1)
        .filter_map(|rest| {
            let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
            digits.parse().ok()
        })
        .collect()
}

/// Swaps `current` to release 2 with `held` in flight on release 1, runs `corral ARGS`,
/// then lets the held request finish; checks that it finished on release 1.
fn swap_and(corral: &Corral, base: &Path, held: &'static str, args: &[&str]) -> PathBuf {
    let markers = base.join("markers");
    let hold = in_flight(corral.http_addr(), held);
    wait_file(&markers.join("started"));
    point_current(base, 2);
    let path = corral.config_path().display().to_string();
    let mut argv: Vec<&str> = args.to_vec();
    argv.extend(["-c", &path]);
    let out = support::corral(&argv);
    assert_eq!(out.code, Some(0), "{out:?}\n{}", corral.log());
    std::fs::write(markers.join("go"), "").unwrap();
    let answer = hold.join().unwrap();
    let (release, _) = answer
        .as_ref()
        .ok()
        .filter(|(status, _)| *status == 200)
        .and_then(|(_, text)| parse(text))
        .unwrap_or_else(|| panic!("held request: {answer:?}\n{}", corral.log()));
    assert_eq!(release, 1, "the request in flight finishes on release 1");
    markers
}

#[test]
fn a_php_root_through_a_symlink_serves_the_new_release_after_reload() {
    php_swap(
        "command = [\"php-cgi\"]\nmode = \"static\"\nmax = 2",
        "reload",
    );
}

#[test]
fn a_php_children_pool_gets_new_groups_for_the_new_release() {
    php_swap(
        "command = [\"php-cgi\"]\nmode = \"static\"\nmax = 1\nphp_children = 2",
        "reload",
    );
}

/// `corral restart-workers` after the swap is a deploy too: the running configuration is
/// reloaded (the root resolved again), so the php pool's new workers serve release 2.
#[test]
fn a_rolling_restart_serves_a_php_roots_new_release() {
    php_swap(
        "command = [\"php-cgi\"]\nmode = \"static\"\nmax = 2",
        "restart-workers",
    );
}

/// The php deploy with a pool of `pool` (its keys), switched by `corral COMMAND`.
fn php_swap(pool: &str, command: &str) {
    let dir = shared_dir();
    let base = dir.path();
    let markers = markers_dir(base);
    php_release(base, 1, &markers);
    php_release(base, 2, &markers);
    point_current(base, 1);
    let text = config(
        &base.join("run"),
        pool,
        &format!(
            "root = \"{}\"\nstatic_files = true",
            base.join("current").display()
        ),
    );
    let corral = Corral::start(&text, 1);
    let addr = corral.http_addr();
    let old = pids(addr, "/index.php", 4);
    assert!(!old.is_empty(), "{}", corral.log());
    let old: BTreeSet<u32> = old.union(&status_pids(&corral)).copied().collect();
    let load = Load::start(addr, &["/index.php", "/version.txt"]);
    load.wait_more(false, 20);
    swap_and(&corral, base, "/hold.php", &[command]);
    // The old php-cgi workers are stopped once their requests are done. `corral reload`
    // returns once the new generation serves; `restart-workers` returns at once, and every
    // answer is release 2 once the last old worker is gone.
    let gone = || support::eventually(TIMEOUT, || old.iter().all(|&p| !support::alive(p)));
    if command != "reload" {
        assert!(gone(), "{old:?}\n{}", corral.log());
    }
    load.after.store(true, Ordering::SeqCst);
    load.wait_more(true, 40);
    let (_, second) = load.finish(&old, &corral.log());
    assert!(second >= 40);
    assert!(gone(), "{}", corral.log());
}

fn wsgi_corral(base: &Path, markers: &Path) -> Corral {
    wsgi_release(base, 1, markers);
    wsgi_release(base, 2, markers);
    point_current(base, 1);
    let text = config(
        &base.join("run"),
        &format!(
            "app = \"wsgi:app:application\"\ncwd = \"{}\"\nmode = \"static\"\nmax = 2\n\
             start_timeout = \"10s\"",
            base.join("current").display()
        ),
        "",
    );
    Corral::start(&text, 1)
}

#[test]
fn a_wsgi_cwd_through_a_symlink_serves_the_new_release_after_reload() {
    wsgi_swap("reload");
}

#[test]
fn a_rolling_restart_starts_a_wsgi_pools_workers_in_the_new_release() {
    wsgi_swap("restart-workers");
}

/// The WSGI deploy, switched by `corral COMMAND`.
fn wsgi_swap(command: &str) {
    let dir = shared_dir();
    let base = dir.path();
    let markers = markers_dir(base);
    let corral = wsgi_corral(base, &markers);
    let addr = corral.http_addr();
    assert!(!pids(addr, "/", 2).is_empty(), "{}", corral.log());
    let old = status_pids(&corral);
    let load = Load::start(addr, &["/"]);
    load.wait_more(false, 20);
    swap_and(&corral, base, "/?hold", &[command]);
    // A restart replaces the workers one at a time and returns at once: once every old
    // one is gone, every answer is release 2.
    if command != "reload" {
        assert!(
            support::eventually(TIMEOUT, || old.iter().all(|&p| !support::alive(p))),
            "{old:?}\n{}",
            corral.log()
        );
    }
    load.after.store(true, Ordering::SeqCst);
    load.wait_more(true, 40);
    load.finish(&old, &corral.log());
}

#[test]
fn a_link_to_a_release_that_is_not_there_refuses_the_reload() {
    let dir = shared_dir();
    let base = dir.path();
    let markers = markers_dir(base);
    php_release(base, 1, &markers);
    point_current(base, 1);
    let text = config(
        &base.join("run"),
        "command = [\"php-cgi\"]\nmode = \"static\"\nmax = 1",
        &format!("root = \"{}\"", base.join("current").display()),
    );
    let corral = Corral::start(&text, 1);
    let addr = corral.http_addr();
    let load = Load::start(addr, &["/index.php"]);
    load.wait_more(false, 10);
    // Release 2 was never copied: the reload must not switch to a root that names nothing.
    point_current(base, 2);
    let path = corral.config_path().display().to_string();
    let out = support::corral(&["reload", "-c", &path]);
    assert_ne!(out.code, Some(0), "{out:?}\n{}", corral.log());
    assert!(
        out.stderr.contains("pool site") && out.stderr.contains("cannot be resolved"),
        "{out:?}"
    );
    load.wait_more(false, 20);
    let (first, second) = load.finish(&BTreeSet::new(), &corral.log());
    assert_eq!(second, 0);
    assert!(first >= 30);
}
