//! Django 3.2 and Flask 2.2 (Debian's python3-django and python3-flask) on the native WSGI
//! worker: the very apps tests/app_python.rs runs on the pure-Python launcher
//! (tests/support/python_apps.rs), with `worker = "native"` added to their pools. The admin
//! login with its CSRF token and session, a Flask form checked against its session, a
//! multipart upload read through wsgi.input, and both frameworks' streamed answers arriving
//! chunk by chunk.

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
use std::sync::OnceLock;

use support::apps::{
    gate_name, input_value, sha256, shared, streamed_get, upload_bytes, Browser, Reaper,
};
use support::native::wsgi_worker;
use support::python_apps::{django_and_flask, ADMIN};
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

fn fixture() -> &'static Fixture {
    shared(&FIXTURE, start)
}

fn start() -> Fixture {
    let reaper = Reaper::start("corral-native-python-");
    let dir = reaper.dir.clone();
    let native = format!(
        "worker = \"native\"\nworker_path = \"{}\"",
        wsgi_worker().display()
    );
    let apps = django_and_flask(&dir, &native);
    let config = format!(
        r#"
[server]
runtime_dir = "{d}/run"
grace = "2s"
kill_timeout = "2s"

[[listen]]
address = "127.0.0.1:0"
protocol = "http"
{apps}"#,
        d = dir.display()
    );
    let corral = reaper.corral(&config);
    let addr = corral.http_addr();
    for warm in ["/django/", "/flask/"] {
        let r = http(addr, "GET", warm, &[], b"");
        assert_eq!(r.status, 200, "{warm}: {}\n{}", r.text(), corral.log());
    }
    // The pools really run on the native worker.
    assert!(corral.wait_log("corral-wsgi-worker: serving mysite.wsgi:application"));
    assert!(corral.wait_log("corral-wsgi-worker: serving flaskapp:app"));
    Fixture {
        reaper,
        corral,
        addr,
    }
}

#[test]
fn django_admin_login_needs_its_csrf_token_and_keeps_the_session() {
    let f = fixture();
    let mut browser = Browser::default();
    let target = "/django/admin/login/?next=/django/admin/";
    let login = browser.get(f.addr, target);
    assert_eq!(login.status, 200, "{}\n{}", login.text(), f.corral.log());
    let token = input_value(&login.text(), "csrfmiddlewaretoken").expect("a CSRF token");
    let fields = |password: &'static str| {
        vec![
            ("csrfmiddlewaretoken", token.clone()),
            ("username", ADMIN.0.to_owned()),
            ("password", password.to_owned()),
            ("next", "/django/admin/".to_owned()),
        ]
    };
    let post = |browser: &mut Browser, fields: &[(&str, String)]| {
        let fields: Vec<(&str, &str)> = fields.iter().map(|(k, v)| (*k, v.as_str())).collect();
        browser.post_form(f.addr, target, &fields)
    };
    // The token without its cookie: 403.
    let r = post(&mut Browser::default(), &fields(ADMIN.1));
    assert_eq!(r.status, 403, "{}", r.text());
    let r = post(&mut browser, &fields(ADMIN.1));
    assert_eq!(r.status, 302, "{}\n{}", r.text(), f.corral.log());
    assert_eq!(r.header("location"), Some("/django/admin/"));
    assert!(browser.cookie("sessionid").is_some(), "{:?}", r.headers);
    let r = browser.get(f.addr, "/django/admin/auth/user/");
    assert_eq!(r.status, 200, "{}", r.text());
    assert!(r.text().contains(">admin<"), "{}", r.text());
}

#[test]
fn django_streams_a_streaming_http_response() {
    let f = fixture();
    let (name, gate) = f.gate("django");
    let target = format!("/django/stream/?gate={name}");
    let r = streamed_get(f.addr, &target, ("first;", "second;"), &gate);
    assert_eq!(r.status, 200, "{}", f.corral.log());
    assert_eq!(r.text(), "first;second;third;");
}

#[test]
fn a_flask_form_post_needs_the_token_in_its_session_cookie() {
    let f = fixture();
    let mut browser = Browser::default();
    let form = browser.get(f.addr, "/flask/form");
    assert_eq!(form.status, 200, "{}\n{}", form.text(), f.corral.log());
    let token = input_value(&form.text(), "csrf").unwrap();
    let r = Browser::default().post_form(f.addr, "/flask/form", &[("csrf", &token)]);
    assert_eq!(r.status, 400, "{}", r.text());
    let r = browser.post_form(
        f.addr,
        "/flask/form",
        &[("csrf", &token), ("name", "Ada L.")],
    );
    assert_eq!(r.status, 302, "{}\n{}", r.text(), f.corral.log());
    let text = browser.get(f.addr, "/flask/").text();
    assert!(text.contains("name=Ada L.\nposts=1\n"), "{text}");
}

#[test]
fn flask_takes_a_multipart_upload_through_wsgi_input() {
    let f = fixture();
    let data = upload_bytes((5 << 20) + 12_345);
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
fn flask_streams_a_generator() {
    let f = fixture();
    let (name, gate) = f.gate("flask");
    let target = format!("/flask/stream?gate={name}");
    let r = streamed_get(f.addr, &target, ("first;", "second;"), &gate);
    assert_eq!(r.status, 200, "{}", f.corral.log());
    assert_eq!(r.text(), "first;second;third;");
}
