//! Preload and fork (ARCHITECTURE.md, "Preload and fork") behind the real corral binary, with
//! real Python and Ruby: the test apps append their pid to a file when they are loaded and
//! answer with the pid and parent pid of the process serving. A preloading pool loads the app
//! once, in a preloader that is corral's child, and its workers are that preloader's children,
//! each its own process group; a SIGKILLed worker is replaced by a fresh fork (no new load),
//! a SIGKILLed preloader by a new preloader that loads again and serves; `max_requests` and
//! `max_memory` still recycle one worker at a time; a new worker's time from being asked for
//! to its first response is measured and printed (bounded generously); `preload = false`
//! keeps one interpreter per worker, each corral's child, each loading the app. The WSGI
//! cases run again on the native WSGI worker (`worker = "native"`).

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing,
    missing_docs
)]

mod support;

use std::collections::BTreeSet;
use std::time::Duration;

use tokio::time::Instant;

use support::apps::{writable_dir, write_tree, Reaper};
use support::preloading::{
    self, both, config, kill, loads, parent_of, served_fields, Apps, Lang, Pool,
};
use support::server::http;

/// The WSGI app: records each load; `/grow` keeps 48 MiB more per request.
const WSGI_APP: &str = r#"import os, time
HERE = os.environ["LOADS_DIR"]
with open(os.path.join(HERE, "loads"), "a") as f:
    f.write("%d\n" % os.getpid())
HELD = []

def application(environ, start_response):
    if environ["PATH_INFO"] == "/grow":
        HELD.append(bytearray(b"\x01") * (48 << 20))
    if environ["PATH_INFO"] == "/slow":
        # A barrier: each request of round R leaves its pid and waits (5 s at most) until
        # the N requests of the round are all in, each on a worker of its own.
        query = dict(p.split("=") for p in environ["QUERY_STRING"].split("&"))
        here = os.path.join(HERE, "slow-" + query["round"])
        os.makedirs(here, exist_ok=True)
        open(os.path.join(here, str(os.getpid())), "w").close()
        for _ in range(500):
            if len(os.listdir(here)) >= int(query["n"]):
                break
            time.sleep(0.01)
    body = ("pid=%d ppid=%d pgid=%d" % (os.getpid(), os.getppid(), os.getpgid(0))).encode()
    start_response("200 OK", [("Content-Type", "text/plain"), ("Content-Length", str(len(body)))])
    return [body]
"#;

/// The Rack app, the same in Ruby.
const RACK_APP: &str = r#"File.open(File.join(ENV.fetch("LOADS_DIR"), "loads"), "a") { |f| f.puts Process.pid }
HELD = []
run lambda { |env|
  HELD << ("x" * (48 << 20)) if env["PATH_INFO"] == "/grow"
  if env["PATH_INFO"] == "/slow"
    query = env["QUERY_STRING"].split("&").to_h { |p| p.split("=", 2) }
    here = File.join(ENV.fetch("LOADS_DIR"), "slow-#{query["round"]}")
    Dir.mkdir(here) rescue Errno::EEXIST
    File.write(File.join(here, Process.pid.to_s), "")
    500.times do
      break if Dir.children(here).size >= query["n"].to_i
      sleep 0.01
    end
  end
  [200, { "content-type" => "text/plain" },
   ["pid=#{Process.pid} ppid=#{Process.ppid} pgid=#{Process.getpgid(0)}"]]
}
"#;

/// Each case again on the native WSGI worker (workers/wsgi), which speaks the same
/// control protocol: `native!(case: name)`.
macro_rules! native {
    ($case:ident: $name:ident) => {
        #[test]
        fn $name() {
            $case(Lang::PythonNative);
        }
    };
}

const APPS: Apps = Apps {
    wsgi: WSGI_APP,
    rack: RACK_APP,
};

/// A corral serving the test app of `lang` from a pool with `keys` added.
fn start(lang: Lang, keys: &str) -> Pool {
    preloading::start("corral-preload-", &APPS, lang, keys)
}

/// pid, ppid and pgid of the process that served a GET of `target`.
fn served(p: &Pool, target: &str) -> (u32, u32, u32) {
    let [pid, ppid, pgid] = served_fields(p, target, ["pid=", "ppid=", "pgid="]);
    (pid, ppid, pgid)
}

