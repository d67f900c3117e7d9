//! A preloading pool's preloaders, as its driver keeps them (ARCHITECTURE.md, "Preload and
//! fork"): which one new workers are forked from, which workers each one forked (or was asked
//! to), the listening sockets waiting until a preloader has loaded the app, and the task that
//! owns each preloader's `Child` and reads its control socket.
//!
//! A preloader is a spawned child of corral like any worker (own session, parent-death
//! signal, reaped by the one task that owns it). Its workers are not corral's children: their
//! exits are seen through a pidfd, with the status the preloader reports when it reaps them.
//! A pool that reforks (`refork_after`) also has promoted templates: workers that became
//! the template new workers are forked from (docs/pools.md, "Reforking"). Such a template
//! is its old template's child (until that one retires, when it is orphaned), watched like
//! a forked worker (a pidfd, and the status its parent reports while it has one), and
//! speaks the same control protocol on the socket it got at its fork.

use std::collections::{HashMap, HashSet};
use std::os::fd::OwnedFd;
use std::sync::Arc;
use std::time::Duration;

use tokio::process::Child;
use tokio::time::Instant;

use crate::pool::state::{ExitKind, WorkerKey};
use crate::process::preload::{control_pair, Control, ControlError, Message, PidFd};
use crate::process::{self, spawn_preloader, StopSignal, WorkerSpawn};

/// The argument that turns an embedded launcher into a preloader.
pub const PRELOAD_FLAG: &str = "--preload";

/// What a preloader's task reports to the driver.
#[derive(Debug)]
pub enum PreloaderEvent {
    /// The app is loaded: forks can be asked for.
    Ready,
    /// The worker asked for under `key` was forked as `pid` (not yet checked).
    Forked {
        /// Its key.
        key: WorkerKey,
        /// Its pid, as the preloader says.
        pid: u32,
    },
    /// The preloader reaped `pid`.
    Exited {
        /// The worker's pid, as the preloader says.
        pid: u32,
        /// How it ended.
        exit: ExitKind,
    },
    /// The preloader broke the protocol, closed its control socket or did not load the app
    /// in time; the task has killed it and reports [`PreloaderEvent::Gone`] once reaped.
    Broken(String),
    /// The preloader has exited and been reaped.
    Gone(ExitKind),
}

/// One preloader.
#[derive(Debug)]
pub struct Preloader {
    /// Its pid (and process group).
    pub pid: u32,
    control: Arc<Control>,
    /// Whether it has loaded the app.
    pub ready: bool,
    /// Listening sockets (and, when the pool reforks, control sockets) of workers asked
    /// for before it was ready, in order.
    pub pending: Vec<(WorkerKey, OwnedFd, Option<OwnedFd>)>,
    /// Workers it forked or was asked to fork and the driver has not forgotten.
    pub workers: HashSet<WorkerKey>,
    /// It was told to stop (a retired or the pool's last preloader): its exit is expected.
    pub stopping: bool,
    /// The driver killed it for holding a fork request too long.
    pub killed: bool,
    /// 0 for a preloader corral started; one more than its parent's for a promoted
    /// template.
    pub generation: usize,
    /// The template it was a worker of, when it was promoted (its parent process until that
    /// one retires: a promoted template clears its parent-death signal, and outlives it).
    pub parent: Option<u64>,
    /// A promoted template's exit status, as its parent reports it, goes here.
    pub status: Option<tokio::sync::oneshot::Sender<ExitKind>>,
    /// The preloader corral started at the root of its line: the stderr stream it and its
    /// workers write on.
    pub origin: u32,
}

impl Preloader {
    /// Asks for a worker under `key` on `listener` (corral's copy is closed on return);
    /// when the request cannot be sent, kills the preloader (whose exit then fails what it
    /// was asked for) and returns false.
    pub fn fork_or_kill(
        &self,
        pool: &str,
        key: WorkerKey,
        listener: OwnedFd,
        channel: Option<OwnedFd>,
    ) -> bool {
        match self.control.send_fork(key.0, &listener, channel.as_ref()) {
            Ok(()) => true,
            Err(e) => {
                tracing::error!(pool, pid = self.pid, error = %e, "cannot ask the preloader for a worker; killing it");
                self.signal(pool, StopSignal::Kill);
                false
            }
        }
    }

