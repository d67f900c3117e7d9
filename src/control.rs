//! Finding and steering a running corral through its configuration file, the way
//! `php-fpm`'s and nginx's `-s` users expect: `corral run` writes its pid to
//! `RUNTIME_DIR/corral.pid` (mode 0600, in the private runtime directory) and holds a write
//! lock on it for as long as it runs, and `corral stop [--fast]`, `corral reload` and
//! `corral restart-workers` read it back from the same file's `runtime_dir` and signal the
//! process (`corral status` asks its status listener instead).
//!
//! A pid file is only a number someone wrote, and a root `corral stop` would send SIGTERM to
//! whatever process it names. So before signalling, the commands check the runtime directory
//! and its parents as `corral run` does (`runtime_dir::check_existing`), open the pid file
//! without following a link and check that it is a regular file of root or of the caller
//! that neither group nor others may write; and then ask the kernel who holds its lock
//! (`F_GETLK`, a POSIX record lock, whose holder's pid the kernel reports, unlike `flock`'s
//! or an OFD lock's): only when the process holding it is the one named is it signalled. A
//! stale file, a forged one, or one naming a process that is not that corral is refused.

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
    /// The open file, whose write lock says this process is the corral named (closing any
    /// descriptor of the file would drop it, so nothing else in corral opens it).
    _locked: std::fs::File,
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
        lock(&file).map_err(|e| {
            io::Error::new(e.kind(), format!("cannot lock {}: {e}", path.display()))
        })?;
        writeln!(file, "{}", std::process::id())?;
        Ok(PidFile {
            path: path.to_path_buf(),
            _locked: file,
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

/// A whole-file write lock (`F_SETLK`) on `file`, held until it is closed.
fn lock(file: &std::fs::File) -> io::Result<()> {
    let l = whole_file(nix::libc::F_WRLCK);
    nix::fcntl::fcntl(file, nix::fcntl::FcntlArg::F_SETLK(&l)).map_err(io::Error::from)?;
    Ok(())
}

/// A `struct flock` covering the whole file.
fn whole_file(kind: i32) -> nix::libc::flock {
    nix::libc::flock {
        l_type: kind as i16,
        l_whence: nix::libc::SEEK_SET as i16,
        l_start: 0,
        l_len: 0,
        l_pid: 0,
    }
}

/// The pid of the process holding a write lock on `file`, if one does.
fn lock_holder(file: &std::fs::File) -> io::Result<Option<u32>> {
    let mut l = whole_file(nix::libc::F_WRLCK);
    nix::fcntl::fcntl(file, nix::fcntl::FcntlArg::F_GETLK(&mut l)).map_err(io::Error::from)?;
    if l.l_type == nix::libc::F_UNLCK as i16 {
        return Ok(None);
    }
    Ok(u32::try_from(l.l_pid).ok())
}

/// Opens the pid file `path` of the runtime directory `dir` for a command that will signal
/// the process it names: the directory checked as `corral run` checks it, the file opened
/// without following a link and checked to be a regular file that only root or the caller
/// owns and may write. `None` when there is no such file.
fn open_checked(dir: &Path, path: &Path) -> io::Result<Option<std::fs::File>> {
    use std::os::unix::fs::MetadataExt;
    crate::runtime_dir::check_existing(dir).map_err(|e| {
        io::Error::new(
            io::ErrorKind::PermissionDenied,
            format!("refusing to trust the pid file {}: {e}", path.display()),
        )
    })?;
    let file = match std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(nix::libc::O_NOFOLLOW | nix::libc::O_NONBLOCK)
        .open(path)
    {
        Ok(f) => f,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) if e.raw_os_error() == Some(nix::libc::ELOOP) => {
            return Err(io::Error::new(
                io::ErrorKind::PermissionDenied,
                format!(
                    "refusing the pid file {}: it is a symbolic link, and corral never writes \
                     one; remove it",
                    path.display()
                ),
            ))
        }
        Err(e) if e.kind() == io::ErrorKind::PermissionDenied => {
            return Err(io::Error::new(
                e.kind(),
                format!(
                    "cannot read the pid file {}: {e}; it belongs to the user corral runs as, \
                     so run this command as that user (or with sudo)",
                    path.display()
                ),
            ))
        }
        Err(e) => {
            return Err(io::Error::new(
                e.kind(),
                format!("cannot open the pid file {}: {e}", path.display()),
            ))
        }
    };
    let meta = file.metadata()?;
    let uid = nix::unistd::Uid::effective().as_raw();
    let refuse = |why: String| {
        Err(io::Error::new(
            io::ErrorKind::PermissionDenied,
            format!("refusing the pid file {}: {why}", path.display()),
        ))
    };
    if !meta.file_type().is_file() {
        return refuse("it is not a regular file".to_owned());
    }
    if meta.uid() != uid && meta.uid() != 0 {
        return refuse(format!(
            "it belongs to uid {}, neither you (uid {uid}) nor root; run this command as the \
             user corral runs as",
            meta.uid()
        ));
    }
    if meta.mode() & 0o022 != 0 {
        return refuse(format!(
            "it has mode {:04o}, writable by its group or by everyone, and corral writes it 0600",
            meta.mode() & 0o7777
        ));
    }
    Ok(Some(file))
}

/// The pid of the corral serving `config`, running now: named in its pid file, and holding
/// that file's lock (see the module documentation).
pub fn running_pid(config: &Config) -> io::Result<u32> {
    let path = pid_path(config);
    let Some(mut file) = open_checked(&config.server.runtime_dir, &path)? else {
        return Err(io::Error::new(
            io::ErrorKind::NotFound,
            format!(
                "no {}: corral is not running with this configuration",
                path.display()
            ),
        ));
    };
    let mut text = String::new();
    // A pid is a few bytes; anything longer is not a pid file corral wrote.
    (&mut file).take(64).read_to_string(&mut text)?;
    let named: u32 = text.trim().parse().map_err(|_| {
        io::Error::new(
            io::ErrorKind::InvalidData,
            format!("{} does not hold a pid", path.display()),
        )
    })?;
    match lock_holder(&file)? {
        Some(holder) if holder == named => Ok(named),
        Some(holder) => Err(io::Error::new(
            io::ErrorKind::PermissionDenied,
            format!(
                "refusing to signal process {named}: {} names it, but its lock is held by \
                 process {holder}, so it is not the corral of this runtime directory",
                path.display()
            ),
        )),
        None if alive(named) => Err(io::Error::new(
            io::ErrorKind::PermissionDenied,
            format!(
                "refusing to signal process {named}: {} names it, but no corral holds the \
                 file's lock, so it is not the corral of {} (a stale or forged pid file); \
                 corral is not running with this configuration",
                path.display(),
                config.server.runtime_dir.display()
            ),
        )),
        None => Err(io::Error::new(
            io::ErrorKind::NotFound,
            format!(
                "{} names process {named}, which is gone: corral is not running",
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

/// Waits up to `bound` for the corral `pid` to finish the reload it was just asked for:
/// until `RUNTIME_DIR/reload.result` holds a reload other than number `before`
/// (`src/deploy/mod.rs`). The new generation's number, or why the reload did not apply.
pub fn wait_reload(dir: &Path, before: u64, pid: u32, bound: Duration) -> Result<u64, String> {
    let step = Duration::from_millis(20);
    let mut waited = Duration::ZERO;
    loop {
        match crate::deploy::read_result(dir) {
            Ok(Some((number, result))) if number != before => return result,
            Ok(_) => {}
            Err(e) => return Err(e.to_string()),
        }
        if !alive(pid) {
            return Err("corral exited before the reload finished; see its log".to_owned());
        }
        if waited >= bound {
            return Err(format!(
                "no outcome within {bound:?}; corral may still be starting the new workers, see its log"
            ));
        }
        std::thread::sleep(step);
        waited += step;
    }
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

    /// What `f` logs at warn level and above, as text.
    fn warnings_of(f: impl FnOnce()) -> String {
        let (captured, subscriber) = crate::logs::capture::warnings();
        tracing::subscriber::with_default(subscriber, f);
        captured.text()
    }

    /// As nginx and php-fpm do, the newest corral takes the pid file over, whether the pid
    /// there is gone or live; only a live one is warned of (two corrals in one runtime_dir).
    /// On drop the file is removed only while it still names this process.
    #[test]
    fn a_pid_file_is_ours_until_dropped_replacing_a_stale_or_live_one_and_a_live_one_is_warned() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(PID_FILE);
        {
            let _ours = PidFile::create(&path).unwrap();
            assert_eq!(read_pid(&path).unwrap(), Some(std::process::id()));
        }
        assert!(!path.exists(), "removed on drop");
        // A file naming a process that is gone is replaced, quietly.
        std::fs::write(&path, "999999999\n").unwrap();
        let mut ours = None;
        let warned = warnings_of(|| ours = Some(PidFile::create(&path).unwrap()));
        assert_eq!(read_pid(&path).unwrap(), Some(std::process::id()));
        assert_eq!(warned, "", "a stale pid is not worth a warning");
        drop(ours);
        // One naming a live process (pid 1) is replaced too, with a warning naming it.
        std::fs::write(&path, "1\n").unwrap();
        let mut ours = None;
        let warned = warnings_of(|| ours = Some(PidFile::create(&path).unwrap()));
        assert_eq!(read_pid(&path).unwrap(), Some(std::process::id()));
        assert!(
            warned.contains("another running process is named in the pid file")
                && warned.contains("pid=1"),
            "{warned}"
        );
        // Once another process has written the file, it is not ours to remove.
        std::fs::write(&path, "1\n").unwrap();
        drop(ours);
        assert_eq!(
            read_pid(&path).unwrap(),
            Some(1),
            "not removed: not ours any more"
        );
    }
}
