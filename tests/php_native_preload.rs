//! The native PHP worker's fork template (`worker = "native"` pools preload by default): PHP
//! starts once in a template process corral spawns, and every worker is forked from it, as
//! php-fpm's master forks its children. Against real PHP (libphp8.2-embed): each worker is a
//! process of its own, a child of the one template, and all of them map the same OPcache
//! segment; `max_requests` replaces one worker at a time from the same template with no
//! failed request; a template killed outright takes its workers with it, and corral starts a
//! new template whose workers serve; worker mode boots its script in each forked worker;
//! `preload = false` spawns every worker on its own again.

mod support;

use std::collections::BTreeSet;
use std::time::Duration;

use support::native::NativeSite;
use support::peers::{shared_dir, write_file};
use support::sync1::children;

type Site = NativeSite;

impl Site {
    /// corral's children that run the PHP worker (the template, or spawned workers).
    fn direct_children(&self) -> Vec<u32> {
        children(self.corral.pid())
            .into_iter()
            .filter(|&p| cmdline(p).contains("corral-php-worker"))
            .collect()
    }

    /// The one template and its workers, once it has `n` of them.
    fn template_with(&self, n: usize) -> (u32, Vec<u32>) {
        let mut found = None;
        let ok = support::eventually(Duration::from_secs(20), || {
            let t = self.direct_children();
            if let [template] = t.as_slice() {
                // A worker that reached max_requests and exited stays listed until the
                // template reaps it: count the live ones only.
                let w: Vec<u32> = children(*template)
                    .into_iter()
                    .filter(|&p| support::alive(p))
                    .collect();
                if w.len() == n {
                    found = Some((*template, w));
                    return true;
                }
            }
            false
        });
        assert!(
            ok,
            "no template with {n} workers: corral's children {:?}\n{}",
            self.direct_children(),
            self.corral.log()
        );
        found.unwrap()
    }
}

fn cmdline(pid: u32) -> String {
    std::fs::read(format!("/proc/{pid}/cmdline"))
        .map(|b| String::from_utf8_lossy(&b).replace('\0', " "))
        .unwrap_or_default()
}

/// The inode of the biggest shared anonymous mapping of `pid` (OPcache's segment, mapped
/// from /dev/zero), or `None`.
fn opcache_segment(pid: u32) -> Option<(u64, String)> {
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).ok()?;
    maps.lines()
        .filter(|l| l.contains("/dev/zero") || l.contains("SYSV"))
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            let (from, to) = f.first()?.split_once('-')?;
            let size = u64::from_str_radix(to, 16).ok()? - u64::from_str_radix(from, 16).ok()?;
            Some((size, f.get(4)?.to_string()))
        })
        .max()
}

fn site(pool: &str) -> Site {
    site_with(pool, "")
}

/// A site whose context also has `context` (TOML lines).
fn site_with(pool: &str, context: &str) -> Site {
    let dir = shared_dir();
    let root = dir.path().join("www");
    std::fs::create_dir_all(&root).unwrap();
    write_file(&root, "pid.php", "<?php echo getmypid();");
    write_file(
        &root,
        "slow.php",
        "<?php usleep(200000); echo getmypid(), ' ', \
         json_encode(opcache_get_status(false)['opcache_enabled'] ?? null);",
    );
    write_file(
        &root,
        "server.php",
        "<?php echo json_encode([$_SERVER['123'] ?? null, array_key_exists(123, $_SERVER), \
         $_SERVER['9LIVES'] ?? null, $_SERVER['PLAIN_1'] ?? null]);",
    );
    write_file(
        &root,
        "worker.php",
        "<?php $boot = getmypid(); $n = 0;\n\
         while (corral_handle_request(function () use ($boot, &$n) { $n++; \
         echo $boot, ' ', getmypid(), ' ', $n; })) {}",
    );
    NativeSite::start(dir, "php", &format!("max = 2\n{pool}"), context)
}

