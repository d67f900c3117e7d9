//! The Python apps the WSGI tests run, as people deploy them: a Django 3.2 project and a
//! Flask 2.2 app (Debian's python3-django and python3-flask) with the views and routes the
//! tests ask for. Shared by tests/app_python.rs (the pure-Python launcher) and
//! tests/wsgi_native_apps.rs (the native worker), so both run the very same apps. Django's
//! `/whoami/` answers with the pid and parent pid of the worker serving, and the project
//! records each load of itself in the file `LOADS_FILE` names, when set (for reforking).

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use super::apps::{chmod, setup, writable_dir, write_tree};

/// Debian's Python, for which python3-django and python3-flask are installed.
pub const PYTHON: &str = "/usr/bin/python3";

/// The Django admin user the fixture creates.
pub const ADMIN: (&str, &str) = ("admin", "corral-test-Pa55word");

/// Waits for the gate file named by `?gate=` (in `$GATES`), looked for every 10 ms for up
/// to 20 s (within the test's 30 s read timeout), then says whether it appeared; shared by
/// the Django and Flask streams.
pub const GATE_PY: &str = r#"import os, time

def wait(name):
    path = os.path.join(os.environ["GATES"], os.path.basename(name))
    for _ in range(2000):
        if os.path.exists(path):
            return True
        time.sleep(0.01)
    return False
"#;

/// A Django project as `django-admin startproject mysite` lays it out, trimmed, with a few
/// views of the test's own.
pub const DJANGO: &[(&str, &str)] = &[
    (
        "manage.py",
        r#"#!/usr/bin/env python3
import os, sys

if __name__ == "__main__":
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "mysite.settings")
    from django.core.management import execute_from_command_line
    execute_from_command_line(sys.argv)
"#,
    ),
    ("mysite/__init__.py", ""),
    ("mysite/gate.py", GATE_PY),
    (
        "mysite/settings.py",
        r#"import os

SECRET_KEY = "corral-test-not-secret-0123456789abcdefghijklmnopqrstuvwxyz"
DEBUG = False
ALLOWED_HOSTS = ["localhost", "127.0.0.1"]
INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
]
MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]
ROOT_URLCONF = "mysite.urls"
TEMPLATES = [{
    "BACKEND": "django.template.backends.django.DjangoTemplates",
    "DIRS": [],
    "APP_DIRS": True,
    "OPTIONS": {"context_processors": [
        "django.template.context_processors.request",
        "django.contrib.auth.context_processors.auth",
        "django.contrib.messages.context_processors.messages",
    ]},
}]
WSGI_APPLICATION = "mysite.wsgi.application"
DATABASES = {"default": {"ENGINE": "django.db.backends.sqlite3",
                         "NAME": os.environ["DJANGO_DB"]}}
USE_TZ = True
DEFAULT_AUTO_FIELD = "django.db.models.AutoField"
STATIC_URL = "/static/"
STATIC_ROOT = os.environ["DJANGO_STATIC_ROOT"]
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"console": {"class": "logging.StreamHandler"}},
    "loggers": {"django": {"handlers": ["console"], "level": "WARNING"}},
}
"#,
    ),
    (
        "mysite/urls.py",
        r#"from django.contrib import admin
from django.urls import path

from . import views

urlpatterns = [
    path("admin/", admin.site.urls),
    path("", views.index, name="index"),
    path("stream/", views.stream, name="stream"),
    path("upload/", views.upload, name="upload"),
    path("whoami/", views.whoami, name="whoami"),
]
"#,
    ),
    (
        "mysite/views.py",
        r#"import hashlib, os, sys

from django.http import HttpResponse, StreamingHttpResponse
from django.template import engines
from django.templatetags.static import static
from django.urls import reverse

from .gate import wait

def index(request):
    text = "script_name=%s\nadmin=%s\nupload=%s\nstatic=%s\npython=%s\n" % (
        request.META["SCRIPT_NAME"], reverse("admin:index"), reverse("upload"),
        static("admin/css/base.css"), sys.executable)
    return HttpResponse(text, content_type="text/plain")

def stream(request):
    gate = request.GET["gate"]
    def body():
        yield b"first;"
        yield b"second;" if wait(gate) else b"late;"
        yield b"third;"
    return StreamingHttpResponse(body(), content_type="text/plain")

UPLOAD_FORM = """<form method="post" enctype="multipart/form-data" action="{{ request.path }}">
{% csrf_token %}<input type="file" name="file"><button>Upload</button></form>"""

def upload(request):
    if request.method == "POST":
        f = request.FILES["file"]
        digest = hashlib.sha256()
        for chunk in f.chunks():
            digest.update(chunk)
        return HttpResponse("%s %d %s" % (f.name, f.size, digest.hexdigest()),
                            content_type="text/plain")
    return HttpResponse(engines["django"].from_string(UPLOAD_FORM).render(request=request))

def whoami(request):
    return HttpResponse("pid=%d ppid=%d" % (os.getpid(), os.getppid()), content_type="text/plain")
"#,
    ),
    (
        "mysite/wsgi.py",
        r#"import os

from django.core.wsgi import get_wsgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "mysite.settings")
application = get_wsgi_application()

# Each load of the project, recorded where the test asks: a pool that forks its workers
# (and reforks them from a promoted worker) loads it once.
if os.environ.get("LOADS_FILE"):
    with open(os.environ["LOADS_FILE"], "a") as f:
        f.write("%d\n" % os.getpid())
"#,
    ),
];

