//! A FastCGI client for the tests of corral's FastCGI front: one request per connection,
//! its CGI response and status.

use std::io::{Read, Write};
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
