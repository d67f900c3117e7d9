//! Spawning real workers with `corral::process`: php-cgi and lsphp with their socket on
//! fd 0, answering real FastCGI and LSAPI requests with a clean environment; placeholder
//! and LISTEN_FDS handoffs; readiness errors; killing a process group; the parent-death
//! signal; PSS of a process tree; worker output reaching the log.
//!
//! Every worker is also held by a [`Group`] guard that SIGKILLs its process group when the
//! test ends, panics included.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing,
    missing_docs
)]

mod support;

use std::io::Write;
use std::path::Path;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use corral::backend::{
    fastcgi, lsapi, BackendConnection, BackendRequest, BackendResponse, ExchangeOptions,
    RequestBody,
};
use corral::config::{BackendAddress, BackendProtocol};
use corral::process::{
    process_tree_pss, signal_group, spawn_worker, wait_ready, ExitKind, Handoff, ReadyError,
    SpawnedWorker, StopSignal, WorkerSocket, WorkerSpawn,
};
use tokio::io::{AsyncBufReadExt, BufReader};

use support::peers::{cgi_params, shared_dir, write_file, LSPHP, PHP_CGI};

const PYTHON: &str = "/usr/bin/python3";
const START: Duration = Duration::from_secs(20);

/// SIGKILLs a worker's process group when dropped.
struct Group(u32);

impl Drop for Group {
    fn drop(&mut self) {
        let _ = signal_group(self.0, StopSignal::Kill);
    }
}

fn spec(pool: &str, argv: &[&str], protocol: BackendProtocol, socket: WorkerSocket) -> WorkerSpawn {
    WorkerSpawn::new(
        pool,
        argv.iter().map(|s| s.to_string()).collect(),
        protocol,
        socket,
        Handoff::Fd0,
    )
}

fn start(spec: &WorkerSpawn) -> (SpawnedWorker, Group) {
    let worker = spawn_worker(spec).unwrap();
    let group = Group(worker.pid);
    (worker, group)
}

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

async fn body_text(response: &mut BackendResponse) -> String {
    let mut all = Vec::new();
    while let Some(chunk) = response.body.next_chunk().await {
        all.extend_from_slice(&chunk.unwrap());
    }
    String::from_utf8(all).unwrap()
}

fn get(script: &Path) -> BackendRequest {
    BackendRequest {
        params: cgi_params("GET", script, "", &[]),
        body: RequestBody::empty(),
    }
}

async fn connect(address: &BackendAddress) -> BackendConnection {
    BackendConnection::connect(address, Duration::from_secs(5))
        .await
        .unwrap()
}

/// The worker's initial environment, as the kernel holds it.
const ENVIRON_PHP: &str =
    "<?php echo str_replace(\"\\0\", \"\\n\", file_get_contents('/proc/self/environ'));";

/// php-cgi on fd 0 answers a FastCGI request; its environment is exactly PATH, the pool's
/// env and the pinned `PHP_FCGI_MAX_REQUESTS=0`.
async fn php_cgi_answers(socket: WorkerSocket) {
    std::env::set_var("CORRAL_TEST_LEAK_MARKER", "must-not-reach-workers");
    let dir = shared_dir();
    let script = write_file(dir.path(), "env.php", ENVIRON_PHP);
    let mut spec = spec("php", &[PHP_CGI, "-n"], BackendProtocol::Fastcgi, socket);
    spec.env.insert("APP_MARKER".into(), "pool-value".into());
    spec.env
        .insert("PHP_FCGI_MAX_REQUESTS".into(), "500".into());
    let (mut worker, _group) = start(&spec);
    wait_ready(&worker.address, &mut worker.child, START)
        .await
        .unwrap();

    let options = ExchangeOptions::new("php", 1);
    let mut response = fastcgi::send(connect(&worker.address).await, get(&script), &options)
        .await
        .unwrap();
    assert_eq!(response.head.status_code(), 200);
    let text = body_text(&mut response).await;
    let mut names: Vec<&str> = text
        .lines()
        .filter(|l| !l.is_empty())
        .map(|l| l.split('=').next().unwrap())
        .collect();
    names.sort_unstable();
    assert_eq!(
        names,
        vec!["APP_MARKER", "PATH", "PHP_FCGI_MAX_REQUESTS"],
        "environment: {text}"
    );
    assert!(text.contains("PHP_FCGI_MAX_REQUESTS=0\n"), "{text}");
    assert!(text.contains("APP_MARKER=pool-value\n"), "{text}");
    assert!(!text.contains("CORRAL_TEST_LEAK_MARKER"), "{text}");
    assert!(worker.child.try_wait().unwrap().is_none());
}

#[tokio::test]
async fn php_cgi_on_fd0_unix_socket() {
    let dir = tempfile::tempdir().unwrap();
    php_cgi_answers(WorkerSocket::Unix(dir.path().join("php.sock"))).await;
}

#[tokio::test]
async fn php_cgi_on_fd0_tcp_port() {
    php_cgi_answers(WorkerSocket::Tcp { port: 0 }).await;
}

