//! The Caddy cells of the front-server matrix (tests/support/matrix.rs): conf/caddy's
//! `php_fastcgi` and `reverse_proxy` Caddyfiles, as two sites of one `caddy run` (Debian's
//! Caddy 2.6, admin endpoint and automatic HTTPS off, its home and XDG dirs in the temp dir)
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

use support::matrix::{guarded, snippet, Daemon, Matrix, Site, FASTCGI_SOCKET, HTTP_ADDR, ROOT};
use support::matrix_checks::front_matrix;

fn build() -> Matrix {
    let site = Site::start();
    let dir = site.subdir("caddy");
    let (caddy, ports) = Daemon::start("caddy", &dir, 2, &[], |ports| {
        // `example.com` is the site placeholder of both Caddyfiles: a plain-HTTP site on a
        // port of the test's own here.
        let site_on = |i: usize| ("example.com", format!("http://127.0.0.1:{}", ports[i]));
        let php = snippet(
            "conf/caddy/Caddyfile",
            &[
                site_on(0),
                (ROOT, site.root_value()),
                (FASTCGI_SOCKET, site.fastcgi_socket()),
            ],
        );
        let proxy = snippet(
            "conf/caddy/reverse-proxy.Caddyfile",
            &[site_on(1), (HTTP_ADDR, site.http_addr().to_string())],
        );
        // The global options block comes first in a Caddyfile (tab-indented, as `caddy fmt`
        // has it, or Caddy warns).
        let caddyfile = format!(
            "{{\n\tadmin off\n\tauto_https off\n\tdefault_bind 127.0.0.1\n\
             \tstorage file_system {d}/data\n}}\n\n{php}\n{proxy}",
            d = dir.display()
        );
        let file = dir.join("Caddyfile");
        std::fs::write(&file, caddyfile).unwrap();
        let mut cmd = guarded("/usr/bin/caddy");
        cmd.args(["run", "--adapter", "caddyfile", "--config"])
            .arg(&file)
            .env("HOME", &dir)
            .env("XDG_DATA_HOME", dir.join("xdg-data"))
            .env("XDG_CONFIG_HOME", dir.join("xdg-config"));
        cmd
    });
    let logs = [dir.join("caddy.out")];
    let mut m = Matrix::new(site);
    m.cell("php_fastcgi", "Caddy", ports[0], &logs);
    m.cell("reverse_proxy", "Caddy", ports[1], &logs);
    m.keep(caddy);
    m
}

front_matrix!(build; php_fastcgi, reverse_proxy);
