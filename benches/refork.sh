#!/usr/bin/env bash
# Question: how much memory does reforking (`refork_after`, docs/pools.md "Reforking") save
# on a real app? Issue 21's target: the summed PSS of 8 reforked Rails workers <= 0.8x that
# of 8 workers forked from the preloader alone.
#
# For Rails 6.1 (Debian's ruby-rails, through the Rack launcher) and Django 3.2 (Debian's
# python3-django, through the WSGI launcher), with 4 and 8 workers (static pool, preload),
# with and without `refork_after = $REFORK_AFTER`: 2,000 requests spread over a few real
# pages (templates with a layout and helpers, a form with its CSRF token, JSON, a page of
# partials; production settings, no database), from as many keep-alive clients as workers,
# then the pool is left to settle (every worker forked from the same template: a refork
# replaces the older workers one at a time), then PSS is read from /proc/PID/smaps_rollup of
# every worker (the processes of corral's tree that have no child) and of the whole tree
# (the preloader and the templates too); then 2,000 more requests and the same again. A
# request that is not answered 200 fails the run. PSS counts each shared page once over the
# processes sharing it, so the sums are comparable between rows.
# Prints a Markdown table to stdout and writes it as the `refork` section of OUT (default
# benches/RESULTS.md; OUT= prints only; benches/lib/results.sh).
#
#   APPS="rails django"  WORKERS="4 8"  REFORK_AFTER="[50, 200]"  REQUESTS=2000
# Needs: ruby with ruby-rails, python3-django for /usr/bin/python3, root (the workers run as
# nobody and their smaps_rollup is read).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
source benches/lib/results.sh
RESULTS_VARS="APPS WORKERS REFORK_AFTER REQUESTS CORRAL"
results_start "$@"
APPS=${APPS:-rails django}
WORKERS=${WORKERS:-4 8}
REFORK_AFTER=${REFORK_AFTER:-[50, 200]}
REQUESTS=${REQUESTS:-2000}
if [ -z "${CORRAL:-}" ]; then
  cargo build --release --quiet -p corral
  CORRAL=${CARGO_TARGET_DIR:-target}/release/corral
fi
CORRAL=$(realpath "$CORRAL")
RESULTS_BINARY=$CORRAL

SCRATCH=$(mktemp -d /tmp/corral-refork-bench.XXXXXX)
chmod 755 "$SCRATCH"
CORRAL_PID=
cleanup() {
  if [ -n "$CORRAL_PID" ]; then kill "$CORRAL_PID" 2>/dev/null || true; wait "$CORRAL_PID" 2>/dev/null || true; fi
  rm -rf "$SCRATCH"
}
trap cleanup EXIT

# ---- the apps -------------------------------------------------------------------------
write() { mkdir -p "$(dirname "$1")"; cat > "$1"; }

RAILS=$SCRATCH/shop
write "$RAILS/config.ru" <<'EOF'
require_relative "config/environment"
run Rails.application
EOF
write "$RAILS/config/environment.rb" <<'EOF'
require "rails"
require "active_model/railtie"
require "action_controller/railtie"
require "action_view/railtie"

module Shop
  class Application < Rails::Application
    config.load_defaults 6.1
    config.eager_load = true
    config.consider_all_requests_local = false
    config.public_file_server.enabled = false
    config.logger = ActiveSupport::Logger.new($stderr)
    config.log_level = :warn
    config.session_store :cookie_store, key: "_shop_session"
    config.root = File.expand_path("..", __dir__)
  end
end

Rails.application.initialize!
EOF
write "$RAILS/config/routes.rb" <<'EOF'
Rails.application.routes.draw do
  root "products#index"
  resources :products, only: [:index, :show, :new]
  get "about", to: "pages#about"
  get "api/products", to: "products#api"
end
EOF
write "$RAILS/config/locales/en.yml" <<'EOF'
en:
  shop:
    title: "The corral shop"
    about: "We sell %{count} things."
