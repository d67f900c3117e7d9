//! The launchers corral embeds for the apps people deploy (ARCHITECTURE.md decision 14): a Python
//! WSGI launcher and a Ruby Rack launcher, both speaking LSAPI over persistent connections, each
//! written with only its language's standard library, each taking its listening socket on fd 0 and
//! serving one request at a time. A pool that says `app = "wsgi:module:callable"` or `app = "rack:config.ru"` runs them;
//! they are written into the runtime directory when the pool is built, so the binary is all a
//! deployment needs. That directory is corral's own (its owner and mode are checked before anything
//! is written there), and the files are written so that nothing planted in it is ever followed.

use std::io::{self, Write};
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use nix::fcntl::OFlag;

use crate::config::Program;

/// The Python WSGI launcher (LSAPI on fd 0).
pub const WSGI: &str = include_str!("wsgi.py");
/// The Ruby Rack launcher (LSAPI on fd 0).
pub const RACK: &str = include_str!("rack.rb");

/// The argv that runs `program` through its launcher, after writing the launcher into
/// `runtime_dir`; `None` for a plain `command`, which needs no launcher. The interpreter is
/// the pool's (`python`, `virtualenv`, `ruby`) and is run by the path written there, never
/// resolved first: a virtualenv's `bin/python` is a symbolic link, and Python finds the
/// environment (its `pyvenv.cfg`) from the path it was started by.
pub fn command(program: &Program, runtime_dir: &Path) -> io::Result<Option<Vec<String>>> {
    match program {
        Program::Command(_) => Ok(None),
        Program::PhpNative {
            worker_path,
            worker_script,
        } => {
            let mut argv = vec![php_worker(worker_path.as_deref())];
            if let Some(script) = worker_script {
                argv.push("--worker".to_owned());
                argv.push(script.display().to_string());
            }
            Ok(Some(argv))
        }
        Program::Wsgi {
            module,
            callable,
            python,
            native: Some(native),
        } => Ok(Some(vec![
            wsgi_worker(native.worker_path.as_deref()),
            python.clone(),
            format!("{module}:{callable}"),
        ])),
        Program::Wsgi {
            module,
            callable,
            python,
            native: None,
        } => {
            let path = write(runtime_dir, "corral-wsgi.py", WSGI)?;
            Ok(Some(vec![
                python.clone(),
                path.display().to_string(),
                format!("{module}:{callable}"),
            ]))
        }
        Program::Rack { rackup, ruby } => {
            let path = write(runtime_dir, "corral-rack.rb", RACK)?;
            Ok(Some(vec![
                ruby.clone(),
                path.display().to_string(),
                rackup.display().to_string(),
            ]))
        }
    }
}

/// The program name of corral's native PHP worker (the `workers/php` package).
pub const PHP_WORKER: &str = "corral-php-worker";

/// The program a `worker = "native"` pool runs: `worker_path` as written; else
/// [`PHP_WORKER`] in the directory of corral's own executable when it is there (a package
/// installs both in one directory, and cargo builds both into one target directory); else
/// the bare name, which the worker's `PATH` resolves.
pub fn php_worker(worker_path: Option<&str>) -> String {
    native_worker(PHP_WORKER, worker_path)
}

/// The program name of corral's native WSGI worker (the `workers/wsgi` package).
pub const WSGI_WORKER: &str = "corral-wsgi-worker";

/// The program an `app = "wsgi:..."` + `worker = "native"` pool runs, found by the rules of
/// [`php_worker`]. Its arguments are the pool's Python (which the embedded interpreter
/// starts as, so a virtualenv is found) and `module:callable`.
pub fn wsgi_worker(worker_path: Option<&str>) -> String {
    native_worker(WSGI_WORKER, worker_path)
}

fn native_worker(name: &str, worker_path: Option<&str>) -> String {
    if let Some(path) = worker_path {
        return path.to_owned();
    }
    let beside = std::env::current_exe()
        .ok()
        .and_then(|exe| exe.parent().map(|dir| dir.join(name)))
        .filter(|path| path.is_file());
    match beside {
        Some(path) => path.display().to_string(),
        None => name.to_owned(),
    }
}

/// Writes the launcher of every `app = ...` pool of `config` into its runtime directory and
/// gives each such pool's command by name: the one step of building pools that touches the
/// file system, done before the (side-effect free) pool registry is built.
pub fn install(
    config: &crate::config::Config,
) -> Result<std::collections::HashMap<String, Vec<String>>, crate::error::StartupError> {
    let dir = &config.server.runtime_dir;
    let mut commands = std::collections::HashMap::new();
    for p in &config.pools {
        let crate::config::Backend::Spawned(spawn) = &p.backend else {
            continue;
        };
        let argv = command(&spawn.program, dir).map_err(|source| {
            crate::error::StartupError::Launcher {
                pool: p.name.clone(),
                dir: dir.clone(),
                source,
            }
        })?;
        if let Some(argv) = argv {
            commands.insert(p.name.clone(), argv);
        }
    }
    Ok(commands)
}

