//! Opening a file beneath a directory so that what is checked is what was opened: every file
//! corral opens on a client's or a backend's behalf (static files, the front controller's
//! existence test, X-Sendfile and X-Accel-Redirect, the script guard) is opened once,
//! relative to a descriptor of its directory, and judged by that descriptor (`fstat`, and
//! its real path read back from `/proc/self/fd`), never by a path checked first and opened
//! again: between those two, anyone who can write a directory under the root could swap the
//! file for a symlink to `/etc/shadow` (ARCHITECTURE.md, invariant 17).
//!
//! [`open_beneath`] asks `openat2(2)` with `RESOLVE_BENEATH` for a walk that cannot leave the
//! directory, first without following any symlink (the common case, which needs no real-path
//! read-back: the file is where its name says), then following symlinks that stay beneath
//! (`RESOLVE_NO_MAGICLINKS`: no `/proc/…/fd` jumps). The kernel refuses an absolute symlink
//! under `RESOLVE_BENEATH` even when it points back inside (`current -> /srv/site/v2`), and
//! corral has always served those; so for them (and on a kernel without `openat2`) the walk
//! follows symlinks without opening anything (`O_PATH`), the real path is read from the
//! descriptor and must lie under the directory's real path, and only then is that same
//! descriptor reopened for reading through `/proc/self/fd`. Either way the descriptor, not
//! the name, is what was checked.
//!
//! Files are opened with `O_NONBLOCK` (a named pipe does not wait for a writer), `O_NOCTTY`
//! and `O_CLOEXEC`; symlinks inside the directory are followed (the rules judge the real
//! name instead), so `O_NOFOLLOW` is not used. The calls block like any file-system call on
//! a tree the kernel has not cached; the request path makes them on its serving thread and
//! keeps them few, as nginx does its `open` and `stat` (docs/decisions.md, decision 41).

use std::fs::{File, Metadata};
use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};

use nix::errno::Errno;
use nix::fcntl::{openat, openat2, OFlag, OpenHow, ResolveFlag};
use nix::sys::stat::Mode;

/// A directory files are opened beneath: an `O_PATH` descriptor taken by its path once, so
/// every walk starts from the same directory whatever happens to that path meanwhile.
#[derive(Debug)]
pub struct Dir {
    fd: OwnedFd,
}

impl Dir {
    /// Opens the directory at `path` (symlinks in `path` itself are followed: the
    /// configuration names it).
    pub fn open(path: &Path) -> io::Result<Dir> {
        let fd = nix::fcntl::open(
            path,
            OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
            Mode::empty(),
        )?;
        Ok(Dir { fd })
    }

    /// The directory's real path, as the kernel names it now.
    pub fn real_path(&self) -> io::Result<PathBuf> {
        fd_path(&self.fd)
    }
}

/// What a file is opened for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    /// Reading (`O_RDONLY | O_NONBLOCK`); readable only when it is a regular file, which the
    /// caller checks on [`Opened::meta`] before reading.
    Read,
    /// Looking only (`O_PATH`): existence, type and real name, never the contents.
    Look,
}

/// A file opened beneath a [`Dir`].
#[derive(Debug)]
pub struct Opened {
    /// The open file.
    pub file: File,
    /// Its `fstat`.
    pub meta: Metadata,
    /// Its real path relative to the directory's real path when a symlink led to it; `None`
    /// when the walk followed none, so the file is at the path asked for.
    pub real: Option<PathBuf>,
}

impl Opened {
    /// The file's real path relative to the directory: `asked` when no symlink was followed.
    pub fn real_rel<'a>(&'a self, asked: &'a Path) -> &'a Path {
        self.real.as_deref().unwrap_or(asked)
    }
}

/// Why [`open_beneath`] opened nothing.
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    /// The file system's own refusal: missing, a component not a directory, a symlink loop,
    /// no permission.
    #[error("{0}")]
    Io(#[from] io::Error),
    /// The file resolves outside the directory (a symlink out of it).
    #[error("it resolves to {}, outside {}", .real.display(), .dir.display())]
    Outside {
        /// Where it resolves.
        real: PathBuf,
        /// The directory's real path.
        dir: PathBuf,
    },
}

/// Opens `rel` (a relative path without `.` or `..` segments; empty for the directory
/// itself) beneath `dir`, as the module doc says.
pub fn open_beneath(dir: &Dir, rel: &Path, access: Access) -> Result<Opened, OpenError> {
    let rel = if rel.as_os_str().is_empty() {
        Path::new(".")
    } else {
        rel
    };
    let flags = match access {
        Access::Read => OFlag::O_RDONLY | OFlag::O_NONBLOCK | OFlag::O_NOCTTY | OFlag::O_CLOEXEC,
        Access::Look => OFlag::O_PATH | OFlag::O_CLOEXEC,
    };
    let how = |resolve| OpenHow::new().flags(flags).resolve(resolve);
    let plain = openat2(
        &dir.fd,
        rel,
        how(ResolveFlag::RESOLVE_BENEATH | ResolveFlag::RESOLVE_NO_SYMLINKS),
    );
    let followed = match plain {
        Ok(fd) => return opened(fd, None),
        // ELOOP: a symlink on the way. Follow those that stay beneath.
        Err(Errno::ELOOP) => openat2(
            &dir.fd,
            rel,
            how(ResolveFlag::RESOLVE_BENEATH | ResolveFlag::RESOLVE_NO_MAGICLINKS),
        ),
        Err(e) => Err(e),
    };
    match followed {
        Ok(fd) => {
            let real = fd_path(&fd)?;
            let real_dir = dir.real_path()?;
            let rel = under(&real, &real_dir)?;
            opened(fd, Some(rel))
        }
        // EXDEV: an absolute symlink, or one out of the directory; ENOSYS: no openat2;
        // EAGAIN: the kernel could not rule out a race on `..` in a symlink's target.
        Err(Errno::EXDEV | Errno::ENOSYS | Errno::EAGAIN) => followed_by_path(dir, rel, access),
        Err(e) => Err(OpenError::Io(e.into())),
    }
}

