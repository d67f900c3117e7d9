//! `corral null-backend` end to end: each null backend answers a real peer (nginx
//! `fastcgi_pass` and `scgi_pass`, curl for HTTP on a Unix socket, TCP and an inherited fd 0,
//! corral's own LSAPI and SCGI client), and the FastCGI one honours FCGI_KEEP_CONN. What
//! `corral bench` makes of them is in `tests/bench_cli.rs`. Every process is started in a
//! temp dir and killed by its guard.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing,
    missing_docs
)]

mod support;

use std::os::fd::OwnedFd;
use std::process::{Command, Stdio};
use std::time::Duration;

use support::front::{curl, spawn_on_free_port, Corral, Nginx};
use support::null_backend::{null_backend, target};
use support::peers::shared_dir;
use support::{Guard, CORRAL};

#[test]
fn nginx_fastcgi_and_scgi_pass_reach_the_null_backends() {
    let dir = shared_dir();
    let fcgi = null_backend(dir.path(), "fastcgi", &[]);
    let scgi = null_backend(dir.path(), "scgi", &["--body-size", "40"]);
    let upstream = format!(
        "  upstream null_kept {{\n    server {};\n    keepalive 2;\n  }}",
        target(&fcgi)
    );
    let fastcgi_location = |pass: &str, extra: &str| {
        format!(
            "    location / {{\n      include /etc/nginx/fastcgi_params;\n      \
             fastcgi_pass {pass};\n{extra}    }}"
        )
    };
    let nginx = Nginx::start(
        dir.path(),
        &upstream,
        &[
            fastcgi_location(&target(&fcgi), ""),
            fastcgi_location("null_kept", "      fastcgi_keep_conn on;\n"),
            format!(
                "    location / {{\n      include /etc/nginx/scgi_params;\n      \
                 scgi_pass {};\n    }}",
                target(&scgi)
            ),
        ],
    );
    for server in 0..2 {
        // Several requests: on the kept upstream they share one FastCGI connection.
        for _ in 0..3 {
            let r = curl(&format!("{}/hello.php", nginx.url(server)), &[]);
            assert_eq!(r.status, 200, "{}", nginx.error_log());
            assert_eq!(r.text(), "Hello, world\n");
            assert_eq!(r.header("content-type"), Some("text/plain"));
        }
    }
    let r = curl(&format!("{}/anything", nginx.url(2)), &[]);
    assert_eq!(r.status, 200, "{}", nginx.error_log());
    assert_eq!(r.text(), "Hello, world\nHello, world\nHello, world\nH");
}

