//! Django 3.2 and Flask 2.2 (Debian's python3-django and python3-flask) through corral's
//! embedded WSGI launcher, as people deploy them, and an app in a real virtualenv. One corral
//! serves them all:
//!
//! - Django, mounted under `/django`: the admin login with its CSRF token and session
//!   cookie (403 without the token), an upload form with its token, a
//!   `StreamingHttpResponse`, `reverse()` and `request.path` under the mount, and the admin's
//!   static files (`collectstatic` into the static root) served by corral itself from
//!   `/static` (Django with `DEBUG = False` serves none);
//! - Flask, mounted under `/flask`: a form POST checked against a token kept in the signed
//!   session cookie, a streamed generator, a multipart upload, `url_for` under the mount, and
//!   its static folder served by corral (the app never sees those requests);
//! - a WSGI app importing a PyPI package installed with pip into a venv made by the test
//!   (Debian's Python lacks it), run by the pool's `virtualenv`.
//!
//! A pool of its own on the same Django project checks reforking (`refork_after`) under a
//! little load.
//!
//! Django and Flask run on `python = "/usr/bin/python3"`: Debian's packages are for
//! Debian's Python, which need not be the `python3` first on PATH (a pyenv's, say).

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing,
    missing_docs
)]

mod support;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use std::time::Duration;

use support::apps::{
    gate_name, input_value, setup, sha256, shared, streamed_get, upload_bytes, writable_dir,
    write_tree, Browser, Reaper,
};
use support::python_apps::{django_and_flask, ADMIN, PYTHON};
use support::server::{http, Corral};

/// The PyPI package installed into the test's venv, which Debian's Python must lack.
const VENV_PACKAGE: &str = "humanize";

/// A plain WSGI app that needs the venv's package, and says which Python runs it.
const VENV_APP: &str = r#"import os, sys

import humanize

def application(environ, start_response):
    text = "size=%s\nmodule=%s\nprefix=%s\nexecutable=%s\nvirtual_env=%s\npath0=%s\n" % (
        humanize.naturalsize(3 << 20, binary=True), humanize.__file__, sys.prefix,
        sys.executable, os.environ.get("VIRTUAL_ENV", ""),
        os.environ.get("PATH", "").split(os.pathsep)[0])
    body = text.encode()
    start_response("200 OK", [("Content-Type", "text/plain"),
                              ("Content-Length", str(len(body)))])
    return [body]
"#;

struct Fixture {
    reaper: Reaper,
    corral: Corral,
    addr: SocketAddr,
}

impl Fixture {
    fn dir(&self) -> &Path {
        &self.reaper.dir
    }

    fn gate(&self, tag: &str) -> (String, PathBuf) {
        let name = gate_name(tag);
        let path = self.dir().join("gates").join(&name);
        (name, path)
    }

    /// The paths the Flask app was asked for so far.
    fn flask_seen(&self) -> String {
        std::fs::read_to_string(self.dir().join("data/flask-seen")).unwrap_or_default()
    }
}

static FIXTURE: OnceLock<Result<Fixture, String>> = OnceLock::new();

fn fixture() -> &'static Fixture {
    shared(&FIXTURE, start)
}

fn start() -> Fixture {
    let reaper = Reaper::start("corral-python-");
    let dir = reaper.dir.clone();
    let d = dir.display();
    write_tree(&dir, &[("venvapp/venvapp.py", VENV_APP)]);
    let apps = django_and_flask(&dir, "");
    make_venv(&dir.join("venv"));

    let config = format!(
        r#"
[server]
runtime_dir = "{d}/run"
grace = "2s"
kill_timeout = "2s"

[[listen]]
address = "127.0.0.1:0"
protocol = "http"
{apps}
[pools.venv]
app = "wsgi:venvapp"
virtualenv = "{d}/venv"
cwd = "{d}/venvapp"
mode = "static"
max = 1
queue_timeout = "60s"

[[contexts]]
prefix = "/venv"
pool = "venv"
"#
    );
    let corral = reaper.corral(&config);
    let addr = corral.http_addr();
    for warm in ["/django/", "/flask/", "/venv/"] {
        let r = http(addr, "GET", warm, &[], b"");
        assert_eq!(r.status, 200, "{warm}: {}\n{}", r.text(), corral.log());
    }
    Fixture {
        reaper,
        corral,
        addr,
    }
}

