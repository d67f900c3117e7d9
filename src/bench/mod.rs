//! `corral bench` and `corral null-backend`: measuring what the web-server↔interpreter
//! interface costs (ARCHITECTURE.md decision 13).
//!
//! `null-backend` answers every request of one protocol with a fixed CGI response, so the
//! cost of a hop can be measured with no application behind it; `bench` is a load generator
//! that speaks HTTP/1.1, FastCGI, SCGI or LSAPI straight to any address, sweeps concurrency
//! and reports req/s, latency percentiles, errors and the CPU and memory of given processes
//! as a table, JSON and an SVG chart. Files: `null` (the responders), `client` (one
//! connection of the generator per protocol), `load` (the sweep), `procs` (/proc sampling),
//! `report` (table and JSON), `svg` (the chart), `body` (a fixed hyper body).

mod body;
mod client;
mod load;
mod null;
mod procs;
mod report;
mod svg;

use std::path::PathBuf;
use std::time::Duration;

use crate::config::BackendAddress;
use crate::error::Error;

/// The wire protocol a null backend answers or the load generator speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Protocol {
    /// HTTP/1.1.
    Http,
    /// FastCGI (responder role).
    Fastcgi,
    /// SCGI: one request per connection.
    Scgi,
    /// LSAPI (LiteSpeed SAPI).
    Lsapi,
}

impl Protocol {
    /// The name used on the command line and in reports.
    pub fn name(self) -> &'static str {
        match self {
            Protocol::Http => "http",
            Protocol::Fastcgi => "fastcgi",
            Protocol::Scgi => "scgi",
            Protocol::Lsapi => "lsapi",
        }
    }
}

/// `on` or `off`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Switch {
    /// Enabled.
    On,
    /// Disabled.
    Off,
}

/// Arguments of `corral null-backend`.
#[derive(Debug, clap::Args)]
pub struct NullArgs {
    /// The protocol to answer.
    #[arg(long, value_enum)]
    pub protocol: Protocol,
    /// `unix:/path`, `127.0.0.1:PORT`, or `fd0` for a listening socket inherited on fd 0
    /// (as a pool starts its workers).
    #[arg(long, value_name = "ADDR")]
    pub listen: String,
    /// Bytes of response body ("Hello, world\n" repeated and cut to length).
    #[arg(long, value_name = "N", default_value_t = 13)]
    pub body_size: usize,
    /// Runtime worker threads (default: one per core).
    #[arg(long, value_name = "N")]
    pub threads: Option<usize>,
}

