//! The `corral` command: a thin shell that hands the real arguments and streams to the
//! library and exits with the code it returns.

use std::process::ExitCode;

fn main() -> ExitCode {
    let code = corral::cli::main(
        std::env::args_os(),
        &mut std::io::stdout().lock(),
        &mut std::io::stderr().lock(),
    );
    ExitCode::from(code)
}
