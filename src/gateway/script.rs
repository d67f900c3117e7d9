//! The guard between a URL and code execution: before a request of a script context (one with
//! a document root) reaches its backend, the file SCRIPT_FILENAME names must exist, be a
//! regular file, lie under the document root once both are resolved (symlinks followed), and
//! carry an allowed script extension under its real name too.
//!
//! php-cgi has no `security.limit_extensions`, and with `cgi.fix_pathinfo=1` (its default) it
//! walks a missing `/uploads/avatar.gif/x.php` back to the gif and runs it; switching
//! fix_pathinfo off does not help either (php-cgi then runs PATH_TRANSLATED). So corral checks
//! the file itself, on every front (HTTP, FastCGI, SCGI), the way nginx's `try_files $uri =404`
//! does, and a refused request never takes a slot or touches a worker.
//!
//! The script is opened once beneath a descriptor of the document root and judged by that
//! descriptor (`crate::beneath`): its type by `fstat`, its real name by the walk (no symlink
//! followed) or read back from `/proc/self/fd` (a symlink followed). The calls are plain
//! system calls on the runtime thread (an `O_PATH` open, never a read, of a file the page
//! cache already holds: five calls for a script reached without symlinks; moving them to
//! the blocking pool would cost more in thread hand-offs). The realpath walks this replaced
//! measured as a fifth of a hello-world request's cost; a script that passed is still
//! remembered by its thread for [`PASSED_FOR`], as php's own realpath cache and nginx's
//! open_file_cache remember theirs. Only passes are remembered: a path never checked, or one
//! that failed, is checked in full every time. What a remembered pass can miss is a script
//! deleted or replaced within that window, which takes write access to the document root.

use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use crate::beneath::{open_beneath, Access, Dir, OpenError};
use crate::protocols::cgi::{
    has_allowed_ext, has_hidden_segment, CgiContext, CgiParams, ScriptMode,
};

/// Why a script request was refused before any backend was contacted.
#[derive(Debug, thiserror::Error)]
pub enum ScriptFileError {
    /// The parameters name no SCRIPT_FILENAME although the context runs script files.
    #[error("no SCRIPT_FILENAME to check")]
    NoFilename,
    /// The document root itself cannot be resolved.
    #[error("the document root {} cannot be resolved: {source}", .root.display())]
    Root {
        /// The configured root.
        root: PathBuf,
        /// What realpath said.
        source: std::io::Error,
    },
    /// The script does not exist (or a path component is not a directory).
    #[error("script {} does not exist: {source}", .path.display())]
    Missing {
        /// SCRIPT_FILENAME.
        path: PathBuf,
        /// What realpath said.
        source: std::io::Error,
    },
    /// The script resolves outside the real document root (a symlink out of it).
    #[error("script {} resolves to {}, outside the document root {}", .path.display(), .real.display(), .root.display())]
    OutsideRoot {
        /// SCRIPT_FILENAME.
        path: PathBuf,
        /// Its real path.
        real: PathBuf,
        /// The real document root.
        root: PathBuf,
    },
    /// The script is a directory, a device, a socket...
    #[error("script {} is not a regular file", .path.display())]
    NotAFile {
        /// SCRIPT_FILENAME.
        path: PathBuf,
    },
    /// The real file has no allowed extension or sits under a hidden directory (a symlink
    /// `x.php -> avatar.gif`, `x.php -> .env`).
    #[error("script {} resolves to {}, which is not an allowed script", .path.display(), .real.display())]
    NotAScript {
        /// SCRIPT_FILENAME.
        path: PathBuf,
        /// Its real path.
        real: PathBuf,
    },
}

impl ScriptFileError {
    /// The status for the client: 404 for every refusal about the file (php-fpm answers
    /// "File not found." the same way, and a 403 would confirm that something is there);
    /// 500 when the configured root itself is unusable.
    pub fn status(&self) -> u16 {
        match self {
            ScriptFileError::Root { .. } => 500,
            _ => 404,
        }
    }
}

type Passed =
    std::collections::HashMap<Vec<u8>, std::collections::HashMap<Vec<u8>, tokio::time::Instant>>;

/// How long a thread reuses a script's pass.
pub const PASSED_FOR: std::time::Duration = std::time::Duration::from_secs(2);
/// Passes one thread remembers at most; when full it starts over.
const PASSED_MAX: usize = 4096;

