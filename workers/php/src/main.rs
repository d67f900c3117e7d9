//! corral's native PHP worker: PHP's embed SAPI (libphp) behind LSAPI. corral spawns it with
//! its listening socket on fd 0 (a Unix or TCP socket) and keeps a connection open to it;
//! the worker accepts one connection at a time and serves its requests one after another,
//! each as a full PHP request (startup, the script SCRIPT_FILENAME names, shutdown), as
//! php-cgi would, with OPcache on. The gateway's script guard (a real `.php` file under the
//! context's root) runs before any request reaches it.
//!
//! ```text
//! corral-php-worker             serve the socket on fd 0
//! corral-php-worker --check     start PHP and exit 0 (what `corral check` runs)
//! corral-php-worker --worker SCRIPT
//!                               worker mode: SCRIPT boots once and serves every
//!                               request through corral_handle_request (`worker.rs`)
//! corral-php-worker [--worker SCRIPT] --preload
//!                               the fork template: fd 0 is corral's control socket;
//!                               PHP starts once and every worker is forked from this
//!                               process (`preload.rs`), then serves as above
//! ```
//!
//! SIGTERM and SIGINT finish the request in progress and exit 0. Bad LSAPI input closes that
//! connection with a log line on stderr (which corral logs with the worker's pool and pid);
//! the worker goes on. A request PHP cannot even start is answered 500 and ends the worker,
//! which corral replaces.

mod body;
mod conn;
mod exchange;
mod keys;
mod php;
mod preload;
mod request;
mod script;
mod worker;

use std::io::Write;
use std::rc::Rc;

use corral_protocols::lsapi::ResponseEncoder;

use conn::{Conn, End};
use exchange::{Exchange, Sink};

pub use corral_worker_control::stop::{reset_stop, stopping};

/// The listening socket corral hands over.
pub const LISTENER: libc::c_int = 0;

/// php.ini settings the worker always sets on top of the embed SAPI's php.ini. OPcache
/// caches compiled scripts across requests (`opcache.enable` is php.ini's; the embed
/// php.ini leaves it at its default, on); `cgi.fix_pathinfo` is php-cgi's and has no effect
/// here, where SCRIPT_FILENAME is the file to run, checked by corral.
const INI: &str = "opcache.enable=1\n";

/// One line on stderr, which corral logs with this worker's pool and pid.
pub fn log(message: &str) {
    let message = message.trim_end_matches('\n');
    let _ = writeln!(std::io::stderr(), "corral-php-worker: {message}");
}

/// Closes the listening socket (fd 0 becomes /dev/null): corral's next connection to this
/// worker is refused at once, and corral sends that request to another worker.
pub fn close_listener() {
    // SAFETY: open(2) of a constant path and dup2(2) onto fd 0, which this process owns; the
    // listener's only reference is fd 0 (corral keeps no copy), so the socket closes.
    unsafe {
        let null = libc::open(c"/dev/null".as_ptr(), libc::O_RDONLY | libc::O_CLOEXEC);
        if null < 0 {
            libc::close(LISTENER);
            return;
        }
        libc::dup2(null, LISTENER);
        libc::close(null);
    }
}

fn install_signals() {
    // SIGTERM and SIGINT set the stop flag and wake every wait between requests or for a
    // connection (corral_worker_control::stop).
    if let Err(e) = corral_worker_control::stop::catch_stop_signals() {
        log(&format!("cannot catch stop signals: {e}"));
        std::process::exit(1);
    }
    // SAFETY: prctl(2) with constant arguments.
    unsafe {
        // A worker must not outlive the corral that supervises it.
        libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0, 0, 0);
    }
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (check, script, preloading) = match args
        .iter()
        .map(String::as_str)
        .collect::<Vec<_>>()
        .as_slice()
    {
        [] => (false, None, false),
        ["--check"] => (true, None, false),
        ["--preload"] => (false, None, true),
        ["--worker", script] => (false, Some(script.to_string()), false),
        ["--worker", script, "--preload"] => (false, Some(script.to_string()), true),
        _ => {
            log(&format!(
                "bad arguments {args:?}; usage: corral-php-worker \
                 [--check | [--worker SCRIPT] [--preload]]"
            ));
            std::process::exit(64);
        }
    };
    install_signals();
    if let Err(e) = php::startup(INI) {
        log(&e);
        std::process::exit(1);
    }
    if check {
        php::shutdown();
        return;
    }
    if preloading {
        match preload::run(LISTENER) {
            preload::Role::Template(code) => {
                php::shutdown();
                std::process::exit(code);
            }
            preload::Role::Worker => {}
        }
    }
    // accept() waits on the stop pipe beside the listener, then takes the connection
    // without blocking.
    if let Err(e) = corral_worker_control::conn::listen_nonblocking(LISTENER) {
        log(&format!("fd 0 is not a listening socket: {e}"));
        php::shutdown();
        std::process::exit(1);
    }
    let code = match script {
        Some(script) => worker::serve(&script),
        None => serve(),
    };
    php::shutdown();
    std::process::exit(code);
}

