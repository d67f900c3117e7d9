//! Deploys by symlink swap (`ln -sfn releases/N current && corral reload`): a context's
//! `root` and a pool's `cwd` are resolved to their real paths when a generation is built
//! (at start and at every reload), and a pool's `cwd` again at every rolling restart
//! (ARCHITECTURE.md, "Generations and reload").
//!
//! A generation therefore serves one release from first request to last: SCRIPT_FILENAME and
//! DOCUMENT_ROOT name the real release directory (as nginx's `$realpath_root` does), so the
//! script guard's and the static files' per-thread caches, which are keyed by the root, and
//! php's own realpath cache and OPcache, which are keyed by the script's path, never answer
//! for release N from an entry of release N-1. A pool whose real `cwd` or whose contexts'
//! real roots changed is a changed pool: the reload starts new workers beside the old ones
//! and switches once they are ready, while requests routed before the switch finish on the
//! old release.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use crate::config::{Backend, Config};

/// A configuration with its symlinks resolved ([`resolve`]).
#[derive(Debug)]
pub struct Resolved {
    /// The configuration, every context `root` and pool `cwd` replaced by its real path.
    pub config: Config,
    /// The configured `cwd` of each pool whose real one differs (so a rolling restart can
    /// resolve it again), by pool name.
    pub cwd_links: HashMap<String, PathBuf>,
    /// The paths that could not be resolved (left as written), with the pool they serve and
    /// why: at start they are only logged, a reload is refused for them
    /// ([`Resolved::refusal`]).
    pub broken: Vec<(String, String)>,
}

impl Resolved {
    /// Why a reload must not switch to this configuration: a root or cwd names nothing (a
    /// `current` link pointed at a release that is not there), with the pool it serves.
    pub fn refusal(&self) -> Option<super::Refusal> {
        self.broken.first().map(|(pool, reason)| super::Refusal {
            pool: pool.clone(),
            reason: reason.clone(),
            stderr: Vec::new(),
        })
    }
}

/// `config` with its context roots and pool cwds resolved to their real paths. A path that
/// cannot be resolved stays as written, with a warning, and is listed in
/// [`Resolved::broken`].
pub fn resolve(config: &Config) -> Resolved {
    let mut resolved = config.clone();
    let mut broken = Vec::new();
    for context in &mut resolved.contexts {
        if let Some(root) = &mut context.root {
            match real_path(root, "context root") {
                Ok(real) => *root = real,
                Err(why) => broken.push((context.pool.clone(), why)),
            }
        }
    }
    let mut cwd_links = HashMap::new();
    for pool in &mut resolved.pools {
        let Backend::Spawned(spawn) = &mut pool.backend else {
            continue;
        };
        if let Some(cwd) = &mut spawn.cwd {
            match real_path(cwd, "pool cwd") {
                Ok(real) if real != *cwd => {
                    cwd_links.insert(pool.name.clone(), std::mem::replace(cwd, real));
                }
                Ok(_) => {}
                Err(why) => broken.push((pool.name.clone(), why)),
            }
        }
    }
    Resolved {
        config: resolved,
        cwd_links,
        broken,
    }
}

/// Whether a context root of `written` names another real directory now than it did when
/// `serving` (its resolution, [`resolve`]) was built: a `current` link swapped since, or one
/// that names nothing any more. The contexts of both are the same list, in the same order.
pub fn roots_moved(written: &Config, serving: &Config) -> bool {
    written
        .contexts
        .iter()
        .zip(&serving.contexts)
        .any(|(w, s)| match (&w.root, &s.root) {
            (Some(w), Some(s)) => std::fs::canonicalize(w).map_or(true, |real| real != *s),
            _ => false,
        })
}

