//! The runtime directory (`server.runtime_dir`): where corral keeps its worker sockets and
//! the embedded launchers, checked and created before anything is put there.
//!
//! Whoever can write in this directory can replace a worker socket (and be sent every
//! request, or send forged answers) or a launcher (and run code as the workers' user), so
//! corral refuses to start when the directory is a symbolic link, is writable by its group
//! or by everyone, or belongs to another user than corral's own or root. A directory corral
//! owns is given the mode it needs, whatever mode it had:
//!
//! - **0700** when only corral opens paths in it, which is the case whenever the workers
//!   get their socket as an inherited descriptor and run no launcher file (php-cgi, lsphp,
//!   SCGI apps under the systemd protocol), or run as corral's own user.
//! - **0711** (search but no listing for others) when a process under another user must
//!   open a path in it: a root corral's workers under their own user reading the launcher
//!   or binding their own socket (`{socket}` in the command), or a front server connecting
//!   to a front Unix socket placed in it. 0750 would do only if all of those shared one
//!   group, which pools under different users and an nginx under `www-data` do not. Search
//!   permission reaches only names one already knows, and every name is protected by its
//!   own mode: worker sockets 0600 (corral's user only), launchers 0644 and owned by corral
//!   (the text is the one embedded in the binary), front sockets their configured `mode`,
//!   and the per-pool directory of self-binding workers 0700 for that pool's user.

use std::io;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use nix::unistd::Uid;

use crate::config::{Backend, Bind, Config, Program};
use crate::process::{Handoff, Identity};

/// The runtime directory's mode when nobody but corral opens paths in it.
pub const PRIVATE_MODE: u32 = 0o700;
/// Its mode when other users must reach names in it (see the module documentation).
pub const TRAVERSE_MODE: u32 = 0o711;
/// Mode of a missing parent directory corral creates on the way to the runtime directory:
/// it must let the same processes through.
const PARENT_MODE: u32 = 0o755;

/// Why the runtime directory cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum RuntimeDirError {
    /// The path is a symbolic link.
    #[error(
        "the runtime directory {path} is a symbolic link; corral keeps its sockets and \
         launchers only in a real directory, so point runtime_dir at the directory itself"
    )]
    Symlink {
        /// The runtime directory.
        path: PathBuf,
    },
    /// The path exists and is something else than a directory.
    #[error("the runtime directory {path} exists and is not a directory")]
    NotADirectory {
        /// The runtime directory.
        path: PathBuf,
    },
    /// Another unprivileged user owns it.
    #[error(
        "the runtime directory {path} belongs to uid {owner}, neither corral's user (uid \
         {uid}) nor root, so that user could replace corral's sockets and launchers; remove \
         it or give it to corral's user"
    )]
    Owner {
        /// The runtime directory.
        path: PathBuf,
        /// Its owner.
        owner: u32,
        /// corral's effective uid.
        uid: u32,
    },
    /// Its group or everyone may write in it.
    #[error(
        "the runtime directory {path} has mode {mode:04o}: writable by its group or by \
         everyone, so another user could replace corral's sockets and launchers; {advice}"
    )]
    Writable {
        /// The runtime directory.
        path: PathBuf,
        /// Its permission bits.
        mode: u32,
        /// What to do about it ([`advice`]).
        advice: String,
    },
    /// A directory above it may be written by others, who could rename the runtime
    /// directory away and put their own in its place (OpenSSH's StrictModes rule).
    #[error(
        "the runtime directory {dir} is inside {path}, which has mode {mode:04o}: writable by \
         its group or by everyone{sticky}, so another user could rename {dir} away and put \
         their own in its place; {advice}"
    )]
    AncestorWritable {
        /// The runtime directory.
        dir: PathBuf,
        /// The ancestor.
        path: PathBuf,
        /// Its permission bits.
        mode: u32,
        /// Why the sticky bit does not save it, when it has one.
        sticky: &'static str,
        /// What to do about it ([`advice`]).
        advice: String,
    },
    /// A directory above it belongs to another unprivileged user.
    #[error(
        "the runtime directory {dir} is inside {path}, which belongs to uid {owner}, neither \
         corral's user (uid {uid}) nor root, so that user could replace {dir}; choose a \
         runtime_dir whose every parent directory belongs to root or to corral's user"
    )]
    AncestorOwner {
        /// The runtime directory.
        dir: PathBuf,
        /// The ancestor.
        path: PathBuf,
        /// Its owner.
        owner: u32,
        /// corral's effective uid.
        uid: u32,
    },
    /// It is root's and corral, not root, cannot create its files in it.
    #[error(
        "the runtime directory {path} belongs to root and corral runs as {user}, who cannot \
         create its pid file and sockets in it; {advice}"
    )]
    NotWritable {
        /// The runtime directory.
        path: PathBuf,
        /// corral's user, by name and uid.
        user: String,
        /// What to do about it.
        advice: String,
    },
    /// A system call failed.
    #[error("cannot {what} {path}: {source}")]
    Io {
        /// What was being done: "create", "inspect", "chmod", ...
        what: &'static str,
        /// The path it was done to.
        path: PathBuf,
        /// The operating system's reason.
        source: io::Error,
    },
}

