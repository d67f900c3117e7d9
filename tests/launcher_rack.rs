//! The embedded Rack launcher, behind the real corral binary and on its own: a pool with
//! `app = "rack:config.ru"` (LSAPI by default) serves a test app wrapped in `Rack::Lint`, from
//! Debian's rack gem, on persistent LSAPI connections; and the launcher started directly on a
//! Unix listener, driven with corral's LSAPI codec, answers in the request's byte order,
//! survives malformed packets and finishes its request on SIGTERM.

mod support;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{Shutdown, TcpStream};
use std::os::fd::OwnedFd;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::BytesMut;
use corral::protocols::lsapi::{
    ByteOrder, FlagRule, RequestBuilder, ResponseDecoder, ResponseEvent,
};
use corral::protocols::Limits;
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use support::lsapi::{assert_closed_without_answer, read_answer_from, Answer};
use support::peers::{md5_hex, shared_dir, write_file};
use support::server::{http, parse_response, Corral};

/// The test app: one Rack endpoint per path, all behind `Rack::Lint`. Headers are
/// lowercase (Rack 3 wants that, Rack 2 accepts it); two Set-Cookie values are an array in
/// Rack 3 and one "\n"-joined string in Rack 2.
const APP: &str = r##"require 'digest/md5'

HERE = Dir.pwd
RACK3 = Rack.release.to_i >= 3

def cookies(*values)
  RACK3 ? values : values.join("\n")
end

def show(env)
  text = format('method=%s query=%s script=%p path=%p custom=%s scheme=%s server=%s:%s proto=%s',
                env['REQUEST_METHOD'], env['QUERY_STRING'], env['SCRIPT_NAME'], env['PATH_INFO'],
                env['HTTP_X_CUSTOM_THING'], env['rack.url_scheme'], env['SERVER_NAME'],
                env['SERVER_PORT'], env['SERVER_PROTOCOL'])
  [200, { 'content-type' => 'text/plain',
          'set-cookie' => cookies('a=1; Path=/', 'b=2; Path=/') }, [text]]
end

def echo(env)
  input = env['rack.input']
  body = +''
  while (part = input.read(65_536))
    body << part
  end
  [200, { 'content-type' => 'application/octet-stream',
          'x-body-md5' => Digest::MD5.hexdigest(body),
          'x-content-length' => env['CONTENT_LENGTH'].to_s }, [body]]
end

# Yields a chunk, waits until the test creates `go`, yields the rest; close leaves a marker.
class Stream
  def each
    yield 'first;'
    1000.times do
      break if File.exist?(File.join(HERE, 'go'))

      sleep 0.01
    end
    yield 'second;'
    yield ''
    yield 'third;'
  end

  def close
    File.write(File.join(HERE, 'closed'), 'closed')
  end
end

def explode_for_the_test
  raise 'kaboom from the rack test app'
end

use Rack::Lint
run(lambda do |env|
  case env['PATH_INFO']
  when '/echo' then echo(env)
  when '/stream' then [200, { 'content-type' => 'text/plain' }, Stream.new]
  when '/boom' then explode_for_the_test
  when '/sleep'
    sleep 3
    [200, { 'content-type' => 'text/plain' }, ['slept']]
  when '/conn'
    text = "#{Process.pid} #{env['corral.connection_requests']}"
    [200, { 'content-type' => 'text/plain' }, [text]]
  else show(env)
  end
end)
"##;

/// A corral with one http listener in front of a one-worker pool running the test app from
/// `dir`, mounted at `/app` and at the root; the pool names no protocol, so it is LSAPI.
fn start(dir: &Path) -> Corral {
    start_with(dir, "")
}

/// `start` with `keys` added to the pool.
fn start_with(dir: &Path, keys: &str) -> Corral {
    let config = format!(
        r#"
[server]
runtime_dir = "{run}"
grace = "5s"
kill_timeout = "2s"

[[listen]]
address = "127.0.0.1:0"
protocol = "http"

[pools.rb]
app = "rack:config.ru"
cwd = "{dir}"
mode = "static"
min = 1
max = 1
{keys}

[[contexts]]
prefix = "/app"
pool = "rb"

[[contexts]]
prefix = "/"
pool = "rb"
"#,
        run = dir.join("run").display(),
        dir = dir.display(),
    );
    Corral::start(&config, 1)
}