    /// Sends `signal` to its process group.
    pub fn signal(&self, pool: &str, signal: StopSignal) {
        if let Err(e) = process::signal_group(self.pid, signal) {
            tracing::warn!(pool, pid = self.pid, error = %e, "cannot signal the preloader");
        }
    }
}

/// The preloaders of one pool.
#[derive(Debug)]
pub struct Preloaders {
    /// The launcher's argv plus [`PRELOAD_FLAG`].
    argv: Vec<String>,
    /// The one new workers come from; none until needed, and none after a rolling restart
    /// until the next spawn starts a fresh one (the app's code may have changed).
    pub current: Option<u64>,
    next: u64,
    /// Every preloader not yet reaped, by its number.
    pub all: HashMap<u64, Preloader>,
}

impl Preloaders {
    /// The preloaders of a pool whose workers run `argv`.
    pub fn new(argv: &[String]) -> Preloaders {
        let mut argv = argv.to_vec();
        argv.push(PRELOAD_FLAG.to_string());
        Preloaders {
            argv,
            current: None,
            next: 0,
            all: HashMap::new(),
        }
    }

    /// The current preloader's number, starting one when there is none. Its task reports
    /// through `send` (the number and the event).
    pub fn current_or_start(
        &mut self,
        template: &WorkerSpawn,
        (start_timeout, kill_timeout): (Duration, Duration),
        send: impl Fn(u64, PreloaderEvent) + Send + 'static,
    ) -> std::io::Result<u64> {
        if let Some(n) = self.current {
            return Ok(n);
        }
        let (ours, theirs) = control_pair()?;
        let control = Arc::new(Control::new(ours)?);
        let mut spec = template.clone();
        spec.argv.clone_from(&self.argv);
        let spawned = spawn_preloader(&spec, theirs)?;
        let n = self.next;
        self.next += 1;
        let pid = spawned.pid;
        tracing::info!(pool = %template.pool, pid, preloader = n, "preloader started");
        tokio::spawn(watch(
            n,
            Owner::Child(spawned.child),
            pid,
            Arc::clone(&control),
            (start_timeout, kill_timeout),
            send,
        ));
        self.all
            .insert(n, Preloader::new(pid, control, (0, None, pid), None));
        self.current = Some(n);
        Ok(n)
    }

    /// Makes the worker `pid`, forked by template `parent` and told to become a template on
    /// `control` (its control socket), the current template: new workers are asked of it
    /// once it says `ready`. Its task reports through `send`, as a preloader's does.
    pub fn promoted(
        &mut self,
        pid: u32,
        control: Control,
        parent: u64,
        (start_timeout, kill_timeout): (Duration, Duration),
        send: impl Fn(u64, PreloaderEvent) + Send + 'static,
    ) -> std::io::Result<u64> {
        let generation = self.all.get(&parent).map_or(0, |p| p.generation) + 1;
        let origin = self.all.get(&parent).map_or(pid, |p| p.origin);
        let pidfd = PidFd::open(pid)?;
        let (tx, rx) = tokio::sync::oneshot::channel();
        let control = Arc::new(control);
        let n = self.next;
        self.next += 1;
        tokio::spawn(watch(
            n,
            Owner::Promoted { pidfd, status: rx },
            pid,
            Arc::clone(&control),
            (start_timeout, kill_timeout),
            send,
        ));
        self.all.insert(
            n,
            Preloader::new(pid, control, (generation, Some(parent), origin), Some(tx)),
        );
        self.current = Some(n);
        Ok(n)
    }

    /// Template `gone` has failed; when it was the current one, the template it was promoted
    /// from becomes current again if it still serves (the fallback), else none (the next
    /// spawn starts a fresh preloader).
    pub fn fall_back(&mut self, gone: u64) {
        if self.current != Some(gone) {
            return;
        }
        let parent = self.all.get(&gone).and_then(|p| p.parent);
        self.current = parent.filter(|p| {
            self.all
                .get(p)
                .is_some_and(|t| t.ready && !t.stopping && !t.killed)
        });
    }
}

