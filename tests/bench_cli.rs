//! `corral bench` end to end: it drives every null backend and a real php-cgi and writes its
//! table, JSON and SVG, keeps or drops connections as asked, sends large bodies, reconnects
//! to a server that closes, counts non-2xx answers, connect errors and timeouts, and
//! `--compare` prints ratios; bad arguments are usage errors. The null backends answering
//! real peers are in `tests/null_backend.rs`. Every process is started in a temp dir and
//! killed by its guard.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing,
    missing_docs
)]

mod support;

use std::net::Shutdown;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::Duration;

use support::front::{curl, spawn_on_free_port};
use support::null_backend::{null_backend, target};
use support::peers::{php_cgi, shared_dir, write_file};
use support::{run, Guard, Outcome, CORRAL};

/// How long one `corral bench` of a few hundred requests may take.
const BENCH: Duration = Duration::from_secs(60);

fn bench(args: &[&str]) -> Outcome {
    let mut cmd = Command::new(CORRAL);
    cmd.arg("bench").args(args);
    let out = run(cmd, BENCH);
    assert_eq!(out.code, Some(0), "{}\n{}", out.stdout, out.stderr);
    out
}

/// Checks that `svg` is one well-formed element tree rooted at `<svg>`: every tag opened is
/// closed in order (a tiny check, enough for what `corral bench` writes).
fn assert_well_formed_svg(svg: &str) {
    assert!(svg.starts_with("<svg "), "{svg}");
    let mut open: Vec<&str> = Vec::new();
    let mut rest = svg;
    while let Some(start) = rest.find('<') {
        let end = rest[start..].find('>').expect("unclosed tag") + start;
        let tag = &rest[start + 1..end];
        if let Some(name) = tag.strip_prefix('/') {
            assert_eq!(open.pop(), Some(name), "mismatched </{name}>");
        } else if !tag.ends_with('/') {
            open.push(tag.split_whitespace().next().unwrap());
        }
        rest = &rest[end + 1..];
    }
    assert!(open.is_empty(), "unclosed elements {open:?}");
    assert_eq!(
        svg.trim_end().rfind("</svg>"),
        Some(svg.trim_end().len() - 6)
    );
}

/// A Unix socket in front of `upstream` that counts the connections made to it and relays
/// each to a connection of its own to `upstream`, so a test sees how many connections a
/// client opened.
struct CountingProxy {
    socket: PathBuf,
    accepted: Arc<AtomicUsize>,
}

impl CountingProxy {
    fn start(socket: PathBuf, upstream: PathBuf) -> CountingProxy {
        let listener = UnixListener::bind(&socket).unwrap();
        let accepted = Arc::new(AtomicUsize::new(0));
        let count = Arc::clone(&accepted);
        thread::spawn(move || {
            for client in listener.incoming() {
                let Ok(client) = client else { continue };
                count.fetch_add(1, Ordering::SeqCst);
                let Ok(server) = UnixStream::connect(&upstream) else {
                    continue;
                };
                relay(client.try_clone().unwrap(), server.try_clone().unwrap());
                relay(server, client);
            }
        });
        CountingProxy { socket, accepted }
    }

    fn accepted(&self) -> usize {
        self.accepted.load(Ordering::SeqCst)
    }
}

/// Copies `from` to `to` on a thread of its own, passing the end of stream on.
fn relay(mut from: UnixStream, mut to: UnixStream) {
    thread::spawn(move || {
        let _ = std::io::copy(&mut from, &mut to);
        let _ = to.shutdown(Shutdown::Write);
    });
}

