//! Shared by the preload and refork suites (`tests/preload.rs`, `tests/refork.rs`): a corral
//! with one http listener in front of pool `app`, which runs a suite's test app in Python or
//! Ruby (or Python on the native WSGI worker). Each suite brings its own apps; they append
//! their pid to `loads` in `LOADS_DIR` when they are loaded and answer with `name=value`
//! fields (`pid=`, `ppid=`, ...) separated by spaces.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use super::apps::{writable_dir, write_tree, Reaper};
use super::server::{http, Corral};

/// One test per launcher: `both!(case: wsgi_name, rack_name)` runs `case` with Python
/// and with Ruby. (Every suite compiles this module; most use neither the macro nor its
/// export.)
#[allow(unused_macros)]
macro_rules! both {
    ($case:ident: $wsgi:ident, $rack:ident) => {
        #[test]
        fn $wsgi() {
            $case($crate::support::preloading::Lang::Python);
        }

        #[test]
        fn $rack() {
            $case($crate::support::preloading::Lang::Ruby);
        }
    };
}
#[allow(unused_imports)]
pub(crate) use both;

/// Which launcher runs the test app.
#[derive(Clone, Copy, Debug)]
pub enum Lang {
    Python,
    Ruby,
    /// The WSGI app on `worker = "native"`.
    PythonNative,
}

/// A suite's test app in each language: the WSGI module (written as `app.py`) and the
/// rackup file (written as `config.ru`).
pub struct Apps {
    pub wsgi: &'static str,
    pub rack: &'static str,
}

/// A running corral and where its pool's app records its loads.
pub struct Pool {
    pub _reaper: Reaper,
    pub corral: Corral,
    pub addr: SocketAddr,
    pub loads: PathBuf,
}

/// The configuration of a corral with one http listener in front of pool `app`, which
/// runs in `dir` with `pool` (its keys, `app = ...` included) added.
pub fn config(dir: &Path, pool: &str) -> String {
    format!(
        r#"
[server]
runtime_dir = "{dir}/run"
grace = "2s"
kill_timeout = "2s"

[[listen]]
address = "127.0.0.1:0"
protocol = "http"

[pools.app]
cwd = "{dir}"
{pool}

[[contexts]]
prefix = "/"
pool = "app"
"#,
        dir = dir.display(),
    )
}

/// A corral (its directory named with `prefix`) serving `apps` in `lang` from a pool with
/// `keys` added.
pub fn start(prefix: &str, apps: &Apps, lang: Lang, keys: &str) -> Pool {
    let reaper = Reaper::start(prefix);
    let dir = reaper.dir.clone();
    let loads_dir = writable_dir(&dir.join("loads.d"));
    let app = match lang {
        Lang::Python => {
            write_tree(&dir, &[("app.py", apps.wsgi)]);
            "wsgi:app:application".to_owned()
        }
        Lang::PythonNative => {
            write_tree(&dir, &[("app.py", apps.wsgi)]);
            format!(
                "wsgi:app:application\"\nworker = \"native\"\nworker_path = \"{}",
                super::native::wsgi_worker().display()
            )
        }
        Lang::Ruby => {
            write_tree(&dir, &[("config.ru", apps.rack)]);
            "rack:config.ru".to_owned()
        }
    };
    let config = config(
        &dir,
        &format!(
            "app = \"{app}\"\nqueue_timeout = \"30s\"\nenv = {{ LOADS_DIR = \"{}\" }}\n{keys}",
            loads_dir.display()
        ),
    );
    let corral = reaper.corral(&config);
    let addr = corral.http_addr();
    Pool {
        _reaper: reaper,
        corral,
        addr,
        loads: loads_dir.join("loads"),
    }
}

/// The numeric fields `names` (each with its `=`) of the answer to a GET of `target`,
/// which must be a 200.
pub fn served_fields<const N: usize>(p: &Pool, target: &str, names: [&str; N]) -> [u32; N] {
    let r = http(p.addr, "GET", target, &[], b"");
    assert_eq!(r.status, 200, "{}\n{}", r.text(), p.corral.log());
    let text = r.text();
    names.map(|name| {
        text.split(' ')
            .find_map(|w| w.strip_prefix(name))
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("no {name} in {text:?}"))
    })
}

/// The pids that loaded the app, in order.
pub fn loads(p: &Pool) -> Vec<u32> {
    std::fs::read_to_string(&p.loads)
        .unwrap_or_default()
        .lines()
        .map(|l| l.parse().unwrap())
        .collect()
}

/// The parent pid of `pid`, from /proc.
pub fn parent_of(pid: u32) -> u32 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    corral::process::memory::parse_stat_ppid(&stat).unwrap()
}

/// SIGKILLs `pid`.
pub fn kill(pid: u32) {
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid as i32),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
}