/// Sends `n` requests to `/slow` at once, again until `n` distinct workers answered (30 s
/// at most). `/slow` is a barrier: each request waits until all `n` of its round have
/// reached the app, so they are in flight together, each on a worker of its own.
fn workers(p: &Pool, n: usize) -> BTreeSet<(u32, u32, u32)> {
    static ROUND: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let mut seen = BTreeSet::new();
    let deadline = Instant::now() + Duration::from_secs(30);
    while seen.len() < n {
        assert!(
            Instant::now() < deadline,
            "only {seen:?} answered\n{}",
            p.corral.log()
        );
        let round = ROUND.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let target = format!("/slow?n={n}&round={round}");
        seen = std::thread::scope(|s| {
            let all: Vec<_> = (0..n).map(|_| s.spawn(|| served(p, &target))).collect();
            all.into_iter().map(|h| h.join().unwrap()).collect()
        });
    }
    seen
}

/// Waits (30 s at most) until `check` holds.
fn wait_until(p: &Pool, what: &str, check: impl FnMut() -> bool) {
    assert!(
        support::eventually(Duration::from_secs(30), check),
        "{what}\n{}",
        p.corral.log()
    );
}

/// The app is loaded once, by corral's child the preloader; the workers are its children,
/// each a process group of its own.
fn forked_workers_serve(lang: Lang) {
    let p = start(lang, "mode = \"static\"\nmin = 3\nmax = 3");
    let seen = workers(&p, 3);
    let loaded = loads(&p);
    assert_eq!(
        loaded.len(),
        1,
        "the app loaded {loaded:?}\n{}",
        p.corral.log()
    );
    let preloader = loaded[0];
    assert_eq!(parent_of(preloader), p.corral.pid());
    for &(pid, ppid, pgid) in &seen {
        assert_eq!(ppid, preloader, "{seen:?}");
        assert_eq!(pgid, pid, "a forked worker leads its own group: {seen:?}");
    }
    // Killing a worker gets a fresh fork from the same preloader, without loading again.
    let (victim, _, _) = *seen.iter().next().unwrap();
    kill(victim);
    assert!(
        p.corral
            .wait_count("worker forked", 4, Duration::from_secs(20)),
        "{}",
        p.corral.log()
    );
    let again = workers(&p, 3);
    assert!(
        again
            .iter()
            .all(|&(pid, ppid, _)| pid != victim && ppid == preloader),
        "{again:?}"
    );
    assert_eq!(loads(&p), loaded, "{}", p.corral.log());

    // Killing the preloader: its workers die with it, a new preloader loads the app again
    // and the pool serves from it.
    kill(preloader);
    wait_until(&p, "no new preloader loaded the app", || {
        loads(&p).len() >= 2
    });
    let deadline = Instant::now() + Duration::from_secs(30);
    let second = loads(&p)[1];
    loop {
        assert!(Instant::now() < deadline, "{}", p.corral.log());
        if workers(&p, 3).iter().all(|w| w.1 == second) {
            break;
        }
    }
    for &(pid, _, _) in &again {
        assert!(!support::alive(pid), "worker {pid} outlived its preloader");
    }
    assert_eq!(parent_of(second), p.corral.pid());
}

both!(forked_workers_serve: wsgi_forked_workers_serve_and_the_app_loads_once, rack_forked_workers_serve_and_the_app_loads_once);

/// `max_requests` retires each forked worker after its own count; `max_memory` retires the
/// one that grew, measured on its own process tree.
fn recycling_is_per_worker(lang: Lang) {
    let p = start(
        lang,
        "mode = \"static\"\nmin = 1\nmax = 1\nmax_requests = 3\nmax_requests_jitter = 0",
    );
    let mut counts = std::collections::BTreeMap::new();
    for _ in 0..9 {
        let (pid, _, _) = served(&p, "/");
        *counts.entry(pid).or_insert(0) += 1;
    }
    assert!(counts.values().all(|&n| n <= 3), "{counts:?}");
    assert!(counts.len() >= 3, "{counts:?}");
    assert_eq!(loads(&p).len(), 1, "{}", p.corral.log());
    drop(p);

    let p = start(
        lang,
        "mode = \"static\"\nmin = 2\nmax = 2\nmax_memory = \"40MiB\"",
    );
    let before = workers(&p, 2);
    let (grown, _, _) = served(&p, "/grow");
    wait_until(&p, "the grown worker was not recycled", || {
        !support::alive(grown)
    });
    let after = workers(&p, 2);
    let before_pids: BTreeSet<u32> = before.iter().map(|w| w.0).collect();
    let after_pids: BTreeSet<u32> = after.iter().map(|w| w.0).collect();
    // Only the one that grew was replaced.
    assert_eq!(
        before_pids
            .difference(&after_pids)
            .copied()
            .collect::<Vec<_>>(),
        vec![grown],
        "before {before:?} after {after:?}\n{}",
        p.corral.log()
    );
    assert_eq!(loads(&p).len(), 1, "{}", p.corral.log());
}

