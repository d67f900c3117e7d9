//! The native WSGI worker (`workers/wsgi`, CPython embedded behind LSAPI): the key rules of
//! a pool that pairs `app = "wsgi:module:callable"` with `worker = "native"`, and whether
//! the worker can start (`corral check` runs it with `--check`, which starts the pool's
//! Python and exits). The worker is linked against libpython3.11, so a missing
//! `libpython3.11` shows as the dynamic loader's refusal, and a virtualenv made for another
//! Python as the worker's own message.

use std::path::Path;

use super::file::FilePool;
use super::validate::Errors;

/// How a `worker = "native"` WSGI pool finds its worker.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NativeWsgi {
    /// `worker_path` as written (an absolute path or a name looked up in `PATH`); `None`:
    /// `corral-wsgi-worker` beside corral's own executable, else in `PATH`
    /// (`crate::launchers::wsgi_worker`).
    pub worker_path: Option<String>,
}

/// How to get the worker, for messages.
pub const INSTALL: &str = "build it with `cargo build --release -p corral-wsgi-worker` (which \
                           needs python3-dev) and install it beside corral, or set \
                           worker_path; or leave worker out to run the app on the embedded \
                           pure-Python launcher";

/// Whether `p` sets both `app` and `worker`, which is one choice (not two) when the app is
/// WSGI; any other app with `worker` is an error said here, at `worker`.
pub(super) fn paired(e: &mut Errors, n: &str, p: &FilePool) -> bool {
    let (Some(app), Some(worker)) = (&p.app, &p.worker) else {
        return false;
    };
    if app.get_ref().starts_with("wsgi:") {
        return true;
    }
    if app.get_ref().starts_with("rack:") {
        e.at(
            worker.span(),
            format!(
                "pool \"{n}\": worker = \"native\" runs PHP scripts or a WSGI app; a Rack app \
                 runs on the embedded Ruby launcher (remove worker)"
            ),
        );
        // Reported here: not also as two programs.
        return true;
    }
    false
}

/// The native worker of a WSGI pool: `Some(None)` for the launcher (no `worker`),
/// `Some(Some(..))` for the native worker, `None` when its keys are wrong (recorded).
pub(super) fn native(e: &mut Errors, p: &FilePool) -> Option<Option<NativeWsgi>> {
    let Some(worker) = &p.worker else {
        return Some(None);
    };
    if worker.get_ref() != "native" {
        e.at(
            worker.span(),
            format!(
                "worker \"{}\" is not a worker corral has: a WSGI app runs on the embedded \
                 launcher (leave worker out) or on worker = \"native\"",
                worker.get_ref()
            ),
        );
        return None;
    }
    if let Some(script) = &p.worker_script {
        e.at(
            script.span(),
            "worker_script belongs to the native PHP worker; a WSGI pool names its app with \
             app = \"wsgi:module:callable\"",
        );
        return None;
    }
    let worker_path = match &p.worker_path {
        Some(path) => Some(e.check(
            path.span(),
            super::app::interpreter_path("worker_path", path.get_ref()),
        )?),
        None => None,
    };
    Some(Some(NativeWsgi { worker_path }))
}

/// `Ok` when `worker PYTHON --check` exits 0; else why it cannot start Python.
pub fn starts(worker: &Path, python: &str) -> Result<(), String> {
    super::php_native::checks(
        worker,
        &[python, "--check"],
        &format!("Python as {python}"),
        ("libpython", "libpython3.11"),
    )
}

#[cfg(test)]
mod tests {
    use crate::config::{parse, Backend, Program};

    fn pool(keys: &str) -> Result<Program, String> {
        let src = format!(
            "[[listen]]\naddress = \"127.0.0.1:8080\"\nprotocol = \"http\"\n\n[pools.p]\n{keys}\n"
        );
        match parse(&src, "t.toml") {
            Ok(c) => match &c.pools[0].backend {
                Backend::Spawned(s) => Ok(s.program.clone()),
                Backend::External { .. } => Err("external".into()),
            },
            Err(errors) => Err(errors
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join("\n")),
        }
    }

    #[test]
    fn a_wsgi_app_with_worker_native_runs_on_the_native_worker() {
        let p = pool("app = \"wsgi:site.wsgi:application\"\nworker = \"native\"").unwrap();
        assert_eq!(
            p,
            Program::Wsgi {
                module: "site.wsgi".into(),
                callable: "application".into(),
                python: "python3".into(),
                native: Some(super::NativeWsgi { worker_path: None }),
            }
        );
        let p = pool(
            "worker = \"native\"\nworker_path = \"/opt/w\"\napp = \"wsgi:app\"\n\
             virtualenv = \"/srv/venv\"",
        )
        .unwrap();
        assert!(
            matches!(&p, Program::Wsgi { python, native: Some(n), .. }
                if python == "/srv/venv/bin/python" && n.worker_path.as_deref() == Some("/opt/w")),
            "{p:?}"
        );
        // Without worker: the pure-Python launcher, as before.
        let p = pool("app = \"wsgi:app\"").unwrap();
        assert!(matches!(p, Program::Wsgi { native: None, .. }), "{p:?}");
    }

    #[test]
    fn rack_scripts_and_unknown_workers_are_refused_with_what_to_do() {
        let e = pool("app = \"rack:config.ru\"\nworker = \"native\"").unwrap_err();
        assert!(e.starts_with("t.toml:7:10: "), "{e}");
        assert!(
            e.contains("a Rack app runs on the embedded Ruby launcher (remove worker)"),
            "{e}"
        );
        // Said once, not also as two programs.
        assert!(!e.contains("sets both"), "{e}");
        let e = pool("app = \"wsgi:app\"\nworker = \"uwsgi\"").unwrap_err();
        assert!(
            e.contains("worker \"uwsgi\" is not a worker corral has"),
            "{e}"
        );
        let e =
            pool("app = \"wsgi:app\"\nworker = \"native\"\nworker_script = \"w.php\"").unwrap_err();
        assert!(
            e.contains("worker_script belongs to the native PHP worker"),
            "{e}"
        );
        let e =
            pool("app = \"wsgi:app\"\nworker = \"native\"\nworker_path = \"bin/w\"").unwrap_err();
        assert!(e.contains("must be an absolute path"), "{e}");
        let e = pool("app = \"wsgi:app\"\nworker = \"native\"\nconcurrency = 4").unwrap_err();
        assert!(e.contains("serve one request at a time"), "{e}");
        // Still one program: command with the pair is two.
        let e = pool("app = \"wsgi:app\"\nworker = \"native\"\ncommand = [\"x\"]").unwrap_err();
        assert!(e.contains("sets both app and command"), "{e}");
    }
}