thread_local! {
    /// Scripts that passed, by document root and then SCRIPT_FILENAME, with when they did.
    /// Per thread, so the request path takes no lock; looked up by borrowed bytes, so a hit
    /// allocates nothing.
    static PASSED: std::cell::RefCell<Passed> = std::cell::RefCell::default();
}

/// Checks the script a request of context `cgi` would run; `Ok` for contexts that run an
/// application rather than files.
pub fn check(cgi: &CgiContext, params: &CgiParams) -> Result<(), ScriptFileError> {
    let ScriptMode::Files { .. } = &cgi.mode else {
        return Ok(());
    };
    let raw = params
        .get(b"SCRIPT_FILENAME")
        .ok_or(ScriptFileError::NoFilename)?;
    let now = tokio::time::Instant::now();
    let fresh = PASSED.with(|passed| {
        passed
            .borrow()
            .get(cgi.document_root.as_slice())
            .and_then(|scripts| scripts.get(raw))
            .is_some_and(|&at| now.duration_since(at) < PASSED_FOR)
    });
    if fresh {
        return Ok(());
    }
    check_now(cgi, Path::new(std::ffi::OsStr::from_bytes(raw)))?;
    PASSED.with(|passed| {
        let mut passed = passed.borrow_mut();
        // A root no longer served (a symlink deploy moved the generation to the next
        // release's real root, src/deploy/links.rs) is not remembered past PASSED_FOR.
        passed.retain(|root, scripts| {
            *root == cgi.document_root
                || scripts
                    .values()
                    .any(|&at| now.duration_since(at) < PASSED_FOR)
        });
        let scripts = passed.entry(cgi.document_root.clone()).or_default();
        if scripts.len() >= PASSED_MAX {
            scripts.clear();
        }
        scripts.insert(raw.to_vec(), now);
    });
    Ok(())
}

