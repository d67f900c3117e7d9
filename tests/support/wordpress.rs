//! The WordPress fixture of tests/app_wordpress.rs (included there by path, so that no
//! other test binary compiles it): WordPress 6.1 as Debian packages it, on a MariaDB server
//! of its own, installed three times, each site behind one front: corral's HTTP listener and
//! nginx (both on a php-cgi pool), and a second corral whose pool is the native PHP worker.
//! See tests/app_wordpress.rs for what the tests check.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::time::Duration;

use tokio::time::Instant;

use crate::support::apps::{chmod, setup, sha256, shared, writable_dir, Browser, Reaper};
use crate::support::front::Nginx;
use crate::support::matrix::{snippet, FASTCGI_SOCKET};
use crate::support::server::{Corral, HttpResponse};

/// Debian's WordPress.
pub const WORDPRESS: &str = "/usr/share/wordpress";
/// The admin account each install creates.
pub const ADMIN: (&str, &str) = ("admin", "corral-wp-Pa55word");
/// The database account WordPress uses.
pub const DB_USER: (&str, &str) = ("wordpress", "corral-db-pass");
/// The blog title each install gets.
pub const TITLE: &str = "Corral Test Blog";

/// One WordPress site behind one front server.
pub struct Site {
    /// Which front, for messages.
    pub front: &'static str,
    /// Where the front listens.
    pub addr: SocketAddr,
    /// The Host header (name and port): picks the config file.
    pub host: String,
    /// The site's URL as WordPress builds it: nginx passes the Host without its port
    /// (Debian's fastcgi_params sends `$host`), corral as the client sent it.
    pub base: String,
}

pub struct Fixture {
    pub via_corral: Site,
    pub via_nginx: Site,
    pub via_native: Site,
    pub corral: Corral,
    /// The corral whose pool is the native PHP worker.
    pub native: Corral,
    pub _nginx: Nginx,
    /// Kept with the fixture (never dropped): its pipe closes when the binary exits.
    pub _reaper: Reaper,
}

static FIXTURE: OnceLock<Result<Fixture, String>> = OnceLock::new();

pub fn fixture() -> &'static Fixture {
    shared(&FIXTURE, start)
}

