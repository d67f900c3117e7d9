//! The front-server matrix (issue 11): each front-server snippet in `conf/` run as written,
//! in front of corral running `conf/php.toml` with its real php-cgi pool.
//!
//! **Placeholders.** A snippet is read from `conf/` and only the values its "To adapt"
//! comment names are replaced: corral's addresses as `conf/php.toml` has them
//! ([`FASTCGI_SOCKET`], [`SCGI_SOCKET`], [`HTTP_ADDR`]), the document root ([`ROOT`]) and
//! the front server's own port or site name. [`snippet`] fails when a placeholder is not in
//! the file, so a snippet cannot drift away from the test that runs it.
//!
//! **One start per test binary.** A test file builds its [`Matrix`] (corral, the front
//! servers, one [`Cell`] per snippet) once, through [`kept`], and `front_matrix!`
//! (`matrix_checks.rs`, with what each test checks) writes the same six tests for every
//! cell: a GET with a query, a 10 MiB POST checked by md5, a 404 from PHP and for a missing
//! script, a redirect, cookies both ways, and 100 requests from 4 threads with no error.
//! The processes are shared by the tests, so no test's guard can stop
//! them: each is started through `setpriv --pdeathsig TERM` by a thread that lives as long as
//! the test binary, so each gets SIGTERM (a clean stop) when the binary ends, however it ends.
//! A watchdog started the same way removes the temp dir then.

use std::any::Any;
use std::io::Write;
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{mpsc, OnceLock};
use std::thread;
use std::time::Duration;

use tokio::time::Instant;

use super::front::free_port;
use super::peers::{md5_hex, shared_dir, write_file};
use super::server::Corral;

/// Placeholder: corral's `fastcgi` listener, as conf/php.toml and the snippets name it.
pub const FASTCGI_SOCKET: &str = "/run/corral/php.sock";
/// Placeholder: corral's `scgi` listener.
pub const SCGI_SOCKET: &str = "/run/corral/scgi.sock";
/// Placeholder: corral's `http` listener.
pub const HTTP_ADDR: &str = "127.0.0.1:8080";
/// Placeholder: the site's document root.
pub const ROOT: &str = "/var/www/html";

/// The wrapper every shared process is started through (see the module documentation).
pub const PDEATHSIG: [&str; 4] = ["setpriv", "--pdeathsig", "TERM", "--"];

/// Size of the POST.
pub const TEN_MIB: usize = 10 * 1024 * 1024;

/// How long a front server may take to listen.
const START: Duration = Duration::from_secs(20);

/// The site every cell serves.
const SCRIPTS: &[(&str, &str)] = &[
    (
        "query.php",
        "<?php echo 'q=', $_GET['q'] ?? '', ' qs=', $_SERVER['QUERY_STRING'] ?? '', \
         ' method=', $_SERVER['REQUEST_METHOD'];",
    ),
    (
        "upload.php",
        "<?php $b = file_get_contents('php://input'); echo md5($b), ' ', strlen($b);",
    ),
    (
        "gone.php",
        "<?php http_response_code(404); echo 'php says 404';",
    ),
    // As apps redirect: a Location header and no body (PHP adds Status: 302).
    (
        "redirect.php",
        "<?php header('Location: /query.php?q=redirected'); exit;",
    ),
    (
        "cookies.php",
        "<?php setcookie('first', 'one'); setcookie('second', 'two', ['httponly' => true]); \
         echo 'flavour=', $_COOKIE['flavour'] ?? 'none', ' size=', $_COOKIE['size'] ?? 'none';",
    ),
];

/// Removes the temp dir (`$0`) when the test binary ends; the daemons get their SIGTERM at
/// the same moment and remove their own sockets and pid files, for which a second is plenty
/// (removing the dir under a slower one harms nothing).
const WATCHDOG: &str = r#"trap 'kill "$s" 2>/dev/null; sleep 1; rm -rf -- "$0"; exit 0' TERM
while :; do sleep 3600 & s=$!; wait "$s"; done"#;

