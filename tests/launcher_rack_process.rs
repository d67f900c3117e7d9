//! The Rack launcher on its own, started directly on a Unix listener, as a process: how it
//! starts (without the rack gem its own builder reads config.ru; YJIT is off on Ruby 3.1
//! unless the pool turns it on, which runs the launcher again in the same process) and how
//! it stops (SIGTERM finishes the request in progress, then exits 0). The app and the client
//! are in tests/support/launcher_rack.rs.

mod support;

use std::io::{Read, Write};

use corral::protocols::lsapi::ByteOrder;
use nix::sys::signal::Signal;
use support::launcher::{eventually, Launcher};
use support::launcher_rack::{begin_request, read_answer, DIRECT_APP};

#[test]
fn sigterm_finishes_the_request_in_progress_then_exits_zero() {
    let mut launcher = Launcher::rack();
    let mut s = launcher.connect();
    s.write_all(&begin_request("GET", "/slow", "", b"", ByteOrder::NATIVE))
        .unwrap();
    // The app counts its rounds in `ticks`: once the file is there, the app is running
    // (REQ_RECEIVED waits for the answer's head, so nothing arrives before).
    let ticks = launcher.dir().join("ticks");
    let tick = || {
        std::fs::read_to_string(&ticks)
            .ok()
            .and_then(|t| t.trim().parse::<u32>().ok())
    };
    assert!(eventually(|| tick().is_some()), "{}", launcher.stderr());
    launcher.signal(Signal::SIGTERM);
    // The trap runs on the main thread, which runs the app: two rounds of the app's loop
    // after the signal, the trap has run (or the launcher is gone, which fails below).
    let at_signal = tick().unwrap_or(0);
    assert!(eventually(|| {
        tick().is_some_and(|t| t >= at_signal + 2) || launcher.child.try_wait().unwrap().is_some()
    }));
    assert!(
        launcher.child.try_wait().unwrap().is_none(),
        "the launcher exited with its request in progress:\n{}",
        launcher.stderr()
    );
    std::fs::write(launcher.dir().join("go"), "").unwrap();
    let mut rest = Vec::new();
    s.read_to_end(&mut rest).unwrap();
    assert!(
        rest.windows(9).any(|w| w == b"slow done"),
        "{:?}",
        String::from_utf8_lossy(&rest)
    );
    // REQ_RECEIVED leads the answer, the last packet is RESP_END, then the launcher closed
    // the connection.
    assert_eq!(&rest[..3], &[b'L', b'S', 7]);
    assert_eq!(
        &rest[rest.len() - 8..rest.len() - 4],
        &[b'L', b'S', 5, rest[3]]
    );
    let status = launcher
        .exit()
        .expect("the launcher exits after its request");
    assert_eq!(status.code(), Some(0), "{}", launcher.stderr());

    // Idle, waiting for the next request on a kept connection (a blocking read): it exits
    // at once. One request first: the launcher logs "serving" before it sets its traps, and
    // an answer shows they are set.
    let mut idle = Launcher::rack();
    let mut s = idle.connect();
    s.write_all(&begin_request("GET", "/x", "", b"", ByteOrder::NATIVE))
        .unwrap();
    assert_eq!(read_answer(&mut s).body, b"ok /x");
    idle.signal(Signal::SIGTERM);
    let status = idle.exit().expect("an idle launcher exits on SIGTERM");
    assert_eq!(status.code(), Some(0), "{}", idle.stderr());
    drop(s);
}

/// A config.ru that needs no rack gem: `use`, `map` and `run`, as the launcher's own
/// builder reads them.
const PLAIN_APP: &str = r##"
class Tag
  def initialize(app, value)
    @app = app
    @value = value
  end

  def call(env)
    status, headers, body = @app.call(env)
    [status, headers.merge('x-tag' => @value), body]
  end
end

use Tag, 'tagged'
map '/hello' do
  run ->(env) { [200, {}, ["hello script=#{env['SCRIPT_NAME']} path=#{env['PATH_INFO']} version=#{env['rack.version'].inspect}"]] }
end
run ->(env) { [404, {}, ["root #{env['PATH_INFO']}"]] }
"##;

#[test]
fn without_the_rack_gem_the_launchers_own_builder_reads_config_ru() {
    // --disable-gems hides Debian's rack gem.
    let launcher = Launcher::rack_with(&["--disable-gems"], PLAIN_APP);
    assert!(
        launcher.stderr().contains("no rack gem"),
        "{}",
        launcher.stderr()
    );
    let mut s = launcher.connect();
    s.write_all(&begin_request(
        "GET",
        "/hello/there",
        "",
        b"",
        ByteOrder::NATIVE,
    ))
    .unwrap();
    let a = read_answer(&mut s);
    assert_eq!(a.status, 200);
    assert_eq!(
        String::from_utf8_lossy(&a.body),
        "hello script=/hello path=/there version=[1, 3]"
    );
    assert_eq!(a.lines, ["x-tag: tagged"]);
    s.write_all(&begin_request("GET", "/other", "", b"", ByteOrder::NATIVE))
        .unwrap();
    let a = read_answer(&mut s);
    assert_eq!((a.status, a.body.as_slice()), (404, &b"root /other"[..]));
}

/// Asks the launcher's app for `/jit`: "PID YJIT-ON ENV-KEYS-NAMING-YJIT".
fn jit_state(launcher: &Launcher) -> String {
    let mut s = launcher.connect();
    s.write_all(&begin_request("GET", "/jit", "", b"", ByteOrder::NATIVE))
        .unwrap();
    String::from_utf8_lossy(&read_answer(&mut s).body).into_owned()
}

#[test]
fn yjit_is_off_on_ruby_3_1_unless_the_pool_turns_it_on() {
    // Debian's Ruby 3.1 reads YJIT only at start, and a large app's boot fills YJIT's area
    // before its first request (docs/decisions.md, 34): off unless the pool asks.
    let launcher = Launcher::rack();
    let pid = launcher.child.id();
    assert!(
        launcher.stderr().contains(&format!("no YJIT, pid {pid})")),
        "{}",
        launcher.stderr()
    );
    assert_eq!(jit_state(&launcher), format!("{pid} false "));
    // Asked: the launcher starts itself again with YJIT, keeping its pid (corral's handle
    // on it) and its socket, and the app's ENV keeps neither variable that did it.
    let on = Launcher::rack_env(&[], DIRECT_APP, &[("CORRAL_RACK_YJIT", "on")]);
    let pid = on.child.id();
    assert!(
        on.stderr().contains(&format!(", YJIT, pid {pid})")),
        "{}",
        on.stderr()
    );
    assert_eq!(jit_state(&on), format!("{pid} true "));
    // Said off, as before: no restart, no YJIT.
    let off = Launcher::rack_env(&[], DIRECT_APP, &[("CORRAL_RACK_YJIT", "off")]);
    let pid = off.child.id();
    assert!(off.stderr().contains(&format!("no YJIT, pid {pid})")));
    assert_eq!(jit_state(&off), format!("{pid} false "));
    // A value that is neither is named in the log, and the default holds.
    let odd = Launcher::rack_env(&[], DIRECT_APP, &[("CORRAL_RACK_YJIT", "yes")]);
    let pid = odd.child.id();
    assert!(odd.wait_stderr("CORRAL_RACK_YJIT=\"yes\" is neither on nor off"));
    assert!(odd.stderr().contains(&format!("no YJIT, pid {pid})")));
    assert_eq!(jit_state(&odd), format!("{pid} false "));
}
