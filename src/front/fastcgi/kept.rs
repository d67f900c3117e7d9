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
    use std::sync::Arc;

    use bytes::BytesMut;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio_util::sync::CancellationToken;

    use super::{Kept, SpareAnswer};
    use crate::front::fastcgi::{serve_kept, Served};
    use crate::front::limits::{Admission, Client};
    use crate::gateway::{BuildSettings, Gateway};
    use crate::net::Stream;
    use crate::protocols::fastcgi::{encode_begin_request, encode_params, encode_stdin_end, Role};

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
            let mut request = BytesMut::new();
            encode_begin_request(1, Role::Responder, false, &mut request);
            let params = [
                ("REQUEST_METHOD", "GET"),
                ("SCRIPT_NAME", "/x"),
                ("REQUEST_URI", "/x"),
                ("DOCUMENT_ROOT", "/"),
                ("SERVER_NAME", "localhost"),
            ];
            encode_params(1, &params, &mut request).unwrap();
            encode_stdin_end(1, &mut request);
            theirs.write_all(&request).await.unwrap();
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
}
