//! The `corral` command: a thin shell that hands the real arguments and streams to the
//! library and exits with the code it returns.

use std::process::ExitCode;

/// mimalloc, not glibc's malloc: a new connection's buffers (hyper's 8 KiB read and write
/// buffers among them) are beyond glibc's per-thread cache, and each took its slow path and
/// a consolidation when freed: 3k fewer instructions per request when each request comes on
/// a new connection (`CLOSE=1 benches/callgrind.sh http`, docs/decisions.md decision 42).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> ExitCode {
    // Unlocked handles: `run` serves for as long as corral lives, and the log writer (other
    // threads) needs stderr meanwhile; holding its lock here would deadlock the first log line.
    let code = corral::cli::main(
        std::env::args_os(),
        &mut std::io::stdout(),
        &mut std::io::stderr(),
    );
    ExitCode::from(code)
}
