//! Reforking (`refork_after`, docs/pools.md "Reforking") behind the real corral binary, with
//! real Python and Ruby. The test app records each load and answers with the pid and parent
//! pid of the process serving. After a worker has served N requests it is promoted to be the
//! template: the next workers are its children (and the app is not loaded again), the older
//! workers are replaced one at a time with no failed request under load; a second step
//! promotes a worker of the first promoted template; a SIGKILLed promoted template is
//! replaced by workers of the template before it, and the pool reforks again;
//! `max_requests` and `max_memory` recycle into workers of the promoted template (the app
//! is not loaded again); a reforked worker past `request_timeout` still has its stacks
//! collected (it writes on the first preloader's stderr, two generations up).

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing,
    missing_docs
)]

mod support;

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use support::apps::write_tree;
use support::preloading::{
    self, both, config, kill, loads, parent_of, served_fields, Apps, Lang, Pool,
};
use support::server::http;

/// The WSGI app: records each load, answers with pid and ppid; `/grow` keeps 100 MiB more.
const WSGI_APP: &str = r#"import os, time
with open(os.path.join(os.environ["LOADS_DIR"], "loads"), "a") as f:
    f.write("%d\n" % os.getpid())
CACHE = {}
HELD = []

def application(environ, start_response):
    # Something warmed per worker, as an app's caches are.
    CACHE.setdefault(environ["PATH_INFO"], "x" * 4096)
    if environ["PATH_INFO"] == "/grow":
        # 100 MiB written (so resident) and kept for the worker's life.
        HELD.append(bytearray(b"\x01") * (100 << 20))
    if environ["PATH_INFO"] == "/sleep":
        time.sleep(60)
    body = ("pid=%d ppid=%d" % (os.getpid(), os.getppid())).encode()
    start_response("200 OK", [("Content-Type", "text/plain"), ("Content-Length", str(len(body)))])
    return [body]
"#;

/// The Rack app, the same in Ruby.
const RACK_APP: &str = r#"File.open(File.join(ENV.fetch("LOADS_DIR"), "loads"), "a") { |f| f.puts Process.pid }
CACHE = {}
HELD = []
run lambda { |env|
  CACHE[env["PATH_INFO"]] ||= "x" * 4096
  HELD << "\x01" * (100 << 20) if env["PATH_INFO"] == "/grow"
  sleep 60 if env["PATH_INFO"] == "/sleep"
  [200, { "content-type" => "text/plain" }, ["pid=#{Process.pid} ppid=#{Process.ppid}"]]
}
"#;

const APPS: Apps = Apps {
    wsgi: WSGI_APP,
    rack: RACK_APP,
};

/// A corral serving the test app of `lang` from a pool with `keys` added.
fn start(lang: Lang, keys: &str) -> Pool {
    preloading::start("corral-refork-", &APPS, lang, keys)
}

/// pid and ppid of the process that served a GET of `target`.
fn served(p: &Pool, target: &str) -> (u32, u32) {
    let [pid, ppid] = served_fields(p, target, ["pid=", "ppid="]);
    (pid, ppid)
}

/// Whether corral logged that template `template` forked worker `pid`.
fn forked_by(p: &Pool, pid: u32, template: u32) -> bool {
    p.corral.log().lines().any(|l| {
        l.contains("worker forked") && l.contains(&format!(" pid={pid} preloader={template} "))
    })
}

