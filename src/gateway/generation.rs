//! The generation being served: one configuration's router and pools, swapped whole on
//! reload, and the cell every request reads it from without a lock.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use crate::access::LogSettings;
use crate::config::{Config, ListenAddress};
use crate::router::Router;

use super::PoolRegistry;

/// One configuration at run time: its router and its pools, built together and replaced
/// together on reload, so a request is never routed by one configuration and served by
/// another (ARCHITECTURE.md, "Generations and reload").
#[derive(Debug)]
pub struct Generation {
    /// Counts from 0 (the configuration corral started with), one more per reload.
    pub number: u64,
    /// Request → context.
    pub router: Router,
    /// The pools, by the [`PoolId`](crate::router::PoolId)s the router hands out.
    pub pools: PoolRegistry,
    /// php-fpm's status and ping paths per FastCGI listener: (listener, status, ping).
    pub(super) fpm_paths: Vec<(ListenAddress, Option<String>, Option<String>)>,
    /// The request logs' settings, when one is on.
    pub logs: Option<Arc<LogSettings>>,
}

impl Generation {
    /// The generation `number` of `config`, with the pools already built.
    pub fn new(number: u64, config: &Config, router: Router, pools: PoolRegistry) -> Generation {
        Generation {
            number,
            router,
            pools,
            logs: Some(LogSettings::of(&config.server))
                .filter(LogSettings::enabled)
                .map(Arc::new),
            fpm_paths: config
                .listeners
                .iter()
                .filter(|l| l.status_path.is_some() || l.ping_path.is_some())
                .map(|l| (l.bind.address(), l.status_path.clone(), l.ping_path.clone()))
                .collect(),
        }
    }
}

/// The generation being served, readable on every request without a lock: each thread keeps
/// the one it last used with its epoch, and takes the lock only when the epoch has moved
/// (once per thread per reload).
#[derive(Debug)]
pub(super) struct Live {
    /// Tells this cell's generations apart from another gateway's in the thread caches.
    id: u64,
    epoch: AtomicU64,
    current: std::sync::Mutex<Arc<Generation>>,
}

/// Gives every [`Live`] its own id.
static NEXT_LIVE: AtomicU64 = AtomicU64::new(0);

thread_local! {
    /// (live id, epoch, generation) last read by this thread.
    static CURRENT: std::cell::RefCell<Option<(u64, u64, Arc<Generation>)>> =
        const { std::cell::RefCell::new(None) };
}

impl Live {
    pub(super) fn new(generation: Generation) -> Live {
        Live {
            id: NEXT_LIVE.fetch_add(1, Ordering::Relaxed),
            epoch: AtomicU64::new(0),
            current: std::sync::Mutex::new(Arc::new(generation)),
        }
    }

    fn locked(&self) -> Arc<Generation> {
        Arc::clone(&self.current.lock().unwrap_or_else(|p| p.into_inner()))
    }

    pub(super) fn get(&self) -> Arc<Generation> {
        let epoch = self.epoch.load(Ordering::Acquire);
        CURRENT.with(|cell| {
            let Ok(mut cached) = cell.try_borrow_mut() else {
                return self.locked();
            };
            if let Some((id, e, g)) = cached.as_ref() {
                if *id == self.id && *e == epoch {
                    return Arc::clone(g);
                }
            }
            let g = self.locked();
            *cached = Some((self.id, epoch, Arc::clone(&g)));
            g
        })
    }

    /// Calls `f` with the current generation, borrowed from this thread's cache when it is
    /// current (no reference count touched: `get` clones the `Arc`, whose count every
    /// serving thread writes).
    pub(super) fn with<R, F: FnOnce(&Generation) -> R>(&self, f: F) -> R {
        let epoch = self.epoch.load(Ordering::Acquire);
        let tried = CURRENT.with(move |cell| {
            let Ok(cached) = cell.try_borrow() else {
                return Err(f);
            };
            match cached.as_ref() {
                Some((id, e, g)) if *id == self.id && *e == epoch => Ok(f(g)),
                _ => Err(f),
            }
        });
        match tried {
            Ok(r) => r,
            Err(f) => f(&self.get()),
        }
    }

    pub(super) fn set(&self, generation: Arc<Generation>) -> Arc<Generation> {
        let mut current = self.current.lock().unwrap_or_else(|p| p.into_inner());
        let old = std::mem::replace(&mut *current, generation);
        self.epoch.fetch_add(1, Ordering::AcqRel);
        old
    }
}
