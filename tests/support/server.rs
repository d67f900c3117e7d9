//! The real `corral` binary serving a generated configuration, and a small HTTP/1.1 client.
//!
//! `Corral::start` waits (with a deadline) until every listener has logged its bound address,
//! so tests can use port 0; the guard kills corral on drop, also on panic. The client sends
//! one request per connection (`Connection: close`) and de-chunks the answer.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::Duration;

use super::CORRAL;

/// How long corral may take to bind its listeners.
const START: Duration = Duration::from_secs(20);

/// What corral logs when SIGUSR1 reaches it: it reopens the access and slow-request logs
/// (src/signals.rs) and changes nothing else, so a test can have it log a line at will.
pub const MARK: &str = "reopening the request logs";

/// A running corral: killed and reaped when dropped.
pub struct Corral {
    child: Child,
    log: Arc<Mutex<String>>,
    /// Bound listener addresses in the order they were logged (`127.0.0.1:PORT`,
    /// `unix:/path`).
    pub listeners: Vec<String>,
    /// Their protocols as logged (`Http`, `Fastcgi`, `Scgi`, `status`), in the same order.
    pub protocols: Vec<String>,
    /// Set once corral's stderr reached its end: every line it will ever log is in `log`.
    closed: Arc<AtomicBool>,
    _config: tempfile::NamedTempFile,
}

impl Corral {
    /// Starts `corral run -c FILE` on `config` and waits for its `listeners` listeners.
    pub fn start(config: &str, listeners: usize) -> Corral {
        Corral::start_via(&[], config, listeners)
    }

    /// Like [`Corral::start`], with corral started through `wrapper` (a program and its
    /// arguments, such as `prlimit --nofile=1024:4096 --`), which must exec corral in its own
    /// place so the pid and the kill on drop are corral's.
    pub fn start_via(wrapper: &[&str], config: &str, listeners: usize) -> Corral {
        let file = super::config_file(config);
        let mut cmd = match wrapper.split_first() {
            Some((program, args)) => {
                let mut c = Command::new(program);
                c.args(args).arg(CORRAL);
                c
            }
            None => Command::new(CORRAL),
        };
        cmd.args(["run", "-c"]).arg(file.path());
        Corral::start_command(cmd, file, listeners)
    }

    /// Like [`Corral::start`], but through `/bin/sh -c "SETUP; exec corral run -c FILE"`
    /// with `env` added, so a test can start corral with a umask, an inherited descriptor
    /// or a file planted under corral's own pid (`$$` is the pid corral keeps after `exec`).
    pub fn start_after(
        config: &str,
        listeners: usize,
        setup: &str,
        env: &[(&str, &str)],
    ) -> Corral {
        let file = super::config_file(config);
        let mut cmd = Command::new("/bin/sh");
        cmd.arg("-c")
            .arg(format!("{setup}\nexec \"$0\" run -c \"$1\""))
            .arg(CORRAL)
            .arg(file.path())
            .envs(env.iter().copied());
        Corral::start_command(cmd, file, listeners)
    }

