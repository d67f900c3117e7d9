//! The sweep: for each concurrency level (and each round, targets interleaved A B A B ...),
//! an unrecorded warm-up, then C connections sending requests back to back until the
//! duration or request count is used up; latencies go into one histogram per connection,
//! merged at the end.

use std::io::Write;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use hdrhistogram::Histogram;
use tokio::task::JoinSet;
use tokio::time::Instant;

use super::client::{Conn, Failure, Plan, Reply};
use super::procs::{Sampler, Usage};
use super::{address_label, report, BenchArgs};
use crate::config::BackendAddress;
use crate::error::Error;

/// Largest latency the histograms hold exactly, in microseconds (longer ones saturate).
const MAX_LATENCY_US: u64 = 3_600_000_000;
/// Pause after a failed connect, so a dead target is not hammered in a tight loop.
const CONNECT_BACKOFF: Duration = Duration::from_millis(10);

/// Failed requests by kind.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(super) struct Errors {
    /// The connection could not be made.
    pub connect: u64,
    /// The peer broke the protocol or closed mid-answer.
    pub protocol: u64,
    /// An answer whose status was not 2xx (it also counts as completed).
    pub status: u64,
    /// No answer within --timeout.
    pub timeout: u64,
}

impl Errors {
    /// All errors.
    pub fn total(&self) -> u64 {
        self.connect + self.protocol + self.status + self.timeout
    }

    fn add(&mut self, o: &Errors) {
        self.connect += o.connect;
        self.protocol += o.protocol;
        self.status += o.status;
        self.timeout += o.timeout;
    }
}

/// The outcome of one or more runs of one target at one concurrency level.
#[derive(Debug, Clone)]
pub(super) struct Run {
    /// Connections.
    pub concurrency: usize,
    /// Answers received (any status).
    pub completed: u64,
    /// Wall time of the measured runs.
    pub elapsed: Duration,
    /// Latency of every answer, in microseconds.
    pub latency: Histogram<u64>,
    /// Failures.
    pub errors: Errors,
    /// Response body bytes received.
    pub body_bytes: u64,
    /// The sampled processes (of the last round).
    pub procs: Vec<Usage>,
    /// The load generator itself (of the last round), to show when it is the bottleneck.
    pub generator: Option<Usage>,
}

impl Run {
    fn empty(concurrency: usize) -> Result<Run, Error> {
        Ok(Run {
            concurrency,
            completed: 0,
            elapsed: Duration::ZERO,
            latency: new_histogram()?,
            errors: Errors::default(),
            body_bytes: 0,
            procs: Vec::new(),
            generator: None,
        })
    }

    /// Answers per second.
    pub fn rate(&self) -> f64 {
        self.completed as f64 / self.elapsed.as_secs_f64().max(f64::MIN_POSITIVE)
    }

    fn absorb(&mut self, o: Run) {
        self.completed += o.completed;
        self.elapsed += o.elapsed;
        let _ = self.latency.add(&o.latency);
        self.errors.add(&o.errors);
        self.body_bytes += o.body_bytes;
        self.procs = o.procs;
        self.generator = o.generator.or(self.generator);
    }
}

/// Every level of one target.
#[derive(Debug, Clone)]
pub(super) struct TargetResult {
    /// The address as given.
    pub label: String,
    /// One entry per concurrency level, in order.
    pub runs: Vec<Run>,
}

fn new_histogram() -> Result<Histogram<u64>, Error> {
    Histogram::new_with_bounds(1, MAX_LATENCY_US, 3)
        .map_err(|e| Error::Internal(format!("latency histogram: {e}")))
}

/// When a run stops.
#[derive(Debug, Clone, Copy)]
enum Stop {
    After(u64),
    At(Duration),
}

/// What the connections of a run share.
struct Shared {
    remaining: Option<AtomicU64>,
    deadline: Instant,
}

impl Shared {
    /// Claims the right to send one more request.
    fn take(&self) -> bool {
        if Instant::now() >= self.deadline {
            return false;
        }
        match &self.remaining {
            None => true,
            Some(left) => left
                .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1))
                .is_ok(),
        }
    }
}

