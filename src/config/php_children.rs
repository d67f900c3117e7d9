//! `php_children = N` on a spawned php-cgi pool: each worker corral spawns is one php-cgi
//! parent that forks N children (`PHP_FCGI_CHILDREN`), all accepting on the worker's fd-0
//! socket and sharing the OPcache the parent created before forking (ARCHITECTURE.md,
//! "Shared OPcache"). The worker is the group: its concurrency is N, so the pool's sizing,
//! `max_conns` and queue count groups and slots as for any worker with that concurrency.
//! `max_requests` is per child, so it is taken out of the pool's `recycle` here and kept in
//! [`PhpChildren`]: behind the gateway corral counts it for the whole group
//! (`PoolSpec::from_config`: `max_requests` × N, the group replaced new first); in a direct
//! pool each child counts its own (`PHP_FCGI_MAX_REQUESTS`, the parent forks a replacement).

use toml::Spanned;

use super::file::FilePool;
use super::validate::Errors;
use super::{BackendProtocol, Program, Recycle};

/// Most children per parent: php-cgi forks them all at start.
pub const MAX_PHP_CHILDREN: u32 = 256;

/// A pool's `php_children`, resolved.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PhpChildren {
    /// Children each php-cgi parent forks (`PHP_FCGI_CHILDREN`).
    pub children: u32,
    /// Requests per child before it is recycled (the pool's `max_requests`; none = never):
    /// by the group's replacement behind the gateway, by the child's own exit in a direct pool.
    pub max_requests: Option<u64>,
    /// Up to this many requests added per group (the pool's `max_requests_jitter`).
    pub max_requests_jitter: u64,
}

impl PhpChildren {
    /// The per-child request limit for the group spawned as worker number `key`: the
    /// pool's `max_requests` plus a jitter that differs between groups (a fixed spread by
    /// key, so groups started together do not recycle their children in step). 0 = never.
    pub fn child_max_requests(&self, key: u64) -> u64 {
        let Some(max) = self.max_requests else {
            return 0;
        };
        let spread = self.max_requests_jitter.saturating_add(1);
        // Knuth's multiplicative hash of the key spreads consecutive keys over the range.
        let jitter = key.wrapping_mul(2_654_435_761) % spread;
        max.saturating_add(jitter)
    }
}

/// Checks `php_children` and, when set, takes `max_requests` out of `recycle` into the
/// group (see the module doc).
pub(super) fn php_children(
    e: &mut Errors,
    p: &FilePool,
    protocol: BackendProtocol,
    program: Option<&Program>,
    recycle: &mut Recycle,
) -> Option<PhpChildren> {
    let spanned = p.php_children.as_ref()?;
    let children = *spanned.get_ref();
    let span = spanned.span();
    if children == 0 || children > MAX_PHP_CHILDREN {
        e.at(
            span.clone(),
            format!("php_children must be between 1 and {MAX_PHP_CHILDREN}"),
        );
    }
    if protocol != BackendProtocol::Fastcgi || !matches!(program, Some(Program::Command(_)) | None)
    {
        e.at(
            span.clone(),
            "php_children applies to a php-cgi pool (command = [\"php-cgi\", ...], protocol fastcgi)",
        );
    }
    if let Some(c) = p.concurrency.as_ref().filter(|c| *c.get_ref() != children) {
        e.at(
            c.span(),
            format!(
                "concurrency {} differs from php_children {children}: a php-cgi parent takes \
                 one request per child (leave concurrency out)",
                c.get_ref()
            ),
        );
    }
    let resolved = PhpChildren {
        children: children.clamp(1, MAX_PHP_CHILDREN),
        max_requests: recycle.max_requests.take(),
        max_requests_jitter: std::mem::take(&mut recycle.max_requests_jitter),
    };
    Some(resolved)
}

/// The concurrency of a pool's workers: `php_children` when set, else `concurrency`.
pub(super) fn concurrency(p: &FilePool, concurrency: u32) -> u32 {
    p.php_children
        .as_ref()
        .map(Spanned::get_ref)
        .map_or(concurrency, |&c| c.clamp(1, MAX_PHP_CHILDREN))
}