/// The walk for symlinks `RESOLVE_BENEATH` refuses: follow them without opening anything,
/// check where the descriptor landed, and only then reopen that same file for reading.
fn followed_by_path(dir: &Dir, rel: &Path, access: Access) -> Result<Opened, OpenError> {
    let fd = openat(
        &dir.fd,
        rel,
        OFlag::O_PATH | OFlag::O_CLOEXEC,
        Mode::empty(),
    )
    .map_err(io::Error::from)?;
    let real = fd_path(&fd)?;
    let real_dir = dir.real_path()?;
    let rel = under(&real, &real_dir)?;
    let looked = File::from(fd);
    let meta = looked.metadata()?;
    let file = if access == Access::Read && meta.is_file() {
        // The magic link reopens the very file the O_PATH descriptor holds: no second walk.
        File::from(
            nix::fcntl::open(
                &proc_fd(&looked),
                OFlag::O_RDONLY | OFlag::O_NONBLOCK | OFlag::O_NOCTTY | OFlag::O_CLOEXEC,
                Mode::empty(),
            )
            .map_err(io::Error::from)?,
        )
    } else {
        looked
    };
    Ok(Opened {
        file,
        meta,
        real: Some(rel),
    })
}

fn opened(fd: OwnedFd, real: Option<PathBuf>) -> Result<Opened, OpenError> {
    let file = File::from(fd);
    let meta = file.metadata()?;
    Ok(Opened { file, meta, real })
}

/// `real` relative to `real_dir`, or the refusal when it lies outside.
fn under(real: &Path, real_dir: &Path) -> Result<PathBuf, OpenError> {
    match real.strip_prefix(real_dir) {
        Ok(rel) => Ok(rel.to_path_buf()),
        Err(_) => Err(OpenError::Outside {
            real: real.to_path_buf(),
            dir: real_dir.to_path_buf(),
        }),
    }
}

fn proc_fd(fd: &impl AsRawFd) -> PathBuf {
    PathBuf::from(format!("/proc/self/fd/{}", fd.as_raw_fd()))
}

/// The path the kernel has for an open descriptor.
fn fd_path(fd: &impl AsRawFd) -> io::Result<PathBuf> {
    Ok(PathBuf::from(nix::fcntl::readlink(&proc_fd(fd))?))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;
    use std::os::unix::fs::symlink;

    fn read(dir: &Dir, rel: &str) -> Result<(String, Option<PathBuf>), OpenError> {
        let mut o = open_beneath(dir, Path::new(rel), Access::Read)?;
        let mut text = String::new();
        o.file.read_to_string(&mut text).map_err(OpenError::Io)?;
        Ok((text, o.real))
    }

    #[test]
    fn symlinks_are_followed_only_while_they_stay_beneath() {
        let t = tempfile::tempdir().unwrap();
        let root = t.path().join("root");
        std::fs::create_dir_all(root.join("sub")).unwrap();
        std::fs::write(root.join("sub/a.txt"), "a").unwrap();
        std::fs::write(t.path().join("secret"), "secret").unwrap();
        symlink("sub/a.txt", root.join("rel.txt")).unwrap();
        symlink(root.join("sub/a.txt"), root.join("abs.txt")).unwrap();
        symlink("../secret", root.join("up.txt")).unwrap();
        symlink(t.path().join("secret"), root.join("out.txt")).unwrap();
        symlink("/proc/self/root/etc/hostname", root.join("magic.txt")).unwrap();
        let dir = Dir::open(&root).unwrap();

        assert_eq!(read(&dir, "sub/a.txt").unwrap(), ("a".into(), None));
        let inside = Some(PathBuf::from("sub/a.txt"));
        assert_eq!(read(&dir, "rel.txt").unwrap(), ("a".into(), inside.clone()));
        // The kernel refuses an absolute symlink beneath; the path walk serves it.
        assert_eq!(read(&dir, "abs.txt").unwrap(), ("a".into(), inside));
        for out in ["up.txt", "out.txt", "magic.txt"] {
            assert!(
                matches!(read(&dir, out), Err(OpenError::Outside { .. })),
                "{out}"
            );
        }
        assert!(matches!(read(&dir, "missing"), Err(OpenError::Io(_))));
        let o = open_beneath(&dir, Path::new(""), Access::Look).unwrap();
        assert!(o.meta.is_dir());
    }

    #[test]
    fn a_named_pipe_opens_at_once_and_is_no_regular_file() {
        let t = tempfile::tempdir().unwrap();
        nix::unistd::mkfifo(&t.path().join("pipe"), Mode::from_bits_truncate(0o600)).unwrap();
        symlink(t.path().join("pipe"), t.path().join("abs-pipe")).unwrap();
        let dir = Dir::open(t.path()).unwrap();
        for name in ["pipe", "abs-pipe"] {
            let o = open_beneath(&dir, Path::new(name), Access::Read).unwrap();
            assert!(!o.meta.is_file(), "{name}");
        }
    }
}