/// Arguments of `corral bench`.
#[derive(Debug, clap::Args)]
pub struct BenchArgs {
    /// The protocol to speak to the target.
    #[arg(long, value_enum)]
    pub protocol: Protocol,
    /// Where to send requests: `unix:/path` or `host:port`.
    #[arg(long, value_name = "ADDR", value_parser = BackendAddress::parse)]
    pub target: BackendAddress,
    /// Concurrency levels to sweep (connections sending requests back to back).
    #[arg(
        long,
        value_name = "C,C,...",
        value_delimiter = ',',
        default_value = "1,25,100",
        value_parser = parse_level
    )]
    pub concurrency: Vec<usize>,
    /// How long each measured run lasts.
    #[arg(long, value_name = "DURATION", value_parser = humantime::parse_duration, default_value = "8s")]
    pub duration: Duration,
    /// Send exactly N requests per run instead of running for --duration.
    #[arg(long, value_name = "N", conflicts_with = "duration")]
    pub requests: Option<u64>,
    /// Unrecorded load before each run.
    #[arg(long, value_name = "DURATION", value_parser = humantime::parse_duration, default_value = "2s")]
    pub warmup: Duration,
    /// Keep connections open between requests (SCGI has one request per connection always).
    #[arg(long, value_enum, default_value = "on")]
    pub keepalive: Switch,
    /// The request method.
    #[arg(long, default_value = "GET")]
    pub method: String,
    /// The request path (with an optional `?query`).
    #[arg(long, default_value = "/hello.php")]
    pub path: String,
    /// SCRIPT_FILENAME for FastCGI, SCGI and LSAPI (default: the path).
    #[arg(long, value_name = "PATH")]
    pub script_filename: Option<String>,
    /// Bytes of request body to send with each request.
    #[arg(long, value_name = "N", default_value_t = 0)]
    pub body_size: usize,
    /// A process whose CPU time and memory to sample during each run (repeatable).
    #[arg(long = "pid", value_name = "PID")]
    pub pids: Vec<u32>,
    /// Write the results as JSON to FILE.
    #[arg(long, value_name = "FILE")]
    pub json: Option<PathBuf>,
    /// Write an SVG chart (req/s and p99 against concurrency) to FILE.
    #[arg(long, value_name = "FILE")]
    pub svg: Option<PathBuf>,
    /// More targets, run interleaved with --target (A B A B ...) and compared to it.
    #[arg(long, value_name = "ADDR", value_parser = BackendAddress::parse, num_args = 1..)]
    pub compare: Vec<BackendAddress>,
    /// Runs per target and level (interleaved when comparing); default 1, or 3 with
    /// --compare.
    #[arg(long, value_name = "N")]
    pub rounds: Option<usize>,
    /// A request taking longer than this counts as a timeout error.
    #[arg(long, value_name = "DURATION", value_parser = humantime::parse_duration, default_value = "10s")]
    pub timeout: Duration,
    /// Load-generator threads (1 = a single-threaded runtime, like `wrk -t1`).
    #[arg(long, value_name = "N", default_value_t = 1)]
    pub threads: usize,
}

/// Runs `corral null-backend` until killed.
pub fn run_null(args: NullArgs) -> Result<(), Error> {
    let mut builder = tokio::runtime::Builder::new_multi_thread();
    if let Some(n) = args.threads {
        builder.worker_threads(n.max(1));
    }
    let runtime = builder.enable_all().build().map_err(|source| Error::Io {
        what: "start the runtime".to_owned(),
        source,
    })?;
    runtime.block_on(null::serve(&args))
}

/// Runs `corral bench`, writing the table (and ratios) to `out`.
pub fn run_bench(args: BenchArgs, out: &mut dyn std::io::Write) -> Result<(), Error> {
    if args.concurrency.is_empty() {
        return Err(Error::Usage(clap::Error::raw(
            clap::error::ErrorKind::ValueValidation,
            "--concurrency needs at least one level\n",
        )));
    }
    let runtime = if args.threads <= 1 {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
    } else {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(args.threads)
            .enable_all()
            .build()
    };
    let runtime = runtime.map_err(|source| Error::Io {
        what: "start the runtime".to_owned(),
        source,
    })?;
    let results = runtime.block_on(load::sweep(&args, out))?;
    if let Some(path) = &args.json {
        std::fs::write(path, report::json(&args, &results)).map_err(|source| Error::Io {
            what: format!("write {}", path.display()),
            source,
        })?;
    }
    if let Some(path) = &args.svg {
        std::fs::write(path, svg::chart(&args, &results)).map_err(|source| Error::Io {
            what: format!("write {}", path.display()),
            source,
        })?;
    }
    Ok(())
}

/// A concurrency level: a whole number of connections, 1 or more.
fn parse_level(text: &str) -> Result<usize, String> {
    match text.trim().parse::<usize>() {
        Ok(n) if n > 0 => Ok(n),
        _ => Err(format!(
            "\"{text}\" is not a number of connections (1 or more)"
        )),
    }
}

/// A target address as reports show it.
pub fn address_label(addr: &BackendAddress) -> String {
    match addr {
        BackendAddress::Tcp { host, port } if host.contains(':') => format!("[{host}]:{port}"),
        BackendAddress::Tcp { host, port } => format!("{host}:{port}"),
        BackendAddress::Unix(path) => format!("unix:{}", path.display()),
    }
}
