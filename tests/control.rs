//! `corral stop`, `reload` and `restart-workers` signal only the corral of the
//! configuration's runtime directory: a pid file naming another process (a forged or stale
//! one, or one rewritten while corral runs), a symlinked pid file, and an unsafe runtime
//! directory are refused, and the process named is left alone. The real binary, a real
//! `sleep` as the process a forged file names, and a real corral with php-cgi.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing,
    missing_docs
)]

mod support;

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::{Child, Command};

use support::server::Corral;

fn config(run: &Path, root: &Path) -> String {
    format!(
        "[server]\nruntime_dir = \"{run}\"\nkill_timeout = \"2s\"\n\
         [[listen]]\naddress = \"127.0.0.1:0\"\nprotocol = \"http\"\n\
         [pools.php]\ncommand = [\"php-cgi\"]\nmode = \"static\"\nmax = 1\n\
         [[contexts]]\npool = \"php\"\nroot = \"{root}\"\n",
        run = run.display(),
        root = root.display()
    )
}

/// A process that is not corral, killed and reaped on drop.
struct Victim(Child);

impl Victim {
    fn start() -> Victim {
        Victim(Command::new("sleep").arg("300").spawn().unwrap())
    }

    fn pid(&self) -> u32 {
        self.0.id()
    }

    fn alive(&mut self) -> bool {
        self.0.try_wait().unwrap().is_none()
    }
}

impl Drop for Victim {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Runs each signalling command on `file` and expects it refused with `reason`.
fn refused(file: &Path, reason: &str) {
    let path = file.to_str().unwrap();
    for command in ["stop", "reload", "restart-workers"] {
        let out = support::corral(&[command, "-c", path]);
        assert_ne!(out.code, Some(0), "{command}: {out:?}");
        assert!(
            out.stderr.contains(reason),
            "{command}: {reason:?} in {out:?}"
        );
    }
}

#[test]
fn a_pid_file_naming_another_process_or_a_link_is_refused_and_the_process_lives() {
    let dir = tempfile::tempdir().unwrap();
    let run = dir.path().join("run");
    std::fs::create_dir(&run).unwrap();
    std::fs::set_permissions(&run, std::fs::Permissions::from_mode(0o700)).unwrap();
    let file = support::config_file(&config(&run, dir.path()));
    let pid_file = run.join("corral.pid");
    let mut victim = Victim::start();

    // A pid file corral did not write: nobody holds its lock.
    std::fs::write(&pid_file, format!("{}\n", victim.pid())).unwrap();
    std::fs::set_permissions(&pid_file, std::fs::Permissions::from_mode(0o600)).unwrap();
    refused(file.path(), "no corral holds the file's lock");
    assert!(victim.alive(), "the process named was signalled");

    // A symbolic link in its place.
    std::fs::remove_file(&pid_file).unwrap();
    let elsewhere = dir.path().join("elsewhere.pid");
    std::fs::write(&elsewhere, format!("{}\n", victim.pid())).unwrap();
    std::os::unix::fs::symlink(&elsewhere, &pid_file).unwrap();
    refused(file.path(), "it is a symbolic link");
    assert!(victim.alive());
    std::fs::remove_file(&pid_file).unwrap();

    // A runtime directory others may write in: anyone could have written the file.
    std::fs::write(&pid_file, format!("{}\n", victim.pid())).unwrap();
    std::fs::set_permissions(&pid_file, std::fs::Permissions::from_mode(0o600)).unwrap();
    std::fs::set_permissions(&run, std::fs::Permissions::from_mode(0o777)).unwrap();
    refused(file.path(), "writable by its group or by everyone");
    assert!(victim.alive());
}

#[test]
fn a_pid_file_rewritten_while_corral_runs_names_a_process_that_is_not_the_lock_holder() {
    let dir = tempfile::tempdir().unwrap();
    let run = dir.path().join("run");
    let text = config(&run, dir.path());
    let corral = Corral::start(&text, 1);
    let file = corral.config_path().to_str().unwrap().to_owned();
    let pid_file = run.join("corral.pid");
    let mut victim = Victim::start();
    // Rewritten in place (not replaced), so the file corral locked is the one read.
    std::fs::OpenOptions::new()
        .write(true)
        .truncate(true)
        .open(&pid_file)
        .and_then(|mut f| {
            use std::io::Write;
            writeln!(f, "{}", victim.pid())
        })
        .unwrap();
    refused(
        Path::new(&file),
        &format!("its lock is held by process {}", corral.pid()),
    );
    assert!(victim.alive());
    // Named right again, corral is reached.
    std::fs::write(&pid_file, format!("{}\n", corral.pid())).unwrap();
    let out = support::corral(&["restart-workers", "-c", &file]);
    assert_eq!(out.code, Some(0), "{out:?}\n{}", corral.log());
    let out = support::corral(&["stop", "-c", &file]);
    assert_eq!(out.code, Some(0), "{out:?}\n{}", corral.log());
}
