//! Shared by the application tests (`tests/app_*.rs`): real frameworks behind the real corral
//! binary, started once per test binary, and a browser's side of HTTP (cookies, forms,
//! multipart uploads, streamed bodies).
//!
//! A framework boots in seconds (Rails in several), so each test binary starts its apps and
//! its corral once, in [`shared`], and its tests use them concurrently. Nothing in a `static`
//! is dropped, so the fixture's cleanup cannot be a guard: a [`Reaper`] process, started
//! first, holds the read end of a pipe whose write end only this test binary has; when the
//! binary exits, however it ends, the pipe closes, and the reaper kills corral (its workers
//! follow it through their parent-death signal) and removes the fixture's directory.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{ChildStdin, Command, Stdio};
use std::sync::{Mutex, OnceLock};
use std::time::Duration;

use super::server::{http, parse_response, Corral, HttpResponse};

/// Builds a test binary's fixture once, on first use; every later caller gets the same one,
/// or the same failure (a failed start is not retried by each test).
pub fn shared<T: Send + Sync + 'static>(
    cell: &'static OnceLock<Result<T, String>>,
    make: impl FnOnce() -> T,
) -> &'static T {
    let made = cell.get_or_init(|| {
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(make)).map_err(|panic| {
            panic
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| panic.downcast_ref::<&str>().map(|s| (*s).to_owned()))
                .unwrap_or_else(|| "a non-text panic".to_owned())
        })
    });
    match made {
        Ok(fixture) => fixture,
        Err(message) => panic!("the shared fixture did not start:\n{message}"),
    }
}

/// Cleans up after the test binary once it exits (see the module comment).
pub struct Reaper {
    pipe: Mutex<ChildStdin>,
    /// The fixture's directory: readable by everyone, removed when the binary exits.
    pub dir: PathBuf,
}

impl Reaper {
    /// A fresh directory (mode 0755, so workers running as `nobody` can read the apps in
    /// it) and the reaper that removes it.
    pub fn start(prefix: &str) -> Reaper {
        let dir = tempfile::Builder::new()
            .prefix(prefix)
            .tempdir()
            .expect("create the fixture dir")
            .keep();
        chmod(&dir, 0o755);
        // Pids to kill and absolute paths of files to remove come in on stdin, one a line;
        // EOF means the test binary is gone.
        let mut child = Command::new("/bin/sh")
            .arg("-c")
            .arg(
                "pids=; files=; while read -r x; do case $x in /*) files=\"$files $x\";; \
                 *) pids=\"$pids $x\";; esac; done; \
                 [ -n \"$pids\" ] && kill -KILL $pids 2>/dev/null; \
                 [ -n \"$files\" ] && rm -f -- $files; rm -rf -- \"$0\"",
            )
            .arg(&dir)
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .process_group(0)
            .spawn()
            .expect("start the reaper");
        let pipe = child.stdin.take().expect("the reaper's stdin is piped");
        // The reaper outlives this process by design; it is never waited for.
        std::mem::forget(child);
        Reaper {
            pipe: Mutex::new(pipe),
            dir,
        }
    }

    /// Kills `pid` when the test binary exits.
    pub fn kill_on_exit(&self, pid: u32) {
        let mut pipe = self.pipe.lock().unwrap();
        writeln!(pipe, "{pid}").expect("tell the reaper");
        pipe.flush().unwrap();
    }

    /// Removes the file `path` (absolute, without spaces) when the test binary exits: a
    /// fixture's file outside its directory, such as a config file under /etc.
    pub fn remove_on_exit(&self, path: &Path) {
        let text = path
            .to_str()
            .filter(|p| p.starts_with('/') && !p.contains(char::is_whitespace));
        let path =
            text.unwrap_or_else(|| panic!("{} cannot be passed to the reaper", path.display()));
        let mut pipe = self.pipe.lock().unwrap();
        writeln!(pipe, "{path}").expect("tell the reaper");
        pipe.flush().unwrap();
    }

    /// Starts corral on `config` (written into the fixture's directory) and has it killed
    /// when the test binary exits.
    pub fn corral(&self, config: &str) -> Corral {
        self.corral_listening(config, 1)
    }

    /// [`Reaper::corral`] for a configuration with `listeners` listeners.
    pub fn corral_listening(&self, config: &str, listeners: usize) -> Corral {
        let mut file = tempfile::Builder::new()
            .prefix("corral-")
            .suffix(".toml")
            .tempfile_in(&self.dir)
            .expect("create the config file");
        file.write_all(config.as_bytes()).unwrap();
        let mut cmd = Command::new(super::CORRAL);
        cmd.args(["run", "-c"]).arg(file.path());
        let corral = Corral::start_command(cmd, file, listeners);
        self.kill_on_exit(corral.pid());
        corral
    }
}

