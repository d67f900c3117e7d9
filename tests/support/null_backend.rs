//! `corral null-backend` as a peer of the tests (`tests/bench_cli.rs`, `tests/null_backend.rs`,
//! the front-limit fixtures of `sync2.rs`): started on a Unix socket in a test's temp dir,
//! waited for until it accepts, killed with its process group by the [`Peer`] guard; and the
//! `unix:PATH` address clients name it by.

use std::path::Path;
use std::process::{Command, Stdio};

use super::peers::Peer;
use super::CORRAL;

/// `corral null-backend --protocol P --listen unix:DIR/P.sock`, ready to accept.
pub fn null_backend(dir: &Path, protocol: &str, extra: &[&str]) -> Peer {
    let socket = dir.join(format!("{protocol}.sock"));
    let mut cmd = Command::new(CORRAL);
    cmd.args(["null-backend", "--protocol", protocol, "--listen"])
        .arg(format!("unix:{}", socket.display()))
        .args(extra)
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    Peer::spawn(cmd, &socket).wait_connectable()
}

/// `peer`'s socket as `unix:PATH`, the form `corral bench --target` and a pool's `servers`
/// take.
pub fn target(peer: &Peer) -> String {
    format!("unix:{}", peer.socket.display())
}
