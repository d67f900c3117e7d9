//! How corral opens a file on a client's or a backend's behalf (static files, X-Sendfile,
//! X-Accel-Redirect), tried as an attacker who can write one directory under a root would:
//! a file swapped for a symlink to a secret between corral's check and its open never leaks
//! the secret, and a named pipe (or any file that is not a regular file) never blocks a
//! thread. ARCHITECTURE.md, "HTTP front", steps 4 and 10.

mod support;

use std::os::unix::fs::{symlink, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use support::peers::{self, write_file};
use support::server::{http, Corral};

/// What the secret holds; no answer may contain it.
const SECRET: &str = "TOP-SECRET-root-only-0123456789";
/// What the swapped file holds when it is a file.
const PUBLIC: &str = "public upload";

struct Site {
    dir: tempfile::TempDir,
    corral: Corral,
    _php: peers::Peer,
}

impl Site {
    fn d(&self) -> &Path {
        self.dir.path()
    }
}

/// php-cgi behind corral's HTTP listener; one context with static files, `sendfile_dirs`
/// (`private/`) and `accel_redirect` (`/protected/` → `files/`). Each of `www/uploads/`,
/// `private/` and `files/` holds `x.txt`, the file the racer swaps; `secret.txt` (mode 0600)
/// lies outside all of them.
fn site() -> Site {
    let dir = peers::shared_dir();
    let d = dir.path();
    for sub in ["www/uploads", "private", "files", "run"] {
        std::fs::create_dir_all(d.join(sub)).unwrap();
    }
    std::fs::set_permissions(d.join("run"), PermissionsExt::from_mode(0o700)).unwrap();
    let secret = d.join("secret.txt");
    std::fs::write(&secret, SECRET).unwrap();
    std::fs::set_permissions(&secret, PermissionsExt::from_mode(0o600)).unwrap();
    let root = d.join("www");
    write_file(
        &root,
        "send.php",
        "<?php header('X-Sendfile: ' . $_GET['f']); echo 'backend body';",
    );
    write_file(
        &root,
        "accel.php",
        "<?php header('X-Accel-Redirect: ' . $_GET['u']); echo 'backend body';",
    );
    write_file(&root, "style.css", "body { color: red }\n");
    for dir in swapped_dirs(d) {
        write_file(&dir, "x.txt", PUBLIC);
    }
    let php = peers::php_cgi(d);
    let config = format!(
        r#"
[server]
grace = "2s"
log_level = "debug"
runtime_dir = "{d}/run"

[[listen]]
address = "127.0.0.1:0"
protocol = "http"

[pools.php]
servers = ["unix:{socket}"]

[[contexts]]
root = "{d}/www"
pool = "php"
static_files = true
sendfile_dirs = ["{d}/private"]
accel_redirect = {{ "/protected/" = "{d}/files" }}
"#,
        d = d.display(),
        socket = php.socket.display(),
    );
    let corral = Corral::start(&config, 1);
    Site {
        dir,
        corral,
        _php: php,
    }
}

/// The directories whose `x.txt` the racer swaps.
fn swapped_dirs(d: &Path) -> [PathBuf; 3] {
    [d.join("www/uploads"), d.join("private"), d.join("files")]
}

/// Swaps each `x.txt` between a regular file and a symlink to the secret, atomically (by
/// rename), until `stop`; counts its rounds in `rounds`.
fn racer(d: PathBuf, stop: Arc<AtomicBool>, rounds: Arc<AtomicU64>) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        let secret = d.join("secret.txt");
        while !stop.load(Ordering::Relaxed) {
            for dir in swapped_dirs(&d) {
                let link = dir.join(".x.link");
                let file = dir.join(".x.file");
                let _ = std::fs::remove_file(&link);
                symlink(&secret, &link).unwrap();
                std::fs::rename(&link, dir.join("x.txt")).unwrap();
                std::fs::write(&file, PUBLIC).unwrap();
                std::fs::rename(&file, dir.join("x.txt")).unwrap();
            }
            rounds.fetch_add(1, Ordering::Relaxed);
        }
    })
}

