//! The native PHP worker (`worker = "native"`, the `workers/php` package: PHP's embed SAPI
//! behind LSAPI) run by the real corral against real PHP (Debian's libphp8.2-embed): hello,
//! phpinfo, bodies by md5 (in memory and spooled), uploads, cookies, headers, status codes,
//! missing scripts, the hostile script URLs, fatal errors and exit(), fastcgi_finish_request(),
//! max_requests and the
//! hard timeout, and what `corral check` says when the worker cannot start.
//!
//! The worker is its own package; cargo builds it beside `corral` for a workspace test run.
//! A test binary run alone (`cargo test --test php_native`) builds it first, once, with the
//! same cargo and profile, so the test always runs the worker of this tree.

mod support;

use std::collections::BTreeSet;
use std::path::Path;

use support::apps::multipart;
use support::native::{worker, NativeSite};
use support::peers::{md5_hex, shared_dir, write_file};
use support::server::{http, Corral};

/// The site every test serves.
const SCRIPTS: &[(&str, &str)] = &[
    ("hello.php", "<?php echo \"Hello, world\\n\";"),
    ("phpinfo.php", "<?php phpinfo();"),
    (
        "sapi.php",
        "<?php echo PHP_SAPI, ' ', json_encode(opcache_get_status(false)['opcache_enabled'] ?? null);",
    ),
    (
        "post.php",
        "<?php $b = file_get_contents('php://input'); \
         echo md5($b), ' ', strlen($b), ' ', $_SERVER['CONTENT_LENGTH'] ?? '-', ' ', \
         $_SERVER['REQUEST_METHOD'];",
    ),
    (
        "form.php",
        "<?php echo $_POST['a'] ?? '-', '|', $_POST['b'] ?? '-', '|', $_GET['q'] ?? '-';",
    ),
    (
        "upload.php",
        "<?php foreach ($_FILES as $n => $f) { printf('%s %s %d %s %d', $n, $f['name'], \
         $f['size'], md5_file($f['tmp_name']), $f['error']); } echo ' ', $_POST['title'] ?? '-';",
    ),
    (
        "cookies.php",
        "<?php setcookie('sid', 'abc123', ['httponly' => true]); setcookie('theme', 'dark'); \
         echo $_COOKIE['a'] ?? '-', '|', $_COOKIE['b'] ?? '-';",
    ),
    (
        "status.php",
        "<?php http_response_code((int)($_GET['code'] ?? 200)); header('X-Native: yes'); \
         header('X-Multi: one'); header('X-Multi: two', false); echo 'status';",
    ),
    ("redirect.php", "<?php header('Location: /hello.php'); "),
    (
        "server.php",
        "<?php foreach (['SCRIPT_NAME', 'SCRIPT_FILENAME', 'PHP_SELF', 'REQUEST_URI', \
         'QUERY_STRING', 'HTTP_X_CUSTOM', 'HTTP_HOST', 'PHP_AUTH_USER', 'PHP_AUTH_PW', \
         'DOCUMENT_ROOT'] as $k) { echo $k, '=', $_SERVER[$k] ?? '-', \"\\n\"; } \
         echo 'cwd=', getcwd(), \"\\n\";",
    ),
    ("big.php", "<?php echo str_repeat('0123456789', 300000);"),
    (
        "mixed.php",
        "<?php echo 'a'; echo str_repeat('b', 32773); flush(); echo str_repeat('c', 16384); \
         echo 'd'; $h = ''; for ($i = 0; $i < 5000; $i++) { $h .= sprintf('%06d', $i); } echo $h;",
    ),
    (
        "stream.php",
        "<?php for ($i = 0; $i < 5; $i++) { echo \"line $i\\n\"; flush(); }",
    ),
    ("fatal.php", "<?php echo 'before'; undefined_function_xyz();"),
    ("exit.php", "<?php echo 'bye'; exit(3);"),
    ("pid.php", "<?php echo getmypid();"),
    (
        "sleep.php",
        "<?php sleep((int)($_GET['s'] ?? 0)); echo 'slept';",
    ),
    (
        "finish.php",
        "<?php header('X-Early: yes'); echo 'early'; \
         $first = fastcgi_finish_request(); $second = litespeed_finish_request(); \
         echo 'never sent'; $go = __DIR__ . '/../finish.go'; \
         for ($i = 0; $i < 3000 && !file_exists($go); $i++) { usleep(10000); } \
         file_put_contents(__DIR__ . '/../finish.done', json_encode([$first, $second, \
         file_exists($go)]));",
    ),
    (
        "many.php",
        "<?php for ($i = 0; $i < 40; $i++) { header(\"X-H$i: v$i\"); } \
         echo $_SERVER['HTTP_X_PLAIN'] ?? '-';",
    ),
    ("sub/inc.php", "<?php echo 'included'; "),
    ("cwd.php", "<?php echo getcwd();"),
    ("sub/cwd.php", "<?php echo getcwd();"),
    ("move.php", "<?php chdir('/'); echo getcwd();"),
    ("sub/index.php", "<?php include 'inc.php'; echo ' from ', basename(getcwd());"),
];

