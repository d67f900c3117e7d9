//! What a spawned pool runs: its `command`, its `app` (`wsgi:MODULE[:CALLABLE]` or
//! `rack:PATH`) with the interpreter `python`, `virtualenv` or `ruby` names, or a native
//! worker's `worker_path`; and the rules an embedded launcher puts on `protocol` and
//! `concurrency`. [`super::pool`] calls these while it checks one `[pools.NAME]` table.

use std::path::PathBuf;

use super::file::FilePool;
use super::validate::Errors;
use super::{BackendProtocol, Program, DEFAULT_PYTHON, DEFAULT_RUBY};

/// An embedded launcher speaks LSAPI only, and serves one request at a time on one
/// connection: another protocol would never reach it, and a second request sent while its
/// kept connection is open would wait until that connection closes.
pub(super) fn launcher_rules(
    e: &mut Errors,
    p: &FilePool,
    app: std::ops::Range<usize>,
    pool: &str,
    speaker: &str,
) {
    let other = match p.protocol {
        Some(BackendProtocol::Fastcgi) => Some("fastcgi"),
        Some(BackendProtocol::Scgi) => Some("scgi"),
        Some(BackendProtocol::Lsapi) | None => None,
    };
    if let Some(protocol) = other {
        e.at(
            app,
            format!(
                "protocol = \"{protocol}\" cannot reach {pool}: {speaker} lsapi (leave \
                 protocol out)"
            ),
        );
    }
    if let Some(c) = p.concurrency.as_ref().filter(|c| *c.get_ref() > 1) {
        e.at(
            c.span(),
            format!(
                "{pool}'s workers serve one request at a time: concurrency must be 1 (raise \
                 max for more workers)"
            ),
        );
    }
}

pub(super) fn program(e: &mut Errors, p: &FilePool) -> Option<Program> {
    for (key, value) in [
        ("worker_path", &p.worker_path),
        ("worker_script", &p.worker_script),
    ] {
        if let (Some(v), None) = (value, &p.worker) {
            e.at(
                v.span(),
                format!(
                    "{key} belongs to the native workers (PHP, WSGI): it needs worker = \"native\""
                ),
            );
        }
    }
    if let Some(worker) = p.worker.as_ref().filter(|_| p.app.is_none()) {
        if worker.get_ref() != "native" {
            e.at(
                worker.span(),
                format!(
                    "worker \"{}\" is not a worker corral has: the one there is is \
                     worker = \"native\" (PHP's embed SAPI, for PHP scripts)",
                    worker.get_ref()
                ),
            );
            return None;
        }
        let worker_path = match &p.worker_path {
            Some(path) => {
                Some(e.check(path.span(), interpreter_path("worker_path", path.get_ref()))?)
            }
            None => None,
        };
        let worker_script = match &p.worker_script {
            Some(s) if s.get_ref().trim().is_empty() || s.get_ref().contains('\0') => {
                e.at(
                    s.span(),
                    "worker_script must name a PHP file, e.g. \"public/worker.php\"",
                );
                return None;
            }
            Some(s) => Some(PathBuf::from(s.get_ref())),
            None => None,
        };
        return Some(Program::PhpNative {
            worker_path,
            worker_script,
        });
    }
    if let Some(cmd) = &p.command {
        let argv: Vec<String> = cmd.get_ref().iter().map(|a| a.get_ref().clone()).collect();
        if argv.first().is_none_or(|a| a.trim().is_empty()) {
            e.at(cmd.span(), "command must start with the program to run");
            return None;
        }
        if let Some(a) = cmd.get_ref().iter().find(|a| a.get_ref().contains('\0')) {
            e.at(a.span(), "command argument contains a NUL byte");
            return None;
        }
        return Some(Program::Command(argv));
    }
    let app = p.app.as_ref()?;
    let result = parse_app(app.get_ref());
    let mut program = e.check(app.span(), result)?;
    match &mut program {
        Program::Wsgi { python, native, .. } => {
            if let Some(chosen) = python_interpreter(e, p) {
                *python = chosen;
            }
            *native = super::wsgi_native::native(e, p)?;
        }
        Program::Rack { ruby, .. } => {
            if let Some(chosen) = p.ruby.as_ref() {
                *ruby = e.check(chosen.span(), interpreter_path("ruby", chosen.get_ref()))?;
            }
        }
        Program::Command(_) | Program::PhpNative { .. } => {}
    }
    Some(program)
}

