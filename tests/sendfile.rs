//! X-Sendfile and X-Accel-Redirect from real php-cgi and a real Rack app: corral's HTTP
//! listener sends the file the backend names, from allowed directories only, and never shows
//! the client the header; its FastCGI and SCGI listeners pass both headers on to nginx, which
//! acts on X-Accel-Redirect itself.

mod support;

use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};

use support::front::{curl, Nginx};
use support::peers::{self, write_file};
use support::server::{http, Corral, HttpResponse};

const SCRIPTS: &[(&str, &str)] = &[
    (
        "send.php",
        "<?php header('X-Sendfile: ' . $_GET['f']); \
         if (isset($_GET['status'])) { http_response_code((int)$_GET['status']); } \
         header('Content-Disposition: attachment; filename=\"report.pdf\"'); \
         header('Cache-Control: private'); \
         echo 'the backend body, never sent';",
    ),
    (
        "accel.php",
        "<?php header('X-Accel-Redirect: ' . $_GET['u']); echo 'the backend body, never sent';",
    ),
    (
        "two.php",
        "<?php header('X-Sendfile: ' . $_GET['f']); header('X-Accel-Redirect: /protected/a.txt');",
    ),
    (
        "plain.php",
        "<?php header('X-Accel-Buffering: no'); header('X-Sendfile-Temporary: x'); echo 'plain';",
    ),
    (
        "typed.php",
        "<?php if (isset($_GET['t'])) { header('Content-Type: ' . $_GET['t']); \
         header('X-Content-Type-Options: nosniff'); } else { ini_set('default_mimetype', ''); } \
         if (isset($_GET['f'])) { header('X-Sendfile: ' . $_GET['f']); } \
         else { header('X-Accel-Redirect: ' . $_GET['u']); }",
    ),
    (
        "env.php",
        "<?php echo $_SERVER['HTTP_X_SENDFILE_TYPE'] ?? '-', '|', $_SERVER['HTTP_X_ACCEL_MAPPING'] ?? '-';",
    ),
];

/// A PDF-looking file of bytes every value of which occurs.
fn report() -> Vec<u8> {
    let mut b = b"%PDF-1.4\n".to_vec();
    b.extend((0..4096u32).map(|i| (i % 251) as u8));
    b
}

struct Site {
    dir: tempfile::TempDir,
    corral: Corral,
    _php: peers::Peer,
}

impl Site {
    fn private(&self) -> PathBuf {
        self.dir.path().join("private")
    }

    fn files(&self) -> PathBuf {
        self.dir.path().join("files")
    }

    fn get(&self, host: &str, target: &str, headers: &[(&str, &str)]) -> HttpResponse {
        let mut all = vec![("Host", host)];
        all.extend_from_slice(headers);
        http(self.corral.http_addr(), "GET", target, &all, b"")
    }

    fn send(&self, f: &Path) -> HttpResponse {
        self.get("on.test", &format!("/send.php?f={}", f.display()), &[])
    }

    /// Asserts a refusal with `status`, no trace of the backend's answer, and a log line
    /// holding `logged`.
    fn refused(&self, r: &HttpResponse, status: u16, logged: &str) {
        assert_eq!(r.status, status, "{}\n{}", r.text(), self.corral.log());
        assert!(!r.text().contains("backend body"), "{}", r.text());
        assert_eq!(r.header("x-sendfile"), None);
        assert_eq!(r.header("x-accel-redirect"), None);
        // The line is read from corral's stderr by another thread: it may trail the answer.
        assert!(
            self.corral.wait_log(logged),
            "no {logged:?} in:\n{}",
            self.corral.log()
        );
    }
}

