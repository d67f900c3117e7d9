//! Reading a launcher's LSAPI answers straight off its socket, for the tests that talk to the
//! Rack and WSGI launchers without corral in between.

use std::io::Read;
use std::os::unix::net::UnixStream;

use bytes::BytesMut;
use corral::protocols::lsapi::{ResponseDecoder, ResponseEvent};
use corral::protocols::Limits;

/// What one response carried.
#[derive(Debug, Default)]
pub struct Answer {
    /// The flag byte of every packet.
    pub flags: Vec<u8>,
    pub events: Vec<ResponseEvent>,
    pub status: u16,
    pub lines: Vec<String>,
    pub body: Vec<u8>,
}

impl Answer {
    /// The body as text.
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
}

/// Reads packets until RESP_END, from `buf` first, leaving what follows it there; false when
/// the connection ends first (with the packets read until then in `partial`).
pub fn read_answer_from(s: &mut UnixStream, buf: &mut BytesMut, partial: &mut Answer) -> bool {
    let mut decoder = ResponseDecoder::new(&Limits::DEFAULT);
    let mut chunk = [0u8; 65536];
    loop {
        if buf.len() >= 4 {
            let flag = buf[3];
            if let Some(event) = decoder.decode(buf).unwrap() {
                partial.flags.push(flag);
                match &event {
                    ResponseEvent::Header(head) => {
                        partial.status = head.status;
                        partial.lines = head
                            .lines
                            .iter()
                            .map(|l| String::from_utf8_lossy(l).into_owned())
                            .collect();
                    }
                    ResponseEvent::Stream(data) => partial.body.extend_from_slice(data),
                    _ => {}
                }
                let end = event == ResponseEvent::End;
                partial.events.push(event);
                if end {
                    return true;
                }
                continue;
            }
        }
        match s.read(&mut chunk) {
            Ok(0) | Err(_) => return false,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
    }
}

/// The connection ends with no answer at all (a close with unread input is a reset).
pub fn assert_closed_without_answer(s: &mut UnixStream) {
    let mut rest = Vec::new();
    match s.read_to_end(&mut rest) {
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => {}
        Err(e) => panic!("reading the answer to a bad request: {e}"),
    }
    assert!(rest.is_empty(), "answered a bad request: {rest:?}");
}