both!(recycling_is_per_worker: wsgi_recycling_stays_per_worker, rack_recycling_stays_per_worker);

/// With `preload = false` every worker is corral's child and loads the app itself.
fn without_preload_each_worker_loads(lang: Lang) {
    let p = start(lang, "mode = \"static\"\nmin = 2\nmax = 2\npreload = false");
    let seen = workers(&p, 2);
    for &(pid, ppid, _) in &seen {
        assert_eq!(ppid, p.corral.pid(), "{seen:?}");
        assert!(loads(&p).contains(&pid), "{:?} {seen:?}", loads(&p));
    }
    assert_eq!(loads(&p).len(), 2);
    p.corral.assert_absent("preloader");
}

both!(without_preload_each_worker_loads: wsgi_without_preload_each_worker_loads_the_app, rack_without_preload_each_worker_loads_the_app);

/// A new worker's time from the moment the pool needs it to its first response: one worker
/// with `max_requests = 1`, so each request's worker retires and the next request waits for
/// the replacement. Printed for both modes; preloaded, bounded generously.
fn spawn_to_first_response(lang: Lang) {
    let mut report = Vec::new();
    for preload in [true, false] {
        let p = start(
            lang,
            &format!("mode = \"static\"\nmin = 1\nmax = 1\nmax_requests = 1\nmax_requests_jitter = 0\npreload = {preload}"),
        );
        served(&p, "/");
        let mut times = Vec::new();
        let mut last = 0;
        for _ in 0..10 {
            // The last worker retired after its one request; this one waits in the queue
            // for its replacement.
            let t = Instant::now();
            let (pid, _, _) = served(&p, "/");
            assert_ne!(pid, last);
            last = pid;
            times.push(t.elapsed());
        }
        times.sort();
        let median = times[times.len() / 2];
        report.push((preload, median, times[times.len() - 1]));
        if preload {
            assert!(median < Duration::from_secs(1), "{times:?}");
        }
    }
    eprintln!("{lang:?} spawn-to-first-response (median, worst) by preload: {report:?}");
}

both!(spawn_to_first_response: wsgi_new_worker_time_to_first_response, rack_new_worker_time_to_first_response);

/// SIGUSR2 replaces every worker from a fresh preloader, which loads the app again (the code
/// may have changed); the old preloader exits once its last worker is gone.
fn rolling_restart_reloads_the_app(lang: Lang) {
    let p = start(lang, "mode = \"static\"\nmin = 2\nmax = 2");
    let before = workers(&p, 2);
    let first = loads(&p)[0];
    p.corral.signal(nix::sys::signal::Signal::SIGUSR2);
    wait_until(&p, "no new preloader loaded the app", || {
        loads(&p).len() >= 2
    });
    let deadline = Instant::now() + Duration::from_secs(30);
    let second = loads(&p)[1];
    loop {
        assert!(Instant::now() < deadline, "{}", p.corral.log());
        let now = workers(&p, 2);
        if now.iter().all(|w| w.1 == second) {
            assert!(now.is_disjoint(&before));
            break;
        }
    }
    wait_until(&p, &format!("old preloader {first} still runs"), || {
        !support::alive(first)
    });
    assert_eq!(loads(&p).len(), 2, "{}", p.corral.log());
}

both!(rolling_restart_reloads_the_app: wsgi_rolling_restart_forks_from_a_fresh_preloader, rack_rolling_restart_forks_from_a_fresh_preloader);

