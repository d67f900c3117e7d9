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

/// `config` with every context `root` and every pool `cwd` replaced by its real path, and
/// the configured `cwd` of each pool whose real one differs (so a rolling restart can
/// resolve it again), by pool name. A path that cannot be resolved stays as written, with a
/// warning: the request path or the spawn then reports what is wrong with it.
pub fn resolve(config: &Config) -> (Config, HashMap<String, PathBuf>) {
    let mut resolved = config.clone();
    for context in &mut resolved.contexts {
        if let Some(root) = &mut context.root {
            *root = real_or_configured(root, "context root");
        }
    }
    let mut links = HashMap::new();
    for pool in &mut resolved.pools {
        let Backend::Spawned(spawn) = &mut pool.backend else {
            continue;
        };
        if let Some(cwd) = &mut spawn.cwd {
            let real = real_or_configured(cwd, "pool cwd");
            if real != *cwd {
                links.insert(pool.name.clone(), std::mem::replace(cwd, real));
            }
        }
    }
    (resolved, links)
}

/// The real path of `path`, or `path` itself (with a warning) when it cannot be resolved.
pub fn real_or_configured(path: &Path, what: &str) -> PathBuf {
    match std::fs::canonicalize(path) {
        Ok(real) => {
            if real != path {
                tracing::info!(path = %path.display(), real = %real.display(), "{what} resolves through a symlink");
            }
            real
        }
        Err(e) => {
            tracing::warn!(path = %path.display(), error = %e, "{what} cannot be resolved; used as written");
            path.to_path_buf()
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
        let dir = tempfile::tempdir().unwrap();
        let base = std::fs::canonicalize(dir.path()).unwrap();
        for n in ["1", "2"] {
            std::fs::create_dir_all(base.join("releases").join(n).join("public")).unwrap();
        }
        let current = base.join("current");
        std::os::unix::fs::symlink("releases/1", &current).unwrap();
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
        let (one, links) = resolve(&config);
        assert_eq!(
            roots(&one),
            [base.join("releases/1/public"), base.join("missing")]
        );
        assert_eq!(cwd(&one), Some(base.join("releases/1")));
        assert_eq!(links.get("php"), Some(&current));
        // The swap: the same configuration now resolves to release 2.
        std::fs::remove_file(&current).unwrap();
        std::os::unix::fs::symlink("releases/2", &current).unwrap();
        let (two, _) = resolve(&config);
        assert_eq!(roots(&two)[0], base.join("releases/2/public"));
        assert_eq!(cwd(&two), Some(base.join("releases/2")));
        // What is configured is left as written.
        assert_eq!(cwd(&config), Some(current));
    }
}