EOF
write "$RAILS/app/controllers/application_controller.rb" <<'EOF'
class ApplicationController < ActionController::Base
end
EOF
write "$RAILS/app/models/product.rb" <<'EOF'
class Product
  include ActiveModel::Model
  attr_accessor :id, :name, :price, :added
  def self.all
    @all ||= (1..30).map { |i| new(id: i, name: "Product #{i}", price: i * 3.25, added: Time.utc(2024, 1, i % 28 + 1)) }
  end
  def self.find(id) = all.fetch(id.to_i - 1)
  def persisted? = true
end
EOF
write "$RAILS/app/controllers/products_controller.rb" <<'EOF'
class ProductsController < ApplicationController
  def index
    @products = Product.all
  end

  def show
    @product = Product.find(params[:id])
  end

  def new
    @product = Product.new
  end

  def api
    render json: Product.all.map { |p| { id: p.id, name: p.name, price: p.price, url: product_url(p) } }
  end
end
EOF
write "$RAILS/app/controllers/pages_controller.rb" <<'EOF'
class PagesController < ApplicationController
  def about
  end
end
EOF
write "$RAILS/app/views/layouts/application.html.erb" <<'EOF'
<!doctype html>
<html><head><title><%= t("shop.title") %></title><%= csrf_meta_tags %></head>
<body><nav><%= link_to "Products", products_path %> | <%= link_to "About", about_path %></nav>
<%= yield %></body></html>
EOF
write "$RAILS/app/views/products/index.html.erb" <<'EOF'
<h1><%= pluralize(@products.size, "product") %></h1>
<ul><% @products.each do |p| %>
  <li><%= link_to truncate(p.name, length: 12), product_path(p) %>
      <%= number_to_currency(p.price) %>, added <%= time_ago_in_words(p.added) %> ago</li>
<% end %></ul>
EOF
write "$RAILS/app/views/products/show.html.erb" <<'EOF'
<h1><%= @product.name %></h1>
<p><%= number_to_currency(@product.price, unit: "EUR ") %> (<%= number_with_delimiter(@product.price * 1000) %> cents)</p>
<%= render partial: "shared/card", collection: Product.all.first(5), as: :product %>
EOF
write "$RAILS/app/views/products/new.html.erb" <<'EOF'
<%= form_with model: @product, url: products_path, scope: :product do |f| %>
  <%= f.label :name %> <%= f.text_field :name %>
  <%= f.label :price %> <%= f.number_field :price, step: 0.01 %>
  <%= f.submit "Create" %>
<% end %>
EOF
write "$RAILS/app/views/shared/_card.html.erb" <<'EOF'
<div class="card"><%= content_tag :strong, product.name %> <%= simple_format("price\n#{product.price}") %></div>
EOF
write "$RAILS/app/views/pages/about.html.erb" <<'EOF'
<p><%= t("shop.about", count: Product.all.size) %></p>
<%= render partial: "shared/card", collection: Product.all.last(3), as: :product %>
EOF
RAILS_PAGES="/ /products/3 /products/new /about /api/products /products/17"

