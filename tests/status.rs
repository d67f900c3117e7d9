//! The status listener against the real binary and a real php-cgi pool: `/ping`, the text
//! page with php-fpm's field names and the configured limits, `?json` (checked by Python's
//! parser), `?full` rows naming the real worker pids, `/metrics` in the OpenMetrics shape,
//! and answers within a second while every worker is busy and requests queue, with a full
//! queue counted as `rejected queue full`.

mod support;

use std::collections::BTreeSet;
use std::io::Write;
use std::net::SocketAddr;
use std::path::Path;
use std::process::{Command, Stdio};
use std::thread;
use std::time::Duration;

use tokio::time::Instant;

use support::peers;
use support::server::{http, Corral, HttpResponse};

/// One http listener, a status listener, and a static php-cgi pool of two workers with a
/// queue of one.
fn config(run: &Path, root: &Path) -> String {
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
address = "127.0.0.1:0"

[pools.php]
command = ["php-cgi"]
mode = "static"
max = 2
queue_size = 1
queue_timeout = "20s"

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
    _dir: tempfile::TempDir,
}

fn start() -> Setup {
    let dir = peers::shared_dir();
    peers::write_file(dir.path(), "pid.php", "<?php echo getmypid();");
    peers::write_file(
        dir.path(),
        "sleep.php",
        "<?php usleep((int)($_GET['ms'] ?? 100) * 1000); echo getmypid();",
    );
    let corral = Corral::start(&config(&dir.path().join("run"), dir.path()), 1);
    let status = status_addr(&corral);
    Setup {
        corral,
        status,
        _dir: dir,
    }
}

/// The status listener's address, from its log line.
fn status_addr(corral: &Corral) -> SocketAddr {
    corral.status_ready_addr()
}

impl Setup {
    /// The http listener.
    fn http(&self) -> SocketAddr {
        self.corral.http_addr()
    }

    fn get(&self, target: &str) -> HttpResponse {
        let r = http(self.status, "GET", target, &[], b"");
        assert_eq!(r.status, 200, "{target}: {}", r.text());
        r
    }

    /// Waits until both workers are ready (the page says so).
    fn wait_idle(&self) {
        assert!(
            eventually(Duration::from_secs(10), || {
                field(&self.get("/status").text(), "idle processes") == Some("2".into())
            }),
            "workers never became idle:\n{}",
            self.corral.log()
        );
    }
}

/// The value of `label:` in a text page block (the first occurrence).
fn field(text: &str, label: &str) -> Option<String> {
    let prefix = format!("{label}:");
    text.lines()
        .find(|l| l.starts_with(&prefix))
        .map(|l| l[prefix.len()..].trim().to_owned())
}

fn eventually(limit: Duration, mut check: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + limit;
    while Instant::now() < deadline {
        if check() {
            return true;
        }
        thread::sleep(Duration::from_millis(50));
    }
    check()
}