/// Marker a planted script leaves behind if it ever runs.
const MARKER: &str = "planted-ran";

type Site = NativeSite;

/// corral with a native pool of 2 workers serving the site; `pool` adds keys to the pool.
fn site(pool: &str) -> Site {
    let dir = shared_dir();
    let root = dir.path().join("www");
    std::fs::create_dir_all(root.join("uploads")).unwrap();
    std::fs::create_dir_all(root.join("sub")).unwrap();
    for (name, text) in SCRIPTS {
        write_file(&root, name, text);
    }
    let plant = |name: &str| {
        format!(
            "<?php file_put_contents('{}', '{name}'); echo 'PWNED';",
            dir.path().join(MARKER).display()
        )
    };
    write_file(
        &root,
        "uploads/avatar.gif",
        &format!("GIF89a{}", plant("gif")),
    );
    write_file(&root, "notes.txt", &plant("txt"));
    write_file(dir.path(), "outside.php", &plant("outside"));
    std::os::unix::fs::symlink(root.join("uploads/avatar.gif"), root.join("gif.php")).unwrap();
    std::os::unix::fs::symlink(dir.path().join("outside.php"), root.join("out.php")).unwrap();
    let site = NativeSite::start(dir, "php", &format!("max = 2\n{pool}"), "");
    assert_eq!(site.ok("/hello.php"), "Hello, world\n");
    site
}

#[test]
fn hello_phpinfo_and_opcache() {
    let site = site("");
    let r = site.get("/phpinfo.php");
    assert_eq!(r.status, 200);
    let info = r.text();
    assert!(info.contains("corral native PHP worker"), "{info}");
    // OPcache is on and caching ("Opcode Caching: Up and Running").
    assert!(info.contains("Up and Running"), "{info}");
    assert_eq!(site.ok("/sapi.php"), "litespeed true");
    assert_eq!(
        r.header("content-type"),
        Some("text/html; charset=UTF-8"),
        "PHP's default type"
    );
}

#[test]
fn bodies_forms_and_uploads_arrive_whole() {
    let site = site("");
    let dir = site.dir.path();
    // In memory, and spooled to a file (over 1 MiB).
    for size in [0usize, 1, 70_000, 3 * 1024 * 1024 + 17] {
        let body: Vec<u8> = (0..size).map(|i| (i * 7 % 251) as u8).collect();
        let r = site.request(
            "POST",
            "/post.php",
            &[("Content-Type", "application/octet-stream")],
            &body,
        );
        assert_eq!(r.status, 200, "{size}: {}", site.corral.log());
        let cl = if size == 0 {
            "0".to_owned()
        } else {
            size.to_string()
        };
        assert_eq!(
            r.text(),
            format!("{} {size} {cl} POST", md5_hex(dir, &body)),
            "{size}"
        );
    }
    let r = site.request(
        "POST",
        "/form.php?q=x%20y",
        &[("Content-Type", "application/x-www-form-urlencoded")],
        b"a=1&b=two+words",
    );
    assert_eq!(r.text(), "1|two words|x y");
    let data: Vec<u8> = (0..200_000u32).map(|i| (i % 256) as u8).collect();
    let (ctype, body) = multipart(&[("title", "holiday")], ("photo", "beach.jpg", &data));
    let r = site.request("POST", "/upload.php", &[("Content-Type", &ctype)], &body);
    assert_eq!(
        r.text(),
        format!("photo beach.jpg 200000 {} 0 holiday", md5_hex(dir, &data)),
        "{}",
        site.corral.log()
    );
    // The next request on the same worker sees none of it.
    assert_eq!(site.ok("/form.php"), "-|-|-");
}

