//! One request as PHP sees it through the SAPI callbacks: the variables it registers, the
//! body it reads, the headers and output it produces, turned into LSAPI response packets on
//! the connection. Output is queued and written in blocks of [`FLUSH_AT`] (a small answer
//! is one write, REQ_RECEIVED and RESP_END included), or at once when the script calls
//! `flush()`. A large write from PHP (at least one whole 16 KiB packet, [`MAX_DATA_LEN`]) is
//! not copied: its whole packets go out from PHP's own buffer in one writev(2), with what
//! was queued before them and their packet headers between them, and only its tail is
//! queued (see [`Exchange::write_through`]). The worker script's own output outside any
//! request (worker mode) goes to the log instead ([`Sink::Log`]).

use std::cell::Cell;
use std::fs::File;
use std::io::{IoSlice, Write};
use std::rc::Rc;

use bytes::BytesMut;
use corral_protocols::lsapi::{ResponseEncoder, HEADER_LEN, MAX_DATA_LEN};

use crate::body::Body;
use crate::php::Zval;
use crate::request::Server;
use crate::What;

/// Response header lines split on the stack; more take one allocation. (The array is filled
/// with empty pairs before each head is split, so it is sized for a usual head, not the
/// largest.)
const STACK_HEADERS: usize = 16;

/// Response bytes queued before they are written.
const FLUSH_AT: usize = 64 * 1024;

/// The output buffer's first size: a small page's answer whole.
const OUT_CAPACITY: usize = 16 * 1024;

/// Most RESP_STREAM packets one writev(2) of [`Exchange::write_through`] carries: two
/// slices each (header, data) and the queued bytes stay well under IOV_MAX (1024), and the
/// slices fit on the stack.
const THROUGH_PACKETS: usize = 64;

thread_local! {
    /// The last exchange's output buffer, for the next one: it is allocated once per
    /// worker rather than once per request.
    static SPARE_OUT: Cell<Option<BytesMut>> = const { Cell::new(None) };
}

/// Where an exchange's answer goes.
pub enum Sink {
    /// LSAPI packets on corral's connection.
    Conn(Rc<File>),
    /// Lines in the log: the worker script's output outside a request (worker mode).
    Log,
}

/// Most bytes of the worker script's own output logged at once.
const MAX_LOGGED: usize = 4096;

/// One request's state while PHP runs it.
pub struct Exchange {
    sink: Sink,
    encoder: ResponseEncoder,
    out: BytesMut,
    vars: Server,
    body: Body,
    headers: Vec<(Vec<u8>, Vec<u8>)>,
    head_sent: bool,
    /// RESP_END went out (fastcgi_finish_request): later output goes nowhere.
    ended: bool,
    broken: bool,
    what: What,
}

impl Exchange {
    /// A request whose `$_SERVER` is `vars`, body `body`, answered to `sink` with
    /// `encoder`; `what` names it in log lines ("GET /x.php").
    pub fn new(
        sink: Sink,
        encoder: ResponseEncoder,
        vars: Server,
        body: Body,
        what: What,
    ) -> Exchange {
        let mut out = SPARE_OUT
            .take()
            .unwrap_or_else(|| BytesMut::with_capacity(OUT_CAPACITY));
        out.clear();
        // REQ_RECEIVED leads the first write rather than going alone (as the embedded
        // launchers do): corral takes from it only that a byte came.
        encoder.req_received(&mut out);
        Exchange {
            sink,
            encoder,
            out,
            vars,
            body,
            headers: Vec::new(),
            head_sent: false,
            ended: false,
            broken: false,
            what,
        }
    }

    /// The script's output. A short count (0) once corral's connection is gone, which PHP
    /// takes for an aborted connection.
    pub fn write(&mut self, data: &[u8]) -> usize {
        if !self.head_sent {
            self.send_head(200);
        }
        if self.broken {
            return 0;
        }
        if self.ended {
            // After fastcgi_finish_request, as under php-fpm: the client has its answer.
            return data.len();
        }
        if let Sink::Log = self.sink {
            let shown = data.get(..MAX_LOGGED).unwrap_or(data);
            crate::log(&format!(
                "{} wrote {} bytes outside a request: {}",
                crate::Described(&self.what, &self.vars),
                data.len(),
                String::from_utf8_lossy(shown)
            ));
            return data.len();
        }
        let whole = data.len() - data.len() % MAX_DATA_LEN;
        let tail = match data.split_at_checked(whole) {
            Some((packets, tail)) if !packets.is_empty() => {
                self.write_through(packets);
                tail
            }
            _ => data,
        };
        if self.broken {
            return 0;
        }
        self.encoder.stream(tail, &mut self.out);
        if self.out.len() >= FLUSH_AT {
            self.flush();
        }
        data.len()
    }

