//! Rails 6.1 (Debian's ruby-rails) through corral's embedded Rack launcher, as people deploy
//! it: a small Rails app written the way `rails new` lays one out (Gemfile and a
//! Gemfile.lock made offline by `bundle lock --local`, config/boot.rb requiring
//! bundler/setup, production environment), mounted under `/app` so SCRIPT_NAME is `/app` and
//! the url helpers say so. One corral serves every case (Rails boots slowly): a GET, a form
//! POST with its CSRF token and session cookie (and 422 without them), an
//! `ActionController::Live` stream, a multipart upload checked by hash on the server, the
//! pool's `ruby` interpreter, and Bundler's setup run by the launcher when a Gemfile sits
//! next to config.ru (a plain Rack app, with and without one, and with one naming a gem
//! nobody installed).

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
use support::server::{http, Corral};

/// The Ruby the Rails pool names with `ruby` (relative to the fixture dir): a shim in the way
/// rbenv's are, a script that sets up and runs a particular Ruby, so the app can tell it was
/// started through this path and not through the `ruby` a PATH lookup finds.
const RUBY_SHIM: (&str, &str) = (
    "rubies/3.1/bin/ruby",
    "#!/bin/sh\nRUBY_VIA=corral-test-shim exec /usr/bin/ruby3.1 \"$@\"\n",
);

/// The Rails app, file by file, relative to `blog/`.
const RAILS_APP: &[(&str, &str)] = &[
    (
        "Gemfile",
        r##"source "https://rubygems.org"

gem "rails", "~> 6.1.0"
"##,
    ),
    (
        "config.ru",
        r##"require_relative "config/environment"

run Rails.application
"##,
    ),
    (
        "config/boot.rb",
        r##"ENV["BUNDLE_GEMFILE"] ||= File.expand_path("../Gemfile", __dir__)

require "bundler/setup"
"##,
    ),
    (
        "config/application.rb",
        r##"require_relative "boot"

require "rails"
require "action_controller/railtie"
require "action_view/railtie"

module Blog
  class Application < Rails::Application
    config.load_defaults 6.1
    config.eager_load = true
    config.consider_all_requests_local = false
    config.public_file_server.enabled = false
    config.logger = ActiveSupport::Logger.new($stderr)
    config.log_level = :warn
    config.session_store :cookie_store, key: "_blog_session"
  end
end
"##,
    ),
    (
        "config/environment.rb",
        r##"require_relative "application"

Rails.application.initialize!
"##,
    ),
    (
        "config/routes.rb",
        r##"Rails.application.routes.draw do
  root "posts#index"
  resources :posts, only: [:index, :new, :create]
  get "stream", to: "stream#show"
  get "upload", to: "uploads#new", as: :new_upload
  post "upload", to: "uploads#create", as: :upload
end
"##,
    ),
    (
        "app/controllers/application_controller.rb",
        r##"class ApplicationController < ActionController::Base
end
"##,
    ),
    (
        "app/controllers/posts_controller.rb",
        r##"class PostsController < ApplicationController
  def index
    render plain: <<~TEXT
      notice: #{flash[:notice]}
      posts: #{Array(session[:titles]).join(", ")}
      script_name: #{request.script_name}
      new_post_url: #{new_post_url}
      ruby: #{RbConfig.ruby} via #{ENV.fetch("RUBY_VIA", "PATH")}
      bundle: #{ENV["BUNDLE_GEMFILE"]}
      rails: #{Rails.version} #{Rails.env}
    TEXT
  end

  def new
  end

  def create
    title = params.require(:post).require(:title)
    session[:titles] = Array(session[:titles]) + [title]
    redirect_to posts_url, notice: "created #{title}"
  end
end
"##,
    ),
    (
        "app/views/posts/new.html.erb",
        r##"<!doctype html>
<html>
<head><title>New post</title><%= csrf_meta_tags %></head>
<body>
<%= form_with scope: :post, url: posts_path do |f| %>
  <%= f.text_field :title %>
  <%= f.submit "Create" %>
<% end %>
<a href="<%= root_path %>">all posts</a>
</body>
</html>
"##,
    ),
    (
        "app/controllers/stream_controller.rb",
        r##"class StreamController < ApplicationController
  include ActionController::Live

  # Writes a chunk, waits until the test creates the gate file (which it does once it has
  # read that chunk), writes the rest: "late;" instead of "second;" when the gate stayed
  # shut, as it does when the first chunk was held back. The wait is on the file, looked
  # for every 10 ms for up to 20 s (within the test's 30 s read timeout), so that a loaded
  # machine's slow read is no "late;".
  def show
    response.headers["Content-Type"] = "text/plain"
    # Rack 2.2's Rack::ETag (in Rails' default stack) reads a whole body to digest it
    # unless it has a validator already, which holds a Live stream back until it ends
    # (rack/rack#1619); Rails' documentation for Live says to set one.
    response.headers["Last-Modified"] = Time.now.httpdate
    response.stream.write("first;")
    gate = File.join(ENV.fetch("GATES"), File.basename(params.require(:gate)))
    opened = 2000.times.any? do
      File.exist?(gate) || (sleep(0.01) && false)
    end
    response.stream.write(opened ? "second;" : "late;")
    response.stream.write("third;")
  ensure
    response.stream.close
  end
end
"##,
    ),
    (
        "app/controllers/uploads_controller.rb",
        r##"require "digest"

class UploadsController < ApplicationController
  def new
    render inline: <<~ERB
      <%= form_with url: upload_path, multipart: true do |f| %>
        <%= f.file_field :file %>
        <%= f.submit "Upload" %>
      <% end %>
    ERB
  end

  def create
    file = params.require(:file)
    render plain: "#{file.original_filename} #{file.size} #{Digest::SHA256.file(file.path).hexdigest}"
  end
end
"##,
    ),
];

/// A plain Rack app reporting whether Bundler's setup ran before it was loaded: under a
/// bundle of `rack` alone, the rails gem (installed on the system) cannot be required.
const BUNDLE_PROBE: &str = r##"rails = begin
  require "rails"
  "loadable"
rescue LoadError
  "refused"
end

run lambda { |env|
  text = "gemfile=#{ENV["BUNDLE_GEMFILE"]}\n" \
         "bundler=#{defined?(Bundler) ? Bundler.root : "none"}\n" \
         "rails=#{rails}\n" \
         "ruby=#{ENV.fetch("RUBY_VIA", "PATH")}\n"
  [200, { "content-type" => "text/plain" }, [text]]
}
"##;

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
env = {{ RAILS_ENV = "production", SECRET_KEY_BASE = "{secret}", GATES = "{dir}/gates" }}

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

fn parent_pid(pid: u32) -> u32 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    corral::process::memory::parse_stat_ppid(&stat).unwrap()
}