fn start() -> Fixture {
    let reaper = Reaper::start("corral-wp-");
    let dir = reaper.dir.clone();
    let socket = mariadb(&reaper, &dir);
    let pid = std::process::id();
    let hosts = [
        format!("wp-corral-{pid}.corral.test"),
        format!("wp-nginx-{pid}.corral.test"),
        format!("wp-native-{pid}.corral.test"),
    ];
    for (i, host) in hosts.iter().enumerate() {
        let content = content_dir(&dir.join(format!("site{i}")));
        let config = PathBuf::from(format!("/etc/wordpress/config-{host}.php"));
        std::fs::write(
            &config,
            format!(
                "<?php\n\
                 define('DB_NAME', 'wp{i}');\n\
                 define('DB_USER', '{user}');\n\
                 define('DB_PASSWORD', '{password}');\n\
                 define('DB_HOST', 'localhost:{socket}');\n\
                 define('WP_CONTENT_DIR', '{content}');\n\
                 // No loopback HTTP from cron, no calls to wordpress.org.\n\
                 define('DISABLE_WP_CRON', true);\n\
                 define('WP_HTTP_BLOCK_EXTERNAL', true);\n\
                 define('AUTOMATIC_UPDATER_DISABLED', true);\n\
                 {keys}",
                keys = keys_and_salts(&format!("{pid}-{i}")),
                user = DB_USER.0,
                password = DB_USER.1,
                socket = socket.display(),
                content = content.display(),
            ),
        )
        .unwrap();
        reaper.remove_on_exit(&config);
        chmod(&config, 0o644);
    }

    let fcgi = dir.join("corral-fcgi.sock");
    let config = format!(
        r#"
[server]
runtime_dir = "{dir}/run"
user = "nobody"
log_level = "info"

[[listen]]
address = "127.0.0.1:0"
protocol = "http"

[[listen]]
address = "unix:{fcgi}"
protocol = "fastcgi"

[pools.php]
command = ["php-cgi", "-d", "upload_max_filesize=16M", "-d", "post_max_size=16M"]
mode = "static"
max = 4

# corral's own listener (the FastCGI listener's context below wins there, named by
# its listener): WordPress's code, the pretty permalinks through its front controller,
# and the site's wp-content (kept apart, as Debian does) as static files.
{http_contexts}

[[contexts]]
listen = "unix:{fcgi}"
root = "{wordpress}"
pool = "php"
"#,
        dir = dir.display(),
        fcgi = fcgi.display(),
        wordpress = WORDPRESS,
        http_contexts = http_contexts(&dir.join("site0")),
    );
    let corral = reaper.corral_listening(&config, 2);
    let native = reaper.corral(&format!(
        r#"
[server]
runtime_dir = "{dir}/run-native"
user = "nobody"
log_level = "info"

[[listen]]
address = "127.0.0.1:0"
protocol = "http"

[pools.php]
worker = "native"
worker_path = "{worker}"
mode = "static"
max = 2

{http_contexts}"#,
        dir = dir.display(),
        worker = crate::support::native::worker().display(),
        http_contexts = http_contexts(&dir.join("site2")),
    ));

    let nginx_dir = dir.join("nginx");
    std::fs::create_dir(&nginx_dir).unwrap();
    std::os::unix::fs::symlink(
        "/etc/nginx/fastcgi_params",
        nginx_dir.join("fastcgi_params"),
    )
    .unwrap();
    let text = snippet(
        "conf/nginx/wordpress.conf",
        &[
            ("blog.example.com", hosts[1].clone()),
            (FASTCGI_SOCKET, fcgi.display().to_string()),
            (
                "/var/lib/wordpress",
                dir.join("site1").display().to_string(),
            ),
            ("listen 80;", String::new()),
        ],
    );
    let body = crate::support::front::nginx_blocks(&text, "server")
        .pop()
        .expect("conf/nginx/wordpress.conf has a server block")
        .1;
    // Debian's nginx.conf includes the media types in its http block; the snippet is a
    // server block of such a file.
    let nginx = Nginx::start(&nginx_dir, "  include /etc/nginx/mime.types;", &[body]);
    reaper.kill_on_exit(nginx.pid());

    let via_corral = Site {
        front: "corral's http listener",
        addr: corral.http_addr(),
        host: format!("{}:{}", hosts[0], corral.http_addr().port()),
        base: format!("http://{}:{}", hosts[0], corral.http_addr().port()),
    };
    let via_nginx = Site {
        front: "nginx",
        addr: SocketAddr::from(([127, 0, 0, 1], nginx.ports[0])),
        host: format!("{}:{}", hosts[1], nginx.ports[0]),
        base: format!("http://{}", hosts[1]),
    };
    let via_native = Site {
        front: "corral's native PHP worker",
        addr: native.http_addr(),
        host: format!("{}:{}", hosts[2], native.http_addr().port()),
        base: format!("http://{}:{}", hosts[2], native.http_addr().port()),
    };
    // The installs at once: each is a few seconds of PHP and SQL.
    std::thread::scope(|s| {
        let a = s.spawn(|| install(&via_corral, &corral));
        let b = s.spawn(|| install(&via_nginx, &corral));
        let c = s.spawn(|| install(&via_native, &native));
        a.join().unwrap();
        b.join().unwrap();
        c.join().unwrap();
    });
    Fixture {
        via_corral,
        via_nginx,
        via_native,
        corral,
        native,
        _nginx: nginx,
        _reaper: reaper,
    }
}

/// The contexts of corral's http listener for the site whose directory is `site`.
pub fn http_contexts(site: &Path) -> String {
    format!(
        r#"[[contexts]]
prefix = "/wp-content"
root = "{site}"
static_files = true
pool = "php"

[[contexts]]
root = "{WORDPRESS}"
static_files = true
front_controller = "/index.php"
pool = "php"
"#,
        site = site.display()
    )
}