fn io_error<'p>(
    what: &'static str,
    path: &'p Path,
) -> impl FnOnce(io::Error) -> RuntimeDirError + 'p {
    move |source| RuntimeDirError::Io {
        what,
        path: path.to_path_buf(),
        source,
    }
}

/// Directories shared by the whole system, whose mode is not the runtime directory's to
/// change even when they are not sticky.
const SYSTEM_DIRS: &[&str] = &[
    "/",
    "/tmp",
    "/var/tmp",
    "/dev/shm",
    "/run",
    "/var/run",
    "/run/lock",
    "/var/lock",
    "/run/user",
    "/home",
    "/var",
    "/usr",
    "/opt",
    "/srv",
    "/etc",
    "/mnt",
    "/media",
];

/// What to do about `path`, a directory others may write in: `chmod go-w` for a directory
/// of corral's own, but a directory of its own instead of a shared one (sticky, such as
/// /tmp, or a system directory), whose mode other programs rely on.
pub fn advice(path: &Path, mode: u32) -> String {
    let shared = mode & 0o1000 != 0 || SYSTEM_DIRS.iter().any(|d| Path::new(d) == path);
    if !shared {
        return format!(
            "run `chmod go-w {}`, or choose another runtime_dir",
            path.display()
        );
    }
    let own = own_dir();
    format!(
        "{} is shared by every user of the system and must keep its mode (do not chmod it): \
         set server.runtime_dir to a directory of corral's own, such as {own}, which corral \
         creates",
        path.display()
    )
}

/// A runtime directory to suggest: /run/corral for root, else the user's own runtime
/// directory's `corral`.
fn own_dir() -> String {
    if Uid::effective().is_root() {
        return "/run/corral".to_owned();
    }
    match std::env::var_os("XDG_RUNTIME_DIR") {
        Some(x) => format!("{}/corral", Path::new(&x).display()),
        None => "~/.cache/corral".to_owned(),
    }
}

/// Refuses the runtime directory `dir` when a directory above it could be written by
/// another user than root and corral's own: each existing ancestor, as written and as
/// resolved (a symbolic link among them is checked where it leads too), must belong to root
/// or to corral's user and be writable by neither its group nor others, unless it is
/// sticky and root's (as /tmp: then nobody else may rename what is in it).
pub fn check_ancestors(dir: &Path) -> Result<(), RuntimeDirError> {
    let absolute = if dir.is_absolute() {
        dir.to_path_buf()
    } else {
        std::env::current_dir()
            .map_err(io_error("inspect", dir))?
            .join(dir)
    };
    let existing = absolute
        .ancestors()
        .skip(1)
        .find(|a| std::fs::metadata(a).is_ok())
        .map(Path::to_path_buf);
    let Some(existing) = existing else {
        return Ok(());
    };
    let real = std::fs::canonicalize(&existing).map_err(io_error("inspect", &existing))?;
    let uid = Uid::effective().as_raw();
    let lexical = existing.ancestors().map(Path::to_path_buf);
    for path in lexical.chain(real.ancestors().map(Path::to_path_buf)) {
        if path.as_os_str().is_empty() {
            continue;
        }
        let meta = std::fs::metadata(&path).map_err(io_error("inspect", &path))?;
        let mode = meta.mode() & 0o7777;
        if meta.uid() != 0 && meta.uid() != uid {
            return Err(RuntimeDirError::AncestorOwner {
                dir: dir.to_path_buf(),
                path,
                owner: meta.uid(),
                uid,
            });
        }
        let sticky = mode & 0o1000 != 0;
        if mode & 0o022 != 0 && !(sticky && meta.uid() == 0) {
            return Err(RuntimeDirError::AncestorWritable {
                dir: dir.to_path_buf(),
                advice: advice(&path, mode),
                path,
                mode,
                sticky: if sticky {
                    " (sticky, but not root's: its owner may still rename what is in it)"
                } else {
                    ""
                },
            });
        }
    }
    Ok(())
}

