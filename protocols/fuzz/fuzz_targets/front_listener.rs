#![no_main]
//! Fuzzes corral's front listeners whole: the input is what a front server or client sends on
//! one connection, and it is fed to the real connection-serving code of the FastCGI, SCGI or
//! HTTP front (the first input byte picks which) over a socketpair, with a gateway whose one
//! pool is a null FastCGI backend running in this process. Nothing may panic, every
//! connection must end within a deadline once the client has sent everything and shut its
//! side, and what the FastCGI front writes back must be whole, well-formed records.
//!
//! The gateway, the runtime and the null backend are built once and shared by every input,
//! as they are by every connection of a running corral.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use bytes::BytesMut;
use corral::bench::{NullArgs, Protocol};
use corral::config::{FrontTimeouts, ListenAddress};
use corral::front::http::ConnInfo;
use corral::front::limits::{Admission, Client};
use corral::front::listener::Peer;
use corral::front::{fastcgi, http, scgi};
use corral::gateway::Gateway;
use corral::net::{QuietUnix, Stream};
use corral::protocols::cgi::ServerVars;
use corral::protocols::fastcgi::RecordDecoder;
use libfuzzer_sys::fuzz_target;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::UnixStream;
use tokio_util::sync::CancellationToken;

/// How long a connection may take to end after the client shut its side; longer is a hang.
/// Generous, so a loaded CI machine does not report one falsely.
const DEADLINE: Duration = Duration::from_secs(10);
/// With the input sent, the client waits this long without output before it shuts its
/// side, so requests the input completed can reach the backend and be answered.
const QUIET: Duration = Duration::from_millis(2);

struct Harness {
    runtime: tokio::runtime::Runtime,
    gateway: Arc<Gateway>,
    fastcgi: Arc<ListenAddress>,
    scgi: Arc<ListenAddress>,
    http: ListenAddress,
    /// The HTTP listener's SERVER_ADDR and SERVER_PORT, as its accept loop encodes them.
    server_vars: Arc<ServerVars>,
    /// The listeners' timeouts, as configured (the same for the three).
    timeouts: FrontTimeouts,
    /// The connection table every input's connection is admitted to, as a running corral's
    /// front listeners share one.
    admission: Arc<Admission>,
}

fn harness() -> &'static Harness {
    static HARNESS: OnceLock<Harness> = OnceLock::new();
    HARNESS.get_or_init(build)
}

fn build() -> Harness {
    let dir = std::env::temp_dir().join(format!("corral-fuzz-front-{}", std::process::id()));
    let www = dir.join("www");
    std::fs::create_dir_all(&www).expect("create the fuzz directory");
    for script in ["index.php", "form.php", "upload.php", "hello.php"] {
        std::fs::write(www.join(script), "<?php\n").expect("write a script");
    }
    let null = dir.join("null.sock");
    start_null_backend(null.clone());
    let config = format!(
        r#"
[server]
runtime_dir = "{dir}/run"

[[listen]]
address = "unix:{dir}/fcgi.sock"
protocol = "fastcgi"

[[listen]]
address = "unix:{dir}/scgi.sock"
protocol = "scgi"

[[listen]]
address = "127.0.0.1:8080"
protocol = "http"

[pools.null]
protocol = "fastcgi"
servers = ["unix:{null}"]
concurrency = 4
max_conns = 4
queue_size = 4
queue_timeout = "50ms"
connect_timeout = "1s"
request_timeout = "2s"

[[contexts]]
extension = "php"
root = "{www}"
index = ["index.php"]
pool = "null"

[[contexts]]
prefix = "/"
pool = "null"
max_body = "64KiB"
"#,
        dir = dir.display(),
        null = null.display(),
        www = www.display(),
    );
    let config = match corral::config::parse(&config, "fuzz.toml") {
        Ok(c) => c,
        Err(errors) => panic!("the fuzz configuration is invalid: {errors:?}"),
    };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("build the runtime");
    let gateway = {
        let _entered = runtime.enter();
        let settings = corral::gateway::BuildSettings::default();
        let (gateway, drivers) = Gateway::build(&config, &settings).expect("build the gateway");
        assert!(drivers.is_empty(), "an external pool has no driver");
        Arc::new(gateway)
    };
    let listen = |i: usize| config.listeners[i].bind.address();
    Harness {
        fastcgi: Arc::new(listen(0)),
        scgi: Arc::new(listen(1)),
        http: listen(2),
        server_vars: Arc::new(http::server_vars(Some(SocketAddr::from((
            [127, 0, 0, 1],
            8080,
        ))))),
        timeouts: config.listeners[0].timeouts,
        admission: Admission::new("front", 1024),
        runtime,
        gateway,
    }
}

