//! Shared by the integration tests: run the real `corral` binary with a deadline, and write
//! throw-away configuration files.
//!
//! Every process started here is waited for, or killed when the deadline passes, so a hung
//! binary fails its test instead of hanging the suite.

// Each test file uses a different subset of these helpers.
#![allow(dead_code)]

pub mod apps;
pub mod backend_fastcgi;
pub mod convert;
pub mod direct;
pub mod fastcgi;
pub mod front;
pub mod front_fastcgi;
pub mod http_front;
pub mod invariants;
pub mod launcher;
pub mod launcher_rack;
pub mod launcher_wsgi;
pub mod lsapi;
pub mod matrix;
pub mod matrix_checks;
pub mod native;
pub mod null_backend;
pub mod peers;
pub mod preloading;
pub mod python_apps;
pub mod rails_app;
pub mod raw_fastcgi;
pub mod reforking;
pub mod scripted;
pub mod server;
pub mod spawning;
pub mod sync1;
pub mod sync2;
pub mod weak;

use std::io::{Read, Write};
use std::process::{Child, Command, Stdio};
use std::thread;
use std::time::Duration;

/// The binary under test.
pub const CORRAL: &str = env!("CARGO_BIN_EXE_corral");

/// How long a command that should finish at once may take.
pub const QUICK: Duration = Duration::from_secs(30);

/// How a finished process ended.
#[derive(Debug)]
pub struct Outcome {
    /// Exit code (`None` if killed by a signal).
    pub code: Option<i32>,
    /// Everything written to standard output.
    pub stdout: String,
    /// Everything written to standard error.
    pub stderr: String,
}

/// Runs `corral ARGS...` and waits for it (at most [`QUICK`]).
pub fn corral(args: &[&str]) -> Outcome {
    let mut cmd = Command::new(CORRAL);
    cmd.args(args);
    run(cmd, QUICK)
}

/// Runs `cmd` with no input, collecting its output; kills it and panics after `deadline`.
pub fn run(mut cmd: Command, deadline: Duration) -> Outcome {
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start {cmd:?}: {e}"));
    // Drain both pipes while waiting, so a chatty child never blocks on a full pipe.
    let stdout = drain(child.stdout.take());
    let stderr = drain(child.stderr.take());
    let status = wait(&mut child, deadline)
        .unwrap_or_else(|| panic!("{cmd:?} still running after {deadline:?}; killed"));
    Outcome {
        code: status.code(),
        stdout: stdout.join().expect("stdout reader"),
        stderr: stderr.join().expect("stderr reader"),
    }
}

/// Waits for `child` until `deadline` has passed; on expiry kills and reaps it, giving `None`.
pub fn wait(child: &mut Child, deadline: Duration) -> Option<std::process::ExitStatus> {
    const POLL: Duration = Duration::from_millis(5);
    let mut waited = Duration::ZERO;
    loop {
        if let Some(status) = child.try_wait().expect("try_wait") {
            return Some(status);
        }
        if waited >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            return None;
        }
        thread::sleep(POLL);
        waited += POLL;
    }
}

/// Kills and reaps a child on drop (for a child that is no [`peers::Peer`]: one started on
/// a TCP port, or handed its socket as fd 0).
pub struct Guard(pub Child);

impl Drop for Guard {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn drain(pipe: Option<impl Read + Send + 'static>) -> thread::JoinHandle<String> {
    thread::spawn(move || {
        let mut text = String::new();
        if let Some(mut pipe) = pipe {
            let _ = pipe.read_to_string(&mut text);
        }
        text
    })
}

/// A corral with an http and a status listener (both on port 0), its runtime dir at `run`,
/// a 5 s grace, and one pool `site` (with `pool` as its keys) serving every path.
pub fn site_config(run: &std::path::Path, pool: &str) -> String {
    format!(
        "[server]\nruntime_dir = \"{}\"\ngrace = \"5s\"\nkill_timeout = \"2s\"\n\n\
         [[listen]]\naddress = \"127.0.0.1:0\"\nprotocol = \"http\"\n\n\
         [status]\naddress = \"127.0.0.1:0\"\n\n[pools.site]\n{pool}\n\n\
         [[contexts]]\nprefix = \"/\"\npool = \"site\"\n",
        run.display()
    )
}

/// A configuration file that is deleted when dropped.
pub fn config_file(text: &str) -> tempfile::NamedTempFile {
    let mut file = tempfile::Builder::new()
        .prefix("corral-test-")
        .suffix(".toml")
        .tempfile()
        .expect("create temp config");
    file.write_all(text.as_bytes()).expect("write temp config");
    file.flush().expect("flush temp config");
    file
}

/// Polls `check` every 50 ms for up to `limit`; whether it held by then.
pub fn eventually(limit: Duration, mut check: impl FnMut() -> bool) -> bool {
    let step = Duration::from_millis(50);
    let mut waited = Duration::ZERO;
    while waited < limit {
        if check() {
            return true;
        }
        thread::sleep(step);
        waited += step;
    }
    check()
}

/// Whether `pid` is a live process (not gone, not a zombie).
pub fn alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| !s.contains(") Z "))
}

/// Pids of the live processes whose parent is `parent` (a php-cgi group's children, the
/// parents corral spawned).
pub fn live_children(parent: u32) -> Vec<u32> {
    corral::process::php_children::children_of(parent)
        .into_iter()
        .filter(|&p| alive(p))
        .collect()
}

/// The scheduling policy of each thread of `pid`, by thread name (`comm`), from field 41 of
/// /proc/PID/task/TID/stat: 0 is Linux's default (`SCHED_OTHER`), 3 `SCHED_BATCH`.
pub fn thread_policies(pid: u32) -> Vec<(String, u32)> {
    let mut found = Vec::new();
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return found;
    };
    for task in tasks.flatten() {
        let Ok(stat) = std::fs::read_to_string(task.path().join("stat")) else {
            continue;
        };
        // The name sits in parentheses and may hold spaces; the fields after it start at 3.
        let Some((head, rest)) = stat.rsplit_once(')') else {
            continue;
        };
        let name = head.split_once('(').map_or("", |(_, n)| n).to_owned();
        if let Some(policy) = rest.split_whitespace().nth(41 - 3) {
            found.push((name, policy.parse().unwrap_or(u32::MAX)));
        }
    }
    found
}

/// The next datagram on `socket`, as text; `None` after `within`.
fn next_datagram(socket: &std::os::unix::net::UnixDatagram, within: Duration) -> Option<String> {
    socket.set_read_timeout(Some(within)).unwrap();
    let mut buf = [0u8; 4096];
    let n = socket.recv(&mut buf).ok()?;
    Some(String::from_utf8_lossy(&buf[..n]).into_owned())
}

/// Reads datagrams from a NOTIFY_SOCKET the test bound until one contains `needle`; all of
/// them, in order. Panics after `within`.
pub fn notify_until(
    socket: &std::os::unix::net::UnixDatagram,
    needle: &str,
    within: Duration,
) -> Vec<String> {
    let mut seen = Vec::new();
    let deadline = tokio::time::Instant::now() + within;
    while let Some(left) = deadline.checked_duration_since(tokio::time::Instant::now()) {
        match next_datagram(socket, left) {
            Some(m) => {
                let done = m.contains(needle);
                seen.push(m);
                if done {
                    return seen;
                }
            }
            None => break,
        }
    }
    panic!("no {needle:?} within {within:?}; got {seen:?}");
}
