//! `corral status --watch`: a terminal view of the running corral that refreshes in place.
//!
//! Every interval it asks the status listener of the configuration (as `corral status` does,
//! `crate::control::fetch_status`) for `/status?full` (php-fpm's text page, one block per
//! pool and per worker) and `/metrics` (for the request-time histogram), and draws one frame:
//! a row per pool (workers idle, busy and in all, queue, in flight, accepted, req/s, p50 and
//! p99, errors, recycles, crashes), then each pool's workers. req/s and the percentiles are
//! those of the last interval: the difference between this fetch and the previous one.
//!
//! On a terminal the frame is drawn over the last one in the alternate screen with the cursor
//! hidden, cut to the terminal's size; both are restored on exit, which Ctrl-C (SIGINT),
//! SIGTERM or SIGHUP asks for. When standard output is not a terminal each frame is printed
//! whole, without escape sequences, followed by a blank line. `--count N` ends after N frames.
//!
//! Everything read from the listener is parsed leniently: a line or field that does not
//! parse is skipped, never trusted for an index.

use std::fmt::Write as _;
use std::io::{self, Write};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tokio::time::Instant;

use crate::config::Config;
use crate::status::history::quantile_in;

mod parse;
use parse::field;
pub use parse::{parse_latency, parse_text, PoolView};

/// What `--watch` was asked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Options {
    /// Time between two frames.
    pub interval: Duration,
    /// Stop after this many frames.
    pub count: Option<u64>,
    /// Draw in place (standard output is a terminal).
    pub tty: bool,
}

/// Why watching ended badly.
#[derive(Debug)]
pub enum WatchError {
    /// The first fetch failed: nothing to show.
    Unavailable(io::Error),
    /// Standard output could not be written.
    Output(io::Error),
    /// The runtime or the signal handlers could not be set up.
    Setup(io::Error),
}

/// What one fetch saw.
#[derive(Debug, Clone)]
pub struct Snapshot {
    /// When the answers arrived.
    pub at: Instant,
    /// The pools.
    pub pools: Vec<PoolView>,
}

/// Fetches the text page and the metrics of the corral serving `config`.
fn fetch(config: &Config) -> io::Result<Snapshot> {
    let page = crate::control::fetch_status(config, "/status?full")?;
    // Without metrics (an older corral, a proxy in between) the view has no percentiles.
    let metrics = crate::control::fetch_status(config, "/metrics").unwrap_or_default();
    let mut pools = parse_text(&page);
    for (pool, bounds, counts) in parse_latency(&metrics) {
        if let Some(p) = pools.iter_mut().find(|p| p.name() == pool) {
            p.latency = Some((bounds, counts));
        }
    }
    Ok(Snapshot {
        at: Instant::now(),
        pools,
    })
}

/// How a table column is aligned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Align {
    Left,
    Right,
}

/// Lines of a table: the header then the rows, each column as wide as its widest cell,
/// two spaces apart.
fn table(indent: &str, columns: &[(&str, Align)], rows: &[Vec<String>]) -> Vec<String> {
    let widths: Vec<usize> = columns
        .iter()
        .enumerate()
        .map(|(i, (h, _))| {
            rows.iter()
                .filter_map(|r| r.get(i))
                .map(|c| c.chars().count())
                .chain(std::iter::once(h.chars().count()))
                .max()
                .unwrap_or(0)
        })
        .collect();
    let line = |cells: &mut dyn Iterator<Item = &str>| {
        let mut out = indent.to_owned();
        for (i, ((_, align), w)) in columns.iter().zip(&widths).enumerate() {
            let cell = cells.next().unwrap_or("");
            if i > 0 {
                out.push_str("  ");
            }
            let _ = match align {
                Align::Left => write!(out, "{cell:<w$}"),
                Align::Right => write!(out, "{cell:>w$}"),
            };
        }
        out.trim_end().to_owned()
    };
    let mut out = vec![line(&mut columns.iter().map(|(h, _)| *h))];
    for r in rows {
        out.push(line(&mut r.iter().map(String::as_str)));
    }
    out
}

fn secs_text(s: Option<f64>) -> String {
    match s {
        None => "-".to_owned(),
        Some(s) if s < 0.001 => format!("{:.0} µs", s * 1e6),
        Some(s) if s < 0.01 => format!("{:.2} ms", s * 1e3),
        Some(s) if s < 1.0 => format!("{:.1} ms", s * 1e3),
        Some(s) => format!("{s:.2} s"),
    }
}

fn rate_text(r: Option<f64>) -> String {
    match r {
        None => "-".to_owned(),
        Some(r) if r >= 100.0 => format!("{r:.0}"),
        Some(r) => format!("{r:.1}"),
    }
}

