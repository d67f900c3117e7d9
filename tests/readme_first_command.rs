//! The README's first command on a fresh machine, `cargo run --release`, works: in a fresh
//! clone of the repository, corral with no arguments runs its embedded default configuration
//! and http://127.0.0.1:8080/ answers with the demo WSGI page; SIGTERM then stops it cleanly.
//!
//! The test clones the committed repository (`git clone` of this working tree's HEAD) into a
//! temporary directory and runs the binary cargo already built for this test run from inside
//! the clone, instead of `cargo run --release` there: building again would take minutes and
//! would test cargo rather than corral. What the clone checks is that nothing the default
//! needs lives outside the committed tree or depends on the directory corral starts in.
//!
//! The embedded default listens on the fixed ports 127.0.0.1:8080 (http) and 127.0.0.1:9180
//! (status) and keeps worker sockets in /run/corral, so the test needs those ports free and
//! /run/corral creatable (CI runs the tests as root); it fails with a message saying which.

mod support;

use std::io::{BufRead, BufReader};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::Duration;

use support::server::http;
use support::CORRAL;

/// How long the default may take to answer its first request (it spawns the worker then).
const FIRST_ANSWER: Duration = Duration::from_secs(20);
/// How long a graceful stop may take.
const STOP: Duration = Duration::from_secs(15);

/// corral, killed and reaped if the test fails before stopping it.
struct Running {
    child: Option<Child>,
    log: Arc<Mutex<String>>,
}

impl Running {
    fn log(&self) -> String {
        self.log.lock().unwrap().clone()
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        if let Some(child) = self.child.as_mut() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

#[test]
fn corral_with_no_arguments_serves_the_demo_page_from_a_fresh_clone() {
    for (addr, what) in [("127.0.0.1:8080", "http"), ("127.0.0.1:9180", "status")] {
        if let Err(e) = TcpListener::bind(addr) {
            panic!(
                "cannot test the embedded default: {addr} (its {what} address, fixed by the \
                 default configuration) is not free ({e}); stop whatever listens there"
            );
        }
    }
    if let Err(e) = std::fs::create_dir_all("/run/corral") {
        panic!(
            "cannot test the embedded default: its runtime_dir /run/corral cannot be created \
             ({e}); run the tests as root as CI does"
        );
    }

    let tmp = tempfile::Builder::new()
        .prefix("corral-clone-")
        .tempdir()
        .unwrap();
    let clone = tmp.path().join("corral");
    let git = Command::new("git")
        .arg("clone")
        .arg("--quiet")
        .arg(env!("CARGO_MANIFEST_DIR"))
        .arg(&clone)
        .output()
        .expect("run git clone");
    assert!(
        git.status.success(),
        "git clone failed: {}",
        String::from_utf8_lossy(&git.stderr)
    );

    let mut corral = start(&clone);
    let addr: SocketAddr = "127.0.0.1:8080".parse().unwrap();
    // Waits are counted in steps: clippy.toml keeps std's clock out of the code.
    let step = Duration::from_millis(100);
    let mut waited = Duration::ZERO;
    let page = loop {
        if TcpStream::connect(addr).is_ok() {
            let r = http(addr, "GET", "/", &[], b"");
            if r.status == 200 {
                break r.text();
            }
        }
        assert!(
            waited < FIRST_ANSWER,
            "http://{addr}/ did not answer 200 within {FIRST_ANSWER:?}:\n{}",
            corral.log()
        );
        thread::sleep(step);
        waited += step;
    };
    assert!(page.contains("corral is running"), "{page}");
    assert!(page.contains("WSGI"), "{page}");

    let mut child = corral.child.take().unwrap();
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    let mut waited = Duration::ZERO;
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if waited > STOP {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "corral did not stop within {STOP:?} of SIGTERM:\n{}",
                corral.log()
            );
        }
        thread::sleep(step);
        waited += step;
    };
    assert_eq!(status.code(), Some(0), "{status}:\n{}", corral.log());
}

/// Runs the binary with no arguments from `dir`, collecting its log.
fn start(dir: &Path) -> Running {
    let mut child = Command::new(CORRAL)
        .current_dir(dir)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start corral");
    let stderr = child.stderr.take().unwrap();
    let log = Arc::new(Mutex::new(String::new()));
    let sink = Arc::clone(&log);
    thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            let mut log = sink.lock().unwrap();
            log.push_str(&line);
            log.push('\n');
        }
    });
    Running {
        child: Some(child),
        log,
    }
}
