# Sourced by benches/refork.sh (bash): the real apps its rows serve, a small shop written
# twice, as a Rails 6.1 app (Debian's ruby-rails, run through config.ru) and as a Django 3.2
# project (Debian's python3-django): templates with a layout and helpers, a form with its
# CSRF token, JSON, a page of partials; production settings, no database. And the load
# both are warmed with.
#
#   write_rails_shop DIR; write_django_shop DIR   # the app in DIR (created)
#   $RAILS_PAGES, $DJANGO_PAGES                    # the pages each serves, all answering 200
#   REQUESTS=N load PORT CLIENTS PAGES...          # N GETs over PAGES; fails on any but 200

write() { mkdir -p "$(dirname "$1")"; cat > "$1"; }

write_rails_shop() { # DIR
  local RAILS=$1
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
}
RAILS_PAGES="/ /products/3 /products/new /about /api/products /products/17"

write_django_shop() { # DIR
  local DJANGO=$1
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
}
DJANGO_PAGES="/ /products/3/ /products/new/ /about/ /api/products/ /products/17/"

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