/// A venv of Debian's Python without the system's site-packages, with [`VENV_PACKAGE`]
/// installed into it from PyPI.
fn make_venv(venv: &Path) {
    // Otherwise the test would prove nothing.
    let out = Command::new(PYTHON)
        .args(["-c", &format!("import {VENV_PACKAGE}")])
        .output()
        .unwrap();
    assert!(
        !out.status.success(),
        "{PYTHON} has {VENV_PACKAGE} already: pick a package it lacks"
    );
    let mut create = Command::new(PYTHON);
    create.args(["-m", "venv"]).arg(venv);
    setup(create, Duration::from_secs(120));
    let mut pip = Command::new(venv.join("bin/python"));
    pip.args([
        "-m",
        "pip",
        "install",
        "--quiet",
        "--disable-pip-version-check",
    ])
    .args(["--no-input", "--root-user-action=ignore", VENV_PACKAGE]);
    setup(pip, Duration::from_secs(180));
    // Readable by the workers' user whatever the umask.
    let mut read = Command::new("chmod");
    read.args(["-R", "a+rX"]).arg(venv);
    setup(read, Duration::from_secs(30));
}

#[test]
fn django_sees_its_mount_point_in_script_name_and_reverse() {
    let f = fixture();
    let r = http(f.addr, "GET", "/django/", &[], b"");
    assert_eq!(r.status, 200, "{}\n{}", r.text(), f.corral.log());
    let text = r.text();
    assert!(text.contains("script_name=/django\n"), "{text}");
    assert!(text.contains("admin=/django/admin/\n"), "{text}");
    assert!(text.contains("upload=/django/upload/\n"), "{text}");
    assert!(
        text.contains("static=/static/admin/css/base.css\n"),
        "{text}"
    );
    assert!(text.contains(&format!("python={PYTHON}\n")), "{text}");
    // Django's own 404 (DEBUG off), from under the mount.
    let r = http(f.addr, "GET", "/django/no/such/page/", &[], b"");
    assert_eq!(r.status, 404, "{}", r.text());
}

#[test]
fn django_admin_login_needs_its_csrf_token_and_keeps_the_session() {
    let f = fixture();
    let mut browser = Browser::default();
    let r = browser.get(f.addr, "/django/admin/");
    assert_eq!(r.status, 302, "{}", r.text());
    assert_eq!(
        r.header("location"),
        Some("/django/admin/login/?next=/django/admin/")
    );
    let login = browser.get(f.addr, "/django/admin/login/?next=/django/admin/");
    assert_eq!(login.status, 200, "{}\n{}", login.text(), f.corral.log());
    let html = login.text();
    assert!(
        html.contains("action=\"/django/admin/login/?next=/django/admin/\""),
        "{html}"
    );
    let token = input_value(&html, "csrfmiddlewaretoken").expect("a CSRF token in the form");
    assert!(browser.cookie("csrftoken").is_some(), "{:?}", login.headers);
    let fields = |token: &str, password: &str| {
        vec![
            ("csrfmiddlewaretoken", token.to_owned()),
            ("username", ADMIN.0.to_owned()),
            ("password", password.to_owned()),
            ("next", "/django/admin/".to_owned()),
        ]
    };
    let post = |browser: &mut Browser, fields: &[(&str, String)]| {
        let fields: Vec<(&str, &str)> = fields.iter().map(|(k, v)| (*k, v.as_str())).collect();
        browser.post_form(f.addr, "/django/admin/login/?next=/django/admin/", &fields)
    };

    // Without the token, or with the token but without its cookie: 403, no session.
    let r = post(&mut browser, &fields(&token, ADMIN.1)[1..]);
    assert_eq!(r.status, 403, "{}", r.text());
    let mut stranger = Browser::default();
    let r = post(&mut stranger, &fields(&token, ADMIN.1));
    assert_eq!(r.status, 403, "{}", r.text());
    assert!(stranger.cookie("sessionid").is_none());

    // A wrong password: the form again, no session.
    let r = post(&mut browser, &fields(&token, "wrong"));
    assert_eq!(r.status, 200, "{}", r.text());
    assert!(
        r.text().contains("Please enter the correct username"),
        "{}",
        r.text()
    );
    assert!(browser.cookie("sessionid").is_none());

    let r = post(&mut browser, &fields(&token, ADMIN.1));
    assert_eq!(r.status, 302, "{}\n{}", r.text(), f.corral.log());
    assert_eq!(r.header("location"), Some("/django/admin/"));
    assert!(browser.cookie("sessionid").is_some(), "{:?}", r.headers);
    let r = browser.get(f.addr, "/django/admin/");
    assert_eq!(r.status, 200, "{}", r.text());
    let html = r.text();
    assert!(html.contains("Site administration"), "{html}");
    assert!(html.contains("href=\"/django/admin/auth/user/\""), "{html}");
    let r = browser.get(f.addr, "/django/admin/auth/user/");
    assert_eq!(r.status, 200, "{}", r.text());
    assert!(r.text().contains(">admin<"), "{}", r.text());
}