#[tokio::test]
async fn lsphp_on_fd0_serves_connection_after_connection() {
    let dir = shared_dir();
    let script = write_file(
        dir.path(),
        "who.php",
        "<?php preg_match('/^Uid:\\s+(\\d+)/m', file_get_contents('/proc/self/status'), $m); \
         echo getmypid(), ' ', $m[1];",
    );
    let spec = spec(
        "lsphp",
        &[LSPHP, "-n"],
        BackendProtocol::Lsapi,
        WorkerSocket::Unix(dir.path().join("lsphp.sock")),
    );
    let (mut worker, _group) = start(&spec);
    wait_ready(&worker.address, &mut worker.child, START)
        .await
        .unwrap();
    let options = ExchangeOptions::new("lsphp", 1);
    let expected_uid = if nix::unistd::Uid::effective().is_root() {
        let nobody = nix::unistd::User::from_name("nobody").unwrap().unwrap();
        nobody.uid.as_raw()
    } else {
        nix::unistd::Uid::effective().as_raw()
    };
    let expected = format!("{} {expected_uid}", worker.pid);

    let mut conn = connect(&worker.address).await;
    for round in 1..=2 {
        let mut response = lsapi::send(conn, get(&script), &options).await.unwrap();
        assert_eq!(body_text(&mut response).await, expected, "request {round}");
        conn = response.body.take_connection().expect("connection kept");
    }
    drop(conn);
    // A new connection after the first one closed: lsphp run as root would have exited.
    let mut response = lsapi::send(connect(&worker.address).await, get(&script), &options)
        .await
        .unwrap();
    assert_eq!(body_text(&mut response).await, expected, "third request");
    assert!(
        worker.child.try_wait().unwrap().is_none(),
        "lsphp still runs"
    );
}

#[tokio::test]
async fn placeholder_command_becomes_ready() {
    // The program binds the socket itself, so the worker's user (nobody, under a root
    // corral with no user set) must be able to create it in the directory.
    let dir = shared_dir();
    let mut spec = spec(
        "py",
        &[
            PYTHON,
            "-c",
            "import socket, sys, time\n\
             s = socket.socket(socket.AF_UNIX)\ns.bind(sys.argv[1])\ns.listen()\ntime.sleep(100)",
            "{socket}",
        ],
        BackendProtocol::Scgi,
        WorkerSocket::Unix(dir.path().join("app.sock")),
    );
    spec.handoff = Handoff::Placeholder;
    let (mut worker, _group) = start(&spec);
    wait_ready(&worker.address, &mut worker.child, START)
        .await
        .unwrap();
    assert!(dir.path().join("app.sock").exists());
}

#[tokio::test]
async fn placeholder_port_is_substituted() {
    // The worker binds the port its argv names and tells every caller what argv said: the
    // answer on the port corral chose proves `{port}` became that port, not a literal.
    let mut spec = spec(
        "py",
        &[
            PYTHON,
            "-c",
            "import socket, sys\n\
             s = socket.socket()\ns.bind(('127.0.0.1', int(sys.argv[1])))\ns.listen()\n\
             while True:\n    c, _ = s.accept()\n    c.sendall(sys.argv[1].encode())\n    c.close()",
            "{port}",
        ],
        BackendProtocol::Scgi,
        WorkerSocket::Tcp { port: 0 },
    );
    spec.handoff = Handoff::Placeholder;
    let (mut worker, _group) = start(&spec);
    wait_ready(&worker.address, &mut worker.child, START)
        .await
        .unwrap();
    let BackendAddress::Tcp { host, port } = &worker.address else {
        panic!("a TCP worker socket gave {:?}", worker.address);
    };
    assert_ne!(*port, 0, "corral chose no port");
    let mut stream = std::net::TcpStream::connect((host.as_str(), *port)).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    let mut said = String::new();
    std::io::Read::read_to_string(&mut stream, &mut said).unwrap();
    assert_eq!(said, port.to_string(), "the worker's argv[1]");
    let argv = std::fs::read(format!("/proc/{}/cmdline", worker.pid)).unwrap();
    let argv: Vec<&[u8]> = argv.split(|b| *b == 0).collect();
    assert_eq!(
        argv[3],
        port.to_string().as_bytes(),
        "argv as the kernel holds it"
    );
}

#[tokio::test]
async fn a_command_that_exits_at_once_is_not_ready() {
    let dir = tempfile::tempdir().unwrap();
    let mut spec = spec(
        "bad",
        &["/bin/sh", "-c", "exit 3"],
        BackendProtocol::Scgi,
        WorkerSocket::Unix(dir.path().join("never.sock")),
    );
    spec.handoff = Handoff::Placeholder;
    let (mut worker, _group) = start(&spec);
    let err = wait_ready(&worker.address, &mut worker.child, START)
        .await
        .unwrap_err();
    assert!(
        matches!(
            err,
            ReadyError::Exited {
                exit: ExitKind::Code(3),
                ..
            }
        ),
        "{err:?}"
    );
    assert!(err.to_string().contains("exited with code 3"), "{err}");
}

