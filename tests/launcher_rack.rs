//! The embedded Rack launcher behind the real corral binary: a pool with
//! `app = "rack:config.ru"` (LSAPI by default) serves a test app wrapped in `Rack::Lint`, from
//! Debian's rack gem, on persistent LSAPI connections. The launcher on its own, driven with
//! corral's LSAPI codec, is tested in tests/launcher_rack_lsapi.rs (its requests and answers)
//! and tests/launcher_rack_process.rs (how it starts and stops).

mod support;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::time::Duration;

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