DJANGO=$SCRATCH/site
write "$DJANGO/site_app/__init__.py" < /dev/null
write "$DJANGO/site_app/settings.py" <<'EOF'
import os
BASE = os.path.dirname(os.path.abspath(__file__))
SECRET_KEY = "bench-" + "x" * 40
DEBUG = False
ALLOWED_HOSTS = ["*"]
INSTALLED_APPS = ["django.contrib.humanize", "site_app"]
MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]
ROOT_URLCONF = "site_app.urls"
TEMPLATES = [{
    "BACKEND": "django.template.backends.django.DjangoTemplates",
    "DIRS": [os.path.join(os.path.dirname(BASE), "templates")],
    "APP_DIRS": False,
    "OPTIONS": {"context_processors": ["django.template.context_processors.request",
                                       "django.template.context_processors.csrf"]},
}]
DATABASES = {}
USE_TZ = True
USE_I18N = True
WSGI_APPLICATION = "site_app.wsgi.application"
EOF
write "$DJANGO/site_app/wsgi.py" <<'EOF'
import os
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "site_app.settings")
from django.core.wsgi import get_wsgi_application
application = get_wsgi_application()
EOF
write "$DJANGO/site_app/urls.py" <<'EOF'
from django.urls import path
from . import views
urlpatterns = [
    path("", views.index, name="index"),
    path("products/<int:pk>/", views.show, name="show"),
    path("products/new/", views.new, name="new"),
    path("about/", views.about, name="about"),
    path("api/products/", views.api, name="api"),
]
EOF
write "$DJANGO/site_app/views.py" <<'EOF'
import datetime
from django import forms
from django.http import JsonResponse
from django.shortcuts import render
from django.urls import reverse

PRODUCTS = [{"id": i, "name": "Product %d" % i, "price": i * 3.25,
             "added": datetime.datetime(2024, 1, i % 28 + 1, tzinfo=datetime.timezone.utc)}
            for i in range(1, 31)]

class ProductForm(forms.Form):
    name = forms.CharField(max_length=80)
    price = forms.DecimalField(decimal_places=2)
    notes = forms.CharField(widget=forms.Textarea, required=False)

def index(request):
    return render(request, "index.html", {"products": PRODUCTS})

def show(request, pk):
    return render(request, "show.html", {"product": PRODUCTS[pk - 1], "cards": PRODUCTS[:5]})

def new(request):
    return render(request, "new.html", {"form": ProductForm()})

def about(request):
    return render(request, "about.html", {"count": len(PRODUCTS), "cards": PRODUCTS[-3:]})

def api(request):
    return JsonResponse([dict(p, added=p["added"].isoformat(), url=reverse("show", args=[p["id"]]))
                         for p in PRODUCTS], safe=False)
EOF
write "$DJANGO/templates/base.html" <<'EOF'
<!doctype html>
<html><head><title>The corral shop</title></head>
<body><nav><a href="{% url 'index' %}">Products</a> | <a href="{% url 'about' %}">About</a></nav>
{% block content %}{% endblock %}</body></html>
EOF
write "$DJANGO/templates/index.html" <<'EOF'
{% extends "base.html" %}{% load humanize %}
{% block content %}<h1>{{ products|length }} product{{ products|pluralize }}</h1>
<ul>{% for p in products %}<li><a href="{% url 'show' p.id %}">{{ p.name|truncatechars:12 }}</a>
{{ p.price|floatformat:2|intcomma }}, added {{ p.added|naturaltime }}</li>{% endfor %}</ul>{% endblock %}
EOF
write "$DJANGO/templates/show.html" <<'EOF'
{% extends "base.html" %}{% load humanize %}
{% block content %}<h1>{{ product.name }}</h1><p>EUR {{ product.price|floatformat:2 }}</p>
{% for product in cards %}{% include "card.html" %}{% endfor %}{% endblock %}
EOF
write "$DJANGO/templates/card.html" <<'EOF'
<div class="card"><strong>{{ product.name|title }}</strong> {{ product.price|linebreaksbr }}</div>
EOF
write "$DJANGO/templates/new.html" <<'EOF'
{% extends "base.html" %}
{% block content %}<form method="post" action="{% url 'new' %}">{% csrf_token %}{{ form.as_p }}
<button>Create</button></form>{% endblock %}
EOF
write "$DJANGO/templates/about.html" <<'EOF'
{% extends "base.html" %}{% load humanize %}
{% block content %}<p>We sell {{ count|apnumber }} things.</p>
{% for product in cards %}{% include "card.html" %}{% endfor %}{% endblock %}
EOF
DJANGO_PAGES="/ /products/3/ /products/new/ /about/ /api/products/ /products/17/"

