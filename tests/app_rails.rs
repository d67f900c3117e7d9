//! Rails 6.1 (Debian's ruby-rails) through corral's embedded Rack launcher, as people deploy
//! it: a small Rails app written the way `rails new` lays one out (Gemfile and a
//! Gemfile.lock made offline by `bundle lock --local`, config/boot.rb requiring
//! bundler/setup, production environment), mounted under `/app` so SCRIPT_NAME is `/app` and
//! the url helpers say so. One corral serves every case (Rails boots slowly): a GET, a form
//! POST with its CSRF token and session cookie (and 422 without them), an
//! `ActionController::Live` stream, a multipart upload checked by hash on the server, the
//! pool's `ruby` interpreter, and Bundler's setup run by the launcher when a Gemfile sits
//! next to config.ru (a plain Rack app, with and without one, and with one naming a gem
//! nobody installed). Pools of their own on the same app measure what preloading shares
//! and check reforking (`refork_after`) under a little load. The app itself is in
//! `tests/support/rails_app.rs`.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing,
    missing_docs
)]

mod support;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::Command;
use std::sync::OnceLock;
use std::time::Duration;

use support::apps::{
    gate_name, input_value, setup, sha256, shared, streamed_get, upload_bytes, writable_dir,
    write_tree, Browser, Reaper,
};
use support::rails_app::{BUNDLE_PROBE, RAILS_APP, RUBY_SHIM};
use support::server::{http, Corral};

struct Fixture {
    reaper: Reaper,
    corral: Corral,
    addr: SocketAddr,
}

impl Fixture {
    fn gate(&self, tag: &str) -> (String, PathBuf) {
        let name = gate_name(tag);
        let path = self.reaper.dir.join("gates").join(&name);
        (name, path)
    }
}

static FIXTURE: OnceLock<Result<Fixture, String>> = OnceLock::new();

/// The Rails app, the two probes and the corral serving them, started once.
fn fixture() -> &'static Fixture {
    shared(&FIXTURE, start)
}

fn start() -> Fixture {
    let reaper = Reaper::start("corral-rails-");
    let dir = reaper.dir.clone();
    let blog = dir.join("blog");
    write_tree(&blog, RAILS_APP);
    // Where a deployment lets the app write; Rails in production needs little else.
    writable_dir(&blog.join("tmp"));
    writable_dir(&blog.join("log"));
    write_tree(&dir, &[RUBY_SHIM]);
    support::apps::chmod(&dir.join(RUBY_SHIM.0), 0o755);
    std::fs::create_dir(dir.join("gates")).unwrap();
    support::apps::chmod(&dir.join("gates"), 0o755);
    write_tree(
        &dir,
        &[
            ("bundled/config.ru", BUNDLE_PROBE),
            (
                "bundled/Gemfile",
                "source \"https://rubygems.org\"\n\ngem \"rack\"\n",
            ),
            ("plain/config.ru", BUNDLE_PROBE),
            ("unbundlable/config.ru", BUNDLE_PROBE),
            (
                "unbundlable/Gemfile",
                "source \"https://rubygems.org\"\n\ngem \"corral-test-no-such-gem\"\n",
            ),
        ],
    );
    // Resolved against the gems Debian installed, with no network.
    for app in [&blog, &dir.join("bundled")] {
        let mut lock = Command::new("bundle");
        lock.args(["lock", "--local"]).current_dir(app);
        setup(lock, Duration::from_secs(60));
        support::apps::chmod(&app.join("Gemfile.lock"), 0o644);
    }

    let config = format!(
        r#"
[server]
runtime_dir = "{dir}/run"
grace = "2s"
kill_timeout = "2s"

[[listen]]
address = "127.0.0.1:0"
protocol = "http"

[pools.rails]
app = "rack:blog/config.ru"
ruby = "{dir}/{ruby}"
cwd = "{dir}"
mode = "static"
max = 2
start_timeout = "60s"
queue_timeout = "60s"
env = {{ RAILS_ENV = "production", SECRET_KEY_BASE = "{secret}", GATES = "{dir}/gates", CORRAL_RACK_WARMUP = "30" }}

[pools.bundled]
app = "rack:bundled/config.ru"
cwd = "{dir}"
mode = "static"
max = 1
queue_timeout = "60s"

[pools.plain]
app = "rack:plain/config.ru"
cwd = "{dir}"
mode = "static"
max = 1
queue_timeout = "60s"

# Its Gemfile names a gem nobody installed: the worker never starts.
[pools.unbundlable]
app = "rack:unbundlable/config.ru"
cwd = "{dir}"
mode = "static"
max = 1
queue_timeout = "1s"

[[contexts]]
prefix = "/app"
pool = "rails"

[[contexts]]
prefix = "/unbundlable"
pool = "unbundlable"

[[contexts]]
prefix = "/bundled"
pool = "bundled"

[[contexts]]
prefix = "/plain"
pool = "plain"
"#,
        dir = dir.display(),
        ruby = RUBY_SHIM.0,
        secret = "5ec7e7".repeat(22),
    );
    let corral = reaper.corral(&config);
    let addr = corral.http_addr();
    // The first answer waits for a booted worker (the queue holds it meanwhile).
    let r = http(addr, "GET", "/app/", &[], b"");
    assert_eq!(r.status, 200, "{}\n{}", r.text(), corral.log());
    Fixture {
        reaper,
        corral,
        addr,
    }
}

