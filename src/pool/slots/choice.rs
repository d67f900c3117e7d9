//! Taking a slot and giving it back: the pool's, the context's and the chosen worker's counts
//! move together here, under the table's lock.

use std::sync::Arc;

use tokio::time::Instant;

use super::{SlotTable, State, WorkerId};
use crate::config::BackendAddress;

/// What a waiter is handed.
#[derive(Debug)]
pub(super) struct Grant {
    pub(super) worker: WorkerId,
    /// Where the worker listens.
    pub(super) address: Arc<BackendAddress>,
    /// Whether the slot is a probe (the worker had failures on record).
    pub(super) probe: bool,
    /// The worker's lane that holds when the slot was taken.
    pub(super) lane: u32,
    /// The pool's requests in flight with this one, for the status page's maximum (read
    /// here, under the lock the grant already holds, not with a lock of its own).
    pub(super) in_flight: usize,
    /// The worker's process id as the table knew it then.
    pub(super) pid: Option<u32>,
}

/// The lane of a slot taken with every lane in use, which cannot happen while `in_flight`
/// stays below the concurrency; such a slot is simply not timed.
pub(super) const NO_LANE: u32 = u32::MAX;

impl SlotTable {
    /// Takes a slot for `context` if the pool, the context and some worker have room; the
    /// least loaded accepting worker wins, the lowest index on a tie. A server out of
    /// rotation is skipped; when every server with room is out, the one due back first is
    /// used anyway (as a probe) when no server is up at all, so a request fails fast with
    /// the server's own error rather than waiting for a slot that nothing would free.
    /// The slot's lane records `since`, or the time now when that is `None` (read only
    /// when a slot is taken).
    pub(super) fn try_take(
        st: &mut State,
        context: usize,
        since: Option<Instant>,
    ) -> Option<Grant> {
        if st.in_flight >= st.limits.max_conns {
            return None;
        }
        let cap = st.context_caps.get(context).copied().unwrap_or(usize::MAX);
        if st.context_in_flight.get(context).copied().unwrap_or(0) >= cap {
            return None;
        }
        let mut now: Option<Instant> = None;
        let mut best: Option<(usize, usize)> = None;
        let mut fallback: Option<(usize, Instant)> = None;
        let mut any_up = false;
        for (i, w) in st.workers.iter().enumerate() {
            if !w.accepting {
                continue;
            }
            if let Some(until) = w.down_until {
                let t = *now.get_or_insert_with(Instant::now);
                if until > t {
                    let room = !w.checking && w.in_flight < w.capacity();
                    if room && fallback.is_none_or(|(_, f)| until < f) {
                        fallback = Some((i, until));
                    }
                    continue;
                }
            }
            any_up = true;
            if w.checking || w.in_flight >= w.capacity() {
                continue;
            }
            if w.in_flight == 0 {
                best = Some((i, 0));
                break;
            }
            if best.is_none_or(|(_, load)| w.in_flight < load) {
                best = Some((i, w.in_flight));
            }
        }
        // A busy server that is up will free a slot; only when none is up is a down one
        // tried.
        let fallback = fallback.filter(|_| !any_up).map(|(i, _)| i);
        let index = best.map(|(i, _)| i).or(fallback)?;
        let w = st.workers.get_mut(index)?;
        w.in_flight += 1;
        w.started += 1;
        if w.budget.is_some_and(|b| w.started >= b) {
            // The last request of its budget: it takes no more, and its supervisor is told
            // (`SlotTable::wake_if_spent`) so that it replaces it now.
            w.accepting = false;
            st.spent = true;
        }
        // The first request after a rest wakes a supervisor that asked for it.
        st.spent |= std::mem::take(&mut st.wake_at_next_request);
        let probe = w.fails > 0 || w.down_since.is_some();
        let id = WorkerId {
            index,
            generation: w.generation,
        };
        let address = Arc::clone(&w.address);
        let pid = w.pid;
        let lane = w.free_lanes.pop_front().unwrap_or(NO_LANE);
        if let Some(l) = w.lanes.get_mut(lane as usize) {
            *l = Some(since.or(now).unwrap_or_else(Instant::now));
        }
        if let Some(c) = st.context_in_flight.get_mut(context) {
            *c += 1;
        }
        st.in_flight += 1;
        Some(Grant {
            worker: id,
            address,
            probe,
            lane,
            in_flight: st.in_flight,
            pid,
        })
    }

    /// Gives a slot back; true when the supervisor must hear of it (a memory check is due,
    /// or a watched worker drained).
    pub(super) fn give_back(st: &mut State, worker: WorkerId, context: usize, lane: u32) -> bool {
        let mut check = false;
        let mut drained = false;
        if let Some(w) = Self::entry(st, worker) {
            if let Some(l) = w.lanes.get_mut(lane as usize) {
                if l.take().is_some() {
                    w.free_lanes.push_back(lane);
                }
            }
            w.in_flight = w.in_flight.saturating_sub(1);
            w.finished += 1;
            if w.in_flight == 0 && w.watch_drain {
                w.watch_drain = false;
                drained = true;
            }
            if let Some(n) = w.check_in.as_mut() {
                *n = n.saturating_sub(1);
                if *n == 0 && w.accepting && !w.checking {
                    // Held until the supervisor has measured it, so a worker grown past
                    // max_memory never takes the next request.
                    w.check_in = None;
                    w.checking = true;
                    check = true;
                }
            }
        }
        if let Some(c) = st.context_in_flight.get_mut(context) {
            *c = c.saturating_sub(1);
        }
        st.in_flight = st.in_flight.saturating_sub(1);
        if check {
            st.checks.push(worker);
        }
        if drained {
            st.drained.push(worker);
        }
        check || drained
    }

    /// Undoes a grant whose waiter gave up between the check and the send. Its request never
    /// ran, so the worker's request count and memory check stay as they were.
    pub(super) fn ungrant(st: &mut State, worker: WorkerId, context: usize, lane: u32) {
        if let Some(w) = Self::entry(st, worker) {
            w.started = w.started.saturating_sub(1);
            w.check_in = w.check_in.map(|n| n + 1);
        }
        Self::give_back(st, worker, context, lane);
        if let Some(w) = Self::entry(st, worker) {
            w.finished = w.finished.saturating_sub(1);
        }
    }
}