#[test]
fn django_static_files_come_from_corral() {
    let f = fixture();
    let html = http(f.addr, "GET", "/django/admin/login/", &[], b"").text();
    assert!(
        html.contains("href=\"/static/admin/css/base.css\""),
        "{html}"
    );
    let r = http(f.addr, "GET", "/static/admin/css/base.css", &[], b"");
    assert_eq!(r.status, 200, "{}\n{}", r.text(), f.corral.log());
    assert_eq!(r.header("content-type"), Some("text/css; charset=utf-8"));
    let on_disk = std::fs::read(f.dir().join("public/static/admin/css/base.css")).unwrap();
    assert!(
        r.body == on_disk,
        "the stylesheet differs from collectstatic's"
    );
    // Django with DEBUG off serves no static file itself: a miss is corral's 404 too.
    let r = http(f.addr, "GET", "/static/admin/css/missing.css", &[], b"");
    assert_eq!(r.status, 404, "{}", r.text());
}

#[test]
fn django_streams_a_streaming_http_response() {
    let f = fixture();
    let (name, gate) = f.gate("django");
    let r = streamed_get(
        f.addr,
        &format!("/django/stream/?gate={name}"),
        ("first;", "second;"),
        &gate,
    );
    assert_eq!(r.status, 200, "{}", f.corral.log());
    assert_eq!(r.text(), "first;second;third;");
}

#[test]
fn django_takes_an_upload_with_its_csrf_token() {
    let f = fixture();
    let mut browser = Browser::default();
    let form = browser.get(f.addr, "/django/upload/");
    assert_eq!(form.status, 200, "{}\n{}", form.text(), f.corral.log());
    let html = form.text();
    assert!(html.contains("action=\"/django/upload/\""), "{html}");
    let token = input_value(&html, "csrfmiddlewaretoken").unwrap();
    // Over Django's 2.5 MB in-memory limit, so it goes through a temporary file.
    let data = upload_bytes(3 << 20);
    let r = browser.post_multipart(
        f.addr,
        "/django/upload/",
        &[("csrfmiddlewaretoken", &token)],
        ("file", "blob.bin", &data),
    );
    assert_eq!(r.status, 200, "{}\n{}", r.text(), f.corral.log());
    assert_eq!(
        r.text(),
        format!("blob.bin {} {}", data.len(), sha256(&data))
    );
    let r = Browser::default().post_multipart(f.addr, "/django/upload/", &[], ("file", "x", b"x"));
    assert_eq!(r.status, 403, "{}", r.text());
}

#[test]
fn flask_sees_its_mount_point_in_script_root_and_url_for() {
    let f = fixture();
    let r = http(f.addr, "GET", "/flask/", &[], b"");
    assert_eq!(r.status, 200, "{}\n{}", r.text(), f.corral.log());
    let text = r.text();
    assert!(text.contains("script_root=/flask\n"), "{text}");
    assert!(text.contains("form=/flask/form\n"), "{text}");
    assert!(text.contains("static=/flask/static/app.css\n"), "{text}");
    assert!(text.contains(&format!("python={PYTHON}\n")), "{text}");
}

#[test]
fn a_flask_form_post_needs_the_token_in_its_session_cookie() {
    let f = fixture();
    let mut browser = Browser::default();
    let form = browser.get(f.addr, "/flask/form");
    assert_eq!(form.status, 200, "{}\n{}", form.text(), f.corral.log());
    let html = form.text();
    assert!(html.contains("action=\"/flask/form\""), "{html}");
    let token = input_value(&html, "csrf").unwrap();
    assert!(browser.cookie("session").is_some(), "{:?}", form.headers);

    // The same token from a client without the session cookie: refused.
    let r = Browser::default().post_form(
        f.addr,
        "/flask/form",
        &[("csrf", &token), ("name", "mallory")],
    );
    assert_eq!(r.status, 400, "{}", r.text());

    let r = browser.post_form(
        f.addr,
        "/flask/form",
        &[("csrf", &token), ("name", "Ada L.")],
    );
    assert_eq!(r.status, 302, "{}\n{}", r.text(), f.corral.log());
    assert!(
        r.header("location").is_some_and(|l| l.ends_with("/flask/")),
        "{:?}",
        r.headers
    );
    let text = browser.get(f.addr, "/flask/").text();
    assert!(text.contains("name=Ada L.\nposts=1\n"), "{text}");

    // The token was used up: posting it again is refused, and the session is unchanged.
    let r = browser.post_form(
        f.addr,
        "/flask/form",
        &[("csrf", &token), ("name", "again")],
    );
    assert_eq!(r.status, 400, "{}", r.text());
}