/// Sets the mode of `path`.
pub fn chmod(path: &Path, mode: u32) {
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))
        .unwrap_or_else(|e| panic!("chmod {}: {e}", path.display()));
}

/// Writes the files of an app under `dir`, each `(relative path, text)`, creating the
/// directories (0755; files 0644, readable by the workers' user).
pub fn write_tree(dir: &Path, files: &[(&str, &str)]) {
    for (name, text) in files {
        let path = dir.join(name);
        let mut parent = path.parent();
        let mut missing = Vec::new();
        while let Some(p) = parent.filter(|p| !p.exists()) {
            missing.push(p.to_path_buf());
            parent = p.parent();
        }
        for p in missing.iter().rev() {
            std::fs::create_dir(p).unwrap();
            chmod(p, 0o755);
        }
        std::fs::write(&path, text).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        chmod(&path, 0o644);
    }
}

/// A directory the workers (`nobody` under a root corral) may write to.
pub fn writable_dir(path: &Path) -> PathBuf {
    std::fs::create_dir_all(path).unwrap();
    // Sticky, as /tmp: a runtime directory in it passes corral's check of its parents.
    chmod(path, 0o1777);
    path.to_path_buf()
}

/// Runs a set-up command to completion (at most `deadline`), panicking with its output
/// when it fails.
pub fn setup(mut cmd: Command, deadline: Duration) -> String {
    let shown = format!("{cmd:?}");
    cmd.stdin(Stdio::null());
    let out = super::run(cmd, deadline);
    assert_eq!(
        out.code,
        Some(0),
        "{shown} failed:\n{}\n{}",
        out.stdout,
        out.stderr
    );
    out.stdout
}

/// What a browser keeps between requests: its cookies.
#[derive(Debug, Default, Clone)]
pub struct Browser {
    cookies: Vec<(String, String)>,
}

impl Browser {
    /// Sends one request with the cookies so far and keeps those the answer sets.
    pub fn request(
        &mut self,
        addr: SocketAddr,
        method: &str,
        target: &str,
        headers: &[(&str, &str)],
        body: &[u8],
    ) -> HttpResponse {
        let cookie = self.cookie_header();
        let mut all: Vec<(&str, &str)> = headers.to_vec();
        if !cookie.is_empty() {
            all.push(("Cookie", &cookie));
        }
        let r = http(addr, method, target, &all, body);
        for (_, v) in r.headers.iter().filter(|(n, _)| n == "set-cookie") {
            let pair = v.split(';').next().unwrap_or("");
            if let Some((name, value)) = pair.split_once('=') {
                self.cookies.retain(|(n, _)| n != name.trim());
                self.cookies
                    .push((name.trim().to_owned(), value.trim().to_owned()));
            }
        }
        r
    }

    /// GET `target`.
    pub fn get(&mut self, addr: SocketAddr, target: &str) -> HttpResponse {
        self.request(addr, "GET", target, &[], b"")
    }

    /// POSTs `fields` as `application/x-www-form-urlencoded`.
    pub fn post_form(
        &mut self,
        addr: SocketAddr,
        target: &str,
        fields: &[(&str, &str)],
    ) -> HttpResponse {
        let body = form_urlencode(fields);
        self.request(
            addr,
            "POST",
            target,
            &[("Content-Type", "application/x-www-form-urlencoded")],
            body.as_bytes(),
        )
    }

    /// POSTs `fields` and one file as `multipart/form-data`.
    pub fn post_multipart(
        &mut self,
        addr: SocketAddr,
        target: &str,
        fields: &[(&str, &str)],
        file: (&str, &str, &[u8]),
    ) -> HttpResponse {
        let (content_type, body) = multipart(fields, file);
        self.request(
            addr,
            "POST",
            target,
            &[("Content-Type", &content_type)],
            &body,
        )
    }

    /// The value of cookie `name`, if one was set.
    pub fn cookie(&self, name: &str) -> Option<&str> {
        self.cookies
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }

    /// The names of the cookies kept.
    pub fn cookie_names(&self) -> Vec<&str> {
        self.cookies.iter().map(|(n, _)| n.as_str()).collect()
    }

    /// Forgets every cookie.
    pub fn clear(&mut self) {
        self.cookies.clear();
    }

    fn cookie_header(&self) -> String {
        self.cookies
            .iter()
            .map(|(n, v)| format!("{n}={v}"))
            .collect::<Vec<_>>()
            .join("; ")
    }
}

