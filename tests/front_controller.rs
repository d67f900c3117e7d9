//! `front_controller` on corral's HTTP listener, with real php-cgi behind it: paths that name
//! no script and nothing under the root run the controller with the request's own
//! REQUEST_URI and QUERY_STRING (nginx's `try_files $uri $uri/ /index.php?$args`), and every
//! way around that rule is closed: a missing script, a hidden path, a symlink out of the
//! root, `..`, NUL, an encoded `/`, a `//host` redirect, and a controller that is itself a
//! symlink out of the root.

mod support;

use std::collections::HashMap;
use std::os::unix::fs::symlink;

use support::peers::{self, write_file};
use support::server::{http, Corral, HttpResponse};

/// The controller answers with the variables a front controller routes by.
const CONTROLLER: &str = r#"<?php
header('Content-Type: text/plain');
$seen = [
    'controller' => 'yes',
    'method' => $_SERVER['REQUEST_METHOD'],
    'script_name' => $_SERVER['SCRIPT_NAME'],
    'script_filename' => $_SERVER['SCRIPT_FILENAME'],
    'request_uri' => $_SERVER['REQUEST_URI'],
    'query_string' => $_SERVER['QUERY_STRING'],
    'document_uri' => $_SERVER['DOCUMENT_URI'] ?? '-',
    'has_path_info' => array_key_exists('PATH_INFO', $_SERVER) ? 'yes' : 'no',
    'get_q' => $_GET['q'] ?? '-',
    'body' => file_get_contents('php://input'),
];
foreach ($seen as $k => $v) { echo "$k=$v\n"; }
"#;

struct Site {
    _dirs: Vec<tempfile::TempDir>,
    root: std::path::PathBuf,
    corral: Corral,
    _php: peers::Peer,
}

/// Three hosts on one php-cgi: `app.test` with a controller in its root and static files,
/// `plain.test` the same root without static files (so no static-file check runs first),
/// and `guard.test` whose controller is a symlink to a PHP file outside its root.
fn site() -> Site {
    let root_dir = peers::shared_dir();
    let outside = peers::shared_dir();
    let guard_dir = peers::shared_dir();
    let root = root_dir.path().to_path_buf();
    write_file(&root, "index.php", CONTROLLER);
    write_file(&root, "other.php", "<?php echo 'other';");
    write_file(&root, "style.css", "body { color: red }");
    std::fs::create_dir(root.join("dir")).unwrap();
    write_file(&root.join("dir"), "index.php", "<?php echo 'dir index';");
    std::fs::create_dir(root.join("empty-dir")).unwrap();
    std::fs::create_dir(root.join("evil.example")).unwrap();
    std::fs::create_dir(root.join(".git")).unwrap();
    write_file(&root.join(".git"), "HEAD", "ref: refs/heads/main");
    write_file(outside.path(), "index.php", "<?php echo 'outside ran';");
    write_file(outside.path(), "secret.txt", "the secret");
    symlink(outside.path(), root.join("out")).unwrap();
    symlink(
        outside.path().join("index.php"),
        guard_dir.path().join("index.php"),
    )
    .unwrap();

    let php = peers::php_cgi(root_dir.path());
    let config = format!(
        r#"
[server]
grace = "2s"
log_level = "debug"

[[listen]]
address = "127.0.0.1:0"
protocol = "http"

[pools.php]
servers = ["unix:{socket}"]

[[contexts]]
host = "app.test"
root = "{root}"
static_files = true
front_controller = "/index.php"
pool = "php"

[[contexts]]
host = "plain.test"
root = "{root}"
front_controller = "/index.php"
pool = "php"

[[contexts]]
host = "guard.test"
root = "{guard}"
front_controller = "/index.php"
pool = "php"
"#,
        socket = php.socket.display(),
        root = root.display(),
        guard = guard_dir.path().display(),
    );
    let corral = Corral::start(&config, 1);
    Site {
        _dirs: vec![root_dir, outside, guard_dir],
        root,
        corral,
        _php: php,
    }
}

impl Site {
    fn get(&self, target: &str) -> HttpResponse {
        self.request("GET", "app.test", target, b"")
    }

    fn request(&self, method: &str, host: &str, target: &str, body: &[u8]) -> HttpResponse {
        http(
            self.corral.http_addr(),
            method,
            target,
            &[("Host", host)],
            body,
        )
    }

    /// Asserts that the controller answered `target` and returns what it saw.
    fn controller(&self, target: &str) -> HashMap<String, String> {
        let r = self.get(target);
        assert_eq!(
            r.status,
            200,
            "{target}: {}\n{}",
            r.text(),
            self.corral.log()
        );
        let seen = lines_of(&r);
        assert_eq!(
            seen.get("controller").map(String::as_str),
            Some("yes"),
            "{target}: not the controller: {}",
            r.text()
        );
        seen
    }

    /// Asserts a 404 that the controller did not make.
    fn not_found(&self, target: &str) {
        self.not_found_on("app.test", target);
    }

    fn not_found_on(&self, host: &str, target: &str) {
        let r = self.request("GET", host, target, b"");
        assert_eq!(r.status, 404, "{target}: {}", r.text());
        assert!(
            !r.text().contains("controller=yes"),
            "{target}: {}",
            r.text()
        );
    }
}

/// The controller's `key=value` lines.
fn lines_of(r: &HttpResponse) -> HashMap<String, String> {
    r.text()
        .lines()
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect()
}