/// Checks an existing runtime directory as `corral run` does, without changing it: for the
/// commands that find a running corral through it (`crate::control`).
pub fn check_existing(dir: &Path) -> Result<(), RuntimeDirError> {
    check_ancestors(dir)?;
    let meta = std::fs::symlink_metadata(dir).map_err(io_error("inspect", dir))?;
    check_meta(dir, &meta)
}

/// The rules [`prepare`] applies to the directory itself: a real directory, corral's own or
/// root's, that neither its group nor others may write in.
fn check_meta(dir: &Path, meta: &std::fs::Metadata) -> Result<(), RuntimeDirError> {
    let path = dir.to_path_buf();
    if meta.file_type().is_symlink() {
        return Err(RuntimeDirError::Symlink { path });
    }
    if !meta.is_dir() {
        return Err(RuntimeDirError::NotADirectory { path });
    }
    let uid = Uid::effective().as_raw();
    if meta.uid() != uid && meta.uid() != 0 {
        return Err(RuntimeDirError::Owner {
            path,
            owner: meta.uid(),
            uid,
        });
    }
    let current = meta.mode() & 0o7777;
    if current & 0o022 != 0 {
        return Err(RuntimeDirError::Writable {
            advice: advice(&path, current),
            path,
            mode: current,
        });
    }
    Ok(())
}

/// The mode `config`'s runtime directory needs, for a corral that is root or not.
pub fn mode_for(config: &Config, corral_is_root: bool) -> u32 {
    let dir = &config.server.runtime_dir;
    let front_socket_inside = config
        .listeners
        .iter()
        .map(|l| &l.bind)
        .chain(config.status.iter().map(|s| &s.bind))
        .any(|b| matches!(b, Bind::Unix { path, .. } if path.starts_with(dir)));
    let workers_open_paths = corral_is_root
        && config.pools.iter().any(|p| match &p.backend {
            Backend::Spawned(s) => {
                let opens_paths = match &s.program {
                    Program::Wsgi { .. } | Program::Rack { .. } => true,
                    // Its program is corral's own, outside the runtime directory.
                    Program::PhpNative { .. } => false,
                    Program::Command(argv) => {
                        Handoff::for_command(p.protocol, argv) == Handoff::Placeholder
                    }
                };
                let as_root = matches!(s.user.as_deref(), Some("root" | "0"));
                opens_paths && !as_root
            }
            Backend::External { .. } => false,
        });
    if front_socket_inside || workers_open_paths {
        TRAVERSE_MODE
    } else {
        PRIVATE_MODE
    }
}

/// Creates `dir` with `mode`, or checks the existing one and gives it `mode` (see the
/// module documentation for what is refused).
pub fn prepare(dir: &Path, mode: u32) -> Result<(), RuntimeDirError> {
    check_ancestors(dir)?;
    let meta = match std::fs::symlink_metadata(dir) {
        Ok(meta) => meta,
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            create_parents(dir)?;
            match std::fs::DirBuilder::new().mode(mode).create(dir) {
                Ok(()) => {}
                // Another corral got there first; it is checked like any existing one.
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
                Err(e) => return Err(io_error("create", dir)(e)),
            }
            std::fs::symlink_metadata(dir).map_err(io_error("inspect", dir))?
        }
        Err(e) => return Err(io_error("inspect", dir)(e)),
    };
    check_meta(dir, &meta)?;
    let uid = Uid::effective().as_raw();
    let current = meta.mode() & 0o7777;
    if meta.uid() != uid {
        let access = nix::unistd::AccessFlags::W_OK | nix::unistd::AccessFlags::X_OK;
        if nix::unistd::access(dir, access).is_err() {
            let user = nix::unistd::User::from_uid(Uid::effective())
                .ok()
                .flatten()
                .map_or_else(
                    || format!("uid {uid}"),
                    |u| format!("{} (uid {uid})", u.name),
                );
            return Err(RuntimeDirError::NotWritable {
                path: dir.to_path_buf(),
                user,
                advice: format!(
                    "run corral as root, or set server.runtime_dir to a directory of corral's \
                     own, such as {}, which corral creates",
                    own_dir()
                ),
            });
        }
    }
    // A root-owned directory a non-root corral uses is root's to set up.
    if meta.uid() == uid && current != mode {
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(mode))
            .map_err(io_error("chmod", dir))?;
    }
    Ok(())
}

