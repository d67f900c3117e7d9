//! `servers = [...]` naming a DNS name that moves: corral runs in a private mount namespace
//! whose `/etc/hosts` is a file the test owns (bind-mounted over it; the system resolver reads
//! it on every lookup), with the name first on 127.0.0.2, where a real php-cgi answers "one",
//! then on 127.0.0.3, where another answers "two". corral follows without a restart, no
//! request fails across the move, the old server is drained, and a lookup that fails in
//! between keeps the last good server.

mod support;

use std::net::TcpListener;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use support::peers::{shared_dir, write_file, Peer, PHP_CGI};
use support::server::{http, Corral};

const NAME: &str = "app.corral-test.invalid";

/// php-cgi serving FastCGI on `ip:port`, answering `who` through its environment.
fn php_at(ip: &str, port: u16, who: &str, dir: &Path) -> Peer {
    let mut cmd = Command::new(PHP_CGI);
    cmd.env_clear()
        .env("PATH", "/usr/bin:/bin")
        .env("PHP_FCGI_CHILDREN", "0")
        .env("PHP_FCGI_MAX_REQUESTS", "0")
        .env("WHO", who)
        .args(["-n", "-b", &format!("{ip}:{port}")])
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    let peer = Peer::spawn(cmd, &dir.join(format!("{who}.unused")));
    assert!(
        support::eventually(Duration::from_secs(10), || {
            std::net::TcpStream::connect((ip, port)).is_ok()
        }),
        "php-cgi did not listen on {ip}:{port}"
    );
    peer
}

/// A port free on both 127.0.0.2 and 127.0.0.3 (the name keeps its port when it moves).
fn common_port() -> u16 {
    for _ in 0..50 {
        let port = TcpListener::bind("127.0.0.2:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        if TcpListener::bind(("127.0.0.3", port)).is_ok() {
            return port;
        }
    }
    panic!("no port free on both 127.0.0.2 and 127.0.0.3");
}

/// Rewrites the hosts file in place: the bind mount shows the same inode, so a rename would
/// not be seen.
fn hosts(path: &Path, ip: Option<&str>) {
    let mut text = "127.0.0.1 localhost\n".to_owned();
    if let Some(ip) = ip {
        text.push_str(&format!("{ip} {NAME}\n"));
    }
    std::fs::write(path, text).unwrap();
}

#[test]
fn a_server_name_that_moves_is_followed_without_a_failed_request() {
    let dir = shared_dir();
    let d = dir.path();
    write_file(d, "who.php", "<?php echo getenv('WHO');\n");
    let hosts_file = d.join("hosts");
    hosts(&hosts_file, Some("127.0.0.2"));
    let port = common_port();
    let _one = php_at("127.0.0.2", port, "one", d);
    let _two = php_at("127.0.0.3", port, "two", d);
    let config = format!(
        "[server]\nruntime_dir = \"{d}/run\"\ngrace = \"2s\"\n\n\
         [[listen]]\naddress = \"127.0.0.1:0\"\nprotocol = \"http\"\n\n\
         [pools.php]\nservers = [\"{NAME}:{port}\"]\nresolve_every = \"200ms\"\n\n\
         [[contexts]]\nroot = \"{d}\"\npool = \"php\"\n",
        d = d.display()
    );
    let mount = format!(
        "mount --bind '{}' /etc/hosts && exec \"$@\"",
        hosts_file.display()
    );
    let corral = Corral::start_via(
        &[
            "unshare",
            "--mount",
            "--propagation",
            "private",
            "/bin/sh",
            "-c",
            &mount,
            "sh",
        ],
        &config,
        1,
    );
    let addr = corral.http_addr();
    assert!(
        corral.wait_log("server added: the name resolves to it"),
        "{}",
        corral.log()
    );
    assert!(
        corral.log().contains("server=127.0.0.2:"),
        "{}",
        corral.log()
    );

    // Requests one after another for the whole test, every answer kept.
    let answers = Arc::new(Mutex::new(Vec::<(u16, String)>::new()));
    let stop = Arc::new(AtomicBool::new(false));
    let client = {
        let (answers, stop) = (Arc::clone(&answers), Arc::clone(&stop));
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                let r = http(addr, "GET", "/who.php", &[], b"");
                answers.lock().unwrap().push((r.status, r.text()));
            }
        })
    };
    let seen = |who: &str| answers.lock().unwrap().iter().any(|(_, t)| t == who);
    assert!(
        support::eventually(Duration::from_secs(10), || seen("one")),
        "{}",
        corral.log()
    );

    // The name stops resolving: logged, and the last server keeps serving.
    hosts(&hosts_file, None);
    assert!(
        corral.wait_log("cannot resolve a server name; keeping its last 1 server(s)"),
        "{}",
        corral.log()
    );
    let before = answers.lock().unwrap().len();
    assert!(
        support::eventually(Duration::from_secs(10), || {
            answers.lock().unwrap().len() > before + 5
        }),
        "requests stopped while the name did not resolve:\n{}",
        corral.log()
    );

    // It moves: corral follows, and the old server is drained.
    hosts(&hosts_file, Some("127.0.0.3"));
    assert!(
        support::eventually(Duration::from_secs(10), || seen("two")),
        "{}",
        corral.log()
    );
    assert!(
        corral.wait_log("server removed (draining): the name no longer resolves to it"),
        "{}",
        corral.log()
    );
    let moved = answers.lock().unwrap().len();
    assert!(
        support::eventually(Duration::from_secs(10), || {
            answers.lock().unwrap().len() > moved + 10
        }),
        "{}",
        corral.log()
    );
    stop.store(true, Ordering::Relaxed);
    client.join().unwrap();

    let answers = answers.lock().unwrap();
    let failed: Vec<_> = answers
        .iter()
        .filter(|(s, t)| *s != 200 || (t != "one" && t != "two"))
        .collect();
    assert!(failed.is_empty(), "{failed:?}\n{}", corral.log());
    // Once the new server answered, the old one got nothing new.
    let first_two = answers.iter().position(|(_, t)| t == "two").unwrap();
    let late_ones = answers[first_two..]
        .iter()
        .filter(|(_, t)| t == "one")
        .count();
    assert_eq!(late_ones, 0, "{answers:?}");
    assert!(
        corral.log().contains("server name resolves again"),
        "{}",
        corral.log()
    );
}
