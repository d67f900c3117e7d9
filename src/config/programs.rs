//! Whether the programs a configuration's pools would run exist and can be executed: each
//! `command`'s program, and the interpreter of an `app` pool (`python`, `virtualenv`'s
//! `bin/python`, `ruby`, or the default one). A name without a `/` is looked up in the
//! worker's `PATH` (the pool's `env` PATH, else corral's), as the spawn will.
//!
//! This looks at the file system, so it is not part of [`super::parse`], which stays a
//! function of the text: `corral check` reports what it finds as errors (a missing
//! interpreter would otherwise pass the check, and `run` would retry spawns forever while
//! clients get 503), `corral run` logs it and starts anyway.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use super::diagnostic::ConfigError;
use super::file::FileConfig;
use super::{Backend, Config, Program, DEFAULT_PYTHON, DEFAULT_RUBY};

/// One error per pool program that does not exist or cannot be executed, located at the
/// key that names it. `src` and `origin` are what `config` was parsed from; `path_var` is
/// corral's `PATH` (`None`: the default the workers get).
pub fn check_programs(
    config: &Config,
    src: &str,
    origin: &str,
    path_var: Option<&str>,
) -> Vec<ConfigError> {
    // The text parsed once already; its spans say where each program was named.
    let Ok(file) = FileConfig::from_toml(src, origin) else {
        return Vec::new();
    };
    let mut errors = Vec::new();
    for pool in &config.pools {
        let Backend::Spawned(spawn) = &pool.backend else {
            continue;
        };
        let written = file
            .pools
            .iter()
            .find(|(name, _)| name.get_ref() == &pool.name)
            .map(|(_, p)| p.get_ref());
        let (program, mut key, mut span) = match &spawn.program {
            Program::Command(argv) => {
                let span = written
                    .and_then(|p| p.command.as_ref())
                    .and_then(|c| c.get_ref().first())
                    .map(toml::Spanned::span);
                (argv.first().cloned().unwrap_or_default(), "command", span)
            }
            Program::Wsgi { python, .. } => {
                let (key, span) = match written {
                    Some(p) if p.python.is_some() => {
                        ("python", p.python.as_ref().map(toml::Spanned::span))
                    }
                    Some(p) if p.virtualenv.is_some() => {
                        ("virtualenv", p.virtualenv.as_ref().map(toml::Spanned::span))
                    }
                    Some(p) => ("app", p.app.as_ref().map(toml::Spanned::span)),
                    None => ("app", None),
                };
                (python.clone(), key, span)
            }
            Program::Rack { ruby, .. } => {
                let (key, span) = match written {
                    Some(p) if p.ruby.is_some() => {
                        ("ruby", p.ruby.as_ref().map(toml::Spanned::span))
                    }
                    Some(p) => ("app", p.app.as_ref().map(toml::Spanned::span)),
                    None => ("app", None),
                };
                (ruby.clone(), key, span)
            }
            Program::PhpNative { worker_path, .. } => {
                let (key, span) = match written {
                    Some(p) if p.worker_path.is_some() => (
                        "worker_path",
                        p.worker_path.as_ref().map(toml::Spanned::span),
                    ),
                    Some(p) => ("worker", p.worker.as_ref().map(toml::Spanned::span)),
                    None => ("worker", None),
                };
                (
                    crate::launchers::php_worker(worker_path.as_deref()),
                    key,
                    span,
                )
            }
        };
        let path = spawn
            .env
            .get("PATH")
            .map(String::as_str)
            .or(path_var)
            .unwrap_or(crate::process::spawn::DEFAULT_PATH);
        let found = find_program(&program, path, spawn.cwd.as_deref());
        let found = match (found, &spawn.program) {
            // The worker is there: whether it can start PHP (libphp and php.ini) is asked
            // of the worker itself.
            (Ok(file), Program::PhpNative { .. }) => super::php_native::starts(&file),
            (found, _) => found.map(|_| ()),
        };
        let found = match (found, &spawn.program) {
            // The interpreter is there: now the native worker that embeds it.
            (
                Ok(()),
                Program::Wsgi {
                    native: Some(native),
                    python,
                    ..
                },
            ) => {
                let (worker_key, worker_span) = match written {
                    Some(p) if p.worker_path.is_some() => (
                        "worker_path",
                        p.worker_path.as_ref().map(toml::Spanned::span),
                    ),
                    Some(p) => ("worker", p.worker.as_ref().map(toml::Spanned::span)),
                    None => ("worker", None),
                };
                (key, span) = (worker_key, worker_span);
                let worker = crate::launchers::wsgi_worker(native.worker_path.as_deref());
                find_program(&worker, path, spawn.cwd.as_deref())
                    .and_then(|file| super::wsgi_native::starts(&file, python))
            }
            (found, _) => found,
        };
        if let Err(why) = found {
            let default = match (&spawn.program, key) {
                (
                    Program::Wsgi {
                        native: Some(_), ..
                    },
                    "worker",
                ) => format!(
                    " (corral looks for {} beside its own executable, then in PATH; {})",
                    crate::launchers::WSGI_WORKER,
                    super::wsgi_native::INSTALL
                ),
                (Program::PhpNative { .. }, "worker") => format!(
                    " (corral looks for {} beside its own executable, then in PATH; {})",
                    crate::launchers::PHP_WORKER,
                    super::php_native::INSTALL
                ),
                (Program::Wsgi { .. }, "app") => {
                    format!(" (the default interpreter {DEFAULT_PYTHON}; set python or virtualenv)")
                }
                (Program::Rack { .. }, "app") => {
                    format!(" (the default interpreter {DEFAULT_RUBY}; set ruby)")
                }
                _ => String::new(),
            };
            errors.push(ConfigError::new(
                src,
                origin,
                span,
                format!(
                    "pool {:?}: {why}{default}: its workers could not start",
                    pool.name
                ),
            ));
        }
        if let Program::PhpNative {
            worker_script: Some(script),
            ..
        } = &spawn.program
        {
            if let Err(why) = super::php_native::script_is_file(script, spawn.cwd.as_deref()) {
                let span = written
                    .and_then(|p| p.worker_script.as_ref())
                    .map(toml::Spanned::span);
                errors.push(ConfigError::new(
                    src,
                    origin,
                    span,
                    format!("pool {:?}: {why}: its workers could not start", pool.name),
                ));
            }
        }
    }
    errors
}

