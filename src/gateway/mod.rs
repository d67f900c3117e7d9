//! The gateway core shared by every front listener: the generation being served (a router
//! and a pool registry built from one configuration, swapped whole on reload), and
//! `dispatch`, which takes a slot, sends one request to the chosen worker and hands back the
//! response with the slot still held until its body ends.
//!
//! Front listeners only translate their wire format into CGI variables and a body and back;
//! everything about limits, queueing, worker choice and backend errors happens here, the same
//! for HTTP, FastCGI and SCGI fronts.

mod body;
mod dispatch;
mod error;
mod generation;
pub mod registry;
mod routed;
pub mod script;
mod slow_stacks;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use crate::access::{AccessLog, LogSettings};
use crate::backend::{SpoolBudget, SpoolConfig};
use crate::config::{Config, ListenAddress};
use crate::error::StartupError;
use crate::protocols::Limits;
pub use crate::router::RouteKey;
use crate::router::Router;

pub use body::{GatewayBody, GatewayResponse};
pub use error::GatewayError;
pub use generation::Generation;
use generation::Live;
pub use registry::{BuildSettings, Built, NewPool, Pool, PoolRegistry};
pub use routed::Routed;

/// Everything the front listeners share: the generation being served, and what outlives a
/// reload (request ids, limits, the spool budget, the status page's memory cache).
#[derive(Debug)]
pub struct Gateway {
    live: Live,
    /// Bounds on what peers may make corral buffer.
    pub limits: Limits,
    /// Where bodies are spooled, and the budget all of them share.
    pub spool: SpoolConfig,
    request_ids: RequestIds,
    /// What php-fpm-style status answers are made from.
    fpm_status: crate::status::collect::StatusSource,
    /// The request logs' writer.
    pub access: AccessLog,
    /// What the latest reload came to (`src/deploy/mod.rs`), for the status page.
    pub reloads: crate::deploy::LastReload,
}

/// Request ids handed out by blocks: each thread takes [`ID_BLOCK`] ids at a time from the
/// gateway's counter and numbers its requests from them, so that a request does not write a
/// counter every serving thread writes (a read-modify-write on a shared cache line per
/// request). Ids stay unique and, with one serving thread, consecutive; with several, each
/// thread's are increasing but the threads' interleave by blocks.
#[derive(Debug)]
struct RequestIds {
    /// Tells this gateway's blocks apart from another's in the thread's cache.
    owner: u64,
    /// The first id of the next block to hand out.
    next_block: AtomicU64,
}

/// Ids a thread takes at a time.
const ID_BLOCK: u64 = 1024;

/// Gives every [`RequestIds`] its own owner number.
static NEXT_OWNER: AtomicU64 = AtomicU64::new(0);

thread_local! {
    /// (owner, next id, end of the block) of the block this thread numbers from.
    static ID_CACHE: std::cell::Cell<(u64, u64, u64)> =
        const { std::cell::Cell::new((u64::MAX, 0, 0)) };
}

impl RequestIds {
    fn new() -> RequestIds {
        RequestIds {
            owner: NEXT_OWNER.fetch_add(1, Ordering::Relaxed),
            next_block: AtomicU64::new(1),
        }
    }

    fn next(&self) -> u64 {
        ID_CACHE.with(|cache| {
            let (owner, next, end) = cache.get();
            if owner == self.owner && next < end {
                cache.set((owner, next + 1, end));
                return next;
            }
            let start = self.next_block.fetch_add(ID_BLOCK, Ordering::Relaxed);
            cache.set((self.owner, start + 1, start.saturating_add(ID_BLOCK)));
            start
        })
    }
}

impl Gateway {
    /// A gateway serving `generation`, with the server-wide settings of `config`.
    pub fn new(config: &Config, generation: Generation) -> Gateway {
        Gateway {
            live: Live::new(generation),
            limits: Limits::DEFAULT,
            // Spool files live in the private runtime directory, not a shared /tmp.
            spool: SpoolConfig {
                dir: config.server.runtime_dir.as_path().into(),
                budget: Arc::new(SpoolBudget::new(config.server.spool_budget)),
                ..SpoolConfig::default()
            },
            request_ids: RequestIds::new(),
            fpm_status: crate::status::collect::StatusSource::new(),
            access: AccessLog::start(LogSettings::of(&config.server)),
            reloads: crate::deploy::LastReload::default(),
        }
    }

    /// Builds the first generation of `config` and a gateway serving it, with the drivers of
    /// its spawned pools to run ([`Pool::start`]; until then those pools have no worker).
    /// Writes nothing: `settings.launchers` must name the launcher of every `app` pool.
    pub fn build(
        config: &Config,
        settings: &BuildSettings,
    ) -> Result<(Gateway, Vec<NewPool>), StartupError> {
        let router = Router::new(config);
        let built = PoolRegistry::build(config, &router, None, settings)?;
        let generation = Generation::new(settings.generation, config, router, built.registry);
        Ok((Gateway::new(config, generation), built.drivers))
    }