/// `application/x-www-form-urlencoded` text of `fields`.
pub fn form_urlencode(fields: &[(&str, &str)]) -> String {
    let encode = |s: &str| {
        s.bytes()
            .map(|b| match b {
                b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                    (b as char).to_string()
                }
                b' ' => "+".to_owned(),
                _ => format!("%{b:02X}"),
            })
            .collect::<String>()
    };
    fields
        .iter()
        .map(|(k, v)| format!("{}={}", encode(k), encode(v)))
        .collect::<Vec<_>>()
        .join("&")
}

/// A `multipart/form-data` body (and its Content-Type) with `fields` and one file part
/// `(field name, file name, bytes)`, sent as `application/octet-stream`.
pub fn multipart(fields: &[(&str, &str)], file: (&str, &str, &[u8])) -> (String, Vec<u8>) {
    let boundary = "----corral-test-boundary-7MA4YWxkTrZu0gW";
    let mut body = Vec::new();
    for (name, value) in fields {
        body.extend_from_slice(
            format!(
                "--{boundary}\r\nContent-Disposition: form-data; name=\"{name}\"\r\n\r\n{value}\r\n"
            )
            .as_bytes(),
        );
    }
    let (name, filename, data) = file;
    body.extend_from_slice(
        format!(
            "--{boundary}\r\nContent-Disposition: form-data; name=\"{name}\"; \
             filename=\"{filename}\"\r\nContent-Type: application/octet-stream\r\n\r\n"
        )
        .as_bytes(),
    );
    body.extend_from_slice(data);
    body.extend_from_slice(format!("\r\n--{boundary}--\r\n").as_bytes());
    (format!("multipart/form-data; boundary={boundary}"), body)
}

/// The `value` of the `<input>` named `name` in `html`, with the entities HTML escaping
/// puts in attribute values decoded.
pub fn input_value(html: &str, name: &str) -> Option<String> {
    let at = html.find(&format!("name=\"{name}\""))?;
    let start = html[..at].rfind('<')?;
    let end = at + html[at..].find('>')?;
    let tag = &html[start..end];
    let value = tag.split("value=\"").nth(1)?.split('"').next()?;
    Some(
        value
            .replace("&quot;", "\"")
            .replace("&#39;", "'")
            .replace("&#x27;", "'")
            .replace("&#x2F;", "/")
            .replace("&#43;", "+")
            .replace("&#x3D;", "=")
            .replace("&lt;", "<")
            .replace("&gt;", ">")
            .replace("&amp;", "&"),
    )
}

/// `n` bytes that do not repeat in any short period (so a shifted or dropped block shows).
pub fn upload_bytes(n: usize) -> Vec<u8> {
    (0..n)
        .map(|i| ((i as u32).wrapping_mul(2_654_435_761) >> 24) as u8)
        .collect()
}

/// The SHA-256 of `data` in hex, from coreutils' sha256sum (an oracle independent of the
/// apps' own hashing).
pub fn sha256(data: &[u8]) -> String {
    let mut child = Command::new("sha256sum")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("run sha256sum");
    let mut stdin = child.stdin.take().unwrap();
    let input = data.to_vec();
    let writer = std::thread::spawn(move || stdin.write_all(&input));
    let out = child.wait_with_output().unwrap();
    writer.join().unwrap().unwrap();
    String::from_utf8(out.stdout).unwrap()[..64].to_owned()
}

/// A GET whose body is read as it comes: `first` must arrive, without `later`, while the app
/// is still held back (it waits for the file `gate`, which this creates only once `first`
/// was read), then the rest. Returns the whole response. This is what proves a body streams:
/// a buffered one shows `first` only together with `later`.
pub fn streamed_get(
    addr: SocketAddr,
    target: &str,
    (first, later): (&str, &str),
    gate: &Path,
) -> HttpResponse {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    write!(
        s,
        "GET {target} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut raw = Vec::new();
    let mut buf = [0u8; 4096];
    while !String::from_utf8_lossy(&raw).contains(first) {
        let n = s.read(&mut buf).unwrap_or_else(|e| {
            panic!(
                "{target}: no {first:?} before the gate opened ({e}): {:?}",
                String::from_utf8_lossy(&raw)
            )
        });
        assert!(
            n > 0,
            "{target}: closed before {first:?}: {:?}",
            String::from_utf8_lossy(&raw)
        );
        raw.extend_from_slice(&buf[..n]);
    }
    // What arrived so far was sent while the app waited; had the answer been buffered,
    // `later` would have come with it, once the app gave up waiting.
    assert!(
        !String::from_utf8_lossy(&raw).contains(later),
        "{target}: {later:?} came with {first:?}, before the gate opened: not streamed"
    );
    std::fs::write(gate, "").unwrap();
    s.read_to_end(&mut raw).unwrap();
    parse_response(&raw)
}

/// A fresh name for a gate file, unique in this test binary.
pub fn gate_name(tag: &str) -> String {
    static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    format!("{tag}-{}-{n}", std::process::id())
}
