//! corral's native WSGI worker: CPython embedded behind LSAPI, in place of the pure-Python
//! launcher (`src/launchers/wsgi.py`) for a pool with `app = "wsgi:module:callable"` and
//! `worker = "native"`. corral spawns it with its listening socket on fd 0 and keeps a
//! connection open to it; the worker accepts one connection at a time and serves its
//! requests one after another: the LSAPI decoding, the environ's strings and the response
//! packets are Rust and C, so the interpreter runs only the app.
//!
//!     corral-wsgi-worker PYTHON MODULE:CALLABLE   serve the socket on fd 0
//!     corral-wsgi-worker PYTHON MODULE:CALLABLE --preload
//!                                                 fd 0 is a control socket: load the app
//!                                                 once, fork workers on request (preload.rs)
//!     corral-wsgi-worker PYTHON --check           start Python as PYTHON would and exit 0
//!
//! PYTHON is the pool's interpreter (`python`, `virtualenv`'s bin/python, or python3): the
//! embedded interpreter starts as that program would, so a virtualenv's site-packages are
//! found from its pyvenv.cfg. It must be the Python the worker was built with (3.11 on
//! Debian 12); a virtualenv of another version is refused at start.
//!
//! SIGTERM and SIGINT finish the request in progress and exit 0. SIGUSR2 writes every
//! thread's Python stack to stderr, then `corral-stacks: end of pid PID` (what corral asks
//! before it kills a worker past request_timeout). Bad LSAPI input closes that connection
//! with a log line on stderr (which corral logs with the worker's pool and pid); the worker
//! goes on. Nothing the app does or returns ends the worker: an error before any of the
//! answer was written is a 500, after it the connection is closed.

mod conn;
mod environ;
mod preload;
mod python;
mod response;

use std::io::Write;

use conn::{Conn, End};

pub use corral_worker_control::stop::{reset_stop, stopping};

/// The glue run once when the interpreter starts (loading the app, wsgi.input's class).
const GLUE: &str = include_str!("glue.py");

/// The line that ends a stack dump; faulthandler writes the stacks, then chains here.
extern "C" fn on_stacks(_: libc::c_int) {
    let mut line = *b"corral-stacks: end of pid           ";
    // SAFETY: getpid is async-signal-safe.
    let mut pid = unsafe { libc::getpid() }.unsigned_abs();
    let mut digits = [0u8; 10];
    let mut n = 0;
    while n < digits.len() {
        if let Some(d) = digits.get_mut(n) {
            *d = b'0' + (pid % 10) as u8;
        }
        n += 1;
        pid /= 10;
        if pid == 0 {
            break;
        }
    }
    let start = 26;
    let mut at = start;
    for i in (0..n).rev() {
        if let (Some(slot), Some(d)) = (line.get_mut(at), digits.get(i)) {
            *slot = *d;
        }
        at += 1;
    }
    if let Some(slot) = line.get_mut(at) {
        *slot = b'\n';
    }
    // SAFETY: write(2) is async-signal-safe; `line` outlives the call and `at + 1` is
    // within it (26 + 10 + 1 <= 36).
    unsafe {
        libc::write(2, line.as_ptr().cast(), (at + 1).min(line.len()));
    }
}

/// One line on stderr, which corral logs with this worker's pool and pid.
pub fn log(message: &str) {
    let message = message.trim_end_matches('\n');
    let _ = writeln!(std::io::stderr(), "corral-wsgi-worker: {message}");
}