#[test]
fn bench_drives_every_null_backend_and_writes_json_and_svg() {
    let dir = shared_dir();
    for protocol in ["fastcgi", "scgi", "lsapi", "http"] {
        let null = null_backend(dir.path(), protocol, &[]);
        let json = dir.path().join(format!("{protocol}.json"));
        let svg = dir.path().join(format!("{protocol}.svg"));
        let pid = null.pid().to_string();
        let out = bench(&[
            "--protocol",
            protocol,
            "--target",
            &target(&null),
            "--requests",
            "200",
            "--concurrency",
            "1,4",
            "--warmup",
            "0s",
            "--pid",
            &pid,
            "--json",
            json.to_str().unwrap(),
            "--svg",
            svg.to_str().unwrap(),
        ]);
        let rows: Vec<Vec<&str>> = out
            .stdout
            .lines()
            .filter(|l| l.starts_with("unix:"))
            .map(|l| l.split_whitespace().collect())
            .collect();
        assert_eq!(rows.len(), 2, "{}", out.stdout);
        for (row, c) in rows.iter().zip(["1", "4"]) {
            // target, c, requests, req/s, p50, p90, p99, p99.9, max, errors, body bytes
            assert_eq!((row[1], row[2], row[9]), (c, "200", "0"), "{}", out.stdout);
            assert_eq!(row[10], "2600", "{}", out.stdout);
        }
        assert!(
            out.stdout.contains(&format!("pid {pid}: cpu ")),
            "{}",
            out.stdout
        );
        assert!(
            out.stdout.contains("corral bench itself: cpu "),
            "{}",
            out.stdout
        );

        let json = std::fs::read_to_string(&json).unwrap();
        assert!(
            json.starts_with(&format!("{{\"protocol\":\"{protocol}\"")),
            "{json}"
        );
        for c in [1, 4] {
            assert!(
                json.contains(&format!("{{\"concurrency\":{c},\"completed\":200,")),
                "{json}"
            );
        }
        let clean = "\"errors\":{\"connect\":0,\"protocol\":0,\"status\":0,\"timeout\":0}";
        assert_eq!(json.matches(clean).count(), 2, "{json}");
        for field in [
            "\"req_per_s\":",
            "\"p50\":",
            "\"p99\":",
            "\"p99_9\":",
            "\"max\":",
        ] {
            assert_eq!(json.matches(field).count(), 2, "{field} in {json}");
        }
        assert!(
            json.contains(&format!("{{\"pid\":{pid},\"cpu_percent\":")),
            "{json}"
        );
        assert_eq!(json.matches("\"generator\":{\"pid\":").count(), 2, "{json}");
        assert_balanced_json(&json);

        let svg = std::fs::read_to_string(&svg).unwrap();
        assert_well_formed_svg(&svg);
        // One line per target in each of the two panels.
        assert_eq!(svg.matches("<polyline").count(), 2, "{svg}");
    }
}

/// Brackets and braces outside strings balance, and strings close.
fn assert_balanced_json(json: &str) {
    let (mut depth, mut in_string, mut escaped) = (Vec::new(), false, false);
    for c in json.chars() {
        match (in_string, escaped, c) {
            (true, true, _) => escaped = false,
            (true, false, '\\') => escaped = true,
            (true, false, '"') => in_string = false,
            (true, false, _) => {}
            (false, _, '"') => in_string = true,
            (false, _, '{' | '[') => depth.push(c),
            (false, _, '}') => assert_eq!(depth.pop(), Some('{'), "{json}"),
            (false, _, ']') => assert_eq!(depth.pop(), Some('['), "{json}"),
            _ => {}
        }
    }
    assert!(depth.is_empty() && !in_string, "{json}");
}

/// `--keepalive on` sends every request of a connection over it; `off` opens one per
/// request. Counted at a proxy in front of the null backend, not read from the header.
#[test]
fn bench_keeps_or_drops_connections_as_asked() {
    let dir = shared_dir();
    for protocol in ["fastcgi", "lsapi", "http"] {
        let null = null_backend(dir.path(), protocol, &[]);
        for (keepalive, connections, phrase) in [
            ("on", 2, "kept connections"),
            ("off", 50, "a connection per request"),
        ] {
            let what = format!("{protocol} --keepalive {keepalive}");
            let proxy = CountingProxy::start(
                dir.path().join(format!("{protocol}-{keepalive}.sock")),
                null.socket.clone(),
            );
            let out = bench(&[
                "--protocol",
                protocol,
                "--target",
                &format!("unix:{}", proxy.socket.display()),
                "--requests",
                "50",
                "--concurrency",
                "2",
                "--warmup",
                "0s",
                "--keepalive",
                keepalive,
            ]);
            let row: Vec<&str> = out
                .stdout
                .lines()
                .find(|l| l.starts_with("unix:"))
                .unwrap()
                .split_whitespace()
                .collect();
            assert_eq!((row[2], row[9]), ("50", "0"), "{what}: {}", out.stdout);
            assert_eq!(
                proxy.accepted(),
                connections,
                "{what}: connections opened for 50 requests at concurrency 2\n{}",
                out.stdout
            );
            assert!(out.stdout.contains(phrase), "{what}: {}", out.stdout);
        }
    }
}

