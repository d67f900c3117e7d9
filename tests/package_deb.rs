//! The Debian package: scripts/build-deb.sh builds it (from the debug binary this test was
//! built with, and the native PHP worker beside it, to save a release build; `--fast`
//! compresses with gzip -1), its contents and
//! control fields are what README.md says, `dpkg -i` installs it (tests run as root on CI),
//! the installed `corral check` accepts the installed /etc/corral/corral.toml,
//! `systemd-analyze verify` accepts the installed units, nothing is enabled or started, and
//! `dpkg --purge` leaves nothing behind: no file, no state directory, no user.
//!
//! The package is machine-wide state, so the test holds a lock file while it runs (another
//! run of it waits), refuses to start if a corral package, user or /etc/corral is already
//! there (it would not know what is its own), and purges on every exit, a failed assertion
//! included.

mod support;

use std::fs::File;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use nix::fcntl::{Flock, FlockArg};

const LOCK: &str = "/run/lock/corral-package-deb.lock";

/// Paths the package installs or creates.
const PATHS: &[&str] = &[
    "/usr/bin/corral",
    "/usr/bin/corral-php-worker",
    "/etc/corral",
    "/lib/systemd/system/corral.service",
    "/lib/systemd/system/corral.socket",
    "/usr/share/doc/corral",
    "/var/lib/corral",
    "/var/log/corral",
];

fn run(program: &str, args: &[&str]) -> support::Outcome {
    let mut cmd = Command::new(program);
    cmd.args(args).env("DEBIAN_FRONTEND", "noninteractive");
    support::run(cmd, Duration::from_secs(180))
}

#[track_caller]
fn ok(program: &str, args: &[&str]) -> String {
    let out = run(program, args);
    assert_eq!(
        out.code,
        Some(0),
        "{program} {args:?} failed:\n{}\n{}",
        out.stdout,
        out.stderr
    );
    out.stdout
}

fn installed() -> bool {
    run("dpkg-query", &["-W", "-f=${db:Status-Status}", "corral"]).stdout == "installed"
}

fn known(database: &str, name: &str) -> bool {
    run("getent", &[database, name]).code == Some(0)
}

/// Processes running /usr/bin/corral.
fn running_installed_binary() -> Vec<String> {
    std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|e| {
            let e = e.ok()?;
            let exe = std::fs::read_link(e.path().join("exe")).ok()?;
            (exe == Path::new("/usr/bin/corral"))
                .then(|| e.file_name().to_string_lossy().into_owned())
        })
        .collect()
}

/// Whether dpkg knows a corral package at all (installed, half-installed or config-files).
fn known_to_dpkg() -> bool {
    run("dpkg-query", &["-W", "corral"]).code == Some(0)
}

/// Purges the package when dropped, also when an assertion failed: a purge, the user and
/// group removed if they are left, a second purge (a postrm that failed on them succeeds
/// then), and as the last resort a purge without the postrm that keeps failing.
struct Purge;

