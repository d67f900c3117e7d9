//! A FastCGI web server written out by hand, talking straight to corral's fastcgi listener:
//! for what nginx never does (multiplexing, FCGI_ABORT_REQUEST, management records, broken
//! or oversized records). The connection and its record reader; each suite adds the requests
//! it sends (`tests/front_fastcgi_raw.rs`, `tests/front_fastcgi_bounds.rs`).

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::Duration;

use bytes::BytesMut;
use corral::protocols::fastcgi::{Record, RecordDecoder};

/// One connection to corral's FastCGI socket.
pub struct RawConn {
    /// The socket, for a test that writes or reads around the record reader.
    pub stream: UnixStream,
    buf: BytesMut,
    records: RecordDecoder,
}

impl RawConn {
    /// Connects to `socket`; a read waits 20 s at most.
    pub fn connect(socket: &Path) -> RawConn {
        let stream = UnixStream::connect(socket).unwrap();
        stream
            .set_read_timeout(Some(Duration::from_secs(20)))
            .unwrap();
        RawConn {
            stream,
            buf: BytesMut::new(),
            records: RecordDecoder::new(),
        }
    }

    /// Writes `bytes` whole.
    pub fn send(&mut self, bytes: &[u8]) {
        self.stream.write_all(bytes).unwrap();
    }

    /// The next record; `None` when corral closed the connection.
    pub fn record(&mut self) -> Option<Record> {
        loop {
            if let Some(r) = self.records.decode(&mut self.buf).unwrap() {
                return Some(r);
            }
            let mut chunk = [0u8; 65536];
            let n = self
                .stream
                .read(&mut chunk)
                .expect("corral answers in time");
            if n == 0 {
                assert!(self.buf.is_empty(), "connection closed mid-record");
                return None;
            }
            self.buf.extend_from_slice(&chunk[..n]);
        }
    }
}
