//! A worker spawned with `corral::process`, once it runs: its process group counted and
//! killed, the parent-death signal, the PSS of a process tree, its output reaching the log
//! line by line, and the session, limits and user it runs with. Spawning workers until they
//! serve is in `tests/process_spawn.rs`.
//!
//! Every worker is also held by a `support::spawning::Group` guard that SIGKILLs its process
//! group when the test ends, panics included.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing,
    missing_docs
)]

mod support;

use std::io::Write;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use corral::config::BackendProtocol;
use corral::process::{
    process_tree_pss, signal_group, spawn_worker, ExitKind, Handoff, StopSignal, WorkerSocket,
};

use support::peers::shared_dir;
use support::spawning::{spec, start, Group, PYTHON, START};

/// Polls `check` every 10 ms until it gives `Some`, or panics after `within`.
async fn eventually<T>(within: Duration, what: &str, mut check: impl FnMut() -> Option<T>) -> T {
    let deadline = tokio::time::Instant::now() + within;
    loop {
        if let Some(value) = check() {
            return value;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{what} within {within:?}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Pids whose process group is `pgid` and which are not zombies.
fn live_group_members(pgid: u32) -> Vec<u32> {
    let mut members = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else {
            continue;
        };
        let Some(close) = stat.rfind(')') else {
            continue;
        };
        let fields: Vec<&str> = stat[close + 1..].split_whitespace().collect();
        // After the command name: state, ppid, pgrp.
        if fields[2] == pgid.to_string() && fields[0] != "Z" {
            members.push(pid);
        }
    }
    members
}

#[tokio::test]
async fn a_tree_is_counted_and_killed_as_a_group() {
    let dir = tempfile::tempdir().unwrap();
    let mut spec = spec(
        "tree",
        &["/bin/sh", "-c", "sleep 100 & sleep 100 & wait"],
        BackendProtocol::Scgi,
        WorkerSocket::Unix(dir.path().join("tree.sock")),
    );
    spec.handoff = Handoff::Placeholder;
    let (mut worker, _group) = start(&spec);
    let pid = worker.pid;
    let usage = eventually(START, "sh and its two sleeps", || {
        process_tree_pss(pid).ok().filter(|u| u.processes == 3)
    })
    .await;
    assert!(usage.rss_bytes > 0);
    assert_eq!(live_group_members(pid).len(), 3);

    assert!(signal_group(pid, StopSignal::Kill).unwrap());
    let status = tokio::time::timeout(START, worker.child.wait())
        .await
        .unwrap()
        .unwrap();
    let exit = ExitKind::of(status);
    assert_eq!(exit, ExitKind::Signal(9));
    assert_eq!(exit.to_string(), "killed by signal SIGKILL");
    eventually(START, "every process of the group gone", || {
        live_group_members(pid).is_empty().then_some(())
    })
    .await;
}

#[tokio::test]
async fn pss_of_a_python_holding_50_mb() {
    let dir = tempfile::tempdir().unwrap();
    let mut spec = spec(
        "mem",
        &[
            PYTHON,
            "-c",
            "import time\nb = b'x' * (50 * 1024 * 1024)\ntime.sleep(100)",
        ],
        BackendProtocol::Scgi,
        WorkerSocket::Unix(dir.path().join("mem.sock")),
    );
    spec.handoff = Handoff::Placeholder;
    let (worker, _group) = start(&spec);
    let usage = eventually(START, "PSS above 40 MB", || {
        process_tree_pss(worker.pid)
            .ok()
            .filter(|u| u.pss_bytes.is_some_and(|pss| pss > 40 << 20))
    })
    .await;
    assert_eq!(usage.processes, 1);
    assert!(usage.rss_bytes > 0);
}

/// Spawns `sleep 100` from a thread with its own runtime, then lets that thread end
/// without dropping (and so killing) the child: the parent-death signal must kill it.
#[test]
fn the_worker_dies_with_the_thread_that_spawned_it() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("orphan.sock");
    let pid = std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(async {
            let mut spec = spec(
                "orphan",
                &["/bin/sleep", "100"],
                BackendProtocol::Scgi,
                WorkerSocket::Unix(socket),
            );
            spec.handoff = Handoff::Placeholder;
            let worker = spawn_worker(&spec).unwrap();
            let pid = worker.pid;
            // Not dropped: kill_on_drop must not be what ends it.
            std::mem::forget(worker.child);
            pid
        })
    })
    .join()
    .unwrap();
    let _group = Group(pid);
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(eventually(START, "the orphan killed", || {
        live_group_members(pid).is_empty().then_some(())
    }));
    // Still our child: reap it and see how it died.
    let status = nix::sys::wait::waitpid(nix::unistd::Pid::from_raw(pid as i32), None).unwrap();
    assert_eq!(
        status,
        nix::sys::wait::WaitStatus::Signaled(
            nix::unistd::Pid::from_raw(pid as i32),
            nix::sys::signal::Signal::SIGKILL,
            false
        )
    );
}

