//! Starting one worker process: its own listening socket handed over the way its kind of
//! interpreter expects, a clean environment, its user, limits and process group, and its
//! output piped into corral's log; then waiting until it accepts connections.
//!
//! The three handoffs (ARCHITECTURE.md decision 3):
//! - [`Handoff::Fd0`]: corral binds the socket and the child inherits it as fd 0
//!   (`FCGI_LISTENSOCK_FILENO`, `LSAPI_SOCK_FILENO`), put there with `Stdio::from(OwnedFd)`.
//! - [`Handoff::Placeholder`]: `{socket}` and `{port}` in argv are replaced and the child
//!   binds. For a TCP port corral picks a free one by binding port 0 and closing it again,
//!   so another process could take it in between; readiness then times out or reaches the
//!   wrong server, which is why the two socket-passing handoffs are preferred.
//! - [`Handoff::ListenFds`]: the systemd protocol, fd 3 with `LISTEN_FDS=1` and
//!   `LISTEN_PID`. The child's pid is known only after the fork, and the environment cannot
//!   be changed safely between fork and exec, so the program is started through
//!   `/bin/sh -c 'export LISTEN_PID=$$; exec "$@" 3<&0 0</dev/null'`: the shell's `$$` is
//!   the pid the program keeps after `exec`, and the shell moves the socket from fd 0 to
//!   fd 3 itself, so corral needs no unsafe descriptor juggling.

use std::collections::BTreeMap;
use std::io;
use std::os::fd::OwnedFd;
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::Stdio;

use nix::unistd::{Gid, Pid, Uid};
use tokio::process::Child;

use super::child::{child_setup, death_signal, find_user, group_id, ChildLimits};
use super::output::{log_lines, TailHandle};
use super::worker_socket::{prepare_socket, remove_socket_file, substitute};
use crate::config::{BackendAddress, BackendProtocol, PoolConfig, Program, SpawnConfig};

/// Mode of a worker socket corral binds: read and write for corral's user alone.
pub const WORKER_SOCKET_MODE: u32 = 0o600;

/// `PATH` given to workers when corral itself has none.
pub const DEFAULT_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// The socket a worker listens on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WorkerSocket {
    /// A Unix stream socket at this path (in the runtime dir); a stale file is removed.
    Unix(PathBuf),
    /// A TCP port on 127.0.0.1; 0 lets corral pick a free one.
    Tcp {
        /// The port, or 0.
        port: u16,
    },
}

/// How the worker gets its socket.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Handoff {
    /// corral binds and listens; the child gets the listening socket as fd 0.
    Fd0,
    /// `{socket}` / `{port}` are substituted in argv; the child binds.
    Placeholder,
    /// corral binds and listens; the child gets it as fd 3 with `LISTEN_FDS=1` and
    /// `LISTEN_PID` set (systemd socket activation).
    ListenFds,
}

impl Handoff {
    /// The handoff a configured `command` implies: `{socket}` or `{port}` in it means the
    /// program binds itself; otherwise FastCGI and LSAPI interpreters take fd 0 (their own
    /// convention) and other programs the systemd protocol.
    pub fn for_command(protocol: BackendProtocol, argv: &[String]) -> Handoff {
        if argv
            .iter()
            .any(|a| a.contains("{socket}") || a.contains("{port}"))
        {
            return Handoff::Placeholder;
        }
        match protocol {
            BackendProtocol::Fastcgi | BackendProtocol::Lsapi => Handoff::Fd0,
            BackendProtocol::Scgi => Handoff::ListenFds,
        }
    }
}