fn bytes_text(v: Option<&str>) -> String {
    let Some(b) = v.and_then(|v| v.parse::<u64>().ok()) else {
        return "-".to_owned();
    };
    const MIB: f64 = 1024.0 * 1024.0;
    if b >= 1 << 30 {
        format!("{:.2} GiB", b as f64 / (MIB * 1024.0))
    } else {
        format!("{:.1} MiB", b as f64 / MIB)
    }
}

fn age_text(v: Option<&str>) -> String {
    let Some(s) = v.and_then(|v| v.parse::<u64>().ok()) else {
        return "-".to_owned();
    };
    let (d, h, m, s) = (s / 86_400, s % 86_400 / 3600, s % 3600 / 60, s % 60);
    if d > 0 {
        format!("{d}d{h:02}h")
    } else if h > 0 {
        format!("{h}h{m:02}m")
    } else if m > 0 {
        format!("{m}m{s:02}s")
    } else {
        format!("{s}s")
    }
}

/// The wall clock as `HH:MM:SS UTC`.
fn clock(now: SystemTime) -> String {
    let s = now.duration_since(UNIX_EPOCH).unwrap_or_default().as_secs() % 86_400;
    format!("{:02}:{:02}:{:02} UTC", s / 3600, s % 3600 / 60, s % 60)
}

/// req/s, p50 and p99 of `pool` between `prev` and `now`.
fn interval_numbers(
    pool: &PoolView,
    at: Instant,
    prev: Option<&Snapshot>,
) -> (Option<f64>, Option<f64>, Option<f64>) {
    let Some(prev) = prev else {
        return (None, None, None);
    };
    let Some(before) = prev.pools.iter().find(|p| p.name() == pool.name()) else {
        return (None, None, None);
    };
    let secs = at.duration_since(prev.at).as_secs_f64();
    let rate = match (pool.int("accepted conn"), before.int("accepted conn")) {
        (Some(n), Some(b)) if n >= b && secs > 0.0 => Some((n - b) as f64 / secs),
        _ => None,
    };
    let (p50, p99) = match (&pool.latency, &before.latency) {
        (Some((bounds, now)), Some((bounds_before, then)))
            if bounds == bounds_before && now.len() == then.len() =>
        {
            let ended: Option<Vec<u64>> = now
                .iter()
                .zip(then)
                .map(|(n, t)| n.checked_sub(*t))
                .collect();
            match ended {
                Some(ended) => (
                    quantile_in(bounds, &ended, 0.5),
                    quantile_in(bounds, &ended, 0.99),
                ),
                None => (None, None),
            }
        }
        _ => (None, None),
    };
    (rate, p50, p99)
}

