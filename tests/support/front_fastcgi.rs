//! The site both FastCGI front suites run on (`tests/front_fastcgi.rs` with nginx in front,
//! `tests/front_fastcgi_raw.rs` with a FastCGI web server written out by hand): php-cgi
//! serving the test scripts from `www/`, and corral's fastcgi listener on a Unix socket in
//! front of it, with a status listener on port 0.

use std::path::Path;

use super::front::{php_cgi_with, Corral};
use super::peers::{shared_dir, write_file, Peer};

/// The scripts in `www/`, by name.
pub const SCRIPTS: &[(&str, &str)] = &[
    (
        "query.php",
        "<?php echo 'q=', $_GET['q'] ?? '', ' method=', $_SERVER['REQUEST_METHOD'];",
    ),
    (
        "form.php",
        "<?php echo 'name=', $_POST['name'] ?? '', ' age=', $_POST['age'] ?? '';",
    ),
    (
        "upload.php",
        "<?php $b = file_get_contents('php://input'); echo md5($b), ' ', strlen($b), ' ', \
         $_SERVER['CONTENT_LENGTH'];",
    ),
    (
        "download.php",
        "<?php $b = str_repeat('0123456789abcdef', 655360); header('X-Md5: ' . md5($b)); \
         header('Content-Type: application/octet-stream'); echo $b;",
    ),
    (
        "headers.php",
        "<?php echo 'custom=', $_SERVER['HTTP_X_CORRAL_TEST'] ?? 'none', \
         ' script=', $_SERVER['SCRIPT_NAME'], ' proxy=', $_SERVER['HTTP_PROXY'] ?? 'none';",
    ),
    (
        "cookies.php",
        "<?php setcookie('first', 'one'); setcookie('second', 'two'); \
         echo 'flavour=', $_COOKIE['flavour'] ?? 'none';",
    ),
    (
        "status.php",
        "<?php http_response_code((int)($_GET['code'] ?? 200)); echo 'status page';",
    ),
    (
        "redirect.php",
        "<?php header('Location: /x'); echo 'moved';",
    ),
    (
        "sleep.php",
        "<?php usleep((int)($_GET['ms'] ?? 0) * 1000); echo 'slept ', $_GET['ms'] ?? 0;",
    ),
    (
        "stderr.php",
        "<?php error_log('corral-front-stderr-marker'); echo 'logged';",
    ),
];

/// php-cgi and corral's fastcgi listener in front of it, in a temp dir of their own.
pub struct Site {
    /// The temp dir: `www/` holds the scripts, `run/` is corral's runtime dir.
    pub dir: tempfile::TempDir,
    /// corral, its front listener's socket at `corral-fcgi.sock`.
    pub corral: Corral,
    /// php-cgi, one request at a time, the pool's only server.
    pub php: Peer,
}

/// Starts php-cgi on [`SCRIPTS`] (64 MiB uploads allowed) and corral in front of it.
pub fn site() -> Site {
    let dir = shared_dir();
    let root = dir.path().join("www");
    std::fs::create_dir(&root).unwrap();
    for (name, text) in SCRIPTS {
        write_file(&root, name, text);
    }
    let php = php_cgi_with(
        dir.path(),
        &[
            "post_max_size=64M",
            "upload_max_filesize=64M",
            "memory_limit=256M",
        ],
    );
    let socket = dir.path().join("corral-fcgi.sock");
    let config = format!(
        r#"
[server]
# Not {dir} itself: the shared dir is world-writable, which corral refuses.
runtime_dir = "{dir}/run"

[[listen]]
address = "unix:{socket}"
protocol = "fastcgi"

[status]
address = "127.0.0.1:0"

[pools.php]
servers = ["unix:{php}"]

[[contexts]]
prefix = "/"
extension = "php"
root = "{root}"
index = ["index.php"]
pool = "php"
"#,
        dir = dir.path().display(),
        socket = socket.display(),
        php = php.socket.display(),
        root = root.display(),
    );
    let corral = Corral::start(dir.path(), &config, &socket);
    Site { dir, corral, php }
}

impl Site {
    /// The temp dir.
    pub fn path(&self) -> &Path {
        self.dir.path()
    }
}