/// Everything needed to start one worker.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkerSpawn {
    /// The pool's name, for log fields.
    pub pool: String,
    /// Program and arguments; the program is looked up in the worker's `PATH`.
    pub argv: Vec<String>,
    /// The backend protocol, which decides the interpreter variables corral pins
    /// (see [`worker_environment`]).
    pub protocol: BackendProtocol,
    /// Where the worker listens.
    pub socket: WorkerSocket,
    /// How the socket reaches the worker.
    pub handoff: Handoff,
    /// The pool's `env`, added to `PATH` in an otherwise empty environment.
    pub env: BTreeMap<String, String>,
    /// Working directory (none = corral's).
    pub cwd: Option<PathBuf>,
    /// User the worker runs as when corral is root (none = see [`WorkerSpawn::identity`]).
    /// With [`Handoff::Placeholder`] and a Unix socket, that user must be able to create
    /// the socket in its directory.
    pub user: Option<String>,
    /// Group the worker runs as when corral is root (none = the user's primary group).
    pub group: Option<String>,
    /// Soft `RLIMIT_NOFILE` for the worker, capped at the hard limit (none = inherited).
    pub nofile: Option<u64>,
    /// Workers are forked by a preloader started from `argv` plus `--preload` (the
    /// embedded launchers only; ARCHITECTURE.md, "Preload and fork").
    pub preload: bool,
    /// A php-cgi parent forking children (`php_children`, see
    /// [`super::php_children::pin_environment`]); its jitter already resolved per worker.
    pub php_children: Option<crate::config::PhpChildren>,
    /// A direct pool's worker (`accept = "direct"`, ARCHITECTURE.md "Direct pools"): php-cgi
    /// counts its own requests and exits after this many (`PHP_FCGI_MAX_REQUESTS`, 0 =
    /// never), and starts with `-d cgi.fix_pathinfo=0`.
    pub direct_max_requests: Option<u64>,
    /// Where the pool keeps its processes' last stderr lines (none = logged only).
    pub stderr_tail: TailHandle,
}

impl WorkerSpawn {
    /// A spawn with no extra environment, corral's cwd, no user and inherited limits.
    pub fn new(
        pool: &str,
        argv: Vec<String>,
        protocol: BackendProtocol,
        socket: WorkerSocket,
        handoff: Handoff,
    ) -> WorkerSpawn {
        WorkerSpawn {
            pool: pool.to_string(),
            argv,
            protocol,
            socket,
            handoff,
            env: BTreeMap::new(),
            cwd: None,
            user: None,
            group: None,
            nofile: None,
            preload: false,
            php_children: None,
            direct_max_requests: None,
            stderr_tail: TailHandle::default(),
        }
    }

    /// The spawn for one worker of a pool whose `command` is configured, with the handoff
    /// [`Handoff::for_command`] picks. `None` for `app = ...` pools, whose command comes
    /// from the embedded launchers.
    pub fn from_config(
        pool: &PoolConfig,
        spawn: &SpawnConfig,
        socket: WorkerSocket,
    ) -> Option<WorkerSpawn> {
        let Program::Command(argv) = &spawn.program else {
            return None;
        };
        Some(WorkerSpawn {
            pool: pool.name.clone(),
            argv: argv.clone(),
            protocol: pool.protocol,
            socket,
            handoff: Handoff::for_command(pool.protocol, argv),
            env: spawn.env.clone(),
            cwd: spawn.cwd.clone(),
            user: spawn.user.clone(),
            group: spawn.group.clone(),
            nofile: None,
            preload: false,
            php_children: spawn.php_children,
            direct_max_requests: None,
            stderr_tail: TailHandle::default(),
        })
    }

    /// The user and group the worker will run as, or `None` to keep corral's.
    ///
    /// Only a root corral changes identity; otherwise `user` and
    /// `group` are ignored, since an unprivileged process cannot switch. A root corral never
    /// runs an interpreter as root unless told to (`user = "root"`): with no user configured
    /// the worker runs as [`DEFAULT_USER`], in [`DEFAULT_GROUP`] when that group exists (else
    /// the user's primary group). An interpreter runs whatever code its requests name, so
    /// root is the worst default; refusing to start instead would break a first run as root
    /// of the embedded demo. lsphp has a second reason: started as root it takes itself for
    /// LiteSpeed's suEXEC daemon and serves a single connection before exiting
    /// (protocols/LSAPI.md §5.3). The warning that says so is logged once per pool, by the
    /// caller of [`default_identity_applies`], not here at every spawn.
    pub fn identity(&self) -> io::Result<Option<Identity>> {
        if !Uid::effective().is_root() {
            if self.user.is_some() || self.group.is_some() {
                tracing::debug!(pool = %self.pool, "corral is not root: the worker keeps corral's user; `user` and `group` are ignored");
            }
            return Ok(None);
        }
        let defaulted = self.user.is_none();
        let user = find_user(self.user.as_deref().unwrap_or(DEFAULT_USER))?;
        let gid = match (&self.group, defaulted) {
            (Some(group), _) => group_id(group)?,
            (None, true) => group_id(DEFAULT_GROUP).unwrap_or(user.gid),
            (None, false) => user.gid,
        };
        Ok(Some(Identity {
            user: user.name,
            uid: user.uid,
            gid,
        }))
    }
}

/// The user a root corral runs workers as when neither the pool nor `[server]` names one.
pub const DEFAULT_USER: &str = "nobody";

