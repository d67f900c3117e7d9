//! The real worker binary with a real app, idle, stopped by SIGTERM over and over: each
//! time it must exit (code 0) well within a second or two, never wait for a connection or
//! for corral's kill_timeout. Idle in both of its blocking waits (for a connection, and on a
//! kept connection between requests), and at arbitrary moments from its start on. The app
//! starts a thread, so that a signal may be delivered to a thread other than the one that
//! waits.

// Wall-clock waits of a real process: there is no tokio clock here.
#![allow(clippy::disallowed_types)]

use std::os::fd::OwnedFd;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

#[path = "../../control/testing/stop.rs"]
mod stopping;
use stopping::{stop, until_idle, PROMPT};

const WORKER: &str = env!("CARGO_BIN_EXE_corral-wsgi-worker");
const PYTHON: &str = "/usr/bin/python3";
const ROUNDS: u64 = 10;

const APP: &str = r#"import threading, time

def tick():
    while True:
        time.sleep(0.05)

threading.Thread(target=tick, daemon=True).start()

def application(environ, start_response):
    start_response('200 OK', [('Content-Type', 'text/plain')])
    return [b'hello']
"#;

fn dir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("corral-wsgi-stop-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).expect("temp dir");
    d
}

/// The worker serving `dir/app.py` on a fresh listener at `dir/s` (its fd 0).
fn start(dir: &Path) -> Child {
    std::fs::write(dir.join("app.py"), APP).expect("app");
    let listener = UnixListener::bind(dir.join("s")).expect("bind");
    Command::new(WORKER)
        .args([PYTHON, "app:application"])
        .current_dir(dir)
        .stdin(Stdio::from(OwnedFd::from(listener)))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("worker starts")
}

#[test]
fn an_idle_worker_stops_at_once_every_time() {
    for kept in [false, true] {
        for round in 0..ROUNDS {
            let d = dir(&format!("{kept}-{round}"));
            let child = start(&d);
            let conn = kept.then(|| UnixStream::connect(d.join("s")).expect("connect"));
            until_idle(&child);
            let (took, status) = stop(child);
            assert!(
                took < PROMPT && status.code() == Some(0),
                "kept connection {kept}, round {round}: {status:?} after {took:?}"
            );
            drop(conn);
            std::fs::remove_dir_all(d).ok();
        }
    }
}

#[test]
fn a_stop_at_any_moment_after_start_is_prompt() {
    for round in 0..ROUNDS * 2 {
        let d = dir(&format!("any-{round}"));
        let child = start(&d);
        // From before Python is up to well after: each moment a different wait or none. The
        // signal may even come before the worker catches it (the default action then ends
        // it): promptness is what counts.
        std::thread::sleep(Duration::from_millis(round * 7));
        let (took, status) = stop(child);
        assert!(took < PROMPT, "round {round}: {status:?} after {took:?}");
        std::fs::remove_dir_all(d).ok();
    }
}
