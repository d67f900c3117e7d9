//! The cap table's word to one connection that it has been closed for room: a flag and a
//! wake-up inside the connection's shared state, so that admitting a connection costs no
//! allocation for it (a cancellation token is a tree node of its own on the heap, made and
//! freed for every connection, and nginx's plain `fastcgi_pass` opens one per request).

use std::sync::atomic::{AtomicBool, Ordering};

use tokio::sync::Notify;

/// Set once by the cap table; waited on by the connection's task.
#[derive(Debug, Default)]
pub struct Eviction {
    set: AtomicBool,
    woken: Notify,
}

impl Eviction {
    /// Marks the connection evicted and wakes whoever waits in [`cancelled`](Self::cancelled).
    pub fn cancel(&self) {
        self.set.store(true, Ordering::Release);
        self.woken.notify_waiters();
    }

    /// Whether the connection has been evicted.
    pub fn is_cancelled(&self) -> bool {
        self.set.load(Ordering::Acquire)
    }

    /// Returns once the connection has been evicted. A `Notified` made before the flag is
    /// read sees a `notify_waiters` that comes after that read, even if it is not polled yet,
    /// so an eviction between the two is never lost.
    pub async fn cancelled(&self) {
        loop {
            let woken = self.woken.notified();
            if self.is_cancelled() {
                return;
            }
            woken.await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::time::Duration;

    #[tokio::test]
    async fn a_waiter_wakes_when_the_connection_is_evicted() {
        let e = Arc::new(Eviction::default());
        assert!(!e.is_cancelled());
        let waiting = tokio::spawn({
            let e = Arc::clone(&e);
            async move { e.cancelled().await }
        });
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(!waiting.is_finished());
        e.cancel();
        tokio::time::timeout(Duration::from_secs(5), waiting)
            .await
            .expect("the waiter woke")
            .expect("the waiter ended");
        assert!(e.is_cancelled());
    }

    #[tokio::test]
    async fn an_eviction_made_before_the_wait_is_seen_at_once() {
        let e = Eviction::default();
        e.cancel();
        tokio::time::timeout(Duration::from_secs(1), e.cancelled())
            .await
            .expect("already evicted");
    }

    #[tokio::test]
    async fn a_wait_made_before_the_eviction_but_polled_after_it_ends() {
        let e = Eviction::default();
        let wait = e.cancelled();
        e.cancel();
        tokio::time::timeout(Duration::from_secs(1), wait)
            .await
            .expect("the eviction between making and polling the wait is seen");
    }
}