/// php-cgi behind one corral with an HTTP, a FastCGI and an SCGI listener; `on.test` allows
/// both headers, `accel.test` X-Accel-Redirect only, `off.test` neither.
fn site() -> Site {
    let dir = peers::shared_dir();
    let d = dir.path();
    let root = d.join("www");
    for sub in [
        "www",
        "private",
        "private/sub",
        "private-other",
        "files",
        "outside",
        "run",
    ] {
        std::fs::create_dir_all(d.join(sub)).unwrap();
    }
    std::fs::set_permissions(
        d.join("run"),
        std::os::unix::fs::PermissionsExt::from_mode(0o700),
    )
    .unwrap();
    for (name, text) in SCRIPTS {
        write_file(&root, name, text);
    }
    std::fs::write(d.join("private/report.pdf"), report()).unwrap();
    write_file(&d.join("private"), "data.unknownext", "opaque");
    write_file(&d.join("private-other"), "x.txt", "not allowed");
    write_file(&d.join("outside"), "secret.txt", "the secret");
    write_file(&d.join("files"), "a b.txt", "accel file");
    write_file(&d.join("files"), "a.txt", "a");
    for dir in ["private", "files"] {
        write_file(
            &d.join(dir),
            "upload.html",
            "<script>alert(document.domain)</script>",
        );
        write_file(&d.join(dir), "upload.svg", "<svg onload=\"alert(1)\"/>");
    }
    symlink(d.join("outside/secret.txt"), d.join("private/link.txt")).unwrap();
    symlink(d.join("private/report.pdf"), d.join("private/inner.pdf")).unwrap();
    symlink(d.join("outside/secret.txt"), d.join("files/link.txt")).unwrap();

    let php = peers::php_cgi(d);
    let context = |host: &str, extra: &str| {
        format!(
            "[[contexts]]\nhost = \"{host}\"\nroot = \"{root}\"\nextension = \"php\"\n\
             pool = \"php\"\n{extra}\n",
            root = root.display()
        )
    };
    let config = format!(
        r#"
[server]
grace = "2s"
log_level = "debug"
runtime_dir = "{run}"

[[listen]]
address = "127.0.0.1:0"
protocol = "http"

[[listen]]
address = "unix:{d}/fcgi.sock"
protocol = "fastcgi"

[[listen]]
address = "unix:{d}/scgi.sock"
protocol = "scgi"

[pools.php]
servers = ["unix:{socket}"]

{on}{accel}{off}
[[contexts]]
listen = "unix:{d}/fcgi.sock"
root = "{root}"
pool = "php"

[[contexts]]
listen = "unix:{d}/scgi.sock"
root = "{root}"
pool = "php"
"#,
        run = d.join("run").display(),
        d = d.display(),
        socket = php.socket.display(),
        root = root.display(),
        on = context(
            "on.test",
            &format!(
                "sendfile_dirs = [\"{}\"]\naccel_redirect = {{ \"/protected/\" = \"{}\" }}",
                d.join("private").display(),
                d.join("files").display()
            )
        ),
        accel = context(
            "accel.test",
            &format!(
                "accel_redirect = {{ \"/protected/\" = \"{}\" }}",
                d.join("files").display()
            )
        ),
        off = context("off.test", ""),
    );
    let corral = Corral::start(&config, 3);
    Site {
        dir,
        corral,
        _php: php,
    }
}

