//! Reforking (`refork_after`) checked on a real app, shared by tests/app_rails.rs and
//! tests/app_python.rs: the app answers `pid=N ppid=M` at a path of its own and appends the
//! pid of each process that loads it to a file.

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use super::server::{http, pool_counter, Corral};

/// How many workers the pool under test runs.
pub const WORKERS: usize = 3;

/// The keys of the pool under test: preloaded, [`WORKERS`] workers, one refork step.
pub const POOL_KEYS: &str = "mode = \"static\"
min = 3
max = 3
preload = true
refork_after = [20]";

/// The configuration of a corral (its runtime directory `run`) serving pool `pool` under
/// `prefix`, with a status listener: the pool's lines `app` (what it runs: `app`, `cwd`,
/// `env`...) and [`POOL_KEYS`].
pub fn config(run: &Path, pool: &str, prefix: &str, app: &str) -> String {
    format!(
        r#"
[server]
runtime_dir = "{run}"
grace = "2s"
kill_timeout = "2s"

[[listen]]
address = "127.0.0.1:0"
protocol = "http"

[status]
address = "127.0.0.1:0"

[pools.{pool}]
{app}
{POOL_KEYS}
start_timeout = "120s"
queue_timeout = "120s"

[[contexts]]
prefix = "{prefix}"
pool = "{pool}"
"#,
        run = run.display(),
    )
}

/// `corral`, started with [`config`], runs pool `pool`, whose app answers `whoami` with its pid and
/// parent pid and records its loads in `loads`. Checks that the pool serves 300 requests
/// over `pages` (and `whoami`) from 3 clients with no failed answer; that one worker that
/// served 20 was promoted to be the template, and it was forked by the preloader corral
/// started; that every worker then answering (also to 3 clients at once) is the template's
/// child and in its process tree, and the first preloader has retired; and that the app was
/// loaded once, by the preloader; and that status counts the one refork (`/status?json` and
/// the Prometheus metrics).
pub fn serves_from_a_promoted_worker(
    corral: &Corral,
    pool: &str,
    pages: &[&'static str],
    whoami: &'static str,
    loads: &Path,
) {
    let addr = corral.http_addr();
    let ask = |addr| ask_whoami(addr, whoami).unwrap_or_else(|e| panic!("{e}\n{}", corral.log()));
    assert!(
        corral.wait_count("forked from preloader", WORKERS, Duration::from_secs(120)),
        "{}",
        corral.log()
    );
    let (_, preloader) = ask(addr);
    assert_eq!(parent_pid(preloader), corral.pid(), "{}", corral.log());

    let mut all: Vec<&'static str> = pages.to_vec();
    all.push(whoami);
    let clients: Vec<_> = (0..3)
        .map(|i| {
            let all = all.clone();
            std::thread::spawn(move || {
                let mut failed = Vec::new();
                for n in 0..100 {
                    let page = all[(i + n) % all.len()];
                    let r = http(addr, "GET", page, &[], b"");
                    if r.status != 200 {
                        failed.push((page, r.status));
                    }
                }
                failed
            })
        })
        .collect();
    let failed: Vec<_> = clients
        .into_iter()
        .flat_map(|c| c.join().unwrap())
        .collect();
    assert!(failed.is_empty(), "{failed:?}\n{}", corral.log());

    // 300 requests over 3 workers: one of them passed 20 and was promoted (once: the list
    // has one step).
    assert!(
        corral.wait_count("worker promoted:", 1, Duration::from_secs(60)),
        "{}",
        corral.log()
    );
    let log = corral.log();
    let promoted: Vec<u32> = log
        .lines()
        .filter(|l| l.contains("worker promoted:"))
        .filter_map(|l| l.split(' ').find_map(|w| w.strip_prefix("pid=")))
        .map(|v| v.parse().unwrap())
        .collect();
    assert_eq!(promoted.len(), 1, "{log}");
    let template = promoted[0];
    // A former worker, forked by the first preloader.
    assert!(
        log.lines().any(|l| l.contains("worker forked")
            && l.contains(&format!(" pid={template} preloader={preloader} "))),
        "{log}"
    );
    // The older workers are replaced one at a time: soon every answer comes from a child
    // of the promoted worker.
    let mut seen = BTreeSet::new();
    assert!(
        super::eventually(Duration::from_secs(60), || {
            seen = (0..9).map(|_| ask(addr)).collect();
            seen.iter().all(|&(_, ppid)| ppid == template)
        }),
        "{seen:?}\n{}",
        corral.log()
    );
    // The first preloader retires once its last worker is gone; the template's tree is
    // then the whole pool, and 3 clients at once are answered by its workers alone.
    assert!(
        super::eventually(Duration::from_secs(60), || !super::alive(preloader)),
        "{}",
        corral.log()
    );
    let workers: BTreeSet<u32> = corral::process::process_tree(template)
        .unwrap()
        .into_iter()
        .filter(|&p| p != template)
        .collect();
    assert_eq!(workers.len(), WORKERS, "{workers:?}\n{}", corral.log());
    let answers: BTreeSet<(u32, u32)> = (0..3)
        .map(|_| {
            std::thread::spawn(move || {
                (0..30)
                    .map(|_| ask_whoami(addr, whoami))
                    .collect::<Vec<_>>()
            })
        })
        .collect::<Vec<_>>()
        .into_iter()
        .flat_map(|c| c.join().unwrap())
        .collect::<Result<_, _>>()
        .unwrap_or_else(|e| panic!("{e}\n{}", corral.log()));
    assert!(
        answers
            .iter()
            .all(|&(pid, ppid)| ppid == template && workers.contains(&pid)),
        "{answers:?} {workers:?}"
    );
    let loaded = std::fs::read_to_string(loads).unwrap();
    assert_eq!(loaded, format!("{preloader}\n"), "{}", corral.log());
    assert_eq!(corral.count_log("worker promoted:"), 1, "{}", corral.log());
    let status = corral.status_ready_addr();
    assert_eq!(pool_counter(status, pool, "reforks"), 1, "{}", corral.log());
    let metrics = http(status, "GET", "/metrics", &[], b"").text();
    let line = format!("corral_reforks_total{{pool=\"{pool}\"}} 1\n");
    assert!(metrics.contains(&line), "{line:?} not in:\n{metrics}");
}

/// The pid and parent pid of the worker answering a GET of `whoami`, or what was wrong.
fn ask_whoami(addr: SocketAddr, whoami: &str) -> Result<(u32, u32), String> {
    let r = http(addr, "GET", whoami, &[], b"");
    let text = r.text();
    if r.status != 200 {
        return Err(format!("{} {text}", r.status));
    }
    let field = |name: &str| {
        text.split(' ')
            .find_map(|w| w.strip_prefix(name))
            .and_then(|v| v.parse().ok())
            .ok_or_else(|| format!("no {name} in {text:?}"))
    };
    Ok((field("pid=")?, field("ppid=")?))
}

fn parent_pid(pid: u32) -> u32 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    corral::process::memory::parse_stat_ppid(&stat).unwrap()
}