#[test]
fn curl_reaches_the_http_null_backend_on_unix_tcp_and_fd0() {
    let dir = shared_dir();
    let http = null_backend(dir.path(), "http", &[]);
    let r = curl(
        "http://localhost/x",
        &["--unix-socket", http.socket.to_str().unwrap()],
    );
    assert_eq!((r.status, r.text().as_str()), (200, "Hello, world\n"));

    let (child, port) = spawn_on_free_port(|port| {
        let mut cmd = Command::new(CORRAL);
        cmd.args(["null-backend", "--protocol", "http", "--body-size", "0"])
            .arg("--listen")
            .arg(format!("127.0.0.1:{port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        cmd
    });
    let tcp = Guard(child);
    let url = format!("http://127.0.0.1:{port}/");
    let r = curl(&url, &[]);
    assert_eq!((r.status, r.body.len()), (200, 0));
    drop(tcp);

    // A listening socket handed over on fd 0, as a pool starts its workers.
    let path = dir.path().join("inherited.sock");
    let listener = std::os::unix::net::UnixListener::bind(&path).unwrap();
    let mut cmd = Command::new(CORRAL);
    cmd.args(["null-backend", "--protocol", "http", "--listen", "fd0"])
        .stdin(Stdio::from(OwnedFd::from(listener)))
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    let _inherited = Guard(cmd.spawn().unwrap());
    let r = curl(
        "http://localhost/",
        &["--unix-socket", path.to_str().unwrap()],
    );
    assert_eq!((r.status, r.text().as_str()), (200, "Hello, world\n"));
}

/// No LSAPI front server is installed, so corral's own LSAPI client (itself tested against
/// lsphp) is the peer: corral's http listener with an LSAPI pool and an SCGI pool, each
/// naming a null backend, and curl in front.
#[test]
fn corral_reaches_the_lsapi_and_scgi_null_backends() {
    let dir = shared_dir();
    let lsapi = null_backend(dir.path(), "lsapi", &["--body-size", "20"]);
    let scgi = null_backend(dir.path(), "scgi", &[]);
    let socket = dir.path().join("corral-http.sock");
    let config = format!(
        r#"
[server]
# Not {dir} itself: the shared dir is world-writable, which corral refuses.
runtime_dir = "{dir}/run"

[[listen]]
address = "unix:{socket}"
protocol = "http"

[pools.ls]
servers = ["{ls}"]
protocol = "lsapi"

[pools.sc]
servers = ["{sc}"]
protocol = "scgi"

[[contexts]]
prefix = "/scgi"
pool = "sc"

[[contexts]]
prefix = "/"
pool = "ls"
"#,
        dir = dir.path().display(),
        socket = socket.display(),
        ls = target(&lsapi),
        sc = target(&scgi),
    );
    let corral = Corral::start(dir.path(), &config, &socket);
    let via = ["--unix-socket", socket.to_str().unwrap()];
    for _ in 0..3 {
        let r = curl("http://localhost/index.php", &via);
        assert_eq!(r.status, 200, "{}", corral.log());
        assert_eq!(r.text(), "Hello, world\nHello, ");
        let r = curl("http://localhost/scgi/x", &via);
        assert_eq!(r.status, 200, "{}", corral.log());
        assert_eq!(r.text(), "Hello, world\n");
    }
}

/// Reads FastCGI records from `stream` until FCGI_END_REQUEST; returns the STDOUT bytes.
fn read_fastcgi_answer(
    stream: &mut std::os::unix::net::UnixStream,
    buf: &mut bytes::BytesMut,
) -> Vec<u8> {
    use corral::protocols::fastcgi::{RecordDecoder, RecordType};
    use std::io::Read;
    let mut decoder = RecordDecoder::new();
    let mut stdout = Vec::new();
    loop {
        while let Some(record) = decoder.decode(buf).unwrap() {
            match record.kind {
                RecordType::Stdout => stdout.extend_from_slice(&record.content),
                RecordType::EndRequest => return stdout,
                other => panic!("unexpected {other}"),
            }
        }
        let mut chunk = [0u8; 4096];
        let n = stream.read(&mut chunk).unwrap();
        assert!(n > 0, "connection closed before FCGI_END_REQUEST");
        buf.extend_from_slice(&chunk[..n]);
    }
}

#[test]
fn the_fastcgi_null_backend_honours_fcgi_keep_conn() {
    use corral::protocols::fastcgi::{encode_begin_request, encode_params, encode_stdin_end, Role};
    use std::io::{Read, Write};
    let dir = shared_dir();
    let null = null_backend(dir.path(), "fastcgi", &[]);
    let mut stream = std::os::unix::net::UnixStream::connect(&null.socket).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let request = |id: u16, keep: bool| {
        let mut wire = bytes::BytesMut::new();
        encode_begin_request(id, Role::Responder, keep, &mut wire);
        encode_params(id, &[("SCRIPT_NAME", "/x")], &mut wire).unwrap();
        encode_stdin_end(id, &mut wire);
        wire
    };
    let mut buf = bytes::BytesMut::new();
    // Kept: two requests (ids 1 and 7) on one connection.
    for id in [1, 7] {
        stream.write_all(&request(id, true)).unwrap();
        let stdout = read_fastcgi_answer(&mut stream, &mut buf);
        assert!(stdout.ends_with(b"\r\n\r\nHello, world\n"), "{stdout:?}");
        assert!(stdout.starts_with(b"Status: 200 OK\r\n"), "{stdout:?}");
    }
    // Not kept: answered, then the backend closes.
    stream.write_all(&request(2, false)).unwrap();
    read_fastcgi_answer(&mut stream, &mut buf);
    assert!(buf.is_empty());
    let mut rest = Vec::new();
    stream.read_to_end(&mut rest).unwrap();
    assert!(rest.is_empty(), "{rest:?}");
}