#[test]
fn workers_are_forked_from_one_template_and_share_its_opcache() {
    let site = site("");
    let (template, workers) = site.template_with(2);
    assert!(
        cmdline(template).ends_with("--preload "),
        "{}",
        cmdline(template)
    );
    // Two requests at once reach both workers, each answering with its own pid.
    let seen: BTreeSet<String> = std::thread::scope(|s| {
        let a = s.spawn(|| site.ok("/slow.php"));
        let b = s.spawn(|| site.ok("/slow.php"));
        [a.join().unwrap(), b.join().unwrap()].into_iter().collect()
    });
    let want: BTreeSet<String> = workers.iter().map(|p| format!("{p} true")).collect();
    assert_eq!(seen, want, "{}", site.corral.log());
    // One OPcache segment: the workers map the template's.
    let segments: Vec<_> = [template, workers[0], workers[1]]
        .iter()
        .map(|&p| opcache_segment(p))
        .collect();
    assert!(segments[0].is_some(), "no OPcache segment in the template");
    assert!(segments.iter().all(|s| s == &segments[0]), "{segments:?}");
    assert!(site.corral.wait_log("forked from preloader"));
}

#[test]
fn max_requests_replaces_one_worker_at_a_time_from_the_same_template() {
    let site = site("max_requests = 5\nmax_requests_jitter = 0");
    let (template, _) = site.template_with(2);
    let pids = site.answers("/pid.php", 30);
    // 30 requests at 5 per worker: at least 6 workers, all forked by the one template.
    assert!(pids.len() >= 6, "{pids:?}");
    // The last workers to reach max_requests exit after their answer and the template forks
    // their replacements: it is the same template, alive, with two live workers again.
    let (after, _) = site.template_with(2);
    assert_eq!(after, template, "the template was replaced");
    assert!(support::alive(template));
}

#[test]
fn a_killed_template_is_replaced_and_the_pool_serves_again() {
    let site = site("");
    let (template, workers) = site.template_with(2);
    site.ok("/pid.php");
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(template as i32),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    // Its workers die with it (parent-death signal), and a new template forks new ones.
    assert!(support::eventually(Duration::from_secs(10), || workers
        .iter()
        .all(|&w| !support::alive(w))));
    let (fresh, new_workers) = site.template_with(2);
    assert_ne!(fresh, template);
    let served: BTreeSet<String> = (0..6).map(|_| site.ok("/pid.php")).collect();
    let new: BTreeSet<String> = new_workers.iter().map(u32::to_string).collect();
    assert!(served.is_subset(&new), "{served:?} not from {new:?}");
}

#[test]
fn worker_mode_boots_in_each_forked_worker() {
    let site = site("worker_script = \"worker.php\"\ncwd = \"ROOT\"");
    let (template, workers) = site.template_with(2);
    let line = cmdline(template);
    assert!(line.contains("--worker worker.php --preload"), "{line}");
    let mut counts = std::collections::BTreeMap::new();
    for _ in 0..10 {
        let text = site.ok("/pid.php");
        let f: Vec<u32> = text.split(' ').map(|n| n.parse().unwrap()).collect();
        // The script booted in the worker that serves (not in the template), and goes on
        // counting there.
        assert_eq!(f[0], f[1], "{text}");
        assert!(workers.contains(&f[0]), "{text} not from {workers:?}");
        let n = counts.entry(f[0]).or_insert(0);
        *n += 1;
        assert_eq!(f[2], *n, "{text}");
    }
}

#[test]
fn preload_false_spawns_every_worker() {
    let site = site("preload = false");
    assert!(support::eventually(Duration::from_secs(20), || site
        .direct_children()
        .len()
        == 2));
    for p in site.direct_children() {
        assert!(!cmdline(p).contains("--preload"), "{}", cmdline(p));
        assert!(children(p).is_empty());
    }
    let pid = site.ok("/pid.php");
    assert!(site.direct_children().iter().any(|p| p.to_string() == pid));
}

/// A variable whose name PHP would parse (here numeric, or starting with a digit) is
/// registered by PHP's full registration, as php-cgi registers it: `123` becomes the
/// integer key 123; a plain one is stored as it is.
#[test]
fn odd_variable_names_take_phps_own_registration() {
    let site = site_with(
        "",
        "params = { \"123\" = \"numeric\", \"9LIVES\" = \"cat\", \"PLAIN_1\" = \"p\" }",
    );
    assert_eq!(
        site.ok("/server.php"),
        r#"["numeric",true,"cat","p"]"#,
        "{}",
        site.corral.log()
    );
}