/// The lines of one frame. `source` names where the numbers come from, `error` is the last
/// fetch's failure when the numbers shown are older.
pub fn frame(
    now: &Snapshot,
    prev: Option<&Snapshot>,
    source: &str,
    interval: Duration,
    wall: SystemTime,
    error: Option<&str>,
) -> Vec<String> {
    let up = now
        .pools
        .first()
        .map_or_else(|| "-".to_owned(), |p| age_text(p.get("start since")));
    let mut out = vec![format!(
        "corral status · {source} · every {} · {} · up {up} · Ctrl-C quits",
        humantime::format_duration(interval),
        clock(wall)
    )];
    if let Some(e) = error {
        out.push(format!(
            "! cannot fetch the status ({e}); showing the last answer"
        ));
    }
    out.push(String::new());
    let columns = [
        ("POOL", Align::Left),
        ("MODE", Align::Left),
        ("IDLE", Align::Right),
        ("BUSY", Align::Right),
        ("TOTAL", Align::Right),
        ("QUEUE", Align::Right),
        ("MAX Q", Align::Right),
        ("IN FLIGHT", Align::Right),
        ("ACCEPTED", Align::Right),
        ("REQ/S", Align::Right),
        ("P50", Align::Right),
        ("P99", Align::Right),
        ("ERRORS", Align::Right),
        ("RECYCLED", Align::Right),
        ("CRASHES", Align::Right),
    ];
    let text = |p: &PoolView, label: &str| p.get(label).unwrap_or("-").to_owned();
    let rows: Vec<Vec<String>> = now
        .pools
        .iter()
        .map(|p| {
            let (rate, p50, p99) = interval_numbers(p, now.at, prev);
            let errors = ["backend errors", "rejected queue full", "queue timeouts"]
                .iter()
                .filter_map(|l| p.int(l))
                .fold(0u64, u64::saturating_add);
            let mut mode = text(p, "process manager");
            if p.get("throttled") == Some("yes") {
                mode.push_str(" THROTTLED");
            }
            if p.get("stopping") == Some("yes") {
                mode.push_str(" stopping");
            }
            vec![
                p.name().to_owned(),
                mode,
                text(p, "idle processes"),
                text(p, "active processes"),
                text(p, "total processes"),
                text(p, "listen queue"),
                text(p, "max listen queue"),
                text(p, "in flight"),
                text(p, "accepted conn"),
                rate_text(rate),
                secs_text(p50),
                secs_text(p99),
                errors.to_string(),
                text(p, "recycled"),
                text(p, "crashes"),
            ]
        })
        .collect();
    out.extend(table("", &columns, &rows));
    for p in &now.pools {
        out.push(String::new());
        let external = p.rows.first().is_some_and(|r| field(r, "server").is_some());
        let noun = if external { "server" } else { "worker" };
        out.push(format!(
            "{}: {} {noun}{}",
            p.name(),
            p.rows.len(),
            if p.rows.len() == 1 { "" } else { "s" }
        ));
        if p.rows.is_empty() {
            continue;
        }
        let get = |r: &[(String, String)], l: &str| field(r, l).unwrap_or("-").to_owned();
        if external {
            let columns = [
                ("SERVER", Align::Right),
                ("ADDRESS", Align::Left),
                ("STATE", Align::Left),
                ("REQUESTS", Align::Right),
                ("IN FLIGHT", Align::Right),
            ];
            let rows: Vec<Vec<String>> = p
                .rows
                .iter()
                .map(|r| {
                    ["server", "address", "state", "requests", "in flight"]
                        .iter()
                        .map(|l| get(r, l))
                        .collect()
                })
                .collect();
            out.extend(table("  ", &columns, &rows));
        } else {
            let columns = [
                ("WORKER", Align::Right),
                ("PID", Align::Right),
                ("STATE", Align::Left),
                ("REQUESTS", Align::Right),
                ("IN FLIGHT", Align::Right),
                ("MEMORY", Align::Right),
                ("AGE", Align::Right),
                ("RECYCLE", Align::Left),
            ];
            let rows: Vec<Vec<String>> = p
                .rows
                .iter()
                .map(|r| {
                    vec![
                        get(r, "worker"),
                        get(r, "pid"),
                        get(r, "state"),
                        get(r, "requests"),
                        get(r, "in flight"),
                        bytes_text(field(r, "memory")),
                        age_text(field(r, "start since")),
                        get(r, "recycle"),
                    ]
                })
                .collect();
            out.extend(table("  ", &columns, &rows));
        }
    }
    out
}

/// The terminal's columns and rows, if standard output is one.
fn terminal_size() -> Option<(usize, usize)> {
    let mut ws = nix::libc::winsize {
        ws_row: 0,
        ws_col: 0,
        ws_xpixel: 0,
        ws_ypixel: 0,
    };
    // SAFETY: TIOCGWINSZ writes one `winsize` through the pointer, which points to a live,
    // aligned local of that type; the descriptor is only asked about, not changed.
    let r = unsafe {
        nix::libc::ioctl(
            nix::libc::STDOUT_FILENO,
            nix::libc::TIOCGWINSZ,
            &mut ws as *mut nix::libc::winsize,
        )
    };
    (r == 0 && ws.ws_col > 0 && ws.ws_row > 0)
        .then(|| (usize::from(ws.ws_col), usize::from(ws.ws_row)))
}

/// `lines` cut to `cols` characters and `rows` lines (the last saying how many were left
/// out), so a frame never scrolls the terminal.
fn fit(lines: &[String], cols: usize, rows: usize) -> Vec<String> {
    let cut = |l: &str| l.chars().take(cols).collect::<String>();
    if lines.len() <= rows {
        return lines.iter().map(|l| cut(l)).collect();
    }
    let keep = rows.saturating_sub(1);
    let mut out: Vec<String> = lines.iter().take(keep).map(|l| cut(l)).collect();
    out.push(cut(&format!(
        "… {} more lines: enlarge the terminal",
        lines.len() - keep
    )));
    out
}

/// Enter the alternate screen, hide the cursor.
const ENTER: &str = "\x1b[?1049h\x1b[?25l";
/// Show the cursor, leave the alternate screen.
const LEAVE: &str = "\x1b[?25h\x1b[?1049l";

fn draw(out: &mut dyn Write, lines: &[String], tty: bool) -> io::Result<()> {
    let mut text = String::new();
    if tty {
        let (cols, rows) = terminal_size().unwrap_or((80, 24));
        // Home, each line cleared to its end, everything below the frame cleared; no newline
        // after the last line, which would scroll a frame as tall as the terminal.
        text.push_str("\x1b[H");
        text.push_str(&fit(lines, cols, rows).join("\x1b[K\n"));
        text.push_str("\x1b[K\x1b[J");
    } else {
        for l in lines {
            text.push_str(l);
            text.push('\n');
        }
        text.push('\n');
    }
    out.write_all(text.as_bytes())?;
    out.flush()
}