    /// Starts `cmd` (which must exec `corral run -c FILE` in its own place) and waits for
    /// its `listeners` listeners; `file` is kept for corral's lifetime.
    pub fn start_command(
        mut cmd: Command,
        file: tempfile::NamedTempFile,
        listeners: usize,
    ) -> Corral {
        let mut child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start corral");
        let stderr = child.stderr.take().expect("stderr is piped");
        // Killed on drop from here on, also when the wait below panics.
        let mut child = KillOnDrop(Some(child));
        let log = Arc::new(Mutex::new(String::new()));
        let (tx, rx) = std::sync::mpsc::channel();
        let sink = Arc::clone(&log);
        let closed = Arc::new(AtomicBool::new(false));
        let eof = Arc::clone(&closed);
        thread::spawn(move || {
            let _eof = SetOnDrop(eof);
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if line.contains(" listening ") {
                    if let Some(addr) = field(&line, "listener=") {
                        let protocol = field(&line, "protocol=").unwrap_or_default();
                        let _ = tx.send((addr, protocol));
                    }
                }
                let mut log = sink.lock().unwrap();
                log.push_str(&line);
                log.push('\n');
            }
        });
        let step = Duration::from_millis(100);
        let mut waited = Duration::ZERO;
        let mut found = Vec::new();
        while found.len() < listeners {
            match rx.recv_timeout(step) {
                Ok(listener) => found.push(listener),
                Err(_) => {
                    waited += step;
                    if let Ok(Some(status)) = child.get().try_wait() {
                        panic!("corral exited early ({status}):\n{}", log.lock().unwrap());
                    }
                    assert!(
                        waited < START,
                        "corral did not listen within {START:?}:\n{}",
                        log.lock().unwrap()
                    );
                }
            }
        }
        let (listeners, protocols) = found.into_iter().unzip();
        Corral {
            child: child.take(),
            log,
            listeners,
            protocols,
            closed,
            _config: file,
        }
    }

    /// The first TCP listener that is not the status listener.
    pub fn http_addr(&self) -> SocketAddr {
        self.listeners
            .iter()
            .zip(&self.protocols)
            .filter(|(_, p)| p.as_str() != "status")
            .find_map(|(a, _)| a.parse().ok())
            .expect("a TCP listener")
    }

    /// The status listener's address, from its "status listener ready" line (waited for).
    pub fn status_ready_addr(&self) -> SocketAddr {
        assert!(self.wait_log("status listener ready"), "{}", self.log());
        self.log()
            .lines()
            .find(|l| l.contains("status listener ready"))
            .and_then(|l| field(l, "listener="))
            .and_then(|a| a.parse().ok())
            .unwrap_or_else(|| panic!("no status listener logged:\n{}", self.log()))
    }

    /// The TCP address of the listener logged with `protocol` (`Http`, `Fastcgi`, `Scgi`).
    pub fn addr_of(&self, protocol: &str) -> SocketAddr {
        self.listeners
            .iter()
            .zip(&self.protocols)
            .find(|(_, p)| p.as_str() == protocol)
            .and_then(|(a, _)| a.parse().ok())
            .unwrap_or_else(|| panic!("no {protocol} TCP listener in {:?}", self.listeners))
    }

    /// Everything corral logged so far.
    pub fn log(&self) -> String {
        self.log.lock().unwrap().clone()
    }

    /// Waits (5 s at most) until corral has logged a line containing `needle`; the log is
    /// read on another thread, so a line may trail the event that caused it.
    pub fn wait_log(&self, needle: &str) -> bool {
        let step = Duration::from_millis(20);
        for _ in 0..250 {
            if self.log().contains(needle) {
                return true;
            }
            thread::sleep(step);
        }
        false
    }

    /// corral's pid.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The configuration file corral runs with (a reload reads it again).
    pub fn config_path(&self) -> &std::path::Path {
        self._config.path()
    }

    /// Sends `signal` to corral.
    pub fn signal(&self, signal: nix::sys::signal::Signal) {
        let pid = nix::unistd::Pid::from_raw(i32::try_from(self.pid()).unwrap());
        nix::sys::signal::kill(pid, signal).unwrap();
    }

    /// How many lines corral has logged that contain `needle`.
    pub fn count_log(&self, needle: &str) -> usize {
        self.log().lines().filter(|l| l.contains(needle)).count()
    }

    /// Waits (`within` at most) until corral has logged `n` lines containing `needle`.
    pub fn wait_count(&self, needle: &str, n: usize, within: Duration) -> bool {
        let step = Duration::from_millis(10);
        let mut waited = Duration::ZERO;
        while waited < within {
            if self.count_log(needle) >= n {
                return true;
            }
            thread::sleep(step);
            waited += step;
        }
        false
    }
}

/// Negative checks: a line that is absent may only not have been read yet (the log is read
/// on another thread), or its event may still be coming. These look at the log only up to a
/// line corral wrote later, so what they do not find was not logged before it.
impl Corral {
    /// Makes corral log [`MARK`] now (SIGUSR1) and waits (5 s at most) until that line is
    /// read; gives the log up to it. Every line corral wrote before the signal is in it.
    /// The line is at `info`: a configuration with `log_level = "warn"` cannot be marked.
    pub fn mark(&self) -> String {
        let n = self.count_log(MARK);
        self.signal(nix::sys::signal::Signal::SIGUSR1);
        assert!(
            self.wait_count(MARK, n + 1, Duration::from_secs(5)),
            "corral did not log {MARK:?} on SIGUSR1:\n{}",
            self.log()
        );
        let log = self.log();
        let end = log
            .match_indices(MARK)
            .nth(n)
            .map_or(log.len(), |(at, _)| at);
        log[..end].to_owned()
    }

    /// Asserts that corral logged no line containing `needle` before now: checked on the
    /// log up to a [`Corral::mark`] made after the call.
    pub fn assert_absent(&self, needle: &str) {
        let log = self.mark();
        assert!(!log.contains(needle), "{needle:?} in the log:\n{log}");
    }

    /// Asserts that no line before the first one containing `marker` contains `needle`;
    /// waits (5 s at most) for `marker`, a line the test made corral log after the event
    /// that would have logged `needle`.
    pub fn assert_absent_before(&self, needle: &str, marker: &str) {
        assert!(self.wait_log(marker), "no {marker:?} in:\n{}", self.log());
        let log = self.log();
        let end = log.find(marker).unwrap_or(log.len());
        assert!(
            !log[..end].contains(needle),
            "{needle:?} before {marker:?} in the log:\n{log}"
        );
    }

