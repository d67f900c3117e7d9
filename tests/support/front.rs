//! Front-listener tests: the real `corral` binary serving a unix-socket front listener, a real
//! nginx in front of it, and curl as the client.
//!
//! Every process is started in its own temp dir, waited for by polling with a deadline (a
//! socket that accepts, a port that answers), and killed and reaped by its guard, also when
//! the test panics. Ports are picked by binding 127.0.0.1:0 and released for nginx, which
//! cannot listen on port 0; a start that loses the port to someone else is retried.

use std::io::{BufRead, BufReader};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::Duration;

use tokio::time::Instant;

use super::peers::Peer;
use super::CORRAL;

/// How long corral or nginx may take to start listening.
const START: Duration = Duration::from_secs(20);
/// Step of the readiness polls.
const POLL: Duration = Duration::from_millis(10);

/// A running `corral run -c FILE`: its stderr is collected; killed and reaped on drop.
pub struct Corral {
    child: Child,
    log: Arc<Mutex<String>>,
    /// The front listener's socket.
    pub socket: PathBuf,
}

impl Corral {
    /// Writes `config` to `dir/corral.toml`, starts corral on it and waits until `socket`
    /// (its front listener) accepts a connection.
    pub fn start(dir: &Path, config: &str, socket: &Path) -> Corral {
        let file = dir.join("corral.toml");
        std::fs::write(&file, config).expect("write corral config");
        let mut child = Command::new(CORRAL)
            .args(["run", "-c"])
            .arg(&file)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start corral");
        let stderr = child.stderr.take().expect("stderr is piped");
        let log = Arc::new(Mutex::new(String::new()));
        let sink = Arc::clone(&log);
        thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                let mut log = sink.lock().unwrap();
                log.push_str(&line);
                log.push('\n');
            }
        });
        let mut corral = Corral {
            child,
            log,
            socket: socket.to_path_buf(),
        };
        let deadline = Instant::now() + START;
        while std::os::unix::net::UnixStream::connect(socket).is_err() {
            if let Ok(Some(status)) = corral.child.try_wait() {
                panic!("corral exited early ({status}):\n{}", corral.log());
            }
            assert!(
                Instant::now() < deadline,
                "corral did not listen on {} within {START:?}:\n{}",
                socket.display(),
                corral.log()
            );
            thread::sleep(POLL);
        }
        corral
    }

    /// corral's pid.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Everything corral logged so far.
    pub fn log(&self) -> String {
        self.log.lock().unwrap().clone()
    }

    /// Waits until corral's log contains `text`, or panics after `within`.
    pub fn wait_log(&self, text: &str, within: Duration) -> String {
        let deadline = Instant::now() + within;
        loop {
            let log = self.log();
            if log.contains(text) {
                return log;
            }
            assert!(
                Instant::now() < deadline,
                "corral never logged {text:?}:\n{log}"
            );
            thread::sleep(POLL);
        }
    }
}

impl Drop for Corral {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A port that was free a moment ago. Another test may take it before the caller binds it:
/// start servers with [`spawn_on_free_port`], which notices and tries another.
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("bind 127.0.0.1:0")
        .port()
}

/// Whether process `pid` itself holds the socket listening on 127.0.0.1:`port` (matched by
/// inode between /proc/net/tcp and /proc/PID/fd), so a server of another test that took the
/// port is never mistaken for this one.
pub fn listens_on(pid: u32, port: u16) -> bool {
    let local = format!("0100007F:{port:04X}");
    let Ok(table) = std::fs::read_to_string("/proc/net/tcp") else {
        return false;
    };
    let inodes: Vec<String> = table
        .lines()
        .skip(1)
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            let inode = f.get(9)?;
            (f.get(1) == Some(&local.as_str()) && f.get(3) == Some(&"0A"))
                .then(|| format!("socket:[{inode}]"))
        })
        .collect();
    std::fs::read_dir(format!("/proc/{pid}/fd")).is_ok_and(|fds| {
        fds.flatten().any(|fd| {
            std::fs::read_link(fd.path())
                .is_ok_and(|t| inodes.iter().any(|i| t.as_os_str() == i.as_str()))
        })
    })
}

