//! WordPress 6.1 as Debian packages it, on MariaDB, with PHP run by a php-cgi pool corral
//! spawns, in front of two front servers, and by corral's native PHP worker:
//!
//! - corral's own HTTP listener, with `front_controller = "/index.php"` for the pretty
//!   permalinks and static files for wp-content;
//! - nginx with conf/nginx/wordpress.conf as written (`try_files $uri $uri/
//!   /index.php?$args`, `fastcgi_pass` to corral's FastCGI listener), only its placeholders
//!   replaced;
//! - a second corral whose pool is the native PHP worker (`worker = "native"`, classic mode),
//!   with the same contexts as the first.
//!
//! Each front has a site of its own (its own database and wp-content), installed through
//! wp-admin/install.php; the tests then read the front page, switch on pretty permalinks in
//! the admin and read a post by its pretty URL, log in with cookies, upload a file to the
//! media library and fetch it back, and open the dashboard.
//!
//! Debian's /usr/share/wordpress/wp-config.php picks `/etc/wordpress/config-HOST.php` by
//! the request's Host (port stripped). Each site therefore gets a host name of its own,
//! `wp-FRONT-PID.corral.test`, sent as the Host header, and its config file, which the
//! reaper removes when the test binary exits, as it kills corral, nginx and the MariaDB
//! server (one of each per binary, shared by the tests) and removes their directory.
//! MariaDB runs as `mysql` (mariadbd refuses root) on a private socket and datadir.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing,
    missing_docs
)]

mod support;

#[path = "support/wordpress.rs"]
mod wordpress;

use std::time::Duration;

use support::apps::{input_value, sha256, Browser};
use tokio::time::Instant;
use wordpress::{each_site, fixture, http_contexts, Site, ADMIN, SITES, TITLE};

#[test]
fn the_front_page_shows_the_installed_blog() {
    each_site(|site| {
        let r = site.get(&mut Browser::default(), "/");
        assert_eq!(r.status, 200, "{}: {}", site.front, r.text());
        let page = r.text();
        assert!(page.contains(TITLE), "{}: {page}", site.front);
        assert!(page.contains("Hello world!"), "{}: {page}", site.front);
        // The page's links use the URL the install saw, the front's own.
        assert!(page.contains(&site.url("/")), "{}: {page}", site.front);
        // A static file of the theme, through the front (nginx, or corral's static files).
        let css = site.get(
            &mut Browser::default(),
            "/wp-includes/css/dist/block-library/style.min.css",
        );
        assert_eq!(css.status, 200, "{}", site.front);
        assert!(css.header("content-type").unwrap().starts_with("text/css"));
    });
}

#[test]
fn pretty_permalinks_reach_the_post() {
    each_site(|site| {
        let mut b = site.logged_in();
        let r = site.get(&mut b, "/wp-admin/options-permalink.php");
        assert_eq!(r.status, 200, "{}: {}", site.front, r.text());
        let nonce = input_value(&r.text(), "_wpnonce").expect("the permalink form's nonce");
        let r = site.post(
            &mut b,
            "/wp-admin/options-permalink.php",
            &[
                ("_wpnonce", &nonce),
                ("_wp_http_referer", "/wp-admin/options-permalink.php"),
                ("selection", "/%postname%/"),
                ("permalink_structure", "/%postname%/"),
                ("category_base", ""),
                ("tag_base", ""),
                ("submit", "Save Changes"),
            ],
        );
        assert_eq!(r.status, 302, "{}: {}", site.front, r.text());
        // The post by its pretty URL: no such file, so the front controller (or nginx's
        // try_files) runs index.php with the original REQUEST_URI, which WordPress routes.
        let r = site.get(&mut Browser::default(), "/hello-world/");
        assert_eq!(r.status, 200, "{}: {}", site.front, r.text());
        assert!(r.text().contains("Welcome to WordPress"), "{}", site.front);
        // The old URL now redirects to the pretty one...
        let r = site.get(&mut Browser::default(), "/?p=1");
        assert_eq!(r.status, 301, "{}: {}", site.front, r.text());
        assert_eq!(r.header("location"), Some(&*site.url("/hello-world/")));
        // ...and a pretty URL naming nothing is WordPress's own 404 page.
        let r = site.get(&mut Browser::default(), "/no-such-post-here/");
        assert_eq!(r.status, 404, "{}", site.front);
        assert!(r.text().contains(TITLE), "{}: {}", site.front, r.text());
    });
}