#[test]
fn x_sendfile_sends_the_file_with_the_backends_headers() {
    let s = site();
    let pdf = report();
    let r = s.send(&s.private().join("report.pdf"));
    assert_eq!(r.status, 200, "{}\n{}", r.text(), s.corral.log());
    assert_eq!(r.body, pdf);
    // The backend's type stands, here PHP's default: an app names its file's type, as it
    // must behind nginx (the_backends_content_type_is_kept_and_guessed_only_when_it_sent_none).
    assert_eq!(r.header("content-type"), Some("text/html; charset=UTF-8"));
    assert_eq!(r.header("content-length"), Some(&*pdf.len().to_string()));
    assert_eq!(
        r.header("content-disposition"),
        Some("attachment; filename=\"report.pdf\"")
    );
    assert_eq!(r.header("cache-control"), Some("private"));
    assert_eq!(r.header("accept-ranges"), Some("bytes"));
    assert_eq!(r.header("x-sendfile"), None);

    // A symlink that stays inside the directory is fine.
    assert_eq!(s.send(&s.private().join("inner.pdf")).body, pdf);

    // The backend's status when it set one.
    let r = s.get(
        "on.test",
        &format!(
            "/send.php?status=404&f={}/report.pdf",
            s.private().display()
        ),
        &[],
    );
    assert_eq!(r.status, 404);
    assert_eq!(r.body, pdf);

    // A 304 (the app answered a conditional GET) has no body to replace.
    let r = s.get(
        "on.test",
        &format!(
            "/send.php?status=304&f={}/report.pdf",
            s.private().display()
        ),
        &[],
    );
    assert_eq!(r.status, 304);
    assert!(r.body.is_empty());
    assert_eq!(r.header("x-sendfile"), None);

    // So does an extension corral does not know.
    let r = s.send(&s.private().join("data.unknownext"));
    assert_eq!(r.text(), "opaque");
    assert_eq!(r.header("content-type"), Some("text/html; charset=UTF-8"));

    // HEAD: the head of the file's answer, no body.
    let target = format!("/send.php?f={}/report.pdf", s.private().display());
    let r = http(
        s.corral.http_addr(),
        "HEAD",
        &target,
        &[("Host", "on.test")],
        b"",
    );
    assert_eq!(r.status, 200);
    assert_eq!(r.header("content-length"), Some(&*pdf.len().to_string()));
    assert!(r.body.is_empty());

    // One range: 206 with the slice; the last bytes; past the end: 416.
    let r = s.get("on.test", &target, &[("Range", "bytes=9-18")]);
    assert_eq!(r.status, 206);
    assert_eq!(r.body, &pdf[9..=18]);
    assert_eq!(
        r.header("content-range"),
        Some(&*format!("bytes 9-18/{}", pdf.len()))
    );
    let r = s.get("on.test", &target, &[("Range", "bytes=-5")]);
    assert_eq!(r.body, &pdf[pdf.len() - 5..]);
    let r = s.get("on.test", &target, &[("Range", "bytes=999999-")]);
    assert_eq!(r.status, 416);
    assert_eq!(
        r.header("content-range"),
        Some(&*format!("bytes */{}", pdf.len()))
    );
}

#[test]
fn x_sendfile_outside_the_allowed_directories_is_refused() {
    let s = site();
    let r = s.send(&s.private().join("link.txt"));
    s.refused(&r, 500, "outside");
    assert!(!r.text().contains("the secret"));
    let dotdot = format!("{}/../outside/secret.txt", s.private().display());
    s.refused(
        &s.send(Path::new(&dotdot)),
        500,
        "is not an absolute path without '.', '..' or empty segments",
    );
    s.refused(
        &s.send(Path::new("/etc/passwd")),
        500,
        "is under none of sendfile_dirs",
    );
    // A sibling whose name starts like the allowed directory is not inside it.
    s.refused(
        &s.send(&s.dir.path().join("private-other/x.txt")),
        500,
        "private-other/x.txt\" is under none of sendfile_dirs",
    );
    s.refused(
        &s.send(&s.private().join("nothing.pdf")),
        404,
        "which does not exist",
    );
    s.refused(
        &s.send(&s.private().join("sub")),
        404,
        "which is not a regular file",
    );
    s.refused(
        &s.send(Path::new("relative/report.pdf")),
        500,
        "is not an absolute path",
    );
}

#[test]
fn x_accel_redirect_maps_its_prefix_to_the_directory() {
    let s = site();
    let r = s.get("on.test", "/accel.php?u=/protected/a%2520b.txt", &[]);
    assert_eq!(r.status, 200, "{}\n{}", r.text(), s.corral.log());
    assert_eq!(r.text(), "accel file");
    assert_eq!(r.header("content-type"), Some("text/html; charset=UTF-8"));
    assert_eq!(r.header("x-accel-redirect"), None);

    // Dot segments resolve first; the result must still be under a prefix.
    s.refused(
        &s.get("on.test", "/accel.php?u=/protected/../etc/passwd", &[]),
        500,
        "/protected/../etc/passwd\" is under none of accel_redirect",
    );
    s.refused(
        &s.get(
            "on.test",
            "/accel.php?u=/protected/%252e%252e/www/send.php",
            &[],
        ),
        500,
        "is under none of accel_redirect",
    );
    s.refused(
        &s.get("on.test", "/accel.php?u=/protected%252Fa.txt", &[]),
        500,
        "is not a usable URI path",
    );
    s.refused(
        &s.get("on.test", "/accel.php?u=/protected/link.txt", &[]),
        500,
        "outside",
    );
    s.refused(
        &s.get("on.test", "/accel.php?u=/elsewhere/a.txt", &[]),
        500,
        "/elsewhere/a.txt\" is under none of accel_redirect",
    );
}

