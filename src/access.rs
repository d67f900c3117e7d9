//! The access log and the slow-request log: one line per request that reached a pool, with
//! the pool, the worker's pid, the status, the body bytes sent and the timing split (queue
//! wait, backend connect, time to the response head, total), in nginx's combined format with
//! corral's fields after it, or as JSON.
//!
//! Lines are made where the request ends (`GatewayBody`'s end or drop, or a failed
//! `dispatch`) and handed to one writer task through a channel, so no request waits on a file
//! or a lock; the writer batches what is queued and flushes when the queue is empty. SIGUSR1
//! (`AccessLog::reopen`) makes it flush and reopen its files: the line order of the channel
//! decides which file a line lands in, so none is lost across a logrotate rename. Both logs
//! are off by default (`[server] access_log`, `slow_log`, `slow_threshold`).

mod record;
mod stack;

use std::io::Write as _;
use std::os::unix::fs::OpenOptionsExt as _;
use std::time::{Duration, SystemTime};

use tokio::sync::mpsc;

use crate::config::{AccessFormat, LogTarget, ServerConfig};
pub use record::Record;
pub use stack::SlowStack;

/// What the request logs are set to, as a generation serves them (a reload may change them).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogSettings {
    access: Option<LogTarget>,
    format: AccessFormat,
    slow: Option<(LogTarget, Duration)>,
}

impl LogSettings {
    /// The settings of `[server]`.
    pub fn of(server: &ServerConfig) -> LogSettings {
        LogSettings {
            access: server.access_log.clone(),
            format: server.access_log_format,
            slow: server.slow_log.clone(),
        }
    }

    /// Whether any request log is on (a request's fields are then kept for its line).
    pub fn enabled(&self) -> bool {
        self.access.is_some() || self.slow.is_some()
    }

    /// `slow_threshold`, when the slow-request log is on.
    pub fn slow_threshold(&self) -> Option<Duration> {
        self.slow.as_ref().map(|(_, threshold)| *threshold)
    }
}

enum Message {
    Line {
        text: String,
        access: bool,
        slow: bool,
    },
    Reopen,
    Settings(LogSettings),
}

/// The request logs' handle: cheap to clone, sending lines to the writer task.
#[derive(Debug, Clone)]
pub struct AccessLog {
    tx: mpsc::UnboundedSender<Message>,
}

impl std::fmt::Debug for Message {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Message::Line { .. } => "Line",
            Message::Reopen => "Reopen",
            Message::Settings(_) => "Settings",
        })
    }
}

impl AccessLog {
    /// Starts the writer task with `settings`; it ends when every handle is dropped.
    pub fn start(settings: LogSettings) -> AccessLog {
        let (tx, rx) = mpsc::unbounded_channel();
        tokio::spawn(write_loop(rx, settings));
        AccessLog { tx }
    }

    /// Writes `record` to the access log and, when `slow` says it took long enough, to the
    /// slow log, as `settings` (the generation's) say.
    pub fn write(&self, settings: &LogSettings, record: &Record) {
        let access = settings.access.is_some();
        let slow = settings
            .slow
            .as_ref()
            .is_some_and(|(_, threshold)| record.total >= *threshold);
        if !access && !slow {
            return;
        }
        let text = record.line(settings.format, SystemTime::now());
        match record.stack.as_deref().filter(|_| slow) {
            Some(stack) => {
                if access {
                    let _ = self.tx.send(Message::Line {
                        text: text.clone(),
                        access,
                        slow: false,
                    });
                }
                let text = stack::append(text, settings.format, stack);
                let _ = self.tx.send(Message::Line {
                    text,
                    access: false,
                    slow,
                });
            }
            None => {
                let _ = self.tx.send(Message::Line { text, access, slow });
            }
        }
    }

    /// Flushes and reopens the log files (SIGUSR1, logrotate's `postrotate`).
    pub fn reopen(&self) {
        let _ = self.tx.send(Message::Reopen);
    }

    /// Writes to where `settings` say from now on (a reload); files are reopened.
    pub fn reconfigure(&self, settings: LogSettings) {
        let _ = self.tx.send(Message::Settings(settings));
    }
}

