//! The nginx cells of the front-server matrix (tests/support/matrix.rs): conf/nginx's
//! `fastcgi_pass` drop-in, `scgi_pass` and `proxy_pass` snippets, run as written in one nginx
//! in front of corral on conf/php.toml, each with a GET and query, a 10 MiB POST, 404s, a
//! redirect, cookies and 100 requests.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing,
    missing_docs
)]

mod support;

use support::front::{nginx_blocks, Nginx};
use support::matrix::{
    snippet, Matrix, Site, FASTCGI_SOCKET, HTTP_ADDR, PDEATHSIG, ROOT, SCGI_SOCKET,
};
use support::matrix_checks::front_matrix;

fn build() -> Matrix {
    let site = Site::start();
    let root = || (ROOT, site.root_value());
    let snippets = [
        snippet(
            "conf/nginx/php-fpm-dropin.conf",
            &[root(), (FASTCGI_SOCKET, site.fastcgi_socket())],
        ),
        snippet(
            "conf/nginx/scgi-pass.conf",
            &[root(), (SCGI_SOCKET, site.scgi_socket())],
        ),
        snippet(
            "conf/nginx/proxy-pass.conf",
            &[(HTTP_ADDR, site.http_addr().to_string())],
        ),
    ];
    // Each snippet's upstreams go in the http block; its server block's body is served on a
    // port of the test's own (its `listen 80;` is the port placeholder).
    let mut upstreams = String::new();
    let mut servers = Vec::new();
    for text in &snippets {
        for (head, body) in nginx_blocks(text, "upstream") {
            upstreams.push_str(&format!("{head} {{{body}}}\n"));
        }
        let blocks = nginx_blocks(text, "server");
        assert_eq!(blocks.len(), 1, "one server block per snippet");
        let body = &blocks[0].1;
        assert!(body.contains("listen 80;"), "{body}");
        servers.push(body.replace("listen 80;", ""));
    }
    let dir = site.subdir("nginx");
    // The snippets include fastcgi_params and scgi_params relative to nginx's configuration
    // directory, as Debian's /etc/nginx has them.
    for params in ["fastcgi_params", "scgi_params"] {
        std::os::unix::fs::symlink(format!("/etc/nginx/{params}"), dir.join(params)).unwrap();
    }
    let nginx = Nginx::start_via(&PDEATHSIG, &dir, &upstreams, &servers);
    let logs = [dir.join("nginx-error.log")];
    let mut m = Matrix::new(site);
    m.cell("fastcgi_pass", "nginx", nginx.ports[0], &logs);
    m.cell("scgi_pass", "nginx", nginx.ports[1], &logs);
    m.cell("proxy_pass", "nginx", nginx.ports[2], &logs);
    m.keep(nginx);
    m
}

front_matrix!(build; fastcgi_pass, scgi_pass, proxy_pass);

/// What corral's own listener never serves, nginx does not serve either through the drop-in
/// and scgi_pass snippets, which serve the root's other files themselves: dotfiles (but
/// /.well-known/) and PHP source in any letter case or as a backup copy. A script still
/// runs.
#[test]
fn no_dotfile_or_php_source_is_served_through_the_snippets() {
    let m = matrix();
    let root = &m.site.root;
    for dir in [".git", ".well-known/acme-challenge"] {
        std::fs::create_dir_all(root.join(dir)).unwrap();
    }
    let secrets = [
        ("/.env", "DB_PASSWORD=SECRET"),
        ("/.git/config", "[remote] SECRET"),
        ("/.htaccess", "SECRET rules"),
        ("/X.PHP", "<?php echo 'ran'; // SECRET"),
        ("/x.php.bak", "<?php // SECRET backup"),
        ("/x.php~", "<?php // SECRET editor copy"),
        ("/x.php.orig", "<?php // SECRET original"),
        ("/x.phtml", "<?php // SECRET template"),
    ];
    for (path, text) in secrets {
        std::fs::write(root.join(&path[1..]), text).unwrap();
    }
    std::fs::write(root.join(".well-known/acme-challenge/token"), "token-body").unwrap();
    for cell in ["fastcgi_pass", "scgi_pass"] {
        for (path, _) in secrets {
            let r = support::front::curl(&m.url(cell, path), &[]);
            assert!(
                !r.text().contains("SECRET"),
                "{cell}: {path} was served: {r:?}"
            );
            assert!(r.status == 403 || r.status == 404, "{cell}: {path}: {r:?}");
        }
        let r = support::front::curl(&m.url(cell, "/.well-known/acme-challenge/token"), &[]);
        assert_eq!((r.status, r.text().as_str()), (200, "token-body"), "{cell}");
        let r = support::front::curl(&m.url(cell, "/query.php?q=still"), &[]);
        assert_eq!(r.status, 200, "{cell}: {r:?}");
        assert!(r.text().starts_with("q=still "), "{cell}: {r:?}");
    }
}