/// What the Django fixture runs once before corral starts: the database, the admin user,
/// the static files.
pub const DJANGO_SETUP: &str = r#"import os, django
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "mysite.settings")
django.setup()
from django.core.management import call_command
from django.contrib.auth.models import User
call_command("migrate", interactive=False, verbosity=0)
call_command("collectstatic", interactive=False, verbosity=0)
User.objects.create_superuser(os.environ["ADMIN_USER"], "admin@example.com",
                              os.environ["ADMIN_PASSWORD"])
"#;

/// A Flask app: a form whose token lives in the signed session cookie, a stream, an upload,
/// and a log of every path it is asked for (so the test can tell corral served the static
/// files).
pub const FLASK: &str = r#"import hashlib, os, secrets, sys

from flask import Flask, Response, abort, redirect, render_template_string, request, session, url_for

from gate import wait

app = Flask(__name__, static_folder=os.environ["FLASK_STATIC"])
app.secret_key = "corral-test-flask-not-secret"

@app.before_request
def note_path():
    with open(os.environ["FLASK_SEEN"], "a") as seen:
        seen.write(request.script_root + request.path + "\n")

@app.route("/")
def index():
    text = "script_root=%s\nform=%s\nstatic=%s\nname=%s\nposts=%d\npython=%s\n" % (
        request.script_root, url_for("form"), url_for("static", filename="app.css"),
        session.get("name", ""), session.get("posts", 0), sys.executable)
    return Response(text, mimetype="text/plain")

FORM = """<form method="post" action="{{ url_for('form') }}">
<input type="hidden" name="csrf" value="{{ token }}"><input name="name"></form>"""

@app.route("/form", methods=["GET", "POST"])
def form():
    if request.method == "POST":
        token = session.pop("csrf", None)
        if token is None or request.form.get("csrf") != token:
            abort(400)
        session["name"] = request.form["name"]
        session["posts"] = session.get("posts", 0) + 1
        return redirect(url_for("index"))
    session["csrf"] = secrets.token_urlsafe(16)
    return render_template_string(FORM, token=session["csrf"])

@app.route("/stream")
def stream():
    gate = request.args["gate"]
    def body():
        yield "first;"
        yield "second;" if wait(gate) else "late;"
        yield "third;"
    return Response(body(), mimetype="text/plain")

@app.route("/upload", methods=["POST"])
def upload():
    f = request.files["file"]
    digest, size = hashlib.sha256(), 0
    while True:
        chunk = f.stream.read(65536)
        if not chunk:
            break
        digest.update(chunk)
        size += len(chunk)
    return Response("%s %d %s" % (f.filename, size, digest.hexdigest()), mimetype="text/plain")
"#;

/// Lays out the Django project and the Flask app in `dir` (with `gates/` and the workers'
/// writable `data/`), prepares Django's database, admin user and static files, and returns
/// the configuration text of their two pools (`extra` added to each) and their contexts:
/// Django under `/django` with its static files from corral at `/static`, Flask under
/// `/flask` with its static folder from corral.
pub fn django_and_flask(dir: &Path, extra: &str) -> String {
    let d = dir.display();
    write_tree(&dir.join("django"), DJANGO);
    write_tree(
        dir,
        &[
            ("flask/flaskapp.py", FLASK),
            ("flask/gate.py", GATE_PY),
            (
                "public/flask/static/app.css",
                "body { color: #2a5d2a; } /* served by corral */\n",
            ),
        ],
    );
    // What the workers (nobody, under a root corral) may write: the database, Flask's log.
    let data = writable_dir(&dir.join("data"));
    std::fs::create_dir(dir.join("gates")).unwrap();
    chmod(&dir.join("gates"), 0o755);
    let django_env = [
        ("DJANGO_DB", format!("{}/db.sqlite3", data.display())),
        ("DJANGO_STATIC_ROOT", format!("{d}/public/static")),
    ];

    let mut prepare = Command::new(PYTHON);
    prepare
        .args(["-c", DJANGO_SETUP])
        .current_dir(dir.join("django"))
        .envs(django_env.iter().map(|(k, v)| (k, v)))
        .env("ADMIN_USER", ADMIN.0)
        .env("ADMIN_PASSWORD", ADMIN.1);
    setup(prepare, Duration::from_secs(120));
    chmod(&data.join("db.sqlite3"), 0o666);
    format!(
        r#"
[pools.django]
app = "wsgi:mysite.wsgi:application"
python = "{PYTHON}"
cwd = "{d}/django"
mode = "static"
max = 2
queue_timeout = "60s"
{extra}
env = {{ DJANGO_DB = "{db}", DJANGO_STATIC_ROOT = "{d}/public/static", GATES = "{d}/gates" }}

[pools.flask]
app = "wsgi:flaskapp:app"
python = "{PYTHON}"
cwd = "{d}/flask"
mode = "static"
max = 2
queue_timeout = "60s"
{extra}
env = {{ FLASK_STATIC = "{d}/public/flask/static", FLASK_SEEN = "{d}/data/flask-seen", GATES = "{d}/gates" }}

[[contexts]]
prefix = "/django"
pool = "django"

# collectstatic's output, served by corral: /static/admin/... is {d}/public/static/admin/...
[[contexts]]
prefix = "/static"
root = "{d}/public"
static_files = true
pool = "django"

[[contexts]]
prefix = "/flask"
pool = "flask"

# Flask's static folder, served by corral before the app would be asked.
[[contexts]]
prefix = "/flask/static"
root = "{d}/public"
static_files = true
pool = "flask"

"#,
        db = django_env[0].1,
    )
}