/// The group of [`DEFAULT_USER`] workers, when the system has it (Debian's name for it).
pub const DEFAULT_GROUP: &str = "nogroup";

/// Whether a pool whose configured user is `user` gets [`DEFAULT_USER`]: corral is root and
/// no user is configured.
pub fn default_identity_applies(user: Option<&str>) -> bool {
    user.is_none() && Uid::effective().is_root()
}

/// The user and group a worker runs as.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Identity {
    /// The user's name.
    pub user: String,
    /// Its uid.
    pub uid: Uid,
    /// The group id (supplementary groups are cleared).
    pub gid: Gid,
}

/// A started worker.
#[derive(Debug)]
pub struct SpawnedWorker {
    /// The child; its single owner awaits its exit. Killed if dropped (a safety net only).
    pub child: Child,
    /// Its pid, which is also its process group and session id.
    pub pid: u32,
    /// Where corral connects to it.
    pub address: BackendAddress,
}

/// Starts the worker `spec` describes.
///
/// Must be called inside a tokio runtime, from a thread that outlives the worker (see the
/// module documentation of `process` on the parent-death signal). The child's stdout and
/// stderr are logged line by line (target `corral::worker`, fields `pool`, `pid`,
/// `stream`) by tasks that end when the pipes close.
pub fn spawn_worker(spec: &WorkerSpawn) -> io::Result<SpawnedWorker> {
    if spec.argv.is_empty() {
        return Err(empty_command(spec));
    }
    let identity = spec.identity()?;
    let (address, listener) = prepare_socket(&spec.socket, spec.handoff)?;
    let bound = listener.is_some();
    let started = substitute(&spec.argv, &address).and_then(|argv| {
        start(
            spec,
            &argv,
            identity.as_ref(),
            listener,
            &address.to_string(),
        )
    });
    let (child, pid) = match started {
        Ok(started) => started,
        Err(e) => {
            // Nobody will listen on the socket corral bound for this worker: remove its
            // file, or every failed spawn (a missing interpreter, retried with backoff)
            // would leave one more in the runtime directory.
            if let (true, WorkerSocket::Unix(path)) = (bound, &spec.socket) {
                remove_socket_file(path);
            }
            return Err(e);
        }
    };
    Ok(SpawnedWorker {
        child,
        pid,
        address,
    })
}

/// Starts a direct pool's worker (ARCHITECTURE.md, "Direct pools") with `listener`, the
/// pool's shared listening socket (a duplicate, blocking), as fd 0; `address` names it.
/// php-cgi is started with `-d cgi.fix_pathinfo=0` after its program name: corral cannot
/// check which script a request names, so PATH_INFO guessing stays off.
pub fn spawn_direct_worker(
    spec: &WorkerSpawn,
    listener: OwnedFd,
    address: BackendAddress,
) -> io::Result<SpawnedWorker> {
    let Some((program, args)) = spec.argv.split_first() else {
        return Err(empty_command(spec));
    };
    let identity = spec.identity()?;
    let mut argv = vec![
        program.clone(),
        "-d".to_owned(),
        "cgi.fix_pathinfo=0".to_owned(),
    ];
    argv.extend(args.iter().cloned());
    let (child, pid) = start(
        spec,
        &argv,
        identity.as_ref(),
        Some(listener),
        &address.to_string(),
    )?;
    Ok(SpawnedWorker {
        child,
        pid,
        address,
    })
}

/// Starts a pool's preloader (ARCHITECTURE.md, "Preload and fork"): `spec`'s program, user,
/// environment, limits and process group, with `control` (corral's control socket to it)
/// as fd 0 instead of a listening socket. The address in the result is not one corral
/// connects to; it names the preloader in logs.
pub fn spawn_preloader(spec: &WorkerSpawn, control: OwnedFd) -> io::Result<SpawnedWorker> {
    if spec.argv.is_empty() {
        return Err(empty_command(spec));
    }
    let identity = spec.identity()?;
    let address = BackendAddress::Unix(PathBuf::from(format!("preloader of pool {}", spec.pool)));
    let (child, pid) = start(
        spec,
        &spec.argv,
        identity.as_ref(),
        Some(control),
        "(control socket)",
    )?;
    Ok(SpawnedWorker {
        child,
        pid,
        address,
    })
}

