//! The files in conf/ work as written: every configuration passes `corral check`, and the
//! recipes start and serve their example apps for real, with the paths moved into a temp
//! dir (runtime dir, sockets, document root, ports) and nothing else changed. The PHP recipe
//! runs behind a real nginx with conf/nginx/php-fpm-dropin.conf, as its comment says.

mod support;

use std::path::{Path, PathBuf};

use support::front::{curl, nginx_blocks, Nginx};
use support::peers;
use support::server::{http, Corral};

fn repo(path: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(path)
}

fn read(path: &str) -> String {
    std::fs::read_to_string(repo(path)).unwrap_or_else(|e| panic!("{path}: {e}"))
}

#[test]
fn every_configuration_in_conf_passes_corral_check() {
    // conf/php-native.toml and conf/php-worker.toml name the native PHP worker, and
    // conf/wsgi-native.toml the native WSGI worker, which `corral check` finds beside corral.
    support::native::worker();
    support::native::wsgi_worker();
    let mut checked = 0;
    for entry in std::fs::read_dir(repo("conf")).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "toml") {
            // `corral check` wants a worker-mode pool's script to exist: the worker recipe's
            // app is its example script here.
            let text = std::fs::read_to_string(&path).unwrap().replace(
                "/var/www/app/public/worker.php",
                &repo("workers/php/examples/worker.php")
                    .display()
                    .to_string(),
            );
            let file = support::config_file(&text);
            let out = support::corral(&["check", "-c", &file.path().display().to_string()]);
            assert_eq!(out.code, Some(0), "{}: {}", path.display(), out.stderr);
            checked += 1;
        }
    }
    assert!(checked >= 6, "only {checked} configurations in conf/");
}

