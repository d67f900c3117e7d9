//! What a spawned worker gets between fork and exec, and who it runs as: its resource
//! limits (computed before the fork), its parent-death signal, its own session, and the user
//! and group looked up by name or number. Used by `spawn.rs`.

use std::io;

use nix::errno::Errno;
use nix::sys::prctl::set_pdeathsig;
use nix::sys::resource::{getrlimit, setrlimit, Resource};
use nix::sys::signal::Signal;
use nix::unistd::{getppid, setsid, Gid, Group, Pid, Uid, User};

use super::spawn::WorkerSpawn;
use crate::config::BackendProtocol;

/// Resource limits applied in the child, computed before the fork.
#[derive(Debug, Clone, Copy)]
pub(super) struct ChildLimits {
    /// Hard `RLIMIT_CORE`, kept while the soft limit goes to 0 (no core dumps).
    core_hard: u64,
    /// Soft and hard `RLIMIT_NOFILE`, if set.
    nofile: Option<(u64, u64)>,
}

impl ChildLimits {
    pub(super) fn for_worker(nofile: Option<u64>) -> io::Result<ChildLimits> {
        let (_, core_hard) = getrlimit(Resource::RLIMIT_CORE)?;
        let nofile = match nofile {
            Some(wanted) => {
                let (_, hard) = getrlimit(Resource::RLIMIT_NOFILE)?;
                Some((wanted.min(hard), hard))
            }
            None => None,
        };
        Ok(ChildLimits { core_hard, nofile })
    }
}

/// The signal a worker gets when corral dies (`PR_SET_PDEATHSIG`): SIGKILL, except for a
/// php-cgi parent of children (`php_children`), which gets SIGTERM. php-cgi's parent
/// handles SIGTERM (and SIGINT, SIGQUIT) by sending SIGTERM to its process group and
/// exiting, so its children leave with it (each after the request it holds, or at once
/// from accept); killed with SIGKILL it could not, and its children, forked by php-cgi
/// with no parent-death signal of their own, would be left running, owned by nobody.
pub(super) fn death_signal(spec: &WorkerSpawn) -> Signal {
    if spec.php_children.is_some() && spec.protocol == BackendProtocol::Fastcgi {
        Signal::SIGTERM
    } else {
        Signal::SIGKILL
    }
}

/// Runs in the child between fork and exec: async-signal-safe system calls only.
///
/// A new session (so the worker is its own process group, and a terminal's ^C reaches
/// corral alone); `death` ([`death_signal`]) when the forking thread dies; a check that the parent did not die
/// before that was armed (the signal would then never come); no core dumps; the file limit.
///
/// `PR_SET_DUMPABLE 0` is not set here: execve makes the new program dumpable again
/// whenever its real and effective ids agree, which they do after the uid change std makes
/// (seen on Linux 6.18: a process that set it and then exec'd was readable through
/// /proc/PID/environ by its own user again). Between the fork and the exec the child is
/// protected anyway: a root corral's child changed credentials, which clears the flag. The
/// embedded launchers set it themselves once running (`src/launchers/`); php-cgi, lsphp and
/// other commands stay dumpable, which is why pools sharing a user are warned about.
pub(super) fn child_setup(parent: Pid, limits: ChildLimits, death: Signal) -> io::Result<()> {
    setsid()?;
    set_pdeathsig(death)?;
    if getppid() != parent {
        return Err(io::Error::from(Errno::ESRCH));
    }
    setrlimit(Resource::RLIMIT_CORE, 0, limits.core_hard)?;
    if let Some((soft, hard)) = limits.nofile {
        setrlimit(Resource::RLIMIT_NOFILE, soft, hard)?;
    }
    Ok(())
}

/// A user by name, or by numeric uid (as the configuration allows).
pub(super) fn find_user(name: &str) -> io::Result<User> {
    if let Some(user) = User::from_name(name).map_err(io::Error::from)? {
        return Ok(user);
    }
    match name.parse::<u32>() {
        Ok(uid) => User::from_uid(Uid::from_raw(uid))
            .map_err(io::Error::from)?
            .ok_or_else(|| not_found("user id", name)),
        Err(_) => Err(not_found("user", name)),
    }
}

/// A group id by name, or a numeric gid as given (a gid needs no `/etc/group` entry).
pub(super) fn group_id(name: &str) -> io::Result<Gid> {
    if let Some(group) = Group::from_name(name).map_err(io::Error::from)? {
        return Ok(group.gid);
    }
    name.parse::<u32>()
        .map(Gid::from_raw)
        .map_err(|_| not_found("group", name))
}

fn not_found(what: &str, name: &str) -> io::Error {
    io::Error::new(
        io::ErrorKind::NotFound,
        format!("{what} {name} does not exist"),
    )
}