#[test]
fn flask_streams_a_generator() {
    let f = fixture();
    let (name, gate) = f.gate("flask");
    let r = streamed_get(
        f.addr,
        &format!("/flask/stream?gate={name}"),
        ("first;", "second;"),
        &gate,
    );
    assert_eq!(r.status, 200, "{}", f.corral.log());
    assert_eq!(r.text(), "first;second;third;");
}

#[test]
fn flask_takes_a_multipart_upload() {
    let f = fixture();
    let data = upload_bytes((1 << 20) + 12_345);
    let r = Browser::default().post_multipart(
        f.addr,
        "/flask/upload",
        &[("note", "a field before the file")],
        ("file", "photo.raw", &data),
    );
    assert_eq!(r.status, 200, "{}\n{}", r.text(), f.corral.log());
    assert_eq!(
        r.text(),
        format!("photo.raw {} {}", data.len(), sha256(&data))
    );
}

#[test]
fn flask_static_files_come_from_corral_and_never_reach_the_app() {
    let f = fixture();
    let r = http(f.addr, "GET", "/flask/static/app.css", &[], b"");
    assert_eq!(r.status, 200, "{}\n{}", r.text(), f.corral.log());
    assert_eq!(r.header("content-type"), Some("text/css; charset=utf-8"));
    assert!(r.text().contains("served by corral"), "{}", r.text());
    // The app itself is asked for other paths, and they are logged.
    assert_eq!(http(f.addr, "GET", "/flask/", &[], b"").status, 200);
    let seen = f.flask_seen();
    assert!(seen.contains("/flask/\n"), "{seen}");
    assert!(!seen.contains("/flask/static/"), "{seen}");
}

#[test]
fn a_virtualenv_pool_runs_the_venvs_python_with_its_packages() {
    let f = fixture();
    let r = http(f.addr, "GET", "/venv/", &[], b"");
    assert_eq!(r.status, 200, "{}\n{}", r.text(), f.corral.log());
    let text = r.text();
    let venv = f.dir().join("venv");
    let venv = venv.display();
    assert!(text.contains("size=3.0 MiB\n"), "{text}");
    assert!(text.contains(&format!("module={venv}/lib/")), "{text}");
    assert!(text.contains(&format!("prefix={venv}\n")), "{text}");
    assert!(
        text.contains(&format!("executable={venv}/bin/python\n")),
        "{text}"
    );
    // As bin/activate would have it, for what the app starts.
    assert!(text.contains(&format!("virtual_env={venv}\n")), "{text}");
    assert!(text.contains(&format!("path0={venv}/bin\n")), "{text}");
    assert!(
        f.corral.log().contains(&format!("virtualenv {venv}")),
        "{}",
        f.corral.log()
    );
}

/// Reforking on Django: a preloaded pool of 3 workers with `refork_after = [20]` serves 300
/// requests over a few pages (the admin's login form, the upload form) from 3 clients with
/// no failed answer; a worker that served 20 is promoted to be the template (it was forked
/// by the preloader corral started), every worker then answering is its child, and the
/// project was loaded once, by the preloader (`support::reforking` says in full what is
/// checked).
#[test]
fn a_reforked_django_pool_serves_from_a_promoted_worker_and_loads_once() {
    let f = fixture();
    let d = f.dir().display();
    // Written by the preloader, which runs as the workers' user.
    let loads = writable_dir(&f.dir().join("loads-refork")).join("loads");
    let app = format!(
        r#"app = "wsgi:mysite.wsgi:application"
python = "{PYTHON}"
cwd = "{d}/django"
env = {{ DJANGO_DB = "{d}/data/db.sqlite3", DJANGO_STATIC_ROOT = "{d}/public/static", GATES = "{d}/gates", LOADS_FILE = "{loads}" }}"#,
        loads = loads.display(),
    );
    let config = support::reforking::config(&f.dir().join("run-refork"), "django", "/django", &app);
    let corral = f.reaper.corral(&config);
    support::reforking::serves_from_a_promoted_worker(
        &corral,
        "django",
        &["/django/", "/django/admin/login/", "/django/upload/"],
        "/django/whoami/",
        &loads,
    );
}
