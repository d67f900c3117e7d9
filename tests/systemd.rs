//! systemd's protocols, spoken by the real binary: `Type=notify` readiness (READY=1 once the
//! pool has its `min` workers, STATUS= with live counts, WATCHDOG=1, RELOADING=1 with
//! MONOTONIC_USEC on reload, STOPPING=1) to a
//! NOTIFY_SOCKET the test listens on, and socket activation: a listening socket handed over
//! as fd 3 with LISTEN_FDS serves requests in place of the `[[listen]]` block's own bind.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing,
    missing_docs
)]

mod support;

use std::os::fd::AsRawFd;
use std::os::unix::net::UnixDatagram;
use std::os::unix::process::CommandExt;
use std::process::Command;
use std::time::Duration;

use support::notify_until;
use support::peers::{shared_dir, write_file};
use support::server::{http, Corral};

fn config(dir: &std::path::Path, listen: &str) -> String {
    format!(
        r#"
[server]
runtime_dir = "{run}"
grace = "2s"
kill_timeout = "2s"

[[listen]]
address = "{listen}"
protocol = "http"

[status]
address = "127.0.0.1:0"

[pools.php]
command = ["php-cgi"]
mode = "static"
max = 2

[[contexts]]
root = "{root}"
pool = "php"
"#,
        run = dir.join("run").display(),
        root = dir.display(),
    )
}

#[test]
fn readiness_status_watchdog_and_stopping_reach_the_notify_socket() {
    let dir = shared_dir();
    write_file(dir.path(), "pid.php", "<?php echo getmypid();");
    let notify = dir.path().join("notify.sock");
    let socket = UnixDatagram::bind(&notify).unwrap();
    let notify_env = notify.display().to_string();
    let corral = Corral::start_after(
        &config(dir.path(), "127.0.0.1:0"),
        1,
        "",
        &[
            ("NOTIFY_SOCKET", notify_env.as_str()),
            ("WATCHDOG_USEC", "400000"),
        ],
    );
    let ready = notify_until(&socket, "READY=1", Duration::from_secs(20));
    let last = ready.last().unwrap();
    assert!(last.contains("STATUS="), "{last}");
    // Ready means the pool's two workers accept requests.
    assert!(
        last.contains("2 workers accepting"),
        "{last}\n{}",
        corral.log()
    );
    assert_eq!(
        http(corral.http_addr(), "GET", "/pid.php", &[], b"").status,
        200
    );
    // The watchdog is fed at half of WATCHDOG_USEC, and STATUS= comes with live counts.
    let seen = notify_until(&socket, "WATCHDOG=1", Duration::from_secs(3));
    let seen2 = notify_until(&socket, "served", Duration::from_secs(8));
    assert!(
        seen.iter().chain(&seen2).any(|m| m.starts_with("STATUS=")),
        "{seen:?} {seen2:?}"
    );
    // A reload says RELOADING=1 with the monotonic time, then READY=1 once it is applied.
    corral.signal(nix::sys::signal::Signal::SIGHUP);
    let reloading = notify_until(&socket, "RELOADING=1", Duration::from_secs(10));
    let message = reloading.last().unwrap();
    let usec = message
        .lines()
        .find_map(|l| l.strip_prefix("MONOTONIC_USEC="))
        .and_then(|v| v.parse::<u64>().ok());
    assert!(usec.is_some_and(|u| u > 0), "{message}");
    let ready = notify_until(&socket, "READY=1", Duration::from_secs(20));
    assert!(
        ready.last().is_some_and(|m| m.contains("STATUS=")),
        "{ready:?}\n{}",
        corral.log()
    );
    assert!(corral.wait_log("reloaded: the new configuration serves"));
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(corral.pid() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    notify_until(&socket, "STOPPING=1", Duration::from_secs(5));
}

#[test]
fn a_socket_handed_over_with_listen_fds_serves_requests() {
    let dir = shared_dir();
    write_file(dir.path(), "pid.php", "<?php echo getmypid();");
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let fd = listener.as_raw_fd();
    let file = support::config_file(&config(dir.path(), &addr.to_string()));
    let mut cmd = Command::new("/bin/sh");
    cmd.arg("-c")
        .arg("export LISTEN_PID=$$ LISTEN_FDS=1\nexec \"$0\" run -c \"$1\"")
        .arg(support::CORRAL)
        .arg(file.path());
    // SAFETY: between fork and exec only dup2 and fcntl, both async-signal-safe.
    unsafe {
        cmd.pre_exec(move || {
            if fd != 3 && nix::libc::dup2(fd, 3) < 0 {
                return Err(std::io::Error::last_os_error());
            }
            // dup2 clears close-on-exec on a new descriptor, but not when the listener
            // already is fd 3: clear it either way.
            if nix::libc::fcntl(3, nix::libc::F_SETFD, 0) < 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let corral = Corral::start_command(cmd, file, 1);
    // The test's own copy goes: only corral's inherited one is left listening.
    drop(listener);
    // The log is read on another thread: the line may trail the answer.
    assert!(corral.wait_log("socket activation"), "{}", corral.log());
    let r = http(addr, "GET", "/pid.php", &[], b"");
    assert_eq!(r.status, 200, "{}", corral.log());
}
