//! The `fastcgi` front listener: corral as the FastCGI responder that nginx `fastcgi_pass`,
//! Apache mod_proxy_fcgi, lighttpd or Caddy connect to, where they would connect to php-fpm.
//!
//! One reader loop per connection (`fastcgi/reader.rs`) turns records into request events
//! (`fastcgi/requests.rs`); each request is routed once its FCGI_PARAMS stream ends and
//! dispatched. Requests answer with FCGI_STDOUT records through the connection's one writer,
//! which runs beside the reader in the connection's task. One request at a time is served in that task too (a front server that does not
//! multiplex, as nginx, Apache and Caddy do not, never needs another task); a request
//! multiplexed beside it gets a task of its own.
//!
//! The reader never waits for one request while others share the connection: a request that
//! waits in its pool's queue, or whose backend reads slowly, must not hold up another
//! request's records or an FCGI_ABORT_REQUEST. FCGI_STDIN bytes are therefore handed over
//! without waiting, against a byte budget per request and per connection. FastCGI has no flow
//! control per request, so when a request runs past its budget: alone on its connection (how
//! nginx, Apache and Caddy use FastCGI), the reader waits for its backend to read, and a slow
//! backend slows the front server down; multiplexed with others, the request is refused with
//! a 503 and FCGI_END_REQUEST status FCGI_OVERLOADED, so the others go on. What one
//! connection can make corral hold is bounded by `Limits` (ids in flight, parameters per id)
//! and by the two budgets below. Multiplexed request ids,
//! FCGI_ABORT_REQUEST (the task is dropped, which aborts the backend request and frees its
//! slot), FCGI_KEEP_CONN, FCGI_GET_VALUES and unknown record types are handled here.
//!
//! Timeouts: a request's FCGI_PARAMS must be complete within `header_timeout` of its
//! FCGI_BEGIN_REQUEST (a new connection's first request within `header_timeout` of accept),
//! an FCGI_KEEP_CONN connection with no request waits at most `idle_timeout` for the next,
//! and while FCGI_STDIN is open the front server must send something within `body_timeout`.
//! A connection past any of them is closed, aborting its requests' backend exchanges.
//! `body_deadline` is per request (`stdin`): once its exchange has waited that long in all for
//! its FCGI_STDIN, the request alone is answered 408 and its backend exchange aborted.
//!
//! The part shared with the SCGI front (routing a front server's parameters, the CGI answer
//! for a request that got no backend response, the lingering close) is in `crate::front::cgi`.

use std::sync::atomic::AtomicU8;
use std::sync::Arc;
use std::task::{Context, Poll};

use tokio::io::AsyncWriteExt;
use tokio::sync::{mpsc, Semaphore};
use tokio::time::Instant;
use tokio_util::sync::{CancellationToken, ReusableBoxFuture};
use tokio_util::task::AbortOnDropHandle;

use crate::config::{FrontTimeouts, ListenAddress};
use crate::front::limits::{BusyGuard, ConnState, Ticket};
use crate::gateway::Gateway;
use crate::net::Stream;
use crate::protocols::fastcgi::{Capabilities, FrontParamsDecoder, RequestDecoder};

use crate::front::cgi::{give_back, linger, read_buffer, Serving};
use crate::front::halves::halves;

mod answer;
mod gather;
mod kept;
mod outbox;
mod reader;
mod requests;
mod stdin;
mod table;
use answer::{write_loop, Closed, Done, Ending, Out};
pub use kept::{serve_connection, Kept, SpareAnswer};
use outbox::Outbox;
use stdin::StdinSender;
use table::Requests;

/// FCGI_STDIN bytes one connection holds for backends that have not read them yet.
const STDIN_BUDGET: usize = 1024 * 1024;
/// Retry-After of the 503 that refuses a request whose body outran its budget.
const OVERLOADED_RETRY_AFTER: u32 = 1;

/// What [`serve_kept`] serves a connection with, beside its stream.
pub struct Served {
    pub listener: Arc<ListenAddress>,
    pub ticket: Ticket,
    pub timeouts: FrontTimeouts,
    pub gateway: Arc<Gateway>,
    pub shutdown: CancellationToken,
}

