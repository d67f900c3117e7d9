//! The two operator views against the real binary and a real php-cgi pool:
//! `corral status --watch` run in a tmux pane (the pool and worker rows appear, the pane
//! changes while load runs, Ctrl-C restores the cursor and the screen) and printing plain
//! frames when its output is not a terminal; and `/status?html` loaded in headless Chromium
//! (a screenshot, the pool's name and request count in the DOM after its script ran, the
//! count growing with load), with `?history` feeding its sparklines.
//!
//! Needs tmux and chromium (scripts/setup-peers.sh installs both).

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing,
    missing_docs
)]

mod support;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::Duration;

use tokio::time::Instant;

use support::server::{http, Corral};
use support::{eventually, peers};

const CHROMIUM: &str = "/usr/bin/chromium";

/// One http listener, a status listener on `status`, and a static php-cgi pool of two
/// recycled every 40 requests or so.
fn config(run: &Path, root: &Path, status: &str) -> String {
    format!(
        r#"
[server]
runtime_dir = "{run}"
grace = "5s"
kill_timeout = "2s"

[[listen]]
address = "127.0.0.1:0"
protocol = "http"

[status]
address = "{status}"

[pools.php]
command = ["php-cgi"]
mode = "static"
max = 2
# Recycles under the tests' load, for the page's recent events.
max_requests = 40

[[contexts]]
pool = "php"
root = "{root}"
"#,
        run = run.display(),
        root = root.display()
    )
}

struct Setup {
    corral: Corral,
    status: SocketAddr,
    /// The same configuration with the status listener's real address, for `-c`.
    file: tempfile::NamedTempFile,
    _dir: tempfile::TempDir,
}

fn start() -> Setup {
    let dir = peers::shared_dir();
    peers::write_file(
        dir.path(),
        "work.php",
        "<?php usleep(3000); echo getmypid();",
    );
    let run = dir.path().join("run");
    let corral = Corral::start(&config(&run, dir.path(), "127.0.0.1:0"), 1);
    let status = corral.status_ready_addr();
    let file = support::config_file(&config(&run, dir.path(), &status.to_string()));
    let s = Setup {
        corral,
        status,
        file,
        _dir: dir,
    };
    assert!(
        eventually(Duration::from_secs(10), || s
            .get("/status")
            .contains("idle processes:       2")),
        "workers never became idle:\n{}",
        s.corral.log()
    );
    s
}

impl Setup {
    fn get(&self, target: &str) -> String {
        let r = http(self.status, "GET", target, &[], b"");
        assert_eq!(r.status, 200, "{target}: {}", r.text());
        r.text()
    }

    fn accepted(&self) -> u64 {
        let page = self.get("/status");
        page.lines()
            .find_map(|l| l.strip_prefix("accepted conn:"))
            .and_then(|v| v.trim().parse().ok())
            .unwrap()
    }

    fn config_path(&self) -> &str {
        self.file.path().to_str().unwrap()
    }

    /// `n` requests from two threads in the background; how many were answered 200.
    fn load(&self, n: usize) -> thread::JoinHandle<usize> {
        let addr = self.corral.http_addr();
        thread::spawn(move || {
            let workers: Vec<_> = (0..2)
                .map(|_| {
                    thread::spawn(move || {
                        (0..n / 2)
                            .filter(|_| http(addr, "GET", "/work.php", &[], b"").status == 200)
                            .count()
                    })
                })
                .collect();
            workers.into_iter().map(|w| w.join().unwrap()).sum()
        })
    }

    /// Requests from two threads in the background until `stop` is set; how many there
    /// were, and how many of them were answered 200.
    fn load_until(&self, stop: &Arc<AtomicBool>) -> thread::JoinHandle<(usize, usize)> {
        let addr = self.corral.http_addr();
        let stop = Arc::clone(stop);
        thread::spawn(move || {
            let workers: Vec<_> = (0..2)
                .map(|_| {
                    let stop = Arc::clone(&stop);
                    thread::spawn(move || {
                        let (mut sent, mut ok) = (0, 0);
                        while !stop.load(Ordering::SeqCst) {
                            sent += 1;
                            ok +=
                                usize::from(http(addr, "GET", "/work.php", &[], b"").status == 200);
                        }
                        (sent, ok)
                    })
                })
                .collect();
            workers
                .into_iter()
                .map(|w| w.join().unwrap())
                .fold((0, 0), |(s, o), (s2, o2)| (s + s2, o + o2))
        })
    }
}

/// A tmux server of our own (its own socket), killed with everything in it when dropped.
struct Tmux {
    socket: String,
    _conf: tempfile::NamedTempFile,
}

impl Tmux {
    fn new() -> Tmux {
        let conf = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(conf.path(), "set -g remain-on-exit on\n").unwrap();
        Tmux {
            socket: format!("corral-status-ui-{}", std::process::id()),
            _conf: conf,
        }
    }