#[test]
fn login_sets_the_cookies_and_a_wrong_password_does_not() {
    each_site(|site| {
        let b = site.logged_in();
        assert!(
            b.cookie_names()
                .iter()
                .any(|n| n.starts_with("wordpress_logged_in_")),
            "{}: {:?}",
            site.front,
            b.cookie_names()
        );
        let mut b = Browser::default();
        site.get(&mut b, "/wp-login.php");
        let r = site.post(
            &mut b,
            "/wp-login.php",
            &[("log", ADMIN.0), ("pwd", "wrong"), ("testcookie", "1")],
        );
        assert_eq!(r.status, 200, "{}", site.front);
        assert!(
            r.text().contains("is incorrect"),
            "{}: {}",
            site.front,
            r.text()
        );
        // Not logged in: the admin sends the browser to the login page.
        let r = site.get(&mut b, "/wp-admin/");
        assert_eq!(r.status, 302, "{}", site.front);
        assert!(r.header("location").unwrap().contains("/wp-login.php"));
    });
}

#[test]
fn a_media_upload_is_served_back_unchanged() {
    each_site(|site| {
        let mut b = site.logged_in();
        let r = site.get(&mut b, "/wp-admin/media-new.php?browser-uploader");
        assert_eq!(r.status, 200, "{}: {}", site.front, r.text());
        let nonce = input_value(&r.text(), "_wpnonce").expect("the upload form's nonce");
        let data: Vec<u8> = (0..20_000)
            .flat_map(|i| format!("line {i} of a corral upload test\n").into_bytes())
            .collect();
        let name = format!("corral-{}.txt", site.front.len());
        let (content_type, body) = support::apps::multipart(
            &[
                ("name", &name),
                ("action", "upload-attachment"),
                ("_wpnonce", &nonce),
            ],
            ("async-upload", &name, &data),
        );
        let r = b.request(
            site.addr,
            "POST",
            "/wp-admin/async-upload.php",
            &[("Host", &site.host), ("Content-Type", &content_type)],
            &body,
        );
        assert_eq!(r.status, 200, "{}: {}", site.front, r.text());
        let answer = r.text();
        assert!(
            answer.contains("\"success\":true"),
            "{}: {answer}",
            site.front
        );
        // The JSON's "url", with its escaped slashes.
        let url = answer
            .split("\"url\":\"")
            .nth(1)
            .and_then(|rest| rest.split('"').next())
            .expect("the attachment's url")
            .replace("\\/", "/");
        let path = url
            .strip_prefix(&site.url(""))
            .unwrap_or_else(|| panic!("{}: {url} is not on the site", site.front));
        assert!(path.starts_with("/wp-content/uploads/"), "{path}");
        let r = site.get(&mut Browser::default(), path);
        assert_eq!(r.status, 200, "{}: {path}", site.front);
        assert_eq!(sha256(&r.body), sha256(&data), "{}: {path}", site.front);
    });
}

#[test]
fn the_dashboard_opens_for_the_admin() {
    each_site(|site| {
        let mut b = site.logged_in();
        let r = site.get(&mut b, "/wp-admin/");
        assert_eq!(r.status, 200, "{}: {}", site.front, r.text());
        let page = r.text();
        assert!(page.contains("<title>Dashboard"), "{}: {page}", site.front);
        assert!(page.contains("At a Glance"), "{}", site.front);
        // The directory without its '/' is a redirect to it, on every front.
        let r = site.get(&mut b, "/wp-admin");
        assert_eq!(r.status, 301, "{}", site.front);
        assert!(r.header("location").unwrap().ends_with("/wp-admin/"));
    });
}

/// The summed PSS, in bytes, of every process under corral `pid` (its workers and their
/// children), corral itself left out.
fn php_pss(pid: u32) -> u64 {
    let tree = corral::process::process_tree(pid).unwrap();
    tree.iter()
        .filter(|&&p| p != pid)
        .filter_map(|&p| corral::process::memory_of(p, &[p]).ok())
        .map(|m| m.bytes())
        .sum()
}

