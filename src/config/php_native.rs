//! Whether the native PHP worker of a `worker = "native"` pool can start: the program is
//! found by [`super::programs`] like any other; this runs it with `--check`, which starts
//! PHP (libphp, php.ini, every extension) and exits, and turns a failure into what is
//! missing. The worker is linked against libphp, so a missing `libphp8.2-embed` shows as the
//! dynamic loader's refusal. [`script_is_file`] checks a worker-mode pool's `worker_script`.

use std::path::Path;
use std::process::{Command, Stdio};

/// How to get the worker, for messages.
pub const INSTALL: &str = "build it with `cargo build --release -p corral-php-worker` (which \
                           needs php8.2-dev and libphp8.2-embed) and install it beside corral, \
                           or set worker_path";

/// Most bytes of the worker's stderr quoted in a message.
const MAX_QUOTED: usize = 400;

/// `Ok` when `worker --check` exits 0; else why it cannot start PHP.
pub fn starts(worker: &Path) -> Result<(), String> {
    checks(worker, &["--check"], "PHP", ("libphp", "libphp8.2-embed"))
}

/// `Ok` when `worker ARGS...` (a native worker's self-check) exits 0; else a message that
/// it cannot start `what`, quoting the worker's stderr and, when that names `library.0`,
/// the package that installs it (`library.1`). The native WSGI worker's check shares it.
pub(super) fn checks(
    worker: &Path,
    args: &[&str],
    what: &str,
    library: (&str, &str),
) -> Result<(), String> {
    let out = Command::new(worker)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .output()
        .map_err(|e| format!("{} cannot be run: {e}", worker.display()))?;
    if out.status.success() {
        return Ok(());
    }
    let text = String::from_utf8_lossy(&out.stderr);
    let text = text.trim();
    let quoted: String = text.chars().take(MAX_QUOTED).collect();
    let (lib, package) = library;
    let hint = if text.contains(lib) {
        format!(" ({lib} is missing: apt-get install {package})")
    } else {
        String::new()
    };
    Err(format!(
        "{} cannot start {what} ({}): {quoted}{hint}",
        worker.display(),
        crate::process::ExitKind::of(out.status)
    ))
}

/// `Ok` when the worker-mode script `script` (relative to `cwd`, where the worker starts,
/// when it is relative) is a file; else what is wrong with it.
pub fn script_is_file(script: &Path, cwd: Option<&Path>) -> Result<(), String> {
    let full = match cwd {
        Some(cwd) if script.is_relative() => cwd.join(script),
        _ => script.to_path_buf(),
    };
    match std::fs::metadata(&full) {
        Ok(m) if m.is_file() => Ok(()),
        Ok(_) => Err(format!("worker_script {} is not a file", full.display())),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            Err(format!("worker_script {} does not exist", full.display()))
        }
        Err(e) => Err(format!("worker_script {}: {e}", full.display())),
    }
}
