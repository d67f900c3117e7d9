//! A launcher (the WSGI or the Rack one) run on its own, without corral: its interpreter is
//! started on a Unix listener passed as fd 0, as corral hands a worker its socket, and its
//! stderr is collected on a thread, so a test can wait for a log line. The guard kills the
//! launcher when the test ends, panics included. Shared by the tests that drive a launcher
//! with corral's LSAPI codec (`tests/launcher_wsgi_*.rs`, `tests/launcher_rack_*.rs`); what
//! each writes on the wire is in `support::launcher_wsgi` and `support::launcher_rack`.

use std::io::{BufRead, BufReader};
use std::os::fd::OwnedFd;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

/// Polls `check` for up to 5 s.
pub fn eventually(check: impl FnMut() -> bool) -> bool {
    super::eventually(Duration::from_secs(5), check)
}

/// A running launcher; killed on drop.
pub struct Launcher {
    pub child: Child,
    socket: PathBuf,
    stderr: Arc<Mutex<String>>,
    dir: PathBuf,
    /// The launcher's directory when the launcher made it (removed after the kill).
    _owned: Option<tempfile::TempDir>,
}

impl Launcher {
    /// Runs `cmd` in `dir` with a listener bound at `dir/socket` as its fd 0, and waits
    /// (5 s at most) until its stderr says `ready`. `owned` is kept until the launcher is
    /// gone.
    pub fn spawn(
        mut cmd: Command,
        dir: &Path,
        socket: &str,
        ready: &str,
        owned: Option<tempfile::TempDir>,
    ) -> Launcher {
        let socket = dir.join(socket);
        let listener: OwnedFd = UnixListener::bind(&socket).unwrap().into();
        let mut child = cmd
            .current_dir(dir)
            .stdin(Stdio::from(listener))
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {cmd:?}: {e}"));
        let pipe = child.stderr.take().unwrap();
        let stderr = Arc::new(Mutex::new(String::new()));
        let sink = Arc::clone(&stderr);
        std::thread::spawn(move || {
            for line in BufReader::new(pipe).lines().map_while(Result::ok) {
                let mut text = sink.lock().unwrap();
                text.push_str(&line);
                text.push('\n');
            }
        });
        let launcher = Launcher {
            child,
            socket,
            stderr,
            dir: dir.to_owned(),
            _owned: owned,
        };
        assert!(
            launcher.wait_stderr(ready),
            "the launcher did not start:\n{}",
            launcher.stderr()
        );
        launcher
    }

    /// The launcher's working directory (where its app and the tests' marker files are).
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    pub fn stderr(&self) -> String {
        self.stderr.lock().unwrap().clone()
    }

    /// Whether the launcher logs `needle` within 5 s (read on another thread, so a line may
    /// trail the answer it belongs to).
    pub fn wait_stderr(&self, needle: &str) -> bool {
        eventually(|| self.stderr().contains(needle))
    }

    /// Waits until the launcher has logged `needle`; fails the test after 5 s.
    pub fn wait_log(&self, needle: &str) {
        assert!(
            self.wait_stderr(needle),
            "no log line saying {needle:?}:\n{}",
            self.stderr()
        );
    }

    pub fn connect(&self) -> UnixStream {
        let s = UnixStream::connect(&self.socket).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        s
    }

    pub fn signal(&self, signal: Signal) {
        kill(Pid::from_raw(self.child.id() as i32), signal).unwrap();
    }

    /// How the launcher exited, waiting 5 s at most.
    pub fn exit(&mut self) -> Option<ExitStatus> {
        let mut status = None;
        eventually(|| {
            status = self.child.try_wait().unwrap();
            status.is_some()
        });
        status
    }

    /// Waits (5 s at most) for the exit code; fails the test if the launcher is still
    /// running.
    pub fn exit_code(&mut self) -> Option<i32> {
        let status = self.exit();
        assert!(
            status.is_some(),
            "the launcher did not exit:\n{}",
            self.stderr()
        );
        status.and_then(|s| s.code())
    }
}

impl Drop for Launcher {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