/// A file of the repository.
pub fn repo_file(path: &str) -> String {
    let full = Path::new(env!("CARGO_MANIFEST_DIR")).join(path);
    std::fs::read_to_string(&full).unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// `conf/...` file `path` with each placeholder replaced by its value; panics when the
/// file does not contain one of them.
pub fn snippet(path: &str, subs: &[(&str, String)]) -> String {
    let mut text = repo_file(path);
    for (placeholder, value) in subs {
        assert!(
            text.contains(placeholder),
            "{path} no longer contains the placeholder {placeholder:?} its test replaces"
        );
        text = text.replace(placeholder, value);
    }
    text
}

/// `program` started through [`PDEATHSIG`].
pub fn guarded(program: &str) -> Command {
    let mut cmd = Command::new(PDEATHSIG[0]);
    cmd.args(&PDEATHSIG[1..]).arg(program);
    cmd
}

/// corral on conf/php.toml and its site, in a temp dir of their own.
pub struct Site {
    dir: tempfile::TempDir,
    /// The document root, with the [`SCRIPTS`].
    pub root: PathBuf,
    /// corral.
    pub corral: Corral,
    /// The 10 MiB body every cell POSTs, and its md5.
    pub(super) upload: PathBuf,
    pub(super) upload_md5: String,
    _watchdog: Child,
}

impl Site {
    /// Starts corral on conf/php.toml, with its runtime dir, root and ports moved into a
    /// new temp dir.
    pub fn start() -> Site {
        let dir = shared_dir();
        let watchdog = guarded("sh")
            .arg("-c")
            .arg(WATCHDOG)
            .arg(dir.path())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start the temp dir watchdog");
        let root = dir.path().join("www");
        std::fs::create_dir(&root).unwrap();
        std::fs::set_permissions(&root, std::os::unix::fs::PermissionsExt::from_mode(0o755))
            .unwrap();
        for (name, text) in SCRIPTS {
            write_file(&root, name, text);
        }
        let config = snippet(
            "conf/php.toml",
            &[
                ("/run/corral", dir.path().join("run").display().to_string()),
                (ROOT, root.display().to_string()),
                (HTTP_ADDR, "127.0.0.1:0".to_owned()),
                ("127.0.0.1:9180", "127.0.0.1:0".to_owned()),
            ],
        );
        let mut file = tempfile::Builder::new()
            .prefix("corral-")
            .suffix(".toml")
            .tempfile_in(dir.path())
            .unwrap();
        file.write_all(config.as_bytes()).unwrap();
        let mut cmd = guarded(super::CORRAL);
        cmd.args(["run", "-c"]).arg(file.path());
        // fastcgi, scgi and http.
        let corral = Corral::start_command(cmd, file, 3);

        // Not a repeating pattern, so a lost, doubled or moved chunk changes the md5.
        let mut x: u32 = 0x2545_f491;
        let body: Vec<u8> = (0..TEN_MIB)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 17;
                x ^= x << 5;
                x as u8
            })
            .collect();
        let upload = dir.path().join("upload.bin");
        std::fs::write(&upload, &body).unwrap();
        let upload_md5 = md5_hex(dir.path(), &body);
        Site {
            dir,
            root,
            corral,
            upload,
            upload_md5,
            _watchdog: watchdog,
        }
    }

    /// The temp dir.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// A new directory in the temp dir, writable by the unprivileged users front servers
    /// run as.
    pub fn subdir(&self, name: &str) -> PathBuf {
        let path = self.dir().join(name);
        std::fs::create_dir(&path).unwrap();
        std::fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(0o1777))
            .unwrap();
        path
    }

    /// What [`ROOT`] becomes.
    pub fn root_value(&self) -> String {
        self.root.display().to_string()
    }

    /// What [`FASTCGI_SOCKET`] becomes.
    pub fn fastcgi_socket(&self) -> String {
        self.dir().join("run/php.sock").display().to_string()
    }

    /// What [`SCGI_SOCKET`] becomes.
    pub fn scgi_socket(&self) -> String {
        self.dir().join("run/scgi.sock").display().to_string()
    }

    /// What [`HTTP_ADDR`] becomes.
    pub fn http_addr(&self) -> SocketAddr {
        self.corral.addr_of("Http")
    }
}

/// A front server (or anything else) started through [`PDEATHSIG`] with its output in a
/// log file.
pub struct Daemon {
    child: Child,
    /// Where its standard output and error go.
    pub output: PathBuf,
}

impl Daemon {
    /// Starts the command `make(ports)` gives, for `count` free ports, and waits until every
    /// port accepts; when the daemon exits first because a port was taken meanwhile
    /// ("already in use" in its output or in one of `logs`), tries again with new ports.
    pub fn start(
        name: &str,
        dir: &Path,
        count: usize,
        logs: &[PathBuf],
        mut make: impl FnMut(&[u16]) -> Command,
    ) -> (Daemon, Vec<u16>) {
        let output = dir.join(format!("{name}.out"));
        for _ in 0..5 {
            let ports: Vec<u16> = (0..count).map(|_| free_port()).collect();
            for log in logs {
                let _ = std::fs::remove_file(log);
            }
            let out = std::fs::File::create(&output).unwrap();
            let mut cmd = make(&ports);
            let child = cmd
                .stdin(Stdio::null())
                .stdout(out.try_clone().unwrap())
                .stderr(out)
                .spawn()
                .unwrap_or_else(|e| panic!("cannot start {name} ({cmd:?}): {e}"));
            let mut daemon = Daemon {
                child,
                output: output.clone(),
            };
            let deadline = Instant::now() + START;
            loop {
                if ports
                    .iter()
                    .all(|p| TcpStream::connect(("127.0.0.1", *p)).is_ok())
                {
                    return (daemon, ports);
                }
                if let Ok(Some(status)) = daemon.child.try_wait() {
                    let text = read_logs(&[std::slice::from_ref(&output), logs].concat());
                    assert!(
                        text.to_ascii_lowercase().contains("already in use"),
                        "{name} exited ({status}) before listening:\n{text}"
                    );
                    break;
                }
                assert!(
                    Instant::now() < deadline,
                    "{name} did not listen on {ports:?} within {START:?}:\n{}",
                    read_logs(&[std::slice::from_ref(&output), logs].concat())
                );
                thread::sleep(Duration::from_millis(10));
            }
        }
        panic!("{name} lost its ports to other processes five times");
    }
}

