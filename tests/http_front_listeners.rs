//! The `http` listener's own settings: static files, HTTPS from a trusted proxy's header and
//! the allow list; `[server] threads` and `scheduler` (serving threads, one SO_REUSEPORT
//! socket each), `sched_batch`, and a second corral refused the port the first one holds.

mod support;

use std::time::Duration;

use support::http_front::{config, php_site};
use support::server::{http, Corral};
use support::weak::{read_until_closed, AT_ONCE};
use support::{peers, thread_policies};

#[test]
fn static_files_trusted_https_and_the_allow_list() {
    let dir = peers::shared_dir();
    peers::write_file(
        dir.path(),
        "https.php",
        "<?php echo $_SERVER['HTTPS'] ?? 'off';",
    );
    peers::write_file(dir.path(), "style.css", "body { color: red }\n");
    std::fs::create_dir(dir.path().join("sub")).unwrap();
    let php = peers::php_cgi(dir.path());
    let outside = tempfile::tempdir().unwrap();
    std::fs::write(outside.path().join("secret.txt"), "secret").unwrap();
    std::os::unix::fs::symlink(
        outside.path().join("secret.txt"),
        dir.path().join("link.txt"),
    )
    .unwrap();
    let corral = Corral::start(
        &format!(
            r#"
[server]
runtime_dir = "{}/run"

[[listen]]
address = "127.0.0.1:0"
protocol = "http"
forwarded = "x-forwarded"
trusted_proxies = ["127.0.0.1/32"]

[[listen]]
address = "127.0.0.2:0"
protocol = "http"
allow = ["10.0.0.0/8"]

[pools.main]
servers = ["unix:{}"]

[[contexts]]
pool = "main"
root = "{}"
static_files = true
"#,
            dir.path().display(),
            php.socket.display(),
            dir.path().display()
        ),
        2,
    );
    // Both listeners log as they start, in either order: take the open one by address.
    let addr: std::net::SocketAddr = corral
        .listeners
        .iter()
        .find(|a| a.starts_with("127.0.0.1:"))
        .unwrap()
        .parse()
        .unwrap();

    let r = http(addr, "GET", "/style.css", &[], b"");
    assert_eq!(r.status, 200, "{}", corral.log());
    assert_eq!(r.header("content-type"), Some("text/css; charset=utf-8"));
    assert_eq!(r.text(), "body { color: red }\n");
    assert_eq!(http(addr, "POST", "/style.css", &[], b"x").status, 405);
    // A symlink out of the root is not served, and no script by that name exists.
    assert_ne!(http(addr, "GET", "/link.txt", &[], b"").text(), "secret");
    // A directory is not a file; with no index script it is not found.
    assert_eq!(http(addr, "GET", "/sub/", &[], b"").status, 404);

    // The trusted proxy's header makes HTTPS=on; without it, off.
    let r = http(
        addr,
        "GET",
        "/https.php",
        &[("X-Forwarded-Proto", "https")],
        b"",
    );
    assert_eq!(r.text(), "on", "{}", corral.log());
    assert_eq!(http(addr, "GET", "/https.php", &[], b"").text(), "off");

    // The second listener only takes clients from 10/8: loopback is closed at once.
    let second: std::net::SocketAddr = corral
        .listeners
        .iter()
        .find(|a| a.starts_with("127.0.0.2:"))
        .unwrap()
        .parse()
        .unwrap();
    let mut s = std::net::TcpStream::connect(second).unwrap();
    use std::io::Write;
    // The write may fail: the connection may already be closed.
    let _ = s.write_all(b"GET /style.css HTTP/1.1\r\nHost: x\r\n\r\n");
    let buf = read_until_closed(&mut s, AT_ONCE);
    assert!(buf.is_empty(), "{}", String::from_utf8_lossy(&buf));
    assert!(corral.wait_log("outside the listener's allow list"));
}

/// Threads of process `pid` whose name is `name`.
fn threads_named(pid: u32, name: &str) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/task"))
        .unwrap()
        .filter(|t| {
            let comm = t.as_ref().unwrap().path().join("comm");
            std::fs::read_to_string(comm).is_ok_and(|c| c.trim() == name)
        })
        .count()
}