impl Preloader {
    fn new(
        pid: u32,
        control: Arc<Control>,
        (generation, parent, origin): (usize, Option<u64>, u32),
        status: Option<tokio::sync::oneshot::Sender<ExitKind>>,
    ) -> Preloader {
        Preloader {
            pid,
            control,
            ready: false,
            pending: Vec::new(),
            workers: HashSet::new(),
            stopping: false,
            killed: false,
            generation,
            parent,
            status,
            origin,
        }
    }
}

/// How a preloader's task learns its exit: a preloader corral started is corral's child,
/// reaped by the task; a promoted template is its old template's child, seen ending through
/// a pidfd, with the status its parent reports.
enum Owner {
    Child(Child),
    Promoted {
        pidfd: PidFd,
        status: tokio::sync::oneshot::Receiver<ExitKind>,
    },
}

impl Owner {
    async fn wait(&mut self) -> ExitKind {
        let sigkill = ExitKind::Signal(nix::sys::signal::Signal::SIGKILL as i32);
        match self {
            Owner::Child(child) => match child.wait().await {
                Ok(status) => ExitKind::of(status),
                Err(_) => sigkill,
            },
            Owner::Promoted { pidfd, status } => {
                pidfd.exited().await;
                // Its parent reaps it and reports at once; once its parent has retired it
                // is orphaned and nobody reports: its status is not known (SIGKILL is
                // assumed, as for a worker whose preloader is gone).
                match tokio::time::timeout(Duration::from_secs(1), status).await {
                    Ok(Ok(exit)) => exit,
                    _ => sigkill,
                }
            }
        }
    }
}

/// Owns preloader `n`'s child: reads its control socket until it breaks, kills it when it
/// misbehaves or does not load the app within `start_timeout`, or when it has closed its
/// control socket and not exited within `kill_timeout`, and reports its exit.
async fn watch(
    n: u64,
    mut owner: Owner,
    pid: u32,
    control: Arc<Control>,
    (start_timeout, kill_timeout): (Duration, Duration),
    send: impl Fn(u64, PreloaderEvent) + Send + 'static,
) {
    let deadline = Instant::now() + start_timeout;
    let mut ready = false;
    let mut broken = false;
    // Once the control socket is closed: when the preloader must be gone by.
    let mut exit_by: Option<Instant> = None;
    let kill = || {
        let _ = process::signal_group(pid, StopSignal::Kill);
    };
    loop {
        let event = tokio::select! {
            exit = owner.wait() => {
                send(n, PreloaderEvent::Gone(exit));
                return;
            }
            message = control.recv(), if !broken => match message {
                Ok(Message::Ready { .. }) if !ready => {
                    ready = true;
                    PreloaderEvent::Ready
                }
                Ok(Message::Forked { key, pid }) if ready => PreloaderEvent::Forked {
                    key: WorkerKey(key),
                    pid,
                },
                Ok(Message::Exited { pid, exit }) => PreloaderEvent::Exited { pid, exit },
                Ok(other) => PreloaderEvent::Broken(format!("unexpected message {other:?}")),
                // It is exiting (told to stop, or killed): its exit is the news, reported
                // above. An interpreter closes its sockets before it is done exiting
                // (Python's teardown, after the SIGTERM that stops it), so it has
                // `kill_timeout` to finish, as a worker has after its stop signal; then it
                // is killed, so it cannot live on without a control socket.
                Err(ControlError::Closed) => {
                    broken = true;
                    exit_by = Some(Instant::now() + kill_timeout);
                    continue;
                }
                Err(e) => PreloaderEvent::Broken(e.to_string()),
            },
            () = tokio::time::sleep_until(deadline), if !ready && !broken => {
                PreloaderEvent::Broken(format!("it did not load the app within {start_timeout:?}"))
            }
            () = tokio::time::sleep_until(exit_by.unwrap_or(deadline)), if exit_by.is_some() => {
                exit_by = None;
                tracing::warn!(pid, ?kill_timeout, "the preloader closed its control socket but did not exit; killing it");
                kill();
                continue;
            }
        };
        if matches!(event, PreloaderEvent::Broken(_)) {
            broken = true;
            kill();
        }
        send(n, event);
    }
}