#[test]
fn bench_fastcgi_against_php_cgi_gets_200s() {
    let dir = shared_dir();
    let script: PathBuf = write_file(dir.path(), "hello.php", "<?php echo 'Hello, world';");
    let php = php_cgi(dir.path());
    let json = dir.path().join("php.json");
    let out = bench(&[
        "--protocol",
        "fastcgi",
        "--target",
        &target(&php),
        "--script-filename",
        script.to_str().unwrap(),
        "--requests",
        "100",
        "--concurrency",
        "1,2",
        "--warmup",
        "0s",
        "--json",
        json.to_str().unwrap(),
    ]);
    let json = std::fs::read_to_string(&json).unwrap();
    let clean = "\"errors\":{\"connect\":0,\"protocol\":0,\"status\":0,\"timeout\":0}";
    assert_eq!(json.matches(clean).count(), 2, "{}\n{json}", out.stdout);
    assert_eq!(json.matches("\"completed\":100,").count(), 2, "{json}");
    // "Hello, world" is 12 bytes of body per answer.
    assert_eq!(json.matches("\"body_bytes\":1200,").count(), 2, "{json}");
}

#[test]
fn bench_reports_non_2xx_and_connect_errors() {
    let dir = shared_dir();
    let php = php_cgi(dir.path());
    let out = bench(&[
        "--protocol",
        "fastcgi",
        "--target",
        &target(&php),
        "--script-filename",
        "/nonexistent/missing.php",
        "--requests",
        "10",
        "--concurrency",
        "1",
        "--warmup",
        "0s",
    ]);
    assert!(
        out.stdout
            .contains("errors: connect 0, protocol 0, non-2xx 10, timeout 0"),
        "{}",
        out.stdout
    );
    let gone = dir.path().join("nobody.sock");
    let out = bench(&[
        "--protocol",
        "scgi",
        "--target",
        &format!("unix:{}", gone.display()),
        "--requests",
        "5",
        "--concurrency",
        "1",
        "--warmup",
        "0s",
    ]);
    assert!(
        out.stdout
            .contains("errors: connect 5, protocol 0, non-2xx 0, timeout 0"),
        "{}",
        out.stdout
    );
}

#[test]
fn compare_interleaves_two_targets_and_prints_ratios() {
    let dir = shared_dir();
    let a = null_backend(dir.path(), "fastcgi", &[]);
    let b_dir = shared_dir();
    let b = null_backend(b_dir.path(), "fastcgi", &["--body-size", "1000"]);
    let out = bench(&[
        "--protocol",
        "fastcgi",
        "--target",
        &target(&a),
        "--compare",
        &target(&b),
        "--rounds",
        "2",
        "--requests",
        "100",
        "--concurrency",
        "1,3",
        "--warmup",
        "0s",
    ]);
    let runs: Vec<&str> = out
        .stdout
        .lines()
        .filter(|l| l.starts_with("unix:") && l.contains(" #"))
        .collect();
    // A B A B at each of two levels.
    assert_eq!(runs.len(), 8, "{}", out.stdout);
    assert!(
        runs[0].contains(&format!("{} #1", target(&a))),
        "{}",
        out.stdout
    );
    assert!(
        runs[1].contains(&format!("{} #1", target(&b))),
        "{}",
        out.stdout
    );
    assert!(
        runs[2].contains(&format!("{} #2", target(&a))),
        "{}",
        out.stdout
    );
    for c in [1, 3] {
        let prefix = format!("ratio {} / {} at c={c}: req/s ", target(&b), target(&a));
        assert!(out.stdout.contains(&prefix), "{}", out.stdout);
    }
}