    fn cmd(&self, args: &[&str]) -> String {
        let out = Command::new("tmux")
            .arg("-L")
            .arg(&self.socket)
            .arg("-f")
            .arg(self._conf.path())
            .args(args)
            .env_remove("TMUX")
            .output()
            .expect("run tmux");
        assert!(
            out.status.success(),
            "tmux {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    fn capture(&self) -> String {
        self.cmd(&["capture-pane", "-p", "-t", "watch"])
    }

    fn format(&self, f: &str) -> String {
        self.cmd(&["display-message", "-p", "-t", "watch", f])
            .trim()
            .to_owned()
    }
}

impl Drop for Tmux {
    fn drop(&mut self) {
        let _ = Command::new("tmux")
            .arg("-L")
            .arg(&self.socket)
            .arg("kill-server")
            .output();
    }
}

/// The ACCEPTED column of the `php` row of a watch frame.
fn accepted_in(frame: &str) -> Option<u64> {
    let header = frame.lines().find(|l| l.starts_with("POOL "))?;
    let column = header.split_whitespace().position(|h| h == "ACCEPTED")?;
    // Headers and cells are single words, except `IN FLIGHT` and `MAX Q` before it.
    let column = column - 2;
    let row = frame.lines().find(|l| l.starts_with("php "))?;
    row.split_whitespace().nth(column)?.parse().ok()
}

/// The REQ/S column of the `php` row.
fn rate_in(frame: &str) -> Option<f64> {
    let row = frame.lines().find(|l| l.starts_with("php "))?;
    row.split_whitespace().nth(9)?.parse().ok()
}

#[test]
fn watch_in_tmux_shows_the_pool_and_changes_under_load() {
    let s = start();
    let tmux = Tmux::new();
    // The shell traps SIGINT so that it outlives corral's Ctrl-C and shows what was left; its
    // `sleep 60` only keeps the pane open for the captures (tmux is killed on drop).
    let script = format!(
        "trap 'true' INT; '{}' status --watch --interval 300ms -c '{}'; echo \"watch exited $?\"; sleep 60",
        support::CORRAL,
        s.config_path()
    );
    tmux.cmd(&[
        "new-session",
        "-d",
        "-s",
        "watch",
        "-x",
        "160",
        "-y",
        "50",
        &script,
    ]);
    let mut frame = String::new();
    assert!(
        eventually(Duration::from_secs(10), || {
            frame = tmux.capture();
            frame.contains("php: 2 workers") && accepted_in(&frame).is_some()
        }),
        "no pool rows in the pane:\n{frame}\n{}",
        s.corral.log()
    );
    assert!(frame.contains("corral status · 127.0.0.1:"), "{frame}");
    assert!(frame.contains("static"), "{frame}");
    let pids: Vec<String> = s
        .get("/status?full")
        .lines()
        .filter_map(|l| l.strip_prefix("pid:"))
        .map(|p| p.trim().to_owned())
        .collect();
    assert_eq!(pids.len(), 2);
    for pid in &pids {
        assert!(
            frame.contains(pid.as_str()),
            "worker {pid} not shown:\n{frame}"
        );
    }
    // In place: the alternate screen, the cursor hidden.
    assert_eq!(tmux.format("#{alternate_on} #{cursor_flag}"), "1 0");
    let before = accepted_in(&frame).unwrap();

    // Load runs until the pane has shown both changes (or 20 s passed): every frame sampled
    // here is one taken under load.
    let stop = Arc::new(AtomicBool::new(false));
    let load = s.load_until(&stop);
    let mut grew_while_loading = false;
    let mut saw_rate = false;
    eventually(Duration::from_secs(20), || {
        frame = tmux.capture();
        grew_while_loading |= accepted_in(&frame).is_some_and(|n| n > before);
        saw_rate |= rate_in(&frame).is_some_and(|r| r > 0.0);
        grew_while_loading && saw_rate
    });
    stop.store(true, Ordering::SeqCst);
    let (sent, served) = load.join().unwrap();
    assert_eq!(served, sent, "{}", s.corral.log());
    assert!(
        grew_while_loading,
        "the pane never changed while load ran (accepted {before}):\n{frame}"
    );
    assert!(saw_rate, "no req/s shown under load:\n{frame}");
    // It ends up showing every request.
    assert!(
        eventually(Duration::from_secs(5), || {
            frame = tmux.capture();
            accepted_in(&frame) == Some(before + sent as u64)
        }),
        "{frame}"
    );

    // Ctrl-C: a clean exit, the cursor shown again and the screen given back.
    tmux.cmd(&["send-keys", "-t", "watch", "C-c"]);
    assert!(
        eventually(Duration::from_secs(5), || tmux
            .capture()
            .contains("watch exited 0")),
        "{}",
        tmux.capture()
    );
    assert_eq!(tmux.format("#{alternate_on} #{cursor_flag}"), "0 1");
    assert!(!tmux.capture().contains("POOL "), "{}", tmux.capture());
}

#[test]
fn watch_prints_plain_frames_when_not_on_a_terminal() {
    let s = start();
    let mut cmd = Command::new(support::CORRAL);
    cmd.args([
        "status",
        "--watch",
        "--interval",
        "200ms",
        "--count",
        "3",
        "-c",
        s.config_path(),
    ]);
    let started = Instant::now();
    let out = support::run(cmd, Duration::from_secs(20));
    assert_eq!(out.code, Some(0), "{out:?}");
    assert!(started.elapsed() >= Duration::from_millis(400));
    assert!(!out.stdout.contains('\x1b'), "{:?}", out.stdout);
    assert_eq!(
        out.stdout.matches("corral status · ").count(),
        3,
        "{}",
        out.stdout
    );
    assert_eq!(out.stdout.matches("php: 2 workers").count(), 3);
    // Frames are separated by a blank line.
    assert!(
        out.stdout.contains("\n\ncorral status · "),
        "{}",
        out.stdout
    );

    // Nothing to watch: an error, not an empty view. The address is a socket path in a
    // fresh temp dir, where nothing listens.
    let nowhere = tempfile::tempdir().unwrap();
    let stopped = support::config_file(&std::fs::read_to_string(s.file.path()).unwrap().replace(
        &s.status.to_string(),
        &format!("unix:{}", nowhere.path().join("status.sock").display()),
    ));
    let out = support::corral(&["status", "--watch", "-c", stopped.path().to_str().unwrap()]);
    assert_eq!(out.code, Some(69), "{out:?}");
    assert!(out.stderr.contains("status listener"), "{}", out.stderr);
}

/// Runs headless Chromium on `url` with `extra` flags and a fresh profile; its stdout.
fn chromium(url: &str, extra: &[&str]) -> String {
    let profile = tempfile::tempdir().unwrap();
    let mut cmd = Command::new(CHROMIUM);
    cmd.args([
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--disable-dev-shm-usage",
        // The script fetches every second or two: let it run a few rounds.
        "--virtual-time-budget=5000",
    ])
    .arg(format!("--user-data-dir={}", profile.path().display()))
    .args(extra)
    .arg(url);
    let out = support::run(cmd, Duration::from_secs(30));
    assert_eq!(out.code, Some(0), "chromium failed: {}", out.stderr);
    out.stdout
}

/// The number in the element with `id` in `dom`.
fn number_by_id(dom: &str, id: &str) -> Option<u64> {
    let start = dom.find(&format!("id=\"{id}\">"))? + id.len() + 6;
    let text: String = dom[start..]
        .chars()
        .take_while(|c| *c != '<')
        .filter(|c| c.is_ascii_digit())
        .collect();
    text.parse().ok()
}

#[test]
fn the_html_page_in_chromium_shows_pools_and_counts_that_grow() {
    let s = start();
    for _ in 0..5 {
        assert_eq!(
            http(s.corral.http_addr(), "GET", "/work.php", &[], b"").status,
            200
        );
    }
    let page = http(s.status, "GET", "/status?html", &[], b"");
    assert_eq!(page.status, 200);
    assert!(page
        .header("content-type")
        .unwrap()
        .starts_with("text/html"));
    let csp = page.header("content-security-policy").unwrap();
    assert!(csp.contains("default-src 'none'"), "{csp}");
    // History: samples every two seconds, one array per field.
    assert!(
        eventually(Duration::from_secs(6), || s
            .get("/status?history")
            .contains("\"t\":[1")),
        "{}",
        s.get("/status?history")
    );
    let history = s.get("/status?history");
    assert!(history.contains("\"pool\":\"php\""), "{history}");
    for key in ["\"accepted\":[", "\"queue\":[", "\"p99\":[", "\"events\":["] {
        assert!(history.contains(key), "no {key} in {history}");
    }

    let url = format!("http://{}/status?html", s.status);
    let shots = tempfile::tempdir().unwrap();
    let png: PathBuf = shots.path().join("status.png");
    chromium(
        &url,
        &[
            &format!("--screenshot={}", png.display()),
            "--window-size=1280,900",
        ],
    );
    let bytes = std::fs::read(&png).expect("a screenshot");
    assert!(bytes.starts_with(b"\x89PNG"), "not a PNG");
    assert!(bytes.len() > 20_000, "a blank page? {} bytes", bytes.len());

    let dom = chromium(&url, &["--dump-dom"]);
    assert!(dom.contains("id=\"pool-php\""), "{dom}");
    assert!(dom.contains("<span class=\"name\">php</span>"), "{dom}");
    assert!(dom.contains("id=\"spark-rate-php\""), "{dom}");
    assert!(
        dom.contains("<td>Idle</td>") || dom.contains(">Idle</span>"),
        "{dom}"
    );
    let before = number_by_id(&dom, "accepted-php").unwrap_or_else(|| panic!("{dom}"));
    assert!(before >= 5, "{before}");
    assert_eq!(before, s.accepted());

    let load = s.load(200);
    assert_eq!(load.join().unwrap(), 200);
    let dom = chromium(&url, &["--dump-dom"]);
    let after = number_by_id(&dom, "accepted-php").unwrap_or_else(|| panic!("{dom}"));
    assert!(after >= before + 200, "{before} then {after}");
    // Workers recycled on the way, listed with their reason.
    assert!(dom.contains("class=\"st warn\">recycled</span>"), "{dom}");
    assert!(dom.contains(">max_requests</td>"), "{dom}");
}
