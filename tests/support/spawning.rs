//! What the tests of spawning with `corral::process` share (`tests/process_spawn.rs`,
//! `tests/process_spawn_life.rs`): a worker's spec, its start, and the [`Group`] guard that
//! SIGKILLs its process group when the test ends, panics included.

use std::time::Duration;

use corral::config::BackendProtocol;
use corral::process::{
    signal_group, spawn_worker, Handoff, SpawnedWorker, StopSignal, WorkerSocket, WorkerSpawn,
};

/// The Python that the placeholder workers run.
pub const PYTHON: &str = "/usr/bin/python3";
/// How long a worker may take to start, or a test to see it change.
pub const START: Duration = Duration::from_secs(20);

/// SIGKILLs a worker's process group when dropped.
pub struct Group(pub u32);

impl Drop for Group {
    fn drop(&mut self) {
        let _ = signal_group(self.0, StopSignal::Kill);
    }
}

/// A worker of `pool` running `argv`, its socket handed over on fd 0.
pub fn spec(
    pool: &str,
    argv: &[&str],
    protocol: BackendProtocol,
    socket: WorkerSocket,
) -> WorkerSpawn {
    WorkerSpawn::new(
        pool,
        argv.iter().map(|s| s.to_string()).collect(),
        protocol,
        socket,
        Handoff::Fd0,
    )
}

/// Spawns `spec`, its process group held by the [`Group`] returned beside it.
pub fn start(spec: &WorkerSpawn) -> (SpawnedWorker, Group) {
    let worker = spawn_worker(spec).unwrap();
    let group = Group(worker.pid);
    (worker, group)
}
