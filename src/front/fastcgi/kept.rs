//! What a crew task keeps from one FastCGI connection to the next (`src/app/accept/crew.rs`).
//!
//! A front server that opens a connection per request (nginx's plain `fastcgi_pass`) would
//! otherwise have each connection allocate the future of its inline request's answer (two
//! kilobytes and more) and free it at its end: a `malloc` and a `free` per request. The
//! allocation is kept across connections by the task that serves them, so the state the
//! future borrows (the writer's queue and flag, the inline request's flag) is the task's too,
//! emptied when a connection starts.

use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::Arc;

use tokio_util::sync::{CancellationToken, ReusableBoxFuture};

use crate::config::{FrontTimeouts, ListenAddress};
use crate::front::limits::Ticket;
use crate::gateway::Gateway;
use crate::net::Stream;

use super::answer::{Closed, Ending};
use super::outbox::Outbox;
use super::{serve_kept, Served};

/// The state a connection's futures borrow, kept by the task that serves connection after
/// connection.
#[derive(Debug, Default)]
pub struct Kept {
    pub(super) outbox: Outbox,
    pub(super) closed: Closed,
    pub(super) inline_answer: AtomicU8,
}

impl Kept {
    /// As new, for the next connection: nothing of the last one's is left in it.
    pub(super) fn renew(&self) {
        self.outbox.renew();
        self.closed.clear();
        self.inline_answer.store(0, Ordering::Release);
    }
}

/// The allocation of the last inline request's future, once that request ended (an ended
/// async block holds nothing); `'c` is the [`Kept`] state such futures borrow.
#[derive(Default)]
pub struct SpareAnswer<'c>(pub(super) Option<ReusableBoxFuture<'c, Ending>>);

impl std::fmt::Debug for SpareAnswer<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.0.is_some() {
            "SpareAnswer(kept)"
        } else {
            "SpareAnswer(none)"
        })
    }
}

/// Serves one FastCGI connection from a front server until it closes, breaks a rule, runs
/// past a timeout, is closed for room under the cap, or `shutdown` fires and its requests in
/// progress have been answered. `ticket` counts it in the cap table; `listener` is shared
/// by the listener's connections (a Unix socket's path, cloned, would be an allocation per
/// connection).
pub async fn serve_connection(
    stream: Stream,
    listener: Arc<ListenAddress>,
    ticket: Ticket,
    timeouts: FrontTimeouts,
    gateway: Arc<Gateway>,
    shutdown: CancellationToken,
) {
    let kept = Kept::default();
    let mut spare = SpareAnswer::default();
    let connection = Served {
        listener,
        ticket,
        timeouts,
        gateway,
        shutdown,
    };
    serve_kept(stream, connection, &kept, &mut spare).await
}

#[cfg(test)]
mod tests {
    use std::io::Write;
    use std::sync::Arc;
    use std::time::Duration;
    use tokio::time::Instant;

    use bytes::BytesMut;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio_util::sync::CancellationToken;

    use super::{Kept, SpareAnswer};
    use crate::config::{FrontTimeouts, ListenAddress};
    use crate::front::fastcgi::{serve_kept, Served};
    use crate::front::limits::{Admission, Client};
    use crate::gateway::{BuildSettings, Gateway};
    use crate::net::fdinfo::{epoll_events, inode};
    use crate::net::{QuietListener, Stream};
    use crate::protocols::fastcgi::{
        encode_begin_request, encode_end_request, encode_params, encode_stdin_end, encode_stdout,
        encode_stdout_end, ProtocolStatus, Role,
    };

    /// One task's state serves connection after connection: each request is answered in
    /// full (the writer's queue and flag of the last connection left nothing behind), and
    /// the inline answer's allocation is kept for the next.
    #[tokio::test(flavor = "current_thread")]
    async fn connections_served_with_kept_state_are_each_answered_in_full() {
        let dir = tempfile::tempdir().unwrap();
        let text = format!(
            "[server]\nruntime_dir = \"{d}/run\"\n[[listen]]\naddress = \"unix:{d}/f.sock\"\n\
             protocol = \"fastcgi\"\n[pools.p]\nservers = [\"unix:{d}/none.sock\"]\n\
             [[contexts]]\npool = \"p\"\n",
            d = dir.path().display()
        );
        let config = crate::config::parse(&text, "t.toml").unwrap();
        let (gateway, _drivers) = Gateway::build(&config, &BuildSettings::default()).unwrap();
        let gateway = Arc::new(gateway);
        let listener = Arc::new(config.listeners[0].bind.address());
        let admission = Admission::new("front", 16);
        let kept = Kept::default();
        let mut spare = SpareAnswer::default();
        for n in 0..3 {
            let (ours, mut theirs) = tokio::net::UnixStream::pair().unwrap();
            theirs.write_all(&request(false)).await.unwrap();
            let client = Client {
                listener: 0,
                addr: None,
                cap: None,
            };
            let served = Served {
                listener: Arc::clone(&listener),
                ticket: admission.admit(client).unwrap(),
                timeouts: config.listeners[0].timeouts,
                gateway: Arc::clone(&gateway),
                shutdown: CancellationToken::new(),
            };
            let answer = async {
                let mut out = Vec::new();
                theirs.read_to_end(&mut out).await.unwrap();
                out
            };
            let ((), out) = tokio::join!(
                serve_kept(
                    Stream::Unix(crate::net::QuietUnix::from_tokio(ours).unwrap()),
                    served,
                    &kept,
                    &mut spare
                ),
                answer
            );
            // No worker can be reached: a 5xx, then the empty FCGI_STDOUT and
            // FCGI_END_REQUEST (its header: version 1, type 3, id 1, length 8).
            let text = String::from_utf8_lossy(&out);
            assert!(text.contains("Status: 5"), "connection {n}: {text:?}");
            assert!(
                out.ends_with(&[1, 3, 0, 1, 0, 8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]),
                "connection {n}: {out:?}"
            );
            assert!(
                spare.0.is_some(),
                "connection {n}: the allocation was not kept"
            );
        }
    }

