//! The Apache 2.4 cells of the front-server matrix (tests/support/matrix.rs): conf/apache's
//! mod_proxy_fcgi snippets (`SetHandler` and `ProxyPassMatch`), mod_proxy_scgi and
//! mod_proxy_http, each a virtual host of one Apache (`apache2 -DFOREGROUND` on a minimal
//! configuration of the test's own) in front of corral on conf/php.toml, each with a GET and
//! query, a 10 MiB POST, 404s, a redirect, cookies and 100 requests.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing,
    missing_docs
)]

mod support;

use std::path::Path;

use support::matrix::{
    guarded, snippet, Daemon, Matrix, Site, FASTCGI_SOCKET, HTTP_ADDR, ROOT, SCGI_SOCKET,
};
use support::matrix_checks::front_matrix;

/// Debian's Apache modules.
const MODULES: &str = "/usr/lib/apache2/modules";

/// The cells, in the order of their ports, with their snippets.
const CELLS: [(&str, &str); 4] = [
    ("fcgi_sethandler", "conf/apache/proxy-fcgi.conf"),
    (
        "fcgi_proxypassmatch",
        "conf/apache/proxy-fcgi-proxypassmatch.conf",
    ),
    ("scgi_sethandler", "conf/apache/proxy-scgi.conf"),
    ("proxy_http", "conf/apache/proxy-http.conf"),
];

/// A minimal Apache: the modules the snippets need, everything it writes in `dir`, one
/// `Listen` per port and the snippets included after it.
fn apache_conf(dir: &Path, ports: &[u16], includes: &[String]) -> String {
    let d = dir.display();
    let mut conf = format!(
        "ServerRoot {d}\nServerName localhost\nPidFile {d}/apache.pid\n\
         ErrorLog {d}/error.log\nLogLevel warn\nMutex file:{d} default\n\
         DefaultRuntimeDir {d}\n\
         StartServers 1\nServerLimit 2\nThreadsPerChild 16\nMaxRequestWorkers 32\n"
    );
    for module in [
        "mpm_event",
        "authz_core",
        "proxy",
        "proxy_fcgi",
        "proxy_scgi",
        "proxy_http",
    ] {
        conf.push_str(&format!(
            "LoadModule {module}_module {MODULES}/mod_{module}.so\n"
        ));
    }
    // Apache started as root serves from children under this user, as Debian's does.
    if nix::unistd::Uid::effective().is_root() {
        conf.push_str("User www-data\nGroup www-data\n");
    }
    for port in ports {
        conf.push_str(&format!("Listen 127.0.0.1:{port}\n"));
    }
    for include in includes {
        conf.push_str(&format!("Include {include}\n"));
    }
    conf
}

fn build() -> Matrix {
    let site = Site::start();
    let dir = site.subdir("apache");
    let root = || (ROOT, site.root_value());
    let fastcgi = || (FASTCGI_SOCKET, site.fastcgi_socket());
    let logs = [dir.join("error.log")];
    let (apache, ports) = Daemon::start("apache", &dir, CELLS.len(), &logs, |ports| {
        let mut includes = Vec::new();
        for ((name, path), port) in CELLS.iter().zip(ports) {
            // `*:80` is the port placeholder of every Apache snippet.
            let vhost = ("*:80", format!("*:{port}"));
            let subs = match *name {
                "fcgi_sethandler" | "fcgi_proxypassmatch" => vec![root(), fastcgi(), vhost],
                "scgi_sethandler" => vec![root(), (SCGI_SOCKET, site.scgi_socket()), vhost],
                _ => vec![(HTTP_ADDR, site.http_addr().to_string()), vhost],
            };
            let file = dir.join(format!("{name}.conf"));
            std::fs::write(&file, snippet(path, &subs)).unwrap();
            includes.push(file.display().to_string());
        }
        let conf = dir.join("apache2.conf");
        std::fs::write(&conf, apache_conf(&dir, ports, &includes)).unwrap();
        let mut cmd = guarded("/usr/sbin/apache2");
        cmd.arg("-f").arg(&conf).arg("-DFOREGROUND");
        cmd
    });
    let mut m = Matrix::new(site);
    for ((name, _), port) in CELLS.iter().zip(&ports) {
        m.cell(name, "Apache", *port, &logs);
    }
    m.keep(apache);
    m
}

front_matrix!(build; fcgi_sethandler, fcgi_proxypassmatch, scgi_sethandler, proxy_http);
