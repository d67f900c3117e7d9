//! The daemon's own file-descriptor limit: raised from the soft to the hard limit at start, and
//! read back to size the front connection cap.
//!
//! systemd (and most shells) start services with a soft `RLIMIT_NOFILE` of 1,024 and a much
//! higher hard limit, expecting a server that needs more to raise its own soft limit. Every
//! front connection, worker socket, backend connection and spool file is a descriptor, so
//! corral raises it before binding anything.

use nix::sys::resource::{getrlimit, setrlimit, Resource};

/// The soft and hard `RLIMIT_NOFILE` before and after [`raise_nofile`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NofileRaise {
    /// Soft limit found at start.
    pub old_soft: u64,
    /// Soft limit now (the hard limit, unless raising failed).
    pub new_soft: u64,
    /// Hard limit.
    pub hard: u64,
}

/// Raises the soft `RLIMIT_NOFILE` to the hard limit. An unlimited hard limit (possible
/// for root) is not taken literally: the kernel refuses soft limits above `fs.nr_open`, so
/// the soft limit goes to that instead.
pub fn raise_nofile() -> std::io::Result<NofileRaise> {
    let (old_soft, hard) = getrlimit(Resource::RLIMIT_NOFILE)?;
    let target = if hard == nix::libc::RLIM_INFINITY {
        nr_open().unwrap_or(old_soft).max(old_soft)
    } else {
        hard
    };
    if target > old_soft {
        setrlimit(Resource::RLIMIT_NOFILE, target, hard)?;
    }
    let (new_soft, hard) = getrlimit(Resource::RLIMIT_NOFILE)?;
    Ok(NofileRaise {
        old_soft,
        new_soft,
        hard,
    })
}

/// The soft `RLIMIT_NOFILE` now; `None` if it cannot be read.
pub fn nofile_soft() -> Option<u64> {
    getrlimit(Resource::RLIMIT_NOFILE)
        .ok()
        .map(|(soft, _)| soft)
}

/// The kernel's ceiling on a process's descriptors (`/proc/sys/fs/nr_open`).
fn nr_open() -> Option<u64> {
    std::fs::read_to_string("/proc/sys/fs/nr_open")
        .ok()?
        .trim()
        .parse()
        .ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn raising_never_lowers_and_reaches_the_hard_limit() {
        let before = nofile_soft().unwrap();
        let r = raise_nofile().unwrap();
        assert_eq!(r.old_soft, before);
        assert!(r.new_soft >= r.old_soft);
        if r.hard != nix::libc::RLIM_INFINITY {
            assert_eq!(r.new_soft, r.hard);
        }
        assert_eq!(nofile_soft(), Some(r.new_soft));
    }
}