fn app_dir() -> tempfile::TempDir {
    let dir = shared_dir();
    write_file(dir.path(), "config.ru", APP);
    dir
}

/// Every value of header `name` (lowercase), in order.
fn all<'a>(headers: &'a [(String, String)], name: &str) -> Vec<&'a str> {
    headers
        .iter()
        .filter(|(n, _)| n == name)
        .map(|(_, v)| v.as_str())
        .collect()
}

/// The log has no complaint from Rack::Lint or from the launcher about the wire, up to a
/// marker corral logs after the call (so a complaint still on its way is seen).
fn assert_clean_log(corral: &Corral) {
    let log = corral.mark();
    for bad in [
        "LintError",
        "bad LSAPI request",
        "connection failed",
        "connection closed by corral",
    ] {
        assert!(!log.contains(bad), "{bad} in the log:\n{log}");
    }
}

#[test]
fn a_linted_get_sees_its_query_headers_cookies_and_mount_point() {
    let dir = app_dir();
    let corral = start(dir.path());
    let addr = corral.http_addr();
    let r = http(
        addr,
        "GET",
        "/some/where?x=1&y=two",
        &[("X-Custom-Thing", "hello")],
        b"",
    );
    assert_eq!(r.status, 200, "{}", corral.log());
    assert_eq!(
        r.text(),
        format!(
            "method=GET query=x=1&y=two script=\"\" path=\"/some/where\" custom=hello \
             scheme=http server=localhost:{} proto=HTTP/1.1",
            addr.port()
        )
    );
    assert_eq!(
        all(&r.headers, "set-cookie"),
        ["a=1; Path=/", "b=2; Path=/"]
    );

    // Under the `/app` context the prefix is SCRIPT_NAME and the rest PATH_INFO.
    let r = http(addr, "GET", "/app/some/path?q=1", &[], b"");
    assert_eq!(r.status, 200, "{}", corral.log());
    assert!(
        r.text()
            .starts_with("method=GET query=q=1 script=\"/app\" path=\"/some/path\" "),
        "{}",
        r.text()
    );
    let r = http(addr, "GET", "/app", &[], b"");
    assert!(
        r.text().contains("script=\"/app\" path=\"\""),
        "{}",
        r.text()
    );
    assert_clean_log(&corral);
}

#[test]
fn posted_bodies_arrive_whole_through_rack_input() {
    let dir = app_dir();
    let corral = start(dir.path());
    let addr = corral.http_addr();
    let r = http(
        addr,
        "POST",
        "/echo",
        &[("Content-Type", "text/plain")],
        b"hello body",
    );
    assert_eq!(r.status, 200, "{}", corral.log());
    assert_eq!(r.text(), "hello body");
    assert_eq!(r.header("x-content-length"), Some("10"));

    // Exactly 1 MiB (kept in memory) and 1 MiB + 1 (spooled to a temporary file) of
    // non-repeating bytes: echoed back unchanged, and the app's md5 agrees with md5sum's.
    for len in [1u32 << 20, (1 << 20) + 1] {
        let big: Vec<u8> = (0u32..len)
            .map(|i| (i.wrapping_mul(2_654_435_761) >> 24) as u8)
            .collect();
        let r = http(addr, "POST", "/echo", &[], &big);
        assert_eq!(r.status, 200, "{}", corral.log());
        assert_eq!(r.body.len(), big.len());
        assert!(r.body == big, "the echoed {len}-byte body differs");
        let md5 = md5_hex(dir.path(), &big);
        assert_eq!(r.header("x-body-md5"), Some(md5.as_str()));
        assert_eq!(r.header("x-content-length"), Some(len.to_string().as_str()));
    }

    // An empty POST reads an empty input.
    let r = http(addr, "POST", "/echo", &[], b"");
    assert_eq!((r.status, r.body.len()), (200, 0), "{}", corral.log());
    assert_clean_log(&corral);
}