#[test]
fn cookies_headers_status_and_redirects() {
    let site = site("");
    let r = site.request("GET", "/cookies.php", &[("Cookie", "a=1; b=x%20y")], b"");
    assert_eq!(r.text(), "1|x y");
    let cookies: Vec<&str> = r
        .headers
        .iter()
        .filter(|(n, _)| n == "set-cookie")
        .map(|(_, v)| v.as_str())
        .collect();
    assert_eq!(
        cookies,
        ["sid=abc123; HttpOnly", "theme=dark"],
        "{:?}",
        r.headers
    );
    for code in [201u16, 404, 418, 503] {
        let r = site.get(&format!("/status.php?code={code}"));
        assert_eq!(r.status, code);
        assert_eq!(r.text(), "status");
        assert_eq!(r.header("x-native"), Some("yes"));
        let multi: Vec<&str> = r
            .headers
            .iter()
            .filter(|(n, _)| n == "x-multi")
            .map(|(_, v)| v.as_str())
            .collect();
        assert_eq!(multi, ["one", "two"]);
    }
    let r = site.get("/redirect.php");
    assert_eq!(r.status, 302);
    assert_eq!(r.header("location"), Some("/hello.php"));
}

#[test]
fn server_variables_are_php_cgis() {
    let site = site("");
    let root = site.root().canonicalize().unwrap();
    let r = site.request(
        "GET",
        "/server.php?x=1",
        &[("X-Custom", "hi"), ("Authorization", "Basic dXNlcjpwYXNz")],
        b"",
    );
    let text = r.text();
    for line in [
        "SCRIPT_NAME=/server.php".to_owned(),
        format!("SCRIPT_FILENAME={}/server.php", root.display()),
        "PHP_SELF=/server.php".to_owned(),
        "REQUEST_URI=/server.php?x=1".to_owned(),
        "QUERY_STRING=x=1".to_owned(),
        "HTTP_X_CUSTOM=hi".to_owned(),
        "PHP_AUTH_USER=user".to_owned(),
        "PHP_AUTH_PW=pass".to_owned(),
        // The script's directory is the working directory, as under php-cgi.
        format!("cwd={}", root.display()),
    ] {
        assert!(
            text.lines().any(|l| l == line),
            "{line} missing in:\n{text}"
        );
    }
    assert_eq!(site.ok("/sub/"), "included from sub");
}

/// Every script runs in its own folder: the worker enters it only when the last script's
/// folder was another, or a script moved the cwd since (chdir() in the script before).
#[test]
fn each_script_runs_in_its_folder_even_after_one_moved_the_cwd() {
    let site = site("");
    let root = site.root().canonicalize().unwrap();
    let sub = root.join("sub");
    let (root, sub) = (root.display().to_string(), sub.display().to_string());
    for _ in 0..6 {
        assert_eq!(site.ok("/cwd.php"), root);
        assert_eq!(site.ok("/cwd.php"), root);
        assert_eq!(site.ok("/sub/cwd.php"), sub);
        assert_eq!(site.ok("/move.php"), "/");
        // Without the worker noticing the chdir() above, the same worker would answer "/".
        assert_eq!(site.ok("/cwd.php"), root);
        assert_eq!(site.ok("/move.php"), "/");
        assert_eq!(site.ok("/sub/"), "included from sub");
    }
}

#[test]
fn large_and_flushed_output() {
    let site = site("");
    let big = site.ok("/big.php");
    assert_eq!(big, "0123456789".repeat(300_000));
    // Writes of whole 16 KiB packets and more go out from PHP's buffer, behind what was
    // queued and ahead of their tails (workers/php/src/exchange.rs): every byte in order.
    let numbers: String = (0..5000).map(|i| format!("{i:06}")).collect();
    let mixed = format!("a{}{}d{numbers}", "b".repeat(32773), "c".repeat(16384));
    assert_eq!(site.ok("/mixed.php"), mixed);
    let lines = site.ok("/stream.php");
    assert_eq!(lines, "line 0\nline 1\nline 2\nline 3\nline 4\n");
}

#[test]
fn missing_scripts_and_hostile_urls_never_run() {
    let site = site("");
    for (target, status) in [
        ("/missing.php", 404),
        ("/uploads/avatar.gif/x.php", 404),
        ("/uploads/avatar.gif/x.php/more", 404),
        ("/notes.txt/.php", 404),
        ("/gif.php", 404),
        ("/out.php", 404),
        ("/uploads/avatar.gif%2fx.php", 400),
        ("/../outside.php", 403),
    ] {
        let r = site.get(target);
        assert_eq!(r.status, status, "{target}: {}", r.text());
        assert!(!r.text().contains("PWNED"), "{target}");
        assert!(
            !site.dir.path().join(MARKER).exists(),
            "{target}: a planted script ran"
        );
        // The worker is still there for the next good request.
        assert_eq!(site.ok("/hello.php"), "Hello, world\n");
    }
}

