//! The guard between a URL and code execution, tried as an attacker would, against one corral
//! that spawns real php-cgi workers behind an HTTP, a FastCGI and an SCGI listener.
//!
//! php-cgi has no `security.limit_extensions`: with its default `cgi.fix_pathinfo=1` a request
//! for `/uploads/avatar.gif/x.php` walks back to the gif and runs it. Every case here asserts
//! the status, that no PHP ran (the planted scripts leave a marker file when they run, and
//! corral's `accepted conn` counts only the good requests) and that no PHP source came back,
//! and a good request after each bad one still succeeds.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing,
    missing_docs
)]

mod support;

use std::io::{Read, Write};
use std::net::SocketAddr;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::Duration;

use support::fastcgi::{cgi_status, fastcgi_status, nginx_params};
use support::peers::{shared_dir, write_file};
use support::server::{http, Corral, HttpResponse};

/// What a planted script leaves behind when php-cgi runs it.
const MARKER: &str = "ran";
/// Words only the planted PHP sources contain, so a leak of source is visible.
const SECRET: &str = "s3cret-source";

struct Site {
    corral: Corral,
    dir: tempfile::TempDir,
    status: SocketAddr,
}

impl Site {
    fn root(&self) -> PathBuf {
        self.dir.path().join("www")
    }

    fn fastcgi_socket(&self) -> PathBuf {
        self.dir.path().join("fcgi.sock")
    }

    fn scgi_socket(&self) -> PathBuf {
        self.dir.path().join("scgi.sock")
    }

    fn marker(&self) -> PathBuf {
        self.dir.path().join(MARKER)
    }

    fn get(&self, target: &str) -> HttpResponse {
        http(self.corral.http_addr(), "GET", target, &[], b"")
    }

    /// `accepted conn` of the pool: requests that reached a worker.
    fn accepted(&self) -> u64 {
        let text = http(self.status, "GET", "/status", &[], b"").text();
        text.lines()
            .find_map(|l| l.strip_prefix("accepted conn:"))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or_else(|| panic!("no accepted conn in:\n{text}"))
    }

    /// The good request run after every bad one: it must still be served by PHP.
    fn good(&self) {
        let r = self.get("/index.php");
        assert_eq!(r.status, 200, "{}", self.corral.log());
        assert_eq!(r.text(), "index ran");
    }

    fn assert_nothing_ran(&self, what: &str, body: &[u8]) {
        let body = String::from_utf8_lossy(body);
        assert!(
            !self.marker().exists(),
            "{what}: a planted script ran\n{}",
            self.corral.log()
        );
        assert!(
            !body.contains(SECRET),
            "{what}: PHP source came back: {body}"
        );
        assert!(
            !body.contains("<?php"),
            "{what}: PHP source came back: {body}"
        );
    }
}

fn site() -> Site {
    let dir = shared_dir();
    let root = dir.path().join("www");
    for sub in ["uploads", "sub", ".git", ".well-known", "dir.php"] {
        std::fs::create_dir_all(root.join(sub)).unwrap();
    }
    let marker = dir.path().join(MARKER);
    let plant = |name: &str| {
        format!(
            "<?php /* {SECRET} */ file_put_contents('{}', '{name}'); echo 'PWNED';",
            marker.display()
        )
    };
    write_file(&root, "index.php", "<?php echo 'index ran';");
    write_file(&root, "style.css", "body { color: red }");
    write_file(&root, ".well-known/acme.txt", "token");
    // An "image" an attacker uploaded: a GIF header and PHP.
    write_file(
        &root,
        "uploads/avatar.gif",
        &format!("GIF89a{}", plant("avatar.gif")),
    );
    write_file(&root, "robots.txt", &plant("robots.txt"));
    // Source that must never be served as text, nor run.
    write_file(&root, "upper.PHP", &plant("upper.PHP"));
    write_file(&root, "lib.inc", &plant("lib.inc"));
    write_file(&root, "old.phps", &plant("old.phps"));
    write_file(&root, ".env", &format!("DB_PASSWORD={SECRET}"));
    write_file(&root, ".user.ini", &format!("; {SECRET}"));
    write_file(&root, ".git/config", &format!("[core] # {SECRET}"));
    write_file(&root, ".git/hook.php", &plant(".git/hook.php"));
    write_file(&root, "sub/.htaccess", &format!("# {SECRET}"));
    // Symlinks: a .php name for the gif, a script outside the root, a text name for PHP
    // source, a .php name for a hidden file.
    write_file(dir.path(), "outside.php", &plant("outside.php"));
    std::os::unix::fs::symlink(root.join("uploads/avatar.gif"), root.join("gif.php")).unwrap();
    std::os::unix::fs::symlink(dir.path().join("outside.php"), root.join("out.php")).unwrap();
    std::os::unix::fs::symlink(root.join("lib.inc"), root.join("readme.txt")).unwrap();
    std::os::unix::fs::symlink(root.join(".git/hook.php"), root.join("hook.php")).unwrap();
    std::os::unix::fs::symlink(dir.path(), root.join("up")).unwrap();

    let config = format!(
        r#"
[server]
runtime_dir = "{run}"
grace = "2s"
kill_timeout = "2s"
log_level = "debug"

[[listen]]
address = "127.0.0.1:0"
protocol = "http"

[[listen]]
address = "unix:{fcgi}"
protocol = "fastcgi"

[[listen]]
address = "unix:{scgi}"
protocol = "scgi"

[status]
address = "127.0.0.1:0"

[pools.php]
command = ["php-cgi", "-d", "cgi.fix_pathinfo=1"]
mode = "static"
max = 2

[[contexts]]
root = "{root}"
static_files = true
pool = "php"
"#,
        run = dir.path().join("run").display(),
        fcgi = dir.path().join("fcgi.sock").display(),
        scgi = dir.path().join("scgi.sock").display(),
        root = root.display(),
    );
    let corral = Corral::start(&config, 3);
    let status = corral.status_ready_addr();
    let site = Site {
        corral,
        dir,
        status,
    };
    site.good();
    site
}

