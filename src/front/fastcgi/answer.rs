//! How a FastCGI front request's answer goes out: the frames queued for the connection's
//! one writer (which gathers them into few writes and drops what an aborted request still
//! sends), and the responder that turns a CGI response into FCGI_STDOUT frames.

use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::sync::Arc;

use bytes::{BufMut, Bytes, BytesMut};
use tokio::io::AsyncWriteExt;

use super::gather::Gather;
use super::outbox::{OutSender, Outbox};
use super::table::IdMap;
use crate::front::cgi::{self, CgiSink, Relayed};
use crate::front::halves::WritePart;
use crate::gateway::{GatewayError, GatewayResponse};
use crate::protocols::fastcgi::{
    encode_request_complete, encode_stdout, stream_encoded_len, RecordHeader, RecordType,
    HEADER_LEN, STREAM_CHUNK_LEN,
};

/// Queued frames are gathered into one write up to about this many bytes.
const WRITE_BATCH: usize = 64 * 1024;

/// One frame for the writer: bytes of request `id`'s answer (`seq` tells apart requests that
/// reuse an id). `last` marks the frame that ends the request; when it was `cut` short, later
/// frames of the same request are dropped, so an aborted request never gets a second
/// FCGI_END_REQUEST. `close` closes the connection after the frame.
#[derive(Debug)]
pub(super) struct Out {
    pub(super) id: u16,
    pub(super) seq: u64,
    pub(super) bytes: Frame,
    pub(super) last: bool,
    /// With `last`: the request was cut short (aborted, refused for its body) while its
    /// task may still send frames; the writer drops those. A request that ended of itself
    /// sends nothing after its last frame, and is not remembered.
    pub(super) cut: bool,
    pub(super) close: bool,
}

/// What a frame carries.
#[derive(Debug)]
pub(super) enum Frame {
    /// Bytes encoded by the sender (none, to close or cut a request short without a word).
    Bytes(BytesMut),
    /// The usual end of the frame's request: an empty FCGI_STDOUT and FCGI_END_REQUEST with
    /// FCGI_REQUEST_COMPLETE, which the writer encodes into the bytes it is gathering (after
    /// the response, in the room its frame kept for them), so no buffer is made for them.
    Complete,
    /// FCGI_STDOUT content as the backend's body gave it: the writer frames it as records
    /// and writes it out of its own buffer (one slice of the write that gathers it), so the
    /// body is not copied.
    Data(Bytes),
}

impl From<BytesMut> for Frame {
    fn from(bytes: BytesMut) -> Frame {
        Frame::Bytes(bytes)
    }
}

