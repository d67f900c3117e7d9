//! What the Rack launcher does for memory, behind the real corral binary: a preloaded
//! pool's preloader asks the app for GET / a few times before the first fork (with
//! `X-Corral-Warmup: 1`; the requests pass `Rack::Lint`, and their count, stop conditions
//! and the CORRAL_RACK_WARMUP switch are what docs/pools.md says), and a worker gives the
//! kernel back the malloc pages a garbage collection left free (CORRAL_RACK_TRIM).

mod support;

use std::path::Path;

use support::peers::{shared_dir, write_file};
use support::server::{http, Corral};

/// Records the warm-up requests the preloader made (the array is inherited by the workers),
/// behaves on GET / as WARM_MODE says, and can fragment the malloc heap and report the
/// process's anonymous memory.
const APP: &str = r##"
SEEN = []
KEPT = []

def plain(text, status = 200)
  [status, { 'content-type' => 'text/plain' }, [text]]
end

# 400 strings of 64 KiB (malloc'd below the mmap threshold), one in four kept: once the
# others are collected, their 19 MiB are free between kept ones, in the middle of the heap,
# where only malloc_trim gives them back.
def fragment
  large = []
  400.times do |i|
    s = 'x' * 65_536
    (i % 4).zero? ? KEPT << s : large << s
  end
  large.size
end

def anon_kib
  File.read('/proc/self/status')[/^RssAnon:\s+(\d+)/, 1]
end

use Rack::Lint
run(lambda do |env|
  case env['PATH_INFO']
  when '/seen' then plain("#{SEEN.size} #{SEEN.uniq.join(',')}")
  when '/fragment' then plain(fragment.to_s)
  when '/gc'
    3.times { GC.start }
    plain('collected')
  when '/anon' then plain(anon_kib)
  else
    SEEN << "#{env['REQUEST_METHOD']} #{env['HTTP_X_CORRAL_WARMUP']} #{env['REMOTE_ADDR']}" if env['HTTP_X_CORRAL_WARMUP']
    case ENV['WARM_MODE']
    when 'raise' then raise 'no warm-up for this app'
    when 'fail' then plain('not yet', 503)
    when 'slow'
      sleep 0.3
      plain('home')
    else plain('home')
    end
  end
end)
"##;

/// corral with one preloaded one-worker pool of the app in `dir`, its env `env` (TOML
/// pairs).
fn start(dir: &Path, env: &str) -> Corral {
    write_file(dir, "config.ru", APP);
    let config = format!(
        r#"
[server]
runtime_dir = "{run}"
kill_timeout = "2s"

[[listen]]
address = "127.0.0.1:0"
protocol = "http"

[pools.rb]
app = "rack:config.ru"
cwd = "{dir}"
mode = "static"
min = 1
max = 1
preload = true
env = {{ {env} }}

[[contexts]]
prefix = "/"
pool = "rb"
"#,
        run = dir.join("run").display(),
        dir = dir.display(),
    );
    Corral::start(&config, 1)
}

fn get(corral: &Corral, path: &str) -> String {
    let r = http(corral.http_addr(), "GET", path, &[], b"");
    assert_eq!(r.status, 200, "{path}: {}\n{}", r.text(), corral.log());
    r.text()
}

