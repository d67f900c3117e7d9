//! Worker mode of the native PHP worker (`worker = "native"` with `worker_script`): the script
//! boots an application once (here: a few hundred classes loaded from files and a container
//! built from them) and serves every request through `corral_handle_request($handler)`.
//! Against real PHP (libphp8.2-embed): one boot per worker over 1,000 requests, superglobals
//! and output that do not outlive their request, a static property and the app's objects that
//! do, bodies, uploads, cookies, headers and status codes per request, a fatal error, an
//! uncaught exception and exit() each answered and followed by a fresh worker process (with
//! no failed request for anyone else), and
//! max_requests replacing worker processes with no failed request.

mod support;

use std::collections::BTreeSet;
use std::path::Path;

use support::apps::multipart;
use support::native::{worker, NativeSite};
use support::peers::{md5_hex, shared_dir, write_file};
use support::server::{http, Corral, HttpResponse};

/// Classes the app loads at boot.
const CLASSES: usize = 300;

/// The worker script: boots (records its pid in boot.log), then serves.
const WORKER: &str = r#"<?php
file_put_contents(__DIR__ . '/../boot.log', getmypid() . "\n", FILE_APPEND);
for ($i = 0; $i < CLASSES; $i++) {
    require __DIR__ . "/../lib/Service$i.php";
}
final class Container {
    private array $services = [];
    public static int $served = 0;
    public function __construct(int $n) {
        for ($i = 0; $i < $n; $i++) { $class = "Service$i"; $this->services[$i] = new $class(); }
    }
    public function count(): int { return count($this->services); }
    public function sum(): int { $s = 0; foreach ($this->services as $o) { $s += $o->id(); } return $s; }
}
$container = new Container(CLASSES);
ini_set('memory_limit', '1G');
$kept = [];
$handler = function () use ($container, &$kept) {
    Container::$served++;
    $path = parse_url($_SERVER['REQUEST_URI'], PHP_URL_PATH);
    switch ($path) {
        case '/count':
            echo getmypid(), ' ', Container::$served, ' ', $container->count(), ' ', $container->sum();
            break;
        case '/set':
            $_GET['planted'] = 'x'; $_SERVER['PLANTED'] = 'y'; $_COOKIE['planted'] = 'z';
            header('X-Only-Once: 1');
            echo 'set';
            break;
        case '/get':
            echo json_encode([$_GET, $_SERVER['PLANTED'] ?? null, $_COOKIE, $_POST, $_FILES,
                $_SERVER['REQUEST_URI'], $_SERVER['QUERY_STRING'] ?? null]);
            break;
        case '/post':
            echo md5(file_get_contents('php://input')), ' ', $_POST['a'] ?? '-', ' ', $_SERVER['REQUEST_METHOD'];
            break;
        case '/upload':
            foreach ($_FILES as $n => $f) { printf('%s %s %d %s', $n, $f['name'], $f['size'], md5_file($f['tmp_name'])); }
            echo ' ', $_POST['title'] ?? '-';
            break;
        case '/cookie':
            setcookie('w', 'v');
            echo $_COOKIE['c'] ?? '-';
            break;
        case '/status':
            http_response_code(404);
            header('X-W: 1');
            echo 'not here';
            break;
        case '/filter':
            echo filter_input(INPUT_GET, 'x') ?? '-', ' ', filter_input(INPUT_COOKIE, 'c') ?? '-';
            break;
        case '/leak':
            // An app that keeps 1 MiB more on every request (touched, so it is resident).
            $kept[] = str_repeat(chr(count($kept) % 256), 1 << 20);
            usleep(20000);
            echo getmypid();
            break;
        case '/xheaders':
            $x = array_filter($_SERVER, fn ($k) => str_starts_with($k, 'HTTP_X_'), ARRAY_FILTER_USE_KEY);
            ksort($x);
            echo json_encode($x);
            break;
        case '/env':
            echo $_SERVER['WORKER_ENV'] ?? '-', ' ', $_SERVER['SET_BY_PUTENV'] ?? '-';
            break;
        case '/putenv':
            putenv('SET_BY_PUTENV=' . ($_GET['v'] ?? ''));
            echo 'put';
            break;
        case '/mem':
            echo memory_get_usage();
            break;
        case '/ob':
            ob_start();
            echo 'left in a buffer';
            break;
        case '/fatal':
            echo 'partial';
            undefined_function_in_worker();
            break;
        case '/throw':
            throw new RuntimeException('thrown by the handler');
        case '/finish':
            header('X-Early: yes');
            echo 'early';
            $first = fastcgi_finish_request();
            echo 'never sent';
            $go = __DIR__ . '/../finish.go';
            for ($i = 0; $i < 3000 && !file_exists($go); $i++) { usleep(10000); }
            file_put_contents(__DIR__ . '/../finish.done', json_encode([$first, fastcgi_finish_request()]));
            break;
        case '/exit':
            echo 'bye';
            exit(0);
        default:
            echo 'hello';
    }
};
while (corral_handle_request($handler)) {
    gc_collect_cycles();
}
"#;

