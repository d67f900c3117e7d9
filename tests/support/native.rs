//! The native PHP worker (`workers/php`, package `corral-php-worker`) beside the corral under
//! test. cargo builds it beside `corral` for a workspace test run; a test binary run alone
//! (`cargo test --test php_native`) builds it here first, once per binary, with the same
//! cargo and profile, so a test always runs the worker of this tree.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

/// The worker's path, built when this test binary first asks.
pub fn worker() -> PathBuf {
    static BUILT: OnceLock<PathBuf> = OnceLock::new();
    BUILT
        .get_or_init(|| {
            let corral = Path::new(super::CORRAL);
            let dir = corral.parent().expect("corral's directory");
            let mut cmd = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()));
            cmd.args(["build", "--quiet", "-p", "corral-php-worker"])
                .current_dir(env!("CARGO_MANIFEST_DIR"));
            if dir.ends_with("release") {
                cmd.arg("--release");
            }
            let out = super::run(cmd, std::time::Duration::from_secs(600));
            assert_eq!(
                out.code,
                Some(0),
                "building corral-php-worker: {}",
                out.stderr
            );
            let worker = dir.join("corral-php-worker");
            assert!(worker.is_file(), "{} was not built", worker.display());
            worker
        })
        .clone()
}