/// A site dir with the PHP examples, readable by the workers' user.
fn php_site(dir: &Path) -> PathBuf {
    let root = dir.join("www");
    std::fs::create_dir_all(&root).unwrap();
    std::fs::set_permissions(&root, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    for name in ["hello.php", "phpinfo.php", "upload.php"] {
        peers::write_file(&root, name, &read(&format!("examples/php/{name}")));
    }
    peers::write_file(&root, "index.php", &read("examples/php/hello.php"));
    root
}

/// `conf/NAME` with its paths and ports moved into `dir`.
fn adapt(name: &str, dir: &Path, root: &Path) -> String {
    read(name)
        .replace("/run/corral", &dir.join("run").display().to_string())
        .replace("/var/www/html", &root.display().to_string())
        .replace("127.0.0.1:8080", "127.0.0.1:0")
        .replace("127.0.0.1:9180", "127.0.0.1:0")
}

#[test]
fn the_php_recipe_serves_through_nginx_and_by_itself() {
    let dir = peers::shared_dir();
    let root = php_site(dir.path());
    // fastcgi, scgi and http.
    let corral = Corral::start(&adapt("conf/php.toml", dir.path(), &root), 3);
    let socket = dir.path().join("run/php.sock");

    // nginx exactly as the drop-in says, with the socket, root and port moved.
    let snippet = read("conf/nginx/php-fpm-dropin.conf")
        .replace("/run/corral/php.sock", &socket.display().to_string())
        .replace("/var/www/html", &root.display().to_string());
    let upstreams: String = nginx_blocks(&snippet, "upstream")
        .into_iter()
        .map(|(head, body)| format!("{head} {{{body}}}\n"))
        .collect();
    let servers: Vec<String> = nginx_blocks(&snippet, "server")
        .into_iter()
        .map(|(_, body)| {
            body.lines()
                .filter(|l| !l.trim_start().starts_with("listen "))
                .collect::<Vec<_>>()
                .join("\n")
                .replace(
                    "include fastcgi_params;",
                    "include /etc/nginx/fastcgi_params;",
                )
        })
        .collect();
    let nginx_dir = dir.path().join("nginx");
    std::fs::create_dir_all(&nginx_dir).unwrap();
    let nginx = Nginx::start(&nginx_dir, &upstreams, &servers);

    let r = curl(&format!("{}/hello.php", nginx.url(0)), &[]);
    assert_eq!(r.status, 200, "{}\n{}", nginx.error_log(), corral.log());
    assert_eq!(r.text(), "Hello, world\n");
    // try_files sends an unknown path to the front controller.
    let r = curl(&format!("{}/some/route", nginx.url(0)), &[]);
    assert_eq!(r.text(), "Hello, world\n", "{}", corral.log());
    let r = curl(
        &format!("{}/upload.php", nginx.url(0)),
        &[
            "--data-binary",
            "corral",
            "-H",
            "Content-Type: application/octet-stream",
        ],
    );
    assert_eq!(
        r.text(),
        "raw body: 6 bytes, md5 c3761f853c220267fae7acb6cc653f74\n"
    );

    // corral's own http listener serves the same site, static files included.
    peers::write_file(&root, "robots.txt", "User-agent: *\n");
    let addr = corral.http_addr();
    assert_eq!(http(addr, "GET", "/", &[], b"").text(), "Hello, world\n");
    let r = http(addr, "GET", "/robots.txt", &[], b"");
    assert_eq!(r.text(), "User-agent: *\n");
    let r = http(addr, "GET", "/phpinfo.php", &[], b"");
    assert!(r.text().contains("CGI/FastCGI"), "{}", r.text());
}

#[test]
fn the_lsphp_recipe_serves() {
    let dir = peers::shared_dir();
    let root = php_site(dir.path());
    let config = adapt("conf/lsphp.toml", dir.path(), &root);
    let corral = Corral::start(&config, 1);
    let r = http(corral.http_addr(), "GET", "/hello.php", &[], b"");
    assert_eq!(r.status, 200, "{}", corral.log());
    assert_eq!(r.text(), "Hello, world\n");
    let r = http(corral.http_addr(), "GET", "/phpinfo.php", &[], b"");
    assert!(r.text().contains("LiteSpeed"), "{}", r.text());
    // The recipe loads the OPcache built beside lsphp, and it runs ("Opcode Caching: Up and
    // Running" in phpinfo's OPcache section).
    assert!(r.text().contains("Up and Running"), "{}", r.text());
}

/// (conf/wsgi.toml is run the same way by tests/launcher_wsgi.rs.)
#[test]
fn the_rack_recipe_serves_its_example() {
    let dir = peers::shared_dir();
    let config = read("conf/rack.toml")
        .replace(
            "/srv/corral/examples",
            &repo("examples").display().to_string(),
        )
        .replace("/run/corral", &dir.path().join("run").display().to_string())
        .replace("127.0.0.1:8080", "127.0.0.1:0");
    let corral = Corral::start(&config, 1);
    let r = http(corral.http_addr(), "GET", "/hello/there", &[], b"");
    assert_eq!(r.status, 200, "{}", corral.log());
    assert!(r.text().starts_with("Hello from Rack"), "{}", r.text());
    assert!(
        r.text().contains("You asked for /hello/there"),
        "{}",
        r.text()
    );
}

/// Both embedded launchers speak LSAPI (the configuration refuses another protocol for an
/// `app = ...` pool): no page a user reads says the WSGI launcher speaks SCGI.
#[test]
fn the_docs_name_the_protocol_the_launchers_speak() {
    let mut pages = vec![
        "README.md".to_owned(),
        "ARCHITECTURE.md".to_owned(),
        "examples/wsgi/README.md".to_owned(),
    ];
    for entry in std::fs::read_dir(repo("conf")).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "toml") {
            pages.push(format!(
                "conf/{}",
                path.file_name().unwrap().to_string_lossy()
            ));
        }
    }
    let mut wrong = Vec::new();
    for page in &pages {
        // A paragraph at a time: a sentence may break its line anywhere.
        for paragraph in read(page).split("\n\n") {
            let lower = paragraph.to_ascii_lowercase();
            // A table's rows are read one by one.
            let units: Vec<&str> = if lower.starts_with('|') {
                lower.lines().collect()
            } else {
                lower.split(". ").collect()
            };
            for sentence in units {
                let says_scgi = sentence.contains("launcher")
                    && sentence.contains("wsgi")
                    && sentence.contains("scgi")
                    && !sentence.contains("lsapi");
                // As the status table said it: "WSGI (SCGI) and Rack (LSAPI)".
                if says_scgi || sentence.contains("wsgi (scgi)") {
                    wrong.push(format!("{page}: {}", sentence.trim()));
                }
            }
        }
    }
    assert!(wrong.is_empty(), "{wrong:#?}");
}

/// corral on `config` (`listeners` to wait for) and nginx on conf/nginx/wordpress.conf as
/// written, with its socket moved into `dir`'s runtime directory and wp-content into `lib`.
fn wordpress_nginx(dir: &Path, config: &str, listeners: usize, lib: &Path) -> (Corral, Nginx) {
    let run = dir.join("run");
    let corral = Corral::start(config, listeners);
    let snippet = read("conf/nginx/wordpress.conf")
        .replace(
            "/run/corral/php.sock",
            &run.join("php.sock").display().to_string(),
        )
        .replace("/var/lib/wordpress", &lib.display().to_string())
        .replace("listen 80;", "")
        .replace(
            "include fastcgi_params;",
            "include /etc/nginx/fastcgi_params;",
        );
    let servers: Vec<String> = nginx_blocks(&snippet, "server")
        .into_iter()
        .map(|(_, body)| body)
        .collect();
    let nginx_dir = dir.join("nginx");
    std::fs::create_dir_all(&nginx_dir).unwrap();
    let nginx = Nginx::start(&nginx_dir, "  include /etc/nginx/mime.types;", &servers);
    (corral, nginx)
}