#[test]
fn a_backend_that_never_answers_is_a_timeout_and_a_stale_socket_is_reused() {
    let dir = shared_dir();
    // Connections queue in the backlog and are never accepted, so never answered.
    let path = dir.path().join("silent.sock");
    let _silent = std::os::unix::net::UnixListener::bind(&path).unwrap();
    let out = bench(&[
        "--protocol",
        "lsapi",
        "--target",
        &format!("unix:{}", path.display()),
        "--requests",
        "2",
        "--concurrency",
        "1",
        "--warmup",
        "0s",
        "--timeout",
        "200ms",
    ]);
    assert!(
        out.stdout
            .contains("errors: connect 0, protocol 0, non-2xx 0, timeout 2"),
        "{}",
        out.stdout
    );

    // A socket file nobody listens on any more (a killed null backend leaves one).
    let stale = dir.path().join("http.sock");
    support::invariants::refusing_socket(&stale);
    assert!(stale.exists());
    let http = null_backend(dir.path(), "http", &[]);
    let r = curl(
        "http://localhost/",
        &["--unix-socket", http.socket.to_str().unwrap()],
    );
    assert_eq!(r.status, 200);
}

#[test]
fn bad_bench_arguments_are_usage_errors() {
    for args in [
        &["--concurrency", "1,0"][..],
        &["--requests", "5", "--duration", "1s"],
        &["--protocol", "gopher"],
    ] {
        let mut all = vec!["bench", "--protocol", "http", "--target", "127.0.0.1:9"];
        if args[0] == "--protocol" {
            all.truncate(1);
            all.extend(["--target", "127.0.0.1:9"]);
        }
        all.extend(args);
        let out = support::corral(&all);
        assert_eq!(out.code, Some(64), "{all:?}: {}", out.stderr);
    }
    let out = support::corral(&[
        "null-backend",
        "--protocol",
        "fastcgi",
        "--listen",
        "nowhere",
    ]);
    assert_eq!(out.code, Some(69), "{}", out.stderr);
    assert!(
        out.stderr
            .contains("\"nowhere\" is not unix:/path, IP:PORT or fd0"),
        "{}",
        out.stderr
    );
}

#[test]
fn bench_sends_large_bodies_to_every_protocol() {
    let dir = shared_dir();
    for protocol in ["fastcgi", "scgi", "lsapi", "http"] {
        let null = null_backend(dir.path(), protocol, &[]);
        let out = bench(&[
            "--protocol",
            protocol,
            "--target",
            &target(&null),
            "--requests",
            "20",
            "--concurrency",
            "2",
            "--warmup",
            "0s",
            "--method",
            "POST",
            "--body-size",
            "1000000",
        ]);
        let row: Vec<&str> = out
            .stdout
            .lines()
            .find(|l| l.starts_with("unix:"))
            .unwrap()
            .split_whitespace()
            .collect();
        assert_eq!((row[2], row[9]), ("20", "0"), "{}", out.stdout);
    }
}

#[test]
fn bench_reconnects_to_an_http_server_that_closes_after_each_answer() {
    let dir = shared_dir();
    write_file(dir.path(), "hello.txt", "Hello, world\n");
    // Python's http.server answers HTTP/1.0 and closes every connection.
    let (child, port) = spawn_on_free_port(|port| {
        let mut cmd = Command::new("python3");
        cmd.args(["-m", "http.server", "--bind", "127.0.0.1", "--directory"])
            .arg(dir.path())
            .arg(port.to_string())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        cmd
    });
    let _server = Guard(child);
    let out = bench(&[
        "--protocol",
        "http",
        "--target",
        &format!("127.0.0.1:{port}"),
        "--path",
        "/hello.txt",
        "--requests",
        "30",
        "--concurrency",
        "2",
        "--warmup",
        "0s",
    ]);
    let row: Vec<&str> = out
        .stdout
        .lines()
        .find(|l| l.starts_with("127.0.0.1:"))
        .unwrap()
        .split_whitespace()
        .collect();
    assert_eq!(
        (row[2], row[9], row[10]),
        ("30", "0", "390"),
        "{}",
        out.stdout
    );
}