    /// `packets` (whole [`MAX_DATA_LEN`] packets of body) written at once from PHP's buffer,
    /// after what is queued: as php-cgi's FastCGI library does for a large write, so a big
    /// page is not copied on its way out (phpinfo(): 73 KB in one write). The packet headers
    /// are put in `out` behind the queued bytes and each slice points into it or into
    /// `packets`.
    fn write_through(&mut self, packets: &[u8]) {
        let Exchange {
            sink: Sink::Conn(stream),
            encoder,
            out,
            broken,
            what,
            vars,
            ..
        } = self
        else {
            return;
        };
        for group in packets.chunks(MAX_DATA_LEN * THROUGH_PACKETS) {
            let queued = out.len();
            for chunk in group.chunks(MAX_DATA_LEN) {
                // A chunk is at most MAX_DATA_LEN: the header always encodes.
                let _ = encoder.stream_header(chunk.len(), out);
            }
            let (pending, heads) = out.split_at(queued);
            let parts = Some(pending).filter(|p| !p.is_empty()).into_iter().chain(
                heads
                    .chunks(HEADER_LEN)
                    .zip(group.chunks(MAX_DATA_LEN))
                    .flat_map(|(head, chunk)| [head, chunk]),
            );
            let mut slices = [IoSlice::new(&[]); 1 + 2 * THROUGH_PACKETS];
            let mut n = 0;
            for (slot, part) in slices.iter_mut().zip(parts) {
                *slot = IoSlice::new(part);
                n += 1;
            }
            let result = write_all_vectored(stream, slices.get_mut(..n).unwrap_or_default());
            out.clear();
            if let Err(e) = result {
                crate::log(&format!(
                    "{}: connection to corral lost while answering ({e})",
                    crate::Described(what, vars)
                ));
                *broken = true;
                return;
            }
        }
    }

    /// One header line for an answer the worker writes itself (see [`Exchange::answer`]).
    fn header_line(&mut self, line: &[u8]) {
        if let Some((name, value)) = self.split_line(line) {
            self.headers.push((name.to_vec(), value.to_vec()));
        }
    }

