//! What a pool supervisor needs to know about its pool, taken from the configuration once,
//! and the small deterministic random source that spreads recycling.

use std::time::Duration;

use crate::config::{Backend, PoolConfig, Recycle, Sizing};

/// First restart delay after a crash; it doubles with each consecutive crash.
pub const BACKOFF_BASE: Duration = Duration::from_millis(100);
/// Longest restart delay.
pub const BACKOFF_CAP: Duration = Duration::from_secs(30);
/// A worker ready this long without crashing ends a crash streak (as does a served request).
pub const STABLE_AFTER: Duration = Duration::from_secs(10);
/// Consecutive crashes after which the pool reports a crash loop.
pub const CRASH_LOOP_AFTER: u32 = 5;
/// Most growth spawns per second (php-fpm's cap for its doubling spawn rate).
pub const MAX_SPAWN_BATCH: u32 = 32;

/// The settings of one spawned pool, as plain values.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PoolSpec {
    /// How many workers, and when.
    pub sizing: Sizing,
    /// When workers are recycled.
    pub recycle: Recycle,
    /// Requests one worker serves at once (at least 1).
    pub concurrency: usize,
    /// Longest wait from spawn to ready; then the worker is killed and counts as a crash.
    pub start_timeout: Duration,
    /// Longest wait from the stop signal to the exit; then SIGKILL.
    pub kill_timeout: Duration,
    /// First restart delay after a crash.
    pub backoff_base: Duration,
    /// Longest restart delay.
    pub backoff_cap: Duration,
    /// How long a ready worker must live to end a crash streak.
    pub stable_after: Duration,
    /// Consecutive crashes that make a crash loop.
    pub crash_loop_after: u32,
    /// Most growth spawns in one second.
    pub max_spawn_batch: u32,
    /// Each worker is a `php_children` group behind the gateway: a php-cgi parent whose
    /// children never exit on their own and each hold a kept connection (docs/pools.md,
    /// "Shared OPcache"). Such a worker serves on past its `max_requests` budget until its
    /// replacement is ready (as for `max_lifetime`), and a request past `request_timeout`
    /// retires it instead of killing it: a kill of the group would take its other children's
    /// requests with it.
    pub group_of_children: bool,
}

impl PoolSpec {
    /// The spec of a pool corral spawns; `None` for a pool of external servers.
    /// `kill_timeout` is the server-wide one.
    pub fn from_config(pool: &PoolConfig, kill_timeout: Duration) -> Option<PoolSpec> {
        let Backend::Spawned(spawn) = &pool.backend else {
            return None;
        };
        let mut recycle = spawn.recycle;
        // A php_children group the gateway sends requests to: its children never exit on
        // their own (PHP_FCGI_MAX_REQUESTS=0, so no kept connection is closed under a
        // request), and corral recycles the whole group after `max_requests` per child.
        // A direct pool's children count their own (`spawn_direct`).
        let group = spawn.php_children.filter(|_| spawn.direct.is_none());
        if let Some(g) = group {
            let n = u64::from(g.children);
            recycle.max_requests = g.max_requests.map(|m| m.saturating_mul(n));
            recycle.max_requests_jitter = g.max_requests_jitter.saturating_mul(n);
        }
        Some(PoolSpec {
            sizing: spawn.sizing,
            recycle,
            concurrency: usize::try_from(pool.concurrency)
                .unwrap_or(usize::MAX)
                .max(1),
            start_timeout: spawn.start_timeout,
            kill_timeout,
            backoff_base: BACKOFF_BASE,
            backoff_cap: BACKOFF_CAP,
            stable_after: STABLE_AFTER,
            crash_loop_after: CRASH_LOOP_AFTER,
            max_spawn_batch: MAX_SPAWN_BATCH,
            group_of_children: group.is_some(),
        })
    }

    /// The most workers that may take requests at once.
    pub fn max(&self) -> usize {
        usize::try_from(self.sizing.max()).unwrap_or(usize::MAX)
    }

    /// Workers kept even at rest: all of them for static, `min` for dynamic, none on demand.
    pub fn floor(&self) -> usize {
        let n = match self.sizing {
            Sizing::Static { workers } => workers,
            Sizing::Dynamic { min, .. } => min,
            Sizing::OnDemand { .. } => 0,
        };
        usize::try_from(n).unwrap_or(usize::MAX)
    }

    /// The restart delay after `crashes` consecutive crashes (at least 1).
    pub fn backoff(&self, crashes: u32) -> Duration {
        let doublings = crashes.saturating_sub(1).min(31);
        self.backoff_base
            .saturating_mul(1u32 << doublings)
            .min(self.backoff_cap)
    }
}

/// xorshift64: small, fast and reproducible from its seed, which is all jitter needs.
#[derive(Debug, Clone)]
pub(super) struct Rng(u64);

impl Rng {
    pub(super) fn new(seed: u64) -> Rng {
        // Zero is xorshift's one fixed point; any other constant will do.
        Rng(if seed == 0 {
            0x9E37_79B9_7F4A_7C15
        } else {
            seed
        })
    }

    pub(super) fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.0 = x;
        x
    }

    /// A number in `0..=max`.
    pub(super) fn up_to(&mut self, max: u64) -> u64 {
        match max.checked_add(1) {
            Some(n) => self.next() % n,
            None => self.next(),
        }
    }
}
