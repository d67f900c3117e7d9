//! The frames waiting for a FastCGI front connection's writer.
//!
//! The reader, the writer and the request served inline all run in the connection's one task,
//! so what they queue for the writer needs no channel: a short queue under an uncontended
//! lock, and a wake of that same task when the writer or a sender waits. A channel costs two
//! cache-aligned allocations per connection, and a front server that opens a connection per
//! request (nginx's plain `fastcgi_pass`) pays them per request. Requests multiplexed beside
//! the inline one run in tasks of their own and send through a channel made with the first of
//! them ([`Outbox::mux_sender`]); the writer takes what that channel holds before the queue's
//! frames, which keeps each request's frames in the order its task sent them ahead of the
//! end the reader queues once the task has reported its ending.

use std::collections::VecDeque;
use std::future::Future;
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::task::{Context, Poll, Waker};

use tokio::sync::mpsc;

use super::answer::Out;

/// Frames the queue holds before a sender waits; with the channel's bound (the same), this
/// bounds what one connection holds in memory.
pub(super) const OUT_FRAMES: usize = 16;

/// The queue of one connection's frames; see the module documentation.
#[derive(Debug, Default)]
pub(super) struct Outbox(Mutex<Queue>);

#[derive(Debug, Default)]
struct Queue {
    frames: Frames,
    /// The writer, waiting for a frame.
    writer: Option<Waker>,
    /// A sender, waiting for room (every local sender runs in the connection's task, so one
    /// waker serves them all).
    sender: Option<Waker>,
    /// The receiving end of the multiplexed requests' channel, until the writer takes it.
    mux: Option<mpsc::Receiver<Out>>,
    /// The writer has ended: nothing more goes out.
    closed: bool,
    /// The reader has ended: no local frame comes any more.
    finished: bool,
}

/// Where a request's frames go: the outbox, for the reader and the inline request; the
/// channel, for a request in a task of its own.
#[derive(Debug, Clone)]
pub(super) enum OutSender<'c> {
    Local(&'c Outbox),
    Mux(mpsc::Sender<Out>),
}

impl OutSender<'_> {
    /// Queues `out`, waiting for room; false once the writer has ended.
    pub(super) async fn send(&self, out: Out) -> bool {
        match self {
            OutSender::Local(outbox) => outbox.push(out).await,
            OutSender::Mux(tx) => tx.send(out).await.is_ok(),
        }
    }
}

/// Frames kept in the queue itself before a heap queue is made for more.
const NEAR_FRAMES: usize = 4;

/// A first-in first-out queue of frames: the first [`NEAR_FRAMES`] in a ring held in place (a
/// request's answer and its end, usually, so a connection that serves one request at a time
/// never allocates for its queue), the rest in a heap queue made when they come. Whatever is
/// in the heap queue was pushed after everything in the ring: a frame goes to the ring only
/// while the heap queue is empty.
#[derive(Debug, Default)]
struct Frames {
    ring: [Option<Out>; NEAR_FRAMES],
    /// The ring's oldest slot.
    head: usize,
    /// Frames in the ring.
    near: usize,
    far: VecDeque<Out>,
}

impl Frames {
    fn len(&self) -> usize {
        self.near + self.far.len()
    }

    fn push_back(&mut self, out: Out) {
        if self.near < NEAR_FRAMES && self.far.is_empty() {
            let slot = (self.head + self.near) % NEAR_FRAMES;
            if let Some(room) = self.ring.get_mut(slot) {
                *room = Some(out);
                self.near += 1;
                return;
            }
        }
        self.far.push_back(out);
    }

    fn pop_front(&mut self) -> Option<Out> {
        if self.near == 0 {
            return self.far.pop_front();
        }
        let out = self.ring.get_mut(self.head).and_then(Option::take);
        self.head = (self.head + 1) % NEAR_FRAMES;
        self.near -= 1;
        out
    }

    fn clear(&mut self) {
        self.ring = Default::default();
        self.head = 0;
        self.near = 0;
        self.far.clear();
    }
}

