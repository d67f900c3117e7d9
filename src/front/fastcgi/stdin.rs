//! One FastCGI request's FCGI_STDIN on its way from the connection's reader to the request's
//! backend exchange: the byte budgets that bound what the reader holds, and `body_deadline`.
//!
//! `body_deadline` is counted per request, on the exchange's side of the channel, as the HTTP
//! front's `IncomingSource` counts it: the time the exchange asked for the next bytes and the
//! channel had none, added up. The reader never waits for one request's backend while others
//! share the connection (a multiplexed request past its budget is refused, see
//! `src/front/fastcgi.rs`), so an empty channel means the front server has not sent that
//! request's bytes (or does not read its answers, which is its doing too); time the exchange
//! spends writing to a slow backend does not count, since it does not ask then.
//! Past the deadline the body fails with [`BodyDeadline`]: the exchange aborts its backend
//! request (which frees the slot), the request is answered 408 through the usual error path
//! and logged there, and the connection's other requests go on.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use tokio::sync::{mpsc, OwnedSemaphorePermit, Semaphore};
use tokio::time::{Instant, Sleep};

use crate::backend::{BodyDeadline, BodyError, BodySource, RequestBody};

/// Of the connection's budget, the bytes one request may hold (a few of the largest records,
/// 64 KiB each).
pub(super) const STDIN_BUDGET_PER_REQUEST: usize = 256 * 1024;

/// A new request body of `len` bytes (`None`: unknown) fed through the returned sender, which
/// fails once the exchange has waited `deadline` in all for its bytes.
pub(super) fn channel(len: Option<u64>, deadline: Duration) -> (StdinSender, RequestBody) {
    let (tx, rx) = mpsc::unbounded_channel();
    let source = StdinSource {
        rx,
        total: deadline,
        timer: Box::pin(tokio::time::sleep(deadline)),
        waiting: None,
        waited: Duration::ZERO,
    };
    let tx = StdinSender {
        tx,
        own: Arc::new(Semaphore::new(STDIN_BUDGET_PER_REQUEST)),
    };
    (tx, RequestBody::from_source(source, len))
}

/// One FCGI_STDIN chunk on its way to the backend exchange, with the budget it holds until
/// the exchange takes it.
pub(super) struct Chunk {
    data: Bytes,
    /// Held, never read: dropping them gives the bytes back to the budgets.
    _permits: Permits,
}

/// A chunk's share of the request's budget and of the connection's.
pub(super) type Permits = (OwnedSemaphorePermit, OwnedSemaphorePermit);

/// The reader's end of one request's body. The channel itself is unbounded; what bounds it is
/// the permits every chunk carries, one per byte, from the request's own budget (`own`) and
/// the connection's.
#[derive(Debug, Clone)]
pub(super) struct StdinSender {
    tx: mpsc::UnboundedSender<Chunk>,
    own: Arc<Semaphore>,
}

impl StdinSender {
    /// Both budgets' permits for `n` bytes if they are free now.
    pub(super) fn try_reserve(&self, connection: &Arc<Semaphore>, n: u32) -> Option<Permits> {
        let own = Arc::clone(&self.own).try_acquire_many_owned(n).ok()?;
        let conn = Arc::clone(connection).try_acquire_many_owned(n).ok()?;
        Some((own, conn))
    }

    /// Both budgets' permits for `n` bytes, waiting for the exchange to take earlier chunks.
    pub(super) async fn reserve(&self, connection: &Arc<Semaphore>, n: u32) -> Option<Permits> {
        let own = Arc::clone(&self.own).acquire_many_owned(n).await.ok()?;
        let conn = Arc::clone(connection).acquire_many_owned(n).await.ok()?;
        Some((own, conn))
    }

    /// Hands `data` to the exchange; false if it no longer reads the body.
    pub(super) fn send(&self, data: Bytes, permits: Permits) -> bool {
        let chunk = Chunk {
            data,
            _permits: permits,
        };
        self.tx.send(chunk).is_ok()
    }
}

/// The exchange's end of one request's body: taking a chunk gives its bytes back to the
/// budgets (the exchange then holds that one chunk while it writes it to the backend).
struct StdinSource {
    rx: mpsc::UnboundedReceiver<Chunk>,
    /// `body_deadline`.
    total: Duration,
    /// Fires when what is left of `total` has passed in the current wait.
    timer: Pin<Box<Sleep>>,
    /// When the current wait began, while the exchange waits for bytes that have not come.
    waiting: Option<Instant>,
    /// The earlier waits, added up.
    waited: Duration,
}