/// A MariaDB server of the fixture's own, as `mysql`, on a Unix socket only; returns the
/// socket once the databases `wp0`, `wp1` and `wp2` and WordPress's account exist.
fn mariadb(reaper: &Reaper, dir: &Path) -> PathBuf {
    let mysql = nix::unistd::User::from_name("mysql")
        .unwrap()
        .expect("mariadb-server creates the mysql user");
    let data = dir.join("mariadb");
    let run = dir.join("mariadb-run");
    for d in [&data, &run] {
        std::fs::create_dir(d).unwrap();
        std::os::unix::fs::chown(d, Some(mysql.uid.as_raw()), Some(mysql.gid.as_raw())).unwrap();
    }
    let mut install = Command::new("mariadb-install-db");
    install
        .arg("--no-defaults")
        .arg(format!("--datadir={}", data.display()))
        .args(["--user=mysql", "--auth-root-authentication-method=socket"])
        .arg("--skip-test-db");
    setup(install, Duration::from_secs(60));
    let socket = run.join("mysqld.sock");
    let server = Command::new("mariadbd")
        .arg("--no-defaults")
        .arg(format!("--datadir={}", data.display()))
        .arg(format!("--socket={}", socket.display()))
        .arg(format!("--pid-file={}", run.join("mysqld.pid").display()))
        .arg(format!("--log-error={}", run.join("error.log").display()))
        .args(["--user=mysql", "--skip-networking", "--skip-log-bin"])
        .args([
            "--innodb-buffer-pool-size=64M",
            "--innodb-flush-log-at-trx-commit=0",
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start mariadbd");
    reaper.kill_on_exit(server.id());
    let deadline = Instant::now() + Duration::from_secs(30);
    while std::os::unix::net::UnixStream::connect(&socket).is_err() {
        assert!(
            Instant::now() < deadline,
            "mariadbd did not listen on {} within 30 s:\n{}",
            socket.display(),
            std::fs::read_to_string(run.join("error.log")).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    // Not waited for: the reaper kills it when the test binary exits.
    drop(server);
    let sql = format!(
        "CREATE DATABASE wp0; CREATE DATABASE wp1; CREATE DATABASE wp2; \
         CREATE USER '{user}'@'localhost' IDENTIFIED BY '{password}'; \
         GRANT ALL ON wp0.* TO '{user}'@'localhost'; GRANT ALL ON wp1.* TO '{user}'@'localhost'; \
         GRANT ALL ON wp2.* TO '{user}'@'localhost';",
        user = DB_USER.0,
        password = DB_USER.1,
    );
    let mut client = Command::new("mariadb");
    client
        .arg("--no-defaults")
        .arg(format!("--socket={}", socket.display()))
        .args(["-u", "root", "-e", &sql]);
    setup(client, Duration::from_secs(30));
    socket
}

/// A site's `wp-content` under `site`: Debian's themes and plugins linked in, and an
/// uploads directory the workers (`nobody`) can write.
fn content_dir(site: &Path) -> PathBuf {
    let content = site.join("wp-content");
    std::fs::create_dir_all(&content).unwrap();
    chmod(site, 0o755);
    chmod(&content, 0o755);
    for sub in ["themes", "plugins"] {
        std::os::unix::fs::symlink(
            Path::new(WORDPRESS).join("wp-content").join(sub),
            content.join(sub),
        )
        .unwrap();
    }
    writable_dir(&content.join("uploads"));
    writable_dir(&content.join("upgrade"));
    content
}

/// The install form (wp-admin/install.php, step 2), as a person submits it.
fn install(site: &Site, corral: &Corral) {
    let mut b = Browser::default();
    let r = site.get(&mut b, "/wp-admin/install.php");
    site.expect(&r, 200, "weblog_title", corral);
    let r = site.post(
        &mut b,
        "/wp-admin/install.php?step=2",
        &[
            ("weblog_title", TITLE),
            ("user_name", ADMIN.0),
            ("admin_password", ADMIN.1),
            ("admin_password2", ADMIN.1),
            ("pw_weak", "1"),
            ("admin_email", "admin@example.com"),
            ("blog_public", "0"),
            ("Submit", "Install WordPress"),
        ],
    );
    site.expect(&r, 200, "WordPress has been installed", corral);
}

impl Site {
    /// Asserts that `r` has `status` and a body holding `text`, showing both and corral's
    /// log otherwise.
    pub fn expect(&self, r: &HttpResponse, status: u16, text: &str, corral: &Corral) {
        assert!(
            r.status == status && r.text().contains(text),
            "{}: expected {status} with {text:?}, got {}: {}\n{}",
            self.front,
            r.status,
            r.text(),
            corral.log()
        );
    }

    pub fn get(&self, b: &mut Browser, target: &str) -> HttpResponse {
        b.request(self.addr, "GET", target, &[("Host", &self.host)], b"")
    }

    pub fn post(&self, b: &mut Browser, target: &str, fields: &[(&str, &str)]) -> HttpResponse {
        let body = crate::support::apps::form_urlencode(fields);
        b.request(
            self.addr,
            "POST",
            target,
            &[
                ("Host", &self.host),
                ("Content-Type", "application/x-www-form-urlencoded"),
            ],
            body.as_bytes(),
        )
    }

    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    /// A browser logged in as the admin.
    pub fn logged_in(&self) -> Browser {
        // One login at a time: WordPress keeps a user's sessions in one user-meta value
        // that each login reads, extends and writes back, so two logins of the admin at
        // once (tests run in parallel) can lose one session, and that browser's cookie is
        // then refused with a 302 to wp-login.php.
        static LOGINS: std::sync::Mutex<()> = std::sync::Mutex::new(());
        let _one = LOGINS
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let mut b = Browser::default();
        // wp-login.php sets its test cookie first and refuses a login without it.
        let r = self.get(&mut b, "/wp-login.php");
        assert_eq!(r.status, 200, "{}: {}", self.front, r.text());
        assert!(
            b.cookie("wordpress_test_cookie").is_some(),
            "{}",
            self.front
        );
        let r = self.post(
            &mut b,
            "/wp-login.php",
            &[
                ("log", ADMIN.0),
                ("pwd", ADMIN.1),
                ("wp-submit", "Log In"),
                ("redirect_to", &self.url("/wp-admin/")),
                ("testcookie", "1"),
            ],
        );
        assert_eq!(r.status, 302, "{}: {}", self.front, r.text());
        assert_eq!(r.header("location"), Some(&*self.url("/wp-admin/")));
        b
    }
}

/// WordPress's eight keys and salts as constants. Without them WordPress makes each on
/// first use and stores it, and two fresh PHP processes doing so at once may keep different
/// ones, so that a cookie signed by one is refused by the other. Distinct per site and run.
fn keys_and_salts(tag: &str) -> String {
    let mut out = String::new();
    for name in [
        "AUTH_KEY",
        "SECURE_AUTH_KEY",
        "LOGGED_IN_KEY",
        "NONCE_KEY",
        "AUTH_SALT",
        "SECURE_AUTH_SALT",
        "LOGGED_IN_SALT",
        "NONCE_SALT",
    ] {
        let value = sha256(format!("{tag}-{name}-{:?}", std::time::SystemTime::now()).as_bytes());
        out.push_str(&format!("define('{name}', '{value}');\n"));
    }
    out
}

/// Held for reading by the tests of the sites, for writing by the memory test, so the
/// memory comparison runs alone.
pub static SITES: std::sync::RwLock<()> = std::sync::RwLock::new(());

/// Runs `check` on every site at once: through corral's listener and nginx (php-cgi), and
/// through the native PHP worker's corral.
pub fn each_site(check: impl Fn(&Site) + Sync) {
    let _sites = SITES
        .read()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let f = fixture();
    let sites = [
        (&f.via_corral, &f.corral),
        (&f.via_nginx, &f.corral),
        (&f.via_native, &f.native),
    ];
    let results: Vec<_> = std::thread::scope(|s| {
        let handles: Vec<_> = sites
            .iter()
            .map(|(site, _)| s.spawn(|| check(site)))
            .collect();
        handles.into_iter().map(|h| h.join()).collect()
    });
    let failed: Vec<_> = sites
        .iter()
        .zip(&results)
        .filter(|(_, r)| r.is_err())
        .map(|((site, corral), _)| format!("{}; its corral's log:\n{}", site.front, corral.log()))
        .collect();
    if !failed.is_empty() {
        panic!("failed through {}", failed.join("\n"));
    }
}
