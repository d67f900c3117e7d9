//! Real backends for the backend-exchange tests: php-cgi, lsphp and small Python apps, each
//! started in its own temp dir and process group, waited for by polling its socket with a
//! deadline, and killed (group and all) when the guard is dropped, also on panic.

use std::io::{BufRead, BufReader};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::thread;
use std::time::Duration;

use bytes::Bytes;

/// How long a peer may take to start listening.
pub const START: Duration = Duration::from_secs(20);

/// php-cgi as Debian installs it.
pub const PHP_CGI: &str = "/usr/bin/php-cgi";
/// lsphp as the setup script builds and caches it.
pub const LSPHP: &str = "/var/cache/corral/lsphp-8.2/lsphp";
/// The OPcache zend_extension built with that lsphp and installed beside it.
pub const LSPHP_OPCACHE: &str = "/var/cache/corral/lsphp-8.2/opcache.so";

/// A started peer: killed with its whole process group, then reaped, when dropped.
pub struct Peer {
    child: Child,
    /// The peer's listening socket.
    pub socket: PathBuf,
}

impl Peer {
    /// Starts `cmd` in a new process group, to listen on `socket`.
    pub fn spawn(mut cmd: Command, socket: &Path) -> Peer {
        cmd.process_group(0).stdin(Stdio::null());
        let child = cmd
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {cmd:?}: {e}"));
        Peer {
            child,
            socket: socket.to_path_buf(),
        }
    }

    /// The peer's pid (its process group id too).
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Waits until the socket accepts a connection, or panics after [`START`]. The probe
    /// connection is closed at once; the peers tested here treat that as a client that
    /// went away.
    pub fn wait_connectable(mut self) -> Peer {
        let mut waited = Duration::ZERO;
        let step = Duration::from_millis(10);
        loop {
            if std::os::unix::net::UnixStream::connect(&self.socket).is_ok() {
                return self;
            }
            if let Ok(Some(status)) = self.child.try_wait() {
                panic!("peer for {} exited early: {status}", self.socket.display());
            }
            assert!(
                waited < START,
                "peer did not listen on {} within {START:?}",
                self.socket.display()
            );
            thread::sleep(step);
            waited += step;
        }
    }

    /// Waits for the line `ready` on the peer's standard output (which must be piped), or
    /// panics after [`START`].
    pub fn wait_ready_line(mut self) -> Peer {
        let stdout = self.child.stdout.take().expect("peer stdout is piped");
        let (tx, rx) = mpsc::channel();
        thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if line.trim() == "ready" {
                    let _ = tx.send(());
                }
            }
        });
        rx.recv_timeout(START)
            .unwrap_or_else(|_| panic!("peer for {} never said ready", self.socket.display()));
        self
    }
}

impl Drop for Peer {
    fn drop(&mut self) {
        // The group id is the child's pid (process_group(0)); the group holds its forks.
        let _ = Command::new("kill")
            .args(["-KILL", "--", &format!("-{}", self.child.id())])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A temp dir that unprivileged peers (lsphp runs as `nobody`) can read and write: sticky,
/// as /tmp is, so that a runtime directory inside it passes corral's check of its parents
/// (nobody else may rename it away).
pub fn shared_dir() -> tempfile::TempDir {
    let dir = tempfile::Builder::new()
        .prefix("corral-backend-")
        .tempdir()
        .expect("create temp dir");
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o1777))
        .expect("chmod temp dir");
    dir
}

/// Writes `text` to `dir/name`, readable by everyone, and returns the path.
pub fn write_file(dir: &Path, name: &str, text: &str) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, text).expect("write file");
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).expect("chmod file");
    path
}

/// php-cgi serving FastCGI on `dir/php.sock`, one request at a time, never exiting on its
/// own (ARCHITECTURE.md decision 3), with errors sent to FastCGI STDERR.
pub fn php_cgi(dir: &Path) -> Peer {
    let socket = dir.join("php.sock");
    let mut cmd = Command::new(PHP_CGI);
    cmd.env_clear()
        .env("PATH", "/usr/bin:/bin")
        .env("PHP_FCGI_CHILDREN", "0")
        .env("PHP_FCGI_MAX_REQUESTS", "0")
        .args(["-n", "-d", "display_errors=0", "-d", "log_errors=1"])
        .args(["-d", "html_errors=0", "-b"])
        .arg(&socket)
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    Peer::spawn(cmd, &socket).wait_connectable()
}