impl Outbox {
    fn queue(&self) -> MutexGuard<'_, Queue> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Queues `out` for the writer, waiting while [`OUT_FRAMES`] are queued; false once the
    /// writer has ended.
    pub(super) async fn push(&self, out: Out) -> bool {
        let mut out = Some(out);
        std::future::poll_fn(|cx| {
            let mut q = self.queue();
            if q.closed {
                return Poll::Ready(false);
            }
            if q.frames.len() >= OUT_FRAMES {
                q.sender = Some(cx.waker().clone());
                return Poll::Pending;
            }
            if let Some(out) = out.take() {
                q.frames.push_back(out);
            }
            if let Some(w) = q.writer.take() {
                w.wake();
            }
            Poll::Ready(true)
        })
        .await
    }

    /// A sender for a request in a task of its own: the channel's, made with the first.
    /// `held` keeps the connection's sender (dropped with the connection).
    pub(super) fn mux_sender(&self, held: &mut Option<mpsc::Sender<Out>>) -> mpsc::Sender<Out> {
        if let Some(tx) = held {
            return tx.clone();
        }
        let (tx, rx) = mpsc::channel(OUT_FRAMES);
        let mut q = self.queue();
        if !q.closed {
            // Once the writer has ended, the receiver is dropped: sends fail.
            q.mux = Some(rx);
        }
        if let Some(w) = q.writer.take() {
            w.wake();
        }
        *held = Some(tx.clone());
        tx
    }

    /// Empty and open again, for the next connection of the task that keeps it.
    pub(super) fn renew(&self) {
        let mut q = self.queue();
        if q.frames.len() != 0 {
            q.frames.clear();
        }
        // Field by field: the queue is a few hundred bytes, and its ring is already empty
        // after a connection whose writer sent everything.
        q.writer = None;
        q.sender = None;
        q.mux = None;
        q.closed = false;
        q.finished = false;
    }

    /// The reader has ended: once the queue and the channel are empty, the writer ends.
    pub(super) fn finish(&self) {
        let mut q = self.queue();
        q.finished = true;
        if let Some(w) = q.writer.take() {
            w.wake();
        }
    }

    /// The writer has ended: senders get false from now on.
    pub(super) fn close(&self) {
        let mut q = self.queue();
        q.closed = true;
        q.frames.clear();
        q.mux = None;
        if let Some(w) = q.sender.take() {
            w.wake();
        }
    }

    /// The next frame for the writer (`mux`: the writer's end of the channel, once made),
    /// waiting for one; `None` once the reader and every task have ended.
    pub(super) fn next<'a>(
        &'a self,
        mux: &'a mut Option<mpsc::Receiver<Out>>,
    ) -> impl Future<Output = Option<Out>> + 'a {
        std::future::poll_fn(move |cx| self.poll_next(mux, Some(cx)))
    }

    /// The next frame if one is there, without waiting.
    pub(super) fn try_next(&self, mux: &mut Option<mpsc::Receiver<Out>>) -> Option<Out> {
        match self.poll_next(mux, None) {
            Poll::Ready(out) => out,
            Poll::Pending => None,
        }
    }

    /// The channel first: a task's frames are all in it by the time its end is queued here.
    fn poll_next(
        &self,
        mux: &mut Option<mpsc::Receiver<Out>>,
        mut cx: Option<&mut Context<'_>>,
    ) -> Poll<Option<Out>> {
        loop {
            if let Some(rx) = mux {
                let polled = match cx.as_deref_mut() {
                    Some(cx) => rx.poll_recv(cx),
                    None => match rx.try_recv() {
                        Ok(out) => Poll::Ready(Some(out)),
                        Err(mpsc::error::TryRecvError::Disconnected) => Poll::Ready(None),
                        Err(mpsc::error::TryRecvError::Empty) => Poll::Pending,
                    },
                };
                match polled {
                    Poll::Ready(Some(out)) => return Poll::Ready(Some(out)),
                    // Every sender is gone: the tasks and the connection's own.
                    Poll::Ready(None) => *mux = None,
                    Poll::Pending => {}
                }
            }
            let mut q = self.queue();
            if let Some(rx) = q.mux.take() {
                drop(q);
                *mux = Some(rx);
                continue;
            }
            if let Some(out) = q.frames.pop_front() {
                if let Some(w) = q.sender.take() {
                    w.wake();
                }
                return Poll::Ready(Some(out));
            }
            if q.finished && mux.is_none() {
                return Poll::Ready(None);
            }
            if let Some(cx) = cx {
                if !q.writer.as_ref().is_some_and(|w| w.will_wake(cx.waker())) {
                    q.writer = Some(cx.waker().clone());
                }
            }
            return Poll::Pending;
        }
    }
}

