//! The Rack launcher on its own, shared by `tests/launcher_rack_lsapi.rs` and
//! `tests/launcher_rack_process.rs`: the plain app (no Lint) those tests run, the launcher
//! started on it or on an app of the test's, and corral's LSAPI codec as the client (a
//! BEGIN_REQUEST, an answer read to its RESP_END).

use std::os::unix::net::UnixStream;
use std::process::Command;

use bytes::BytesMut;
use corral::protocols::lsapi::{ByteOrder, FlagRule, RequestBuilder};
use corral::protocols::Limits;

use super::launcher::Launcher;
use super::lsapi::{read_answer_from, Answer};
use super::peers::write_file;

/// A plain app (no Lint) for the direct tests.
pub const DIRECT_APP: &str = r##"
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

impl Launcher {
    /// `ruby corral-rack.rb config.ru` running [`DIRECT_APP`] in a directory of its own,
    /// with a Unix listener on fd 0; killed on drop.
    pub fn rack() -> Launcher {
        Launcher::rack_with(&[], DIRECT_APP)
    }

    /// Runs `ruby RUBY_ARGS corral-rack.rb config.ru` with `app` as config.ru.
    pub fn rack_with(ruby_args: &[&str], app: &str) -> Launcher {
        Launcher::rack_env(ruby_args, app, &[])
    }

    /// `rack_with`, with `env` added to the launcher's environment.
    pub fn rack_env(ruby_args: &[&str], app: &str, env: &[(&str, &str)]) -> Launcher {
        let dir = tempfile::tempdir().unwrap();
        write_file(dir.path(), "config.ru", app);
        let script = write_file(dir.path(), "corral-rack.rb", corral::launchers::RACK);
        let mut cmd = Command::new("ruby");
        cmd.args(ruby_args)
            .arg(&script)
            .arg("config.ru")
            .envs(env.iter().copied());
        let path = dir.path().to_owned();
        Launcher::spawn(
            cmd,
            &path,
            "rack.sock",
            "corral-rack: serving config.ru",
            Some(dir),
        )
    }
}

/// A BEGIN_REQUEST for `method path?query` with `body`, integers in `order`.
pub fn begin_request(
    method: &str,
    path: &str,
    query: &str,
    body: &[u8],
    order: ByteOrder,
) -> Vec<u8> {
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
pub fn read_answer(s: &mut UnixStream) -> Answer {
    let mut buf = BytesMut::new();
    let mut answer = Answer::default();
    assert!(
        read_answer_from(s, &mut buf, &mut answer),
        "connection closed before RESP_END: {answer:?}"
    );
    answer
}