    /// Waits (`within` at most) until corral has exited and its log is complete (its
    /// standard error closed, in every process that shared it); whether it was.
    pub fn wait_exited(&mut self, within: Duration) -> bool {
        let step = Duration::from_millis(10);
        let mut waited = Duration::ZERO;
        loop {
            let exited = matches!(self.child.try_wait(), Ok(Some(_)));
            if exited && self.closed.load(Ordering::Acquire) {
                return true;
            }
            if waited >= within {
                return false;
            }
            thread::sleep(step);
            waited += step;
        }
    }
}

/// Sets its flag when dropped: when the log reader ends, also by a panic.
struct SetOnDrop(Arc<AtomicBool>);

impl Drop for SetOnDrop {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Release);
    }
}

/// One counter of the first pool named `pool` on the status listener at `status`, from its
/// JSON page (`/status?json`, php-fpm's names: "listen queue", "in flight", "accepted conn").
pub fn pool_counter(status: SocketAddr, pool: &str, name: &str) -> u64 {
    let page = http(status, "GET", "/status?json", &[], b"").text();
    let row = page
        .split("{\"pool\":")
        .find(|row| row.starts_with(&format!("\"{pool}\"")))
        .unwrap_or_else(|| panic!("no pool {pool} on the status page: {page}"));
    let key = format!("\"{name}\":");
    row.split(&key)
        .nth(1)
        .and_then(|rest| {
            let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
            digits.parse().ok()
        })
        .unwrap_or_else(|| panic!("no counter {name:?} for pool {pool}: {page}"))
}

impl Drop for Corral {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A child killed and reaped when dropped, until it is taken.
struct KillOnDrop(Option<Child>);

impl KillOnDrop {
    fn get(&mut self) -> &mut Child {
        self.0.as_mut().expect("not taken yet")
    }

    fn take(&mut self) -> Child {
        self.0.take().expect("taken once")
    }
}

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        if let Some(child) = self.0.as_mut() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// The value of `name=` in a log line (up to the next space).
fn field(line: &str, name: &str) -> Option<String> {
    let start = line.find(name)? + name.len();
    let rest = &line[start..];
    Some(rest.split_whitespace().next()?.trim_matches('"').to_owned())
}

/// An HTTP response as the client saw it.
#[derive(Debug, Clone)]
pub struct HttpResponse {
    /// Status code.
    pub status: u16,
    /// Header fields, names lowercase.
    pub headers: Vec<(String, String)>,
    /// The body, de-chunked.
    pub body: Vec<u8>,
}

impl HttpResponse {
    /// The first header named `name` (lowercase).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }

    /// The body as text.
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
}

/// Sends one request and reads the whole response (30 s at most).
pub fn http(
    addr: SocketAddr,
    method: &str,
    target: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> HttpResponse {
    let mut s = TcpStream::connect(addr).expect("connect to corral");
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let mut head = format!("{method} {target} HTTP/1.1\r\nConnection: close\r\n");
    if !headers.iter().any(|(n, _)| n.eq_ignore_ascii_case("host")) {
        head.push_str("Host: localhost\r\n");
    }
    for (n, v) in headers {
        head.push_str(&format!("{n}: {v}\r\n"));
    }
    if !body.is_empty()
        && !headers
            .iter()
            .any(|(n, _)| n.eq_ignore_ascii_case("transfer-encoding"))
    {
        head.push_str(&format!("Content-Length: {}\r\n", body.len()));
    }
    head.push_str("\r\n");
    s.write_all(head.as_bytes()).unwrap();
    s.write_all(body).unwrap();
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).expect("read the response");
    parse_response(&raw)
}

/// Parses a complete HTTP/1.1 response (one, read to EOF).
pub fn parse_response(raw: &[u8]) -> HttpResponse {
    let end = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .unwrap_or_else(|| panic!("no response head in {:?}", String::from_utf8_lossy(raw)));
    let head = std::str::from_utf8(&raw[..end]).expect("ASCII head");
    let mut lines = head.split("\r\n");
    let status_line = lines.next().unwrap();
    let status = status_line
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("bad status line {status_line:?}"));
    let headers: Vec<(String, String)> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(n, v)| (n.trim().to_ascii_lowercase(), v.trim().to_owned()))
        .collect();
    let rest = &raw[end + 4..];
    let chunked = headers
        .iter()
        .any(|(n, v)| n == "transfer-encoding" && v.contains("chunked"));
    let body = if chunked {
        dechunk(rest)
    } else {
        rest.to_vec()
    };
    HttpResponse {
        status,
        headers,
        body,
    }
}

fn dechunk(mut rest: &[u8]) -> Vec<u8> {
    let mut body = Vec::new();
    loop {
        let line_end = rest
            .windows(2)
            .position(|w| w == b"\r\n")
            .expect("chunk size line");
        let size_text = std::str::from_utf8(&rest[..line_end]).unwrap();
        let size = usize::from_str_radix(size_text.split(';').next().unwrap().trim(), 16)
            .expect("hex chunk size");
        rest = &rest[line_end + 2..];
        if size == 0 {
            return body;
        }
        body.extend_from_slice(&rest[..size]);
        rest = &rest[size + 2..];
    }
}