fn install_signals() {
    // SIGTERM and SIGINT set the stop flag and wake every wait between requests or for a
    // connection (corral_worker_control::stop).
    if let Err(e) = corral_worker_control::stop::catch_stop_signals() {
        log(&format!("cannot catch stop signals: {e}"));
        std::process::exit(1);
    }
    // SAFETY: `on_stacks` only writes with write(2), which is async-signal-safe; the
    // sigaction struct is zeroed and then filled. SIGUSR2's handler is installed before
    // Python starts, so faulthandler (set up by the glue) chains to it.
    unsafe {
        let mut stacks: libc::sigaction = std::mem::zeroed();
        stacks.sa_sigaction = on_stacks as extern "C" fn(libc::c_int) as usize;
        stacks.sa_flags = libc::SA_RESTART;
        libc::sigemptyset(&mut stacks.sa_mask);
        libc::sigaction(libc::SIGUSR2, &stacks, std::ptr::null_mut());
        // A worker must not outlive the corral that supervises it.
        libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0, 0, 0);
        // No core dumps, and no ptrace or /proc/PID/mem by other processes of this user
        // (another pool's compromised worker): as the pure-Python launcher does.
        libc::prctl(libc::PR_SET_DUMPABLE, 0, 0, 0, 0);
    }
}

/// Moves the listening (or, preloading, control) socket off fd 0 and puts /dev/null there,
/// so an app that reads stdin cannot take bytes from corral's socket. The socket's new fd.
fn take_listener() -> Result<libc::c_int, String> {
    // SAFETY: fcntl and dup2 on descriptors this process owns; the path is a C string.
    unsafe {
        let fd = libc::fcntl(0, libc::F_DUPFD_CLOEXEC, 3);
        if fd < 0 {
            return Err(format!(
                "fd 0 is not corral's listening socket: {}",
                std::io::Error::last_os_error()
            ));
        }
        let null = libc::open(c"/dev/null".as_ptr(), libc::O_RDONLY | libc::O_CLOEXEC);
        if null >= 0 {
            libc::dup2(null, 0);
            libc::close(null);
        }
        Ok(fd)
    }
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let usage = || {
        log(&format!(
            "bad arguments {args:?}; usage: corral-wsgi-worker PYTHON \
             (MODULE:CALLABLE [--preload] | --check)"
        ));
        std::process::exit(64);
    };
    let (python, spec, preloading) = match args.as_slice() {
        [python, check] if check == "--check" => (python.clone(), None, false),
        [python, spec] if spec.contains(':') => (python.clone(), Some(spec.clone()), false),
        [python, spec, flag] if spec.contains(':') && flag == "--preload" => {
            (python.clone(), Some(spec.clone()), true)
        }
        _ => usage(),
    };
    install_signals();
    let listener = match &spec {
        Some(_) => match take_listener() {
            Ok(fd) => fd,
            Err(e) => {
                log(&e);
                std::process::exit(1);
            }
        },
        None => -1,
    };
    if let Err(()) = python::start(&python, GLUE, spec.as_deref()) {
        std::process::exit(1);
    }
    if spec.is_none() {
        return;
    }
    let code = if preloading {
        preload::run(listener)
    } else {
        serve(listener)
    };
    python::finalize();
    std::process::exit(code);
}

/// Accepts connections on `listener` until a stop signal; the exit code.
pub fn serve(listener: libc::c_int) -> i32 {
    let Some(mut keys) = environ::Keys::new() else {
        log("Python cannot make the environ's keys");
        return 1;
    };
    // accept() waits on the stop pipe beside the listener, then takes the connection
    // without blocking.
    if let Err(e) = corral_worker_control::conn::listen_nonblocking(listener) {
        log(&format!("corral's socket is not a listening socket: {e}"));
        return 1;
    }
    let mut reused = conn::Buffers::new();
    while !stopping() {
        let stream = match corral_worker_control::conn::accept(listener) {
            Ok(Some(stream)) => stream,
            // None yet, a stop, or gone before it was taken: the loop looks at the flag.
            Ok(None) => continue,
            Err(e) => {
                log(&format!("accept on corral's socket failed: {e}"));
                return 1;
            }
        };
        let (mut conn, mut view) = Conn::new(stream, listener, reused);
        let end = response::serve_connection(&mut conn, &mut keys, &mut view);
        reused = conn.into_buffers(view);
        match end {
            End::Closed => {}
            End::Stopping => return 0,
            End::Failed(why) => log(&format!("{why}; connection closed")),
        }
    }
    0
}