#[test]
fn uploads_and_missing_scripts_never_run_over_http() {
    let site = site();
    let before = site.accepted();
    let long = format!("/robots.txt/{}.php", "A".repeat(1500));
    let cases: &[(&str, u16)] = &[
        ("/uploads/avatar.gif/x.php", 404),
        ("/uploads/avatar.gif/x.php/more/info", 404),
        ("/uploads/./avatar.gif/x.php", 404),
        ("//uploads//avatar.gif//x.php", 404),
        ("/uploads/avatar.gif/%78.php", 404),
        ("/uploads/avatar.gif%2fx.php", 400),
        ("/uploads/avatar.gif/x.php%00", 400),
        ("/uploads/avatar.gif/x.php%0a", 400),
        (&long, 404),
        ("/robots.txt/.php", 404),
        ("/missing.php", 404),
        ("/dir.php", 404),
        ("/dir.php/", 404),
        // Symlinks: a .php name for the gif, out of the root, into a hidden directory.
        ("/gif.php", 404),
        ("/out.php", 404),
        ("/up/outside.php", 404),
        ("/hook.php", 404),
        ("/.git/hook.php", 404),
        ("/../outside.php", 403),
        ("/%2e%2e/outside.php", 403),
    ];
    for &(target, status) in cases {
        let r = site.get(target);
        assert_eq!(r.status, status, "{target}: {}", r.text());
        site.assert_nothing_ran(target, &r.body);
        site.good();
    }
    let good_requests = cases.len() as u64;
    assert_eq!(
        site.accepted() - before,
        good_requests,
        "only the good requests reached a worker"
    );
    // The log is read on another thread: the line may trail the answer.
    assert!(
        site.corral.wait_log("does not exist"),
        "the refusal is logged with its reason:\n{}",
        site.corral.log()
    );
}

#[test]
fn php_source_and_hidden_files_are_never_served() {
    let site = site();
    // Spellings of index.php that must run it, not send its source.
    for target in [
        "/index%2ephp",
        "/index.ph%70",
        "/%69ndex.php",
        "/sub/../index.php",
    ] {
        let r = site.get(target);
        assert_eq!(r.status, 200, "{target}");
        assert_eq!(
            r.text(),
            "index ran",
            "{target}: ran as PHP, not sent as text"
        );
    }
    let before = site.accepted();
    let refused = [
        "/upper.PHP",
        "/upper.Php",
        "/upper.%50HP",
        "/lib.inc",
        "/lib.INC",
        "/old.phps",
        "/readme.txt",
        "/index.php.",
        "/.env",
        "/%2eenv",
        "/.user.ini",
        "/.git/config",
        "/.git/",
        "/sub/.htaccess",
        "/sub/%2ehtaccess",
    ];
    for target in refused {
        let r = site.get(target);
        assert_eq!(r.status, 404, "{target}: {}", r.text());
        site.assert_nothing_ran(target, &r.body);
        site.good();
    }
    assert_eq!(site.accepted() - before, refused.len() as u64);
    // What should be served still is.
    let r = site.get("/style.css");
    assert_eq!(r.status, 200);
    assert_eq!(r.header("content-type"), Some("text/css; charset=utf-8"));
    let r = site.get("/.well-known/acme.txt");
    assert_eq!((r.status, r.text().as_str()), (200, "token"));
}

