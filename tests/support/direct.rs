//! A site for the direct-pool tests (`accept = "direct"`): corral with one direct php-cgi
//! pool, and real nginx in front of it with the shipped conf/nginx/php-fpm-direct.conf.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::Duration;

use tokio::time::Instant;

use super::front::{curl, nginx_blocks, Corral, Nginx};
use super::peers::{shared_dir, write_file};

pub const WAIT: Duration = Duration::from_secs(20);
pub const POLL: Duration = Duration::from_millis(20);

/// corral with one direct pool, and nginx in front of it with the shipped snippet.
pub struct Site {
    /// The site's directory: the document root is `root/`, corral's files beside it.
    pub dir: tempfile::TempDir,
    /// corral.
    pub corral: Corral,
    /// nginx in front.
    pub nginx: Nginx,
}

/// The configuration of a static direct pool of `max` workers, with `extra` pool keys.
pub fn config(dir: &Path, max: u32, extra: &str) -> String {
    config_sized(dir, &format!("mode = \"static\"\nmax = {max}"), extra)
}

/// The configuration of a direct pool sized by `sizing` (its `mode`, `max`, ... lines).
pub fn config_sized(dir: &Path, sizing: &str, extra: &str) -> String {
    let d = dir.display();
    format!(
        "[server]\nruntime_dir = \"{d}/run\"\nkill_timeout = \"5s\"\n\
         [[listen]]\naddress = \"unix:{d}/www.sock\"\nprotocol = \"fastcgi\"\nmode = \"0666\"\n\
         [status]\naddress = \"unix:{d}/status.sock\"\n\
         [pools.www]\ncommand = [\"php-cgi\", \"-n\"]\naccept = \"direct\"\n\
         listener = \"unix:{d}/www.sock\"\n{sizing}\n{extra}\n"
    )
}

impl Site {
    /// A static pool of `max` workers, started and all idle.
    pub fn start(max: u32, extra: &str) -> Site {
        let site = Site::start_sized(&format!("mode = \"static\"\nmax = {max}"), extra);
        site.wait_status(|s| field(s, "idle processes") == Some(u64::from(max)));
        site
    }

    /// A pool sized by `sizing`, once corral's status answers (no worker is waited for:
    /// and no connection is made to the pool's socket, which would start an ondemand
    /// pool's first worker).
    pub fn start_sized(sizing: &str, extra: &str) -> Site {
        let dir = shared_dir();
        let root = dir.path().join("root");
        std::fs::create_dir_all(root.join("uploads")).unwrap();
        std::fs::create_dir_all(dir.path().join("nginx")).unwrap();
        write_file(
            &root,
            "hello.php",
            "<?php echo 'hello pid=', getmypid(), ' method=', $_SERVER['REQUEST_METHOD'], \
             ' body=', strlen(file_get_contents('php://input')), \"\\n\";",
        );
        write_file(
            &root,
            "wait.php",
            "<?php $f = __DIR__ . '/release'; while (!file_exists($f)) { clearstatcache(); \
             usleep(10000); } echo 'released ', getmypid();",
        );
        write_file(
            &root,
            "nap.php",
            "<?php $t = microtime(true); usleep(800000); \
             printf('slept %.2f', microtime(true) - $t);",
        );
        write_file(&root, "uploads/x.gif", "GIF89a<?php echo 'PWNED'; ?>");
        write_file(&root, ".env", "SECRET=1");
        std::fs::set_permissions(&root, std::os::unix::fs::PermissionsExt::from_mode(0o777))
            .unwrap();
        let socket = dir.path().join("www.sock");
        let status = dir.path().join("status.sock");
        let text = config_sized(dir.path(), sizing, extra);
        let corral = Corral::start(dir.path(), &text, &status);
        let snippet = std::fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/conf/nginx/php-fpm-direct.conf"
        ))
        .unwrap()
        .replace("/var/www/html", &root.display().to_string())
        .replace("/run/php/www.sock", &socket.display().to_string());
        let blocks = nginx_blocks(&snippet, "server");
        assert_eq!(blocks.len(), 1);
        let body = blocks[0].1.replace("listen 80;", "");
        let ndir = dir.path().join("nginx");
        std::os::unix::fs::symlink("/etc/nginx/fastcgi_params", ndir.join("fastcgi_params"))
            .unwrap();
        let nginx = Nginx::start(&ndir, "", &[body]);
        Site { dir, corral, nginx }
    }

    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.nginx.url(0))
    }

    pub fn status(&self) -> String {
        let sock = self.dir.path().join("status.sock");
        let out = std::process::Command::new("curl")
            .args(["-sS", "--max-time", "10", "--unix-socket"])
            .arg(&sock)
            .arg("http://localhost/status?full")
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    pub fn wait_status(&self, ok: impl Fn(&str) -> bool) -> String {
        let deadline = Instant::now() + WAIT;
        loop {
            let s = self.status();
            if ok(&s) {
                return s;
            }
            assert!(
                Instant::now() < deadline,
                "status never matched:\n{s}\n{}",
                self.corral.log()
            );
            thread::sleep(POLL);
        }
    }

    /// Waits until corral has logged `n` applied reloads.
    pub fn corral_reloads(&self, n: usize) -> bool {
        let deadline = Instant::now() + WAIT;
        while self.corral.log().matches("reload applied").count() < n {
            if Instant::now() >= deadline {
                return false;
            }
            thread::sleep(POLL);
        }
        true
    }

    /// The pids of corral's php-cgi children.
    pub fn workers(&self) -> Vec<u32> {
        children_of(self.corral.pid())
    }

    /// Waits until corral has at least `count` workers and none of `old`; returns them.
    pub fn wait_replaced(&self, old: &[u32], count: usize) -> Vec<u32> {
        let deadline = Instant::now() + WAIT;
        loop {
            let now = self.workers();
            if now.len() >= count && !now.iter().any(|p| old.contains(p)) {
                return now;
            }
            assert!(
                Instant::now() < deadline,
                "old workers remain: {now:?} of {old:?}\n{}",
                self.corral.log()
            );
            thread::sleep(POLL);
        }
    }

    /// The shipped nginx snippet runs no uploaded file as PHP and serves no dotfile: each
    /// attack URL answers 404 or 403, and never the planted script's or file's content.
    pub fn assert_refuses_attack_urls(&self) {
        for path in [
            "/uploads/x.gif/.php",
            "/uploads/x.gif/x.php",
            "/uploads/x.gif%2f.php",
            "/uploads/x.gif%2fx.php",
            "/uploads/%2e%2e/uploads/x.gif/.php",
            "/.env",
            "/%2eenv",
            "/uploads/%2e%2e/.env",
            "/nothere.php",
        ] {
            let r = curl(&self.url(path), &["--path-as-is"]);
            assert!(r.status == 404 || r.status == 403, "{path}: {r:?}");
            assert!(
                !r.text().contains("PWNED") && !r.text().contains("SECRET"),
                "{path}: {r:?}"
            );
        }
    }
}

