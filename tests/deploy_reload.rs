//! Deployment error resistance with real interpreters: a reload (`corral reload`, SIGHUP)
//! to a configuration whose WSGI app raises on import, or whose Rack app exits while it
//! boots, does not switch. The running generation answers every request sent before,
//! during and after it; `corral reload` exits non-zero naming the pool and the app's error;
//! `/status` (text and JSON) says which pool refused and why; systemd hears `READY=1` with
//! a `STATUS=` saying the reload was refused; a good reload afterwards applies.

mod support;

use std::collections::BTreeSet;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::Duration;

use support::peers::{shared_dir, write_file};
use support::server::{http, Corral};

/// A Python app answering with its release.
const GOOD_PY: &str = r#"
def application(environ, start_response):
    start_response("200 OK", [("Content-Type", "text/plain")])
    return [b"release good"]
"#;

/// A Python app whose import fails.
const BROKEN_PY: &str = r#"
raise RuntimeError("broken deploy: the settings module is missing")
"#;

/// A Rack app answering with its release (no rack gem needed: a bare lambda).
const GOOD_RU: &str = r#"
run lambda { |env| [200, { "content-type" => "text/plain" }, ["release good"]] }
"#;

/// A Rack app that gives up while it boots.
const BROKEN_RU: &str = r#"
$stderr.puts "broken deploy: the database is unreachable"
exit 3
"#;

/// corral with an http and a status listener in front of one app pool from `dir` whose
/// environment has `RELEASE = release` (a reload to another release replaces the pool).
fn config(run: &Path, dir: &Path, app: &str, release: &str) -> String {
    support::site_config(
        run,
        &format!(
            "app = \"{app}\"\ncwd = \"{}\"\nmode = \"static\"\nmin = 1\nmax = 1\n\
             start_timeout = \"10s\"\nenv = {{ RELEASE = \"{release}\" }}",
            dir.display()
        ),
    )
}

/// Requests sent back to back on another thread until stopped: how many, and every answer
/// that was not the good release's.
struct Load {
    stop: Arc<AtomicBool>,
    served: Arc<AtomicU64>,
    wrong: Arc<Mutex<Vec<String>>>,
    thread: Option<thread::JoinHandle<()>>,
}

impl Load {
    fn start(addr: std::net::SocketAddr) -> Load {
        let stop = Arc::new(AtomicBool::new(false));
        let served = Arc::new(AtomicU64::new(0));
        let wrong = Arc::new(Mutex::new(Vec::new()));
        let (s, n, w) = (Arc::clone(&stop), Arc::clone(&served), Arc::clone(&wrong));
        let thread = thread::spawn(move || {
            while !s.load(Ordering::Relaxed) {
                let r = http(addr, "GET", "/", &[], b"");
                if r.status != 200 || r.text() != "release good" {
                    w.lock().unwrap().push(format!("{} {}", r.status, r.text()));
                }
                n.fetch_add(1, Ordering::Relaxed);
            }
        });
        Load {
            stop,
            served,
            wrong,
            thread: Some(thread),
        }
    }

    fn served(&self) -> u64 {
        self.served.load(Ordering::Relaxed)
    }

    /// Waits until `more` requests beyond those served so far were answered.
    fn wait_more(&self, more: u64) {
        let target = self.served() + more;
        assert!(
            support::eventually(Duration::from_secs(10), || self.served() >= target),
            "the load stalled"
        );
    }

    fn finish(mut self) -> (u64, Vec<String>) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            t.join().unwrap();
        }
        let wrong = self.wrong.lock().unwrap().clone();
        (self.served(), wrong)
    }
}

/// The status listener's page at `target`, as text.
fn status_page(corral: &Corral, target: &str) -> String {
    let r = http(corral.status_ready_addr(), "GET", target, &[], b"");
    assert_eq!(r.status, 200, "{}", r.text());
    r.text()
}

