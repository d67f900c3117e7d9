//! Finding and steering a running corral through its configuration file, the way
//! `php-fpm`'s and nginx's `-s` users expect: `corral run` writes its pid to
//! `RUNTIME_DIR/corral.pid` (mode 0600, in the private runtime directory), and
//! `corral stop [--fast]`, `corral restart-workers` and `corral status` read it back from the
//! same file's `runtime_dir` and signal the process (or, for `status`, ask its status
//! listener).

use std::io::{self, Read, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::config::{Bind, Config};

/// The pid file's name inside the runtime directory.
pub const PID_FILE: &str = "corral.pid";

/// Where the pid of the corral serving `config` is kept.
pub fn pid_path(config: &Config) -> PathBuf {
    config.server.runtime_dir.join(PID_FILE)
}

/// The pid file of a running corral: written at start, removed when dropped (a clean exit).
#[derive(Debug)]
pub struct PidFile {
    path: PathBuf,
}

impl PidFile {
    /// Writes this process's pid to `path`, replacing what is there (as nginx and php-fpm
    /// do: the newest instance is the one the commands reach; a live process named there is
    /// reported, since two corrals sharing a runtime_dir is rarely meant). The runtime
    /// directory is private (0700/0711, checked at start); the file is created 0600 and never
    /// through a symlink.
    pub fn create(path: &Path) -> io::Result<PidFile> {
        match read_pid(path) {
            Ok(Some(pid)) if pid != std::process::id() && alive(pid) => tracing::warn!(
                pid,
                file = %path.display(),
                "another running process is named in the pid file: two corrals share this \
                 runtime_dir; the commands will reach this one"
            ),
            _ => {}
        }
        // Another corral starting beside this one in the same runtime_dir may create the file
        // between the removal and the creation: then this one takes it over (the warning
        // above says what that means), a few times at most.
        let mut tries = 0;
        let mut file = loop {
            match std::fs::remove_file(path) {
                Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(e),
                _ => {}
            }
            let created = std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .custom_flags(nix::libc::O_NOFOLLOW)
                .open(path);
            match created {
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists && tries < 5 => tries += 1,
                other => break other?,
            }
        };
        writeln!(file, "{}", std::process::id())?;
        Ok(PidFile {
            path: path.to_path_buf(),
        })
    }
}

impl Drop for PidFile {
    fn drop(&mut self) {
        if read_pid(&self.path).ok().flatten() == Some(std::process::id()) {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

/// The pid in `path`; `None` when there is no such file.
pub fn read_pid(path: &Path) -> io::Result<Option<u32>> {
    let mut text = String::new();
    match std::fs::File::open(path) {
        Ok(mut f) => f.read_to_string(&mut text)?,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e),
    };
    text.trim().parse().map(Some).map_err(|_| {
        io::Error::new(
            io::ErrorKind::InvalidData,
            format!("{} does not hold a pid", path.display()),
        )
    })
}

/// Whether process `pid` exists (and is not a zombie).
fn alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .map(|s| {
            !s.rsplit_once(')')
                .is_some_and(|(_, rest)| rest.trim_start().starts_with('Z'))
        })
        .unwrap_or(false)
}

/// The pid of the corral serving `config`, running now.
pub fn running_pid(config: &Config) -> io::Result<u32> {
    let path = pid_path(config);
    match read_pid(&path)? {
        Some(pid) if alive(pid) => Ok(pid),
        Some(pid) => Err(io::Error::new(
            io::ErrorKind::NotFound,
            format!(
                "{} names process {pid}, which is gone: corral is not running",
                path.display()
            ),
        )),
        None => Err(io::Error::new(
            io::ErrorKind::NotFound,
            format!(
                "no {}: corral is not running with this configuration",
                path.display()
            ),
        )),
    }
}

/// Sends `signal` to the corral serving `config`; its pid.
pub fn signal(config: &Config, signal: nix::sys::signal::Signal) -> io::Result<u32> {
    let pid = running_pid(config)?;
    let raw = i32::try_from(pid).map_err(|_| io::Error::other("pid out of range"))?;
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(raw), signal).map_err(io::Error::from)?;
    Ok(pid)
}

/// Waits up to `bound` for process `pid` to exit; whether it did.
pub fn wait_exit(pid: u32, bound: Duration) -> bool {
    let step = Duration::from_millis(50);
    let mut waited = Duration::ZERO;
    while waited < bound {
        if !alive(pid) {
            return true;
        }
        std::thread::sleep(step);
        waited += step;
    }
    !alive(pid)
}

/// The status listener's `/status` page (`path_and_query` such as `/status?full`), fetched
/// with a plain HTTP/1.0 request.
pub fn fetch_status(config: &Config, path_and_query: &str) -> io::Result<String> {
    let Some(status) = &config.status else {
        return Err(io::Error::new(
            io::ErrorKind::NotFound,
            "the configuration has no [status] listener to ask",
        ));
    };
    // A loopback name, which the status listener always answers (`status::host`).
    let request = format!("GET {path_and_query} HTTP/1.0\r\nHost: localhost\r\n\r\n");
    let mut raw = Vec::new();
    match &status.bind {
        Bind::Tcp { addr, .. } => {
            let mut s = std::net::TcpStream::connect_timeout(addr, Duration::from_secs(5))?;
            s.set_read_timeout(Some(Duration::from_secs(10)))?;
            s.write_all(request.as_bytes())?;
            s.read_to_end(&mut raw)?;
        }
        Bind::Unix { path, .. } => {
            let mut s = std::os::unix::net::UnixStream::connect(path)?;
            s.set_read_timeout(Some(Duration::from_secs(10)))?;
            s.write_all(request.as_bytes())?;
            s.read_to_end(&mut raw)?;
        }
    }
    let text = String::from_utf8_lossy(&raw);
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    if !head.starts_with("HTTP/1.1 200") && !head.starts_with("HTTP/1.0 200") {
        return Err(io::Error::other(format!(
            "the status listener answered {}",
            head.lines().next().unwrap_or("nothing")
        )));
    }
    Ok(body.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pid_file_is_ours_until_dropped_and_a_live_one_is_not_taken() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(PID_FILE);
        {
            let _ours = PidFile::create(&path).unwrap();
            assert_eq!(read_pid(&path).unwrap(), Some(std::process::id()));
        }
        assert!(!path.exists(), "removed on drop");
        // A file naming a process that is gone is replaced.
        std::fs::write(&path, "999999999\n").unwrap();
        let ours = PidFile::create(&path).unwrap();
        assert_eq!(read_pid(&path).unwrap(), Some(std::process::id()));
        drop(ours);
        // One naming a live process (pid 1) is replaced too (with a warning), and kept when
        // that other process's file is no longer ours to remove.
        std::fs::write(&path, "1\n").unwrap();
        let ours = PidFile::create(&path).unwrap();
        assert_eq!(read_pid(&path).unwrap(), Some(std::process::id()));
        std::fs::write(&path, "1\n").unwrap();
        drop(ours);
        assert_eq!(
            read_pid(&path).unwrap(),
            Some(1),
            "not removed: not ours any more"
        );
    }
}