    /// A gateway whose pool is the FastCGI server at `backend`, and the listener's settings
    /// with a `header_timeout` of 1 s.
    fn gateway(
        dir: &std::path::Path,
        backend: &str,
    ) -> (Arc<Gateway>, Arc<ListenAddress>, FrontTimeouts) {
        let text = format!(
            "[server]\nruntime_dir = \"{d}/run\"\n[[listen]]\naddress = \"unix:{d}/f.sock\"\n\
             protocol = \"fastcgi\"\n[pools.p]\nservers = [\"unix:{backend}\"]\n\
             [[contexts]]\npool = \"p\"\n",
            d = dir.display()
        );
        let config = crate::config::parse(&text, "t.toml").unwrap();
        let (gateway, _drivers) = Gateway::build(&config, &BuildSettings::default()).unwrap();
        let mut timeouts = config.listeners[0].timeouts;
        timeouts.header = Duration::from_secs(1);
        (
            Arc::new(gateway),
            Arc::new(config.listeners[0].bind.address()),
            timeouts,
        )
    }

    /// A GET with FCGI_KEEP_CONN as asked.
    fn request(keep_conn: bool) -> BytesMut {
        let mut out = BytesMut::new();
        encode_begin_request(1, Role::Responder, keep_conn, &mut out);
        let params = [
            ("REQUEST_METHOD", "GET"),
            ("SCRIPT_NAME", "/x"),
            ("REQUEST_URI", "/x"),
            ("DOCUMENT_ROOT", "/"),
            ("SERVER_NAME", "localhost"),
        ];
        encode_params(1, &params, &mut out).unwrap();
        encode_stdin_end(1, &mut out);
        out
    }

    /// FCGI_END_REQUEST of request 1, complete: the end of every answer here.
    const END: [u8; 16] = [1, 3, 0, 1, 0, 8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0];

    /// nginx's plain `fastcgi_pass` writes its whole request as it connects and keeps no
    /// connection: the request is answered, through a backend that takes its time, and the
    /// connection closed without ever being registered with the reactor. A request that
    /// keeps its connection is watched meanwhile (its front server may send more).
    #[tokio::test(flavor = "current_thread")]
    async fn a_request_there_at_accept_is_answered_without_registering_its_connection() {
        for keep_conn in [false, true] {
            let dir = tempfile::tempdir().unwrap();
            let backend_path = dir.path().join("b.sock");
            let backend = std::os::unix::net::UnixListener::bind(&backend_path).unwrap();
            let settings = gateway(dir.path(), &backend_path.display().to_string());
            let front_path = dir.path().join("f.sock");
            let listener = QuietListener::bind(&front_path).unwrap();
            let admission = Admission::new("front", 16);
            let mut client = std::os::unix::net::UnixStream::connect(&front_path).unwrap();
            client.write_all(&request(keep_conn)).unwrap();
            // The backend looks at the front connection's registration while it holds the
            // answer, then answers.
            let ours = listener.accept().await.unwrap();
            let fd = ours.fd();
            let ino = inode(fd);
            let looked = std::thread::spawn(move || {
                let (mut conn, _) = backend.accept().unwrap();
                let mut got = Vec::new();
                let mut chunk = [0u8; 4096];
                // Up to the end of FCGI_STDIN (type 5, id 1, empty).
                while !got.windows(8).any(|w| w == [1, 5, 0, 1, 0, 0, 0, 0]) {
                    let n = std::io::Read::read(&mut conn, &mut chunk).unwrap();
                    assert!(n > 0, "corral closed before its request was whole");
                    got.extend_from_slice(&chunk[..n]);
                }
                // Time for the front's task to go to sleep on whatever it waits for: a kept
                // connection is registered in the same turn that sent the request here (the
                // wait is only for a loaded machine); a plain one must still not be after
                // 100 ms.
                let mut events = epoll_events(fd, ino);
                for tick in 1..=500 {
                    if tick > 10 && !(keep_conn && events.is_empty()) {
                        break;
                    }
                    std::thread::sleep(Duration::from_millis(10));
                    events = epoll_events(fd, ino);
                }
                let mut out = BytesMut::new();
                encode_stdout(
                    1,
                    b"Status: 200 OK\r\nContent-Type: text/plain\r\n\r\nhi",
                    &mut out,
                );
                encode_stdout_end(1, &mut out);
                encode_end_request(1, 0, ProtocolStatus::RequestComplete, &mut out);
                conn.write_all(&out).unwrap();
                events
            });
            // The front server reads the answer; a kept connection it then closes.
            let reading = std::thread::spawn(move || {
                let mut answer = Vec::new();
                let mut chunk = [0u8; 4096];
                while !answer.ends_with(&END) {
                    let n = std::io::Read::read(&mut client, &mut chunk).unwrap();
                    if n == 0 {
                        break;
                    }
                    answer.extend_from_slice(&chunk[..n]);
                }
                if !keep_conn {
                    let mut end = [0u8; 1];
                    assert_eq!(std::io::Read::read(&mut client, &mut end).unwrap(), 0);
                }
                answer
            });
            let (gateway, address, timeouts) = &settings;
            let served = Served {
                listener: Arc::clone(address),
                ticket: admission.admit(UNIX_CLIENT).unwrap(),
                timeouts: *timeouts,
                gateway: Arc::clone(gateway),
                shutdown: CancellationToken::new(),
            };
            let (kept, mut spare) = (Kept::default(), SpareAnswer::default());
            tokio::time::timeout(
                Duration::from_secs(10),
                serve_kept(Stream::Unix(ours), served, &kept, &mut spare),
            )
            .await
            .expect("the connection ended");
            let events = looked.join().unwrap();
            if keep_conn {
                assert_eq!(events.len(), 1, "a kept connection is watched: {events:?}");
            } else {
                assert!(events.is_empty(), "registered: {events:x?}");
            }
            let answer = reading.join().unwrap();
            let text = String::from_utf8_lossy(&answer);
            assert!(text.contains("Status: 200"), "{keep_conn}: {text:?}");
            assert!(answer.ends_with(&END), "{keep_conn}: {text:?}");
        }
    }

