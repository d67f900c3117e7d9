//! Whether the native PHP worker of a `worker = "native"` pool can start: the program is
//! found by [`super::programs`] like any other; this runs it with `--check`, which starts
//! PHP (libphp, php.ini, every extension) and exits, and turns a failure into what is
//! missing. The worker is linked against libphp, so a missing `libphp8.2-embed` shows as the
//! dynamic loader's refusal.

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
    let out = Command::new(worker)
        .arg("--check")
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
    let hint = if text.contains("libphp") {
        " (libphp is missing: apt-get install libphp8.2-embed)"
    } else {
        ""
    };
    Err(format!(
        "{} cannot start PHP ({}): {quoted}{hint}",
        worker.display(),
        crate::process::ExitKind::of(out.status)
    ))
}
