//! The `corral` command: a thin shell that hands the real arguments and streams to the
//! library and exits with the code it returns.

use std::process::ExitCode;

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