impl Drop for Purge {
    fn drop(&mut self) {
        for _ in 0..2 {
            if known_to_dpkg() {
                let _ = run("dpkg", &["--purge", "corral"]);
            }
            if known("passwd", "corral") {
                let _ = run("userdel", &["corral"]);
            }
            if known("group", "corral") {
                let _ = run("groupdel", &["corral"]);
            }
        }
        if known_to_dpkg() {
            let _ = std::fs::remove_file("/var/lib/dpkg/info/corral.postrm");
            let _ = run("dpkg", &["--purge", "corral"]);
        }
        for dir in ["/var/lib/corral", "/var/log/corral", "/etc/corral"] {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}

#[test]
fn the_deb_builds_installs_checks_verifies_and_purges_without_a_trace() {
    let lock = File::create(LOCK).expect("create the lock file");
    let _lock = Flock::lock(lock, FlockArg::LockExclusive).expect("lock");
    assert!(
        !known_to_dpkg(),
        "dpkg knows a corral package on this machine already: not touching it"
    );
    assert!(
        !known("passwd", "corral") && !known("group", "corral"),
        "a corral user or group exists already"
    );
    for p in PATHS {
        assert!(
            !Path::new(p).exists(),
            "{p} exists already: not touching it"
        );
    }

    let out_dir = tempfile::tempdir().unwrap();
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/scripts/build-deb.sh");
    let built = ok(
        "bash",
        &[
            script,
            "--binary",
            support::CORRAL,
            "--worker",
            support::native::worker().to_str().unwrap(),
            "--out",
            out_dir.path().to_str().unwrap(),
            "--fast",
        ],
    );
    let deb = built.lines().last().unwrap().to_owned();
    let version = env!("CARGO_PKG_VERSION");
    assert_eq!(
        Path::new(&deb).file_name().unwrap().to_str().unwrap(),
        format!("corral_{version}_amd64.deb")
    );

    // What is in it.
    let contents = ok("dpkg-deb", &["-c", &deb]);
    for path in [
        "./usr/bin/corral",
        "./usr/bin/corral-php-worker",
        "./etc/corral/corral.toml",
        "./lib/systemd/system/corral.service",
        "./lib/systemd/system/corral.socket",
        "./usr/share/doc/corral/copyright",
        "./usr/share/doc/corral/examples/php.toml",
        "./usr/share/doc/corral/examples/corral.toml",
        "./usr/share/doc/corral/examples/nginx/php-fpm-dropin.conf",
        "./usr/share/doc/corral/examples/systemd/corral.service",
    ] {
        assert!(
            contents.lines().any(|l| l.ends_with(&format!(" {path}"))),
            "{path} missing from:\n{contents}"
        );
    }
    assert!(
        contents.lines().all(|l| l.contains(" root/root ")),
        "{contents}"
    );
    let info = ok("dpkg-deb", &["-I", &deb]);
    for field in [
        "Package: corral".to_owned(),
        format!("Version: {version}"),
        "Architecture: amd64".to_owned(),
        "Recommends: php-cgi, libphp8.2-embed".to_owned(),
    ] {
        assert!(info.contains(&field), "{field} missing from:\n{info}");
    }
    for member in ["conffiles", "md5sums", "postinst", "prerm", "postrm"] {
        assert!(
            info.contains(&format!(" {member} ")),
            "{member} missing from:\n{info}"
        );
    }
    // The maintainer scripts start and enable nothing.
    let control = tempfile::tempdir().unwrap();
    ok("dpkg-deb", &["-e", &deb, control.path().to_str().unwrap()]);
    assert_eq!(
        std::fs::read_to_string(control.path().join("conffiles")).unwrap(),
        "/etc/corral/corral.toml\n"
    );
    for script in ["postinst", "prerm", "postrm"] {
        let text = std::fs::read_to_string(control.path().join(script)).unwrap();
        for line in text.lines().filter(|l| !l.trim_start().starts_with('#')) {
            for word in [
                "systemctl start",
                "systemctl enable",
                "systemctl restart",
                "deb-systemd-invoke",
                "invoke-rc.d",
                "corral run",
            ] {
                assert!(!line.contains(word), "{script} runs {word:?}: {line}");
            }
        }
    }

    // Installed.
    // Cleans up at the end of the test, after the checks below saw what the purge left.
    let _purge = Purge;
    ok("dpkg", &["-i", &deb]);
    assert!(installed());
    let conffiles = ok("dpkg-query", &["-W", "-f=${Conffiles}", "corral"]);
    assert!(conffiles.contains("/etc/corral/corral.toml"), "{conffiles}");
    let passwd = ok("getent", &["passwd", "corral"]);
    let uid: u32 = passwd.split(':').nth(2).unwrap().parse().unwrap();
    assert!(uid < 1000, "corral is no system user: {passwd}");
    assert!(
        passwd
            .trim_end()
            .ends_with(":/var/lib/corral:/usr/sbin/nologin"),
        "{passwd}"
    );
    for dir in ["/var/lib/corral", "/var/log/corral"] {
        let meta = std::fs::metadata(dir).unwrap();
        assert_eq!(std::os::unix::fs::MetadataExt::uid(&meta), uid, "{dir}");
    }
    // Every installed file is the packaged one (md5sums), the conffile too.
    let verified = ok("dpkg", &["--verify", "corral"]);
    assert_eq!(verified, "", "dpkg --verify corral:\n{verified}");
    let checked = ok(
        "/usr/bin/corral",
        &["check", "-c", "/etc/corral/corral.toml"],
    );
    assert_eq!(checked.trim(), "/etc/corral/corral.toml: ok");
    // A native PHP pool finds the packaged worker beside /usr/bin/corral, and it starts PHP.
    let native = support::config_file(
        "[[listen]]\naddress = \"127.0.0.1:8080\"\nprotocol = \"http\"\n\n\
         [pools.php]\nworker = \"native\"\n\n[[contexts]]\nroot = \"/tmp\"\npool = \"php\"\n",
    );
    let checked = run(
        "/usr/bin/corral",
        &["check", "-c", native.path().to_str().unwrap()],
    );
    assert_eq!(
        checked.code,
        Some(0),
        "corral check of a native pool:\n{}{}",
        checked.stdout,
        checked.stderr
    );
    // The day-one path with the installed binary: php-fpm's own pools converted and checked.
    let converted = ok(
        "/usr/bin/corral",
        &["convert", "php-fpm", "/etc/php/8.2/fpm/php-fpm.conf"],
    );
    let file = support::config_file(&converted);
    ok(
        "/usr/bin/corral",
        &["check", "-c", file.path().to_str().unwrap()],
    );
    let verify = run(
        "/usr/bin/systemd-analyze",
        &[
            "verify",
            "/lib/systemd/system/corral.service",
            "/lib/systemd/system/corral.socket",
        ],
    );
    assert_eq!(
        verify.code,
        Some(0),
        "systemd-analyze verify:\n{}{}",
        verify.stdout,
        verify.stderr
    );
    assert!(
        !verify.stderr.contains("corral"),
        "systemd-analyze verify warned:\n{}",
        verify.stderr
    );
    let unit = std::fs::read_to_string("/lib/systemd/system/corral.service").unwrap();
    assert!(
        unit.contains("ExecStart=/usr/bin/corral run -c /etc/corral/corral.toml"),
        "{unit}"
    );
    // Nothing enabled, nothing started.
    for link in [
        "/etc/systemd/system/multi-user.target.wants/corral.service",
        "/etc/systemd/system/sockets.target.wants/corral.socket",
    ] {
        assert!(!Path::new(link).exists(), "{link} was created");
    }
    assert_eq!(
        running_installed_binary(),
        Vec::<String>::new(),
        "the package started corral"
    );

    // Purged: nothing left.
    ok("dpkg", &["--purge", "corral"]);
    assert!(!known_to_dpkg(), "dpkg still knows corral");
    for p in PATHS {
        assert!(!Path::new(p).exists(), "{p} is left after the purge");
    }
    assert!(!known("passwd", "corral"), "the corral user is left");
    assert!(!known("group", "corral"), "the corral group is left");
}