/// Serves `good` from `dir`, reloads to release 2 whose app file is `broken` under load,
/// and checks the refusal everywhere it is reported; then a good release 3 applies.
fn refused_reload(app_name: &str, good: (&str, &str), broken: &str, error: &str) {
    let dir = shared_dir();
    let (file, text) = good;
    write_file(dir.path(), file, text);
    let run = dir.path().join("run");
    // systemd's side: a notify socket corral reports to.
    let notify = dir.path().join("notify.sock");
    let socket = std::os::unix::net::UnixDatagram::bind(&notify).unwrap();
    let notify_env = notify.display().to_string();
    let corral = Corral::start_after(
        &config(&run, dir.path(), app_name, "1"),
        1,
        "",
        &[("NOTIFY_SOCKET", notify_env.as_str())],
    );
    let r = http(corral.http_addr(), "GET", "/", &[], b"");
    assert_eq!(r.text(), "release good", "{}", corral.log());
    let load = Load::start(corral.http_addr());
    load.wait_more(5);
    // The deploy: the app file is replaced by the broken one, and the pool's settings
    // change, so the reload builds a new pool that imports it.
    write_file(dir.path(), file, broken);
    std::fs::write(
        corral.config_path(),
        config(&run, dir.path(), app_name, "2"),
    )
    .unwrap();
    let path = corral.config_path().display().to_string();
    let out = support::corral(&["reload", "-c", &path]);
    assert_ne!(out.code, Some(0), "{out:?}\n{}", corral.log());
    assert!(
        out.stderr.contains("refused the reload") && out.stderr.contains("pool site"),
        "{out:?}"
    );
    assert!(out.stderr.contains(error), "the app's own error: {out:?}");
    // The old generation served on during the reload and serves after it.
    load.wait_more(20);
    let (served, wrong) = load.finish();
    assert!(
        wrong.is_empty(),
        "{} of {served} answers were not the running release's: {wrong:?}\n{}",
        wrong.len(),
        corral.log()
    );
    assert!(corral.wait_log("reload refused"), "{}", corral.log());
    // systemd hears that corral is ready again, and that the reload was refused.
    let heard = support::notify_until(&socket, "reload refused", Duration::from_secs(10));
    let last = heard.last().unwrap();
    assert!(
        last.contains("READY=1")
            && last.contains("STATUS=reload refused: pool site")
            && last.contains(error),
        "{last}"
    );
    // /status says which pool refused and why, in JSON and in text.
    let json = status_page(&corral, "/status?json");
    let member = json
        .split_once("\"last_reload\":")
        .map(|(_, m)| m.to_owned())
        .unwrap_or_else(|| panic!("no last_reload in {json}"));
    assert!(
        member.contains("\"applied\":false")
            && member.contains("\"pool\":\"site\"")
            && member.contains(error),
        "{member}"
    );
    let text = status_page(&corral, "/status");
    assert!(
        text.contains("reload refused by:    site") && text.contains(error),
        "{text}"
    );
    // The refused pool's workers are gone; a good release afterwards applies.
    write_file(dir.path(), file, text_of(good));
    std::fs::write(
        corral.config_path(),
        config(&run, dir.path(), app_name, "3"),
    )
    .unwrap();
    let out = support::corral(&["reload", "-c", &path]);
    assert_eq!(out.code, Some(0), "{out:?}\n{}", corral.log());
    assert!(out.stdout.contains("serves now"), "{out:?}");
    let json = status_page(&corral, "/status?json");
    assert!(json.contains("\"applied\":true"), "{json}");
    let r = http(corral.http_addr(), "GET", "/", &[], b"");
    assert_eq!(r.text(), "release good");
}

fn text_of<'a>(good: (&str, &'a str)) -> &'a str {
    good.1
}

#[test]
fn a_reload_to_a_wsgi_app_that_raises_on_import_keeps_the_old_generation() {
    refused_reload(
        "wsgi:app:application",
        ("app.py", GOOD_PY),
        BROKEN_PY,
        "the settings module is missing",
    );
}

#[test]
fn a_reload_to_a_rack_app_that_exits_keeps_the_old_generation() {
    refused_reload(
        "rack:config.ru",
        ("config.ru", GOOD_RU),
        BROKEN_RU,
        "the database is unreachable",
    );
}

/// Answers with its pid, so the test can tell which workers serve.
const PID_PY: &str = r#"
import os

