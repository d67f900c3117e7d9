//! Compiles the SAPI module (`src/sapi.c`) and the `$_SERVER` registration it calls back
//! through Rust (`src/variables.c`) against PHP's headers and links the worker with libphp
//! (PHP's embed SAPI). Both come from Debian's `php8.2-dev` and `libphp8.2-embed`
//! (scripts/setup-peers.sh installs them); `PHP_CONFIG` names another `php-config`.
//!
//! The compiler is run directly (`cc`, then `ar`) rather than through a build-dependency:
//! one C file with fixed flags needs nothing more.

use std::env;
use std::path::PathBuf;
use std::process::Command;

fn main() {
    println!("cargo:rerun-if-changed=src/sapi.c");
    println!("cargo:rerun-if-changed=src/variables.c");
    println!("cargo:rerun-if-env-changed=PHP_CONFIG");
    let php_config = env::var("PHP_CONFIG").unwrap_or_else(|_| "php-config8.2".to_owned());
    let output = |args: &[&str]| -> String {
        let out = Command::new(&php_config).args(args).output();
        match out {
            Ok(o) if o.status.success() => String::from_utf8_lossy(&o.stdout).trim().to_owned(),
            _ => {
                eprintln!(
                    "corral-php-worker needs PHP's headers and embed library: `{php_config} {}` \
                     failed. Install them with `apt-get install php8.2-dev libphp8.2-embed` \
                     (scripts/setup-peers.sh does), or set PHP_CONFIG to another php-config.",
                    args.join(" ")
                );
                std::process::exit(1);
            }
        }
    };
    let includes = output(&["--includes"]);
    let prefix = output(&["--prefix"]);
    let version = output(&["--version"]);
    let major_minor: String = version.split('.').take(2).collect::<Vec<_>>().join(".");
    let out = PathBuf::from(env::var("OUT_DIR").unwrap_or_else(|_| ".".to_owned()));
    let cc = env::var("CC").unwrap_or_else(|_| "cc".to_owned());
    let mut objects = Vec::new();
    for name in ["sapi", "variables"] {
        let object = out.join(format!("{name}.o"));
        let source = format!("src/{name}.c");
        let mut compile = Command::new(&cc);
        compile
            .args(["-c", &source, "-o"])
            .arg(&object)
            .args(["-O2", "-fPIC", "-Wall", "-Werror", "-Wno-unused-parameter"])
            .args(includes.split_whitespace());
        run(&mut compile, &format!("compile {source}"));
        objects.push(object);
    }
    let archive = out.join("libcorral_sapi.a");
    let _ = std::fs::remove_file(&archive);
    run(
        Command::new("ar").arg("crs").arg(&archive).args(&objects),
        "archive the C sources",
    );
    println!("cargo:rustc-link-search=native={}", out.display());
    println!("cargo:rustc-link-lib=static=corral_sapi");
    // Debian installs libphp8.2.so in /usr/lib (the prefix's lib directory).
    println!("cargo:rustc-link-search=native={prefix}/lib");
    println!("cargo:rustc-link-lib=dylib=php{major_minor}");
}

fn run(cmd: &mut Command, what: &str) {
    match cmd.status() {
        Ok(s) if s.success() => {}
        Ok(s) => {
            eprintln!("corral-php-worker: cannot {what}: {cmd:?} exited with {s}");
            std::process::exit(1);
        }
        Err(e) => {
            eprintln!("corral-php-worker: cannot {what}: {cmd:?}: {e}");
            std::process::exit(1);
        }
    }
}