#[tokio::test]
async fn a_command_that_never_listens_times_out() {
    let dir = tempfile::tempdir().unwrap();
    let mut spec = spec(
        "mute",
        &["/bin/sleep", "100"],
        BackendProtocol::Scgi,
        WorkerSocket::Unix(dir.path().join("never.sock")),
    );
    spec.handoff = Handoff::Placeholder;
    let (mut worker, _group) = start(&spec);
    let err = wait_ready(
        &worker.address,
        &mut worker.child,
        Duration::from_millis(300),
    )
    .await
    .unwrap_err();
    assert!(matches!(err, ReadyError::TimedOut { .. }), "{err:?}");
    assert!(err.to_string().contains("300ms"), "{err}");
}

#[tokio::test]
async fn listen_fds_hands_over_fd_3_with_the_workers_pid() {
    let dir = tempfile::tempdir().unwrap();
    let mut spec = spec(
        "sd",
        &[
            PYTHON,
            "-c",
            "import os, socket\n\
             s = socket.socket(fileno=3)\n\
             line = '%s %s %d\\n' % (os.environ.get('LISTEN_PID'), \
             os.environ.get('LISTEN_FDS'), os.getpid())\n\
             while True:\n    c, _ = s.accept()\n\
             \x20   try:\n        c.sendall(line.encode())\n\
             \x20   except OSError:\n        pass  # the readiness probe left at once\n\
             \x20   c.close()",
        ],
        BackendProtocol::Scgi,
        WorkerSocket::Unix(dir.path().join("sd.sock")),
    );
    spec.handoff = Handoff::ListenFds;
    let (mut worker, _group) = start(&spec);
    wait_ready(&worker.address, &mut worker.child, START)
        .await
        .unwrap();
    let stream = tokio::net::UnixStream::connect(dir.path().join("sd.sock"))
        .await
        .unwrap();
    let mut line = String::new();
    tokio::time::timeout(START, BufReader::new(stream).read_line(&mut line))
        .await
        .unwrap()
        .unwrap();
    let pid = worker.pid;
    assert_eq!(line, format!("{pid} 1 {pid}\n"));
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

#[tokio::test]
async fn a_configured_pool_spawns_and_answers() {
    let dir = shared_dir();
    let script = write_file(dir.path(), "env.php", ENVIRON_PHP);
    let config = corral::config::parse(
        &format!(
            "[server]\nruntime_dir = \"{}\"\n\
             [[listen]]\naddress = \"127.0.0.1:0\"\nprotocol = \"http\"\n\
             [[contexts]]\npool = \"php\"\nroot = \"{}\"\n\
             [pools.php]\ncommand = [\"{PHP_CGI}\", \"-n\"]\nenv = {{ APP_ENV = \"test\" }}\n",
            dir.path().display(),
            dir.path().display()
        ),
        "test.toml",
    )
    .unwrap();
    let pool = config.pool("php").unwrap();
    let corral::config::Backend::Spawned(spawn) = &pool.backend else {
        panic!("a spawned pool");
    };
    let socket = WorkerSocket::Unix(config.server.runtime_dir.join("php-1.sock"));
    let spec = WorkerSpawn::from_config(pool, spawn, socket).unwrap();
    assert_eq!(spec.handoff, Handoff::Fd0);
    let (mut worker, _group) = start(&spec);
    wait_ready(&worker.address, &mut worker.child, spawn.start_timeout)
        .await
        .unwrap();
    let options = ExchangeOptions::new("php", 1);
    let mut response = fastcgi::send(connect(&worker.address).await, get(&script), &options)
        .await
        .unwrap();
    let text = body_text(&mut response).await;
    assert!(text.contains("APP_ENV=test\n"), "{text}");
    assert!(text.contains("PHP_FCGI_MAX_REQUESTS=0\n"), "{text}");
}

#[tokio::test]
async fn a_stale_socket_is_replaced_but_a_regular_file_is_kept() {
    let dir = tempfile::tempdir().unwrap();
    let stale = dir.path().join("stale.sock");
    support::invariants::refusing_socket(&stale);
    assert!(stale.exists(), "a closed listener leaves its file behind");
    let (mut worker, _group) = start(&spec(
        "php",
        &[PHP_CGI, "-n"],
        BackendProtocol::Fastcgi,
        WorkerSocket::Unix(stale),
    ));
    wait_ready(&worker.address, &mut worker.child, START)
        .await
        .unwrap();

    let file = dir.path().join("precious");
    std::fs::write(&file, "keep me").unwrap();
    let err = spawn_worker(&spec(
        "php",
        &[PHP_CGI, "-n"],
        BackendProtocol::Fastcgi,
        WorkerSocket::Unix(file.clone()),
    ))
    .unwrap_err();
    assert_eq!(err.kind(), std::io::ErrorKind::AddrInUse, "{err}");
    assert_eq!(std::fs::read_to_string(&file).unwrap(), "keep me");
}