/// An open destination.
enum Sink {
    Stderr,
    File(std::io::BufWriter<std::fs::File>, std::path::PathBuf),
    /// Could not be opened (logged); lines for it are dropped until the next reopen.
    Broken,
}

impl Sink {
    fn open(target: &LogTarget) -> Sink {
        match target {
            LogTarget::Stderr => Sink::Stderr,
            LogTarget::File(path) => {
                // A root corral writes where the path points: a symbolic link planted at
                // the log's name (by whoever can write in its directory) must not make it
                // append to /etc/shadow, so the last component is never followed.
                let file = std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .mode(0o600)
                    .custom_flags(nix::libc::O_NOFOLLOW | nix::libc::O_CLOEXEC)
                    .open(path);
                match file {
                    Ok(f) => Sink::File(
                        std::io::BufWriter::with_capacity(64 * 1024, f),
                        path.clone(),
                    ),
                    Err(e) => {
                        let why = if e.raw_os_error() == Some(nix::libc::ELOOP) {
                            " (it is a symbolic link, which corral does not follow: name the real file)"
                        } else {
                            ""
                        };
                        tracing::error!(path = %path.display(), error = %e, "cannot open a request log{why}; its lines are dropped until it can be reopened (SIGUSR1)");
                        Sink::Broken
                    }
                }
            }
        }
    }

    fn write(&mut self, text: &str) {
        let result = match self {
            Sink::Stderr => std::io::stderr().write_all(text.as_bytes()),
            Sink::File(w, _) => w.write_all(text.as_bytes()),
            Sink::Broken => Ok(()),
        };
        if let (Err(e), Sink::File(_, path)) = (result, &*self) {
            tracing::error!(path = %path.display(), error = %e, "writing a request log failed");
        }
    }

    fn flush(&mut self) {
        if let Sink::File(w, path) = self {
            if let Err(e) = w.flush() {
                tracing::error!(path = %path.display(), error = %e, "flushing a request log failed");
            }
        }
    }
}

async fn write_loop(mut rx: mpsc::UnboundedReceiver<Message>, settings: LogSettings) {
    let open = |s: &LogSettings| {
        (
            s.access.as_ref().map(Sink::open),
            s.slow.as_ref().map(|(t, _)| Sink::open(t)),
        )
    };
    let mut settings = settings;
    let (mut access, mut slow) = open(&settings);
    while let Some(first) = rx.recv().await {
        let mut next = Some(first);
        // Everything queued now, then one flush.
        while let Some(message) = next {
            match message {
                Message::Line {
                    text,
                    access: a,
                    slow: s,
                } => {
                    if a {
                        if let Some(sink) = access.as_mut() {
                            sink.write(&text);
                        }
                    }
                    if s {
                        if let Some(sink) = slow.as_mut() {
                            sink.write(&text);
                        }
                    }
                }
                Message::Reopen | Message::Settings(_) => {
                    for sink in [access.as_mut(), slow.as_mut()].into_iter().flatten() {
                        sink.flush();
                    }
                    if let Message::Settings(new) = message {
                        settings = new;
                    }
                    (access, slow) = open(&settings);
                    tracing::info!("request logs reopened");
                }
            }
            next = rx.try_recv().ok();
        }
        for sink in [access.as_mut(), slow.as_mut()].into_iter().flatten() {
            sink.flush();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_log_path_that_is_a_symbolic_link_is_not_followed() {
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("shadow");
        std::fs::write(&target, "root:secret\n").unwrap();
        let link = dir.path().join("access.log");
        std::os::unix::fs::symlink(&target, &link).unwrap();
        let mut sink = Sink::open(&LogTarget::File(link.clone()));
        assert!(matches!(sink, Sink::Broken), "a symlinked log was opened");
        sink.write("GET / 200\n");
        sink.flush();
        assert_eq!(std::fs::read_to_string(&target).unwrap(), "root:secret\n");
        // The real file is opened and appended to.
        let real = dir.path().join("real.log");
        let mut sink = Sink::open(&LogTarget::File(real.clone()));
        sink.write("GET / 200\n");
        sink.flush();
        assert_eq!(std::fs::read_to_string(&real).unwrap(), "GET / 200\n");
    }
}
