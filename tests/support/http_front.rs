//! What the `http_front_*` tests share: a configuration with one http listener and one pool,
//! php-cgi serving a small PHP site behind a corral, and a threaded flup WSGI app.

use std::path::Path;

use super::peers::{self, Peer};
use super::server::Corral;

/// A config with one TCP http listener on a free port and one pool of running servers; the
/// runtime directory is `dir/run`, the test's own (not the default /run/corral).
pub fn config(dir: &Path, pool: &str, context: &str) -> String {
    format!(
        r#"
[server]
runtime_dir = "{run}"
grace = "2s"
log_level = "debug"

[[listen]]
address = "127.0.0.1:0"
protocol = "http"

[pools.main]
{pool}

[[contexts]]
pool = "main"
{context}
"#,
        run = dir.join("run").display(),
    )
}

/// php-cgi serving `dir` and a corral in front of it whose context's root is `dir`, with
/// `context` appended to the context (bound as `let (_php, corral)`: corral stops first).
pub fn php_corral(dir: &Path, context: &str) -> (Peer, Corral) {
    let php = peers::php_cgi(dir);
    let corral = Corral::start(
        &config(
            dir,
            &format!("servers = [\"unix:{}\"]", php.socket.display()),
            &format!("root = \"{}\"{context}", dir.display()),
        ),
        1,
    );
    (php, corral)
}

pub fn php_site(dir: &Path) {
    peers::write_file(
        dir,
        "hello.php",
        "<?php echo 'Hello ', $_GET['name'] ?? 'nobody', ' via ', $_SERVER['GATEWAY_INTERFACE'];",
    );
    peers::write_file(
        dir,
        "form.php",
        "<?php header('X-Seen-Method: ' . $_SERVER['REQUEST_METHOD']); \
         echo json_encode([$_POST, $_SERVER['CONTENT_TYPE'] ?? null, \
         $_SERVER['HTTP_X_CUSTOM'] ?? null, $_SERVER['PATH_INFO'] ?? null]);",
    );
    peers::write_file(
        dir,
        "status.php",
        "<?php http_response_code(418); setcookie('a', '1'); setcookie('b', '2'); echo 'teapot';",
    );
    peers::write_file(
        dir,
        "local.php",
        "<?php header('Location: /hello.php?name=redirected');",
    );
}

/// A threaded flup WSGI app on a Unix socket: `/slow` sleeps 300 ms while counting how many
/// requests are inside at once; `/max` reports the most seen; `/hold` appends a byte to
/// `entered` beside the socket and answers once a `gate` file is there; anything else echoes
/// the path.
pub const FLUP_APP: &str = r#"
import os, sys, threading, time
from flup.server.fcgi import WSGIServer
here = os.path.dirname(sys.argv[1])
lock = threading.Lock()
inside = 0
most = 0
def app(environ, start_response):
    global inside, most
    path = environ.get('PATH_INFO', '')
    if path == '/slow':
        with lock:
            inside += 1
            most = max(most, inside)
        time.sleep(0.3)
        with lock:
            inside -= 1
        body = b'slow done'
    elif path == '/hold':
        with lock:
            with open(os.path.join(here, 'entered'), 'a') as f:
                f.write('x')
        while not os.path.exists(os.path.join(here, 'gate')):
            time.sleep(0.01)
        body = b'held'
    elif path == '/max':
        body = str(most).encode()
    else:
        body = ('script=%s path=%s' % (environ.get('SCRIPT_NAME'), path)).encode()
    start_response('200 OK', [('Content-Type', 'text/plain')])
    return [body]
WSGIServer(app, bindAddress=sys.argv[1], multithreaded=True, maxThreads=32).run()
"#;

pub fn flup(dir: &Path) -> Peer {
    let script = peers::write_file(dir, "app.py", FLUP_APP);
    peers::python(&script, &dir.join("flup.sock"), false)
}
