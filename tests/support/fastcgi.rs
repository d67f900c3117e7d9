//! A FastCGI client for the tests of corral's FastCGI front: one request per connection,
//! its CGI response and status; and the answers read off a connection that carries several.

use std::collections::HashMap;
use std::io::{ErrorKind, Read, Write};
use std::net::TcpStream;
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use corral::protocols::fastcgi::{
    encode_begin_request, encode_params, encode_stdin_end, RecordDecoder, RecordType, Role,
};

/// One FastCGI request on a new connection; the CGI response's status.
pub fn fastcgi_status(socket: &Path, params: &[(&str, String)]) -> (u16, Vec<u8>) {
    let mut stream = UnixStream::connect(socket).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(20)))
        .unwrap();
    let params: Vec<(Bytes, Bytes)> = params
        .iter()
        .map(|(n, v)| (Bytes::from(n.to_string()), Bytes::from(v.clone())))
        .collect();
    let mut out = BytesMut::new();
    encode_begin_request(1, Role::Responder, false, &mut out);
    encode_params(1, &params, &mut out).unwrap();
    encode_stdin_end(1, &mut out);
    stream.write_all(&out).unwrap();
    let mut decoder = RecordDecoder::new();
    let mut buf = BytesMut::new();
    let mut stdout = Vec::new();
    loop {
        while let Some(r) = decoder.decode(&mut buf).unwrap() {
            match r.kind {
                RecordType::Stdout => stdout.extend_from_slice(&r.content),
                RecordType::EndRequest => return (cgi_status(&stdout), stdout),
                _ => {}
            }
        }
        let mut chunk = [0u8; 16384];
        let n = stream.read(&mut chunk).expect("corral answers in time");
        assert!(n > 0, "closed before END_REQUEST");
        buf.extend_from_slice(&chunk[..n]);
    }
}

/// The status of a CGI response (`Status:` line, 200 without one).
pub fn cgi_status(response: &[u8]) -> u16 {
    String::from_utf8_lossy(response)
        .lines()
        .take_while(|l| !l.trim().is_empty())
        .find_map(|l| l.strip_prefix("Status: "))
        .and_then(|s| s.split(' ').next()?.parse().ok())
        .unwrap_or(200)
}

/// What corral sent on a FastCGI front connection, read a little at a time: each request's
/// FCGI_STDOUT, the ids whose FCGI_END_REQUEST came (in order), and whether it closed.
#[derive(Debug, Default)]
pub struct Answers {
    decoder: RecordDecoder,
    buf: BytesMut,
    /// FCGI_STDOUT per request id.
    pub stdout: HashMap<u16, Vec<u8>>,
    /// The ids answered with FCGI_END_REQUEST.
    pub ended: Vec<u16>,
    /// corral closed (or reset) the connection.
    pub closed: bool,
}

impl Answers {
    /// Reads what `s` sends for at most `wait`, returning early once the connection closed or
    /// request `id` has its FCGI_END_REQUEST; whether it has.
    pub fn read_until_end(&mut self, s: &mut TcpStream, id: u16, wait: Duration) -> bool {
        let deadline = tokio::time::Instant::now() + wait;
        s.set_read_timeout(Some(Duration::from_millis(50))).unwrap();
        let mut chunk = [0u8; 16384];
        loop {
            while let Some(r) = self.decoder.decode(&mut self.buf).unwrap() {
                match r.kind {
                    RecordType::Stdout => self
                        .stdout
                        .entry(r.request_id)
                        .or_default()
                        .extend_from_slice(&r.content),
                    RecordType::EndRequest => self.ended.push(r.request_id),
                    _ => {}
                }
            }
            if self.ended.contains(&id) {
                return true;
            }
            if self.closed || tokio::time::Instant::now() >= deadline {
                return false;
            }
            match s.read(&mut chunk) {
                Ok(0) => self.closed = true,
                Ok(n) => self.buf.extend_from_slice(&chunk[..n]),
                Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
                Err(_) => self.closed = true,
            }
        }
    }

    /// Request `id`'s FCGI_STDOUT as text.
    pub fn text(&self, id: u16) -> String {
        String::from_utf8_lossy(self.stdout.get(&id).map_or(&[][..], |v| v)).into_owned()
    }
}

/// What nginx's `fastcgi_pass` with Debian's fastcgi_params sends for `uri`, with
/// SCRIPT_FILENAME = root + `script`.
pub fn nginx_params(root: &Path, uri: &str, script: &str) -> Vec<(&'static str, String)> {
    vec![
        ("QUERY_STRING", String::new()),
        ("REQUEST_METHOD", "GET".into()),
        ("CONTENT_TYPE", String::new()),
        ("CONTENT_LENGTH", String::new()),
        ("SCRIPT_NAME", script.into()),
        ("REQUEST_URI", uri.into()),
        ("DOCUMENT_URI", script.into()),
        ("DOCUMENT_ROOT", root.display().to_string()),
        ("SERVER_PROTOCOL", "HTTP/1.1".into()),
        ("GATEWAY_INTERFACE", "CGI/1.1".into()),
        ("REMOTE_ADDR", "127.0.0.1".into()),
        ("SERVER_NAME", "localhost".into()),
        ("REDIRECT_STATUS", "200".into()),
        ("SCRIPT_FILENAME", format!("{}{script}", root.display())),
        ("HTTP_HOST", "localhost".into()),
    ]
}