#[test]
fn a_get_sees_the_mount_point_in_script_name_and_url_helpers() {
    let f = fixture();
    let r = http(f.addr, "GET", "/app/posts", &[], b"");
    assert_eq!(r.status, 200, "{}\n{}", r.text(), f.corral.log());
    let text = r.text();
    assert!(text.contains("script_name: /app\n"), "{text}");
    assert!(
        text.contains("new_post_url: http://localhost/app/posts/new\n"),
        "{text}"
    );
    assert!(text.contains("rails: 6.1."), "{text}");
    assert!(text.contains(" production\n"), "{text}");

    // Rails' own 404 for a route it lacks, under the mount too.
    let r = http(f.addr, "GET", "/app/no/such/route", &[], b"");
    assert_eq!(r.status, 404, "{}", r.text());
}

#[test]
fn the_preloader_warms_rails_up_before_forking() {
    // The preloaded pool that asks for a warm-up (CORRAL_RACK_WARMUP = "30"): its preloader
    // asked Rails for GET / (marked X-Corral-Warmup) and
    // got an answer Rails renders or redirects, each time: no warm-up stopped early.
    let f = fixture();
    let r = http(f.addr, "GET", "/app/posts", &[], b"");
    assert_eq!(r.status, 200, "{}\n{}", r.text(), f.corral.log());
    let log = f.corral.log();
    assert!(log.contains("warm-up: 30 GET / answered in"), "{log}");
    assert!(!log.contains("warm-up stops"), "{log}");
}

#[test]
fn the_pools_ruby_runs_the_app_and_its_gemfile_is_bundled() {
    let f = fixture();
    let text = http(f.addr, "GET", "/app/", &[], b"").text();
    assert!(
        text.contains("ruby: /usr/bin/ruby3.1 via corral-test-shim\n"),
        "{text}"
    );
    let gemfile = f.reaper.dir.join("blog/Gemfile");
    assert!(
        text.contains(&format!("bundle: {}\n", gemfile.display())),
        "{text}"
    );
}

#[test]
fn a_form_post_needs_its_csrf_token_and_session_cookie() {
    let f = fixture();
    let mut browser = Browser::default();
    let form = browser.get(f.addr, "/app/posts/new");
    assert_eq!(form.status, 200, "{}\n{}", form.text(), f.corral.log());
    let html = form.text();
    // The form posts back under the mount point.
    assert!(html.contains("action=\"/app/posts\""), "{html}");
    assert!(html.contains("href=\"/app/\""), "{html}");
    let token = input_value(&html, "authenticity_token").expect("a CSRF token in the form");
    assert!(
        browser.cookie("_blog_session").is_some(),
        "no session cookie: {:?}",
        form.headers
    );

    let r = browser.post_form(
        f.addr,
        "/app/posts",
        &[
            ("authenticity_token", &token),
            ("post[title]", "Hello, corral & Rails"),
        ],
    );
    assert_eq!(r.status, 302, "{}\n{}", r.text(), f.corral.log());
    assert_eq!(r.header("location"), Some("http://localhost/app/posts"));
    let r = browser.get(f.addr, "/app/posts");
    let text = r.text();
    assert!(
        text.contains("notice: created Hello, corral & Rails\n"),
        "{text}"
    );
    assert!(text.contains("posts: Hello, corral & Rails\n"), "{text}");

    // A second post in the same session adds to what the session cookie holds.
    let html = browser.get(f.addr, "/app/posts/new").text();
    let token = input_value(&html, "authenticity_token").unwrap();
    let r = browser.post_form(
        f.addr,
        "/app/posts",
        &[("authenticity_token", &token), ("post[title]", "second")],
    );
    assert_eq!(r.status, 302, "{}", r.text());
    let text = browser.get(f.addr, "/app/posts").text();
    assert!(
        text.contains("posts: Hello, corral & Rails, second\n"),
        "{text}"
    );

    // Without the token, with the session: refused.
    let r = browser.post_form(f.addr, "/app/posts", &[("post[title]", "forged")]);
    assert_eq!(r.status, 422, "{}", r.text());
    // With a token but without the session it belongs to: refused too.
    let mut stranger = Browser::default();
    let r = stranger.post_form(
        f.addr,
        "/app/posts",
        &[("authenticity_token", &token), ("post[title]", "forged")],
    );
    assert_eq!(r.status, 422, "{}", r.text());
    let text = browser.get(f.addr, "/app/posts").text();
    assert!(!text.contains("forged"), "{text}");
}