/// Writes frames in order until the outbox ends, a write fails, or a frame says close; then
/// tells the reader through `closed` and gives the write half back: the caller shuts it
/// down only when it lingers, since closing the socket sends the same FIN.
pub(super) async fn write_loop<'w>(
    mut writer: WritePart<'w>,
    frames: &Outbox,
    closed: &Closed,
) -> WritePart<'w> {
    // Last ended request per id; sequence numbers only grow, so one entry per id suffices.
    let mut ended: IdMap<u64> = IdMap::default();
    // The frames queued by the time the writer runs go out in one write: a response's head,
    // body and FCGI_END_REQUEST are one system call, not three.
    let mut batch = BytesMut::new();
    // Body chunks written out of their own buffers, between the batch's bytes.
    let mut gather = Gather::default();
    // The multiplexed requests' channel, once there is one.
    let mut mux = None;
    'frames: while let Some(first) = frames.next(&mut mux).await {
        let mut next = Some(first);
        let mut close = false;
        // The batch ends a request.
        let mut ends = false;
        while let Some(frame) = next.take() {
            ends |= frame.last;
            let stale = frame.seq != 0 && ended.get(&frame.id).is_some_and(|&s| frame.seq <= s);
            if !stale {
                match frame.bytes {
                    Frame::Bytes(bytes) if bytes.is_empty() => {}
                    Frame::Bytes(bytes) if batch.is_empty() && gather.is_empty() => {
                        cgi::give_back(std::mem::replace(&mut batch, bytes));
                    }
                    Frame::Bytes(bytes) => {
                        batch.extend_from_slice(&bytes);
                        cgi::give_back(bytes);
                    }
                    Frame::Complete => encode_request_complete(frame.id, 0, &mut batch),
                    Frame::Data(data) => gather.data(frame.id, data, &mut batch),
                }
            }
            if frame.last && frame.cut {
                ended.insert(frame.id, frame.seq);
            }
            if frame.close {
                close = true;
                break;
            }
            if batch.len() + gather.len < WRITE_BATCH {
                next = frames.try_next(&mut mux);
            }
        }
        if !batch.is_empty() {
            let written = match gather.is_empty() {
                true => writer.write_all(&batch).await,
                false => gather.write(&mut writer, &batch).await,
            };
            if let Err(e) = written {
                tracing::debug!(error = %e, "fastcgi front server went away while answered");
                break 'frames;
            }
            batch.clear();
            gather.clear();
        }
        // An exchange has ended: a write registration that a full socket made for its answer
        // is dropped, so that a kept connection goes back to waking its thread for reads
        // only (the next answer that finds the socket full registers again).
        if ends {
            writer.settle();
        }
        if close {
            break;
        }
    }
    frames.close();
    drop(mux);
    // The batch is most often the first frame's buffer, a kept one: kept again.
    cgi::give_back(batch);
    closed.set().await;
    writer
}

/// Set by the writer when it has ended: the connection is closed on corral's side. The
/// writer runs in the reader's task (joined with it), so it only has to wake that task for
/// the reader to see it; a flag and a wake-up cost less than a cancellation token's tree and
/// the lock every poll of its waiting future takes.
#[derive(Debug, Default)]
pub(super) struct Closed(AtomicBool);

impl Closed {
    /// Whether the writer has ended.
    pub(super) fn is_set(&self) -> bool {
        self.0.load(Ordering::Acquire)
    }

    /// Clears the flag, for the next connection of the task that keeps it.
    pub(super) fn clear(&self) {
        self.0.store(false, Ordering::Release);
    }

    /// Sets the flag and wakes the task the writer and the reader share.
    async fn set(&self) {
        self.0.store(true, Ordering::Release);
        std::future::poll_fn(|cx| {
            cx.waker().wake_by_ref();
            std::task::Poll::Ready(())
        })
        .await;
    }

    /// Ready once the writer has ended; to be polled from the writer's own task.
    pub(super) async fn wait(&self) {
        std::future::poll_fn(|_| {
            if self.is_set() {
                std::task::Poll::Ready(())
            } else {
                std::task::Poll::Pending
            }
        })
        .await;
    }
}

/// Where a request's answer stands, shared by the reader and the request's task so that
/// exactly one of them writes the response head.
pub(super) const ANSWER_NOT_STARTED: u8 = 0;
pub(super) const ANSWER_STARTED: u8 = 1;
pub(super) const ANSWER_REFUSED: u8 = 2;

/// Where a request's `ANSWER_*` flag lives. The reader consults it only to refuse a request
/// whose body outran its budget, so only a request that can be refused while it runs needs
/// one the reader can reach: the inline request borrows the connection's (one at a time),
/// a request in a task of its own shares one with the reader, and a request answered at once
/// by the reader keeps its own. None of them allocates but the multiplexed one.
#[derive(Debug)]
pub(super) enum AnswerFlag<'c> {
    /// Answered by the reader itself: nobody else looks.
    Own(AtomicU8),
    /// The inline request's: the connection's flag, reset for each inline request.
    Inline(&'c AtomicU8),
    /// A request in a task of its own: shared with its entry in the reader's table.
    Shared(Arc<AtomicU8>),
}

