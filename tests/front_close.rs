//! How the CGI fronts close a connection they answered before its request was wholly read
//! (a refused request whose body is still coming): the answer, then the end of corral's side
//! of the stream (a FIN), while corral goes on reading and dropping what the front server
//! still sends (the lingering close), so that neither a reset nor the end of the linger
//! stands between the front server and the answer. A connection whose request was read to
//! its end is closed at once, with no shutdown before the close (the close sends the same
//! FIN), which the benches count as one system call fewer per request.
//!
//! Unix sockets, so that a write after corral closed its end fails at once (EPIPE) instead
//! of depending on when a TCP reset comes back. The backend is `corral null-backend`.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing,
    missing_docs
)]

mod support;

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use corral::protocols::fastcgi::{
    encode_begin_request, encode_params, encode_stdin, encode_stdin_end, RecordDecoder, RecordType,
    Role,
};
use support::front::Corral;
use support::peers::{shared_dir, Peer};
use support::sync2::null_backend;

/// corral with one front listener of `protocol` on `dir/front.sock`, the null backend as its
/// only pool.
fn corral(dir: &Path, null: &Peer, protocol: &str) -> Corral {
    let socket = dir.join("front.sock");
    let config = format!(
        "[server]\nruntime_dir = \"{dir}/run\"\ngrace = \"1s\"\n\n\
         [[listen]]\naddress = \"unix:{socket}\"\nprotocol = \"{protocol}\"\n\n\
         [pools.null]\nservers = [\"unix:{null}\"]\n\n[[contexts]]\npool = \"null\"\n",
        dir = dir.display(),
        socket = socket.display(),
        null = null.socket.display(),
    );
    Corral::start(dir, &config, &socket)
}

fn connect(corral: &Corral) -> UnixStream {
    let s = UnixStream::connect(&corral.socket).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    s
}

/// Reads until corral's side of the stream ends.
fn read_to_end(s: &mut UnixStream) -> Vec<u8> {
    let mut all = Vec::new();
    s.read_to_end(&mut all)
        .expect("corral ends its side of the stream in time");
    all
}

/// The FCGI_STDOUT text of a FastCGI answer, and whether FCGI_END_REQUEST ended it.
fn fastcgi_answer(raw: &[u8]) -> (String, bool) {
    let mut buf = BytesMut::from(raw);
    let mut records = RecordDecoder::new();
    let mut text = String::new();
    let mut ended = false;
    while let Some(r) = records.decode(&mut buf).unwrap() {
        match r.kind {
            RecordType::Stdout => text.push_str(&String::from_utf8_lossy(&r.content)),
            RecordType::EndRequest => ended = true,
            _ => {}
        }
    }
    (text, ended)
}

#[test]
fn a_fastcgi_request_answered_early_gets_its_fin_while_corral_still_reads() {
    let dir = shared_dir();
    let null = null_backend(dir.path());
    let corral = corral(dir.path(), &null, "fastcgi");

    // A POST whose CONTENT_LENGTH is no length: refused with 400 before its body is read.
    let mut s = connect(&corral);
    let mut request = BytesMut::new();
    encode_begin_request(1, Role::Responder, false, &mut request);
    let params: Vec<(Bytes, Bytes)> = [
        ("REQUEST_METHOD", "POST"),
        ("REQUEST_URI", "/upload"),
        ("SERVER_NAME", "localhost"),
        ("CONTENT_LENGTH", "-1"),
    ]
    .iter()
    .map(|(n, v)| {
        (
            Bytes::from_static(n.as_bytes()),
            Bytes::from_static(v.as_bytes()),
        )
    })
    .collect();
    encode_params(1, &params, &mut request).unwrap();
    encode_stdin(1, b"the first part of a body", &mut request);
    s.write_all(&request).unwrap();
    // The answer and the end of the stream come while corral lingers (2 s): the read ends
    // with the FIN of the shutdown, not with the close at the linger's end.
    let (text, ended) = fastcgi_answer(&read_to_end(&mut s));
    assert!(text.starts_with("Status: 400 Bad Request\r\n"), "{text:?}");
    assert!(ended, "no FCGI_END_REQUEST:\n{}", corral.log());
    // corral still reads: the rest of the body is taken and dropped, not refused.
    let mut rest = BytesMut::new();
    encode_stdin(1, &[b'x'; 4096], &mut rest);
    encode_stdin_end(1, &mut rest);
    s.write_all(&rest)
        .expect("corral reads on after its FIN, until the linger ends");

    // A whole request is answered and the connection closed at once (no linger, no
    // shutdown): the answer is complete and the stream ends.
    let mut s = connect(&corral);
    let mut request = BytesMut::new();
    encode_begin_request(2, Role::Responder, false, &mut request);
    let get: Vec<(Bytes, Bytes)> = [
        ("REQUEST_METHOD", "GET"),
        ("REQUEST_URI", "/hello"),
        ("SERVER_NAME", "localhost"),
    ]
    .iter()
    .map(|(n, v)| {
        (
            Bytes::from_static(n.as_bytes()),
            Bytes::from_static(v.as_bytes()),
        )
    })
    .collect();
    encode_params(2, &get, &mut request).unwrap();
    encode_stdin_end(2, &mut request);
    s.write_all(&request).unwrap();
    let (text, ended) = fastcgi_answer(&read_to_end(&mut s));
    assert!(text.contains("Hello, world"), "{text:?}\n{}", corral.log());
    assert!(ended, "no FCGI_END_REQUEST:\n{}", corral.log());
}

/// An SCGI request head as a netstring: CONTENT_LENGTH first, then `pairs`.
fn scgi_head(content_length: usize, pairs: &[(&str, &str)]) -> Vec<u8> {
    let mut head = format!("CONTENT_LENGTH\0{content_length}\0SCGI\x001\0").into_bytes();
    for (name, value) in pairs {
        head.extend_from_slice(name.as_bytes());
        head.push(0);
        head.extend_from_slice(value.as_bytes());
        head.push(0);
    }
    let mut out = format!("{}:", head.len()).into_bytes();
    out.extend_from_slice(&head);
    out.push(b',');
    out
}

#[test]
fn an_scgi_request_answered_early_gets_its_fin_while_corral_still_reads() {
    let dir = shared_dir();
    let null = null_backend(dir.path());
    let corral = corral(dir.path(), &null, "scgi");

    // A Host that is no host name: refused with 400 before the body is read.
    let mut s = connect(&corral);
    let mut request = scgi_head(
        100_000,
        &[
            ("REQUEST_METHOD", "POST"),
            ("REQUEST_URI", "/upload"),
            ("HTTP_HOST", "no host/name"),
        ],
    );
    request.extend_from_slice(b"the first part of a body");
    s.write_all(&request).unwrap();
    let answer = String::from_utf8_lossy(&read_to_end(&mut s)).into_owned();
    assert!(
        answer.starts_with("Status: 400 Bad Request\r\n"),
        "{answer:?}\n{}",
        corral.log()
    );
    s.write_all(&[b'x'; 4096])
        .expect("corral reads on after its FIN, until the linger ends");

    // A whole request: answered, and the stream ends.
    let mut s = connect(&corral);
    s.write_all(&scgi_head(
        0,
        &[
            ("REQUEST_METHOD", "GET"),
            ("REQUEST_URI", "/hello"),
            ("SERVER_NAME", "localhost"),
        ],
    ))
    .unwrap();
    let answer = String::from_utf8_lossy(&read_to_end(&mut s)).into_owned();
    assert!(
        answer.contains("Hello, world"),
        "{answer:?}\n{}",
        corral.log()
    );
}