/// Serves one FastCGI connection from a front server until it closes, breaks a rule, runs
/// past a timeout, is closed for room under the cap, or `shutdown` fires and its requests in
/// progress have been answered ([`serve_connection`] with fresh state), with the state its futures borrow, and the allocation of the last
/// inline answer's future, kept by the caller from one connection to the next.
pub async fn serve_kept<'c>(
    stream: Stream,
    c: Served,
    kept: &'c Kept,
    spare: &mut SpareAnswer<'c>,
) {
    let Served {
        listener,
        ticket,
        timeouts,
        gateway,
        shutdown,
    } = c;
    let mut stream = stream;
    let _serving = Serving::start(&mut stream);
    let front_fd = stream.raw_fd();
    let (mut reader, writer) = halves(&mut stream);
    kept.renew();
    let (outbox, closed) = (&kept.outbox, &kept.closed);
    let now = Instant::now();
    let mut conn = Connection {
        state: Arc::clone(ticket.state()),
        timeouts,
        idle_since: now,
        head_from: Some(now),
        last_read: now,
        decoder: RequestDecoder::collecting(&gateway.limits),
        caps: capabilities(&gateway),
        gateway,
        listener,
        front_fd,
        requests: Requests::default(),
        next_seq: 1,
        stdin_budget: None,
        outbox,
        mux: None,
        done: None,
        done_rx: None,
        closed,
        input_pending: false,
        closing: false,
        inline: None,
        spare_answer: spare.0.take(),
        inline_answer: &kept.inline_answer,
        inline_done: None,
    };
    let mut buf = read_buffer();
    // The writer runs beside the reader in this connection's task, not in a task of its own:
    // a front server that opens a connection per request would otherwise pay a task per
    // connection, and every frame a wake-up of another task. Both borrow `outbox` and
    // `closed` from here.
    // Both sides are pinned where they are made and joined through their pins: joined by
    // value, each future would be moved into the join's state, a copy of its whole size.
    let (linger_needed, mut writer) = {
        let writer = std::pin::pin!(write_loop(writer, outbox, closed));
        let reading = std::pin::pin!(async {
            let closed_by_us = conn.run(&mut reader, &mut buf, shutdown).await;
            let linger_needed = closed_by_us && conn.input_may_follow(&buf);
            // Whatever is still in progress has lost its client: dropping the tasks aborts their
            // backend requests and gives their slots back. Dropping the connection drops its
            // sender of multiplexed frames; the writer ends once the queue is out and the
            // requests' senders are gone too.
            conn.requests.clear();
            spare.0 = conn.spare_answer.take();
            drop(conn);
            outbox.finish();
            linger_needed
        });
        tokio::join!(reading, writer)
    };
    if linger_needed {
        // The FIN first, so the front server sees the answer end while corral reads on.
        let _ = writer.shutdown().await;
        linger(&mut reader, &mut buf).await;
    }
    // Otherwise dropping the stream closes the socket, which sends the FIN a shutdown
    // would have sent: one system call fewer per connection.
    give_back(buf);
}

/// What this front answers to FCGI_GET_VALUES: it multiplexes, and one connection carries at
/// most `Limits::max_concurrent_requests` requests at once. The gateway does not expose the
/// pools' slot caps yet, so FCGI_MAX_CONNS (unbounded here) is left out, as the specification
/// allows for a value the application does not know.
fn capabilities(gateway: &Gateway) -> Capabilities {
    Capabilities {
        max_conns: None,
        max_reqs: u32::try_from(gateway.limits.max_concurrent_requests).ok(),
        mpxs_conns: Some(true),
    }
}

/// One request id in progress.
#[derive(Debug)]
struct Active {
    seq: u64,
    keep_conn: bool,
    body: Option<StdinSender>,
    /// FCGI_STDIN's empty record arrived.
    stdin_ended: bool,
    /// `ANSWER_*` of a request in a task of its own, shared with it; the inline request's is
    /// [`Connection::inline_answer`].
    answer: Option<Arc<AtomicU8>>,
    /// How the request is dispatched, from the end of FCGI_PARAMS.
    task: Option<Dispatch>,
    /// When FCGI_BEGIN_REQUEST arrived (FCGI_PARAMS must end within `header_timeout`).
    begun: Instant,
    /// Counts the connection busy from the end of FCGI_PARAMS.
    busy: Option<BusyGuard>,
}