/// Starts the server `command(port)` makes for a port that was free, and waits until that
/// very process listens on it ([`listens_on`]). If the port was taken between the choice
/// and the server's bind, the server exits: that is said on stderr and another port is
/// tried, five times at most. The child and its port.
pub fn spawn_on_free_port(mut command: impl FnMut(u16) -> Command) -> (Child, u16) {
    for attempt in 1..=5 {
        let port = free_port();
        let mut cmd = command(port);
        let mut child = cmd
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {cmd:?}: {e}"));
        let deadline = Instant::now() + START;
        loop {
            if let Some(status) = child.try_wait().expect("try_wait") {
                eprintln!(
                    "{cmd:?} exited ({status}) before listening on port {port}, taken \
                     meanwhile by another test? (attempt {attempt} of 5; trying another port)"
                );
                break;
            }
            if listens_on(child.id(), port) {
                return (child, port);
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                panic!("{cmd:?} did not listen on port {port} within {START:?}");
            }
            thread::sleep(POLL);
        }
    }
    panic!("no server could bind a free port in five attempts");
}

/// A running nginx (`daemon off; master_process off;`, everything in its temp dir): killed
/// and reaped on drop.
pub struct Nginx {
    child: Child,
    dir: PathBuf,
    /// The ports its server blocks listen on, in the order given.
    pub ports: Vec<u16>,
}

impl Nginx {
    /// Starts nginx in `dir` with one `server` block per entry of `servers` (the block's body;
    /// `listen` is added), inside an `http` block that starts with `http_extra`. Picks free
    /// ports, and retries with new ones when nginx loses one to another process.
    pub fn start(dir: &Path, http_extra: &str, servers: &[String]) -> Nginx {
        Nginx::start_via(&[], dir, http_extra, servers)
    }

    /// Like [`Nginx::start`], with nginx started through `wrapper` (a program and its
    /// arguments, such as `setpriv --pdeathsig TERM --`), which must exec nginx in its own
    /// place.
    pub fn start_via(wrapper: &[&str], dir: &Path, http_extra: &str, servers: &[String]) -> Nginx {
        for _ in 0..5 {
            let ports: Vec<u16> = servers.iter().map(|_| free_port()).collect();
            let conf = nginx_conf(dir, http_extra, servers, &ports);
            let conf_path = dir.join("nginx.conf");
            std::fs::write(&conf_path, conf).expect("write nginx.conf");
            let error_log = dir.join("nginx-error.log");
            let _ = std::fs::remove_file(&error_log);
            let mut cmd = match wrapper.split_first() {
                Some((program, args)) => {
                    let mut c = Command::new(program);
                    c.args(args).arg("/usr/sbin/nginx");
                    c
                }
                None => Command::new("/usr/sbin/nginx"),
            };
            let child = cmd
                .arg("-p")
                .arg(dir)
                .arg("-c")
                .arg(&conf_path)
                .arg("-e")
                .arg(&error_log)
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .expect("start nginx");
            let mut nginx = Nginx {
                child,
                dir: dir.to_path_buf(),
                ports,
            };
            if nginx.wait_listening() {
                return nginx;
            }
            let log = nginx.error_log();
            assert!(
                log.contains("Address already in use"),
                "nginx did not start:\n{log}"
            );
        }
        panic!("nginx lost its port to another process five times");
    }

    /// Polls until every port answers (true) or nginx exits (false); panics after [`START`].
    fn wait_listening(&mut self) -> bool {
        let deadline = Instant::now() + START;
        loop {
            if let Ok(Some(_)) = self.child.try_wait() {
                return false;
            }
            if self
                .ports
                .iter()
                .all(|p| TcpStream::connect(("127.0.0.1", *p)).is_ok())
            {
                return true;
            }
            assert!(
                Instant::now() < deadline,
                "nginx did not listen within {START:?}:\n{}",
                self.error_log()
            );
            thread::sleep(POLL);
        }
    }

    /// nginx's error log so far.
    /// nginx's pid (with `master_process off`, its only process).
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn error_log(&self) -> String {
        std::fs::read_to_string(self.dir.join("nginx-error.log")).unwrap_or_default()
    }

    /// `http://127.0.0.1:PORT` of server block `i`.
    pub fn url(&self, i: usize) -> String {
        format!("http://127.0.0.1:{}", self.ports[i])
    }
}

