//! One connection from corral: LSAPI requests read with corral-protocols' decoder, each with
//! its whole body, one at a time; between requests the worker waits on both the connection
//! and the listener, so that corral opening a new connection (it dropped the kept one
//! without closing it yet) is never kept waiting behind an idle one.

use std::fs::File;
use std::io::{self, Read, Write};
use std::os::fd::{AsRawFd, RawFd};
use std::rc::Rc;

use bytes::BytesMut;
use corral_protocols::lsapi::{RequestDecoder, RequestView, ViewEvent};
use corral_protocols::Limits;
use corral_worker_control::conn::{wait_idle, wait_readable};

pub use corral_worker_control::conn::End;

use crate::body::{Body, MEMORY_BODY};

/// Most bytes read at once.
const CHUNK: usize = 64 * 1024;
/// A request (its packet or body) not complete this long after its first byte is given up.
const READ_TIMEOUT_MS: libc::c_int = 60_000;

/// A connection and what was read from it but not yet decoded.
pub struct Conn {
    /// The socket (a `File` reads and writes any fd), shared with the exchange answering
    /// on it.
    pub stream: Rc<File>,
    buf: BytesMut,
    /// What each read(2) fills, zeroed once per connection: zeroing CHUNK bytes for every
    /// read cost more instructions than the rest of a hello-world request (callgrind).
    chunk: Box<[u8]>,
    decoder: RequestDecoder,
}

impl Conn {
    /// Wraps an accepted socket.
    pub fn new(stream: File) -> Conn {
        Conn {
            stream: Rc::new(stream),
            buf: BytesMut::with_capacity(CHUNK),
            chunk: vec![0u8; CHUNK].into_boxed_slice(),
            decoder: RequestDecoder::new(&Limits::DEFAULT),
        }
    }

    /// The next request and its whole body.
    /// The request is decoded into a view reused from an earlier request when one was
    /// given back ([`crate::request::Server`] does so when dropped): no allocation per request.
    pub fn next_request(&mut self, listener: RawFd) -> Result<(Box<RequestView>, Body), End> {
        let mut view = crate::request::spare_view();
        loop {
            match self.decoder.decode_into(&mut self.buf, &mut view) {
                Ok(Some(ViewEvent::Begin)) => break,
                // The client went away after its answer was complete: nothing to stop.
                Ok(Some(ViewEvent::Abort)) => continue,
                Ok(Some(ViewEvent::Body(_))) => {
                    return Err(End::Failed("body bytes outside a request".to_owned()))
                }
                Ok(None) => {}
                Err(e) => return Err(End::Failed(format!("bad LSAPI request: {e}"))),
            }
            let idle = self.buf.is_empty();
            if idle {
                wait_idle(self.stream.as_raw_fd(), listener, crate::stopping)?;
            }
            if self.fill(!idle)? == 0 {
                return Err(if idle {
                    End::Closed
                } else {
                    End::Failed("connection closed inside a request packet".to_owned())
                });
            }
        }
        let body = self.body(view.body_len())?;
        Ok((view, body))
    }

    /// Reads the `len` body bytes that follow BEGIN_REQUEST.
    fn body(&mut self, len: u64) -> Result<Body, End> {
        let failed = |e: io::Error| End::Failed(format!("spooling the request body: {e}"));
        if len == 0 {
            return Ok(Body::empty());
        }
        let mut memory = BytesMut::new();
        let mut file = None;
        if len > MEMORY_BODY {
            file = Some(Body::spool().map_err(failed)?);
        } else {
            // Bounded by MEMORY_BODY just above.
            memory.reserve(usize::try_from(len).unwrap_or(0));
        }
        while self.decoder.body_remaining() > 0 {
            if self.buf.is_empty() && self.fill(true)? == 0 {
                return Err(End::Failed(
                    "connection closed inside a request body".to_owned(),
                ));
            }
            // Body bytes owed and some buffered: they are body, whatever they look like.
            if let Some(chunk) = self.decoder.decode_body(&mut self.buf) {
                match &mut file {
                    Some(f) => f.write_all(&chunk).map_err(failed)?,
                    None => memory.extend_from_slice(&chunk),
                }
            }
        }
        match file {
            Some(f) => Body::from_file(f).map_err(failed),
            None => Ok(Body::Memory(memory.freeze(), 0)),
        }
    }

    /// Reads what is there into the buffer; 0 at the end of the stream. `timed`: inside a
    /// request, where a peer that stops sending for READ_TIMEOUT_MS is given up.
    fn fill(&mut self, timed: bool) -> Result<usize, End> {
        if timed && !wait_readable(self.stream.as_raw_fd(), READ_TIMEOUT_MS)? {
            return Err(End::Failed(format!(
                "no request byte for {} s, connection closed",
                READ_TIMEOUT_MS / 1000
            )));
        }
        loop {
            match (&*self.stream).read(&mut self.chunk) {
                Ok(n) => {
                    self.buf
                        .extend_from_slice(self.chunk.get(..n).unwrap_or_default());
                    return Ok(n);
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {
                    if crate::stopping() && self.buf.is_empty() {
                        return Err(End::Stopping);
                    }
                }
                Err(e) => return Err(End::Failed(format!("read failed: {e}"))),
            }
        }
    }

    /// Waits for corral to close the connection (after CONN_CLOSE), discarding anything it
    /// still sends: at most `waits` waits of `each_ms` each.
    pub fn wait_closed(&self, waits: u32, each_ms: libc::c_int) {
        let mut tmp = [0u8; 512];
        for _ in 0..waits {
            match wait_readable(self.stream.as_raw_fd(), each_ms) {
                Ok(true) => {}
                Ok(false) => continue,
                Err(_) => return,
            }
            match (&*self.stream).read(&mut tmp) {
                Ok(0) => return,
                Ok(_) => {}
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(_) => return,
            }
        }
    }
}
