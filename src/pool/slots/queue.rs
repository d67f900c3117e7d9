//! The queue of requests waiting for a slot: who is handed a freed slot, and in what order.

use std::sync::Arc;

use tokio::sync::oneshot;
use tokio::time::Instant;

use super::choice::Grant;
use super::{SlotTable, State};

#[derive(Debug)]
pub(super) struct Waiter {
    pub(super) id: u64,
    pub(super) context: usize,
    pub(super) tx: oneshot::Sender<Grant>,
    /// The serving thread it waits on (`crate::shards`).
    pub(super) shard: Option<usize>,
    /// How many times a younger waiter was served before it ([`MAX_PASSED`]).
    pub(super) passed: u32,
    /// When it asked for a slot.
    pub(super) since: Instant,
}

/// How many times a waiter may be passed over for a younger one on the thread that freed the
/// slot. Handing a slot to a request on that thread spares a wake-up of another thread (and
/// keeps the worker's kept connection on the thread that holds it), which on 2 cores cost
/// more than the request itself; the bound keeps the queue nearly FIFO.
const MAX_PASSED: u32 = 2;

impl SlotTable {
    /// Refuses every waiter and every later request with [`super::SlotError::Closed`].
    pub fn close(&self) {
        let mut st = self.lock();
        st.closed = true;
        // Dropping the senders wakes the waiters with an error.
        st.waiters.clear();
    }

    /// Takes waiter `id` out of the queue: it stopped waiting (timeout, client gone), and
    /// its place is free for the next request at once.
    fn leave_queue(&self, id: u64) {
        let mut st = self.lock();
        if let Some(i) = st.waiters.iter().position(|w| w.id == id) {
            st.waiters.remove(i);
        }
    }

    /// Hands free slots to waiters, oldest first. A waiter whose context is at its cap keeps
    /// its place and is skipped, so one busy context cannot block the others.
    pub(super) fn grant_waiters(st: &mut State) {
        Self::grant_local_waiter(st);
        let mut i = 0;
        while i < st.waiters.len() && st.in_flight < st.limits.max_conns {
            let Some((context, gone)) = st.waiters.get(i).map(|w| (w.context, w.tx.is_closed()))
            else {
                return;
            };
            if gone {
                st.waiters.remove(i);
                continue;
            }
            let Some(grant) = Self::try_take(st, context, None) else {
                i += 1;
                continue;
            };
            let (worker, lane) = (grant.worker, grant.lane);
            if let Some(waiter) = st.waiters.remove(i) {
                if waiter.tx.send(grant).is_err() {
                    Self::ungrant(st, worker, context, lane);
                }
            }
        }
    }

    /// On a serving thread, grants capacity to the oldest waiter on the same thread, if no
    /// older waiter has been passed over [`MAX_PASSED`] times already; the rest is granted in
    /// queue order by `grant_waiters`.
    fn grant_local_waiter(st: &mut State) {
        let Some(here) = crate::shards::current() else {
            return;
        };
        if st.in_flight >= st.limits.max_conns {
            return;
        }
        let mut pick = None;
        for (i, w) in st.waiters.iter().enumerate() {
            if w.shard == Some(here) && !w.tx.is_closed() {
                pick = Some((i, w.context));
                break;
            }
            if w.passed >= MAX_PASSED {
                return;
            }
        }
        let Some((i, context)) = pick else {
            return;
        };
        if i == 0 {
            // The oldest one: the queue-order pass grants it anyway.
            return;
        }
        let Some(grant) = Self::try_take(st, context, None) else {
            return;
        };
        let (worker, lane) = (grant.worker, grant.lane);
        let Some(waiter) = st.waiters.remove(i) else {
            return;
        };
        match waiter.tx.send(grant) {
            Ok(()) => {
                for w in st.waiters.iter_mut().take(i) {
                    w.passed += 1;
                }
            }
            Err(_) => Self::ungrant(st, worker, context, lane),
        }
    }
}

/// A queued request's end of the hand-off. If the request stops waiting (timeout, or the
/// client went away and the future was dropped), the drop takes it out of the queue at once,
/// so its place is free for the next request; a slot already sent to it is given back.
pub(super) struct Wait<'a> {
    pub(super) table: &'a Arc<SlotTable>,
    pub(super) id: u64,
    pub(super) context: usize,
    pub(super) rx: oneshot::Receiver<Grant>,
    pub(super) granted: bool,
}

impl<'a> Wait<'a> {
    pub(super) fn new(
        table: &'a Arc<SlotTable>,
        id: u64,
        context: usize,
        rx: oneshot::Receiver<Grant>,
    ) -> Self {
        Wait {
            table,
            id,
            context,
            rx,
            granted: false,
        }
    }
}

impl Drop for Wait<'_> {
    fn drop(&mut self) {
        if self.granted {
            return;
        }
        self.rx.close();
        match self.rx.try_recv() {
            Ok(grant) => self.table.release(grant.worker, self.context, grant.lane),
            Err(_) => self.table.leave_queue(self.id),
        }
    }
}
