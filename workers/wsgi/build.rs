//! Compiles `src/python.c` against CPython's headers and links the worker with libpython,
//! both from Debian's `python3-dev` (scripts/setup-peers.sh installs it). `PYTHON_CONFIG`
//! names another `python3-config`; the default is Debian's by its absolute path, since the
//! `python3-config` first on PATH may be a pyenv's whose libpython is elsewhere.
//!
//! The compiler is run directly (`cc`, then `ar`), as workers/php does: one C file with fixed
//! flags needs nothing more.

use std::env;
use std::path::PathBuf;
use std::process::Command;

fn main() {
    println!("cargo:rerun-if-changed=src/python.c");
    println!("cargo:rerun-if-env-changed=PYTHON_CONFIG");
    let config = env::var("PYTHON_CONFIG").unwrap_or_else(|_| "/usr/bin/python3-config".into());
    let output = |args: &[&str]| -> String {
        match Command::new(&config).args(args).output() {
            Ok(o) if o.status.success() => String::from_utf8_lossy(&o.stdout).trim().to_owned(),
            _ => {
                eprintln!(
                    "corral-wsgi-worker needs CPython's headers and library: `{config} {}` \
                     failed. Install them with `apt-get install python3-dev` \
                     (scripts/setup-peers.sh does), or set PYTHON_CONFIG to another \
                     python3-config.",
                    args.join(" ")
                );
                std::process::exit(1);
            }
        }
    };
    let includes = output(&["--includes"]);
    let ldflags = output(&["--ldflags", "--embed"]);
    let out = PathBuf::from(env::var("OUT_DIR").unwrap_or_else(|_| ".".to_owned()));
    let object = out.join("python.o");
    let cc = env::var("CC").unwrap_or_else(|_| "cc".to_owned());
    let mut compile = Command::new(&cc);
    compile
        .args(["-c", "src/python.c", "-o"])
        .arg(&object)
        .args(["-O2", "-fPIC", "-Wall", "-Werror", "-Wno-unused-parameter"])
        .args(includes.split_whitespace());
    run(&mut compile, "compile src/python.c");
    let archive = out.join("libcorral_python.a");
    let _ = std::fs::remove_file(&archive);
    run(
        Command::new("ar").arg("crs").arg(&archive).arg(&object),
        "archive src/python.c",
    );
    println!("cargo:rustc-link-search=native={}", out.display());
    println!("cargo:rustc-link-lib=static=corral_python");
    for flag in ldflags.split_whitespace() {
        if let Some(dir) = flag.strip_prefix("-L") {
            println!("cargo:rustc-link-search=native={dir}");
        } else if let Some(lib) = flag.strip_prefix("-l") {
            println!("cargo:rustc-link-lib=dylib={lib}");
        }
    }
}

fn run(cmd: &mut Command, what: &str) {
    match cmd.status() {
        Ok(s) if s.success() => {}
        Ok(s) => {
            eprintln!("corral-wsgi-worker: cannot {what}: {cmd:?} exited with {s}");
            std::process::exit(1);
        }
        Err(e) => {
            eprintln!("corral-wsgi-worker: cannot {what}: {cmd:?}: {e}");
            std::process::exit(1);
        }
    }
}