/// PHP source backups an editor, a deploy or an admin leaves beside the script, in any
/// letter case: each holds the source (and the secret) and must get a 404, not the text.
const BACKUPS: &[&str] = &[
    "config.php.bak",
    "config.php~",
    "config.php.orig",
    "config.php.save",
    "config.php.swp",
    "config.php.",
    "config.php.old.1",
    "config.php#",
    "config.php-2024-01-01",
    "config.php_",
    "WP-CONFIG.PHP.BAK",
    "lib.inc.bak",
    "page.phtml~",
];

#[test]
fn php_source_backups_are_never_served() {
    let site = site();
    let root = site.dir.path().join("www");
    for name in BACKUPS {
        write_file(&root, name, &format!("<?php /* {SECRET} */"));
    }
    // A text name for a backup is judged by its real name.
    std::os::unix::fs::symlink(root.join("config.php.bak"), root.join("notes.txt")).unwrap();
    write_file(&root, "about.phpnotes.txt", "not a backup");
    let before = site.accepted();
    let mut targets: Vec<String> = BACKUPS.iter().map(|n| format!("/{n}")).collect();
    targets.push("/config.php%7e".into());
    targets.push("/notes.txt".into());
    for target in &targets {
        let r = site.get(target);
        assert_eq!(r.status, 404, "{target}: {}", r.text());
        site.assert_nothing_ran(target, &r.body);
        site.good();
    }
    assert_eq!(site.accepted() - before, targets.len() as u64);
    // `.php` followed by a letter is another name, served as it is.
    let r = site.get("/about.phpnotes.txt");
    assert_eq!((r.status, r.text().as_str()), (200, "not a backup"));
}

#[test]
fn the_fastcgi_and_scgi_fronts_check_the_script_too() {
    let site = site();
    let root = site.root();
    let (status, body) = fastcgi_status(
        &site.fastcgi_socket(),
        &nginx_params(&root, "/index.php", "/index.php"),
    );
    assert_eq!(
        (status, String::from_utf8_lossy(&body).contains("index ran")),
        (200, true)
    );
    let before = site.accepted();
    let cases: &[(&str, u16)] = &[
        ("/uploads/avatar.gif/x.php", 404),
        ("/gif.php", 404),
        ("/out.php", 404),
        ("/hook.php", 404),
        ("/.git/hook.php", 404),
        ("/upper.PHP", 404),
        ("/missing.php", 404),
    ];
    for &(script, expected) in cases {
        let (status, body) =
            fastcgi_status(&site.fastcgi_socket(), &nginx_params(&root, script, script));
        assert_eq!(
            status,
            expected,
            "fastcgi {script}: {}",
            String::from_utf8_lossy(&body)
        );
        site.assert_nothing_ran(script, &body);
        // The same through SCGI, which nginx's scgi_pass sends without SCRIPT_FILENAME.
        let (status, body) = scgi_status(&site.scgi_socket(), script);
        assert_eq!(
            status,
            expected,
            "scgi {script}: {}",
            String::from_utf8_lossy(&body)
        );
        site.assert_nothing_ran(script, &body);
        site.good();
    }
    // A SCRIPT_FILENAME the front made up outside the root.
    let mut params = nginx_params(&root, "/x.php", "/x.php");
    params.retain(|(n, _)| *n != "SCRIPT_FILENAME");
    params.push((
        "SCRIPT_FILENAME",
        site.dir.path().join("outside.php").display().to_string(),
    ));
    let (status, body) = fastcgi_status(&site.fastcgi_socket(), &params);
    assert_eq!(status, 403);
    site.assert_nothing_ran("outside SCRIPT_FILENAME", &body);
    assert_eq!(site.accepted() - before, cases.len() as u64);
}

/// One SCGI request for `uri` as nginx's `scgi_pass` sends it; the response's status.
fn scgi_status(socket: &Path, uri: &str) -> (u16, Vec<u8>) {
    let mut head = Vec::new();
    for (n, v) in [
        ("CONTENT_LENGTH", "0"),
        ("SCGI", "1"),
        ("REQUEST_METHOD", "GET"),
        ("REQUEST_URI", uri),
        ("SERVER_PROTOCOL", "HTTP/1.1"),
        ("HTTP_HOST", "localhost"),
    ] {
        head.extend_from_slice(n.as_bytes());
        head.push(0);
        head.extend_from_slice(v.as_bytes());
        head.push(0);
    }
    let mut stream = UnixStream::connect(socket).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(20)))
        .unwrap();
    stream
        .write_all(format!("{}:", head.len()).as_bytes())
        .unwrap();
    stream.write_all(&head).unwrap();
    stream.write_all(b",").unwrap();
    let mut response = Vec::new();
    stream.read_to_end(&mut response).unwrap();
    (cgi_status(&response), response)
}
