//! The lighttpd cells of the front-server matrix (tests/support/matrix.rs): conf/lighttpd's
//! mod_fastcgi, mod_scgi and mod_proxy snippets, each included by a `lighttpd -D` of its own
//! (two claim `.php` and the third every path, as a site uses one of them) in front of
//! corral on conf/php.toml, each with a GET and query, a 10 MiB POST, 404s, a redirect,
//! cookies and 100 requests.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing,
    missing_docs
)]

mod support;

use support::matrix::{guarded, snippet, Daemon, Matrix, Site, FASTCGI_SOCKET, SCGI_SOCKET};
use support::matrix_checks::front_matrix;

fn build() -> Matrix {
    let site = Site::start();
    let http_port = site.http_addr().port();
    let cells = [
        (
            "mod_fastcgi",
            snippet(
                "conf/lighttpd/fastcgi.conf",
                &[(FASTCGI_SOCKET, site.fastcgi_socket())],
            ),
        ),
        (
            "mod_scgi",
            snippet(
                "conf/lighttpd/scgi.conf",
                &[(SCGI_SOCKET, site.scgi_socket())],
            ),
        ),
        (
            "mod_proxy",
            snippet(
                "conf/lighttpd/proxy.conf",
                // lighttpd names corral's http listener by host and port apart.
                &[("\"port\" => 8080", format!("\"port\" => {http_port}"))],
            ),
        ),
    ];
    let mut started = Vec::new();
    for (name, text) in cells {
        let dir = site.subdir(name);
        let included = dir.join("snippet.conf");
        std::fs::write(&included, text).unwrap();
        let logs = vec![dir.join("error.log")];
        let (daemon, ports) = Daemon::start(name, &dir, 1, &logs, |ports| {
            // The server's own settings, which a Debian lighttpd.conf has: the port, the
            // document root, where request bodies are buffered and where it logs.
            let conf = format!(
                "server.document-root = \"{root}\"\nserver.bind = \"127.0.0.1\"\n\
                 server.port = {port}\nserver.errorlog = \"{d}/error.log\"\n\
                 server.upload-dirs = ( \"{d}\" )\ninclude \"{included}\"\n",
                root = site.root_value(),
                port = ports[0],
                d = dir.display(),
                included = included.display(),
            );
            let file = dir.join("lighttpd.conf");
            std::fs::write(&file, conf).unwrap();
            let mut cmd = guarded("/usr/sbin/lighttpd");
            cmd.arg("-D").arg("-f").arg(&file);
            cmd
        });
        started.push((name, daemon, ports[0], logs));
    }
    let mut m = Matrix::new(site);
    for (name, daemon, port, logs) in started {
        m.cell(name, "lighttpd", port, &logs);
        m.keep(daemon);
    }
    m
}

front_matrix!(build; mod_fastcgi, mod_scgi, mod_proxy);
