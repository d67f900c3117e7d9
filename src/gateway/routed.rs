//! A request routed to a context and its pool, and the admission checks that need nothing
//! but the route.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use crate::access::LogSettings;
use crate::backend::BackendError;
use crate::protocols::cgi::CgiParams;
use crate::router::Context;

use super::{script, GatewayError, Generation, Pool};

/// A request routed: its context and the pool that serves it, both of one generation. While
/// it lives the pool counts it as routed (a pool retired by a reload waits for it).
#[derive(Debug)]
pub struct Routed {
    /// The context.
    pub context: Arc<Context>,
    /// Its pool.
    pub pool: Arc<Pool>,
    /// The generation that routed it.
    pub generation: u64,
    /// The generation's request-log settings, when a request log is on.
    pub(super) logs: Option<Arc<LogSettings>>,
    /// The share of the pool's [`RoutedCount`] that counts this request.
    share: usize,
}

impl Routed {
    pub(super) fn new(context: Arc<Context>, pool: Arc<Pool>, generation: &Generation) -> Routed {
        let share = pool.routed.enter();
        Routed {
            context,
            pool,
            generation: generation.number,
            logs: generation.logs.clone(),
            share,
        }
    }
}

impl Drop for Routed {
    fn drop(&mut self) {
        self.pool.routed.leave(self.share);
    }
}

/// A pool's requests routed and not yet ended, counted in a share per serving thread (each
/// on a cache line of its own) and added up when a retired pool asks whether it is drained:
/// a request's count was an atomic read-modify-write, twice, on a line every serving thread
/// wrote. A request is taken off the share it was counted in, whichever thread drops it, so
/// no share goes below zero. Requests off the serving threads (the work-stealing scheduler,
/// tests) count in a share of their own.
#[derive(Debug)]
pub struct RoutedCount {
    /// Index 0: requests off the serving threads; 1 + i: serving thread i.
    shares: Box<[Share]>,
}

#[derive(Debug, Default)]
#[repr(align(128))]
struct Share(AtomicUsize);

impl RoutedCount {
    /// A count with a share for each of `threads` serving threads.
    pub fn new(threads: usize) -> RoutedCount {
        RoutedCount {
            shares: (0..=threads).map(|_| Share::default()).collect(),
        }
    }

    /// Counts a request in the calling thread's share; the share's index, for [`leave`].
    ///
    /// [`leave`]: Self::leave
    fn enter(&self) -> usize {
        let share = crate::shards::current()
            .map(|i| i + 1)
            .filter(|&i| i < self.shares.len())
            .unwrap_or(0);
        if let Some(s) = self.shares.get(share) {
            s.0.fetch_add(1, Ordering::AcqRel);
        }
        share
    }

    fn leave(&self, share: usize) {
        if let Some(s) = self.shares.get(share) {
            s.0.fetch_sub(1, Ordering::AcqRel);
        }
    }

    /// Requests routed and not yet ended, every share's added up.
    pub fn now(&self) -> usize {
        self.shares
            .iter()
            .map(|s| s.0.load(Ordering::Acquire))
            .fold(0, usize::wrapping_add)
    }
}

impl Routed {
    /// Checks, before a body is read, what [`Gateway::dispatch`](super::Gateway::dispatch) would refuse anyway: the
    /// script file and a declared length over the context's `max_body`. An upload to a
    /// missing script is then answered 404 without spooling a byte of it.
    pub fn precheck(&self, params: &CgiParams, body_len: Option<u64>) -> Result<(), GatewayError> {
        script::check(&self.context.cgi, params)?;
        match body_len {
            Some(length) if length > self.context.config.max_body => {
                Err(GatewayError::BodyTooLarge {
                    length: Some(length),
                    limit: self.context.config.max_body,
                })
            }
            _ => Ok(()),
        }
    }

    /// Whether the context reads whole request bodies before asking a worker.
    pub fn buffers_requests(&self) -> bool {
        self.context.config.request_buffering
    }

    /// A backend failure of this request's pool.
    pub fn backend_error(&self, source: BackendError) -> GatewayError {
        GatewayError::Backend {
            pool: Arc::clone(&self.pool.name),
            source,
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use std::sync::Arc;

    use super::RoutedCount;
    use crate::shards::Shards;

    /// What `enter` gives on serving thread `on` of `shards`.
    fn enter_on(shards: &Shards, on: usize, count: &Arc<RoutedCount>) -> usize {
        let (tx, rx) = std::sync::mpsc::channel();
        let count = Arc::clone(count);
        shards.handles()[on].spawn(async move {
            let _ = tx.send(count.enter());
        });
        rx.recv().unwrap()
    }

    #[test]
    fn a_request_leaves_the_share_it_entered_from_whichever_thread() {
        let shards = Shards::start(3, false, false).unwrap();
        let count = Arc::new(RoutedCount::new(2));
        let off = count.enter();
        assert_eq!((off, count.now()), (0, 1));
        let on_1 = enter_on(&shards, 1, &count);
        assert_eq!((on_1, count.now()), (2, 2));
        // Left here, off the thread that counted it.
        count.leave(on_1);
        assert_eq!(count.now(), 1);
        // A thread past the shares (a reload cannot add threads) counts in the shared one.
        let past = enter_on(&shards, 2, &count);
        assert_eq!((past, count.now()), (0, 2));
        count.leave(past);
        count.leave(off);
        assert_eq!(count.now(), 0);
    }
}