def application(environ, start_response):
    start_response("200 OK", [("Content-Type", "text/plain")])
    return [str(os.getpid()).encode()]
"#;

#[test]
fn a_rolling_restart_whose_replacement_cannot_import_the_app_stops_and_the_old_workers_serve() {
    let dir = shared_dir();
    write_file(dir.path(), "app.py", PID_PY);
    let run = dir.path().join("run");
    // Each worker imports the app itself (no preloader), and has no health_check: its
    // readiness is its launcher answering, once the import is done.
    let text = config(&run, dir.path(), "wsgi:app:application", "1")
        .replace("min = 1\nmax = 1", "min = 2\nmax = 2\npreload = false");
    let corral = Corral::start(&text, 1);
    let addr = corral.http_addr();
    let served = |n: usize| -> BTreeSet<u32> {
        (0..n)
            .map(|_| {
                let r = http(addr, "GET", "/", &[], b"");
                assert_eq!(r.status, 200, "{}\n{}", r.text(), corral.log());
                r.text().parse().unwrap()
            })
            .collect()
    };
    let workers =
        || -> BTreeSet<u32> { support::sync1::children(corral.pid()).into_iter().collect() };
    // Both workers up, their app loaded ("worker started" is logged at spawn, before the
    // launcher imports the app: the broken app.py written below must not reach a worker
    // still loading).
    assert!(
        support::eventually(Duration::from_secs(10), || {
            corral.count_log("corral-wsgi: serving") >= 2 && workers().len() == 2
        }),
        "two workers:\n{}",
        corral.log()
    );
    let before = workers();
    assert!(served(4).is_subset(&before));
    write_file(dir.path(), "app.py", BROKEN_PY);
    let path = corral.config_path().display().to_string();
    let out = support::corral(&["restart-workers", "-c", &path]);
    assert_eq!(out.code, Some(0), "{out:?}");
    assert!(
        corral.wait_log("rolling restart stopped"),
        "{}",
        corral.log()
    );
    // The workers it did not replace serve on, both of them, and nothing failed.
    let after = served(20);
    assert!(
        after.is_subset(&before),
        "{after:?} not of {before:?}\n{}",
        corral.log()
    );
    assert!(
        before.iter().all(|&p| support::alive(p)),
        "{}",
        corral.log()
    );
    assert!(
        corral.log().contains("the settings module is missing"),
        "the replacement's error is in the log:\n{}",
        corral.log()
    );
}

#[test]
fn corral_reload_is_answered_by_the_running_corral_not_by_an_earlier_ones_result() {
    let dir = shared_dir();
    write_file(dir.path(), "app.py", GOOD_PY);
    let run = dir.path().join("run");
    let text = |release: &str| {
        config(&run, dir.path(), "wsgi:app:application", release)
            .replace("start_timeout = \"10s\"", "start_timeout = \"60s\"")
    };
    // A first corral applies one reload (reload.result says number 1) and stops.
    let mut first = Corral::start(&text("1"), 1);
    let path = first.config_path().display().to_string();
    std::fs::write(first.config_path(), text("2")).unwrap();
    let out = support::corral(&["reload", "-c", &path]);
    assert_eq!(out.code, Some(0), "{out:?}");
    first.signal(nix::sys::signal::Signal::SIGTERM);
    assert!(
        first.wait_exited(Duration::from_secs(20)),
        "{}",
        first.log()
    );
    // The next corral in the same runtime directory numbers its reloads from 1 again: its
    // first reload is answered at once, not taken for the old one nor waited on for 70 s.
    let second = Corral::start(&text("1"), 1);
    let path = second.config_path().display().to_string();
    std::fs::write(second.config_path(), text("3")).unwrap();
    let started = tokio::time::Instant::now();
    let out = support::corral(&["reload", "-c", &path]);
    assert_eq!(out.code, Some(0), "{out:?}\n{}", second.log());
    assert!(out.stdout.contains("generation 1 serves now"), "{out:?}");
    assert!(
        started.elapsed() < Duration::from_secs(20),
        "{:?}",
        started.elapsed()
    );
}
