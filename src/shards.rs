//! Per-thread serving (`[server] scheduler = "per-thread"`, ARCHITECTURE.md "Serving
//! threads"): a fixed set of threads, each running its own single-threaded runtime, each
//! accepting on its own copy of every front listener. A connection, its requests and the
//! backend connections they open stay on the thread that accepted it, so the common request
//! wakes no other thread; only what is shared by design (a pool's slots, the access log's
//! writer) crosses threads.
//!
//! The control plane (pool drivers, reloads, signals, the status listener) stays on the
//! runtime `corral run` starts, which then needs only one thread of its own.

use std::cell::Cell;
use std::io;

use tokio::runtime::Handle;
use tokio::sync::oneshot;

thread_local! {
    /// The serving thread this is, if it is one.
    static SHARD: Cell<Option<usize>> = const { Cell::new(None) };
}

/// The serving thread the caller runs on (`None` off them: the control plane, tests).
pub fn current() -> Option<usize> {
    SHARD.with(Cell::get)
}

/// The serving threads. Dropping this stops them: each runtime drops the tasks it still has.
#[derive(Debug)]
pub struct Shards {
    handles: Vec<Handle>,
    /// One per thread; dropping a sender ends that thread's `block_on`.
    stops: Vec<oneshot::Sender<()>>,
}

impl Shards {
    /// Starts `n` serving threads, each with a runtime that has I/O and timers.
    pub fn start(n: usize) -> io::Result<Shards> {
        let mut handles = Vec::with_capacity(n);
        let mut stops = Vec::with_capacity(n);
        for i in 0..n {
            let (ready_tx, ready_rx) = std::sync::mpsc::channel();
            let (stop_tx, stop_rx) = oneshot::channel::<()>();
            std::thread::Builder::new()
                .name(format!("corral-serve-{i}"))
                .spawn(move || {
                    SHARD.with(|s| s.set(Some(i)));
                    let runtime = match tokio::runtime::Builder::new_current_thread()
                        .enable_all()
                        .build()
                    {
                        Ok(r) => r,
                        Err(e) => {
                            let _ = ready_tx.send(Err(e));
                            return;
                        }
                    };
                    let _ = ready_tx.send(Ok(runtime.handle().clone()));
                    runtime.block_on(async {
                        let _ = stop_rx.await;
                    });
                })?;
            let handle = ready_rx.recv().map_err(|_| {
                io::Error::other(format!(
                    "serving thread {i} ended before its runtime started"
                ))
            })??;
            handles.push(handle);
            stops.push(stop_tx);
        }
        Ok(Shards { handles, stops })
    }

    /// Each serving thread's runtime, in thread order.
    pub fn handles(&self) -> &[Handle] {
        &self.handles
    }

    /// How many serving threads there are.
    pub fn len(&self) -> usize {
        self.handles.len()
    }

    /// Whether there are none (never, once started with `n` ≥ 1).
    pub fn is_empty(&self) -> bool {
        self.handles.is_empty()
    }
}

impl Drop for Shards {
    fn drop(&mut self) {
        self.stops.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_thread_knows_its_index_and_runs_what_it_is_given() {
        let shards = Shards::start(2).unwrap();
        assert_eq!(shards.len(), 2);
        assert_eq!(current(), None);
        for (i, h) in shards.handles().iter().enumerate() {
            let (tx, rx) = std::sync::mpsc::channel();
            h.spawn(async move {
                tokio::task::yield_now().await;
                let _ = tx.send((current(), std::thread::current().name().map(str::to_owned)));
            });
            let (shard, name) = rx.recv().unwrap();
            assert_eq!(shard, Some(i));
            assert_eq!(name.as_deref(), Some(format!("corral-serve-{i}").as_str()));
        }
    }
}