# ---- helpers --------------------------------------------------------------------------

# REQUESTS requests over PAGES from N keep-alive clients; fails on any answer but 200.
load() { # PORT N PAGES...
  python3 - "$@" <<'PY'
import http.client, sys, threading
port, clients, pages = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3:]
total = int(__import__("os").environ["REQUESTS"])
bad = []
def client(i):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    for n in range(i, total, clients):
        conn.request("GET", pages[n % len(pages)])
        r = conn.getresponse()
        r.read()
        if r.status != 200:
            bad.append((pages[n % len(pages)], r.status))
threads = [threading.Thread(target=client, args=(i,)) for i in range(clients)]
for t in threads: t.start()
for t in threads: t.join()
if bad:
    sys.exit("%d requests failed, e.g. %r" % (len(bad), bad[:3]))
PY
}

# corral's tree, and the trees of the promoted templates its LOG names (a promoted template
# outlives the template it came from, orphaned), once it has settled (every worker forked by
# one template, N of them): "WORKERS_PSS_KIB TOTAL_PSS_KIB TEMPLATES" (templates: processes
# with children).
settle_and_measure() { # CORRAL_PID N LOG
  python3 - "$@" <<'PY'
import os, re, sys, time
root, want, log = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
def tree():
    parent = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                stat = open("/proc/%s/stat" % d).read()
            except OSError:
                continue
            fields = stat.rsplit(")", 1)[1].split()
            if fields[0] != "Z":  # a zombie holds no memory and serves nothing
                parent[int(d)] = int(fields[1])
    kids = {}
    for p, pp in parent.items():
        kids.setdefault(pp, []).append(p)
    promoted = {int(m) for m in re.findall(r"worker promoted: .* pid=(\d+)", open(log).read())}
    out = out_of(root, kids)
    for p in promoted:
        if p in parent and p not in out:
            out |= {p} | out_of(p, kids)
    return sorted(out), kids, parent
def out_of(root, kids):
    seen, todo = set(), [root]
    while todo:
        for c in kids.get(todo.pop(), []):
            seen.add(c); todo.append(c)
    return seen
def pss(pid):
    for line in open("/proc/%d/smaps_rollup" % pid):
        if line.startswith("Pss:"):
            return int(line.split()[1])
    return 0
deadline = time.time() + 120
while True:
    procs, kids, parent = tree()
    leaves = [p for p in procs if not kids.get(p)]
    if len(leaves) == want and len({parent[p] for p in leaves}) == 1:
        time.sleep(1.0)
        again, kids2, _ = tree()
        if sorted(again) == sorted(procs):
            break
    if time.time() > deadline:
        sys.exit("the pool did not settle: %r" % procs)
    time.sleep(0.5)
templates = [p for p in procs if kids.get(p)]
print(sum(pss(p) for p in leaves), sum(pss(p) for p in procs), len(templates))
PY
}