/// Creates the missing ancestors of `dir`, outermost first, each with [`PARENT_MODE`] set
/// explicitly (corral's umask would otherwise make them 0700 and close the way through).
fn create_parents(dir: &Path) -> Result<(), RuntimeDirError> {
    let missing: Vec<&Path> = dir
        .ancestors()
        .skip(1)
        .take_while(|a| !a.as_os_str().is_empty() && std::fs::symlink_metadata(a).is_err())
        .collect();
    for parent in missing.into_iter().rev() {
        match std::fs::create_dir(parent) {
            Ok(()) => {
                std::fs::set_permissions(parent, std::fs::Permissions::from_mode(PARENT_MODE))
                    .map_err(io_error("chmod", parent))?
            }
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(io_error("create", parent)(e)),
        }
    }
    Ok(())
}

/// The directory a worker's socket goes in. A worker that binds its socket itself
/// (`{socket}` in its command) under another user than corral's cannot create it in the
/// runtime directory, so its pool gets `runtime_dir/POOL.d`, owned by that user and mode
/// 0700 (corral, as root, still connects). Every other worker's socket is bound by corral
/// and goes straight in the runtime directory.
pub fn worker_socket_dir(
    runtime_dir: &Path,
    pool: &str,
    handoff: Handoff,
    identity: Option<&Identity>,
) -> io::Result<PathBuf> {
    let Some(id) = identity.filter(|id| id.uid != Uid::effective()) else {
        return Ok(runtime_dir.to_path_buf());
    };
    if handoff != Handoff::Placeholder {
        return Ok(runtime_dir.to_path_buf());
    }
    let dir = runtime_dir.join(format!("{pool}.d"));
    match std::fs::DirBuilder::new().mode(PRIVATE_MODE).create(&dir) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(e),
    }
    // Left by an earlier run, perhaps for another user: made this pool's again. Nobody but
    // corral can write in the runtime directory, so what is found here is corral's own.
    let meta = std::fs::symlink_metadata(&dir)?;
    if !meta.is_dir() {
        return Err(io::Error::new(
            io::ErrorKind::AlreadyExists,
            format!("{} exists and is not a directory", dir.display()),
        ));
    }
    std::os::unix::fs::lchown(&dir, Some(id.uid.as_raw()), Some(id.gid.as_raw()))?;
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(PRIVATE_MODE))?;
    Ok(dir)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(extra: &str, pool: &str) -> Config {
        let text = format!(
            "[server]\nruntime_dir = \"/run/x\"\n[[contexts]]\npool = \"p\"\nroot = \"/srv\"\n\
             [[listen]]\naddress = \"127.0.0.1:0\"\nprotocol = \"http\"\n{extra}\n[pools.p]\n{pool}\n"
        );
        crate::config::parse(&text, "t.toml").unwrap()
    }

    #[test]
    fn the_mode_opens_search_only_for_who_needs_it() {
        let php = config("", "command = [\"php-cgi\"]");
        assert_eq!(mode_for(&php, true), PRIVATE_MODE);
        let wsgi = config("", "app = \"wsgi:m:app\"");
        assert_eq!(mode_for(&wsgi, true), TRAVERSE_MODE);
        assert_eq!(mode_for(&wsgi, false), PRIVATE_MODE);
        let as_root = config("", "app = \"wsgi:m:app\"\nuser = \"root\"");
        assert_eq!(mode_for(&as_root, true), PRIVATE_MODE);
        let binds = config("", "protocol = \"scgi\"\ncommand = [\"app\", \"{socket}\"]");
        assert_eq!(mode_for(&binds, true), TRAVERSE_MODE);
        let front = config(
            "[[listen]]\naddress = \"unix:/run/x/front.sock\"\nprotocol = \"fastcgi\"",
            "command = [\"php-cgi\"]",
        );
        assert_eq!(mode_for(&front, false), TRAVERSE_MODE);
    }

    #[test]
    fn prepare_creates_checks_and_refuses() {
        use std::os::unix::fs::PermissionsExt;
        let base = tempfile::tempdir().unwrap();
        let dir = base.path().join("a/b/run");
        prepare(&dir, PRIVATE_MODE).unwrap();
        let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o7777;
        assert_eq!(mode(&dir), PRIVATE_MODE);
        assert_eq!(mode(&base.path().join("a")), PARENT_MODE);
        // An existing directory gets the mode asked for.
        prepare(&dir, TRAVERSE_MODE).unwrap();
        assert_eq!(mode(&dir), TRAVERSE_MODE);

        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o757)).unwrap();
        let err = prepare(&dir, PRIVATE_MODE).unwrap_err();
        assert!(
            matches!(err, RuntimeDirError::Writable { mode: 0o757, .. }),
            "{err}"
        );
        assert_eq!(mode(&dir), 0o757, "left as found");

        let link = base.path().join("link");
        std::os::unix::fs::symlink(&dir, &link).unwrap();
        let err = prepare(&link, PRIVATE_MODE).unwrap_err();
        assert!(matches!(err, RuntimeDirError::Symlink { .. }), "{err}");

        let file = base.path().join("file");
        std::fs::write(&file, "").unwrap();
        let err = prepare(&file, PRIVATE_MODE).unwrap_err();
        assert!(
            matches!(err, RuntimeDirError::NotADirectory { .. }),
            "{err}"
        );
    }

    #[test]
    fn an_ancestor_others_may_write_in_is_refused_unless_sticky_and_roots() {
        use std::os::unix::fs::PermissionsExt;
        let base = tempfile::tempdir().unwrap();
        let open = base.path().join("open");
        std::fs::create_dir(&open).unwrap();
        std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o777)).unwrap();
        let dir = open.join("a/run");
        let err = prepare(&dir, PRIVATE_MODE).unwrap_err();
        assert!(
            matches!(&err, RuntimeDirError::AncestorWritable { path, mode: 0o777, .. } if *path == open),
            "{err}"
        );
        assert!(!dir.exists() && !open.join("a").exists(), "nothing created");
        assert!(
            err.to_string()
                .contains(&format!("chmod go-w {}", open.display())),
            "{err}"
        );
        // Reached through a symbolic link, the directory it leads to is checked.
        let link = base.path().join("link");
        std::os::unix::fs::symlink(&open, &link).unwrap();
        let err = check_ancestors(&link.join("run")).unwrap_err();
        assert!(
            matches!(err, RuntimeDirError::AncestorWritable { .. }),
            "{err}"
        );

        // Sticky, as /tmp: nobody else may rename what is in it.
        if Uid::effective().is_root() {
            std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o1777)).unwrap();
            prepare(&dir, PRIVATE_MODE).unwrap();
            check_existing(&dir).unwrap();
        }
    }

    #[test]
    fn a_shared_directory_gets_a_directory_of_its_own_as_advice_not_chmod() {
        let err = check_existing(Path::new("/tmp")).unwrap_err();
        let text = err.to_string();
        assert!(matches!(err, RuntimeDirError::Writable { .. }), "{text}");
        assert!(!text.contains("chmod go-w"), "{text}");
        assert!(text.contains("a directory of corral's own"), "{text}");
        assert!(advice(Path::new("/var/tmp"), 0o1777).contains("do not chmod it"));
        assert!(advice(Path::new("/run"), 0o775).contains("do not chmod it"));
        let mine = advice(Path::new("/srv/app/run"), 0o775);
        assert!(mine.starts_with("run `chmod go-w /srv/app/run`"), "{mine}");
    }
}