/// The CPUs a task may run on, from its /proc status (`Cpus_allowed_list`: `0-1`, `0,2`, `3`).
fn cpus_allowed(status_path: &std::path::Path) -> Vec<usize> {
    let status = std::fs::read_to_string(status_path).unwrap();
    let list = status
        .lines()
        .find_map(|l| l.strip_prefix("Cpus_allowed_list:"))
        .unwrap()
        .trim();
    let mut cpus = Vec::new();
    for part in list.split(',') {
        match part.split_once('-') {
            Some((a, b)) => cpus.extend(a.parse::<usize>().unwrap()..=b.parse().unwrap()),
            None => cpus.push(part.parse().unwrap()),
        }
    }
    cpus
}

/// The CPUs each task named `corral-serve-N` of `pid` may run on, by N.
fn serving_thread_cpus(pid: u32, threads: usize) -> Vec<Vec<usize>> {
    let mut found = vec![Vec::new(); threads];
    for task in std::fs::read_dir(format!("/proc/{pid}/task")).unwrap() {
        let dir = task.unwrap().path();
        let comm = std::fs::read_to_string(dir.join("comm")).unwrap_or_default();
        if let Some(i) = comm.trim().strip_prefix("corral-serve-") {
            found[i.parse::<usize>().unwrap()] = cpus_allowed(&dir.join("status"));
        }
    }
    found
}

/// Sockets listening on 127.0.0.1:`port`, from /proc/net/tcp (state 0A).
fn listening_sockets(port: u16) -> usize {
    let local = format!("0100007F:{port:04X}");
    std::fs::read_to_string("/proc/net/tcp")
        .unwrap()
        .lines()
        .skip(1)
        .filter(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            f.get(1) == Some(&local.as_str()) && f.get(3) == Some(&"0A")
        })
        .count()
}

/// A corral with `server` added to its `[server]`, in front of the php-cgi at `socket`, that
/// has answered 8 PHP requests on 8 connections.
fn serve_php(dir: &std::path::Path, socket: &std::path::Path, server: &str) -> Corral {
    let text = config(
        dir,
        &format!("servers = [\"unix:{}\"]", socket.display()),
        &format!("root = \"{}\"\nextension = \"php\"", dir.display()),
    )
    .replacen("[server]\n", &format!("[server]\n{server}\n"), 1);
    let corral = Corral::start(&text, 1);
    for _ in 0..8 {
        let r = http(corral.http_addr(), "GET", "/hello.php?name=t", &[], b"");
        assert_eq!(r.status, 200, "{}", corral.log());
        assert_eq!(r.body, b"Hello t via CGI/1.1", "{}", corral.log());
    }
    corral
}

/// `[server] threads` and `scheduler`: with `work-stealing` the number is the runtime's worker
/// threads; with `per-thread` it is the serving threads, each with a TCP socket of
/// its own on the port (SO_REUSEPORT), beside one runtime thread for the control plane.
/// Counted in /proc while corral serves a PHP request; the log says the number.
#[test]
fn the_threads_setting_sets_the_serving_threads() {
    let dir = peers::shared_dir();
    php_site(dir.path());
    let php = peers::php_cgi(dir.path());
    for (scheduler, threads) in [
        ("work-stealing", 1usize),
        ("work-stealing", 3),
        ("per-thread", 1),
        ("per-thread", 3),
    ] {
        // Several connections, so that every serving thread's socket may get some.
        let corral = serve_php(
            dir.path(),
            &php.socket,
            &format!("threads = {threads}\nscheduler = \"{scheduler}\""),
        );
        let (rt, serving, sockets) = match scheduler {
            "work-stealing" => (threads, 0, 1),
            _ => (1, threads, threads),
        };
        let what = format!("{scheduler}, threads = {threads}");
        // tokio's blocking-pool threads bear its workers' name and outlive their task by
        // 10 s: the count settles to the runtime's workers once any such thread is gone.
        let settled = support::eventually(Duration::from_secs(15), || {
            threads_named(corral.pid(), "tokio-rt-worker") == rt
        });
        assert!(
            settled,
            "{what}: {} threads named tokio-rt-worker, not {rt}\n{}",
            threads_named(corral.pid(), "tokio-rt-worker"),
            corral.log()
        );
        let named = (0..threads)
            .map(|i| threads_named(corral.pid(), &format!("corral-serve-{i}")))
            .sum::<usize>();
        assert_eq!(named, serving, "{what}: {}", corral.log());
        assert_eq!(
            listening_sockets(corral.http_addr().port()),
            sockets,
            "{what}: {}",
            corral.log()
        );
        assert!(
            corral.wait_log(&format!("threads={threads} scheduler=\"{scheduler}\"")),
            "{what}: {}",
            corral.log()
        );
    }
}

