//! Per-thread serving (`[server] scheduler = "per-thread"`, ARCHITECTURE.md "Serving
//! threads"): a fixed set of threads, each running its own single-threaded runtime, each
//! accepting on its own copy of every front listener. A connection, its requests and the
//! backend connections they open stay on the thread that accepted it, so the common request
//! wakes no other thread; only what is shared by design (a pool's slots, the access log's
//! writer) crosses threads.
//!
//! The control plane (pool drivers, reloads, signals, the status listener) stays on the
//! runtime `corral run` starts, which then needs only one thread of its own.
//!
//! With `pin_threads`, serving thread i may run only on the i-th CPU corral may run on (in
//! turn, when there are more threads than CPUs), as nginx's `worker_cpu_affinity auto` pins
//! its workers: a thread that sleeps between the two halves of every request (the client's,
//! then the backend's) otherwise wakes wherever the kernel finds an idle CPU, with its data
//! in the other CPU's caches (docs/operations.md, "Serving threads").
//!
//! With `sched_batch`, each serving thread moves itself from Linux's default policy to
//! `SCHED_BATCH`: woken while every CPU is busy, it waits for one instead of taking it from
//! a worker (src/config/threads.rs, decision 45). The workers keep the default: they are
//! forked on the control runtime's thread, which keeps the policy corral started with.

use std::cell::Cell;
use std::io;

use nix::sched::{sched_getaffinity, sched_setaffinity, CpuSet};
use nix::unistd::Pid;
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
    /// Starts `n` serving threads, each with a runtime that has I/O and timers, each pinned
    /// to a CPU of its own when `pin` is set and under `SCHED_BATCH` when `batch` is.
    pub fn start(n: usize, pin: bool, batch: bool) -> io::Result<Shards> {
        let cpus = if pin { allowed_cpus()? } else { Vec::new() };
        let mut handles = Vec::with_capacity(n);
        let mut stops = Vec::with_capacity(n);
        for i in 0..n {
            let (ready_tx, ready_rx) = std::sync::mpsc::channel();
            let (stop_tx, stop_rx) = oneshot::channel::<()>();
            let cpu = (!cpus.is_empty()).then(|| cpus[i % cpus.len()]);
            std::thread::Builder::new()
                .name(format!("corral-serve-{i}"))
                .spawn(move || {
                    SHARD.with(|s| s.set(Some(i)));
                    if let Some(cpu) = cpu {
                        if let Err(e) = pin_to(cpu) {
                            let _ = ready_tx.send(Err(io::Error::other(format!(
                                "cannot pin serving thread {i} to CPU {cpu}: {e}"
                            ))));
                            return;
                        }
                    }
                    if batch {
                        // Not fatal: the policy is a matter of speed, and a thread that
                        // keeps the default serves as it always did.
                        if let Err(e) = to_batch() {
                            tracing::warn!(thread = i, error = %e, "cannot move a serving thread to SCHED_BATCH; it keeps its policy");
                        }
                    }
                    // I/O and timers only: no signal or process driver, whose park checks
                    // the process-wide orphan queue (a lock every serving thread would
                    // share) on every wake-up. Workers are spawned and reaped on the
                    // control runtime.
                    let runtime = match tokio::runtime::Builder::new_current_thread()
                        .enable_io()
                        .enable_time()
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

/// The CPUs this thread may run on (the whole process's set at start: corral's own affinity,
/// a cpuset or `taskset`), in order.
fn allowed_cpus() -> io::Result<Vec<usize>> {
    let set = sched_getaffinity(Pid::from_raw(0)).map_err(io::Error::from)?;
    let cpus: Vec<usize> = (0..CpuSet::count())
        .filter(|&c| set.is_set(c).unwrap_or(false))
        .collect();
    if cpus.is_empty() {
        return Err(io::Error::other("the CPU affinity mask names no CPU"));
    }
    Ok(cpus)
}

/// Lets the calling thread run on `cpu` only.
fn pin_to(cpu: usize) -> nix::Result<()> {
    let mut one = CpuSet::new();
    one.set(cpu)?;
    sched_setaffinity(Pid::from_raw(0), &one)
}

/// Moves the calling thread from Linux's default policy (`SCHED_OTHER`) to `SCHED_BATCH`,
/// which no privilege is needed for and which keeps the thread's nice value. A thread under
/// any other policy (corral started under `chrt`) keeps it: that was its operator's choice.
fn to_batch() -> io::Result<()> {
    // SAFETY: a system call about the calling thread (pid 0) that takes no pointer.
    let policy = unsafe { libc::sched_getscheduler(0) };
    if policy < 0 {
        return Err(io::Error::last_os_error());
    }
    if policy != libc::SCHED_OTHER {
        return Ok(());
    }
    let param = libc::sched_param { sched_priority: 0 };
    // SAFETY: the calling thread (pid 0) and a pointer to a `sched_param` on this stack,
    // which the kernel only reads during the call.
    if unsafe { libc::sched_setscheduler(0, libc::SCHED_BATCH, &param) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
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
        let shards = Shards::start(2, false, false).unwrap();
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

    /// The CPUs serving thread `h` may run on, as it sees them.
    fn affinity_on(h: &Handle) -> Vec<usize> {
        let (tx, rx) = std::sync::mpsc::channel();
        h.spawn(async move {
            let _ = tx.send(allowed_cpus().unwrap());
        });
        rx.recv().unwrap()
    }

    #[test]
    fn pinned_threads_each_run_on_one_cpu_in_turn_and_unpinned_ones_on_all() {
        let all = allowed_cpus().unwrap();
        let n = all.len() + 1;
        let pinned = Shards::start(n, true, false).unwrap();
        for (i, h) in pinned.handles().iter().enumerate() {
            assert_eq!(affinity_on(h), vec![all[i % all.len()]], "thread {i}");
        }
        let free = Shards::start(2, false, false).unwrap();
        for h in free.handles() {
            assert_eq!(affinity_on(h), all);
        }
        // The thread that started them keeps its own.
        assert_eq!(allowed_cpus().unwrap(), all);
    }

    /// The calling thread's scheduling policy.
    fn policy() -> i32 {
        // SAFETY: as in `to_batch`.
        unsafe { libc::sched_getscheduler(0) }
    }

    fn policy_on(h: &Handle) -> i32 {
        let (tx, rx) = std::sync::mpsc::channel();
        h.spawn(async move {
            let _ = tx.send(policy());
        });
        rx.recv().unwrap()
    }

    #[test]
    fn batch_threads_run_under_sched_batch_and_the_starting_thread_keeps_its_policy() {
        let before = policy();
        assert_eq!(
            before,
            libc::SCHED_OTHER,
            "the test runs under the default policy"
        );
        let batch = Shards::start(2, false, true).unwrap();
        for (i, h) in batch.handles().iter().enumerate() {
            assert_eq!(policy_on(h), libc::SCHED_BATCH, "thread {i}");
        }
        let normal = Shards::start(1, false, false).unwrap();
        assert_eq!(policy_on(&normal.handles()[0]), libc::SCHED_OTHER);
        assert_eq!(policy(), before);
    }

    #[test]
    fn a_thread_under_another_policy_keeps_it() {
        std::thread::spawn(|| {
            let param = libc::sched_param { sched_priority: 0 };
            // SAFETY: as in `to_batch`; SCHED_IDLE needs no privilege either.
            let set = unsafe { libc::sched_setscheduler(0, libc::SCHED_IDLE, &param) };
            assert_eq!(set, 0);
            to_batch().unwrap();
            assert_eq!(policy(), libc::SCHED_IDLE);
        })
        .join()
        .unwrap();
    }
}
