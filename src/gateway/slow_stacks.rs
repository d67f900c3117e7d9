//! The slow-request log's stacks: for a pool whose workers run corral's launchers, a request
//! still running when it passes `slow_threshold` has its worker asked for its stacks once
//! (without killing it: [`crate::process::stacks`]), and its slow-log entry carries them.
//!
//! One task per such request sleeps until the threshold; a request that ends first cancels
//! it. A request that ends while its worker is still dumping hands its entry to the task,
//! which writes it once the dump has ended (within [`STACKS_BOUND`]), so the entry is never
//! written without the stacks that were asked for. A request still waiting for a worker at
//! the threshold is slow in the queue, which its entry shows: no worker is asked.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;

use super::body::Logged;
use crate::access::SlowStack;
use crate::process::output::Tail;
use crate::process::stacks::ASK_BOUND as STACKS_BOUND;

/// Where a request's stacks stand.
#[derive(Debug)]
enum State {
    /// Waiting for the threshold.
    Armed,
    /// The worker is being asked; the entry, when the request ended meanwhile.
    Asking(Option<Box<Logged>>),
    /// Asked (`None`: it could not be).
    Taken(Option<Arc<SlowStack>>),
    /// The entry has been written.
    Done,
}

#[derive(Debug)]
struct Shared {
    state: Mutex<State>,
    /// The worker serving the request, once known (0 before).
    pid: AtomicU32,
}

/// One request's watch for `slow_threshold`.
#[derive(Debug)]
pub(super) struct SlowWatch {
    shared: Arc<Shared>,
    task: tokio::task::AbortHandle,
}

impl SlowWatch {
    /// Starts watching a request that started at `started`, for `threshold`.
    pub(super) fn arm(tail: Arc<Tail>, started: Instant, threshold: Duration) -> SlowWatch {
        let shared = Arc::new(Shared {
            state: Mutex::new(State::Armed),
            pid: AtomicU32::new(0),
        });
        let watched = Arc::clone(&shared);
        let task = tokio::spawn(async move {
            tokio::time::sleep_until(started + threshold).await;
            ask(&watched, &tail).await;
        })
        .abort_handle();
        SlowWatch { shared, task }
    }

    /// The worker the request went to (it may move once, when its first one was lost).
    pub(super) fn serving(&self, pid: Option<u32>) {
        self.shared.pid.store(pid.unwrap_or(0), Ordering::Release);
    }

    /// Writes `logged` now, with the stacks if they were taken, or hands it to the task when
    /// they are being taken.
    pub(super) fn finish(self, mut logged: Box<Logged>) {
        let mut state = lock(&self.shared);
        match std::mem::replace(&mut *state, State::Done) {
            State::Armed => {
                drop(state);
                self.task.abort();
                logged.write();
            }
            State::Asking(_) => *state = State::Asking(Some(logged)),
            State::Taken(stack) => {
                drop(state);
                logged.record.stack = stack;
                logged.write();
            }
            State::Done => {
                drop(state);
                logged.write();
            }
        }
    }
}

fn lock(shared: &Shared) -> std::sync::MutexGuard<'_, State> {
    shared.state.lock().unwrap_or_else(|p| p.into_inner())
}

/// The threshold has passed: asks the worker, then writes the entry if the request ended
/// meanwhile.
async fn ask(shared: &Shared, tail: &Tail) {
    let pid = shared.pid.load(Ordering::Acquire);
    {
        let mut state = lock(shared);
        if !matches!(*state, State::Armed) {
            return;
        }
        if pid == 0 {
            *state = State::Taken(None);
            return;
        }
        *state = State::Asking(None);
    }
    let stack = tail.stacks.ask(pid, STACKS_BOUND).await.ok().map(|s| {
        Arc::new(SlowStack {
            pid,
            lines: s.lines,
            complete: s.complete,
        })
    });
    let mut state = lock(shared);
    match std::mem::replace(&mut *state, State::Taken(stack.clone())) {
        State::Asking(Some(mut logged)) => {
            *state = State::Done;
            drop(state);
            logged.record.stack = stack;
            logged.write();
        }
        State::Asking(None) => {}
        other => *state = other,
    }
}