type Site = NativeSite;

impl Site {
    /// Pids that booted the app, one line each.
    fn boots(&self) -> Vec<String> {
        std::fs::read_to_string(self.dir.path().join("boot.log"))
            .unwrap_or_default()
            .lines()
            .map(str::to_owned)
            .collect()
    }

    /// (pid, requests that worker served) from /count.
    fn count(&self) -> (String, u64) {
        let text = self.ok("/count");
        let mut words = text.split(' ');
        let pid = words.next().unwrap().to_owned();
        let served = words.next().unwrap().parse().unwrap();
        assert_eq!(
            words.collect::<Vec<_>>(),
            [CLASSES.to_string(), (0..CLASSES).sum::<usize>().to_string()],
            "the container built at boot is intact"
        );
        (pid, served)
    }
}

/// corral with a worker-mode pool of `workers` workers; `pool` adds keys to the pool.
fn site(workers: u32, pool: &str) -> Site {
    let dir = shared_dir();
    let root = dir.path().join("www");
    std::fs::create_dir_all(&root).unwrap();
    std::fs::create_dir_all(dir.path().join("lib")).unwrap();
    for i in 0..CLASSES {
        write_file(
            &dir.path().join("lib"),
            &format!("Service{i}.php"),
            &format!(
                "<?php\nfinal class Service{i} {{ public function id(): int {{ return {i}; }} }}\n"
            ),
        );
    }
    write_file(
        &root,
        "worker.php",
        &WORKER.replace("CLASSES", &CLASSES.to_string()),
    );
    let site = NativeSite::start(
        dir,
        "app",
        &format!("worker_script = \"ROOT/worker.php\"\nmax = {workers}\n{pool}"),
        "index = [\"worker.php\"]\nfront_controller = \"/worker.php\"",
    );
    assert_eq!(site.ok("/"), "hello");
    site
}

#[test]
fn one_boot_per_worker_over_a_thousand_requests() {
    let site = site(2, "");
    let mut pids = BTreeSet::new();
    for _ in 0..1000 {
        let (pid, _) = site.count();
        pids.insert(pid);
    }
    let boots = site.boots();
    assert_eq!(boots.len(), 2, "one boot per worker: {boots:?}");
    assert!(pids.iter().all(|p| boots.contains(p)), "{pids:?} {boots:?}");
}

#[test]
fn superglobals_and_output_end_with_their_request_and_the_app_does_not() {
    let site = site(1, "");
    let (pid, before) = site.count();
    let r = site.request_with_cookie("/set?q=1", "c=1");
    assert_eq!(r.text(), "set");
    assert_eq!(r.header("x-only-once"), Some("1"));
    let r = site.get("/get?other=2");
    assert_eq!(
        r.header("x-only-once"),
        None,
        "a header does not outlive its request"
    );
    assert_eq!(
        r.text(),
        r#"[{"other":"2"},null,[],[],[],"\/get?other=2","other=2"]"#,
        "nothing planted in a superglobal survives"
    );
    // A buffer the handler left open is flushed with its own answer, not the next one.
    assert_eq!(site.ok("/ob"), "left in a buffer");
    assert_eq!(site.ok("/"), "hello");
    let (same, after) = site.count();
    assert_eq!(same, pid);
    assert_eq!(
        after,
        before + 5,
        "the static counter survives every request"
    );
    assert_eq!(site.boots().len(), 1);
}