/// lsphp serving LSAPI on `dir/lsphp.sock` as `nobody` (as root it would serve one
/// connection and exit).
pub fn lsphp(dir: &Path) -> Peer {
    let socket = dir.join("lsphp.sock");
    let mut cmd = Command::new("setpriv");
    cmd.args(["--reuid=nobody", "--regid=nogroup", "--clear-groups", LSPHP])
        .args(["-n", "-b"])
        .arg(&socket)
        .env_clear()
        .env("PATH", "/usr/bin:/bin")
        .env("LSAPI_MAX_IDLE", "-1")
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    Peer::spawn(cmd, &socket).wait_connectable()
}

/// `python3 SCRIPT SOCKET`, waited for by its `ready` line when `ready_line`, else by
/// connecting to `socket`.
pub fn python(script: &Path, socket: &Path, ready_line: bool) -> Peer {
    let mut cmd = Command::new("python3");
    cmd.arg(script).arg(socket).stderr(Stdio::null());
    if ready_line {
        cmd.stdout(Stdio::piped());
        Peer::spawn(cmd, socket).wait_ready_line()
    } else {
        cmd.stdout(Stdio::null());
        Peer::spawn(cmd, socket).wait_connectable()
    }
}

/// CGI parameters for `method` on the script `script` (absolute), with `query` and extra
/// pairs appended.
pub fn cgi_params(
    method: &str,
    script: &Path,
    query: &str,
    extra: &[(&str, &str)],
) -> Vec<(Bytes, Bytes)> {
    let name = format!(
        "/{}",
        script.file_name().and_then(|n| n.to_str()).unwrap_or("")
    );
    let uri = if query.is_empty() {
        name.clone()
    } else {
        format!("{name}?{query}")
    };
    let root = script.parent().map(|p| p.display().to_string());
    let mut pairs = vec![
        ("GATEWAY_INTERFACE", "CGI/1.1".to_string()),
        ("SERVER_SOFTWARE", "corral-test".to_string()),
        ("SERVER_PROTOCOL", "HTTP/1.1".to_string()),
        ("SERVER_NAME", "localhost".to_string()),
        ("SERVER_PORT", "80".to_string()),
        ("REMOTE_ADDR", "127.0.0.1".to_string()),
        ("REQUEST_METHOD", method.to_string()),
        ("REQUEST_URI", uri),
        ("SCRIPT_NAME", name),
        ("SCRIPT_FILENAME", script.display().to_string()),
        ("DOCUMENT_ROOT", root.unwrap_or_default()),
        ("QUERY_STRING", query.to_string()),
        ("REDIRECT_STATUS", "200".to_string()),
        ("HTTP_HOST", "localhost".to_string()),
    ];
    pairs.extend(extra.iter().map(|(n, v)| (*n, v.to_string())));
    pairs
        .into_iter()
        .map(|(n, v)| (Bytes::from(n.to_string()), Bytes::from(v)))
        .collect()
}

/// md5 of `bytes` as lowercase hex, computed by `md5sum` (no hashing crate needed).
pub fn md5_hex(dir: &Path, bytes: &[u8]) -> String {
    let path = dir.join("md5-input");
    std::fs::write(&path, bytes).expect("write md5 input");
    let out = Command::new("md5sum")
        .arg(&path)
        .output()
        .expect("run md5sum");
    std::fs::remove_file(&path).expect("remove md5 input");
    String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .next()
        .expect("md5sum output")
        .to_string()
}

/// A PHP script that leaks as an app would: each request compiles a fresh script of
/// `entries` array entries (each padded with `pad` bytes) that OPcache keeps in its shared
/// memory for the life of the process, so php-cgi grows by that much per request. Answers
/// with its pid. `tag` keeps the temporary scripts of different tests apart.
pub fn leaking_php(tag: &str, entries: usize, pad: usize) -> String {
    format!(
        r#"<?php
$n = (int)($_GET['n'] ?? 0);
$file = sys_get_temp_dir() . "/corral-{tag}-" . getmypid() . "-$n.php";
$body = '<?php return [';
for ($i = 0; $i < {entries}; $i++) {{ $body .= "'k$n-$i' => 'value-$n-$i-" . str_repeat('x', {pad}) . "',"; }}
file_put_contents($file, $body . '];');
$a = include $file;
unlink($file);
echo getmypid();
"#
    )
}