#[test]
fn an_action_controller_live_response_streams() {
    let f = fixture();
    let (name, gate) = f.gate("live");
    let r = streamed_get(
        f.addr,
        &format!("/app/stream?gate={name}"),
        ("first;", "second;"),
        &gate,
    );
    assert_eq!(r.status, 200, "{}", f.corral.log());
    assert_eq!(r.text(), "first;second;third;");
    assert!(r.header("content-length").is_none(), "{:?}", r.headers);
}

#[test]
fn a_multipart_upload_arrives_whole() {
    let f = fixture();
    let mut browser = Browser::default();
    let form = browser.get(f.addr, "/app/upload");
    assert_eq!(form.status, 200, "{}", form.text());
    let html = form.text();
    assert!(html.contains("action=\"/app/upload\""), "{html}");
    assert!(html.contains("enctype=\"multipart/form-data\""), "{html}");
    let token = input_value(&html, "authenticity_token").unwrap();
    // Larger than Rack's in-memory limit, so it goes through a temporary file.
    let data = upload_bytes(3 << 20);
    let r = browser.post_multipart(
        f.addr,
        "/app/upload",
        &[("authenticity_token", &token)],
        ("file", "blob.bin", &data),
    );
    assert_eq!(r.status, 200, "{}\n{}", r.text(), f.corral.log());
    assert_eq!(
        r.text(),
        format!("blob.bin {} {}", data.len(), sha256(&data))
    );
}

#[test]
fn a_gemfile_next_to_config_ru_is_set_up_before_the_app_loads() {
    let f = fixture();
    let dir = &f.reaper.dir;
    let r = http(f.addr, "GET", "/bundled/", &[], b"");
    assert_eq!(r.status, 200, "{}\n{}", r.text(), f.corral.log());
    let text = r.text();
    let gemfile = dir.join("bundled/Gemfile");
    assert!(
        text.contains(&format!("gemfile={}\n", gemfile.display())),
        "{text}"
    );
    assert!(
        text.contains(&format!("bundler={}\n", dir.join("bundled").display())),
        "{text}"
    );
    // Only the bundle's gems load: rails is on the system, not in this Gemfile.
    assert!(text.contains("rails=refused\n"), "{text}");
    // A pool that names no interpreter runs `ruby` from PATH.
    assert!(text.contains("ruby=PATH\n"), "{text}");

    // The same app without a Gemfile: no Bundler, every installed gem loads.
    let text = http(f.addr, "GET", "/plain/", &[], b"").text();
    assert!(text.contains("gemfile=\n"), "{text}");
    assert!(text.contains("bundler=none\n"), "{text}");
    assert!(text.contains("rails=loadable\n"), "{text}");
}

#[test]
fn a_gemfile_naming_a_missing_gem_is_reported_and_answered_with_a_gateway_error() {
    let f = fixture();
    assert!(
        f.corral
            .wait_log("Could not find gem 'corral-test-no-such-gem'"),
        "{}",
        f.corral.log()
    );
    // A worker that exits while starting (502) or none ready in time (503): an answer at
    // once, either way.
    let r = http(f.addr, "GET", "/unbundlable/", &[], b"");
    assert!(matches!(r.status, 502 | 503), "{} {}", r.status, r.text());
}