/// The file `program` runs, found as exec would: a name with a `/` as written (relative to
/// `cwd`, where the worker starts), any other name in the directories of `path`.
fn find_program(program: &str, path: &str, cwd: Option<&Path>) -> Result<PathBuf, String> {
    if program.is_empty() {
        return Err("the program is empty".to_owned());
    }
    if program.contains('/') {
        let file = match cwd {
            Some(dir) if !program.starts_with('/') => dir.join(program),
            _ => PathBuf::from(program),
        };
        return executable(&file)
            .map(|()| file.clone())
            .map_err(|why| format!("{program:?} {why}"));
    }
    let mut refused = None;
    for dir in path.split(':').filter(|d| !d.is_empty()) {
        let file = Path::new(dir).join(program);
        match executable(&file) {
            Ok(()) => return Ok(file),
            // exec goes on past a file it may not run, and so does this; said if nothing
            // else is found.
            Err(why) if file.exists() => refused = Some(format!("{} {why}", file.display())),
            Err(_) => {}
        }
    }
    Err(match refused {
        Some(why) => format!("{program:?} is found in PATH, but {why}"),
        None => format!(
            "{program:?} is not found in PATH ({path}): install it, or name it by its absolute path"
        ),
    })
}

/// Whether `file` is a regular file (symbolic links followed) with an execute bit.
fn executable(file: &Path) -> Result<(), String> {
    let meta = std::fs::metadata(file).map_err(|e| match e.kind() {
        std::io::ErrorKind::NotFound => "does not exist".to_owned(),
        _ => format!("cannot be read: {e}"),
    })?;
    if !meta.is_file() {
        return Err("is not a regular file".to_owned());
    }
    let mode = meta.permissions().mode();
    if mode & 0o111 == 0 {
        return Err(format!("is not executable (mode {:04o})", mode & 0o7777));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(pool: &str) -> String {
        format!(
            "[[listen]]\naddress = \"127.0.0.1:8080\"\nprotocol = \"http\"\n\n\
             [pools.p]\n{pool}\n"
        )
    }

    fn errors(src: &str, path: &str) -> Vec<String> {
        let parsed = super::super::parse(src, "t.toml").unwrap();
        check_programs(&parsed, src, "t.toml", Some(path))
            .iter()
            .map(ToString::to_string)
            .collect()
    }

    #[test]
    fn a_missing_absolute_command_is_located_at_its_program() {
        let src = config("command = [\"/nonexistent/app-server9\", \"-n\"]");
        let e = errors(&src, "/usr/bin:/bin");
        assert_eq!(e.len(), 1, "{e:?}");
        assert!(
            e[0].starts_with(
                "t.toml:6:12: pool \"p\": \"/nonexistent/app-server9\" does not exist: its workers could not start"
            ),
            "{}",
            e[0]
        );
    }

    #[test]
    fn a_name_is_looked_up_in_the_workers_path() {
        let dir = tempfile::tempdir().unwrap();
        let tool = dir.path().join("tool");
        std::fs::write(&tool, "#!/bin/sh\n").unwrap();
        std::fs::set_permissions(&tool, std::fs::Permissions::from_mode(0o644)).unwrap();
        let src = config("command = [\"tool\"]");
        let path = format!("/nonexistent:{}", dir.path().display());
        let e = errors(&src, &path);
        assert!(e[0].contains("is not executable (mode 0644)"), "{e:?}");
        std::fs::set_permissions(&tool, std::fs::Permissions::from_mode(0o755)).unwrap();
        assert!(errors(&src, &path).is_empty());
        // Not found anywhere: PATH is named.
        let e = errors(&src, "/nonexistent");
        assert!(
            e[0].contains("\"tool\" is not found in PATH (/nonexistent)"),
            "{e:?}"
        );
        // The pool's own PATH wins over corral's.
        let src = config(&format!(
            "command = [\"tool\"]\nenv = {{ PATH = \"{}\" }}",
            dir.path().display()
        ));
        assert!(errors(&src, "/nonexistent").is_empty());
    }

    #[test]
    fn a_worker_script_must_be_a_file() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("worker.php"), "<?php\n").unwrap();
        // /bin/true passes for the worker program (`--check` exits 0).
        let pool = |script: &str, cwd: &str| {
            config(&format!(
                "worker = \"native\"\nworker_path = \"/bin/true\"\n\
                 worker_script = \"{script}\"\n{cwd}\n\n\
                 [[contexts]]\nroot = \"/tmp\"\npool = \"p\""
            ))
        };
        let d = dir.path().display();
        assert!(errors(&pool(&format!("{d}/worker.php"), ""), "/bin").is_empty());
        let e = errors(&pool(&format!("{d}/missing.php"), ""), "/bin");
        assert_eq!(e.len(), 1, "{e:?}");
        assert!(
            e[0].starts_with("t.toml:8:17: pool \"p\": worker_script "),
            "{e:?}"
        );
        assert!(e[0].contains("missing.php does not exist"), "{e:?}");
        let e = errors(&pool(&d.to_string(), ""), "/bin");
        assert!(e[0].contains("is not a file"), "{e:?}");
        // A relative script is found from the pool's cwd, where the worker starts.
        let cwd = format!("cwd = \"{d}\"");
        assert!(errors(&pool("worker.php", &cwd), "/bin").is_empty());
        let e = errors(&pool("nope.php", &cwd), "/bin");
        assert!(
            e[0].contains(&format!("{d}/nope.php does not exist")),
            "{e:?}"
        );
    }

    #[test]
    fn interpreters_of_app_pools_are_checked() {
        let src = config("app = \"wsgi:app\"\npython = \"/nonexistent/python3\"");
        let e = errors(&src, "/usr/bin:/bin");
        assert!(
            e[0].starts_with("t.toml:7:10: pool \"p\": \"/nonexistent/python3\" does not exist"),
            "{e:?}"
        );
        let src = config("app = \"wsgi:app\"\nvirtualenv = \"/nonexistent/venv\"");
        let e = errors(&src, "/usr/bin:/bin");
        assert!(
            e[0].contains("\"/nonexistent/venv/bin/python\" does not exist"),
            "{e:?}"
        );
        let src = config("app = \"rack:config.ru\"\nruby = \"ruby9\"");
        let e = errors(&src, "/nonexistent");
        assert!(e[0].contains("\"ruby9\" is not found in PATH"), "{e:?}");
        // The default interpreter is named as such, at `app`.
        let src = config("app = \"rack:config.ru\"");
        let e = errors(&src, "/nonexistent");
        assert!(e[0].starts_with("t.toml:6:7: "), "{e:?}");
        assert!(
            e[0].contains("the default interpreter ruby; set ruby"),
            "{e:?}"
        );
    }
}