impl AnswerFlag<'_> {
    fn get(&self) -> &AtomicU8 {
        match self {
            AnswerFlag::Own(flag) => flag,
            AnswerFlag::Inline(flag) => flag,
            AnswerFlag::Shared(flag) => flag,
        }
    }
}

/// A request's task has answered: `ending` goes out once the reader has forgotten the id.
#[derive(Debug)]
pub(super) struct Done {
    pub(super) id: u16,
    pub(super) seq: u64,
    pub(super) ending: Ending,
}

/// The frame that ends a request (the end of FCGI_STDOUT and FCGI_END_REQUEST, or nothing to
/// cut the response short) and whether the connection closes after it.
#[derive(Debug)]
pub(super) struct Ending {
    pub(super) bytes: Frame,
    pub(super) close: bool,
}

/// Writes one request's answer as FCGI_STDOUT records.
pub(super) struct Responder<'c> {
    pub(super) id: u16,
    pub(super) seq: u64,
    pub(super) keep_conn: bool,
    pub(super) request_id: u64,
    /// `ANSWER_*`, where the reader can see it when it must.
    pub(super) answer: AnswerFlag<'c>,
    pub(super) out: OutSender<'c>,
}

impl<'c> Responder<'c> {
    /// Queues FCGI_STDOUT bytes; false if the connection is gone or the reader has refused
    /// the request meanwhile.
    pub(super) async fn queue(&self, bytes: impl Into<Frame>) -> bool {
        let state = self.answer.get().compare_exchange(
            ANSWER_NOT_STARTED,
            ANSWER_STARTED,
            Ordering::AcqRel,
            Ordering::Acquire,
        );
        if state == Err(ANSWER_REFUSED) {
            return false;
        }
        let out = Out {
            id: self.id,
            seq: self.seq,
            bytes: bytes.into(),
            last: false,
            cut: false,
            close: false,
        };
        self.out.send(out).await
    }

    /// The usual end: FCGI_STDOUT's end and FCGI_END_REQUEST with REQUEST_COMPLETE.
    pub(super) fn complete(&self) -> Ending {
        Ending {
            bytes: Frame::Complete,
            close: !self.keep_conn,
        }
    }

    /// Streams the backend's answer, or the CGI answer for the error; returns the ending.
    pub(super) async fn answer(
        &mut self,
        response: Result<GatewayResponse, GatewayError>,
    ) -> Ending {
        match cgi::relay(self, response, self.request_id).await {
            Relayed::Complete | Relayed::Gone => self.complete(),
            // The status has gone out: closing without FCGI_END_REQUEST is the only way to
            // tell the front server the response is cut short.
            Relayed::BrokeOff => Ending {
                bytes: Frame::Bytes(BytesMut::new()),
                close: true,
            },
        }
    }

    /// Sends the CGI answer for a request that got no backend response; returns the ending.
    pub(super) async fn error(&mut self, e: &GatewayError) -> Ending {
        cgi::refuse(self, e, self.request_id).await;
        self.complete()
    }

    pub(super) async fn send_cgi(&mut self, cgi: &[u8]) -> Ending {
        cgi::answer(self, cgi).await;
        self.complete()
    }
}

/// Room a frame keeps past its content: the padding of its record (at most 7 bytes) and the
/// end of the response (empty FCGI_STDOUT and FCGI_END_REQUEST, 24 bytes), which the writer
/// appends to the last frame it batches: a short answer goes out of one buffer.
const FRAME_TAIL: usize = 8 + 24;