/// Binds the listening socket of a worker a preloader forks (corral binds it, as for
/// [`Handoff::Fd0`]), returning the address corral connects to and the socket to send.
pub fn bind_worker_socket(socket: &WorkerSocket) -> io::Result<(BackendAddress, OwnedFd)> {
    let (address, listener) = prepare_socket(socket, Handoff::Fd0)?;
    let listener = listener.ok_or_else(|| io::Error::other("no socket was bound"))?;
    Ok((address, listener))
}

fn empty_command(spec: &WorkerSpawn) -> io::Error {
    invalid(format!("pool {}: the worker command is empty", spec.pool))
}

/// Starts `argv` as `spec` describes (environment, cwd, user, limits, own session, log
/// pipes) with `listener` as fd 0 (else /dev/null); returns the child and its pid.
fn start(
    spec: &WorkerSpawn,
    argv: &[String],
    identity: Option<&Identity>,
    listener: Option<OwnedFd>,
    address: &str,
) -> io::Result<(Child, u32)> {
    let (program, args) = argv.split_first().ok_or_else(|| empty_command(spec))?;
    let env = worker_environment(spec);

    let mut cmd = match spec.handoff {
        Handoff::ListenFds => {
            // `sh -c SCRIPT NAME ARGS...`: NAME becomes $0, ARGS become "$@".
            let mut cmd = std::process::Command::new("/bin/sh");
            cmd.args(["-c", "export LISTEN_PID=$$; exec \"$@\" 3<&0 0</dev/null"])
                .arg("corral-listen-fds")
                .args(argv);
            cmd
        }
        Handoff::Fd0 | Handoff::Placeholder => {
            let mut cmd = std::process::Command::new(program);
            cmd.args(args);
            cmd
        }
    };
    cmd.env_clear().envs(&env);
    if spec.handoff == Handoff::ListenFds {
        cmd.env("LISTEN_FDS", "1");
    }
    if let Some(cwd) = &spec.cwd {
        cmd.current_dir(cwd);
    }
    cmd.stdin(listener.map_or_else(Stdio::null, Stdio::from))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    if let Some(id) = identity {
        // std clears the supplementary groups when a root parent sets a uid.
        cmd.uid(id.uid.as_raw()).gid(id.gid.as_raw());
    }
    let limits = ChildLimits::for_worker(spec.nofile)?;
    let parent = Pid::this();
    let death = death_signal(spec);
    // SAFETY: the closure runs in the forked child before exec, where only
    // async-signal-safe work is allowed: another thread of corral may have held the
    // allocator's or a logger's lock at the fork. `child_setup` only makes the raw system
    // calls setsid, prctl, getppid and setrlimit through nix's thin wrappers, on values
    // computed before the fork and captured by copy; it neither allocates (errors are
    // built from a raw errno) nor takes locks. std runs it after the uid/gid change, which
    // matters: changing credentials clears the parent-death signal.
    unsafe {
        cmd.pre_exec(move || child_setup(parent, limits, death));
    }
    let mut child = tokio::process::Command::from(cmd)
        .kill_on_drop(true)
        .spawn()
        .map_err(|e| io::Error::new(e.kind(), format!("cannot start {program}: {e}")))?;
    let pid = child
        .id()
        .ok_or_else(|| io::Error::other(format!("{program} exited before its pid was read")))?;
    if let Some(out) = child.stdout.take() {
        tokio::spawn(log_lines(out, spec.pool.clone(), pid, "stdout", None));
    }
    if let Some(err) = child.stderr.take() {
        tokio::spawn(log_lines(
            err,
            spec.pool.clone(),
            pid,
            "stderr",
            spec.stderr_tail.0.clone(),
        ));
    }
    tracing::info!(
        pool = %spec.pool, pid, address = %address,
        user = identity.as_ref().map_or("(corral's)", |id| id.user.as_str()),
        "worker started"
    );
    // The parent's copy of the listening socket closes here, at the end of `cmd`.
    Ok((child, pid))
}

