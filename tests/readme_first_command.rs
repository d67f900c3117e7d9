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
//! (status) and keeps worker sockets in /run/corral, which other tests and other runs on the
//! same machine may use at the same time. So corral runs in network and mount namespaces of
//! its own (`unshare`, as root, as CI runs the tests): a loopback where those ports are its
//! alone, and a fresh temporary directory mounted on /run/corral. The command stays the
//! README's, with no arguments; readiness is its `READY=1` on a NOTIFY_SOCKET the test
//! binds, and the page is fetched inside its namespace with `nsenter`.

mod support;

use std::io::{BufRead, BufReader};
use std::os::unix::net::UnixDatagram;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::Duration;

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

/// Brings up the loopback of the network namespace it runs in (a new one has it down):
/// SIOCSIFFLAGS with IFF_UP | IFF_LOOPBACK | IFF_RUNNING, from Python, which the demo needs
/// anyway (iproute2 is not on every image).
const LOOPBACK_UP: &str = "import fcntl, socket, struct\n\
    s = socket.socket()\n\
    fcntl.ioctl(s, 0x8914, struct.pack('16sH14s', b'lo', 0x1 | 0x8 | 0x40, b''))";

#[test]
fn corral_with_no_arguments_serves_the_demo_page_from_a_fresh_clone() {
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
    // What /run/corral is inside corral's mount namespace (0700, root's, as corral wants).
    let run = tmp.path().join("run");
    std::fs::create_dir(&run).unwrap();
    let notify_path = tmp.path().join("notify.sock");
    let notify = UnixDatagram::bind(&notify_path).unwrap();

    let mut corral = start(&clone, &run, &notify_path);
    let pid = corral.child.as_ref().unwrap().id();
    let ready = std::panic::catch_unwind(|| {
        support::notify_until(&notify, "READY=1", FIRST_ANSWER);
    });
    assert!(ready.is_ok(), "no READY=1:\n{}", corral.log());
    let (status, page) = fetch_inside(pid, "http://127.0.0.1:8080/");
    assert_eq!(status, "200", "{page}\n{}", corral.log());
    assert!(page.contains("corral is running"), "{page}");
    assert!(page.contains("WSGI"), "{page}");
    assert!(
        run.join("corral.pid").exists(),
        "the pid file is not in the /run/corral given to corral:\n{}",
        corral.log()
    );

    let mut child = corral.child.take().unwrap();
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    let Some(status) = support::wait(&mut child, STOP) else {
        panic!(
            "corral did not stop within {STOP:?} of SIGTERM:\n{}",
            corral.log()
        );
    };
    assert_eq!(status.code(), Some(0), "{status}:\n{}", corral.log());
}

/// GETs `url` with curl inside the network namespace of process `pid`; the status code and
/// the body.
fn fetch_inside(pid: u32, url: &str) -> (String, String) {
    let out = Command::new("nsenter")
        .arg(format!("--net=/proc/{pid}/ns/net"))
        .args([
            "--",
            "curl",
            "-sS",
            "--max-time",
            "20",
            "-w",
            "\n%{http_code}",
            url,
        ])
        .output()
        .expect("run nsenter curl");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let (body, status) = text.rsplit_once('\n').unwrap_or(("", &text));
    assert!(
        out.status.success(),
        "curl {url} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    (status.to_owned(), body.to_owned())
}

/// Runs the binary with no arguments from `dir`, in network and mount namespaces of its own
/// with `run` mounted on /run/corral, collecting its log.
fn start(dir: &Path, run: &Path, notify: &Path) -> Running {
    let mut child = Command::new("unshare")
        .args([
            "--net",
            "--mount",
            "--propagation",
            "private",
            "--",
            "sh",
            "-c",
        ])
        .arg(
            "python3 -c \"$3\" || exit 71\n\
             mkdir -p /run/corral && mount --bind \"$1\" /run/corral || exit 72\n\
             exec \"$0\"",
        )
        .arg(CORRAL)
        .arg(run)
        .arg("unused")
        .arg(LOOPBACK_UP)
        .env("NOTIFY_SOCKET", notify)
        .current_dir(dir)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start unshare (util-linux) to run corral in namespaces of its own");
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