/// The real path of `path` (logged when it differs), or why there is none (logged too).
fn real_path(path: &Path, what: &str) -> Result<PathBuf, String> {
    match std::fs::canonicalize(path) {
        Ok(real) => {
            if real != path {
                tracing::info!(path = %path.display(), real = %real.display(), "{what} resolves through a symlink");
            }
            Ok(real)
        }
        Err(e) => {
            tracing::warn!(path = %path.display(), error = %e, "{what} cannot be resolved; used as written");
            Err(format!("{what} {} cannot be resolved: {e}", path.display()))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const CONFIG: &str = r#"
[[listen]]
address = "127.0.0.1:8080"
protocol = "http"

[pools.php]
command = ["php-cgi"]
cwd = "CURRENT"

[pools.remote]
servers = ["127.0.0.1:9000"]

[[contexts]]
prefix = "/"
root = "CURRENT/public"
pool = "php"

[[contexts]]
prefix = "/r/"
root = "MISSING"
pool = "remote"
"#;

    #[test]
    fn roots_and_cwds_resolve_to_the_release_the_link_names_now() {
        let (_dir, base, current) = releases();
        let text = CONFIG
            .replace("CURRENT", &current.display().to_string())
            .replace("MISSING", &base.join("missing").display().to_string());
        let config = crate::config::parse(&text, "t.toml").unwrap();
        let roots = |c: &Config| -> Vec<PathBuf> {
            c.contexts.iter().filter_map(|c| c.root.clone()).collect()
        };
        let cwd = |c: &Config| match &c.pools[0].backend {
            Backend::Spawned(s) => s.cwd.clone(),
            Backend::External { .. } => None,
        };
        let one = resolve(&config);
        assert_eq!(one.cwd_links.get("php"), Some(&current));
        // A path that names nothing stays as written, and would refuse a reload.
        let refusal = one.refusal().unwrap();
        assert_eq!(refusal.pool, "remote");
        assert!(
            refusal.reason.contains("missing cannot be resolved"),
            "{refusal}"
        );
        let one = one.config;
        assert_eq!(
            roots(&one),
            [base.join("releases/1/public"), base.join("missing")]
        );
        assert_eq!(cwd(&one), Some(base.join("releases/1")));
        // The swap: the same configuration now resolves to release 2.
        std::fs::remove_file(&current).unwrap();
        std::os::unix::fs::symlink("releases/2", &current).unwrap();
        let two = resolve(&config).config;
        assert_eq!(roots(&two)[0], base.join("releases/2/public"));
        assert_eq!(cwd(&two), Some(base.join("releases/2")));
        // What is configured is left as written.
        assert_eq!(cwd(&config), Some(current));
    }

    /// Releases 1 and 2 (each with `public/`) under a new directory, `current` naming 1.
    fn releases() -> (tempfile::TempDir, PathBuf, PathBuf) {
        let dir = tempfile::tempdir().unwrap();
        let base = std::fs::canonicalize(dir.path()).unwrap();
        for n in ["1", "2"] {
            std::fs::create_dir_all(base.join("releases").join(n).join("public")).unwrap();
        }
        let current = base.join("current");
        std::os::unix::fs::symlink("releases/1", &current).unwrap();
        (dir, base, current)
    }

    #[test]
    fn a_swapped_or_broken_root_link_is_a_moved_root() {
        let (_dir, base, current) = releases();
        let text = CONFIG
            .replace("CURRENT", &current.display().to_string())
            .replace("MISSING", &base.join("releases/2").display().to_string());
        let written = crate::config::parse(&text, "t.toml").unwrap();
        let serving = resolve(&written).config;
        assert!(!roots_moved(&written, &serving));
        std::fs::remove_file(&current).unwrap();
        std::os::unix::fs::symlink("releases/2", &current).unwrap();
        assert!(roots_moved(&written, &serving));
        std::fs::remove_file(&current).unwrap();
        std::os::unix::fs::symlink("releases/3", &current).unwrap();
        assert!(roots_moved(&written, &serving), "a link to nothing");
    }
}
