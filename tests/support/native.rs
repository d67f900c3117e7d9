//! The native workers (`workers/php`, package `corral-php-worker`; `workers/wsgi`, package
//! `corral-wsgi-worker`) beside the corral under test. cargo builds them beside `corral` for
//! a workspace test run; a test binary run alone (`cargo test --test php_native`) builds its
//! worker here first, once per binary, with the same cargo and profile, so a test always
//! runs the worker of this tree.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

/// The PHP worker's path, built when this test binary first asks.
pub fn worker() -> PathBuf {
    static BUILT: OnceLock<PathBuf> = OnceLock::new();
    BUILT.get_or_init(|| build("corral-php-worker")).clone()
}

/// The WSGI worker's path, built when this test binary first asks.
pub fn wsgi_worker() -> PathBuf {
    static BUILT: OnceLock<PathBuf> = OnceLock::new();
    BUILT.get_or_init(|| build("corral-wsgi-worker")).clone()
}

/// Builds `package` (whose binary has its name) beside corral; its path.
fn build(package: &str) -> PathBuf {
    let corral = Path::new(super::CORRAL);
    let dir = corral.parent().expect("corral's directory");
    let mut cmd = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()));
    cmd.args(["build", "--quiet", "-p", package])
        .current_dir(env!("CARGO_MANIFEST_DIR"));
    if dir.ends_with("release") {
        cmd.arg("--release");
    }
    let out = super::run(cmd, std::time::Duration::from_secs(600));
    assert_eq!(out.code, Some(0), "building {package}: {}", out.stderr);
    let worker = dir.join(package);
    assert!(worker.is_file(), "{} was not built", worker.display());
    worker
}

/// corral serving `dir`/www over HTTP with one native PHP pool, and the folder it runs in.
/// The suites add their own methods (`impl NativeSite` in a test file).
pub struct NativeSite {
    pub corral: super::server::Corral,
    pub dir: tempfile::TempDir,
}

impl NativeSite {
    /// Starts corral on `dir` (its scripts already written under `dir`/www): pool `name`
    /// with `worker = "native"`, `mode = "static"` and the TOML lines `pool` (where `ROOT`
    /// stands for the site's root), and one context on the root with the lines `context`.
    pub fn start(dir: tempfile::TempDir, name: &str, pool: &str, context: &str) -> NativeSite {
        let root = dir.path().join("www");
        let config = format!(
            r#"
[server]
runtime_dir = "{run}"
grace = "2s"
kill_timeout = "2s"
log_level = "debug"

[[listen]]
address = "127.0.0.1:0"
protocol = "http"

[pools.{name}]
worker = "native"
worker_path = "{worker}"
mode = "static"
{pool}

[[contexts]]
root = "{root}"
pool = "{name}"
{context}
"#,
            run = dir.path().join("run").display(),
            worker = worker().display(),
            root = root.display(),
            pool = pool.replace("ROOT", &root.display().to_string()),
        );
        let corral = super::server::Corral::start(&config, 1);
        NativeSite { corral, dir }
    }

    /// The site's document root.
    pub fn root(&self) -> PathBuf {
        self.dir.path().join("www")
    }

    pub fn get(&self, target: &str) -> super::server::HttpResponse {
        self.request("GET", target, &[], b"")
    }

    pub fn request(
        &self,
        method: &str,
        target: &str,
        headers: &[(&str, &str)],
        body: &[u8],
    ) -> super::server::HttpResponse {
        super::server::http(self.corral.http_addr(), method, target, headers, body)
    }

    /// The body of a GET that must answer 200.
    pub fn ok(&self, target: &str) -> String {
        let r = self.get(target);
        assert_eq!(
            r.status,
            200,
            "{target}: {}\n{}",
            r.text(),
            self.corral.log()
        );
        r.text()
    }

    /// The distinct bodies of `n` GETs of `target`, each of which must answer 200.
    pub fn answers(&self, target: &str, n: usize) -> BTreeSet<String> {
        let mut seen = BTreeSet::new();
        for i in 0..n {
            let r = self.get(target);
            assert_eq!(
                r.status,
                200,
                "request {i}: {}\n{}",
                r.text(),
                self.corral.log()
            );
            seen.insert(r.text());
        }
        seen
    }
}
