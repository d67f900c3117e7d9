//! The real worker binary, idle, stopped by SIGTERM over and over: each time it must exit
//! (code 0) well within a second or two, never wait for a connection or for corral's
//! kill_timeout. Idle in both of its blocking waits (for a connection, and on a kept
//! connection between requests), in both modes (a script per request, and worker mode's
//! accept, which has its own loop), and at arbitrary moments from its start on.

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

const WORKER: &str = env!("CARGO_BIN_EXE_corral-php-worker");
const ROUNDS: u64 = 10;

const WORKER_SCRIPT: &str = r#"<?php
while (corral_handle_request(function () { echo 'hello'; })) {
}
"#;

fn dir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("corral-php-stop-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).expect("temp dir");
    d
}

/// The worker on a fresh listener at `dir/s` (its fd 0), with `args`.
fn start(dir: &Path, args: &[String]) -> Child {
    let listener = UnixListener::bind(dir.join("s")).expect("bind");
    Command::new(WORKER)
        .args(args)
        .stdin(Stdio::from(OwnedFd::from(listener)))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("worker starts")
}

fn idle_stops(mode: &str, args: &[String]) {
    for kept in [false, true] {
        for round in 0..ROUNDS {
            let d = dir(&format!("{mode}-{kept}-{round}"));
            let child = start(&d, args);
            let conn = kept.then(|| UnixStream::connect(d.join("s")).expect("connect"));
            until_idle(&child);
            let (took, status) = stop(child);
            assert!(
                took < PROMPT && status.code() == Some(0),
                "{mode}, kept connection {kept}, round {round}: {status:?} after {took:?}"
            );
            drop(conn);
            std::fs::remove_dir_all(d).ok();
        }
    }
}

#[test]
fn an_idle_worker_stops_at_once_every_time() {
    idle_stops("script", &[]);
    let d = dir("script-file");
    let script = d.join("worker.php");
    std::fs::write(&script, WORKER_SCRIPT).expect("script");
    idle_stops("worker", &["--worker".into(), script.display().to_string()]);
    std::fs::remove_dir_all(d).ok();
}

#[test]
fn a_stop_at_any_moment_after_start_is_prompt() {
    for round in 0..ROUNDS * 2 {
        let d = dir(&format!("any-{round}"));
        let child = start(&d, &[]);
        // From before PHP is up to well after: each moment a different wait or none. The
        // signal may even come before the worker catches it (the default action then ends
        // it): promptness is what counts.
        std::thread::sleep(Duration::from_millis(round * 7));
        let (took, status) = stop(child);
        assert!(took < PROMPT, "round {round}: {status:?} after {took:?}");
        std::fs::remove_dir_all(d).ok();
    }
}