#[test]
fn a_context_that_allows_nothing_sends_nothing() {
    let s = site();
    let f = s.private().join("report.pdf");
    s.refused(
        &s.get("off.test", &format!("/send.php?f={}", f.display()), &[]),
        500,
        "but this context allows none (set sendfile_dirs)",
    );
    s.refused(
        &s.get("accel.test", &format!("/send.php?f={}", f.display()), &[]),
        500,
        "but this context allows none (set sendfile_dirs)",
    );
    s.refused(
        &s.get("off.test", "/accel.php?u=/protected/a.txt", &[]),
        500,
        "but this context allows none (set accel_redirect)",
    );
    s.refused(
        &s.get("on.test", &format!("/two.php?f={}", f.display()), &[]),
        500,
        "the backend sent 2 X-Sendfile and X-Accel-Redirect headers",
    );
    // Other proxy instructions never reach the client either.
    let r = s.get("off.test", "/plain.php", &[]);
    assert_eq!(r.text(), "plain");
    assert_eq!(r.header("x-accel-buffering"), None);
    assert_eq!(r.header("x-sendfile-temporary"), None);
}

#[test]
fn the_backend_hears_how_to_name_files_from_corral_not_the_client() {
    let s = site();
    let forged = [
        ("X-Sendfile-Type", "X-Accel-Redirect"),
        ("X-Accel-Mapping", "/srv/free/=/protected/paid/"),
    ];
    assert_eq!(s.get("on.test", "/env.php", &forged).text(), "X-Sendfile|-");
    assert_eq!(
        s.get("accel.test", "/env.php", &forged).text(),
        format!("X-Accel-Redirect|{}/=/protected/", s.files().display())
    );
    assert_eq!(s.get("off.test", "/env.php", &forged).text(), "-|-");
}

#[test]
fn fastcgi_and_scgi_listeners_leave_the_headers_to_the_front_server() {
    let s = site();
    let d = s.dir.path();
    let root = d.join("www");
    let ngx = d.join("nginx");
    std::fs::create_dir(&ngx).unwrap();
    let server = |pass: &str, params: &str, script: &str| {
        format!(
            "    root {root};\n    location /protected/ {{ internal; alias {files}/; }}\n    \
             location ~ \\.php$ {{\n      include /etc/nginx/{params};\n{script}      \
             {pass};\n    }}",
            root = root.display(),
            files = s.files().display(),
        )
    };
    let script = "      fastcgi_param SCRIPT_FILENAME $document_root$fastcgi_script_name;\n";
    let nginx = Nginx::start(
        &ngx,
        "",
        &[
            server(
                &format!("fastcgi_pass unix:{}/fcgi.sock", d.display()),
                "fastcgi_params",
                script,
            ),
            server(
                &format!("scgi_pass unix:{}/scgi.sock", d.display()),
                "scgi_params",
                "",
            ),
        ],
    );
    for i in 0..2 {
        // nginx acts on X-Accel-Redirect: its internal location serves the file.
        let r = curl(
            &format!("{}/accel.php?u=/protected/a.txt", nginx.url(i)),
            &[],
        );
        assert_eq!(r.status, 200, "{}\n{}", r.text(), nginx.error_log());
        assert_eq!(r.text(), "a");
        assert_eq!(r.header("x-accel-redirect"), None);
        // nginx does nothing with X-Sendfile: it reaches the client as the backend sent it,
        // with the backend's body, so corral passed both on untouched.
        let f = s.private().join("report.pdf");
        let r = curl(&format!("{}/send.php?f={}", nginx.url(i), f.display()), &[]);
        assert_eq!(r.header("x-sendfile"), Some(&*f.display().to_string()));
        assert_eq!(r.text(), "the backend body, never sent");
    }
}

/// A Rack app (Debian's rack 2.2) behind `Rack::Sendfile, 'X-Accel-Redirect'`, which names
/// files by the X-Accel-Mapping corral sends it, through corral's Rack launcher.
const RACK_APP: &str = r#"use Rack::Sendfile, 'X-Accel-Redirect'
run Rack::Files.new(File.join(Dir.pwd, 'files'))
"#;