impl Drop for Daemon {
    /// Only when a build fails or a start is retried: SIGTERM (so Apache stops its
    /// children), SIGKILL if that takes over 5 s.
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let pid = nix::unistd::Pid::from_raw(self.child.id() as i32);
            let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
            let deadline = Instant::now() + Duration::from_secs(5);
            while let Ok(None) = self.child.try_wait() {
                if Instant::now() >= deadline {
                    let _ = self.child.kill();
                    break;
                }
                thread::sleep(Duration::from_millis(10));
            }
        }
        let _ = self.child.wait();
    }
}

fn read_logs(logs: &[PathBuf]) -> String {
    logs.iter()
        .map(|p| {
            let text = std::fs::read_to_string(p).unwrap_or_default();
            let lines: Vec<&str> = text.lines().collect();
            let tail = lines[lines.len().saturating_sub(40)..].join("\n");
            format!("--- {}\n{tail}\n", p.display())
        })
        .collect()
}

/// One front-server snippet, served on a port of its front server.
pub struct Cell {
    /// The test module's name.
    pub name: &'static str,
    /// Where the front server serves this snippet.
    pub addr: SocketAddr,
    /// What the front server's `Server` header starts with: proof that the answer came
    /// through it.
    pub server: &'static str,
    /// The front server's logs.
    pub logs: Vec<PathBuf>,
}

impl Cell {
    /// `http://127.0.0.1:PORT{path}`.
    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }
}

/// corral, the front servers of one test binary, and their cells.
pub struct Matrix {
    /// corral and its site.
    pub site: Site,
    cells: Vec<Cell>,
    guards: Vec<Box<dyn Any + Send + Sync>>,
}

impl Matrix {
    /// A matrix with no cell yet.
    pub fn new(site: Site) -> Matrix {
        Matrix {
            site,
            cells: Vec::new(),
            guards: Vec::new(),
        }
    }

    /// Keeps `guard` (a front server) as long as the matrix.
    pub fn keep(&mut self, guard: impl Any + Send + Sync) {
        self.guards.push(Box::new(guard));
    }

    /// Adds the cell `name`, served on 127.0.0.1:`port` by the front server whose `Server`
    /// header starts with `server`.
    pub fn cell(&mut self, name: &'static str, server: &'static str, port: u16, logs: &[PathBuf]) {
        self.cells.push(Cell {
            name,
            addr: SocketAddr::from(([127, 0, 0, 1], port)),
            server,
            logs: logs.to_vec(),
        });
    }

    /// `http://127.0.0.1:PORT{path}` of cell `name`.
    pub fn url(&self, name: &str, path: &str) -> String {
        self.get(name).url(path)
    }

    /// Cell `name`; panics when there is none.
    pub(super) fn get(&self, name: &str) -> &Cell {
        self.cells
            .iter()
            .find(|c| c.name == name)
            .unwrap_or_else(|| panic!("no cell {name}"))
    }

    /// What the front server and corral logged, for a failed assertion.
    pub(super) fn logs(&self, cell: &Cell) -> String {
        let log = self.site.corral.log();
        let lines: Vec<&str> = log.lines().collect();
        format!(
            "{}--- corral\n{}",
            read_logs(&cell.logs),
            lines[lines.len().saturating_sub(40)..].join("\n")
        )
    }
}

/// The matrix in `lock`, built by `build` on a thread that lives as long as the test binary
/// (the first caller waits for it; a failed build fails every test with its message).
pub fn kept(
    lock: &'static OnceLock<Result<Matrix, String>>,
    build: fn() -> Matrix,
) -> &'static Matrix {
    let built = lock.get_or_init(|| {
        let (tx, rx) = mpsc::channel();
        thread::Builder::new()
            .name("matrix-keeper".into())
            .spawn(move || {
                let result = std::panic::catch_unwind(build).map_err(|p| panic_text(&*p));
                let started = result.is_ok();
                let _ = tx.send(result);
                // The processes' parent-death signal fires when this thread ends.
                if started {
                    loop {
                        thread::park();
                    }
                }
            })
            .expect("spawn the matrix keeper");
        rx.recv()
            .unwrap_or_else(|_| Err("the matrix keeper died".into()))
    });
    match built {
        Ok(matrix) => matrix,
        Err(e) => panic!("the front-server matrix did not start: {e}"),
    }
}

fn panic_text(payload: &(dyn Any + Send)) -> String {
    payload
        .downcast_ref::<String>()
        .cloned()
        .or_else(|| payload.downcast_ref::<&str>().map(|s| (*s).to_owned()))
        .unwrap_or_else(|| "a panic without a message".to_owned())
}