impl CgiSink for Responder<'_> {
    /// A first chunk this long goes into the head's frame; a longer one is written out of
    /// its own buffer, in the same `writev`.
    const HEAD_TAKES: usize = 4096;

    async fn send_data(&mut self, data: Bytes) -> bool {
        self.queue(Frame::Data(data)).await
    }

    async fn send(&mut self, bytes: &[u8]) -> bool {
        let mut frame = BytesMut::with_capacity(bytes.len() + HEADER_LEN + FRAME_TAIL);
        encode_stdout(self.id, bytes, &mut frame);
        self.queue(frame).await
    }

    /// A record header's room first, filled in by `send_frame` once the content is in.
    fn frame(&mut self, len: usize) -> BytesMut {
        // The connection's own request (not a multiplexed one) makes a frame to be kept.
        let keepable = !matches!(self.answer, AnswerFlag::Shared(_));
        let mut frame = cgi::frame_buffer(HEADER_LEN + len + FRAME_TAIL, keepable);
        frame.put_bytes(0, HEADER_LEN);
        frame
    }

    async fn send_frame(&mut self, mut frame: BytesMut) -> bool {
        let content = frame.len().saturating_sub(HEADER_LEN);
        match u16::try_from(content) {
            Ok(len) if content <= STREAM_CHUNK_LEN => {
                let header = RecordHeader::new(RecordType::Stdout, self.id, len);
                if let Some(room) = frame.get_mut(..HEADER_LEN) {
                    room.copy_from_slice(&header.to_bytes());
                }
                if len == 0 {
                    // An empty record would end the stream: nothing goes out.
                    frame.clear();
                }
                frame.put_bytes(0, usize::from(header.padding_len));
                self.queue(frame).await
            }
            // More than one record holds: encoded anew, record by record.
            _ => {
                let content = frame.get(HEADER_LEN..).unwrap_or_default();
                let mut records =
                    BytesMut::with_capacity(stream_encoded_len(content.len()) + FRAME_TAIL);
                encode_stdout(self.id, content, &mut records);
                self.queue(records).await
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use bytes::{Bytes, BytesMut};
    use tokio::io::AsyncReadExt;

    use super::{write_loop, Closed, Frame, Out};
    use crate::front::fastcgi::outbox::Outbox;
    use crate::front::halves::halves;
    use crate::net::{QuietUnix, Stream};

    /// An answer larger than the socket's buffer makes the writer wait for room through a
    /// write registration; once the exchange has ended the kept connection is back to reads
    /// only, before the next request and not only at its close.
    #[tokio::test(flavor = "current_thread")]
    async fn a_blocked_answer_leaves_no_write_registration_after_its_exchange() {
        let (ours, theirs) = tokio::net::UnixStream::pair().unwrap();
        let mut stream = Stream::Unix(QuietUnix::from_tokio(ours).unwrap());
        let Stream::Unix(quiet) = &stream else {
            unreachable!()
        };
        let fd = quiet.fd();
        let outbox = Outbox::default();
        let closed = Closed::default();
        let big = BytesMut::from(&vec![5u8; 4 << 20][..]);
        let (_reader, writer) = halves(&mut stream);
        let writing = write_loop(writer, &outbox, &closed);
        let feeding = async {
            let frame = |bytes: BytesMut, last| out(1, Frame::Bytes(bytes), last);
            assert!(outbox.push(frame(big.clone(), true)).await);
            // The next exchange's small answer: it goes out without waiting for room.
            assert!(outbox.push(frame(BytesMut::from(&b"next"[..]), true)).await);
            outbox.finish();
        };
        let reading = async move {
            let mut theirs = theirs;
            let mut got = vec![0u8; (4 << 20) + 4];
            theirs.read_exact(&mut got).await.unwrap();
            got
        };
        // The write half, given back, is dropped here: the stream is looked at next.
        let (_, (), got) = tokio::join!(writing, feeding, reading);
        assert_eq!(got.len(), (4 << 20) + 4);
        let Stream::Unix(quiet) = &stream else {
            unreachable!()
        };
        assert_eq!(quiet.fd(), fd);
        assert!(
            quiet.room_fd().is_none(),
            "the write registration outlived the exchange"
        );
    }

    /// Request `id`'s frame, its first request on the connection.
    fn out(id: u16, bytes: Frame, last: bool) -> Out {
        Out {
            id,
            seq: 1,
            bytes,
            last,
            cut: false,
            close: false,
        }
    }

    /// The records of `bytes`: (type, request id, content), padding checked and dropped.
    fn records(mut bytes: &[u8]) -> Vec<(u8, u16, Vec<u8>)> {
        let mut out = Vec::new();
        while !bytes.is_empty() {
            let (head, rest) = bytes.split_at(8);
            assert_eq!(head[0], 1, "version");
            let id = u16::from_be_bytes([head[2], head[3]]);
            let len = usize::from(u16::from_be_bytes([head[4], head[5]]));
            let pad = usize::from(head[6]);
            out.push((head[1], id, rest[..len].to_vec()));
            assert!(rest[len..len + pad].iter().all(|&b| b == 0));
            bytes = &rest[len + pad..];
        }
        out
    }

    /// Body chunks passed on out of their own buffers go out where they were queued, as
    /// FCGI_STDOUT records, through writes that take them a part at a time (4 MiB cannot
    /// go into a socket's buffer at once).
    #[tokio::test(flavor = "current_thread")]
    async fn body_chunks_written_from_their_own_buffers_keep_their_place_in_the_stream() {
        let (ours, theirs) = tokio::net::UnixStream::pair().unwrap();
        let mut stream = Stream::Unix(QuietUnix::from_tokio(ours).unwrap());
        let outbox = Outbox::default();
        let closed = Closed::default();
        let big: Vec<u8> = (0..4u32 << 20).map(|i| (i % 251) as u8).collect();
        let head = b"Status: 200 OK\r\n\r\n";
        let (_reader, writer) = halves(&mut stream);
        let writing = write_loop(writer, &outbox, &closed);
        let feeding = async {
            let frame = |bytes: Frame, last| out(3, bytes, last);
            let mut first = BytesMut::new();
            crate::protocols::fastcgi::encode_stdout(3, head, &mut first);
            assert!(outbox.push(frame(Frame::Bytes(first), false)).await);
            let data = Frame::Data(Bytes::from(big.clone()));
            assert!(outbox.push(frame(data, false)).await);
            let short = Frame::Data(Bytes::from_static(b"short"));
            assert!(outbox.push(frame(short, false)).await);
            assert!(outbox.push(frame(Frame::Complete, true)).await);
            outbox.finish();
        };
        // Up to FCGI_END_REQUEST (its header and body, request complete): the socket stays
        // open while the test holds the stream.
        let end = [1, 3, 0, 3, 0, 8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0];
        let reading = async move {
            let mut theirs = theirs;
            let mut got = Vec::new();
            while !got.ends_with(&end) {
                let mut buf = [0u8; 65536];
                let n = theirs.read(&mut buf).await.unwrap();
                assert_ne!(n, 0, "closed before FCGI_END_REQUEST");
                got.extend_from_slice(&buf[..n]);
            }
            got
        };
        let (_, (), got) = tokio::join!(writing, feeding, reading);
        let records = records(&got);
        let stdout: Vec<u8> = records
            .iter()
            .filter(|(kind, ..)| *kind == 6)
            .flat_map(|(_, _, content)| content.clone())
            .collect();
        let mut expected = head.to_vec();
        expected.extend_from_slice(&big);
        expected.extend_from_slice(b"short");
        assert!(
            stdout == expected,
            "the body came out changed or out of order"
        );
        assert!(records.iter().all(|(_, id, _)| *id == 3));
        // The stream's end, then FCGI_END_REQUEST, last.
        let n = records.len();
        assert_eq!((records[n - 2].0, records[n - 2].2.len()), (6, 0));
        assert_eq!(records[n - 1].0, 3);
        assert!(records[..n - 2].iter().all(|(_, _, c)| !c.is_empty()));
    }
}