#[test]
fn rack_sendfile_names_files_by_the_mapping_corral_sends() {
    let dir = peers::shared_dir();
    let d = dir.path();
    write_file(d, "config.ru", RACK_APP);
    std::fs::create_dir(d.join("files")).unwrap();
    let data: Vec<u8> = (0..100_000u32).map(|i| (i % 253) as u8).collect();
    std::fs::write(d.join("files/report one.bin"), &data).unwrap();
    let config = format!(
        r#"
[server]
runtime_dir = "{d}/run"
grace = "2s"
log_level = "debug"

[[listen]]
address = "127.0.0.1:0"
protocol = "http"

[pools.rb]
app = "rack:config.ru"
cwd = "{d}"
mode = "static"
max = 1

[[contexts]]
host = "accel.test"
pool = "rb"
accel_redirect = {{ "/internal/" = "{d}/files/" }}

[[contexts]]
host = "off.test"
pool = "rb"
"#,
        d = d.display()
    );
    let corral = Corral::start(&config, 1);
    let get = |host: &str, headers: &[(&str, &str)]| {
        let mut all = vec![("Host", host)];
        all.extend_from_slice(headers);
        http(corral.http_addr(), "GET", "/report%20one.bin", &all, b"")
    };
    // Rack answers with X-Accel-Redirect: /internal/report%20one.bin and no body; corral
    // decodes it, maps it back into the directory and sends the file.
    let r = get("accel.test", &[]);
    assert_eq!(r.status, 200, "{}\n{}", r.text(), corral.log());
    assert_eq!(r.body, data);
    assert_eq!(r.header("x-accel-redirect"), None);
    assert!(
        corral.wait_log("files/report one.bin"),
        "corral did not send the file itself:\n{}",
        corral.log()
    );
    // A client's own mapping is not what Rack hears: here it would name another directory.
    let forged = format!("{}/=/internal/elsewhere/", d.join("files").display());
    let r = get("accel.test", &[("X-Accel-Mapping", &forged)]);
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.body, data);
    // Where corral sends no mapping, Rack sends the file itself; a forged one would have made
    // it answer with a header this context refuses.
    let r = get("off.test", &[("X-Accel-Mapping", &forged)]);
    assert_eq!(r.status, 200, "{}\n{}", r.text(), corral.log());
    assert_eq!(r.body, data);
}

#[test]
fn the_backends_content_type_is_kept_and_guessed_only_when_it_sent_none() {
    let s = site();
    // An app that serves uploads as text/plain with nosniff keeps its word, whatever the
    // file's extension says: no stored XSS on the site's origin.
    for name in ["upload.html", "upload.svg"] {
        let f = s.private().join(name);
        let ways = [
            format!("/typed.php?t=text/plain&f={}", f.display()),
            format!("/typed.php?t=text/plain&u=/protected/{name}"),
        ];
        for target in &ways {
            let r = s.get("on.test", target, &[]);
            assert_eq!(r.status, 200, "{target}: {}\n{}", r.text(), s.corral.log());
            assert!(r.text().contains("alert"), "{target}: the file itself");
            // PHP adds its charset to the type the script named.
            assert_eq!(
                r.header("content-type"),
                Some("text/plain;charset=UTF-8"),
                "{target}"
            );
            assert_eq!(r.header("x-content-type-options"), Some("nosniff"));
        }
    }
    // A backend that sent no type at all: the file's extension decides.
    let f = s.private().join("report.pdf");
    let r = s.get("on.test", &format!("/typed.php?f={}", f.display()), &[]);
    assert_eq!(r.status, 200, "{}", s.corral.log());
    assert_eq!(r.header("content-type"), Some("application/pdf"));
    let r = s.get("on.test", "/typed.php?u=/protected/upload.svg", &[]);
    assert_eq!(r.header("content-type"), Some("image/svg+xml"));
    let r = s.get(
        "on.test",
        &format!(
            "/typed.php?f={}",
            s.private().join("data.unknownext").display()
        ),
        &[],
    );
    assert_eq!(r.header("content-type"), Some("application/octet-stream"));
}