    const UNIX_CLIENT: Client = Client {
        listener: 0,
        addr: None,
        cap: None,
    };

    /// What an accepted connection that has not sent its request yet gets: a request that
    /// comes later is answered (the read that found nothing registered the connection, and
    /// the bytes woke it); one that never comes is closed at the header deadline; a front
    /// server that closes at once ends the connection at once.
    #[tokio::test(flavor = "current_thread")]
    async fn a_connection_without_its_request_yet_keeps_its_deadline_and_wakes_for_bytes() {
        let dir = tempfile::tempdir().unwrap();
        let none = dir.path().join("none.sock");
        let (gateway, address, timeouts) = gateway(dir.path(), &none.display().to_string());
        let front_path = dir.path().join("f.sock");
        let listener = QuietListener::bind(&front_path).unwrap();
        let admission = Admission::new("front", 16);
        let serve = |ours| {
            let served = Served {
                listener: Arc::clone(&address),
                ticket: admission.admit(UNIX_CLIENT).unwrap(),
                timeouts,
                gateway: Arc::clone(&gateway),
                shutdown: CancellationToken::new(),
            };
            async move {
                let (kept, mut spare) = (Kept::default(), SpareAnswer::default());
                serve_kept(Stream::Unix(ours), served, &kept, &mut spare).await;
            }
        };
        // Late: 100 ms after the accept, well within the 1 s deadline.
        let mut client = std::os::unix::net::UnixStream::connect(&front_path).unwrap();
        let ours = listener.accept().await.unwrap();
        let late = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(100));
            client.write_all(&request(false)).unwrap();
            let mut answer = Vec::new();
            std::io::Read::read_to_end(&mut client, &mut answer).unwrap();
            answer
        });
        serve(ours).await;
        let answer = late.join().unwrap();
        let text = String::from_utf8_lossy(&answer);
        assert!(text.contains("Status: 5"), "late request: {text:?}");
        assert!(answer.ends_with(&END), "late request: {text:?}");

        // Silent: closed, unanswered, at the header deadline.
        let mut client = std::os::unix::net::UnixStream::connect(&front_path).unwrap();
        let ours = listener.accept().await.unwrap();
        let started = Instant::now();
        tokio::time::timeout(Duration::from_secs(5), serve(ours))
            .await
            .expect("closed at the header deadline");
        let took = started.elapsed();
        assert!(took >= Duration::from_millis(990), "closed after {took:?}");
        let mut answer = Vec::new();
        std::io::Read::read_to_end(&mut client, &mut answer).unwrap();
        assert!(answer.is_empty(), "{answer:?}");

        // Gone at once: the connection ends at once, long before its deadline.
        let client = std::os::unix::net::UnixStream::connect(&front_path).unwrap();
        drop(client);
        let ours = listener.accept().await.unwrap();
        let started = Instant::now();
        serve(ours).await;
        assert!(started.elapsed() < Duration::from_millis(500));
    }
}