/// Watches the corral serving `config` until interrupted (or `count` frames), writing frames
/// to `out`.
pub fn run(config: &Config, options: Options, out: &mut dyn Write) -> Result<(), WatchError> {
    let source = match &config.status {
        Some(s) => s.bind.address().to_string(),
        None => {
            return Err(WatchError::Unavailable(io::Error::new(
                io::ErrorKind::NotFound,
                "the configuration has no [status] listener to ask",
            )))
        }
    };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(WatchError::Setup)?;
    let config = Arc::new(config.clone());
    let result = runtime.block_on(async {
        use tokio::signal::unix::{signal, SignalKind};
        let mut stops = [
            signal(SignalKind::interrupt()).map_err(WatchError::Setup)?,
            signal(SignalKind::terminate()).map_err(WatchError::Setup)?,
            signal(SignalKind::hangup()).map_err(WatchError::Setup)?,
        ];
        let mut resized = signal(SignalKind::window_change()).map_err(WatchError::Setup)?;
        let fetch_now = || {
            let config = Arc::clone(&config);
            tokio::task::spawn_blocking(move || fetch(&config))
        };
        let [interrupt, terminate, hangup] = &mut stops;
        let first = tokio::select! {
            first = fetch_now() => first,
            _ = interrupt.recv() => return Ok(()),
            _ = terminate.recv() => return Ok(()),
            _ = hangup.recv() => return Ok(()),
        };
        let first = match first {
            Ok(r) => r.map_err(WatchError::Unavailable)?,
            Err(e) => return Err(WatchError::Setup(io::Error::other(e))),
        };
        if options.tty {
            out.write_all(ENTER.as_bytes())
                .map_err(WatchError::Output)?;
        }
        let result = watch_loop(
            first,
            &source,
            options,
            out,
            &mut stops,
            &mut resized,
            fetch_now,
        )
        .await;
        if options.tty {
            // Restored however the loop ended; a failure to write it is reported below.
            let _ = out.write_all(LEAVE.as_bytes());
            let _ = out.flush();
        }
        result
    });
    // A fetch cut short by Ctrl-C may still be waiting on its socket: do not wait for it.
    runtime.shutdown_timeout(Duration::from_millis(100));
    result
}

async fn watch_loop<F>(
    first: Snapshot,
    source: &str,
    options: Options,
    out: &mut dyn Write,
    stops: &mut [tokio::signal::unix::Signal; 3],
    resized: &mut tokio::signal::unix::Signal,
    fetch_now: impl Fn() -> F,
) -> Result<(), WatchError>
where
    F: std::future::Future<Output = Result<io::Result<Snapshot>, tokio::task::JoinError>>,
{
    let [interrupt, terminate, hangup] = stops;
    let mut last = first;
    let mut prev: Option<Snapshot> = None;
    let mut error: Option<String> = None;
    let mut frames = 0u64;
    let mut next = Instant::now();
    loop {
        let lines = frame(
            &last,
            prev.as_ref(),
            source,
            options.interval,
            SystemTime::now(),
            error.as_deref(),
        );
        draw(out, &lines, options.tty).map_err(WatchError::Output)?;
        frames += 1;
        if options.count.is_some_and(|n| frames >= n) {
            return Ok(());
        }
        next += options.interval;
        loop {
            tokio::select! {
                () = tokio::time::sleep_until(next) => break,
                _ = interrupt.recv() => return Ok(()),
                _ = terminate.recv() => return Ok(()),
                _ = hangup.recv() => return Ok(()),
                _ = resized.recv() => {
                    let lines = frame(&last, prev.as_ref(), source, options.interval,
                        SystemTime::now(), error.as_deref());
                    draw(out, &lines, options.tty).map_err(WatchError::Output)?;
                }
            }
        }
        // A fetch that takes longer than the interval pushes the next frame back, rather
        // than queueing frames.
        let fetched = tokio::select! {
            fetched = fetch_now() => fetched,
            _ = interrupt.recv() => return Ok(()),
            _ = terminate.recv() => return Ok(()),
            _ = hangup.recv() => return Ok(()),
        };
        match fetched {
            Ok(Ok(s)) => {
                error = None;
                prev = Some(std::mem::replace(&mut last, s));
            }
            Ok(Err(e)) => error = Some(e.to_string()),
            Err(e) => error = Some(e.to_string()),
        }
        next = next.max(Instant::now());
    }
}

#[cfg(test)]
mod tests;