/// `$_SERVER` starts from the process environment (the pool's `env`) in every request, and a
/// variable a handler sets with putenv() is there for the requests after it, as when the
/// environment is read anew each time (the worker imports it once and copies it).
#[test]
fn server_holds_the_environment_and_what_putenv_set() {
    let site = site(1, "env = { WORKER_ENV = \"from-pool\" }");
    for _ in 0..3 {
        assert_eq!(site.ok("/env"), "from-pool -");
    }
    assert_eq!(site.ok("/putenv?v=one"), "put");
    assert_eq!(site.ok("/env"), "from-pool one");
    assert_eq!(site.ok("/putenv?v=two"), "put");
    assert_eq!(site.ok("/env"), "from-pool two");
    assert_eq!(site.ok("/env"), "from-pool two");
    assert_eq!(site.boots().len(), 1);
}

/// Each request's `$_SERVER` holds its own headers, whatever the request before sent at the
/// same places (the worker reuses the keys of the request before where the names match).
#[test]
fn server_holds_each_requests_own_headers() {
    let site = site(1, "");
    for (headers, want) in [
        (&[("X-One", "1")][..], r#"{"HTTP_X_ONE":"1"}"#),
        (&[("X-Two", "2")][..], r#"{"HTTP_X_TWO":"2"}"#),
        (
            &[("X-Two", "b"), ("X-One", "a")][..],
            r#"{"HTTP_X_ONE":"a","HTTP_X_TWO":"b"}"#,
        ),
        (
            &[("X-Three", "3"), ("X-One", "c")][..],
            r#"{"HTTP_X_ONE":"c","HTTP_X_THREE":"3"}"#,
        ),
        (&[][..], "[]"),
        (&[("X-One", "again")][..], r#"{"HTTP_X_ONE":"again"}"#),
    ] {
        for _ in 0..2 {
            let r = site.request("GET", "/xheaders", headers, b"");
            assert_eq!((r.status, r.text().as_str()), (200, want), "{headers:?}");
        }
    }
    assert_eq!(site.boots().len(), 1);
}

/// The superglobals of each request are released when the next one starts: memory stays
/// flat over requests that each bring 20 KiB of query, form and cookies.
#[test]
fn a_requests_superglobals_are_released() {
    let site = site(1, "");
    let mem = |site: &Site| site.ok("/mem").parse::<i64>().unwrap();
    let query = format!(
        "/get?{}",
        (0..1000)
            .map(|i| format!("k{i}=v{i}"))
            .collect::<Vec<_>>()
            .join("&")
    );
    let cookie = (0..300)
        .map(|i| format!("c{i}=v{i}"))
        .collect::<Vec<_>>()
        .join("; ");
    for _ in 0..20 {
        site.request_with_cookie(&query, &cookie);
    }
    let before = mem(&site);
    for _ in 0..300 {
        let r = site.request_with_cookie(&query, &cookie);
        assert_eq!(r.status, 200);
    }
    let grown = mem(&site) - before;
    assert!(grown < 256 * 1024, "grew {grown} bytes over 300 requests");
}

#[test]
fn bodies_uploads_cookies_headers_and_status_per_request() {
    let site = site(1, "");
    let dir = site.dir.path();
    for size in [0usize, 5_000, 2 * 1024 * 1024] {
        let body: Vec<u8> = (0..size).map(|i| (i * 13 % 251) as u8).collect();
        let r = http(
            site.corral.http_addr(),
            "POST",
            "/post",
            &[("Content-Type", "application/octet-stream")],
            &body,
        );
        assert_eq!(
            r.text(),
            format!("{} - POST", md5_hex(dir, &body)),
            "{size}"
        );
    }
    let r = http(
        site.corral.http_addr(),
        "POST",
        "/post",
        &[("Content-Type", "application/x-www-form-urlencoded")],
        b"a=form+value",
    );
    assert_eq!(
        r.text(),
        format!("{} form value POST", md5_hex(dir, b"a=form+value"))
    );
    let data: Vec<u8> = (0..300_000u32).map(|i| (i % 253) as u8).collect();
    let (ctype, body) = multipart(&[("title", "t1")], ("doc", "a.bin", &data));
    let r = http(
        site.corral.http_addr(),
        "POST",
        "/upload",
        &[("Content-Type", &ctype)],
        &body,
    );
    assert_eq!(
        r.text(),
        format!("doc a.bin 300000 {} t1", md5_hex(dir, &data))
    );
    // The upload's temporary file is gone with its request.
    assert!(
        site.ok("/get").contains(",[],\"\\/get\""),
        "no $_FILES left"
    );
    // filter_input() reads this request's variables, never a previous one's.
    assert_eq!(site.request_with_cookie("/filter?x=1", "c=2").text(), "1 2");
    assert_eq!(site.ok("/filter"), "- -");
    let r = site.request_with_cookie("/cookie", "c=chocolate");
    assert_eq!(r.text(), "chocolate");
    assert_eq!(r.header("set-cookie"), Some("w=v"));
    assert_eq!(site.ok("/cookie"), "-");
    let r = site.get("/status");
    assert_eq!((r.status, r.text().as_str()), (404, "not here"));
    assert_eq!(r.header("x-w"), Some("1"));
    assert_eq!(
        site.get("/").status,
        200,
        "the status does not outlive its request"
    );
    assert_eq!(site.boots().len(), 1);
}

#[test]
fn fatal_errors_exceptions_and_exit_are_answered_then_a_fresh_worker_serves() {
    // Two workers: while one is replaced, the other serves, and a client hammering the pool
    // the whole time sees no failed request.
    let site = site(2, "");
    let addr = site.corral.http_addr();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let hammer = {
        let stop = std::sync::Arc::clone(&stop);
        std::thread::spawn(move || {
            let mut answered = 0u32;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let r = http(addr, "GET", "/", &[], b"");
                assert_eq!(
                    (r.status, r.text()),
                    (200, "hello".to_owned()),
                    "request {answered}"
                );
                answered += 1;
            }
            answered
        })
    };
    let mut seen: BTreeSet<String> = BTreeSet::new();
    for (target, status, body) in [
        ("/fatal", 500, None),
        ("/throw", 500, None),
        ("/exit", 200, Some("bye")),
    ] {
        let booted = site.boots().len();
        let r = site.get(target);
        assert_eq!(
            r.status,
            status,
            "{target}: {}\n{}",
            r.text(),
            site.corral.log()
        );
        if let Some(body) = body {
            assert_eq!(r.text(), body);
        }
        // The worker that ran it exits after answering, and corral starts a fresh process,
        // which boots the app once more: a pid never seen before.
        let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(30);
        while site.boots().len() == booted {
            assert!(
                tokio::time::Instant::now() < deadline,
                "{target}: no new worker\n{}",
                site.corral.log()
            );
            std::thread::yield_now();
            assert_eq!(site.ok("/"), "hello");
        }
        let boots = site.boots();
        let new = boots.last().unwrap().clone();
        assert!(
            !boots[..boots.len() - 1].contains(&new),
            "{target}: {boots:?}"
        );
        seen.insert(new);
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let answered = hammer
        .join()
        .expect("every request beside the failing ones answered");
    assert!(answered > 0);
    assert_eq!(seen.len(), 3);
    let log = site.corral.log();
    // Not a crash (no backoff): a worker that exits 0 after serving stopped on its own.
    assert!(!log.contains("unexpectedly"), "{log}");
    assert!(
        site.corral.wait_log("undefined_function_in_worker"),
        "{log}"
    );
    assert!(site.corral.wait_log("thrown by the handler"), "{log}");
}

/// fastcgi_finish_request() in a handler completes the answer while the handler goes on;
/// the worker then serves the next request as usual (one worker: it waits for the handler).
#[test]
fn fastcgi_finish_request_answers_while_the_handler_goes_on() {
    let site = site(1, "");
    let (pid, before) = site.count();
    let r = site.get("/finish");
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
        "the handler finished before its answer arrived"
    );
    write_file(site.dir.path(), "finish.go", "");
    let (next, served) = site.count();
    assert_eq!(
        (next, served),
        (pid, before + 2),
        "the same worker and boot serve on"
    );
    assert_eq!(std::fs::read_to_string(&done).unwrap(), "[true,false]");
    assert_eq!(site.boots().len(), 1);
}

#[test]
fn max_requests_replaces_workers_with_no_failed_request() {
    let site = site(2, "max_requests = 10\nmax_requests_jitter = 0");
    let mut pids = BTreeSet::new();
    for i in 0..100 {
        let r = site.get("/count");
        assert_eq!(
            r.status,
            200,
            "request {i}: {}\n{}",
            r.text(),
            site.corral.log()
        );
        let text = r.text();
        let mut words = text.split(' ');
        pids.insert(words.next().unwrap().to_owned());
        let served: u64 = words.next().unwrap().parse().unwrap();
        assert!(served <= 10, "a worker served {served} requests");
    }
    assert!(pids.len() >= 10, "{pids:?}");
    assert_eq!(
        site.boots().len(),
        site.boots().iter().collect::<BTreeSet<_>>().len()
    );
}

/// max_memory replaces a worker whose memory grows past the bound, after its request, with
/// no request failing; the new worker boots the app again.
#[test]
fn max_memory_replaces_a_growing_worker_with_no_failed_request() {
    let site = site(1, "max_memory = \"96MiB\"");
    let first = site.ok("/leak");
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(60);
    let mut served = 0;
    loop {
        let r = site.get("/leak");
        assert_eq!(
            r.status,
            200,
            "request {served}: {}\n{}",
            r.text(),
            site.corral.log()
        );
        served += 1;
        if r.text() != first {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "no replacement after {served} requests\n{}",
            site.corral.log()
        );
    }
    assert!(served > 20, "replaced after only {served} requests");
    assert_eq!(site.boots().len(), 2);
}

impl Site {
    fn request_with_cookie(&self, target: &str, cookie: &str) -> HttpResponse {
        http(
            self.corral.http_addr(),
            "GET",
            target,
            &[("Cookie", cookie)],
            b"",
        )
    }
}

/// conf/php-worker.toml as written (paths and port moved) runs the example worker script,
/// with corral finding the worker beside its own executable.
#[test]
fn the_worker_mode_recipe_serves_its_example() {
    worker();
    let dir = shared_dir();
    let root = dir.path().join("public");
    std::fs::create_dir_all(&root).unwrap();
    let repo = Path::new(env!("CARGO_MANIFEST_DIR"));
    let script = std::fs::read_to_string(repo.join("workers/php/examples/worker.php")).unwrap();
    write_file(&root, "worker.php", &script);
    write_file(&root, "robots.txt", "User-agent: *\n");
    let config = std::fs::read_to_string(repo.join("conf/php-worker.toml"))
        .unwrap()
        .replace("/run/corral", &dir.path().join("run").display().to_string())
        .replace("/var/www/app/public", &root.display().to_string())
        .replace("127.0.0.1:8080", "127.0.0.1:0");
    let corral = Corral::start(&config, 1);
    let addr = corral.http_addr();
    let r = http(addr, "GET", "/hello?name=corral", &[], b"");
    assert_eq!(r.status, 200, "{}", corral.log());
    assert!(r.text().starts_with("Hello, corral\n"), "{}", r.text());
    assert_eq!(
        http(addr, "GET", "/robots.txt", &[], b"").text(),
        "User-agent: *\n"
    );
    // 8 workers, one boot each: 40 requests leave some worker past its first request.
    let most = (0..40)
        .map(|_| {
            let text = http(addr, "GET", "/", &[], b"").text();
            let n = text.rsplit(' ').next().unwrap().trim().to_owned();
            n.parse::<u32>().unwrap()
        })
        .max()
        .unwrap();
    assert!(most >= 5, "{most}");
}