/// The parent pid of `pid`, from `/proc/PID/stat` (0 if it is gone).
fn parent_of(pid: u32) -> u32 {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| {
            let (_, rest) = s.rsplit_once(')')?;
            rest.split_whitespace().nth(1)?.parse().ok()
        })
        .unwrap_or(0)
}

/// `php_children` on WordPress (issue 10): four PHP processes as one php-cgi parent with
/// four children take less memory than four separate php-cgi workers, summed over the
/// whole process tree after the same pages, because the children share one OPcache.
#[test]
fn php_children_serve_wordpress_in_less_memory_than_separate_workers() {
    let f = fixture();
    let _sites = SITES
        .write()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let dir = f._reaper.dir.display().to_string();
    let pages = [
        "/",
        "/?p=1",
        "/wp-login.php",
        "/?s=hello",
        "/?cat=1",
        "/?author=1",
    ];
    let mut pss = Vec::new();
    for (name, pool) in [
        ("4 separate workers", "max = 4"),
        ("php_children = 4", "max = 1\nphp_children = 4"),
    ] {
        let corral = f._reaper.corral(&format!(
            r#"
[server]
runtime_dir = "{dir}/run-{tag}"
user = "nobody"
log_level = "info"

[[listen]]
address = "127.0.0.1:0"
protocol = "http"

[pools.php]
command = ["php-cgi"]
mode = "static"
{pool}

{contexts}"#,
            tag = pss.len(),
            contexts = http_contexts(&f._reaper.dir.join("site0")),
        ));
        // The fixture's own site, by its Host (the fixture's port: WordPress's URLs stay
        // as installed), sent to this corral.
        let site = Site {
            front: name,
            addr: corral.http_addr(),
            host: f.via_corral.host.clone(),
            base: f.via_corral.base.clone(),
        };
        // Four browsers at once, so every process compiles the pages.
        std::thread::scope(|s| {
            for _ in 0..4 {
                s.spawn(|| {
                    for _ in 0..3 {
                        for page in pages {
                            let r = site.get(&mut Browser::default(), page);
                            assert!(
                                r.status == 200 || r.status == 301,
                                "{name} {page}: {} {}\n{}",
                                r.status,
                                r.text(),
                                corral.log()
                            );
                        }
                    }
                });
            }
        });
        // The tree is what the pool asked for: four php-cgi workers under corral, or one
        // php-cgi parent under corral with its four children.
        let tree = corral::process::process_tree(corral.pid()).unwrap();
        let php: Vec<u32> = tree
            .iter()
            .copied()
            .filter(|&p| p != corral.pid())
            .collect();
        let direct = php
            .iter()
            .filter(|&&p| parent_of(p) == corral.pid())
            .count();
        let (want_direct, want_all) = if pool.contains("php_children") {
            (1, 5)
        } else {
            (4, 4)
        };
        assert_eq!(
            (direct, php.len()),
            (want_direct, want_all),
            "{name}: (workers under corral, PHP processes in all) in {php:?}\n{}",
            corral.log()
        );
        for &p in &php {
            let comm = std::fs::read_to_string(format!("/proc/{p}/comm")).unwrap_or_default();
            assert_eq!(comm.trim(), "php-cgi", "{name}: process {p} of the tree");
        }
        let bytes = php_pss(corral.pid());
        println!(
            "{name}: {} PHP processes, {:.1} MiB PSS in all",
            php.len(),
            bytes as f64 / f64::from(1 << 20)
        );
        pss.push((name, bytes));
        // A graceful stop: php-cgi's parent passes SIGTERM to its children, which the
        // reaper's SIGKILL of corral would leave behind.
        corral.signal(nix::sys::signal::Signal::SIGTERM);
        let deadline = Instant::now() + Duration::from_secs(15);
        while corral::process::process_tree(corral.pid()).is_ok_and(|t| t.len() > 1) {
            assert!(Instant::now() < deadline, "{name}: workers still running");
            std::thread::sleep(Duration::from_millis(50));
        }
    }
    let (separate, children) = (pss[0].1, pss[1].1);
    assert!(
        children < separate,
        "php_children took {children} bytes, separate workers {separate}"
    );
}
