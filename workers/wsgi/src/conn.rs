//! One connection from corral: LSAPI requests read with corral-protocols' decoder, one at a
//! time, each decoded in place into a [`RequestView`] the caller reuses (the packet copied
//! into its one buffer, its parts kept as offsets: nothing allocated per request once the
//! view has grown to the largest request seen). A request's body is not read ahead: the
//! app's wsgi.input reads pull it from the connection as it asks ([`Conn::read_body`]), and
//! what the app leaves unread is drained after the answer, so the connection is in step for
//! the next request. Between requests the worker waits on both the connection and the
//! listener, so that corral opening a new connection (it dropped the kept one) is never
//! kept waiting behind an idle one.

use std::fs::File;
use std::io::{self, Write};
use std::os::fd::{AsRawFd, RawFd};

use bytes::{Buf, Bytes, BytesMut};
use corral_protocols::lsapi::{RequestDecoder, RequestView, ViewEvent};
use corral_protocols::Limits;
use corral_worker_control::conn::{wait_idle, wait_readable};

pub use corral_worker_control::conn::End;

/// Most bytes read at once.
const CHUNK: usize = 64 * 1024;
/// A request (its packet or body) not complete this long after its first byte is given up.
const READ_TIMEOUT_MS: libc::c_int = 60_000;

/// The buffers a connection uses, kept from one connection to the next.
pub struct Buffers {
    input: BytesMut,
    /// Response packets queued and not yet written.
    pub out: BytesMut,
    /// The request being answered, decoded in place.
    pub view: RequestView,
}

impl Buffers {
    /// Empty buffers of the usual sizes.
    pub fn new() -> Buffers {
        Buffers {
            input: BytesMut::with_capacity(CHUNK),
            out: BytesMut::with_capacity(CHUNK),
            view: RequestView::new(),
        }
    }
}

/// A connection and what was read from it but not yet decoded.
pub struct Conn {
    stream: File,
    listener: RawFd,
    buf: BytesMut,
    /// Response packets queued and not yet written.
    pub out: BytesMut,
    decoder: RequestDecoder,
    /// Body bytes decoded and not yet handed to the app.
    pending: Bytes,
    /// Requests this connection carried, the current one included.
    pub served: u64,
}

impl Conn {
    /// Wraps an accepted socket; `listener` is watched between requests. The view of
    /// `buffers` is handed back apart, for the caller to decode requests into.
    pub fn new(stream: File, listener: RawFd, buffers: Buffers) -> (Conn, RequestView) {
        let Buffers {
            mut input,
            mut out,
            view,
        } = buffers;
        input.clear();
        out.clear();
        let conn = Conn {
            stream,
            listener,
            buf: input,
            out,
            decoder: RequestDecoder::new(&Limits::DEFAULT),
            pending: Bytes::new(),
            served: 0,
        };
        (conn, view)
    }

    /// The buffers, for the next connection.
    pub fn into_buffers(self, view: RequestView) -> Buffers {
        Buffers {
            input: self.buf,
            out: self.out,
            view,
        }
    }

    /// Decodes the next request into `view` (its body is read later, by
    /// [`Conn::read_body`]).
    pub fn next_request(&mut self, view: &mut RequestView) -> Result<(), End> {
        loop {
            match self.decoder.decode_into(&mut self.buf, view) {
                Ok(Some(ViewEvent::Begin)) => {
                    self.served += 1;
                    return Ok(());
                }
                // corral gives up on the connection.
                Ok(Some(ViewEvent::Abort)) => return Err(End::Closed),
                Ok(Some(ViewEvent::Body(_))) => {
                    return Err(End::Failed("body bytes outside a request".to_owned()))
                }
                Ok(None) => {}
                Err(e) => return Err(End::Failed(format!("bad LSAPI request: {e}"))),
            }
            let idle = self.buf.is_empty();
            if idle {
                wait_idle(self.stream.as_raw_fd(), self.listener, crate::stopping)?;
            }
            if self.fill(!idle)? == 0 {
                return Err(if idle {
                    End::Closed
                } else {
                    End::Failed("connection closed inside a request packet".to_owned())
                });
            }
        }
    }

    /// Up to `dst.len()` bytes of the current request's body; 0 at its end.
    pub fn read_body(&mut self, dst: &mut [u8]) -> Result<usize, End> {
        while self.pending.is_empty() {
            if self.decoder.body_remaining() == 0 {
                return Ok(0);
            }
            if self.buf.is_empty() && self.fill(true)? == 0 {
                return Err(End::Failed(
                    "connection closed inside a request body".to_owned(),
                ));
            }
            // Body bytes owed and some buffered: they are body, whatever they look like.
            if let Some(chunk) = self.decoder.decode_body(&mut self.buf) {
                self.pending = chunk;
            }
        }
        let n = dst.len().min(self.pending.len());
        if let (Some(to), Some(from)) = (dst.get_mut(..n), self.pending.get(..n)) {
            to.copy_from_slice(from);
        }
        self.pending.advance(n);
        Ok(n)
    }

    /// Reads and drops what the app left of the body.
    pub fn drain_body(&mut self) -> Result<(), End> {
        self.pending.clear();
        // The usual case, a body read to its end (or none), costs nothing more.
        if self.decoder.body_remaining() == 0 {
            return Ok(());
        }
        let mut sink = [0u8; 8192];
        while self.read_body(&mut sink)? > 0 {
            self.pending.clear();
        }
        Ok(())
    }

    /// Writes what is queued in [`Conn::out`].
    pub fn flush(&mut self) -> io::Result<()> {
        if self.out.is_empty() {
            return Ok(());
        }
        let result = (&self.stream).write_all(&self.out);
        self.out.clear();
        result
    }

    /// Reads what is there into the buffer; 0 at the end of the stream. `timed`: inside a
    /// request, where a peer that stops sending for READ_TIMEOUT_MS is given up.
    fn fill(&mut self, timed: bool) -> Result<usize, End> {
        if timed && !wait_readable(self.stream.as_raw_fd(), READ_TIMEOUT_MS)? {
            return Err(End::Failed(format!(
                "no request byte for {} s",
                READ_TIMEOUT_MS / 1000
            )));
        }
        self.buf.reserve(CHUNK);
        loop {
            let spare = self.buf.spare_capacity_mut();
            // SAFETY: read(2) writes at most `spare.len()` bytes into the spare capacity,
            // which is valid for writes; only the bytes it reports are marked initialised.
            let n = unsafe {
                libc::read(
                    self.stream.as_raw_fd(),
                    spare.as_mut_ptr().cast(),
                    spare.len(),
                )
            };
            if n >= 0 {
                let n = n.unsigned_abs();
                // SAFETY: read(2) initialised these `n` bytes.
                unsafe { self.buf.set_len(self.buf.len() + n) };
                return Ok(n);
            }
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                if crate::stopping() && self.buf.is_empty() && !timed {
                    return Err(End::Stopping);
                }
                continue;
            }
            return Err(End::Failed(format!("read failed: {e}")));
        }
    }
}