/// The worker's whole environment: `PATH` (corral's, or [`DEFAULT_PATH`]), the pool's
/// `env`, then the variables corral pins for the protocol's interpreters, which win over
/// the pool's (a differing pool value is logged):
///
/// - FastCGI (php-cgi): `PHP_FCGI_CHILDREN` removed (one process, no forking manager) and
///   `PHP_FCGI_MAX_REQUESTS=0` (its default of 500 makes it exit by itself, racing
///   requests; recycling is corral's decision).
/// - LSAPI (lsphp): `LSAPI_CHILDREN`, `PHP_LSAPI_CHILDREN`, `LSAPI_MAX_REQS`,
///   `PHP_LSAPI_MAX_REQUESTS`, `LSAPI_MAX_BUSY_WORKER` and `LSAPI_PGRP_MAX_IDLE` removed
///   (one process serving connection after connection, no request cap) and
///   `LSAPI_MAX_IDLE=-1` (its default makes an idle process exit after 300 s). Its
///   parent-pid check stays on and is harmless: corral is the direct parent, and when
///   corral dies the worker is killed anyway.
///
/// Other programs ignore these variables.
pub fn worker_environment(spec: &WorkerSpawn) -> BTreeMap<String, String> {
    let mut env = BTreeMap::new();
    let path = std::env::var("PATH").unwrap_or_else(|_| DEFAULT_PATH.to_string());
    env.insert("PATH".to_string(), path);
    env.extend(spec.env.clone());
    let (remove, set): (&[&str], &[(&str, &str)]) = match spec.protocol {
        BackendProtocol::Fastcgi => (&["PHP_FCGI_CHILDREN"], &[("PHP_FCGI_MAX_REQUESTS", "0")]),
        BackendProtocol::Lsapi => (
            &[
                "LSAPI_CHILDREN",
                "PHP_LSAPI_CHILDREN",
                "LSAPI_MAX_REQS",
                "PHP_LSAPI_MAX_REQUESTS",
                "LSAPI_MAX_BUSY_WORKER",
                "LSAPI_PGRP_MAX_IDLE",
            ],
            &[("LSAPI_MAX_IDLE", "-1")],
        ),
        BackendProtocol::Scgi => (&[], &[]),
    };
    for name in remove {
        if env.remove(*name).is_some() {
            tracing::warn!(pool = %spec.pool, variable = name, "ignoring the pool's env variable: corral manages the worker count and recycling");
        }
    }
    for (name, value) in set {
        if let Some(old) = env.insert(name.to_string(), value.to_string()) {
            if old != *value {
                tracing::warn!(pool = %spec.pool, variable = name, value, "overriding the pool's env variable: corral manages recycling");
            }
        }
    }
    if let (BackendProtocol::Fastcgi, Some(group)) = (spec.protocol, &spec.php_children) {
        super::php_children::pin_environment(group, &mut env);
    }
    if let (BackendProtocol::Fastcgi, Some(max)) = (spec.protocol, spec.direct_max_requests) {
        env.insert("PHP_FCGI_MAX_REQUESTS".to_string(), max.to_string());
    }
    env
}

pub(super) fn invalid(message: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidInput, message)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_command_decides_the_handoff() {
        let argv = |a: &[&str]| a.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let php = argv(&["php-cgi"]);
        let app = argv(&["app", "--port", "{port}"]);
        assert_eq!(
            Handoff::for_command(BackendProtocol::Fastcgi, &php),
            Handoff::Fd0
        );
        assert_eq!(
            Handoff::for_command(BackendProtocol::Lsapi, &php),
            Handoff::Fd0
        );
        assert_eq!(
            Handoff::for_command(BackendProtocol::Scgi, &php),
            Handoff::ListenFds
        );
        assert_eq!(
            Handoff::for_command(BackendProtocol::Fastcgi, &app),
            Handoff::Placeholder
        );
    }

    #[test]
    fn pinned_interpreter_variables_win() {
        let mut spec = WorkerSpawn::new(
            "php",
            vec!["php-cgi".to_string()],
            BackendProtocol::Fastcgi,
            WorkerSocket::Tcp { port: 0 },
            Handoff::Fd0,
        );
        spec.env.insert("PHP_FCGI_CHILDREN".into(), "8".into());
        spec.env
            .insert("PHP_FCGI_MAX_REQUESTS".into(), "500".into());
        spec.env.insert("APP_ENV".into(), "test".into());
        let env = worker_environment(&spec);
        assert_eq!(
            env.get("PHP_FCGI_MAX_REQUESTS").map(String::as_str),
            Some("0")
        );
        assert_eq!(env.get("APP_ENV").map(String::as_str), Some("test"));
        assert!(!env.contains_key("PHP_FCGI_CHILDREN"));
        assert!(env.contains_key("PATH"));

        spec.protocol = BackendProtocol::Lsapi;
        spec.env.insert("LSAPI_CHILDREN".into(), "4".into());
        let env = worker_environment(&spec);
        assert_eq!(env.get("LSAPI_MAX_IDLE").map(String::as_str), Some("-1"));
        assert!(!env.contains_key("LSAPI_CHILDREN"));
    }
}
