//! A rolling restart of a pool whose `cwd` is a symlink starts its replacements in the
//! directory the link names now (`ln -sfn releases/N current && corral restart-workers`),
//! as a reload does (`crate::deploy::links`).

use std::path::PathBuf;

use super::Driver;
use crate::pool::state::PoolEvent;

impl Driver {
    /// Resolves `configured` (the pool's `cwd`, a symlink) again at every rolling restart.
    pub fn follow_cwd(&mut self, configured: PathBuf) {
        self.cwd_link = Some(configured);
    }

    /// Replaces every worker, new before old: from a fresh preloader and in the directory
    /// the pool's `cwd` resolves to now. A `cwd` that no longer resolves (the link names a
    /// release that is not there) starts no restart: the workers serve on, and the error is
    /// logged.
    pub(super) fn rolling_restart(&mut self) -> bool {
        if let Some(link) = &self.cwd_link {
            match std::fs::canonicalize(link) {
                Ok(real) => {
                    if self.template.cwd.as_ref() != Some(&real) {
                        tracing::info!(pool = %self.name, cwd = %link.display(), real = %real.display(), "rolling restart: the new workers start in the directory cwd names now");
                        self.template.cwd = Some(real);
                    }
                }
                Err(e) => {
                    tracing::error!(pool = %self.name, cwd = %link.display(), error = %e, "rolling restart refused: cwd cannot be resolved; the workers serve on");
                    return false;
                }
            }
        }
        self.renew_preloader();
        self.handle(PoolEvent::RollingRestart)
    }
}