run_one() { # APP WORKERS REFORK(on|off)
  local app=$1 n=$2 refork=$3 port dir keys pages
  dir=$SCRATCH/run-$app-$n-$refork
  # Traversable: the workers run as nobody and open the launcher corral writes in run/.
  mkdir -p "$dir"; chmod 755 "$dir"
  port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
  keys=""
  [ "$refork" = on ] && keys="refork_after = $REFORK_AFTER"
  if [ "$app" = rails ]; then
    pages=$RAILS_PAGES
    pool="app = \"rack:config.ru\"
cwd = \"$RAILS\"
env = { RAILS_ENV = \"production\", SECRET_KEY_BASE = \"$(printf 'be%.0s' {1..64})\" }"
  else
    pages=$DJANGO_PAGES
    pool="app = \"wsgi:site_app.wsgi:application\"
python = \"/usr/bin/python3\"
cwd = \"$DJANGO\""
  fi
  cat > "$dir/corral.toml" <<EOF
[server]
runtime_dir = "$dir/run"
kill_timeout = "5s"

[[listen]]
address = "127.0.0.1:$port"
protocol = "http"

[pools.app]
$pool
mode = "static"
max = $n
start_timeout = "120s"
queue_timeout = "120s"
$keys

[[contexts]]
prefix = "/"
pool = "app"
EOF
  "$CORRAL" run -c "$dir/corral.toml" > "$dir/log" 2>&1 &
  CORRAL_PID=$!
  for _ in $(seq 600); do
    curl -fs -o /dev/null "http://127.0.0.1:$port/" && break
    sleep 0.2
  done
  local first second
  # shellcheck disable=SC2086
  REQUESTS=$REQUESTS load "$port" "$n" $pages
  first=$(settle_and_measure "$CORRAL_PID" "$n" "$dir/log")
  # shellcheck disable=SC2086
  REQUESTS=$REQUESTS load "$port" "$n" $pages
  second=$(settle_and_measure "$CORRAL_PID" "$n" "$dir/log")
  local promoted
  promoted=$(grep -c "worker promoted:" "$dir/log" || true)
  kill "$CORRAL_PID"; wait "$CORRAL_PID" || true
  CORRAL_PID=
  echo "$first $second $promoted"
}

mib() { awk -v k="$1" 'BEGIN { printf "%.1f", k / 1024 }'; }

BODY=$SCRATCH/body.md
{
  echo "Summed PSS after $REQUESTS and $((2 * REQUESTS)) requests over a few real pages, from as many keep-alive clients as workers, once the pool settled; reforking with \`refork_after = $REFORK_AFTER\`. \"workers\" sums the workers (the processes with no child), \"all\" adds the templates alive (the preloader; with reforking the newest promoted template, and an older one until its last worker is replaced). Ratio: reforked workers over workers without reforking (target for 8 Rails workers: <= 0.80); \"all ratio\" the same for all the processes. Right after a promotion the new workers have served little, so a column taken just after one flatters reforking: the later column is the one to read."
  echo
  echo "| app | workers | refork | promotions | workers MiB after $REQUESTS | all MiB | ratio | all ratio | workers MiB after $((2 * REQUESTS)) | all MiB | ratio | all ratio |"
  echo "| --- | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"
} > "$BODY"
for app in $APPS; do
  for n in $WORKERS; do
    # Not in a subshell, so the exit trap can stop a corral a failure leaves running.
    run_one "$app" "$n" off > "$SCRATCH/row"
    read -r off_w1 off_a1 _ off_w2 off_a2 _ _ < "$SCRATCH/row"
    run_one "$app" "$n" on > "$SCRATCH/row"
    read -r on_w1 on_a1 _ on_w2 on_a2 _ promoted < "$SCRATCH/row"
    r1=$(awk -v a="$on_w1" -v b="$off_w1" 'BEGIN { printf "%.2f", a / b }')
    r2=$(awk -v a="$on_w2" -v b="$off_w2" 'BEGIN { printf "%.2f", a / b }')
    a1=$(awk -v a="$on_a1" -v b="$off_a1" 'BEGIN { printf "%.2f", a / b }')
    a2=$(awk -v a="$on_a2" -v b="$off_a2" 'BEGIN { printf "%.2f", a / b }')
    echo "| $app | $n | off | 0 | $(mib "$off_w1") | $(mib "$off_a1") | | | $(mib "$off_w2") | $(mib "$off_a2") | | |" >> "$BODY"
    echo "| $app | $n | on | $promoted | $(mib "$on_w1") | $(mib "$on_a1") | $r1 | $a1 | $(mib "$on_w2") | $(mib "$on_a2") | $r2 | $a2 |" >> "$BODY"
    tail -n 2 "$BODY" >&2
  done
done
cat "$BODY"
results_write refork "Reforking: summed PSS with and without refork_after" "$BODY"