/// Runs `script` with the text on Python's standard input; its standard output.
fn python(script: &str, input: &str) -> String {
    let mut child = Command::new("python3")
        .args(["-c", script])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("python3");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(input.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "python rejected {input}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

#[test]
fn ping_text_json_full_and_metrics() {
    let s = start();
    let ping = s.get("/ping");
    assert_eq!(ping.text(), "pong\n");

    s.wait_idle();
    for _ in 0..3 {
        assert_eq!(http(s.http(), "GET", "/pid.php", &[], b"").status, 200);
    }

    let page = s.get("/status");
    assert!(page
        .header("content-type")
        .unwrap()
        .starts_with("text/plain"));
    let text = page.text();
    for label in [
        "pool",
        "process manager",
        "start time",
        "start since",
        "accepted conn",
        "listen queue",
        "max listen queue",
        "listen queue len",
        "idle processes",
        "active processes",
        "total processes",
        "max active processes",
        "max children reached",
    ] {
        assert!(field(&text, label).is_some(), "no {label:?} in\n{text}");
    }
    assert_eq!(field(&text, "pool").as_deref(), Some("php"));
    assert_eq!(field(&text, "process manager").as_deref(), Some("static"));
    assert_eq!(field(&text, "accepted conn").as_deref(), Some("3"));
    assert_eq!(field(&text, "total processes").as_deref(), Some("2"));
    // Configured limits beside the live values.
    assert_eq!(field(&text, "listen queue len").as_deref(), Some("1"));
    assert_eq!(field(&text, "max workers").as_deref(), Some("2"));
    assert_eq!(field(&text, "max conns").as_deref(), Some("2"));
    assert_eq!(field(&text, "queue timeout").as_deref(), Some("20"));
    assert_eq!(field(&text, "protocol").as_deref(), Some("fastcgi"));
    assert_eq!(field(&text, "workers idle").as_deref(), Some("2"));
    assert_eq!(field(&text, "rejected queue full").as_deref(), Some("0"));
    // php-fpm's time format.
    let start_time = field(&text, "start time").unwrap();
    assert!(
        start_time.ends_with(" +0000") && start_time.len() == 26,
        "{start_time}"
    );

    // JSON: Python's parser accepts it, and it says the same as the text.
    let json = s.get("/status?json&pool=php");
    assert_eq!(json.header("content-type"), Some("application/json"));
    let out = python(
        "import json,sys; d=json.load(sys.stdin); \
         print(d['pool'], d['accepted conn'], d['listen queue len'], d['max workers'], \
         d['queue timeout'], 'processes' in d)",
        &json.text(),
    );
    assert_eq!(out.trim(), "php 3 1 2 20 False");
    let all = s.get("/status?json");
    let out = python(
        "import json,sys; d=json.load(sys.stdin); print(len(d['pools']), d['pools'][0]['pool'])",
        &all.text(),
    );
    assert_eq!(out.trim(), "1 php");

    // ?full: one row per worker, naming real php-cgi processes, with live request counts.
    let full = s.get("/status?json&full&pool=php");
    let pids = python(
        "import json,sys; d=json.load(sys.stdin); \
         print(' '.join(str(p['pid']) for p in d['processes'])); \
         assert all(p['memory'] > 0 for p in d['processes']); \
         assert sum(p['requests'] for p in d['processes']) == 3",
        &full.text(),
    );
    let pids: BTreeSet<u32> = pids
        .split_whitespace()
        .map(|p| p.parse().unwrap())
        .collect();
    assert_eq!(pids.len(), 2, "{}", full.text());
    for pid in &pids {
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
        assert!(
            String::from_utf8_lossy(&cmdline).contains("php-cgi"),
            "pid {pid} is not php-cgi"
        );
    }
    let text_full = s.get("/status?full").text();
    assert_eq!(text_full.matches("************************").count(), 2);
    let text_pids: BTreeSet<u32> = text_full
        .lines()
        .filter_map(|l| l.strip_prefix("pid:"))
        .map(|p| p.trim().parse().unwrap())
        .collect();
    assert_eq!(text_pids, pids);

    // An unknown pool is 404.
    assert_eq!(
        http(s.status, "GET", "/status?pool=nope", &[], b"").status,
        404
    );

    // Metrics: the expected families, OpenMetrics' shape, and `# EOF` last.
    let m = s.get("/metrics");
    assert!(m
        .header("content-type")
        .unwrap()
        .starts_with("application/openmetrics-text"));
    let metrics = m.text();
    check_openmetrics(&metrics);
    for sample in [
        "corral_requests_accepted_total{pool=\"php\"} 3",
        "corral_max_workers{pool=\"php\"} 2",
        "corral_queue_size{pool=\"php\"} 1",
        "corral_queue_length{pool=\"php\"} 0",
        "corral_workers{pool=\"php\",state=\"idle\"} 2",
        "corral_requests_rejected_total{pool=\"php\",reason=\"queue_full\"} 0",
        "corral_backend_errors_total{pool=\"php\",kind=\"connect\"} 0",
        "corral_worker_recycles_total{pool=\"php\",reason=\"max_requests\"} 0",
        "corral_queue_wait_seconds_count{pool=\"php\"} 3",
        "corral_first_byte_seconds_count{pool=\"php\"} 3",
        "corral_request_seconds_count{pool=\"php\"} 3",
        "corral_pool_info{pool=\"php\",protocol=\"fastcgi\",mode=\"static\"} 1",
        "corral_max_connections{listeners=\"status\"} 32",
        "corral_connections_refused_total{listeners=\"front\"} 0",
    ] {
        assert!(metrics.contains(sample), "no {sample:?} in\n{metrics}");
    }
    // The same exposition, but for the open-connection gauges: the previous scrape's
    // connection may or may not have been counted out yet.
    let settled = |text: &str| -> String {
        text.lines()
            .filter(|l| !l.starts_with("corral_connections{"))
            .map(|l| format!("{l}\n"))
            .collect()
    };
    assert_eq!(
        settled(&s.get("/status?openmetrics").text()),
        settled(&metrics)
    );
}

/// Every line is a comment the format knows or a sample of a family declared before it;
/// counter samples end in `_total`; `# EOF` ends the text.
fn check_openmetrics(text: &str) {
    assert!(text.ends_with("# EOF\n"), "{text}");
    let mut families: Vec<(String, String)> = Vec::new();
    for line in text.lines() {
        if line == "# EOF" {
            continue;
        }
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, kind) = rest.split_once(' ').unwrap();
            assert!(name.starts_with("corral_"), "{line}");
            assert!(
                ["counter", "gauge", "histogram", "info"].contains(&kind),
                "{line}"
            );
            assert!(
                !families.iter().any(|(n, _)| n == name),
                "family {name} declared twice"
            );
            families.push((name.to_owned(), kind.to_owned()));
            continue;
        }
        if line.starts_with("# HELP ") || line.starts_with("# UNIT ") {
            continue;
        }
        let (name, value) = match line.split_once('{') {
            Some((name, rest)) => {
                let (labels, value) = rest.rsplit_once("} ").unwrap_or_else(|| panic!("{line}"));
                // Pool families carry the pool; connection families the listeners; accept
                // queue families the listener.
                assert!(
                    labels.starts_with("pool=\"")
                        || labels.starts_with("listeners=\"")
                        || labels.starts_with("listener=\""),
                    "{line}"
                );
                (name, value)
            }
            // Only the process's start time has no pool.
            None => line.split_once(' ').unwrap_or_else(|| panic!("{line}")),
        };
        if !line.contains('{') {
            assert_eq!(name, "corral_start_time_seconds", "{line}");
        }
        assert!(value.parse::<f64>().is_ok(), "{line}");
        let (family, kind) = families.last().expect("a sample before any # TYPE");
        let suffixes: &[&str] = match kind.as_str() {
            "counter" => &["_total"],
            "gauge" => &[""],
            "info" => &["_info"],
            _ => &["_bucket", "_count", "_sum"],
        };
        assert!(
            suffixes.iter().any(|s| name == format!("{family}{s}")),
            "{name} is not a sample of {family} ({kind})"
        );
    }
}