/// Which Python runs a WSGI pool's launcher, from `python` or `virtualenv` (at most one);
/// `None` when neither is set (or the one set is wrong, which is recorded).
fn python_interpreter(e: &mut Errors, p: &FilePool) -> Option<String> {
    match (&p.python, &p.virtualenv) {
        (Some(python), Some(venv)) => {
            let later = if python.span().start > venv.span().start {
                python
            } else {
                venv
            };
            e.at(
                later.span(),
                "set python or virtualenv, not both: virtualenv = \"DIR\" runs DIR/bin/python",
            );
            None
        }
        (Some(python), None) => {
            e.check(python.span(), interpreter_path("python", python.get_ref()))
        }
        (None, Some(venv)) => {
            let dir = e.absolute_path(venv, "virtualenv")?;
            let dir = dir.to_string_lossy();
            let dir = dir.trim_end_matches('/');
            if dir.is_empty() {
                e.at(venv.span(), "virtualenv \"/\" is not a virtual environment");
                return None;
            }
            Some(format!("{dir}/bin/python"))
        }
        (None, None) => None,
    }
}

/// An interpreter as `python` or `ruby` names it: an absolute path to the executable, or a
/// bare program name the worker's `PATH` finds (as `command = [...]` is looked up). A
/// relative path would depend on the directory corral was started from, so it is refused.
pub(super) fn interpreter_path(key: &str, text: &str) -> Result<String, String> {
    let example = match key {
        "python" => "\"/srv/app/venv/bin/python\" or \"python3.11\"",
        "ruby" => "\"/usr/bin/ruby3.1\" or \"ruby3.1\"",
        _ => "\"/usr/local/bin/corral-php-worker\" or \"corral-php-worker\"",
    };
    if text.trim().is_empty() || text.contains('\0') || text.chars().any(char::is_control) {
        let what = if key == "worker_path" {
            "the worker's program"
        } else {
            "an interpreter"
        };
        return Err(format!("{key} must name {what}, e.g. {example}"));
    }
    if text.ends_with('/') {
        return Err(format!(
            "{key} \"{text}\" names a directory; name the interpreter itself, e.g. {example}"
        ));
    }
    if text.contains('/') && !text.starts_with('/') {
        return Err(format!(
            "{key} \"{text}\" must be an absolute path or a program name looked up in PATH, \
             e.g. {example}"
        ));
    }
    Ok(text.to_owned())
}

/// `python` and `virtualenv` belong to WSGI apps, `ruby` to Rack apps: anywhere else the
/// key would be silently ignored, so it is an error that says where it belongs.
pub(super) fn misplaced_interpreter(e: &mut Errors, n: &str, p: &FilePool) {
    let (runs, what) = match p.app.as_ref().map(|a| a.get_ref().as_str()) {
        Some(a) if a.starts_with("wsgi:") => (
            "wsgi",
            "runs a WSGI app (name its interpreter with python or virtualenv)",
        ),
        Some(a) if a.starts_with("rack:") => {
            ("rack", "runs a Rack app (name its interpreter with ruby)")
        }
        // A malformed app is reported on its own.
        Some(_) => return,
        None if p.servers.is_some() => ("", "uses external servers"),
        None if p.worker.is_some() => ("", "runs the native PHP worker"),
        None => ("", "runs a command, which names its own interpreter"),
    };
    let keys = [
        ("python", "wsgi", p.python.as_ref()),
        ("virtualenv", "wsgi", p.virtualenv.as_ref()),
        ("ruby", "rack", p.ruby.as_ref()),
    ];
    for (key, kind, value) in keys {
        let Some(value) = value else { continue };
        if runs != kind {
            e.at(
                value.span(),
                format!("{key} applies to app = \"{kind}:...\" pools; pool \"{n}\" {what}"),
            );
        }
    }
}

/// `wsgi:MODULE[:CALLABLE]` or `rack:PATH`.
fn parse_app(text: &str) -> Result<Program, String> {
    if let Some(rest) = text.strip_prefix("wsgi:") {
        let (module, callable) = rest.split_once(':').unwrap_or((rest, "application"));
        let ident = |s: &str| {
            s.chars()
                .next()
                .is_some_and(|c| c.is_alphabetic() || c == '_')
                && s.chars().all(|c| c.is_alphanumeric() || c == '_')
        };
        if module.split('.').all(ident) && ident(callable) {
            return Ok(Program::Wsgi {
                module: module.to_owned(),
                callable: callable.to_owned(),
                python: DEFAULT_PYTHON.to_owned(),
                native: None,
            });
        }
        return Err(format!(
            "app \"{text}\" is not wsgi:MODULE:CALLABLE with Python names (e.g. \
             \"wsgi:myapp.wsgi:application\")"
        ));
    }
    if let Some(path) = text.strip_prefix("rack:") {
        if path.is_empty() || path.contains('\0') {
            return Err(format!(
                "app \"{text}\" needs a rackup file: \"rack:config.ru\""
            ));
        }
        return Ok(Program::Rack {
            rackup: PathBuf::from(path),
            ruby: DEFAULT_RUBY.to_owned(),
        });
    }
    Err(format!(
        "app \"{text}\" must be \"wsgi:module:callable\" or \"rack:path/to/config.ru\""
    ))
}