/// Everything logged by any test of this file.
fn captured_log() -> Arc<Mutex<Vec<u8>>> {
    static LOG: OnceLock<Arc<Mutex<Vec<u8>>>> = OnceLock::new();
    LOG.get_or_init(|| {
        let log = Arc::new(Mutex::new(Vec::new()));
        let sink = log.clone();
        tracing_subscriber::fmt()
            .with_writer(move || Capture(sink.clone()))
            .init();
        log
    })
    .clone()
}

struct Capture(Arc<Mutex<Vec<u8>>>);

impl Write for Capture {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[tokio::test]
async fn worker_output_reaches_the_log_line_by_line() {
    let log = captured_log();
    let dir = tempfile::tempdir().unwrap();
    let mut spec = spec(
        "chatty",
        &[
            "/bin/sh",
            "-c",
            "echo out-line-7f3a; printf 'err-line-7f3a\\nsecond-err-7f3a' >&2; exec sleep 100",
        ],
        BackendProtocol::Scgi,
        WorkerSocket::Unix(dir.path().join("chatty.sock")),
    );
    spec.handoff = Handoff::Placeholder;
    let (worker, group) = start(&spec);
    let pid = worker.pid;
    let lines = eventually(START, "the worker's lines in the log", || {
        let text = String::from_utf8_lossy(&log.lock().unwrap()).into_owned();
        let lines: Vec<String> = text
            .lines()
            .filter(|l| l.contains("7f3a"))
            .map(str::to_string)
            .collect();
        (lines.len() >= 2).then_some(lines)
    })
    .await;
    let out = lines.iter().find(|l| l.contains("out-line-7f3a")).unwrap();
    assert!(out.contains(&format!("pid={pid}")), "{out}");
    assert!(out.contains("pool=\"chatty\""), "{out}");
    assert!(out.contains("stream=\"stdout\""), "{out}");
    let err = lines.iter().find(|l| l.contains("err-line-7f3a")).unwrap();
    assert!(err.contains("stream=\"stderr\""), "{err}");
    assert!(!err.contains("second-err"), "one event per line: {err}");
    // The unterminated last line is logged once the pipe closes.
    drop(group);
    eventually(START, "the unterminated line", || {
        let text = String::from_utf8_lossy(&log.lock().unwrap()).into_owned();
        text.contains("second-err-7f3a").then_some(())
    })
    .await;
}

/// A line of `/proc/PID/status` or `/proc/PID/limits`, whitespace-collapsed.
fn proc_line(pid: u32, file: &str, prefix: &str) -> String {
    let text = std::fs::read_to_string(format!("/proc/{pid}/{file}")).unwrap();
    let line = text.lines().find(|l| l.starts_with(prefix)).unwrap();
    line.split_whitespace().collect::<Vec<_>>().join(" ")
}

#[tokio::test]
async fn the_worker_leads_its_session_with_limits_and_its_user() {
    let dir = shared_dir();
    let mut spec = spec(
        "limits",
        &["/bin/sleep", "100"],
        BackendProtocol::Scgi,
        WorkerSocket::Unix(dir.path().join("limits.sock")),
    );
    spec.handoff = Handoff::ListenFds;
    spec.nofile = Some(256);
    spec.user = Some("nobody".into());
    let (worker, _group) = start(&spec);
    let pid = worker.pid;
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let fields: Vec<&str> = stat[stat.rfind(')').unwrap() + 1..]
        .split_whitespace()
        .collect();
    // state, ppid, pgrp, session
    assert_eq!(
        fields[1],
        std::process::id().to_string(),
        "corral is the parent"
    );
    assert_eq!(fields[2], pid.to_string(), "own process group");
    assert_eq!(fields[3], pid.to_string(), "own session");
    assert_eq!(
        proc_line(pid, "limits", "Max open files"),
        format!(
            "Max open files 256 {} files",
            nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE)
                .unwrap()
                .1
        )
    );
    assert!(proc_line(pid, "limits", "Max core file size").starts_with("Max core file size 0 "));
    if nix::unistd::Uid::effective().is_root() {
        let nobody = nix::unistd::User::from_name("nobody").unwrap().unwrap();
        let (uid, gid) = (nobody.uid.as_raw(), nobody.gid.as_raw());
        assert_eq!(
            proc_line(pid, "status", "Uid:"),
            format!("Uid: {uid} {uid} {uid} {uid}")
        );
        assert_eq!(
            proc_line(pid, "status", "Gid:"),
            format!("Gid: {gid} {gid} {gid} {gid}")
        );
        assert_eq!(proc_line(pid, "status", "Groups:"), "Groups:");
    }
}