#[test]
fn fatal_errors_and_exit_are_answered_and_the_worker_goes_on() {
    let site = site("");
    let r = site.get("/fatal.php");
    assert_eq!(r.status, 500, "{}", r.text());
    assert!(
        site.corral.wait_log("undefined_function_xyz"),
        "PHP's error is logged:\n{}",
        site.corral.log()
    );
    let r = site.get("/exit.php");
    assert_eq!((r.status, r.text().as_str()), (200, "bye"));
    for _ in 0..10 {
        assert_eq!(site.ok("/hello.php"), "Hello, world\n");
    }
}

/// fastcgi_finish_request() completes the answer while the script goes on: the script below
/// is still waiting for the test's go-ahead file when its answer arrives.
#[test]
fn fastcgi_finish_request_answers_while_the_script_goes_on() {
    let site = site("");
    let r = site.get("/finish.php");
    assert_eq!(
        (r.status, r.text().as_str()),
        (200, "early"),
        "{}",
        site.corral.log()
    );
    assert_eq!(r.header("x-early"), Some("yes"));
    let done = site.dir.path().join("finish.done");
    assert!(
        !done.exists(),
        "the script finished before its answer arrived"
    );
    write_file(site.dir.path(), "finish.go", "");
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(30);
    while !done.exists() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "{}",
            site.corral.log()
        );
        // Both workers go on serving meanwhile (the other one, or this one once done).
        assert_eq!(site.ok("/hello.php"), "Hello, world\n");
    }
    // The first call completed the answer; the second had nothing left to complete.
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(10);
    while std::fs::read_to_string(&done).unwrap() != "[true,false,true]" {
        assert!(
            tokio::time::Instant::now() < deadline,
            "{:?}",
            std::fs::read_to_string(&done)
        );
        std::thread::yield_now();
    }
    for _ in 0..4 {
        assert_eq!(site.ok("/hello.php"), "Hello, world\n");
    }
}

#[test]
fn max_requests_recycles_workers_with_no_failed_request() {
    let site = site("max_requests = 5\nmax_requests_jitter = 0");
    let pids = site.answers("/pid.php", 40);
    // 40 requests at 5 per worker: at least 8 workers served them.
    assert!(pids.len() >= 8, "{pids:?}");
}

#[test]
fn the_hard_timeout_answers_504_and_replaces_the_worker() {
    let site = site("request_timeout = \"1s\"\nfirst_byte_timeout = \"1s\"");
    let before = site.ok("/pid.php");
    let r = site.get("/sleep.php?s=30");
    assert_eq!(r.status, 504, "{}", r.text());
    let mut after = BTreeSet::new();
    for _ in 0..6 {
        after.insert(site.ok("/pid.php"));
    }
    assert_eq!(site.ok("/sleep.php?s=0"), "slept");
    assert!(after.len() <= 2, "{after:?}");
    let _ = before;
}

/// `corral check` names what is missing: the worker program, or what it needs to start PHP.
#[test]
fn check_explains_a_missing_worker_or_libphp() {
    let dir = shared_dir();
    let config = |worker_path: &str| {
        let path = dir.path().join("native.toml");
        std::fs::write(
            &path,
            format!(
                "[[listen]]\naddress = \"127.0.0.1:0\"\nprotocol = \"http\"\n\n\
                 [pools.php]\nworker = \"native\"\n{worker_path}\n\n\
                 [[contexts]]\nroot = \"/var/www\"\npool = \"php\"\n"
            ),
        )
        .unwrap();
        support::corral(&["check", "-c", &path.display().to_string()])
    };
    let out = config(&format!("worker_path = \"{}\"", worker().display()));
    assert_eq!(out.code, Some(0), "{}", out.stderr);

    let out = config("worker_path = \"/nonexistent/corral-php-worker\"");
    assert_ne!(out.code, Some(0));
    assert!(out.stderr.contains("worker_path"), "{}", out.stderr);
    assert!(out.stderr.contains("does not exist"), "{}", out.stderr);

    // A worker the dynamic loader refuses, as it does without libphp8.2-embed.
    let fake = dir.path().join("fake-worker");
    std::fs::write(
        &fake,
        "#!/bin/sh\necho \"$0: error while loading shared libraries: libphp8.2.so: cannot \
         open shared object file: No such file or directory\" >&2\nexit 127\n",
    )
    .unwrap();
    support::apps::chmod(&fake, 0o755);
    let out = config(&format!("worker_path = \"{}\"", fake.display()));
    assert_ne!(out.code, Some(0));
    assert!(
        out.stderr.contains("apt-get install libphp8.2-embed"),
        "{}",
        out.stderr
    );
}

