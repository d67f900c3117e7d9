//! Spent exchanges, a few per serving thread, renewed in place for the next requests.
//!
//! Every backend request lives in one heap allocation (`begin`), and an exchange is larger
//! than the sizes glibc's per-thread cache serves, so a fresh one cost a trip through
//! `malloc`'s bins and `free`'s consolidation on every request, and building it on the stack
//! then moving it to the heap copied its kilobyte twice more (about 900 instructions in all
//! under callgrind). A response body that ends gives its exchange back here, released (its
//! connection, body, buffers and stderr sink dropped, as dropping it would), and a later
//! exchange on the same thread is written into it field by field. A thread keeps at most
//! [`MAX_SPARE`] (as many as it usually has exchanges in flight at once), so what it holds
//! stays a few exchanges' size whatever it served.

use std::cell::RefCell;
use std::sync::Arc;

use bytes::BytesMut;
use tokio::time::Instant;

use super::body::BodyState;
use super::{stderr, BackendConnection, CodecSource, Exchange, ExchangeOptions, RequestBody};

/// Most spent exchanges one thread keeps.
const MAX_SPARE: usize = 16;

thread_local! {
    // Boxes on purpose: each is an allocation handed out whole to an exchange.
    #[allow(clippy::vec_box)]
    static SPARE: RefCell<Vec<Box<Exchange>>> = const { RefCell::new(Vec::new()) };
}

/// One of this thread's spent exchanges, if it has one.
#[inline]
pub(super) fn take() -> Option<Box<Exchange>> {
    SPARE
        .try_with(|spare| spare.try_borrow_mut().ok()?.pop())
        .ok()
        .flatten()
}

/// Releases `exchange` (see [`Exchange::release`]) and keeps it as one of this thread's
/// spares; past the bound, or on a thread whose locals are being torn down, it is freed.
pub(super) fn recycle(mut exchange: Box<Exchange>) {
    exchange.release();
    let _ = SPARE.try_with(|kept| {
        if let Ok(mut kept) = kept.try_borrow_mut() {
            if kept.len() < MAX_SPARE {
                kept.push(exchange);
            }
        }
    });
}

impl Exchange {
    /// Does what dropping the exchange does (an abort when it did not end cleanly, the
    /// connection closed) and drops what it holds, leaving a spent exchange that
    /// [`renew`](Self::renew) makes new again and that drops as a no-op.
    fn release(&mut self) {
        self.abandon();
        self.body = None;
        self.stderr = None;
        self.ahead = None;
        self.kept = None;
        self.held = None;
        self.write_error = None;
        self.inbuf = BytesMut::new();
        self.outbuf = BytesMut::new();
    }

    /// What [`Exchange::new`] makes, written in place over a spent exchange. Every field is
    /// named (no `..`), so that a field added to `Exchange` cannot be left out here.
    #[inline]
    #[allow(clippy::too_many_arguments)] // Exchange::new's, with the place to write to.
    pub(super) fn renew(
        &mut self,
        conn: BackendConnection,
        codec: impl CodecSource,
        head: BytesMut,
        body: RequestBody,
        declared: Option<u64>,
        options: &ExchangeOptions,
        started: Instant,
    ) {
        let mut conn = conn;
        let Exchange {
            conn: conn_slot,
            codec: codec_slot,
            inbuf,
            outbuf,
            body: body_slot,
            declared: declared_slot,
            sent,
            written,
            eof,
            write_error,
            pool,
            request_id,
            timeouts,
            stderr,
            request_deadline,
            first_byte_deadline,
            got_byte,
            reused,
            clean,
            stderr_limit: limit,
            state,
            kept,
            ahead,
            announced,
            handed,
            held,
            discard,
        } = self;
        *reused = conn.requests_served() > 0;
        *inbuf = std::mem::take(&mut conn.inbuf);
        *conn_slot = Some(conn);
        codec.write_over(codec_slot);
        *outbuf = head;
        *body_slot = Some(body);
        *declared_slot = declared;
        *sent = 0;
        *written = 0;
        *eof = false;
        *write_error = None;
        // The same pool's name, as a thread's requests mostly are: no reference moved.
        if !Arc::ptr_eq(pool, &options.pool) {
            *pool = Arc::clone(&options.pool);
        }
        *request_id = options.request_id;
        *timeouts = options.timeouts;
        stderr.clone_from(&options.stderr);
        *request_deadline = started + options.timeouts.request;
        *first_byte_deadline = None;
        *got_byte = false;
        *clean = false;
        *limit = stderr::limit();
        *state = BodyState::Streaming;
        *kept = None;
        *ahead = None;
        *announced = None;
        *handed = 0;
        *held = None;
        *discard = 0;
    }
}