/// Runs every level, round and target, printing each run as it ends, then the summary and
/// ratios.
pub(super) async fn sweep(
    args: &BenchArgs,
    out: &mut dyn Write,
) -> Result<Vec<TargetResult>, Error> {
    let plan = Arc::new(Plan::new(args)?);
    let targets: Vec<Arc<BackendAddress>> = std::iter::once(&args.target)
        .chain(&args.compare)
        .map(|a| Arc::new(a.clone()))
        .collect();
    let rounds = args
        .rounds
        .unwrap_or(if args.compare.is_empty() { 1 } else { 3 })
        .max(1);
    let stop = match args.requests {
        Some(n) => Stop::After(n),
        None => Stop::At(args.duration),
    };
    let mut results: Vec<TargetResult> = Vec::with_capacity(targets.len());
    for t in &targets {
        let runs = args
            .concurrency
            .iter()
            .map(|&c| Run::empty(c))
            .collect::<Result<_, _>>()?;
        results.push(TargetResult {
            label: address_label(t),
            runs,
        });
    }
    let print = |out: &mut dyn Write, text: String| -> Result<(), Error> {
        writeln!(out, "{text}")
            .and_then(|()| out.flush())
            .map_err(|source| Error::Io {
                what: "write to standard output".to_owned(),
                source,
            })
    };
    let width = report::label_width(args, rounds);
    print(out, report::header(args, rounds))?;
    for (level, &c) in args.concurrency.iter().enumerate() {
        for round in 0..rounds {
            for (t, addr) in targets.iter().enumerate() {
                if !args.warmup.is_zero() {
                    run_once(&plan, addr, c, Stop::At(args.warmup), None).await?;
                }
                let run = run_once(&plan, addr, c, stop, Some(&args.pids)).await?;
                let label = results.get(t).map(|r| r.label.clone()).unwrap_or_default();
                let tag = if rounds > 1 {
                    format!("{label} #{}", round + 1)
                } else {
                    label
                };
                print(out, report::row(&tag, &run, width))?;
                if let Some(slot) = results.get_mut(t).and_then(|r| r.runs.get_mut(level)) {
                    slot.absorb(run);
                }
            }
        }
    }
    let summary = report::summary(&results, rounds, width);
    if !summary.is_empty() {
        print(out, summary)?;
    }
    Ok(results)
}

/// One run of `c` connections: measured, sampling `pids` and the generator itself, when
/// `pids` is given; a warm-up otherwise.
async fn run_once(
    plan: &Arc<Plan>,
    addr: &Arc<BackendAddress>,
    c: usize,
    stop: Stop,
    pids: Option<&[u32]>,
) -> Result<Run, Error> {
    let start = Instant::now();
    let shared = Arc::new(Shared {
        remaining: match stop {
            Stop::After(n) => Some(AtomicU64::new(n)),
            Stop::At(_) => None,
        },
        deadline: match stop {
            Stop::After(_) => start + Duration::from_secs(365 * 24 * 3600),
            Stop::At(d) => start + d,
        },
    });
    let watched: Vec<u32> = match pids {
        Some(pids) => pids.iter().copied().chain([std::process::id()]).collect(),
        None => Vec::new(),
    };
    let sampler = Sampler::start(&watched);
    let mut connections = JoinSet::new();
    for _ in 0..c {
        let (plan, addr, shared) = (Arc::clone(plan), Arc::clone(addr), Arc::clone(&shared));
        connections.spawn(async move { connection(&plan, &addr, &shared).await });
    }
    let mut run = Run::empty(c)?;
    while let Some(done) = connections.join_next().await {
        let part =
            done.map_err(|e| Error::Internal(format!("a bench connection failed: {e}")))??;
        run.absorb(part);
    }
    run.elapsed = start.elapsed();
    run.procs = sampler.finish(run.elapsed).await;
    run.generator = run.procs.pop();
    Ok(run)
}

/// One connection's requests, back to back, reconnecting when the connection cannot carry
/// the next one.
async fn connection(plan: &Plan, addr: &BackendAddress, shared: &Shared) -> Result<Run, Error> {
    let mut run = Run::empty(1)?;
    let mut slot: Option<Conn> = None;
    while shared.take() {
        let sent = Instant::now();
        let result = tokio::time::timeout(plan.timeout, one(plan, addr, &mut slot)).await;
        match result {
            Err(_) => run.errors.timeout += 1,
            Ok(Err(Failure::Connect)) => {
                run.errors.connect += 1;
                tokio::time::sleep(CONNECT_BACKOFF).await;
            }
            Ok(Err(Failure::Protocol)) => run.errors.protocol += 1,
            Ok(Ok(reply)) => {
                let us = u64::try_from(sent.elapsed().as_micros()).unwrap_or(u64::MAX);
                run.latency.saturating_record(us.max(1));
                run.completed += 1;
                run.body_bytes += reply.body_bytes;
                if !(200..300).contains(&reply.status) {
                    run.errors.status += 1;
                }
            }
        }
    }
    Ok(run)
}

async fn one(
    plan: &Plan,
    addr: &BackendAddress,
    slot: &mut Option<Conn>,
) -> Result<Reply, Failure> {
    let mut conn = match slot.take() {
        Some(c) => c,
        None => plan.connect(addr).await?,
    };
    let (reply, reusable) = conn.exchange(plan).await?;
    if reusable {
        *slot = Some(conn);
    }
    Ok(reply)
}