/// Clients that GET `path` through nginx in a loop until stopped, `pause` between two
/// requests each; every answer is kept.
pub struct Load {
    stop: Arc<AtomicBool>,
    results: Arc<Mutex<Vec<(u16, String)>>>,
    clients: Vec<thread::JoinHandle<()>>,
}

impl Load {
    pub fn start(port: u16, path: &'static str, clients: usize, pause: Duration) -> Load {
        let stop = Arc::new(AtomicBool::new(false));
        let results = Arc::new(Mutex::new(Vec::new()));
        let clients = (0..clients)
            .map(|_| {
                let (stop, results) = (Arc::clone(&stop), Arc::clone(&results));
                thread::spawn(move || {
                    while !stop.load(Ordering::Relaxed) {
                        let r = get(port, path);
                        results.lock().unwrap().push(r);
                        thread::sleep(pause);
                    }
                })
            })
            .collect();
        Load {
            stop,
            results,
            clients,
        }
    }

    /// Answers received so far.
    pub fn count(&self) -> usize {
        self.results.lock().unwrap().len()
    }

    /// Waits until `more` answers beyond those received so far have come.
    pub fn served(&self, more: usize) {
        self.reached(self.count() + more);
    }

    /// Waits until `total` answers in all have come.
    pub fn reached(&self, n: usize) {
        let deadline = Instant::now() + WAIT;
        while self.count() < n {
            assert!(Instant::now() < deadline, "no progress");
            thread::sleep(POLL);
        }
    }

    /// Stops the clients; every answer they got.
    pub fn finish(self) -> Vec<(u16, String)> {
        self.stop.store(true, Ordering::Relaxed);
        for c in self.clients {
            c.join().unwrap();
        }
        std::mem::take(&mut *self.results.lock().unwrap())
    }
}

/// At least `at_least` answers, and every one a 200.
pub fn assert_all_ok(results: &[(u16, String)], site: &Site, at_least: usize) {
    assert!(results.len() >= at_least, "only {} requests", results.len());
    let failed: Vec<_> = results.iter().filter(|(c, _)| *c != 200).collect();
    assert!(
        failed.is_empty(),
        "{} of {} failed: {:?}\n{}\n{}",
        failed.len(),
        results.len(),
        failed.first(),
        site.nginx.error_log(),
        site.corral.log()
    );
}

/// `name:   N` on php-fpm's text page.
pub fn field(status: &str, name: &str) -> Option<u64> {
    status.lines().find_map(|l| {
        let (k, v) = l.split_once(':')?;
        (k.trim() == name).then(|| v.trim().parse().ok())?
    })
}

pub fn children_of(pid: u32) -> Vec<u32> {
    let mut out = Vec::new();
    for task in std::fs::read_dir(format!("/proc/{pid}/task"))
        .unwrap()
        .flatten()
    {
        let text = std::fs::read_to_string(task.path().join("children")).unwrap_or_default();
        out.extend(
            text.split_whitespace()
                .filter_map(|p| p.parse::<u32>().ok()),
        );
    }
    out.sort_unstable();
    out
}

pub fn parent_of(pid: u32) -> Option<u32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let after = &stat[stat.rfind(')')? + 2..];
    after.split_whitespace().nth(1)?.parse().ok()
}

/// One GET over HTTP/1.0 to nginx: the status code and body.
pub fn get(port: u16, path: &str) -> (u16, String) {
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    write!(s, "GET {path} HTTP/1.0\r\nHost: localhost\r\n\r\n").unwrap();
    let mut raw = String::new();
    s.read_to_string(&mut raw).unwrap();
    let code = raw
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let body = raw
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_owned())
        .unwrap_or_default();
    (code, body)
}

pub fn pid_in(body: &str) -> u32 {
    body.split("pid=")
        .nth(1)
        .and_then(|r| r.split_whitespace().next())
        .and_then(|p| p.parse().ok())
        .unwrap_or_else(|| panic!("no pid in {body:?}"))
}