/// The WordPress snippet in front of conf/php.toml, whose root is not WordPress's: every
/// script is refused with 403, and corral's log line names both roots.
#[test]
fn a_root_that_differs_from_nginxs_is_a_403_naming_both_roots() {
    let dir = peers::shared_dir();
    let root = php_site(dir.path());
    // fastcgi, scgi and http.
    let (corral, nginx) = wordpress_nginx(
        dir.path(),
        &adapt("conf/php.toml", dir.path(), &root),
        3,
        &dir.path().join("wp"),
    );
    let r = curl(&format!("{}/wp-includes/version.php", nginx.url(0)), &[]);
    assert_eq!(r.status, 403, "{r:?}\n{}", corral.log());
    // The log is read on another thread: the line may trail the answer.
    corral.wait_log("request refused");
    let log = corral.log();
    let line = log
        .lines()
        .find(|l| l.contains("request refused") && l.contains("SCRIPT_FILENAME"))
        .unwrap_or_else(|| panic!("no refusal logged:\n{log}"));
    assert!(
        line.contains(&format!("the context's root \"{}\"", root.display()))
            && line.contains("DOCUMENT_ROOT is \"/usr/share/wordpress\""),
        "{line}"
    );
}

/// conf/wordpress.toml with conf/nginx/wordpress.conf, both as written with only their
/// paths and ports moved: nginx's PHP requests run (with conf/php.toml's root they were all
/// 403), and nginx serves neither dotfiles nor PHP source (a `.htaccess` of WordPress's own,
/// and files planted in wp-content). No database is needed: wp-includes/version.php only
/// sets variables.
#[test]
fn the_wordpress_recipe_pair_serves_through_nginx() {
    let dir = peers::shared_dir();
    let run = dir.path().join("run");
    // Debian's /var/lib/wordpress, with a wp-content of the test's own.
    let lib = dir.path().join("wp");
    let content = lib.join("wp-content");
    std::fs::create_dir_all(content.join(".git")).unwrap();
    let planted = [
        ("style.css", "body { color: black }"),
        (".env", "DB_PASSWORD=SECRET"),
        (".git/config", "[remote] SECRET"),
        ("X.PHP", "<?php // SECRET"),
        ("x.php.bak", "<?php // SECRET backup"),
        ("x.php~", "<?php // SECRET editor copy"),
    ];
    for (name, text) in planted {
        std::fs::write(content.join(name), text).unwrap();
    }
    for d in [dir.path(), &lib, &content, &content.join(".git")] {
        std::fs::set_permissions(d, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    }
    let config = read("conf/wordpress.toml")
        .replace("/run/corral", &run.display().to_string())
        .replace("/var/lib/wordpress", &lib.display().to_string())
        .replace("127.0.0.1:8080", "127.0.0.1:0")
        .replace("127.0.0.1:9180", "127.0.0.1:0");
    // fastcgi and http (the status listener logs its own line).
    let (corral, nginx) = wordpress_nginx(dir.path(), &config, 2, &lib);

    let r = curl(&format!("{}/wp-includes/version.php", nginx.url(0)), &[]);
    assert_eq!(
        r.status,
        200,
        "{r:?}\n{}\n{}",
        nginx.error_log(),
        corral.log()
    );
    let r = curl(&format!("{}/wp-content/style.css", nginx.url(0)), &[]);
    assert_eq!(r.text(), "body { color: black }", "{r:?}");
    for path in [
        "/.htaccess",
        "/wp-content/.env",
        "/wp-content/.git/config",
        "/wp-content/X.PHP",
        "/wp-content/x.php.bak",
        "/wp-content/x.php~",
    ] {
        let r = curl(&format!("{}{path}", nginx.url(0)), &[]);
        assert!(
            r.status == 403 || r.status == 404,
            "{path} was served: {r:?}"
        );
        assert!(!r.text().contains("SECRET"), "{path}: {r:?}");
    }
    // corral's own listener serves the same code and wp-content.
    let addr = corral.http_addr();
    assert_eq!(
        http(addr, "GET", "/wp-includes/version.php", &[], b"").status,
        200
    );
    let r = http(addr, "GET", "/wp-content/style.css", &[], b"");
    assert_eq!(r.text(), "body { color: black }", "{}", corral.log());
    assert_eq!(http(addr, "GET", "/wp-content/.env", &[], b"").status, 404);
}