/// Runs `corral null-backend --protocol fastcgi` on a thread of its own and waits until its
/// socket accepts.
fn start_null_backend(socket: PathBuf) {
    let args = NullArgs {
        protocol: Protocol::Fastcgi,
        listen: format!("unix:{}", socket.display()),
        body_size: 13,
        threads: Some(1),
    };
    std::thread::spawn(move || {
        if let Err(e) = corral::bench::run_null(args) {
            eprintln!("the null backend stopped: {e}");
            std::process::abort();
        }
    });
    for _ in 0..1000 {
        if std::os::unix::net::UnixStream::connect(&socket).is_ok() {
            return;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    panic!("the null backend never listened on {}", socket.display());
}

#[derive(Clone, Copy, Debug)]
enum Front {
    Fastcgi,
    Scgi,
    Http,
}

async fn one(h: &'static Harness, front: Front, input: &[u8]) {
    // corral's end registered once, for reads, as its Unix listener accepts a connection.
    let (ours, theirs) = std::os::unix::net::UnixStream::pair().expect("socketpair");
    theirs.set_nonblocking(true).expect("non-blocking");
    let theirs = UnixStream::from_std(theirs).expect("registered");
    let stream = Stream::Unix(QuietUnix::new(ours).expect("registered"));
    let shutdown = CancellationToken::new();
    let gateway = Arc::clone(&h.gateway);
    let client = Client {
        listener: 0,
        addr: None,
        cap: None,
    };
    let ticket = h
        .admission
        .admit(client)
        .expect("one connection at a time never fills the table");
    let server = match front {
        Front::Fastcgi => tokio::spawn(fastcgi::serve_connection(
            stream,
            Arc::clone(&h.fastcgi),
            ticket,
            h.timeouts,
            gateway,
            shutdown.clone(),
        )),
        Front::Scgi => tokio::spawn(scgi::serve_connection(
            stream,
            Arc::clone(&h.scgi),
            ticket,
            h.timeouts,
            gateway,
            shutdown.clone(),
        )),
        Front::Http => {
            let info = ConnInfo {
                listener: h.http.clone(),
                peer: Peer::Tcp(SocketAddr::from(([127, 0, 0, 1], 40000))),
                forwarded: None,
                timeouts: h.timeouts,
                server_vars: Arc::clone(&h.server_vars),
            };
            tokio::spawn(http::serve_connection(
                stream,
                info,
                ticket,
                gateway,
                shutdown.clone(),
            ))
        }
    };
    let (mut rx, mut tx) = theirs.into_split();
    let mut output = Vec::new();
    let conversation = async {
        let mut chunk = vec![0u8; 64 * 1024];
        let mut eof = false;
        {
            // The client writes while it reads, so a front that answers before reading
            // everything cannot deadlock against it on full socket buffers.
            let write = tx.write_all(input);
            tokio::pin!(write);
            while !eof {
                tokio::select! {
                    _ = &mut write => break,
                    read = rx.read(&mut chunk) => match read {
                        Ok(0) | Err(_) => eof = true,
                        Ok(n) => output.extend_from_slice(&chunk[..n]),
                    },
                }
            }
        }
        // Everything is sent: let the requests it completed be answered, until the front
        // has been quiet for a moment.
        while !eof {
            match tokio::time::timeout(QUIET, rx.read(&mut chunk)).await {
                Err(_) => break,
                Ok(Ok(0) | Err(_)) => eof = true,
                Ok(Ok(n)) => output.extend_from_slice(&chunk[..n]),
            }
        }
        // Then the client shuts its side (a front that closed first lingers until it does)
        // and reads what is left.
        let _ = tx.shutdown().await;
        while !eof {
            match rx.read(&mut chunk).await {
                Ok(0) | Err(_) => eof = true,
                Ok(n) => output.extend_from_slice(&chunk[..n]),
            }
        }
    };
    let talked = tokio::time::timeout(DEADLINE, conversation).await;
    assert!(
        talked.is_ok(),
        "the {front:?} front kept the connection open {DEADLINE:?} after the client shut its side"
    );
    match tokio::time::timeout(DEADLINE, server).await {
        Ok(Ok(())) => {}
        Ok(Err(e)) => panic!("the {front:?} front's connection task failed: {e}"),
        Err(_) => panic!("the {front:?} front's connection task outlived its connection"),
    }
    if let Front::Fastcgi = front {
        // Every frame the writer sends is whole records, and nothing cut the socket.
        let mut buf = BytesMut::from(&output[..]);
        let mut records = RecordDecoder::new();
        loop {
            match records.decode(&mut buf) {
                Ok(Some(_)) => {}
                Ok(None) => break,
                Err(e) => panic!("the fastcgi front wrote a broken record: {e}"),
            }
        }
        assert!(
            buf.is_empty(),
            "the fastcgi front's output ends inside a record"
        );
    }
}

fuzz_target!(|data: &[u8]| {
    let Some((&selector, input)) = data.split_first() else {
        return;
    };
    let front = match selector % 3 {
        0 => Front::Fastcgi,
        1 => Front::Scgi,
        _ => Front::Http,
    };
    let h = harness();
    h.runtime.block_on(one(h, front, input));
});