/// Summed PSS of a Rails pool's processes (the workers, and with preload the preloader),
/// for 2, 4 and 8 workers with `preload` on and off, each pool in a corral of its own on the
/// fixture's app. Printed for the record (benches/launchers.sh measures PSS beside
/// Passenger's, on hello world, in its own section of benches/RESULTS.md); asserted lower
/// with preload on.
#[test]
fn preloading_rails_shares_memory_between_workers() {
    let f = fixture();
    let dir = &f.reaper.dir;
    let mut rows = Vec::new();
    for workers in [2usize, 4, 8] {
        let mut pss = Vec::new();
        for preload in [true, false] {
            let config = format!(
                r#"
[server]
runtime_dir = "{dir}/run-pss-{workers}-{preload}"
grace = "2s"
kill_timeout = "2s"

[[listen]]
address = "127.0.0.1:0"
protocol = "http"

[pools.rails]
app = "rack:blog/config.ru"
cwd = "{dir}"
mode = "static"
min = {workers}
max = {workers}
preload = {preload}
start_timeout = "120s"
queue_timeout = "120s"
env = {{ RAILS_ENV = "production", SECRET_KEY_BASE = "{secret}", GATES = "{dir}/gates" }}

[[contexts]]
prefix = "/app"
pool = "rails"
"#,
                dir = dir.display(),
                secret = "5ec7e7".repeat(22),
            );
            let corral = f.reaper.corral(&config);
            let addr = corral.http_addr();
            // Every worker has loaded (or been forked from a loaded preloader) and the
            // pool answers.
            let loaded = if preload {
                "forked from preloader"
            } else {
                "corral-rack: serving"
            };
            assert!(
                corral.wait_count(loaded, workers, Duration::from_secs(120)),
                "{}",
                corral.log()
            );
            for _ in 0..(4 * workers) {
                let r = http(addr, "GET", "/app/", &[], b"");
                assert_eq!(r.status, 200, "{}\n{}", r.text(), corral.log());
            }
            let tree: Vec<u32> = corral::process::process_tree(corral.pid())
                .unwrap()
                .into_iter()
                .filter(|&p| p != corral.pid())
                .collect();
            let expected = workers + usize::from(preload);
            assert_eq!(tree.len(), expected, "{tree:?}\n{}", corral.log());
            let bytes = corral::process::memory_of(tree[0], &tree).unwrap().bytes();
            // The workers alone: corral's children without preload, the preloader's with.
            let children: Vec<u32> = tree
                .iter()
                .copied()
                .filter(|&p| preload != (parent_pid(p) == corral.pid()))
                .collect();
            assert_eq!(children.len(), workers, "{tree:?}");
            let alone = corral::process::memory_of(children[0], &children)
                .unwrap()
                .bytes();
            pss.push((bytes, alone));
            drop(corral);
        }
        let mib = |b: u64| b as f64 / f64::from(1u32 << 20);
        rows.push(format!(
            "{workers} workers: preload {:.1} MiB ({:.1} MiB without the preloader), no preload {:.1} MiB",
            mib(pss[0].0),
            mib(pss[0].1),
            mib(pss[1].0)
        ));
        assert!(pss[0].0 < pss[1].0, "{rows:?}");
    }
    eprintln!(
        "Rails 6.1 summed PSS (workers + preloader):\n{}",
        rows.join("\n")
    );
}

/// Reforking on the real app: a preloaded pool of 3 workers with `refork_after = [20]`
/// serves 300 requests over a few pages from 3 clients with no failed answer; a worker that
/// served 20 is promoted to be the template (it was forked by the preloader corral started),
/// every worker then answering is its child, and the app was loaded once, by the preloader
/// (`support::reforking` says in full what is checked).
#[test]
fn a_reforked_rails_pool_serves_from_a_promoted_worker_and_loads_once() {
    let f = fixture();
    let dir = &f.reaper.dir;
    // Written by the preloader, which runs as the workers' user.
    let loads = writable_dir(&dir.join("loads-refork")).join("loads");
    let app = format!(
        r#"app = "rack:blog/config.ru"
cwd = "{dir}"
env = {{ RAILS_ENV = "production", SECRET_KEY_BASE = "{secret}", GATES = "{dir}/gates", LOADS_FILE = "{loads}" }}"#,
        dir = dir.display(),
        secret = "5ec7e7".repeat(22),
        loads = loads.display(),
    );
    let config = support::reforking::config(&dir.join("run-refork"), "rails", "/app", &app);
    let corral = f.reaper.corral(&config);
    support::reforking::serves_from_a_promoted_worker(
        &corral,
        "rails",
        &["/app/", "/app/posts/new", "/app/upload", "/app/posts"],
        "/app/whoami",
        &loads,
    );
}

fn parent_pid(pid: u32) -> u32 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    corral::process::memory::parse_stat_ppid(&stat).unwrap()
}
