//! The WSGI launcher alone, on a Unix listener passed as fd 0, as a process: SIGTERM or
//! SIGINT finish the request in progress, then exit 0, at once when idle between requests.
//! The app and the client are in tests/support/launcher_wsgi.rs.

mod support;

use std::io::{Read, Write};

use nix::sys::signal::Signal;
use support::launcher::{eventually, Launcher};
use support::launcher_wsgi::{get, read_answer};
use support::peers::shared_dir;

#[test]
fn sigterm_and_sigint_finish_the_request_in_progress_then_exit_0() {
    for signal in [Signal::SIGTERM, Signal::SIGINT] {
        let dir = shared_dir();
        let mut launcher = Launcher::wsgi(dir.path());
        let mut s = launcher.connect();
        s.write_all(&get("/slow")).unwrap();
        assert!(eventually(|| dir.path().join("started").exists()));
        let ticks = dir.path().join("ticks");
        let tick = || {
            std::fs::read_to_string(&ticks)
                .ok()
                .and_then(|t| t.trim().parse::<u32>().ok())
        };
        let at_signal = tick().unwrap_or(0);
        launcher.signal(signal);
        // Python runs signal handlers on the main thread, which runs the app: two rounds of
        // its loop after the signal, the handler has run (or the launcher is gone).
        assert!(eventually(|| {
            tick().is_some_and(|t| t >= at_signal + 2)
                || launcher.child.try_wait().unwrap().is_some()
        }));
        // Still running: the request is not done.
        assert!(
            launcher.child.try_wait().unwrap().is_none(),
            "{signal}: the launcher exited with its request in progress\n{}",
            launcher.stderr()
        );
        std::fs::write(dir.path().join("go"), "").unwrap();
        assert_eq!(read_answer(&mut s).text(), "finished", "{signal}");
        // Then the connection closes and the launcher exits.
        let mut rest = Vec::new();
        s.read_to_end(&mut rest).unwrap();
        assert!(rest.is_empty(), "{rest:?}");
        assert_eq!(launcher.exit_code(), Some(0), "{}", launcher.stderr());

        // An idle launcher, waiting for a connection, stops at once.
        let dir = shared_dir();
        let mut launcher = Launcher::wsgi(dir.path());
        launcher.signal(signal);
        assert_eq!(launcher.exit_code(), Some(0), "{}", launcher.stderr());

        // So does one waiting for the next request on a kept connection.
        let dir = shared_dir();
        let mut launcher = Launcher::wsgi(dir.path());
        let mut s = launcher.connect();
        s.write_all(&get("/")).unwrap();
        assert_eq!(read_answer(&mut s).text(), "hello");
        launcher.signal(signal);
        assert_eq!(launcher.exit_code(), Some(0), "{}", launcher.stderr());
    }
}
