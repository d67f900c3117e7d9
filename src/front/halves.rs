//! A front connection's read and write halves, borrowed from its stream.
//!
//! `tokio::io::split` puts the stream behind an `Arc` and a lock taken on every read and
//! write: an allocation per connection, and a lock per poll, for halves that never leave the
//! connection's task. The halves of the stream's own `split` borrow it instead: the reader
//! and the writer of a CGI front connection run in its one task, which owns the stream. A
//! Unix connection's halves keep its read-only registration (`crate::net::QuietUnix`).

use tokio::net::tcp;

use crate::net::{forward_read, forward_write, QuietRead, QuietWrite, Stream};

/// The read half of a [`Stream`].
#[derive(Debug)]
pub(crate) enum ReadPart<'a> {
    Tcp(tcp::ReadHalf<'a>),
    Unix(QuietRead<'a>),
}

/// The write half of a [`Stream`]; shutting it down shuts the stream down for writing.
#[derive(Debug)]
pub(crate) enum WritePart<'a> {
    Tcp(tcp::WriteHalf<'a>),
    Unix(QuietWrite<'a>),
}

/// Splits `stream` into halves that borrow it.
pub(crate) fn halves(stream: &mut Stream) -> (ReadPart<'_>, WritePart<'_>) {
    match stream {
        Stream::Tcp(s) => {
            let (r, w) = s.split();
            (ReadPart::Tcp(r), WritePart::Tcp(w))
        }
        Stream::Unix(s) => {
            let (r, w) = s.split();
            (ReadPart::Unix(r), WritePart::Unix(w))
        }
    }
}

impl ReadPart<'_> {
    /// Whether the reactor watches the connection for reads: always for TCP; for Unix, once
    /// a read found nothing to take (`crate::net::QuietUnix::accepted`).
    pub(crate) fn is_watched(&self) -> bool {
        match self {
            ReadPart::Tcp(_) => true,
            ReadPart::Unix(r) => r.is_watched(),
        }
    }
}

impl WritePart<'_> {
    /// Drops the write registration a blocked write made on a Unix connection, if any, so
    /// that the connection wakes its thread for reads only again; nothing for TCP.
    pub(crate) fn settle(&mut self) {
        if let WritePart::Unix(w) = self {
            w.settle();
        }
    }
}

forward_read!(ReadPart<'_>, ReadPart::Tcp, ReadPart::Unix);
forward_write!(WritePart<'_>, WritePart::Tcp, WritePart::Unix);