impl Drop for Nginx {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn nginx_conf(dir: &Path, http_extra: &str, servers: &[String], ports: &[u16]) -> String {
    let d = dir.display();
    let mut conf = format!(
        "daemon off;\nmaster_process off;\nworker_processes 1;\npid {d}/nginx.pid;\n\
         error_log {d}/nginx-error.log info;\nevents {{ worker_connections 64; }}\n\
         http {{\n  access_log off;\n  client_max_body_size 64m;\n\
         client_body_temp_path {d}/client_body;\n  proxy_temp_path {d}/proxy;\n\
         fastcgi_temp_path {d}/fastcgi;\n  uwsgi_temp_path {d}/uwsgi;\n\
         scgi_temp_path {d}/scgi;\n{http_extra}\n"
    );
    for (server, port) in servers.iter().zip(ports) {
        conf.push_str(&format!(
            "  server {{\n    listen 127.0.0.1:{port};\n    server_name localhost;\n{server}\n  }}\n"
        ));
    }
    conf.push_str("}\n");
    conf
}

/// The top-level `{ ... }` blocks of an nginx snippet that start with `keyword`, as
/// (header line, body) pairs.
pub fn nginx_blocks(text: &str, keyword: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let mut rest = text;
    while let Some(start) = rest
        .find(&format!("\n{keyword} "))
        .or_else(|| rest.starts_with(&format!("{keyword} ")).then_some(0))
    {
        let block = &rest[start..];
        let open = block.find('{').unwrap();
        let mut depth = 0;
        let mut end = open;
        for (i, c) in block[open..].char_indices() {
            match c {
                '{' => depth += 1,
                '}' => {
                    depth -= 1;
                    if depth == 0 {
                        end = open + i;
                        break;
                    }
                }
                _ => {}
            }
        }
        out.push((
            block[..open].trim().to_owned(),
            block[open + 1..end].to_owned(),
        ));
        rest = &block[end + 1..];
    }
    out
}

/// php-cgi like [`super::peers::php_cgi`], with `ini` settings (`-d` values) added.
pub fn php_cgi_with(dir: &Path, ini: &[&str]) -> Peer {
    let socket = dir.join("php.sock");
    let mut cmd = Command::new(super::peers::PHP_CGI);
    cmd.env_clear()
        .env("PATH", "/usr/bin:/bin")
        .env("PHP_FCGI_CHILDREN", "0")
        .env("PHP_FCGI_MAX_REQUESTS", "0")
        .args(["-n", "-d", "display_errors=0", "-d", "log_errors=1"])
        .args(["-d", "html_errors=0"]);
    for setting in ini {
        cmd.args(["-d", setting]);
    }
    cmd.arg("-b")
        .arg(&socket)
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    Peer::spawn(cmd, &socket).wait_connectable()
}

/// An HTTP response as curl saw it.
#[derive(Debug, Clone)]
pub struct Response {
    /// Status code.
    pub status: u16,
    /// Header fields in order, names lowercase.
    pub headers: Vec<(String, String)>,
    /// The body.
    pub body: Vec<u8>,
}

impl Response {
    /// The first header named `name` (lowercase).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }

    /// Every header named `name` (lowercase).
    pub fn all(&self, name: &str) -> Vec<&str> {
        self.headers
            .iter()
            .filter(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
            .collect()
    }

    /// The body as text.
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
}

/// Runs `curl -sS -i ARGS... URL` (60 s at most) and parses what it printed.
pub fn curl(url: &str, args: &[&str]) -> Response {
    let out = Command::new("curl")
        .args(["-sS", "-i", "--max-time", "60", "-H", "Expect:"])
        .args(args)
        .arg(url)
        .stdin(Stdio::null())
        .output()
        .expect("run curl");
    assert!(
        out.status.success(),
        "curl {url} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    parse(&out.stdout)
}

/// Parses curl's `-i` output: interim 1xx heads are skipped.
fn parse(mut raw: &[u8]) -> Response {
    loop {
        let end = raw
            .windows(4)
            .position(|w| w == b"\r\n\r\n")
            .unwrap_or_else(|| panic!("no response head in {:?}", String::from_utf8_lossy(raw)));
        let head = String::from_utf8_lossy(&raw[..end]).into_owned();
        raw = &raw[end + 4..];
        let mut lines = head.split("\r\n");
        let status_line = lines.next().unwrap_or_default();
        let status: u16 = status_line
            .split(' ')
            .nth(1)
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(|| panic!("bad status line {status_line:?}"));
        if (100..200).contains(&status) {
            continue;
        }
        let headers = lines
            .filter_map(|l| l.split_once(':'))
            .map(|(n, v)| (n.trim().to_ascii_lowercase(), v.trim().to_owned()))
            .collect();
        return Response {
            status,
            headers,
            body: raw.to_vec(),
        };
    }
}

/// Connected Unix sockets (state 03 in /proc/net/unix) bound to `path`: corral's accepted
/// front connections, plus none for the listener itself (state 01).
pub fn connected_unix_sockets(path: &Path) -> usize {
    let table = std::fs::read_to_string("/proc/net/unix").expect("read /proc/net/unix");
    let path = path.to_string_lossy();
    table
        .lines()
        .filter(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            fields.len() >= 8 && fields[5] == "03" && fields[7] == path
        })
        .count()
}