#[test]
fn the_preloader_warms_the_app_up_with_marked_gets_of_the_root() {
    let dir = shared_dir();
    let corral = start(dir.path(), r#"CORRAL_RACK_WARMUP = "30""#);
    // The count asked for, each a Lint-clean GET / from 127.0.0.1 with the header, made by
    // the preloader: the worker inherited what they left.
    assert_eq!(get(&corral, "/seen"), "30 GET 1 127.0.0.1");
    assert!(
        corral.wait_log("warm-up: 30 GET / answered in"),
        "{}",
        corral.log()
    );
    assert!(!corral.log().contains("LintError"), "{}", corral.log());
    // A real GET / is not marked.
    assert_eq!(get(&corral, "/"), "home");
    assert_eq!(get(&corral, "/seen"), "30 GET 1 127.0.0.1");
}

#[test]
fn no_warm_up_unless_the_pool_asks_for_one() {
    // The default: the preloader calls no app code (as Passenger's and Puma's do not).
    let dir = shared_dir();
    let corral = start(dir.path(), "");
    assert_eq!(get(&corral, "/seen"), "0 ");
    assert!(!corral.log().contains("warm-up"), "{}", corral.log());
    drop(corral);

    let dir = shared_dir();
    let corral = start(dir.path(), r#"CORRAL_RACK_WARMUP = "5""#);
    assert_eq!(get(&corral, "/seen"), "5 GET 1 127.0.0.1");
    drop(corral);

    let dir = shared_dir();
    let corral = start(dir.path(), r#"CORRAL_RACK_WARMUP = "off""#);
    assert_eq!(get(&corral, "/seen"), "0 ");
    assert!(!corral.log().contains("warm-up"), "{}", corral.log());
    drop(corral);

    // Not a count: said so, and no warm-up.
    let dir = shared_dir();
    let corral = start(dir.path(), r#"CORRAL_RACK_WARMUP = "lots""#);
    assert!(
        corral.wait_log("CORRAL_RACK_WARMUP=\"lots\" is neither a count nor off; no warm-up"),
        "{}",
        corral.log()
    );
    assert_eq!(get(&corral, "/seen"), "0 ");
}

#[test]
fn a_warm_up_that_raises_or_fails_stops_and_the_pool_serves() {
    let dir = shared_dir();
    let corral = start(
        dir.path(),
        r#"WARM_MODE = "raise", CORRAL_RACK_WARMUP = "30""#,
    );
    assert_eq!(get(&corral, "/seen"), "1 GET 1 127.0.0.1");
    assert!(
        corral.wait_log(
            "warm-up stops at request 1: GET / raised RuntimeError: no warm-up for this app"
        ),
        "{}",
        corral.log()
    );
    drop(corral);

    let dir = shared_dir();
    let corral = start(
        dir.path(),
        r#"WARM_MODE = "fail", CORRAL_RACK_WARMUP = "30""#,
    );
    assert_eq!(get(&corral, "/seen"), "1 GET 1 127.0.0.1");
    assert!(
        corral.wait_log("warm-up stops at request 1: GET / answered 503"),
        "{}",
        corral.log()
    );
}

#[test]
fn a_slow_warm_up_stops_after_its_time_budget() {
    // 0.3 s a request against a 2 s budget: 7 requests, and the first fork is not held up
    // for the 30 (9 s).
    let dir = shared_dir();
    let corral = start(
        dir.path(),
        r#"WARM_MODE = "slow", CORRAL_RACK_WARMUP = "30""#,
    );
    let seen = get(&corral, "/seen");
    let count: usize = seen.split(' ').next().unwrap().parse().unwrap();
    assert!((6..=8).contains(&count), "{seen}\n{}", corral.log());
    assert!(
        corral.wait_log(&format!("warm-up: {count} GET / answered in")),
        "{}",
        corral.log()
    );
}

/// The worker's anonymous memory in KiB before and after a fragmenting request and a
/// collection, each in its own request.
fn anon_growth(env: &str) -> i64 {
    let dir = shared_dir();
    let corral = start(dir.path(), env);
    let before: i64 = get(&corral, "/anon").parse().unwrap();
    assert_eq!(get(&corral, "/fragment"), "300");
    assert_eq!(get(&corral, "/gc"), "collected");
    let after: i64 = get(&corral, "/anon").parse().unwrap();
    after - before
}

#[test]
fn a_worker_gives_back_the_pages_a_collection_freed() {
    // 6.25 MiB kept by the app, 18.75 MiB freed between its strings: all 25 held
    // without the trim.
    let kept = anon_growth(r#"CORRAL_RACK_TRIM = "off""#);
    assert!(
        kept > 20 * 1024,
        "without the trim the worker kept {kept} KiB"
    );
    let trimmed = anon_growth("");
    assert!(
        trimmed < 12 * 1024,
        "after the trim the worker still holds {trimmed} KiB more"
    );
}