impl BodySource for StdinSource {
    fn poll_chunk(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Bytes, BodyError>>> {
        let this = self.get_mut();
        if let Poll::Ready(chunk) = this.rx.poll_recv(cx) {
            if let Some(since) = this.waiting.take() {
                this.waited += since.elapsed();
            }
            return Poll::Ready(chunk.map(|c| Ok(c.data)));
        }
        let since = match this.waiting {
            Some(since) => since,
            None => {
                let now = Instant::now();
                this.waiting = Some(now);
                let left = this.total.saturating_sub(this.waited);
                this.timer.as_mut().reset(now + left);
                now
            }
        };
        if this.timer.as_mut().poll(cx).is_ready() && this.waited + since.elapsed() >= this.total {
            // Logged once, with the request, where the 408 is answered.
            return Poll::Ready(Some(Err(Box::new(BodyDeadline { after: this.total }))));
        }
        Poll::Pending
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The next chunk, or `None` while none is ready (polled once, without waiting).
    fn now_or_never(body: &mut RequestBody) -> Option<Option<Result<Bytes, BodyError>>> {
        let waker = std::task::Waker::noop();
        match body.poll_chunk(&mut Context::from_waker(waker)) {
            Poll::Ready(chunk) => Some(chunk),
            Poll::Pending => None,
        }
    }

    fn budget() -> Arc<Semaphore> {
        Arc::new(Semaphore::new(STDIN_BUDGET_PER_REQUEST * 4))
    }

    fn send(tx: &StdinSender, conn: &Arc<Semaphore>, data: &'static [u8]) {
        let n = u32::try_from(data.len()).unwrap_or(u32::MAX);
        let permits = tx.try_reserve(conn, n).unwrap();
        assert!(tx.send(Bytes::from_static(data), permits));
    }

    #[tokio::test(start_paused = true)]
    async fn a_byte_within_each_wait_is_still_cut_off_once_the_waits_add_up_to_the_deadline() {
        let conn = budget();
        let (tx, mut body) = channel(Some(100), Duration::from_secs(3));
        let mut bytes = 0;
        let mut failed = None;
        for _ in 0..10 {
            // The exchange asks, nothing has come; 0.9 s later a byte does.
            assert!(now_or_never(&mut body).is_none());
            tokio::time::advance(Duration::from_millis(900)).await;
            if let Some(chunk) = now_or_never(&mut body) {
                failed = Some(chunk.unwrap().unwrap_err());
                break;
            }
            send(&tx, &conn, b"x");
            assert_eq!(now_or_never(&mut body).unwrap().unwrap().unwrap(), "x");
            bytes += 1;
        }
        let failed = failed.expect("cut off within 9 s of waiting");
        assert_eq!(
            failed.downcast_ref::<BodyDeadline>(),
            Some(&BodyDeadline {
                after: Duration::from_secs(3)
            }),
            "{failed}"
        );
        // Three waits of 0.9 s, each ended by a byte; the fourth ran into the deadline.
        assert_eq!(bytes, 3);
    }

    #[tokio::test(start_paused = true)]
    async fn time_the_exchange_does_not_ask_for_bytes_is_not_counted() {
        let conn = budget();
        let (tx, mut body) = channel(Some(100), Duration::from_secs(3));
        for _ in 0..5 {
            assert!(now_or_never(&mut body).is_none());
            tokio::time::advance(Duration::from_millis(500)).await;
            send(&tx, &conn, b"x");
            assert!(matches!(now_or_never(&mut body), Some(Some(Ok(_)))));
            // The exchange writes to a slow backend and does not ask for a while.
            tokio::time::advance(Duration::from_secs(10)).await;
        }
        // 2.5 s of waiting in all: the body goes on, and ends when the sender is dropped.
        assert!(now_or_never(&mut body).is_none());
        drop(tx);
        assert!(matches!(now_or_never(&mut body), Some(None)));
    }

    #[tokio::test]
    async fn a_chunk_gives_its_bytes_back_to_both_budgets_when_taken() {
        let conn = budget();
        let (tx, mut body) = channel(None, Duration::from_secs(3));
        send(&tx, &conn, b"abcd");
        assert_eq!(conn.available_permits(), STDIN_BUDGET_PER_REQUEST * 4 - 4);
        assert_eq!(tx.own.available_permits(), STDIN_BUDGET_PER_REQUEST - 4);
        let chunk = body.next_chunk().await;
        assert!(matches!(chunk, Some(Ok(ref d)) if d.as_ref() == b"abcd"));
        assert_eq!(conn.available_permits(), STDIN_BUDGET_PER_REQUEST * 4);
        assert_eq!(tx.own.available_permits(), STDIN_BUDGET_PER_REQUEST);
    }
}