#[test]
fn a_body_streams_chunk_by_chunk_and_is_closed() {
    let dir = app_dir();
    let corral = start(dir.path());
    let mut s = TcpStream::connect(corral.http_addr()).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.write_all(b"GET /stream HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
        .unwrap();
    // The first chunk must arrive while the body is still waiting for `go`.
    let mut raw = Vec::new();
    let mut buf = [0u8; 4096];
    while !String::from_utf8_lossy(&raw).contains("first;") {
        let n = s.read(&mut buf).unwrap_or_else(|e| {
            panic!(
                "no first chunk before the body finished ({e}): {:?}\n{}",
                String::from_utf8_lossy(&raw),
                corral.log()
            )
        });
        assert!(n > 0, "closed before the first chunk:\n{}", corral.log());
        raw.extend_from_slice(&buf[..n]);
    }
    assert!(!String::from_utf8_lossy(&raw).contains("second;"));
    std::fs::write(dir.path().join("go"), "").unwrap();
    s.read_to_end(&mut raw).unwrap();
    let r = parse_response(&raw);
    assert_eq!(r.status, 200);
    assert_eq!(r.text(), "first;second;third;");
    let closed = dir.path().join("closed");
    assert!(
        eventually(|| closed.exists()),
        "the body's close was not called:\n{}",
        corral.log()
    );
    assert_clean_log(&corral);
}

#[test]
fn an_app_error_is_a_500_with_the_backtrace_in_corrals_log() {
    let dir = app_dir();
    let corral = start(dir.path());
    let addr = corral.http_addr();
    let r = http(addr, "GET", "/boom", &[], b"");
    assert_eq!(r.status, 500, "{}", corral.log());
    assert_eq!(r.text(), "Internal Server Error\n");
    assert!(
        corral.wait_log("kaboom from the rack test app"),
        "{}",
        corral.log()
    );
    // The backtrace names the method that raised.
    assert!(corral.wait_log("explode_for_the_test"), "{}", corral.log());
    // The worker keeps serving.
    let r = http(addr, "GET", "/after", &[], b"");
    assert_eq!(r.status, 200, "{}", corral.log());
    assert_clean_log(&corral);
}

#[test]
fn first_byte_timeout_covers_the_app_until_its_answer() {
    // The launcher acknowledges a request with the answer's first write, so corral's
    // first-byte deadline runs while the app does (sent alone, REQ_RECEIVED would end it).
    let dir = app_dir();
    let corral = start_with(dir.path(), "first_byte_timeout = \"1s\"");
    let r = http(corral.http_addr(), "GET", "/sleep", &[], b"");
    assert_eq!(r.status, 504, "{}", corral.log());
}

#[test]
fn sequential_requests_share_one_worker_and_one_connection() {
    let dir = app_dir();
    let corral = start(dir.path());
    let addr = corral.http_addr();
    let answers: Vec<(String, u32)> = (0..6)
        .map(|_| {
            let r = http(addr, "GET", "/conn", &[], b"");
            assert_eq!(r.status, 200, "{}", corral.log());
            let text = r.text();
            let (pid, n) = text.split_once(' ').unwrap();
            (pid.to_owned(), n.parse().unwrap())
        })
        .collect();
    let pid = &answers[0].0;
    assert!(answers.iter().all(|(p, _)| p == pid), "{answers:?}");
    // Each request is the next one on the same persistent LSAPI connection.
    let first = answers[0].1;
    let counts: Vec<u32> = answers.iter().map(|(_, n)| *n).collect();
    assert_eq!(
        counts,
        (first..first + 6).collect::<Vec<_>>(),
        "{answers:?}"
    );
    assert_clean_log(&corral);
}

/// Polls `check` for up to 5 s.
fn eventually(check: impl FnMut() -> bool) -> bool {
    support::eventually(Duration::from_secs(5), check)
}

// ---------------------------------------------------------------------------------------
// The launcher on its own, with corral's LSAPI codec as the client.

/// A plain app (no Lint) for the direct tests.
const DIRECT_APP: &str = r##"
class Callable
  def call(stream)
    stream.write('streamed;')
    stream << 'by call'
    stream.close
  end
end

run(lambda do |env|
  case env['PATH_INFO']
  when '/echo' then [200, { 'content-type' => 'text/plain' }, [env['rack.input'].read]]
  when '/slow'
    # Runs until the test writes `go`, counting its rounds in `ticks`.
    2000.times do |i|
      break if File.exist?('go')

      File.write('ticks', i.to_s)
      sleep 0.01
    end
    [200, { 'content-type' => 'text/plain' }, ['slow done']]
  when '/callable' then [200, { 'content-type' => 'text/plain' }, Callable.new]
  when '/jit'
    state = "#{Process.pid} #{RubyVM::YJIT.enabled?} #{ENV.keys.grep(/YJIT/).sort.join(',')}"
    [200, { 'content-type' => 'text/plain' }, [state]]
  when '/length-then-wait'
    # The bytes its Content-Length announces, then a body that ends once `go` is there
    # (6 s at most).
    wait = Enumerator.new do |y|
      y << 'whole'
      600.times { File.exist?('go') ? break : sleep(0.01) }
    end
    [200, { 'content-length' => '5' }, wait]
  when '/over-length' then [200, { 'Content-Length' => '5' }, Enumerator.new { |y| y << 'whole' << '' << 'and more' }]
  when '/fail-early' then [200, {}, Enumerator.new { raise 'no chunk at all' }]
  when '/fail-late' then [200, {}, Enumerator.new { |y| y << 'part;'; raise 'half way' }]
  when '/bad-header' then [200, { 'bad name' => 'x' }, ['never sent']]
  else [200, { 'content-type' => 'text/plain', 'connection' => 'close' }, ["ok #{env['PATH_INFO']}"]]
  end
end)
"##;

/// `ruby corral-rack.rb config.ru` with a Unix listener on fd 0; killed on drop.
struct Launcher {
    child: Child,
    socket: PathBuf,
    stderr: Arc<Mutex<String>>,
    _dir: tempfile::TempDir,
}

impl Launcher {
    fn start() -> Launcher {
        Launcher::start_with(&[], DIRECT_APP)
    }

    /// Runs `ruby RUBY_ARGS corral-rack.rb config.ru` with `app` as config.ru.
    fn start_with(ruby_args: &[&str], app: &str) -> Launcher {
        Launcher::start_env(ruby_args, app, &[])
    }

    /// `start_with`, with `env` added to the launcher's environment.
    fn start_env(ruby_args: &[&str], app: &str, env: &[(&str, &str)]) -> Launcher {
        let dir = tempfile::tempdir().unwrap();
        write_file(dir.path(), "config.ru", app);
        let script = write_file(dir.path(), "corral-rack.rb", corral::launchers::RACK);
        let socket = dir.path().join("rack.sock");
        let listener = UnixListener::bind(&socket).unwrap();
        let mut child = Command::new("ruby")
            .args(ruby_args)
            .arg(&script)
            .arg("config.ru")
            .envs(env.iter().copied())
            .current_dir(dir.path())
            .stdin(Stdio::from(OwnedFd::from(listener)))
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("run ruby");
        let stderr = Arc::new(Mutex::new(String::new()));
        let sink = Arc::clone(&stderr);
        let pipe = child.stderr.take().unwrap();
        std::thread::spawn(move || {
            for line in BufReader::new(pipe).lines().map_while(Result::ok) {
                let mut log = sink.lock().unwrap();
                log.push_str(&line);
                log.push('\n');
            }
        });
        let launcher = Launcher {
            child,
            socket,
            stderr,
            _dir: dir,
        };
        assert!(
            launcher.wait_stderr("corral-rack: serving config.ru"),
            "the launcher did not start:\n{}",
            launcher.stderr()
        );
        launcher
    }

    fn connect(&self) -> UnixStream {
        let s = UnixStream::connect(&self.socket).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        s
    }

    fn stderr(&self) -> String {
        self.stderr.lock().unwrap().clone()
    }

    fn wait_stderr(&self, needle: &str) -> bool {
        eventually(|| self.stderr().contains(needle))
    }

    fn signal(&self, signal: Signal) {
        kill(Pid::from_raw(self.child.id() as i32), signal).unwrap();
    }

    /// How the launcher exited, waiting 5 s at most.
    fn exit(&mut self) -> Option<ExitStatus> {
        let mut status = None;
        eventually(|| {
            status = self.child.try_wait().unwrap();
            status.is_some()
        });
        status
    }
}

impl Drop for Launcher {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A BEGIN_REQUEST for `method path?query` with `body`, integers in `order`.
fn begin_request(method: &str, path: &str, query: &str, body: &[u8], order: ByteOrder) -> Vec<u8> {
    let line = format!("{method} {path} HTTP/1.1");
    let mut b = RequestBuilder::new(&Limits::DEFAULT, line.as_bytes())
        .unwrap()
        .with_byte_order(order, FlagRule::HOST);
    for (name, value) in [
        ("REQUEST_METHOD", method),
        ("SCRIPT_NAME", ""),
        ("SCRIPT_FILENAME", ""),
        ("PATH_INFO", path),
        ("QUERY_STRING", query),
        ("SERVER_NAME", "localhost"),
        ("SERVER_PORT", "80"),
        ("SERVER_PROTOCOL", "HTTP/1.1"),
    ] {
        b.env(name.as_bytes(), value.as_bytes()).unwrap();
    }
    b.header(b"Host", b"localhost").unwrap();
    b.header(b"X-Test", b"direct").unwrap();
    if !body.is_empty() {
        b.header(b"Content-Length", body.len().to_string().as_bytes())
            .unwrap();
        b.body_len(body.len() as u64);
    }
    let mut out = BytesMut::new();
    b.encode(&mut out).unwrap();
    out.extend_from_slice(body);
    out.to_vec()
}

/// Reads packets until RESP_END.
fn read_answer(s: &mut UnixStream) -> Answer {
    let mut buf = BytesMut::new();
    let mut answer = Answer::default();
    assert!(
        read_answer_from(s, &mut buf, &mut answer),
        "connection closed before RESP_END: {answer:?}"
    );
    answer
}

#[test]
fn the_launcher_answers_in_the_byte_order_of_each_request() {
    let launcher = Launcher::start();
    let mut s = launcher.connect();
    for order in [ByteOrder::NATIVE, ByteOrder::Big, ByteOrder::Little] {
        s.write_all(&begin_request("POST", "/echo", "", b"some body", order))
            .unwrap();
        let a = read_answer(&mut s);
        let flag = FlagRule::HOST.flag_for(order);
        assert!(a.flags.iter().all(|&f| f == flag), "{order:?}: {a:?}");
        assert_eq!(a.events[0], ResponseEvent::ReqReceived, "{a:?}");
        assert_eq!((a.status, a.body.as_slice()), (200, &b"some body"[..]));
        assert_eq!(a.lines, ["content-type: text/plain"]);
    }
    // A hop-by-hop header from the app is dropped (and logged): corral owns the connection.
    s.write_all(&begin_request("GET", "/x", "", b"", ByteOrder::NATIVE))
        .unwrap();
    let a = read_answer(&mut s);
    assert_eq!((a.status, a.body.as_slice()), (200, &b"ok /x"[..]));
    assert_eq!(a.lines, ["content-type: text/plain"]);
    assert!(launcher.wait_stderr("dropped hop-by-hop header connection"));
    // A Rack 3 streaming body (call, not each) writes through the stream.
    s.write_all(&begin_request(
        "GET",
        "/callable",
        "",
        b"",
        ByteOrder::NATIVE,
    ))
    .unwrap();
    let a = read_answer(&mut s);
    assert_eq!(a.body, b"streamed;by call");
}

#[test]
fn a_request_written_byte_by_byte_is_read_whole() {
    let launcher = Launcher::start();
    let mut s = launcher.connect();
    let body: Vec<u8> = (0..40_000u32).map(|i| (i % 251) as u8).collect();
    for b in begin_request("POST", "/echo", "", &body, ByteOrder::NATIVE) {
        s.write_all(&[b]).unwrap();
    }
    let a = read_answer(&mut s);
    assert_eq!(a.body, body);
    // 40000 bytes come back in packets of at most 16 KiB.
    let streams = a
        .events
        .iter()
        .filter(|e| matches!(e, ResponseEvent::Stream(_)))
        .count();
    assert_eq!(streams, 3, "{:?}", a.flags);
}

#[test]
fn bad_packets_close_the_connection_and_the_launcher_keeps_serving() {
    let launcher = Launcher::start();
    let good = begin_request("GET", "/x", "", b"", ByteOrder::Little);
    let with = |at: usize, bytes: &[u8]| {
        let mut p = good.clone();
        p[at..at + bytes.len()].copy_from_slice(bytes);
        p
    };
    // The first env pair starts after the 44-byte header and the empty special env list;
    // its lengths are big-endian and count the NUL.
    let key_len = u16::from_be_bytes([good[48], good[49]]) as usize;
    let garbage: Vec<u8> = (0..4096u32)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
        .collect();
    let cases: Vec<(&str, Vec<u8>, &str)> = vec![
        ("bad magic", with(0, b"XS"), "packet magic"),
        (
            "a response packet type",
            with(2, &[3]),
            "is not BEGIN_REQUEST",
        ),
        // Packet length (little-endian) 65536: over the limit; and one shorter than a
        // request header.
        (
            "too long",
            with(4, &[0x00, 0x00, 0x01, 0x00]),
            "length 65536 is outside",
        ),
        (
            "too short",
            with(4, &[100, 0, 0, 0]),
            "length 100 is outside",
        ),
        // The first env pair's key length runs past the packet.
        (
            "pair past the end",
            with(48, &[0xff, 0xff]),
            "runs past the",
        ),
        ("zero pair length", with(48, &[0x00, 0x00]), "zero length"),
        // The first key's NUL is not where its length puts it.
        (
            "key not NUL-terminated",
            with(48 + 4 + key_len - 1, b"X"),
            "env pair 0 is not NUL-terminated",
        ),
        // A packet length that cuts the env list: the pairs go on in the bytes after the
        // packet, with their NULs where their lengths say, yet they are not the packet's.
        (
            "env list past the packet length",
            with(4, &[210, 0, 0, 0]),
            "runs past the 210-byte packet",
        ),
        // A body length of -1.
        (
            "negative body",
            with(12, &[0xff, 0xff, 0xff, 0xff]),
            "m_reqBodyLen -1",
        ),
        // m_cntEnv one too many: the terminator is read as a pair; a count over 8192.
        ("env count", with(36, &[9, 0, 0, 0]), "zero length"),
        (
            "huge env count",
            with(36, &[0xff, 0xff, 0, 0]),
            "pair count 65535",
        ),
        // A string offset outside the packet; a header block length that does not end
        // the packet; an unknown-header count that runs past it.
        (
            "offset outside",
            with(16, &[0xff, 0xff, 0, 0]),
            "Off 65535 is outside",
        ),
        (
            "header block length",
            with(8, &[0xff, 0, 0, 0]),
            "sections end at",
        ),
        (
            "unknown header count",
            with(32, &[0xff, 0xff, 0xff, 0x7f]),
            "sections end at",
        ),
        // The peer closes in the middle of the packet, or of its header.
        (
            "truncated",
            good[..good.len() - 3].to_vec(),
            "connection closed inside BEGIN_REQUEST",
        ),
        (
            "truncated header",
            good[..5].to_vec(),
            "connection closed inside a packet header (5 of 8 bytes)",
        ),
        // Random bytes.
        ("garbage", garbage, "packet magic"),
    ];
    let n = cases.len();
    let complaints = || launcher.stderr().matches("bad LSAPI request").count();
    for (i, (name, bytes, message)) in cases.into_iter().enumerate() {
        let mut s = launcher.connect();
        // The launcher may close before reading everything: a failed write is fine.
        let _ = s
            .write_all(&bytes)
            .and_then(|()| s.shutdown(Shutdown::Write));
        assert_closed_without_answer(&mut s);
        assert!(
            eventually(|| complaints() == i + 1),
            "{name}: {}",
            launcher.stderr()
        );
        let log = launcher.stderr();
        let last = log.lines().rfind(|l| l.contains("bad LSAPI request"));
        assert!(
            last.is_some_and(|l| l.contains(message)),
            "{name}: wanted {message:?} in {last:?}"
        );
    }
    // A bad packet after a good request on the same connection: the answer to the first
    // arrives, then the connection closes.
    let mut s = launcher.connect();
    s.write_all(&good).unwrap();
    assert_eq!(read_answer(&mut s).body, b"ok /x");
    s.write_all(&with(0, b"XS")).unwrap();
    assert_closed_without_answer(&mut s);
    // A connection that only opens and closes (a readiness probe) is not an error.
    drop(launcher.connect());
    let mut s = launcher.connect();
    s.write_all(&good).unwrap();
    assert_eq!(read_answer(&mut s).body, b"ok /x");
    drop(s);
    // One more bad packet is the marker: its complaint is the last, so the probe and the
    // good requests made none (the launcher serves one connection after the other).
    let mut s = launcher.connect();
    let _ = s
        .write_all(&with(0, b"XS"))
        .and_then(|()| s.shutdown(Shutdown::Write));
    assert_closed_without_answer(&mut s);
    assert!(
        eventually(|| complaints() >= n + 2),
        "{}",
        launcher.stderr()
    );
    let log = launcher.stderr();
    assert_eq!(log.matches("bad LSAPI request").count(), n + 2, "{log}");
    assert!(
        log.lines()
            .rfind(|l| l.contains("bad LSAPI request"))
            .is_some_and(|l| l.contains("magic")),
        "{log}"
    );
}

#[test]
fn sigterm_finishes_the_request_in_progress_then_exits_zero() {
    let mut launcher = Launcher::start();
    let mut s = launcher.connect();
    s.write_all(&begin_request("GET", "/slow", "", b"", ByteOrder::NATIVE))
        .unwrap();
    // The app counts its rounds in `ticks`: once the file is there, the app is running
    // (REQ_RECEIVED waits for the answer's head, so nothing arrives before).
    let ticks = launcher._dir.path().join("ticks");
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
    std::fs::write(launcher._dir.path().join("go"), "").unwrap();
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
    let mut idle = Launcher::start();
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
    let launcher = Launcher::start_with(&["--disable-gems"], PLAIN_APP);
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

#[test]
fn a_body_that_fails_before_its_first_chunk_is_a_500_and_after_it_a_cut_connection() {
    let launcher = Launcher::start();
    let mut s = launcher.connect();
    for path in ["/fail-early", "/bad-header"] {
        s.write_all(&begin_request("GET", path, "", b"", ByteOrder::NATIVE))
            .unwrap();
        let a = read_answer(&mut s);
        assert_eq!(
            (a.status, a.body.as_slice()),
            (500, &b"Internal Server Error\n"[..]),
            "{path}"
        );
    }
    assert!(launcher.wait_stderr("no chunk at all"));
    assert!(launcher.wait_stderr("not an HTTP token"));
    // Still the same connection; now a failure after the head cuts it.
    s.write_all(&begin_request(
        "GET",
        "/fail-late",
        "",
        b"",
        ByteOrder::NATIVE,
    ))
    .unwrap();
    let mut rest = Vec::new();
    s.read_to_end(&mut rest).unwrap();
    let mut decoder = ResponseDecoder::new(&Limits::DEFAULT);
    let mut buf = BytesMut::from(&rest[..]);
    let mut events = Vec::new();
    while let Some(e) = decoder.decode(&mut buf).unwrap() {
        events.push(e);
    }
    assert!(buf.is_empty(), "a partial packet: {buf:?}");
    assert!(matches!(events.first(), Some(ResponseEvent::ReqReceived)));
    assert!(matches!(events.get(1), Some(ResponseEvent::Header(h)) if h.status == 200));
    assert_eq!(events.get(2), Some(&ResponseEvent::Stream("part;".into())));
    assert_eq!(
        events.len(),
        3,
        "no RESP_END after a failed body: {events:?}"
    );
    assert!(launcher.wait_stderr("half way"));
}

#[test]
fn resp_end_leaves_with_the_last_bytes_of_the_announced_content_length() {
    // corral stops reading an answer once it has the bytes Content-Length announced and
    // drops an exchange whose RESP_END has not come with them: an end written only when
    // the body ends would find the connection closed and cost corral the connection.
    let launcher = Launcher::start();
    let mut s = launcher.connect();
    s.write_all(&begin_request(
        "GET",
        "/length-then-wait",
        "",
        b"",
        ByteOrder::NATIVE,
    ))
    .unwrap();
    let asked = tokio::time::Instant::now();
    let answer = read_answer(&mut s);
    assert_eq!((answer.status, answer.text().as_str()), (200, "whole"));
    assert!(
        asked.elapsed() < Duration::from_secs(3),
        "RESP_END came only when the body ended, after {:?}",
        asked.elapsed()
    );
    // Once the body ends, the connection carries the next request.
    std::fs::write(launcher._dir.path().join("go"), "").unwrap();
    s.write_all(&begin_request("GET", "/", "", b"", ByteOrder::NATIVE))
        .unwrap();
    assert_eq!(read_answer(&mut s).text(), "ok /");
    drop(s);

    // More bytes after the announced ones cannot follow RESP_END: the answer ends at the
    // Content-Length, then the connection closes, and the log says why.
    let mut s = launcher.connect();
    s.write_all(&begin_request(
        "GET",
        "/over-length",
        "",
        b"",
        ByteOrder::NATIVE,
    ))
    .unwrap();
    assert_eq!(read_answer(&mut s).text(), "whole");
    let mut rest = Vec::new();
    s.read_to_end(&mut rest).unwrap();
    assert!(rest.is_empty(), "{rest:?}");
    assert!(launcher.wait_stderr("GET /over-length: the body gave more than its Content-Length"));
    // The launcher serves on.
    let mut s = launcher.connect();
    s.write_all(&begin_request("GET", "/", "", b"", ByteOrder::NATIVE))
        .unwrap();
    assert_eq!(read_answer(&mut s).text(), "ok /");
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
    let launcher = Launcher::start();
    let pid = launcher.child.id();
    assert!(
        launcher.stderr().contains(&format!("no YJIT, pid {pid})")),
        "{}",
        launcher.stderr()
    );
    assert_eq!(jit_state(&launcher), format!("{pid} false "));
    // Asked: the launcher starts itself again with YJIT, keeping its pid (corral's handle
    // on it) and its socket, and the app's ENV keeps neither variable that did it.
    let on = Launcher::start_env(&[], DIRECT_APP, &[("CORRAL_RACK_YJIT", "on")]);
    let pid = on.child.id();
    assert!(
        on.stderr().contains(&format!(", YJIT, pid {pid})")),
        "{}",
        on.stderr()
    );
    assert_eq!(jit_state(&on), format!("{pid} true "));
    // Said off, as before: no restart, no YJIT.
    let off = Launcher::start_env(&[], DIRECT_APP, &[("CORRAL_RACK_YJIT", "off")]);
    let pid = off.child.id();
    assert!(off.stderr().contains(&format!("no YJIT, pid {pid})")));
    assert_eq!(jit_state(&off), format!("{pid} false "));
    // A value that is neither is named in the log, and the default holds.
    let odd = Launcher::start_env(&[], DIRECT_APP, &[("CORRAL_RACK_YJIT", "yes")]);
    let pid = odd.child.id();
    assert!(odd.wait_stderr("CORRAL_RACK_YJIT=\"yes\" is neither on nor off"));
    assert!(odd.stderr().contains(&format!("no YJIT, pid {pid})")));
    assert_eq!(jit_state(&odd), format!("{pid} false "));
}
