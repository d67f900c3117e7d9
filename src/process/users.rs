//! What corral says at start about the users its pools' workers run as (ARCHITECTURE.md,
//! "The supervisor: spawning workers", Privileges): one warning per pool that gets `nobody` because no user is configured,
//! per pool whose workers share their user with another pool's (workers of one user can
//! signal, trace and read one another, and php-cgi cannot be made non-dumpable), and per
//! pool whose `user` or `group` a non-root corral cannot apply.

use crate::config::{Backend, Config, SpawnConfig};

/// Says, once per pool: when a root corral runs a pool's workers as
/// [`super::spawn::DEFAULT_USER`] because no user is configured; when a pool's workers run
/// as the same user as another pool's; and when corral is not root, so a pool's `user` or
/// `group` cannot be applied.
pub fn warn(config: &Config) {
    let root = nix::unistd::Uid::effective().is_root();
    let me = nix::unistd::User::from_uid(nix::unistd::Uid::effective())
        .ok()
        .flatten()
        .map_or_else(
            || format!("uid {}", nix::unistd::Uid::effective()),
            |u| u.name,
        );
    let spawned: Vec<(&str, &SpawnConfig)> = config
        .pools
        .iter()
        .filter_map(|p| match &p.backend {
            Backend::Spawned(s) => Some((p.name.as_str(), &**s)),
            Backend::External { .. } => None,
        })
        .collect();
    for &(pool, spawn) in &spawned {
        if !root {
            // Not silently ignored: whoever wrote `user` expects the switch.
            let wanted = [("user", &spawn.user), ("group", &spawn.group)];
            for (key, value) in wanted {
                if let Some(name) = value.as_deref().filter(|n| *n != me) {
                    tracing::warn!(
                        pool,
                        "corral is not root (it runs as {me}), so pool {pool}'s `{key} = \
                         \"{name}\"` cannot be applied: its workers run as {me}; start \
                         corral as root to run them as {name}, or remove `{key}`"
                    );
                }
            }
            continue;
        }
        if super::spawn::default_identity_applies(spawn.user.as_deref()) {
            tracing::warn!(
                pool,
                user = super::spawn::DEFAULT_USER,
                "corral runs as root and neither the pool nor [server] sets `user`: the \
                 workers run as {}, never as root; set `user` to choose",
                super::spawn::DEFAULT_USER
            );
        }
        // Workers of one user can signal, trace and read one another: a pool that shares
        // its user (its own, [server]'s or the default) is told so, one warning per pool.
        let user = spawn.user.as_deref().unwrap_or(super::spawn::DEFAULT_USER);
        let others: Vec<&str> = spawned
            .iter()
            .filter(|(other, s)| {
                *other != pool && s.user.as_deref().unwrap_or(super::spawn::DEFAULT_USER) == user
            })
            .map(|(other, _)| *other)
            .collect();
        if !others.is_empty() {
            tracing::warn!(
                pool,
                user,
                "pool {pool}'s workers run as {user}, as do pool(s) {}: a compromised worker \
                 of one can signal, trace and read the files of the others; give each pool a \
                 `user` of its own",
                others.join(", ")
            );
        }
    }
}