    /// A header line PHP holds (`Name: value`) as its name and value; a line that is not
    /// one is logged and dropped.
    fn split_line<'l>(&self, line: &'l [u8]) -> Option<(&'l [u8], &'l [u8])> {
        let Some(colon) = line.iter().position(|&b| b == b':') else {
            crate::log(&format!(
                "{}: header line without a colon dropped: {:?}",
                crate::Described(&self.what, &self.vars),
                String::from_utf8_lossy(line)
            ));
            return None;
        };
        let (name, rest) = line.split_at(colon);
        let value = rest.get(1..).unwrap_or_default();
        let start = value
            .iter()
            .position(|&b| b != b' ' && b != b'\t')
            .unwrap_or(value.len());
        Some((name, value.get(start..).unwrap_or_default()))
    }

    /// The end of PHP's headers: RESP_HEADER with `status` and `lines` (`Name: value`,
    /// borrowed from PHP for this call; up to [`STACK_HEADERS`] are split on the stack).
    pub fn send_head_lines<'l>(
        &mut self,
        status: u16,
        lines: impl ExactSizeIterator<Item = &'l [u8]>,
    ) {
        if self.head_sent {
            return;
        }
        if lines.len() > STACK_HEADERS {
            let split: Vec<(&[u8], &[u8])> = lines.filter_map(|l| self.split_line(l)).collect();
            return self.encode_head(status, &split);
        }
        let mut stack: [(&[u8], &[u8]); STACK_HEADERS] = [(&[], &[]); STACK_HEADERS];
        let mut n = 0;
        for line in lines {
            if let (Some(slot), Some(pair)) = (stack.get_mut(n), self.split_line(line)) {
                *slot = pair;
                n += 1;
            }
        }
        self.encode_head(status, stack.get(..n).unwrap_or_default());
    }

    /// The end of the headers of an answer the worker writes itself (or of one PHP wrote
    /// output for without a head): RESP_HEADER with `status` and the lines added.
    pub fn send_head(&mut self, status: u16) {
        if self.head_sent {
            return;
        }
        let headers = std::mem::take(&mut self.headers);
        self.encode_head(status, &headers);
    }

    /// RESP_HEADER with `status` and `headers`, once. Headers the codec refuses (too many,
    /// too long) turn the answer into a 500 with none of them.
    fn encode_head<N: AsRef<[u8]>, V: AsRef<[u8]>>(&mut self, status: u16, headers: &[(N, V)]) {
        if self.head_sent {
            return;
        }
        self.head_sent = true;
        if let Err(e) = self.encoder.header(status, headers, &mut self.out) {
            crate::log(&format!(
                "{}: the script's response headers cannot be sent ({e}); answering 500",
                crate::Described(&self.what, &self.vars)
            ));
            let none: [(&str, &str); 0] = [];
            // A status of 500 with no header always encodes.
            let _ = self.encoder.header(500, &none, &mut self.out);
        }
    }

    /// Writes what is queued; after a failed write nothing more is (the connection is gone).
    pub fn flush(&mut self) {
        if self.out.is_empty() || self.broken {
            self.out.clear();
            return;
        }
        let Sink::Conn(stream) = &self.sink else {
            self.out.clear();
            return;
        };
        if let Err(e) = (&**stream).write_all(&self.out) {
            crate::log(&format!(
                "{}: connection to corral lost while answering ({e})",
                crate::Described(&self.what, &self.vars)
            ));
            self.broken = true;
        }
        self.out.clear();
    }

    /// read_post: body bytes into `dst`, 0 at the end.
    pub fn read_body(&mut self, dst: &mut [u8]) -> usize {
        match self.body.read(dst) {
            Ok(n) => n,
            Err(e) => {
                crate::log(&format!(
                    "{}: reading the spooled body failed ({e})",
                    crate::Described(&self.what, &self.vars)
                ));
                0
            }
        }
    }

    /// Fills `$_SERVER` with the request's variables (`keep_keys`: see `crate::keys`).
    pub fn register_variables(&mut self, track_vars: *mut Zval, keep_keys: bool) {
        self.vars.register(track_vars, keep_keys);
    }

    /// Ends the answer (the head if PHP sent none, then RESP_END) and writes it. `true` when
    /// the connection may carry another request.
    pub fn finish(self) -> bool {
        self.end(false)
    }

    /// Ends the answer as [`Exchange::finish`] does, then says CONN_CLOSE in the same write:
    /// the worker is about to exit, and corral must not send another request on this
    /// connection (it would meet a closed socket).
    pub fn finish_closing(self) {
        self.end(true);
    }

    /// fastcgi_finish_request(): the answer ends now (the head if PHP sent none, then
    /// RESP_END, written at once) while the script goes on; `false` when it had already
    /// ended, or when this exchange has no client (the worker script's boot).
    pub fn finish_early(&mut self) -> bool {
        if self.ended || matches!(self.sink, Sink::Log) {
            return false;
        }
        self.complete();
        self.flush();
        true
    }

    /// The head if none was sent, then RESP_END, queued once.
    fn complete(&mut self) {
        if !self.head_sent {
            self.send_head(200);
        }
        if !self.ended {
            self.ended = true;
            self.encoder.end(&mut self.out);
        }
    }

    fn end(mut self, closing: bool) -> bool {
        self.complete();
        if closing {
            self.encoder.conn_close(&mut self.out);
        }
        self.flush();
        !self.broken && !closing
    }

    /// Answers `status` with a short plain-text `body` and no PHP at all (the readiness
    /// probe, a missing script, a request PHP could not start).
    /// `closing`: the worker exits next (see [`Exchange::finish_closing`]).
    pub fn answer(mut self, status: u16, body: &[u8], closing: bool) -> bool {
        if !body.is_empty() {
            self.header_line(b"Content-Type: text/plain; charset=utf-8");
        }
        self.send_head(status);
        self.encoder.stream(body, &mut self.out);
        self.end(closing)
    }
}

/// Writes every byte of `slices` (a blocking socket: a short write is followed by the rest).
fn write_all_vectored(stream: &File, mut slices: &mut [IoSlice<'_>]) -> std::io::Result<()> {
    let mut stream = stream;
    while !slices.is_empty() {
        match stream.write_vectored(slices) {
            Ok(0) => return Err(std::io::ErrorKind::WriteZero.into()),
            Ok(n) => IoSlice::advance_slices(&mut slices, n),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

impl Drop for Exchange {
    /// The output buffer goes back for the next exchange, unless an answer grew it past
    /// what a write is queued to (it is then freed).
    fn drop(&mut self) {
        let out = std::mem::take(&mut self.out);
        if out.capacity() <= 2 * FLUSH_AT {
            SPARE_OUT.set(Some(out));
        }
    }
}