/// Accepts connections on fd 0 until a stop signal; the exit code.
fn serve() -> i32 {
    while !stopping() {
        let stream = match corral_worker_control::conn::accept(LISTENER) {
            Ok(Some(stream)) => stream,
            // None yet, a stop, or gone before it was taken: the loop looks at the flag.
            Ok(None) => continue,
            Err(e) => {
                log(&format!("accept on fd 0 failed: {e}"));
                return 1;
            }
        };
        match serve_connection(Conn::new(stream)) {
            Ok(()) => {}
            Err(code) => return code,
        }
    }
    0
}

/// Serves one connection's requests; `Err(code)` when the worker must end.
fn serve_connection(mut conn: Conn) -> Result<(), i32> {
    loop {
        let (begin, body) = match conn.next_request(LISTENER) {
            Ok(r) => r,
            Err(End::Closed) => return Ok(()),
            Err(End::Stopping) => return Err(0),
            Err(End::Failed(why)) => {
                log(&format!("{why}; connection closed"));
                return Ok(());
            }
        };
        let encoder = ResponseEncoder::new(begin.order(), corral_protocols::lsapi::FlagRule::HOST);
        let known = request::Known::of(&begin);
        let script = known.script(&begin);
        let probe = known.is_probe();
        let missing = !probe && !script::exists(script);
        let info = request::info(&begin, &known, script);
        let sink = Sink::Conn(Rc::clone(&conn.stream));
        let vars = request::Server::request(begin);
        let exchange = Exchange::new(sink, encoder, vars, body, What::Request);
        let keep = if probe {
            // corral asking whether PHP is up (it is: this loop runs only once it started),
            // before the worker gets traffic. No script runs.
            exchange.answer(204, b"", stopping())
        } else if missing {
            // php-cgi's answer; corral's script guard normally answers before this.
            exchange.answer(404, b"No input file specified.\n", stopping())
        } else {
            let mut exchange = exchange;
            match php::run(&mut exchange, &info) {
                Ok(()) if stopping() => {
                    exchange.finish_closing();
                    return Err(0);
                }
                Ok(()) => exchange.finish(),
                Err(()) => {
                    log("PHP could not start a request; answering 500 and exiting");
                    exchange.answer(500, b"Internal Server Error\n", true);
                    return Err(1);
                }
            }
        };
        if !keep {
            return Ok(());
        }
        if stopping() {
            return Err(0);
        }
    }
}

/// What an exchange is, for its log lines: "GET /x.php", formatted only when a line is
/// written (a `String` built for every request cost three allocations: callgrind).
pub enum What {
    /// A request: its method and URI are read from the request itself when a line is written.
    Request,
    /// Anything else, named.
    Named(String),
}

/// A [`What`] with the variables of its request, to format.
pub struct Described<'a>(pub &'a What, pub &'a request::Server);

impl std::fmt::Display for Described<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match (self.0, self.1) {
            (What::Named(name), _) => f.write_str(name),
            (What::Request, request::Server::Request(Some(view))) => {
                let known = request::Known::of(view);
                let method = known.request_method.or(view.request_method());
                fn text(b: Option<&[u8]>) -> std::borrow::Cow<'_, str> {
                    String::from_utf8_lossy(b.unwrap_or_default())
                }
                write!(f, "{} {}", text(method), text(known.request_uri))
            }
            (What::Request, _) => f.write_str("request"),
        }
    }
}