#[test]
fn status_answers_while_every_worker_is_busy_and_counts_a_full_queue() {
    let s = start();
    s.wait_idle();
    let front = s.http();
    // Two requests hold both workers, a third waits in the queue (its size is 1).
    let busy: Vec<_> = (0..3)
        .map(|_| thread::spawn(move || http(front, "GET", "/sleep.php?ms=3000", &[], b"").status))
        .collect();
    assert!(
        eventually(Duration::from_secs(2), || {
            field(&s.get("/status").text(), "listen queue") == Some("1".into())
        }),
        "the third request never queued:\n{}",
        s.get("/status").text()
    );
    // Every worker busy, one queued: status, JSON, full rows and metrics answer at once.
    for target in ["/status", "/status?json&full", "/metrics", "/ping"] {
        let began = Instant::now();
        let r = s.get(target);
        assert!(
            began.elapsed() < Duration::from_secs(1),
            "{target} took {:?}",
            began.elapsed()
        );
        if target == "/status" {
            let text = r.text();
            assert_eq!(
                field(&text, "active processes").as_deref(),
                Some("2"),
                "{text}"
            );
            assert_eq!(
                field(&text, "idle processes").as_deref(),
                Some("0"),
                "{text}"
            );
            assert_eq!(field(&text, "in flight").as_deref(), Some("2"), "{text}");
            assert_eq!(field(&text, "listen queue").as_deref(), Some("1"), "{text}");
            assert_eq!(
                field(&text, "max listen queue").as_deref(),
                Some("1"),
                "{text}"
            );
            assert_eq!(
                field(&text, "max children reached").as_deref(),
                Some("1"),
                "{text}"
            );
        }
    }
    // The queue is full: a fourth request is refused at once and counted.
    let began = Instant::now();
    let refused = http(front, "GET", "/pid.php", &[], b"");
    assert_eq!(refused.status, 503, "{}", refused.text());
    assert!(began.elapsed() < Duration::from_secs(1));
    let text = s.get("/status").text();
    assert_eq!(
        field(&text, "rejected queue full").as_deref(),
        Some("1"),
        "{text}"
    );
    assert!(s
        .get("/metrics")
        .text()
        .contains("corral_requests_rejected_total{pool=\"php\",reason=\"queue_full\"} 1"));
    for t in busy {
        assert_eq!(t.join().unwrap(), 200);
    }
    let text = s.get("/status").text();
    assert_eq!(
        field(&text, "accepted conn").as_deref(),
        Some("3"),
        "{text}"
    );
    assert_eq!(field(&text, "listen queue").as_deref(), Some("0"), "{text}");
    assert_eq!(
        field(&text, "max active processes").as_deref(),
        Some("2"),
        "{text}"
    );
}

