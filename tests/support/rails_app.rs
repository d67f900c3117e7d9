//! The Rails 6.1 app `tests/app_rails.rs` serves (laid out as `rails new` would, mounted
//! under `/app`), the Ruby shim its pool runs, and the plain Rack probe of Bundler's setup.
//! The app records each load of itself in the file `LOADS_FILE` names, when set, and
//! `/whoami` answers with the pid and parent pid of the worker serving (for reforking).

/// The Ruby the Rails pool names with `ruby` (relative to the fixture dir): a shim in the way
/// rbenv's are, a script that sets up and runs a particular Ruby, so the app can tell it was
/// started through this path and not through the `ruby` a PATH lookup finds.
pub const RUBY_SHIM: (&str, &str) = (
    "rubies/3.1/bin/ruby",
    "#!/bin/sh\nRUBY_VIA=corral-test-shim exec /usr/bin/ruby3.1 \"$@\"\n",
);

/// The Rails app, file by file, relative to `blog/`.
pub const RAILS_APP: &[(&str, &str)] = &[
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
  get "whoami", to: "whoami#show"
end
"##,
    ),
    (
        "config/initializers/loads.rb",
        r##"# Each load of the app, recorded where the test asks: a pool that forks its workers
# (and reforks them from a promoted worker) loads it once.
if (loads = ENV["LOADS_FILE"])
  File.open(loads, "a") { |f| f.puts Process.pid }
end
"##,
    ),
    (
        "app/controllers/whoami_controller.rb",
        r##"class WhoamiController < ApplicationController
  def show
    render plain: "pid=#{Process.pid} ppid=#{Process.ppid}"
  end
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
pub const BUNDLE_PROBE: &str = r##"rails = begin
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
