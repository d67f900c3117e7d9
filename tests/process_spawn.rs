//! Spawning real workers with `corral::process` until they serve: php-cgi and lsphp with
//! their socket on fd 0, answering real FastCGI and LSAPI requests with a clean environment;
//! placeholder and LISTEN_FDS handoffs; readiness errors; a pool spawned from its
//! configuration; a stale socket replaced. What a spawned worker is once it runs (its group,
//! session, limits, memory, death and output) is in `tests/process_spawn_life.rs`.
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

use std::path::Path;
use std::time::Duration;

use corral::backend::{
    fastcgi, lsapi, BackendConnection, BackendRequest, BackendResponse, ExchangeOptions,
    RequestBody,
};
use corral::config::{BackendAddress, BackendProtocol};
use corral::process::{
    spawn_worker, wait_ready, ExitKind, Handoff, ReadyError, WorkerSocket, WorkerSpawn,
};
use tokio::io::{AsyncBufReadExt, BufReader};

use support::peers::{cgi_params, shared_dir, write_file, LSPHP, PHP_CGI};
use support::spawning::{spec, start, PYTHON, START};

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