#[test]
fn a_unix_status_socket_answers_and_the_tcp_allow_list_refuses_other_clients() {
    use std::io::Read;
    use std::os::unix::net::UnixStream;

    let dir = peers::shared_dir();
    let socket = dir.path().join("status.sock");
    let text = config(&dir.path().join("run"), dir.path()).replace(
        "[status]\naddress = \"127.0.0.1:0\"",
        &format!("[status]\naddress = \"unix:{}\"", socket.display()),
    );
    let corral = Corral::start(&text, 1);
    let mut s = UnixStream::connect(&socket).expect("connect to the status socket");
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    s.write_all(b"GET /ping HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .unwrap();
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).unwrap();
    let r = support::server::parse_response(&raw);
    assert_eq!((r.status, r.text().as_str()), (200, "pong\n"));
    drop(corral);

    // A TCP status listener that allows only another network closes our connection unread.
    let text = config(&dir.path().join("run"), dir.path()).replace(
        "[status]\naddress = \"127.0.0.1:0\"",
        "[status]\naddress = \"127.0.0.1:0\"\nallow = [\"10.0.0.0/8\"]",
    );
    let corral = Corral::start(&text, 1);
    let addr = status_addr(&corral);
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    // The write may fail: the connection may already be closed.
    let _ = s.write_all(b"GET /ping HTTP/1.1\r\nHost: x\r\n\r\n");
    let raw = support::weak::read_until_closed(&mut s, support::weak::AT_ONCE);
    assert!(raw.is_empty(), "{}", String::from_utf8_lossy(&raw));
    assert!(corral.wait_log("refused a client outside the listener's allow list"));
}

#[test]
fn only_loopback_its_own_address_and_allowed_hosts_are_answered_with_the_security_headers() {
    let s = start();
    let get = |host: &str, target: &str| http(s.status, "GET", target, &[("Host", host)], b"");
    // A browser led here by DNS rebinding sends the attacker's name.
    let r = get("evil.example", "/status?json");
    assert_eq!(r.status, 421, "{}", r.text());
    assert!(r.text().contains("allowed_hosts"), "{}", r.text());
    assert!(!r.text().contains("\"pool\""), "{}", r.text());
    assert!(s
        .corral
        .wait_log("refused a request for a Host it does not answer"));
    assert_eq!(get("evil.example:9180", "/metrics").status, 421);
    // /ping tells nothing and answers every name.
    assert_eq!(get("evil.example", "/ping").status, 200);
    for host in [
        "localhost",
        "LocalHost:9180",
        "127.0.0.1",
        &s.status.to_string(),
    ] {
        assert_eq!(get(host, "/status").status, 200, "{host}");
    }
    // The page for people, with its security headers (src/status/html.rs).
    let r = get("localhost", "/status?html");
    assert_eq!(r.status, 200);
    let csp = r.header("content-security-policy").unwrap();
    assert!(csp.contains("frame-ancestors 'none'"), "{csp}");
    assert_eq!(r.header("x-frame-options"), Some("DENY"));
    assert_eq!(r.header("x-content-type-options"), Some("nosniff"));
    assert_eq!(r.header("referrer-policy"), Some("no-referrer"));
    drop(s);

    let dir = peers::shared_dir();
    let text = config(&dir.path().join("run"), dir.path()).replace(
        "[status]\naddress = \"127.0.0.1:0\"",
        "[status]\naddress = \"127.0.0.1:0\"\nallowed_hosts = [\"Status.Example\"]",
    );
    let corral = Corral::start(&text, 1);
    let addr = status_addr(&corral);
    let get = |host: &str| http(addr, "GET", "/status", &[("Host", host)], b"").status;
    assert_eq!(get("status.example:8443"), 200);
    assert_eq!(get("status.example."), 200);
    assert_eq!(get("other.example"), 421);
    assert_eq!(get("localhost"), 200);
}