/// Mode of a launcher file: a root corral's workers run as another user and must read it;
/// nobody but corral may change it. The text is the one embedded in the binary, so there is
/// nothing secret to hide from other readers.
pub const LAUNCHER_MODE: u32 = 0o644;

/// Writes `text` to `dir/name` (which must exist) through a fresh temporary file renamed
/// into place, so a worker never runs half a file.
///
/// Nothing already in `dir` is trusted or followed: the temporary name is unlinked first
/// (unlinking a symbolic link removes the link, not its target), then created with
/// `O_EXCL | O_NOFOLLOW`, which fails rather than open anything planted there in between;
/// `rename` replaces whatever sits at `dir/name`, a symbolic link included, without
/// touching what it points to. Every pool rewrites the file, which costs a few kilobytes
/// once at start and saves trusting an old copy. The mode is set on the open file, since
/// corral's umask (077) would strip the read bits the workers need.
fn write(dir: &Path, name: &str, text: &str) -> io::Result<PathBuf> {
    let path = dir.join(name);
    let tmp = dir.join(format!(".{name}.{}.tmp", std::process::id()));
    match std::fs::remove_file(&tmp) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(e),
    }
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .custom_flags(OFlag::O_NOFOLLOW.bits())
        .mode(LAUNCHER_MODE)
        .open(&tmp)?;
    file.set_permissions(std::fs::Permissions::from_mode(LAUNCHER_MODE))?;
    file.write_all(text.as_bytes())?;
    drop(file);
    std::fs::rename(&tmp, &path)?;
    Ok(path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn launchers_are_written_once_and_named_in_the_command() {
        let dir = tempfile::tempdir().unwrap();
        let wsgi = Program::Wsgi {
            module: "app.wsgi".into(),
            callable: "application".into(),
            python: "/srv/app/venv/bin/python".into(),
            native: None,
        };
        let argv = command(&wsgi, dir.path()).unwrap().unwrap();
        // The pool's interpreter, as written: a venv's bin/python is not resolved.
        assert_eq!(argv[0], "/srv/app/venv/bin/python");
        assert_eq!(argv[2], "app.wsgi:application");
        assert_eq!(std::fs::read_to_string(&argv[1]).unwrap(), WSGI);
        // A second pool reuses the file.
        assert_eq!(command(&wsgi, dir.path()).unwrap().unwrap(), argv);
        let rack = Program::Rack {
            rackup: "config.ru".into(),
            ruby: "ruby3.1".into(),
        };
        let argv = command(&rack, dir.path()).unwrap().unwrap();
        assert_eq!(
            (argv[0].as_str(), argv[2].as_str()),
            ("ruby3.1", "config.ru")
        );
        assert!(
            command(&Program::Command(vec!["php-cgi".into()]), dir.path())
                .unwrap()
                .is_none()
        );
    }

    #[test]
    fn the_native_wsgi_worker_gets_the_pools_python_and_app() {
        let dir = tempfile::tempdir().unwrap();
        let wsgi = Program::Wsgi {
            module: "app.wsgi".into(),
            callable: "application".into(),
            python: "/srv/app/venv/bin/python".into(),
            native: Some(crate::config::NativeWsgi {
                worker_path: Some("/opt/corral/corral-wsgi-worker".into()),
            }),
        };
        let argv = command(&wsgi, dir.path()).unwrap().unwrap();
        assert_eq!(
            argv,
            [
                "/opt/corral/corral-wsgi-worker",
                "/srv/app/venv/bin/python",
                "app.wsgi:application"
            ]
        );
        // No launcher file is written for it.
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
    }

    #[test]
    fn a_planted_symlink_is_replaced_and_its_target_left_alone() {
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("target");
        std::fs::write(&target, "precious").unwrap();
        let path = dir.path().join("corral-wsgi.py");
        std::os::unix::fs::symlink(&target, &path).unwrap();
        // A stale temporary name (as a symbolic link too) is no obstacle either.
        let tmp = dir
            .path()
            .join(format!(".corral-wsgi.py.{}.tmp", std::process::id()));
        std::os::unix::fs::symlink(&target, &tmp).unwrap();
        let wsgi = Program::Wsgi {
            module: "m".into(),
            callable: "app".into(),
            python: crate::config::DEFAULT_PYTHON.into(),
            native: None,
        };
        command(&wsgi, dir.path()).unwrap();
        assert_eq!(std::fs::read_to_string(&target).unwrap(), "precious");
        let meta = std::fs::symlink_metadata(&path).unwrap();
        assert!(meta.file_type().is_file(), "{meta:?}");
        assert_eq!(meta.permissions().mode() & 0o7777, LAUNCHER_MODE);
        assert_eq!(std::fs::read_to_string(&path).unwrap(), WSGI);
        assert!(!tmp.exists());
    }
}