    /// The generation serving now.
    pub fn current(&self) -> Arc<Generation> {
        self.live.get()
    }

    /// Serves `generation` from now on; returns the one it replaces. Requests already routed
    /// finish on the pools they were routed to.
    pub fn replace(&self, generation: Generation) -> Arc<Generation> {
        self.live.set(Arc::new(generation))
    }

    /// A new request id for logs: unique in this gateway, increasing on each thread. Each
    /// thread takes ids by blocks of 1024, so with several serving threads the threads' ids
    /// interleave by blocks (`RequestIds`).
    pub fn request_id(&self) -> u64 {
        self.request_ids.next()
    }

    /// The spool settings for a body of `routed`'s context: at most its `max_body`.
    pub fn spool_for(&self, routed: &Routed) -> SpoolConfig {
        let mut spool = self.spool.clone();
        spool.max_bytes = spool.max_bytes.min(routed.context.config.max_body);
        spool
    }

    /// Routes a request of the current generation; no matching context is
    /// [`GatewayError::NoContext`].
    pub fn route(&self, key: RouteKey<'_>) -> Result<Routed, GatewayError> {
        self.live
            .with(|generation| {
                let context = generation.router.route(key)?;
                let pool = generation.pools.get(context.pool)?;
                Some(Routed::new(
                    Arc::clone(context),
                    Arc::clone(pool),
                    generation,
                ))
            })
            .ok_or_else(|| GatewayError::NoContext {
                host: String::from_utf8_lossy(key.host).into_owned(),
                path: String::from_utf8_lossy(key.path).into_owned(),
            })
    }

    /// The whole CGI answer for a FastCGI request to a listener's php-fpm status or ping path
    /// (matched on SCRIPT_NAME, else DOCUMENT_URI, as php-fpm matches `pm.status_path`):
    /// corral answers those itself, so dashboards and monitoring set up for php-fpm keep
    /// working when corral takes its socket. `None` for every other request.
    pub fn fpm_answer(
        &self,
        listener: &ListenAddress,
        params: &crate::protocols::cgi::FrontParams,
    ) -> Option<bytes::BytesMut> {
        use crate::protocols::cgi::Known;
        let get = |k: Known| params.first(k).filter(|v| !v.is_empty());
        // Asked of every FastCGI request: the generation is borrowed from the thread's cache,
        // not cloned (its count is shared by every serving thread).
        let path = self.live.with(|generation| {
            let (_, status_path, ping_path) =
                generation.fpm_paths.iter().find(|(l, ..)| l == listener)?;
            let script = get(Known::ScriptName).or_else(|| get(Known::DocumentUri))?;
            let is = |p: &Option<String>| p.as_ref().is_some_and(|p| p.as_bytes() == script);
            if is(ping_path) {
                Some("/ping")
            } else if is(status_path) {
                Some("/status")
            } else {
                None
            }
        })?;
        let method = get(Known::RequestMethod)
            .and_then(|m| http::Method::from_bytes(m).ok())
            .unwrap_or(http::Method::GET);
        let query = get(Known::QueryString)
            .map(|q| String::from_utf8_lossy(q).into_owned())
            .unwrap_or_default();
        let response = crate::status::server::answer(self, &self.fpm_status, &method, path, &query);
        Some(crate::status::server::cgi_answer(response, &method))
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use std::collections::HashSet;

    use super::{RequestIds, ID_BLOCK};

    #[test]
    fn request_ids_are_unique_across_threads_and_gateways_and_increase_on_each_thread() {
        let (a, b) = (RequestIds::new(), RequestIds::new());
        // One thread, one gateway: consecutive from 1.
        let first: Vec<u64> = (0..3).map(|_| a.next()).collect();
        assert_eq!(first, [1, 2, 3]);
        // Another gateway on the same thread has its own numbers; coming back to the
        // first takes a new block of it.
        assert_eq!(b.next(), 1);
        assert_eq!(a.next(), ID_BLOCK + 1);
        let per_thread: Vec<Vec<u64>> = std::thread::scope(|s| {
            let threads: Vec<_> = (0..3)
                .map(|_| s.spawn(|| (0..2 * ID_BLOCK).map(|_| a.next()).collect::<Vec<u64>>()))
                .collect();
            threads.into_iter().map(|t| t.join().unwrap()).collect()
        });
        let mut seen: HashSet<u64> = first.into_iter().chain([ID_BLOCK + 1]).collect();
        for ids in per_thread {
            assert!(ids.windows(2).all(|w| w[0] < w[1]));
            for id in ids {
                assert!(seen.insert(id), "{id} handed out twice");
            }
        }
    }
}