/// How a request whose FCGI_PARAMS ended is being served; dropping it aborts the request.
#[derive(Debug)]
enum Dispatch {
    /// In a task of its own (a request multiplexed beside the inline one).
    Spawned(#[allow(dead_code)] AbortOnDropHandle<()>),
    /// In the connection's own task: [`Connection::inline`].
    Inline,
}

/// The request a connection serves in its own task, as nginx, Apache and Caddy use FastCGI
/// (one request at a time): no task to spawn and no channel to report back through. Further
/// requests multiplexed beside it get tasks of their own.
struct Inline<'c> {
    id: u16,
    seq: u64,
    /// The answer's future (two kilobytes and more): its allocation is the connection's
    /// (`Connection::spare_answer`), reused from one inline request to the next.
    answer: ReusableBoxFuture<'c, Ending>,
}

/// Polls the inline request, if any, to its ending; the allocation of an ended request's
/// future goes to `spare` for the next inline request.
fn poll_inline<'c>(
    inline: &mut Option<Inline<'c>>,
    spare: &mut Option<ReusableBoxFuture<'c, Ending>>,
    cx: &mut Context<'_>,
) -> Poll<Done> {
    let Some(i) = inline.as_mut() else {
        return Poll::Pending;
    };
    let ending = std::task::ready!(i.answer.poll(cx));
    let (id, seq) = (i.id, i.seq);
    // An ended async block holds nothing: keeping it until the next request holds no
    // resource of this one.
    *spare = inline.take().map(|i| i.answer);
    Poll::Ready(Done { id, seq, ending })
}

/// The reader side of one connection; `'c` is the connection's task, where the writer's
/// flag lives.
struct Connection<'c> {
    state: Arc<ConnState>,
    timeouts: FrontTimeouts,
    /// When the connection last had no request (accept, or its last request's end).
    idle_since: Instant,
    /// With no request in progress: when the bytes of the next began to arrive (accept, on
    /// a new connection); `None` while nothing has.
    head_from: Option<Instant>,
    /// The last time the reader got bytes or finished handling them (time spent blocked on
    /// a full body channel is the backend's, not the front server's).
    last_read: Instant,
    decoder: RequestDecoder<FrontParamsDecoder>,
    caps: Capabilities,
    gateway: Arc<Gateway>,
    listener: Arc<ListenAddress>,
    /// The connection's descriptor, for the gateway to peek at when a request of it waited
    /// for a slot: a connection whose request is wholly in and not kept is not read again,
    /// so its close would otherwise go unseen until the answer is written (decision 35).
    /// Valid while the stream lives, which outlives every request's future (dropped with
    /// `requests` and `inline` before `serve_kept` returns).
    front_fd: std::os::fd::RawFd,
    requests: Requests,
    next_seq: u64,
    /// `STDIN_BUDGET` bytes, one permit per byte held; made with the first FCGI_STDIN bytes.
    stdin_budget: Option<Arc<Semaphore>>,
    /// The frames for the writer, from the reader and the inline request.
    outbox: &'c Outbox,
    /// The sender of the channel requests in tasks of their own send their frames through,
    /// once there is one.
    mux: Option<mpsc::Sender<Out>>,
    /// Where requests in tasks of their own report their endings, once there is one.
    done: Option<mpsc::Sender<Done>>,
    /// Its receiving end, until the reader's loop takes it.
    done_rx: Option<mpsc::Receiver<Done>>,
    /// The writer has ended.
    closed: &'c Closed,
    /// A request was ended before the front server had sent all of its records (answered
    /// without a backend, answered before its FCGI_STDIN ended, or refused): more bytes may
    /// follow, so closing must linger.
    input_pending: bool,
    /// A frame that closes the connection has been queued: the writer closes it once the
    /// frames before it are out, so nothing is waited for but that (no deadline, no
    /// shutdown or eviction).
    closing: bool,
    /// The request served in this task, if any.
    inline: Option<Inline<'c>>,
    /// The allocation of the last inline request's future, once it ended: the next inline
    /// request's future is written into it (when its layout is the same, as it is), not
    /// into a new one. An aborted request's future is dropped with its allocation.
    spare_answer: Option<ReusableBoxFuture<'c, Ending>>,
    /// The inline request's `ANSWER_*`, in the connection's task: one flag for the
    /// connection instead of a shared allocation per request.
    inline_answer: &'c AtomicU8,
    /// The inline request's ending, when it came while the reader waited on something else
    /// (body budget): handled at the top of the next turn of the loop.
    inline_done: Option<Done>,
}

/// Whether the reader goes on.
enum Flow {
    Continue,
    Stop,
}