/// The whole check, against the file system as it is now: the script is opened once
/// (`O_PATH`: looked at, never read) beneath a descriptor of the document root, and its
/// type and real name are those of the descriptor that was opened (ARCHITECTURE.md
/// invariant 17), so no swap between two path walks can pass a file the checks never saw.
fn check_now(cgi: &CgiContext, filename: &Path) -> Result<(), ScriptFileError> {
    let ScriptMode::Files { extensions, .. } = &cgi.mode else {
        return Ok(());
    };
    let root = Path::new(std::ffi::OsStr::from_bytes(&cgi.document_root));
    let dir = Dir::open(root).map_err(|source| ScriptFileError::Root {
        root: root.to_path_buf(),
        source,
    })?;
    // SCRIPT_FILENAME is the document root and the script's path on every front; one that
    // is not (a front server that resolved the root's symlink itself) is walked whole, and
    // must still land beneath the root.
    let rel = filename.strip_prefix(root).unwrap_or(filename);
    let opened = match open_beneath(&dir, rel, Access::Look) {
        Ok(o) => o,
        Err(OpenError::Io(source)) => {
            return Err(ScriptFileError::Missing {
                path: filename.to_path_buf(),
                source,
            })
        }
        Err(OpenError::Outside { real, dir }) => {
            return Err(ScriptFileError::OutsideRoot {
                path: filename.to_path_buf(),
                real,
                root: dir,
            })
        }
    };
    let real = opened.real_rel(rel);
    let name_ok = real
        .file_name()
        .is_some_and(|n| has_allowed_ext(n.as_bytes(), extensions));
    let mut rel_path = b"/".to_vec();
    rel_path.extend_from_slice(real.as_os_str().as_bytes());
    if !name_ok || has_hidden_segment(&rel_path) {
        return Err(ScriptFileError::NotAScript {
            path: filename.to_path_buf(),
            real: root.join(real),
        });
    }
    if !opened.meta.is_file() {
        return Err(ScriptFileError::NotAFile {
            path: filename.to_path_buf(),
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;

    fn ctx(root: &Path) -> CgiContext {
        CgiContext {
            document_root: root.as_os_str().as_bytes().to_vec(),
            mode: ScriptMode::Files {
                extensions: vec![b"php".to_vec()],
                index: vec![b"index.php".to_vec()],
            },
            server_software: Bytes::from_static(b"corral"),
            extra_env: Vec::new(),
            allow_php_ini_params: false,
        }
    }

    fn params(file: &Path) -> CgiParams {
        CgiParams::from_pairs(&[(&b"SCRIPT_FILENAME"[..], file.as_os_str().as_bytes())]).unwrap()
    }

    #[test]
    fn only_real_scripts_under_the_real_root_pass() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("www");
        std::fs::create_dir_all(root.join("uploads")).unwrap();
        std::fs::create_dir_all(root.join("dir.php")).unwrap();
        std::fs::create_dir_all(root.join(".git")).unwrap();
        std::fs::write(root.join("index.php"), "<?php").unwrap();
        std::fs::write(root.join("uploads/avatar.gif"), "GIF89a<?php").unwrap();
        std::fs::write(root.join(".git/hook.php"), "<?php").unwrap();
        std::fs::write(dir.path().join("outside.php"), "<?php").unwrap();
        std::os::unix::fs::symlink(root.join("uploads/avatar.gif"), root.join("gif.php")).unwrap();
        std::os::unix::fs::symlink(dir.path().join("outside.php"), root.join("out.php")).unwrap();
        std::os::unix::fs::symlink(root.join(".git/hook.php"), root.join("hook.php")).unwrap();
        let c = ctx(&root);
        assert!(check(&c, &params(&root.join("index.php"))).is_ok());
        let refused = |p: PathBuf| check(&c, &params(&p)).unwrap_err();
        assert!(matches!(
            refused(root.join("uploads/avatar.gif/x.php")),
            ScriptFileError::Missing { .. }
        ));
        assert!(matches!(
            refused(root.join("missing.php")),
            ScriptFileError::Missing { .. }
        ));
        assert!(matches!(
            refused(root.join("gif.php")),
            ScriptFileError::NotAScript { .. }
        ));
        assert!(matches!(
            refused(root.join("hook.php")),
            ScriptFileError::NotAScript { .. }
        ));
        assert!(matches!(
            refused(root.join("out.php")),
            ScriptFileError::OutsideRoot { .. }
        ));
        assert!(matches!(
            refused(root.join("dir.php")),
            ScriptFileError::NotAFile { .. }
        ));
        assert!(matches!(
            check(&c, &CgiParams::default()).unwrap_err(),
            ScriptFileError::NoFilename
        ));
        // A root reached through a symlink (a `current -> releases/42` deploy) is fine.
        std::os::unix::fs::symlink(&root, dir.path().join("current")).unwrap();
        let c = ctx(&dir.path().join("current"));
        assert!(check(&c, &params(&dir.path().join("current/index.php"))).is_ok());
    }

    #[tokio::test(start_paused = true)]
    async fn a_pass_is_remembered_briefly_and_a_failure_never() {
        let dir = tempfile::tempdir().unwrap();
        let script = dir.path().join("a.php");
        std::fs::write(&script, "<?php").unwrap();
        let c = ctx(dir.path());
        assert!(check(&c, &params(&script)).is_ok());
        std::fs::remove_file(&script).unwrap();
        // Within PASSED_FOR the pass stands (no system call is made for it)...
        assert!(check(&c, &params(&script)).is_ok());
        tokio::time::advance(PASSED_FOR).await;
        // ...then the file is looked at again.
        assert!(matches!(
            check(&c, &params(&script)).unwrap_err(),
            ScriptFileError::Missing { .. }
        ));
        // A failure is not remembered: the file appearing is seen at once.
        std::fs::write(&script, "<?php").unwrap();
        assert!(check(&c, &params(&script)).is_ok());
    }

    #[tokio::test(start_paused = true)]
    async fn a_root_no_longer_served_is_forgotten() {
        let dir = tempfile::tempdir().unwrap();
        for release in ["1", "2"] {
            std::fs::create_dir_all(dir.path().join(release)).unwrap();
            std::fs::write(dir.path().join(release).join("a.php"), "<?php").unwrap();
        }
        let one = ctx(&dir.path().join("1"));
        assert!(check(&one, &params(&dir.path().join("1/a.php"))).is_ok());
        let roots = || PASSED.with(|p| p.borrow().len());
        assert_eq!(roots(), 1);
        tokio::time::advance(PASSED_FOR).await;
        let two = ctx(&dir.path().join("2"));
        assert!(check(&two, &params(&dir.path().join("2/a.php"))).is_ok());
        assert_eq!(roots(), 1);
    }

    #[test]
    fn application_contexts_are_not_checked() {
        let mut c = ctx(Path::new("/nonexistent"));
        c.mode = ScriptMode::App { mount: Vec::new() };
        assert!(check(&c, &CgiParams::default()).is_ok());
    }
}