/// With `per-thread` the TCP sockets share their port by SO_REUSEPORT, which would let a second
/// corral (same user) bind the same port and silently take half of its connections. It must
/// fail to start instead, as it does without SO_REUSEPORT.
#[test]
fn a_second_corral_on_a_taken_port_refuses_to_start() {
    let dir = peers::shared_dir();
    let text = |port: u16| {
        config(dir.path(), "servers = [\"127.0.0.1:9\"]", "")
            .replacen(
                "[server]\n",
                "[server]\nthreads = 2\nscheduler = \"per-thread\"\n",
                1,
            )
            .replacen("127.0.0.1:0", &format!("127.0.0.1:{port}"), 1)
    };
    let first = Corral::start(&text(0), 1);
    let port = first.http_addr().port();
    let file = support::config_file(&text(port));
    let mut second = std::process::Command::new(support::CORRAL)
        .args(["run", "-c"])
        .arg(file.path())
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let status = support::wait(&mut second, Duration::from_secs(20)).unwrap_or_else(|| {
        panic!("a second corral started on port {port}, which the first one holds")
    });
    let mut err = String::new();
    std::io::Read::read_to_string(&mut second.stderr.take().unwrap(), &mut err).unwrap();
    assert!(!status.success(), "{err}");
    assert!(
        err.contains(&format!("cannot listen on 127.0.0.1:{port}")),
        "{err}"
    );
    assert_eq!(
        listening_sockets(port),
        2,
        "the first corral's sockets are all there"
    );
}

/// `[server] pin_threads = true`: serving thread i may run only on the i-th CPU corral may
/// run on, in turn when there are more threads than CPUs; without it every serving thread
/// may run on all of them. Read from /proc while corral serves PHP requests.
#[test]
fn pin_threads_gives_each_serving_thread_a_cpu_of_its_own() {
    let dir = peers::shared_dir();
    php_site(dir.path());
    let php = peers::php_cgi(dir.path());
    let threads = 3;
    for pin in [true, false] {
        let corral = serve_php(
            dir.path(),
            &php.socket,
            &format!("threads = {threads}\npin_threads = {pin}"),
        );
        let all = cpus_allowed(std::path::Path::new(&format!(
            "/proc/{}/status",
            corral.pid()
        )));
        let per_thread = serving_thread_cpus(corral.pid(), threads);
        for (i, cpus) in per_thread.iter().enumerate() {
            let expected = if pin {
                vec![all[i % all.len()]]
            } else {
                all.clone()
            };
            assert_eq!(
                cpus,
                &expected,
                "pin_threads = {pin}, thread {i}: {}",
                corral.log()
            );
        }
    }
}

/// `[server] sched_batch`: in front of a php-cgi on this machine the serving threads run
/// under `SCHED_BATCH` unless it is set to false, and the start-up log says which; the main
/// thread never does.
#[test]
fn sched_batch_sets_the_serving_threads_policy() {
    let dir = peers::shared_dir();
    php_site(dir.path());
    let php = peers::php_cgi(dir.path());
    for (setting, expected) in [
        ("", 3),
        ("sched_batch = false", 0),
        ("sched_batch = true", 3),
    ] {
        let corral = serve_php(dir.path(), &php.socket, &format!("threads = 2\n{setting}"));
        let threads = thread_policies(corral.pid());
        let serving: Vec<u32> = threads
            .iter()
            .filter(|(name, _)| name.starts_with("corral-serve-"))
            .map(|(_, p)| *p)
            .collect();
        assert_eq!(serving, vec![expected; 2], "{setting:?}: {threads:?}");
        assert!(
            corral.wait_log(&format!("sched_batch={}", expected == 3)),
            "the start-up log names the policy: {}",
            corral.log()
        );
        let main = threads
            .iter()
            .find(|(name, _)| name == "corral")
            .map(|(_, p)| *p);
        assert_eq!(main, Some(0), "{setting:?}: the main thread: {threads:?}");
    }
}