/// Sends requests (one at a time) until every worker that answers the next `probe`
/// requests is a child of one process, other than `not_parent` (a refork has replaced the
/// older workers), and returns the workers seen last with their parent (30 s at most).
fn wait_for_workers_of_new_template(
    p: &Pool,
    not_parent: u32,
    probe: usize,
) -> BTreeSet<(u32, u32)> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        assert!(
            tokio::time::Instant::now() < deadline,
            "no refork away from {not_parent}\n{}",
            p.corral.log()
        );
        let seen: BTreeSet<(u32, u32)> = (0..probe).map(|_| served(p, "/page")).collect();
        let parents: BTreeSet<u32> = seen.iter().map(|&(_, ppid)| ppid).collect();
        if parents.len() == 1 && !parents.contains(&not_parent) {
            return seen;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Clients that keep requesting until stopped, counting answers that are not 200.
struct Load {
    stop: std::sync::Arc<AtomicBool>,
    failed: std::sync::Arc<AtomicU64>,
    done: std::sync::Arc<AtomicU64>,
    threads: Vec<std::thread::JoinHandle<()>>,
}

impl Load {
    fn start(addr: SocketAddr, clients: usize) -> Load {
        let stop = std::sync::Arc::new(AtomicBool::new(false));
        let failed = std::sync::Arc::new(AtomicU64::new(0));
        let done = std::sync::Arc::new(AtomicU64::new(0));
        let threads = (0..clients)
            .map(|i| {
                let (stop, failed, done) = (stop.clone(), failed.clone(), done.clone());
                std::thread::spawn(move || {
                    let target = format!("/load/{i}");
                    while !stop.load(Ordering::Relaxed) {
                        let r = http(addr, "GET", &target, &[], b"");
                        if r.status != 200 {
                            failed.fetch_add(1, Ordering::Relaxed);
                        }
                        done.fetch_add(1, Ordering::Relaxed);
                    }
                })
            })
            .collect();
        Load {
            stop,
            failed,
            done,
            threads,
        }
    }

    /// (requests, failed).
    fn finish(self) -> (u64, u64) {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.threads {
            t.join().unwrap();
        }
        (
            self.done.load(Ordering::Relaxed),
            self.failed.load(Ordering::Relaxed),
        )
    }
}

/// After N requests a worker becomes the template: under load from 4 clients, the workers
/// are replaced by children of the promoted worker (whose parent is the preloader), with no
/// failed request and no second load of the app; the second step promotes a worker of the
/// first promoted template.
fn reforks_under_load(lang: Lang) {
    let p = start(lang, "mode = \"static\"\nmax = 3\nrefork_after = [30, 200]");
    let (_, preloader) = served(&p, "/");
    assert_eq!(parent_of(preloader), p.corral.pid());
    let load = Load::start(p.addr, 4);
    assert!(
        p.corral
            .wait_count("worker promoted:", 2, Duration::from_secs(60)),
        "{}",
        p.corral.log()
    );
    let promoted = promoted(&p);
    let (first, second) = (promoted[0], promoted[1]);
    assert!(
        forked_by(&p, first, preloader),
        "the first template is a promoted worker of the preloader\n{}",
        p.corral.log()
    );
    assert!(
        forked_by(&p, second, first),
        "the second template is a promoted worker of the first\n{}",
        p.corral.log()
    );
    // Every worker is the second template's, and the older templates have retired; the
    // newest serves on, orphaned (its parent-death signal cleared).
    // (Workers of the preloader may still be replaced when the second promotion comes.)
    assert!(
        support::eventually(Duration::from_secs(30), || (0..9)
            .map(|_| served(&p, "/page"))
            .all(|(_, ppid)| ppid == second)),
        "{}",
        p.corral.log()
    );
    assert!(
        support::eventually(Duration::from_secs(30), || !support::alive(preloader)
            && !support::alive(first)),
        "{}",
        p.corral.log()
    );
    assert!(support::alive(second));
    let (requests, failed) = load.finish();
    assert_eq!(
        failed,
        0,
        "{failed} of {requests} failed\n{}",
        p.corral.log()
    );
    assert!(requests > 200, "{requests}");
    assert_eq!(loads(&p), vec![preloader], "{}", p.corral.log());
    // No third step: the list is used up.
    for _ in 0..300 {
        served(&p, "/");
    }
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(
        p.corral.count_log("worker promoted:"),
        2,
        "{}",
        p.corral.log()
    );
}

/// The pids corral logged as promoted, in order.
fn promoted(p: &Pool) -> Vec<u32> {
    p.corral
        .log()
        .lines()
        .filter(|l| l.contains("worker promoted:"))
        .filter_map(|l| {
            l.split(' ')
                .find_map(|w| w.strip_prefix("pid="))
                .and_then(|v| v.parse().ok())
        })
        .collect()
}

both!(reforks_under_load: wsgi_reforks_under_load_with_no_failed_request, rack_reforks_under_load_with_no_failed_request);

/// A promoted template that is SIGKILLed takes its workers with it; the pool serves again
/// from the template before it while that one still serves, else from a fresh preloader,
/// and reforks again.
fn a_killed_template_falls_back(lang: Lang) {
    let p = start(lang, "mode = \"static\"\nmax = 2\nrefork_after = [10]");
    let (_, preloader) = served(&p, "/");
    let seen = wait_for_workers_of_new_template(&p, preloader, 6);
    let template = seen.iter().next().unwrap().1;
    assert!(forked_by(&p, template, preloader), "{}", p.corral.log());
    kill(template);
    let load = Load::start(p.addr, 2);
    // Back to workers of the preloader first (or straight to a new promoted template),
    // then a new template promoted from them.
    assert!(
        p.corral
            .wait_count("worker promoted:", 2, Duration::from_secs(30)),
        "{}",
        p.corral.log()
    );
    let (_, failed) = load.finish();
    // Right after the second promotion the preloader's workers may still answer until the
    // new template's replace them: wait for workers of a template corral promoted.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    let again = loop {
        let again = wait_for_workers_of_new_template(&p, template, 6);
        let parent = again.iter().next().unwrap().1;
        if parent != preloader && promoted(&p).contains(&parent) {
            break again;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "no workers of a promoted template: {again:?}\n{}",
            p.corral.log()
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    let new_template = again.iter().next().unwrap().1;
    assert!(
        again.iter().all(|&(_, ppid)| ppid == new_template),
        "{again:?}"
    );
    assert_ne!(new_template, preloader);
    for &(pid, _) in &seen {
        assert!(!support::alive(pid), "worker {pid} outlived its template");
    }
    // The first preloader (if it had retired already) is replaced by one fresh load.
    assert!(loads(&p).len() <= 2, "{}", p.corral.log());
    // Requests in flight on the killed workers may fail (they crashed); most do not.
    eprintln!("failed while the template was killed: {failed}");
}

both!(a_killed_template_falls_back: wsgi_a_killed_template_falls_back_to_its_parent, rack_a_killed_template_falls_back_to_its_parent);

/// `max_requests` after a refork: the replacements are forked from the promoted template.
fn max_requests_recycles_from_the_new_template(lang: Lang) {
    let p = start(
        lang,
        "mode = \"static\"\nmax = 1\nrefork_after = [5]\nmax_requests = 12\nmax_requests_jitter = 0",
    );
    let (_, preloader) = served(&p, "/");
    let seen = wait_for_workers_of_new_template(&p, preloader, 1);
    let template = seen.iter().next().unwrap().1;
    let mut pids = BTreeSet::new();
    for _ in 0..40 {
        let (pid, ppid) = served(&p, "/");
        assert_eq!(ppid, template, "{}", p.corral.log());
        pids.insert(pid);
    }
    assert!(pids.len() >= 3, "max_requests recycled {pids:?}");
    assert_eq!(
        p.corral.count_log("worker promoted:"),
        1,
        "{}",
        p.corral.log()
    );
}

both!(max_requests_recycles_from_the_new_template: wsgi_max_requests_after_a_refork_forks_from_the_new_template, rack_max_requests_after_a_refork_forks_from_the_new_template);

/// The workers corral logged as forked after its first log line containing `after`, in
/// order: (the worker's number in the pool, its pid, the template that forked it).
fn forked_after(p: &Pool, after: &str) -> Vec<(u64, u32, u32)> {
    let field = |l: &str, name: &str| -> Option<u64> {
        let rest = &l[l.find(name)? + name.len()..];
        rest.split(' ').next()?.parse().ok()
    };
    p.corral
        .log()
        .lines()
        .skip_while(|l| !l.contains(after))
        .filter(|l| l.contains("worker forked"))
        .map(|l| {
            let key = field(l, " key=worker ");
            let pid = field(l, " pid=").and_then(|v| u32::try_from(v).ok());
            let template = field(l, " preloader=").and_then(|v| u32::try_from(v).ok());
            match (key, pid, template) {
                (Some(key), Some(pid), Some(template)) => (key, pid, template),
                _ => panic!("cannot read {l:?}"),
            }
        })
        .collect()
}

/// `max_memory` after a refork: a worker of the promoted template that grows past the limit
/// answers the request that made it grow, is recycled for it, and its replacement is another
/// child of the promoted template (not of the first preloader, and the app is not loaded
/// again), with no failed request from clients meanwhile.
fn max_memory_recycles_from_the_new_template(lang: Lang) {
    let p = start(
        lang,
        "mode = \"static\"\nmax = 2\nrefork_after = [10]\nmax_memory = \"64MiB\"",
    );
    let (_, preloader) = served(&p, "/");
    let seen = wait_for_workers_of_new_template(&p, preloader, 6);
    let template = seen.iter().next().unwrap().1;
    assert!(forked_by(&p, template, preloader), "{}", p.corral.log());
    let load = Load::start(p.addr, 2);
    let (grown, ppid) = served(&p, "/grow");
    assert_eq!(ppid, template, "{}", p.corral.log());
    // Recycled for its memory (measured after a request or by the sampling every second),
    // then gone.
    let key = forked_after(&p, "worker promoted:")
        .into_iter()
        .find(|&(_, pid, _)| pid == grown)
        .map(|(key, _, _)| key)
        .unwrap_or_else(|| panic!("no fork of {grown} logged\n{}", p.corral.log()));
    let recycled = format!("worker {key} is recycled because its memory exceeded max_memory");
    assert!(p.corral.wait_log(&recycled), "{}", p.corral.log());
    assert!(
        support::eventually(Duration::from_secs(30), || !support::alive(grown)),
        "the grown worker {grown} did not leave\n{}",
        p.corral.log()
    );
    // Its replacement, and every worker forked since, is the promoted template's child.
    assert!(
        support::eventually(Duration::from_secs(30), || {
            !forked_after(&p, &recycled).is_empty()
        }),
        "no replacement forked\n{}",
        p.corral.log()
    );
    let since = forked_after(&p, &recycled);
    assert!(
        since.iter().all(|&(_, _, by)| by == template),
        "forked after the recycle: {since:?}, template {template}, first preloader \
         {preloader}\n{}",
        p.corral.log()
    );
    for _ in 0..8 {
        let (pid, ppid) = served(&p, "/page");
        assert_ne!(pid, grown, "{}", p.corral.log());
        assert_eq!(ppid, template, "{}", p.corral.log());
    }
    let (requests, failed) = load.finish();
    assert_eq!(
        failed,
        0,
        "{failed} of {requests} failed\n{}",
        p.corral.log()
    );
    assert!(requests > 0);
    assert_eq!(loads(&p), vec![preloader], "{}", p.corral.log());
    assert_eq!(
        p.corral.count_log("exceeded max_memory"),
        1,
        "{}",
        p.corral.log()
    );
    assert_eq!(
        p.corral.count_log("worker promoted:"),
        1,
        "{}",
        p.corral.log()
    );
}

both!(max_memory_recycles_from_the_new_template: wsgi_max_memory_after_a_refork_forks_from_the_new_template, rack_max_memory_after_a_refork_forks_from_the_new_template);

/// A worker of a promoted template past `request_timeout` is asked for its stacks, and its
/// whole dump is collected, though it writes on the pipes of the preloader corral started.
fn a_reforked_worker_tells_its_stacks(lang: Lang) {
    let p = start(
        lang,
        "mode = \"static\"\nmax = 1\nrefork_after = [5]\nrequest_timeout = \"1s\"",
    );
    let (_, preloader) = served(&p, "/");
    let seen = wait_for_workers_of_new_template(&p, preloader, 1);
    let template = seen.iter().next().unwrap().1;
    assert_ne!(template, preloader);
    let r = http(p.addr, "GET", "/sleep", &[], b"");
    assert_eq!(r.status, 504, "{}", p.corral.log());
    assert!(
        p.corral
            .wait_log("the worker's stacks at request_timeout are logged above"),
        "{}",
        p.corral.log()
    );
    // The dump names the app's file (the frame that sleeps).
    let file = match lang {
        Lang::Python | Lang::PythonNative => "app.py",
        Lang::Ruby => "config.ru",
    };
    let log = p.corral.log();
    let dump = log
        .lines()
        .skip_while(|l| !l.contains("asking the worker for its stacks"))
        .take_while(|l| !l.contains("logged above"));
    assert!(dump.into_iter().any(|l| l.contains(file)), "{log}");
    // And they were collected from the stream the worker writes on (the first
    // preloader's, which has retired): the end line alone would say "logged above" with
    // nothing collected.
    let collected = log
        .lines()
        .find(|l| l.contains("logged above"))
        .and_then(|l| l.split(' ').find_map(|w| w.strip_prefix("lines=")))
        .and_then(|n| n.parse::<usize>().ok());
    assert!(collected.is_some_and(|n| n > 0), "{collected:?}\n{log}");
    // The pool serves on from the same template.
    let (_, ppid) = served(&p, "/");
    assert_eq!(ppid, template, "{}", p.corral.log());
}

both!(a_reforked_worker_tells_its_stacks: wsgi_a_reforked_worker_tells_its_stacks, rack_a_reforked_worker_tells_its_stacks);

/// corral SIGKILLed after a refork: the promoted template, orphaned once the preloader
/// retired, leaves when its control socket closes, and its workers follow it.
fn nothing_outlives_a_killed_corral(lang: Lang) {
    let mut p = start(lang, "mode = \"static\"\nmax = 2\nrefork_after = [10]");
    let (_, preloader) = served(&p, "/");
    let seen = wait_for_workers_of_new_template(&p, preloader, 6);
    let template = seen.iter().next().unwrap().1;
    assert!(
        support::eventually(Duration::from_secs(30), || !support::alive(preloader)),
        "the old template did not retire\n{}",
        p.corral.log()
    );
    assert!(support::alive(template));
    p.corral.signal(nix::sys::signal::Signal::SIGKILL);
    assert!(p.corral.wait_exited(Duration::from_secs(10)));
    let mut all: Vec<u32> = seen.iter().map(|&(pid, _)| pid).collect();
    all.push(template);
    assert!(
        support::eventually(Duration::from_secs(10), || all
            .iter()
            .all(|&pid| !support::alive(pid))),
        "{all:?} outlived corral"
    );
}

both!(nothing_outlives_a_killed_corral: wsgi_nothing_outlives_a_killed_corral_after_a_refork, rack_nothing_outlives_a_killed_corral_after_a_refork);

/// `corral check` refuses `refork_after` where it cannot work, and a list that does not
/// increase, naming the line.
#[test]
fn corral_check_refuses_refork_after_that_cannot_work() {
    let dir = tempfile::tempdir().unwrap();
    write_tree(dir.path(), &[("app.py", WSGI_APP)]);
    for (keys, message) in [
        (
            "preload = false\nrefork_after = [10]",
            "refork_after needs preload",
        ),
        (
            "refork_after = [10, 5]",
            "refork_after must increase: 5 follows 10",
        ),
    ] {
        let text = config(
            dir.path(),
            &format!("app = \"wsgi:app:application\"\n{keys}"),
        );
        let path = dir.path().join("c.toml");
        std::fs::write(&path, text).unwrap();
        let out = support::corral(&["check", "-c", path.to_str().unwrap()]);
        assert_ne!(out.code, Some(0), "{keys}: {out:?}");
        assert!(out.stderr.contains(message), "{keys}: {}", out.stderr);
        assert!(out.stderr.contains("c.toml:1"), "{}", out.stderr);
    }
}