#[test]
fn missing_paths_run_the_controller_with_the_original_uri() {
    let s = site();
    let seen = s.controller("/2024/05/hello-world/?p=1&q=a%20b");
    assert_eq!(seen["script_name"], "/index.php");
    assert_eq!(
        seen["script_filename"],
        format!("{}/index.php", s.root.display())
    );
    assert_eq!(seen["request_uri"], "/2024/05/hello-world/?p=1&q=a%20b");
    assert_eq!(seen["query_string"], "p=1&q=a%20b");
    assert_eq!(seen["document_uri"], "/index.php");
    assert_eq!(seen["has_path_info"], "no");
    assert_eq!(seen["get_q"], "a b");

    let seen = s.controller("/about");
    assert_eq!(seen["request_uri"], "/about");
    assert_eq!(seen["query_string"], "");

    // Any method, body included (a REST route of Laravel or the WordPress JSON API).
    let r = s.request(
        "POST",
        "app.test",
        "/wp-json/wp/v2/posts",
        b"{\"title\":\"x\"}",
    );
    assert_eq!(r.status, 200, "{}", r.text());
    let seen = lines_of(&r);
    assert_eq!(seen["method"], "POST");
    assert_eq!(seen["body"], "{\"title\":\"x\"}");
    assert_eq!(seen["request_uri"], "/wp-json/wp/v2/posts");

    // A file name that looks like a script in another letter case is no script: served by
    // the controller, never run or shown.
    s.controller("/shell.PHP");
}

#[test]
fn existing_files_scripts_and_directories_keep_their_own_meaning() {
    let s = site();
    assert_eq!(s.get("/other.php").text(), "other");
    assert_eq!(s.get("/style.css").text(), "body { color: red }");
    let r = http(
        s.corral.http_addr(),
        "GET",
        "/style.css",
        &[("Host", "app.test"), ("Range", "bytes=0-3")],
        b"",
    );
    assert_eq!((r.status, r.text()), (206, "body".to_owned()));
    assert_eq!(s.get("/dir/").text(), "dir index");
    let seen = s.controller("/");
    assert_eq!(seen["request_uri"], "/");

    // An existing directory named without its '/': a redirect to it, query kept.
    let r = s.get("/dir");
    assert_eq!(r.status, 301);
    assert_eq!(r.header("location"), Some("/dir/"));
    let r = s.get("/dir?x=1");
    assert_eq!(r.header("location"), Some("/dir/?x=1"));
    // The Location is built from the normalised path: `//evil.example` must not become a
    // redirect to the host evil.example.
    let r = s.get("//evil.example");
    assert_eq!(r.status, 301);
    assert_eq!(r.header("location"), Some("/evil.example/"));

    // An existing directory with no index: not the controller's.
    s.not_found("/empty-dir/");

    // Without static files an existing file is not the controller's either.
    s.not_found_on("plain.test", "/style.css");
}

#[test]
fn a_missing_script_is_not_found_not_rewritten() {
    let s = site();
    // Otherwise a request would choose between the controller and a 404 by naming scripts.
    s.not_found("/missing.php");
    s.not_found("/missing.php/extra/info");
    s.not_found("/uploads/avatar.gif/x.php");
    assert!(
        s.corral.wait_log("missing.php does not exist"),
        "{}",
        s.corral.log()
    );
}

#[test]
fn hidden_paths_are_refused_without_looking() {
    let s = site();
    // Existing or not, the same 404: the answer says nothing about what is there. On
    // plain.test no static-file check runs before the front controller's.
    for host in ["app.test", "plain.test"] {
        s.not_found_on(host, "/.git/HEAD");
        s.not_found_on(host, "/.git/nothing-here");
        s.not_found_on(host, "/.env");
    }
    // `.well-known` is not hidden (RFC 8615): a missing one is the controller's.
    s.controller("/.well-known/acme-challenge/token");
}

#[test]
fn symlinks_out_of_the_root_count_as_missing() {
    let s = site();
    // root/out -> a directory outside the root holding index.php and secret.txt: neither is
    // served nor run, and the answer is the controller's, as for any missing name.
    let seen = s.controller("/out/secret.txt");
    assert_eq!(seen["request_uri"], "/out/secret.txt");
    let seen = s.controller("/out/");
    assert_eq!(
        seen["script_filename"],
        format!("{}/index.php", s.root.display())
    );
    s.controller("/out");
}

#[test]
fn dot_dot_nul_and_encoded_slashes_never_pick_a_script() {
    let s = site();
    assert_eq!(s.get("/a/../../index.php").status, 403);
    assert_eq!(s.get("/../etc/passwd").status, 403);
    assert_eq!(s.get("/missing%00").status, 400);
    assert_eq!(s.get("/index.php%00.css").status, 400);
    assert_eq!(s.get("/out%2Fsecret.txt").status, 400);
    assert_eq!(s.get("/x%2F..%2Fother.php").status, 400);
    assert_eq!(s.get("/dir\\index.php").status, 400);
    // Dot segments inside the root resolve first: the script named is the one run.
    assert_eq!(s.get("/missing/../other.php").text(), "other");
    for bad in ["/a/../../index.php", "/missing%00", "/out%2Fsecret.txt"] {
        assert!(
            !s.get(bad).text().contains("controller=yes"),
            "{bad} reached the controller"
        );
    }
}

#[test]
fn the_script_guard_checks_the_controller_too() {
    let s = site();
    // guard.test's index.php is a symlink to a PHP file outside its root.
    let r = s.request("GET", "guard.test", "/any/page", b"");
    assert_eq!(r.status, 404, "{}", r.text());
    assert!(!r.text().contains("outside ran"));
    assert!(
        s.corral.wait_log("outside the document root"),
        "{}",
        s.corral.log()
    );
}