#[test]
fn the_configuration_refuses_what_a_native_pool_cannot_do() {
    let dir = shared_dir();
    let cases = [
        ("worker = \"fpm\"", "is not a worker corral has"),
        ("worker = \"native\"\ncommand = [\"php-cgi\"]", "sets both"),
        (
            "worker = \"native\"\nprotocol = \"fastcgi\"",
            "the native PHP worker speaks lsapi",
        ),
        (
            "worker = \"native\"\nconcurrency = 4",
            "concurrency must be 1",
        ),
        (
            "command = [\"php-cgi\"]\nworker_path = \"/usr/bin/x\"",
            "needs worker = \"native\"",
        ),
        (
            "worker = \"native\"\nworker_path = \"bin/x\"",
            "absolute path",
        ),
        (
            "worker = \"native\"\nruby = \"ruby\"",
            "runs the native PHP worker",
        ),
    ];
    for (keys, expected) in cases {
        let path = dir.path().join("bad.toml");
        std::fs::write(
            &path,
            format!(
                "[[listen]]\naddress = \"127.0.0.1:0\"\nprotocol = \"http\"\n\n\
                 [pools.php]\n{keys}\n\n[[contexts]]\nroot = \"/var/www\"\npool = \"php\"\n"
            ),
        )
        .unwrap();
        let out = support::corral(&["check", "-c", &path.display().to_string()]);
        assert_ne!(out.code, Some(0), "{keys}");
        assert!(out.stderr.contains(expected), "{keys}: {}", out.stderr);
    }
    // A native pool runs PHP: its context needs a root (the script guard's).
    let path = dir.path().join("rootless.toml");
    std::fs::write(
        &path,
        "[[listen]]\naddress = \"127.0.0.1:0\"\nprotocol = \"http\"\n\n\
         [pools.php]\nworker = \"native\"\n\n[[contexts]]\npool = \"php\"\n",
    )
    .unwrap();
    let out = support::corral(&["check", "-c", &path.display().to_string()]);
    assert_ne!(out.code, Some(0));
    assert!(out.stderr.contains("needs a root"), "{}", out.stderr);
}

/// conf/php-native.toml as written (paths and port moved) serves PHP, with corral finding
/// the worker beside its own executable and the pool's env in `$_SERVER`, as php-cgi has it.
#[test]
fn the_native_recipe_serves_php() {
    worker();
    let dir = shared_dir();
    let root = dir.path().join("www");
    std::fs::create_dir_all(&root).unwrap();
    write_file(
        &root,
        "index.php",
        "<?php echo 'index ', PHP_SAPI, ' ', $_SERVER['RECIPE_ENV'] ?? '-';",
    );
    let repo = Path::new(env!("CARGO_MANIFEST_DIR"));
    let config = std::fs::read_to_string(repo.join("conf/php-native.toml"))
        .unwrap()
        .replace("/run/corral", &dir.path().join("run").display().to_string())
        .replace("/var/www/html", &root.display().to_string())
        .replace("127.0.0.1:8080", "127.0.0.1:0")
        .replace(
            "worker = \"native\"",
            "worker = \"native\"\nenv = { RECIPE_ENV = \"from-env\" }",
        );
    let corral = Corral::start(&config, 1);
    let r = http(corral.http_addr(), "GET", "/", &[], b"");
    assert_eq!(r.status, 200, "{}", corral.log());
    assert_eq!(r.text(), "index litespeed from-env");
}

/// More response headers than the worker splits on the stack all arrive.
#[test]
fn more_response_headers_than_the_stack_holds() {
    let site = site("");
    let r = site.request("GET", "/many.php", &[("X-Plain", "plain")], b"");
    assert_eq!(r.status, 200, "{}", r.text());
    for i in 0..40 {
        assert_eq!(r.header(&format!("x-h{i}")), Some(format!("v{i}").as_str()));
    }
    assert_eq!(r.text(), "plain");
}