/// An app that fails while loading: the preloader exits, every worker it was asked for is a
/// failed spawn (logged, backed off), requests get a gateway error, and corral keeps running
/// and trying.
#[test]
fn a_preloader_that_cannot_load_the_app_is_a_failed_spawn() {
    let reaper = Reaper::start("corral-preload-broken-");
    let dir = reaper.dir.clone();
    let loads_dir = writable_dir(&dir.join("loads.d"));
    write_tree(
        &dir,
        &[(
            "broken.py",
            "import os\nwith open(os.path.join(os.environ['LOADS_DIR'], 'loads'), 'a') as f:\n    f.write('%d\\n' % os.getpid())\nraise RuntimeError('broken at import')\n",
        )],
    );
    let config = config(
        &dir,
        &format!(
            "app = \"wsgi:broken:application\"\nmode = \"static\"\nmin = 2\nmax = 2\nqueue_timeout = \"1s\"\nenv = {{ LOADS_DIR = \"{}\" }}",
            loads_dir.display()
        ),
    );
    let corral = reaper.corral(&config);
    let r = http(corral.http_addr(), "GET", "/", &[], b"");
    assert!(r.status >= 500, "{} {}", r.status, r.text());
    assert!(
        corral.wait_count("could not start", 2, Duration::from_secs(10)),
        "{}",
        corral.log()
    );
    // The log is read on another thread: the line may trail the answer.
    assert!(corral.wait_log("broken at import"), "{}", corral.log());
    // Backed off, not hot-looped, and still trying: five preloaders, each started at least
    // its backoff (100 ms doubling per failed spawn; the first failure is two) after the last
    // one exited.
    assert!(
        corral.wait_count("preloader started", 5, Duration::from_secs(30)),
        "{}",
        corral.log()
    );
    let log = corral.log();
    let pids: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("preloader started"))
        .filter_map(|l| l.split(" pid=").nth(1)?.split_whitespace().next())
        .collect();
    let pairs: Vec<(String, String)> = (0..4)
        .map(|k| {
            (
                format!("preloader exited pool=app pid={} ", pids[k]),
                format!("preloader started pool=app pid={} ", pids[k + 1]),
            )
        })
        .collect();
    support::sync1::assert_backoff_doubles(&support::sync1::gaps(&log, &pairs), 0.1, &log);
    let n = std::fs::read_to_string(loads_dir.join("loads"))
        .unwrap()
        .lines()
        .count();
    // The four that exited had loaded; the fifth may still be loading.
    assert!((4..=12).contains(&n), "{n} loads\n{}", corral.log());
    assert!(support::alive(corral.pid()));
}

/// A preloader that breaks the control protocol is killed and replaced, never believed:
/// the pool's `python` here is a fake that, started as the preloader, says it is ready and
/// then, on its first start, names corral's own pid as the worker it forked (not its child:
/// refused, corral signals nothing it names), on its second sends bytes that are no message
/// at all, and from its third says nothing more (the fork request outlives
/// `start_timeout`). corral logs each, kills it, starts another, and keeps running.
#[test]
fn a_preloader_breaking_the_protocol_is_killed_and_replaced() {
    let reaper = Reaper::start("corral-preload-hostile-");
    let dir = reaper.dir.clone();
    let state = writable_dir(&dir.join("state"));
    write_tree(
        &dir,
        &[(
            "fake-python",
            &format!(
                r#"#!/usr/bin/python3
import os, socket, time
starts = os.path.join("{state}", "starts")
with open(starts, "a") as f:
    f.write("x")
control = socket.socket(fileno=0)
control.send(b"ready %d" % os.getpid())
msg, fds, _, _ = socket.recv_fds(control, 256, 4)
start = os.path.getsize(starts)
if start == 1:
    control.send(b"forked 0 %d" % os.getppid())
elif start == 2:
    control.send(b"\xff" * 300)
time.sleep(60)  # from the third start on, silence: the fault under test
"#,
                state = state.display()
            ),
        )],
    );
    support::apps::chmod(&dir.join("fake-python"), 0o755);
    let config = config(
        &dir,
        &format!(
            "app = \"wsgi:whatever:application\"\npython = \"{}/fake-python\"\nmode = \"static\"\nmin = 1\nmax = 1\nstart_timeout = \"2s\"\nqueue_timeout = \"1s\"",
            dir.display()
        ),
    );
    let corral = reaper.corral(&config);
    assert!(
        corral.wait_log("not its child; killing it"),
        "{}",
        corral.log()
    );
    assert!(
        corral.wait_count("malformed control message", 1, Duration::from_secs(20)),
        "{}",
        corral.log()
    );
    assert!(
        corral.wait_count(
            "did not fork a worker within start_timeout",
            1,
            Duration::from_secs(30)
        ),
        "{}",
        corral.log()
    );
    let r = http(corral.http_addr(), "GET", "/", &[], b"");
    assert!(r.status >= 500, "{} {}", r.status, r.text());
    assert!(support::alive(corral.pid()));
    let starts = std::fs::read_to_string(state.join("starts")).unwrap().len();
    assert!(starts >= 3, "{starts}");
}

