//! The native workers (`workers/php`, package `corral-php-worker`; `workers/wsgi`, package
//! `corral-wsgi-worker`) beside the corral under test. cargo builds them beside `corral` for
//! a workspace test run; a test binary run alone (`cargo test --test php_native`) builds its
//! worker here first, once per binary, with the same cargo and profile, so a test always
//! runs the worker of this tree.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

/// The PHP worker's path, built when this test binary first asks.
pub fn worker() -> PathBuf {
    static BUILT: OnceLock<PathBuf> = OnceLock::new();
    BUILT.get_or_init(|| build("corral-php-worker")).clone()
}

/// The WSGI worker's path, built when this test binary first asks.
pub fn wsgi_worker() -> PathBuf {
    static BUILT: OnceLock<PathBuf> = OnceLock::new();
    BUILT.get_or_init(|| build("corral-wsgi-worker")).clone()
}

/// Builds `package` (whose binary has its name) beside corral; its path.
fn build(package: &str) -> PathBuf {
    let corral = Path::new(super::CORRAL);
    let dir = corral.parent().expect("corral's directory");
    let mut cmd = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()));
    cmd.args(["build", "--quiet", "-p", package])
        .current_dir(env!("CARGO_MANIFEST_DIR"));
    if dir.ends_with("release") {
        cmd.arg("--release");
    }
    let out = super::run(cmd, std::time::Duration::from_secs(600));
    assert_eq!(out.code, Some(0), "building {package}: {}", out.stderr);
    let worker = dir.join(package);
    assert!(worker.is_file(), "{} was not built", worker.display());
    worker
}
