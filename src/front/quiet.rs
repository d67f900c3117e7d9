//! A future polled only when one of its own wakers fired.
//!
//! A connection task waits on its connection and, beside it, on things that almost never
//! happen (its idle or head deadline, an eviction, the server's shutdown). Joined with
//! `tokio::select!`, every wake of the task polls every branch: for each request the watch's
//! notification, its timer and two cancellation tokens were polled again for nothing, a
//! tenth of corral's instructions per request under callgrind. Wrapped in [`Quiet`], the
//! side future is polled only after something it waits on woke it.

use std::future::Future;
use std::ops::DerefMut;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll, Wake, Waker};

/// Polls the future `P` points to only when a waker it registered has fired since its last
/// poll (and on the first poll). Its wakers wake the task that last polled it. `P` is
/// `Pin<&mut F>` for a future pinned on the caller's stack (no allocation), or a box.
pub(crate) struct Quiet<P> {
    inner: Pin<P>,
    signal: Arc<Signal>,
    /// `signal` as a waker, made once.
    waker: Waker,
}

/// Set by the inner future's wakers; remembers whom to wake.
#[derive(Debug)]
struct Signal {
    woken: AtomicBool,
    task: Mutex<Option<Waker>>,
}

impl Wake for Signal {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        self.woken.store(true, Ordering::Release);
        let task = self.task.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(task) = task.as_ref() {
            task.wake_by_ref();
        }
    }
}

impl<P> Quiet<P>
where
    P: DerefMut,
    P::Target: Future,
{
    pub(crate) fn new(inner: Pin<P>) -> Quiet<P> {
        let signal = Arc::new(Signal {
            woken: AtomicBool::new(true),
            task: Mutex::new(None),
        });
        Quiet {
            inner,
            waker: Waker::from(Arc::clone(&signal)),
            signal,
        }
    }
}

impl<P> Future for Quiet<P>
where
    P: DerefMut + Unpin,
    P::Target: Future,
{
    type Output = <P::Target as Future>::Output;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.get_mut();
        if !this.signal.woken.swap(false, Ordering::AcqRel) {
            return Poll::Pending;
        }
        {
            // Before the inner poll, so a wake during it reaches this task.
            let mut task = this
                .signal
                .task
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            if !task.as_ref().is_some_and(|t| t.will_wake(cx.waker())) {
                *task = Some(cx.waker().clone());
            }
        }
        this.inner
            .as_mut()
            .poll(&mut Context::from_waker(&this.waker))
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::AtomicUsize;
    use std::time::Duration;

    use super::*;

    /// Counts every poll of the future it wraps.
    struct CountPolls<F> {
        inner: Pin<Box<F>>,
        polls: Arc<AtomicUsize>,
    }

    impl<F: Future> Future for CountPolls<F> {
        type Output = F::Output;

        fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
            let this = self.get_mut();
            this.polls.fetch_add(1, Ordering::Relaxed);
            this.inner.as_mut().poll(cx)
        }
    }

    #[tokio::test]
    async fn the_side_future_is_polled_only_when_it_was_woken() {
        let polls = Arc::new(AtomicUsize::new(0));
        let notify = Arc::new(tokio::sync::Notify::new());
        let woken = Arc::clone(&notify);
        let mut quiet = Box::pin(Quiet::new(Box::pin(CountPolls {
            inner: Box::pin(async move {
                woken.notified().await;
                "woken"
            }),
            polls: Arc::clone(&polls),
        })));
        // A busy main future wakes the task a hundred times; the side is polled once.
        let (tx, mut rx) = tokio::sync::mpsc::channel::<u32>(1);
        let sender = tokio::spawn(async move {
            for i in 0..100 {
                tx.send(i).await.unwrap();
            }
        });
        let mut received = 0;
        let mut notified = false;
        let outcome = std::future::poll_fn(|cx| {
            while let Poll::Ready(Some(_)) = rx.poll_recv(cx) {
                received += 1;
            }
            if received == 100 && !notified {
                assert_eq!(
                    polls.load(Ordering::Relaxed),
                    1,
                    "polled while nothing woke it"
                );
                notified = true;
                notify.notify_one();
            }
            quiet.as_mut().poll(cx)
        });
        let done = tokio::time::timeout(Duration::from_secs(10), outcome).await;
        assert_eq!(done, Ok("woken"));
        sender.await.unwrap();
        assert_eq!(received, 100);
        assert_eq!(
            polls.load(Ordering::Relaxed),
            2,
            "polled at the start and when woken"
        );
    }
}