#[cfg(test)]
mod tests {
    use std::pin::pin;
    use std::task::Waker;

    use bytes::BytesMut;

    use super::*;
    use crate::front::fastcgi::answer::Frame;

    fn frame(id: u16, byte: u8) -> Out {
        Out {
            id,
            seq: u64::from(id),
            bytes: Frame::Bytes(BytesMut::from(&[byte][..])),
            last: false,
            cut: false,
            close: false,
        }
    }

    fn byte(out: Option<Out>) -> Option<u8> {
        match out?.bytes {
            Frame::Bytes(b) => b.first().copied(),
            Frame::Data(b) => b.first().copied(),
            Frame::Complete => None,
        }
    }

    /// Polls `f` once, with a waker that does nothing.
    fn poll_once<F: Future>(f: std::pin::Pin<&mut F>) -> Poll<F::Output> {
        f.poll(&mut Context::from_waker(Waker::noop()))
    }

    #[tokio::test]
    async fn a_task_s_frames_go_out_before_the_end_queued_after_them() {
        let outbox = Outbox::default();
        let mut held = None;
        let tx = outbox.mux_sender(&mut held);
        let mut mux = None;
        // The reader queues one frame, a task sends two, then the reader queues the task's end.
        assert!(outbox.push(frame(1, b'a')).await);
        tx.send(frame(2, b'x')).await.unwrap();
        tx.send(frame(2, b'y')).await.unwrap();
        assert!(outbox.push(frame(2, b'e')).await);
        let order: Vec<Option<u8>> = (0..4).map(|_| byte(outbox.try_next(&mut mux))).collect();
        assert_eq!(order, [Some(b'x'), Some(b'y'), Some(b'a'), Some(b'e')]);
        assert!(outbox.try_next(&mut mux).is_none());
        // The writer ends only once the reader has finished and every sender is gone.
        outbox.finish();
        assert!(poll_once(pin!(outbox.next(&mut mux))).is_pending());
        drop((tx, held));
        assert!(matches!(
            poll_once(pin!(outbox.next(&mut mux))),
            Poll::Ready(None)
        ));
    }

    #[test]
    fn frames_keep_their_order_across_the_ring_and_the_heap_queue() {
        let mut q = Frames::default();
        let mut next = 0u8;
        let mut expected = 0u8;
        // Runs past the ring, drains partly while frames are in the heap queue, wraps the
        // ring around: every frame comes out in the order it went in.
        for (push, pop) in [(6, 3), (3, 2), (1, 4), (5, 5), (2, 1), (9, 11)] {
            for _ in 0..push {
                q.push_back(frame(1, next));
                next += 1;
            }
            for _ in 0..pop {
                assert_eq!(byte(q.pop_front()), Some(expected));
                expected += 1;
            }
            assert_eq!(q.len(), usize::from(next - expected));
        }
        assert!(q.pop_front().is_none());
        q.push_back(frame(1, 7));
        q.push_back(frame(1, 8));
        q.clear();
        assert_eq!(q.len(), 0);
        assert!(q.pop_front().is_none());
        q.push_back(frame(1, 9));
        assert_eq!(byte(q.pop_front()), Some(9));
    }

    #[test]
    fn a_sender_waits_while_the_queue_is_full_and_fails_once_the_writer_ends() {
        let outbox = Outbox::default();
        for i in 0..OUT_FRAMES {
            let pushed = poll_once(pin!(outbox.push(frame(1, u8::try_from(i).unwrap_or(0)))));
            assert_eq!(pushed, Poll::Ready(true));
        }
        let mut waiting = pin!(outbox.push(frame(1, b'w')));
        assert!(poll_once(waiting.as_mut()).is_pending());
        let mut mux = None;
        assert_eq!(byte(outbox.try_next(&mut mux)), Some(0));
        assert_eq!(poll_once(waiting.as_mut()), Poll::Ready(true));
        outbox.close();
        assert_eq!(
            poll_once(pin!(outbox.push(frame(1, b'z')))),
            Poll::Ready(false)
        );
        assert!(outbox.try_next(&mut mux).is_none());
    }
}