/// Whether a process running as `nobody`, the workers' own user, may read `pid`'s
/// environment: the same ptrace access check (PTRACE_MODE_READ) that attaching with a
/// debugger or reading /proc/PID/mem passes or fails.
fn readable_by_its_own_user(pid: u32) -> bool {
    std::process::Command::new("setpriv")
        .args(["--reuid=nobody", "--regid=nogroup", "--clear-groups", "--"])
        .args(["cat", &format!("/proc/{pid}/environ")])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .unwrap()
        .success()
}

/// The launcher makes itself non-dumpable before it loads the app (execve undoes what
/// corral could set before it), so a compromised worker of another pool running as the
/// same user cannot trace the preloader or a worker, or read their memory.
fn launchers_cannot_be_traced_by_their_own_user(lang: Lang) {
    assert!(
        nix::unistd::Uid::effective().is_root(),
        "run as root, as CI does"
    );
    let p = start(lang, "mode = \"static\"\nmin = 1\nmax = 1");
    let (worker, preloader, _) = served(&p, "/");
    assert_eq!(parent_of(preloader), p.corral.pid());
    // The check itself works: an ordinary nobody process is readable by nobody.
    let mut plain = std::process::Command::new("setpriv")
        .args(["--reuid=nobody", "--regid=nogroup", "--clear-groups", "--"])
        .args(["sleep", "30"])
        .spawn()
        .unwrap();
    // Once setpriv has become nobody and exec'd sleep.
    let comm = format!("/proc/{}/comm", plain.id());
    assert!(
        support::eventually(Duration::from_secs(10), || std::fs::read_to_string(&comm)
            .unwrap_or_default()
            .trim()
            == "sleep"),
        "sleep never started"
    );
    let readable = readable_by_its_own_user(plain.id());
    let _ = plain.kill();
    let _ = plain.wait();
    assert!(readable, "setpriv cat cannot read a plain nobody process");
    assert!(
        !readable_by_its_own_user(preloader),
        "the preloader is dumpable"
    );
    assert!(
        !readable_by_its_own_user(worker),
        "a forked worker is dumpable"
    );
    drop(p);

    let p = start(lang, "mode = \"static\"\nmin = 1\nmax = 1\npreload = false");
    let (worker, _, _) = served(&p, "/");
    assert_eq!(parent_of(worker), p.corral.pid());
    assert!(
        !readable_by_its_own_user(worker),
        "a launcher worker is dumpable"
    );
}

both!(launchers_cannot_be_traced_by_their_own_user: wsgi_launchers_are_not_dumpable, rack_launchers_are_not_dumpable);

/// A graceful stop ends the preloader as it ends workers: SIGTERM, and it exits by itself
/// (code 0) once its workers are gone, with no SIGKILL.
fn a_graceful_stop_ends_the_preloader_without_sigkill(lang: Lang) {
    let mut p = start(lang, "mode = \"static\"\nmin = 2\nmax = 2");
    workers(&p, 2);
    p.corral.signal(nix::sys::signal::Signal::SIGTERM);
    assert!(
        p.corral.wait_log("pool stopped: every worker reaped"),
        "{}",
        p.corral.log()
    );
    // The whole log, to corral's exit: no SIGKILL came later either.
    assert!(
        p.corral.wait_exited(Duration::from_secs(10)),
        "{}",
        p.corral.log()
    );
    let log = p.corral.log();
    let line = log
        .lines()
        .find(|l| l.contains("preloader stopped") || l.contains("preloader exited"))
        .unwrap_or_else(|| panic!("no preloader exit in:\n{log}"));
    assert!(line.contains("preloader stopped"), "{line}");
    assert!(line.contains("exited with code 0"), "{line}\n{log}");
    assert!(!log.contains("SIGKILL"), "{log}");
}

both!(a_graceful_stop_ends_the_preloader_without_sigkill: wsgi_a_graceful_stop_ends_the_preloader_without_sigkill, rack_a_graceful_stop_ends_the_preloader_without_sigkill);

native!(forked_workers_serve: native_wsgi_forked_workers_serve_and_the_app_loads_once);
native!(recycling_is_per_worker: native_wsgi_recycling_stays_per_worker);
native!(without_preload_each_worker_loads: native_wsgi_without_preload_each_worker_loads_the_app);
native!(spawn_to_first_response: native_wsgi_new_worker_time_to_first_response);
native!(rolling_restart_reloads_the_app: native_wsgi_rolling_restart_forks_from_a_fresh_preloader);
native!(launchers_cannot_be_traced_by_their_own_user: native_wsgi_workers_are_not_dumpable);
native!(a_graceful_stop_ends_the_preloader_without_sigkill: native_wsgi_a_graceful_stop_ends_the_preloader_without_sigkill);