#[test]
fn a_file_swapped_for_a_symlink_to_a_secret_never_leaks_it() {
    let s = site();
    let d = s.d().to_path_buf();
    let private = d.join("private/x.txt");
    let targets = [
        ("static file", "/uploads/x.txt".to_owned()),
        ("X-Sendfile", format!("/send.php?f={}", private.display())),
        (
            "X-Accel-Redirect",
            "/accel.php?u=/protected/x.txt".to_owned(),
        ),
    ];
    // Before the race: each way serves the file, and a symlink out is refused.
    for (how, target) in &targets {
        let r = http(s.corral.http_addr(), "GET", target, &[], b"");
        assert_eq!(r.status, 200, "{how}: {}\n{}", r.text(), s.corral.log());
        assert_eq!(r.text(), PUBLIC, "{how}");
    }

    let stop = Arc::new(AtomicBool::new(false));
    let rounds = Arc::new(AtomicU64::new(0));
    let racing = racer(d.clone(), Arc::clone(&stop), Arc::clone(&rounds));
    let mut leaks = Vec::new();
    let mut served = [0u32; 3];
    let mut refused = [0u32; 3];
    // At least 900 requests, then on until each way met both states (the race is random:
    // a fixed count could miss one by chance), within a bound.
    let met_both = |ok: &[u32; 3], no: &[u32; 3]| ok.iter().zip(no).all(|(a, b)| *a > 0 && *b > 0);
    for i in 0..9000 {
        if i >= 900 && i % 3 == 0 && met_both(&served, &refused) {
            break;
        }
        let (how, target) = &targets[i % 3];
        let r = http(s.corral.http_addr(), "GET", target, &[], b"");
        if r.text().contains(SECRET) {
            leaks.push(format!("{how} request {i}: {} {}", r.status, r.text()));
        }
        if r.status == 200 && r.text() == PUBLIC {
            served[i % 3] += 1;
        } else {
            refused[i % 3] += 1;
        }
    }
    stop.store(true, Ordering::Relaxed);
    racing.join().unwrap();
    assert!(leaks.is_empty(), "the secret leaked:\n{}", leaks.join("\n"));
    assert!(rounds.load(Ordering::Relaxed) > 100, "the racer barely ran");
    // The race ran, each way still served the file whenever it was one, and each met the
    // symlink too (the file was opened during the race, not served from a cached
    // descriptor only).
    for ((ok, no), (how, _)) in served.iter().zip(&refused).zip(&targets) {
        assert!(*ok > 0, "{how}: never served the file during the race");
        assert!(*no > 0, "{how}: never met the symlink during the race");
    }
}

#[test]
fn a_named_pipe_never_blocks_and_files_are_still_served() {
    let s = site();
    let root = s.d().join("www");
    nix::unistd::mkfifo(
        &root.join("pipe"),
        nix::sys::stat::Mode::from_bits_truncate(0o666),
    )
    .unwrap();
    nix::unistd::mkfifo(
        &s.d().join("private/pipe"),
        nix::sys::stat::Mode::from_bits_truncate(0o666),
    )
    .unwrap();
    let addr = s.corral.http_addr();
    let private_pipe = format!("/send.php?f={}", s.d().join("private/pipe").display());
    // More than tokio's 512 blocking threads: each GET used to pin one in open() for good.
    for i in 0..600 {
        let target = if i % 2 == 0 { "/pipe" } else { &private_pipe };
        let r = http(addr, "GET", target, &[], b"");
        assert_eq!(r.status, 404, "{target}: {}\n{}", r.text(), s.corral.log());
    }
    let started = tokio::time::Instant::now();
    let r = http(addr, "GET", "/style.css", &[], b"");
    assert_eq!(r.status, 200, "{}", s.corral.log());
    assert_eq!(r.text(), "body { color: red }\n");
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "a static file took {:?} after the pipe requests",
        started.elapsed()
    );
}

#[test]
fn a_large_file_streams_whole_and_by_range() {
    let s = site();
    let data: Vec<u8> = (0..300_000u32).map(|i| (i % 251) as u8).collect();
    std::fs::write(s.d().join("www/big.bin"), &data).unwrap();
    let addr = s.corral.http_addr();
    let r = http(addr, "GET", "/big.bin", &[], b"");
    assert_eq!(r.status, 200, "{}", s.corral.log());
    assert_eq!(r.body, data);
    let r = http(addr, "GET", "/big.bin", &[("Range", "bytes=200000-")], b"");
    assert_eq!(r.status, 206);
    assert_eq!(r.body, &data[200_000..]);
    let r = http(addr, "HEAD", "/big.bin", &[], b"");
    assert_eq!(r.header("content-length"), Some("300000"));
    assert!(r.body.is_empty());
}
