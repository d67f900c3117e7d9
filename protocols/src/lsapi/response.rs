//! Client role (backend → corral): decoding the packets a backend answers with into response
//! events, in either byte order, checking each packet's size and its place in the sequence.
//!
//! Sequence per request: `REQ_RECEIVED` (or the `"\0PID"` stderr packet from a freshly forked
//! child), any number of `STDERR_STREAM` anywhere, one `RESP_HEADER`, `RESP_STREAM`s,
//! `RESP_END`; then optionally `CONN_CLOSE`. Sizes follow OpenLiteSpeed's checks: RESP_HEADER
//! payload 8..=65535, stream/stderr/REQ_RECEIVED payload ≤ 16384, RESP_END and CONN_CLOSE
//! exactly 8 bytes, and every packet ≤ `Limits::max_packet_len`.

use bytes::{Buf, Bytes, BytesMut};

use super::packet::{
    ByteOrder, FlagRule, PacketHeader, PacketType, HEADER_LEN, MAX_DATA_LEN, MAX_HEADER_PACKET_LEN,
};
use super::LsapiError;
use crate::Limits;

/// Bytes of `struct lsapi_resp_info` (`m_cntHeaders`, `m_status`) at the start of a
/// RESP_HEADER payload.
pub const RESP_INFO_LEN: usize = 8;
/// The payload of the stderr packet a prefork child sends first: `"\0PID"` + int32 pid.
pub const PID_MARKER: [u8; 4] = *b"\0PID";

/// Status and header lines of a response, as the backend sent them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResponseHead {
    /// `m_status`: the HTTP status, or 0 when the backend left it to a `Status:` line (lsphp
    /// with `LSAPI_DISABLE_CPAN_BEHAV`). Gateway rule: use it when non-zero, else a
    /// `Status:` line, else 200.
    pub status: u16,
    /// The header lines exactly as sent (`Name: value` or `Name:value`), NULs stripped;
    /// repeated headers (Set-Cookie) are separate lines.
    pub lines: Vec<Bytes>,
}

impl ResponseHead {
    /// Each line split at its first colon into (name, value without surrounding spaces or
    /// tabs). Lines without a colon, which no HTTP header can be, are skipped.
    pub fn fields(&self) -> impl Iterator<Item = (Bytes, Bytes)> + '_ {
        self.lines.iter().filter_map(split_header_line)
    }
}

/// Splits a header line at its first colon into name and trimmed value.
pub fn split_header_line(line: &Bytes) -> Option<(Bytes, Bytes)> {
    let colon = line.iter().position(|&b| b == b':')?;
    let value = line.get(colon + 1..)?;
    let lead = value
        .iter()
        .take_while(|&&b| b == b' ' || b == b'\t')
        .count();
    let trail = value
        .iter()
        .rev()
        .take_while(|&&b| b == b' ' || b == b'\t')
        .count();
    let end = value.len().saturating_sub(trail).max(lead);
    Some((
        line.slice(..colon),
        line.slice(colon + 1 + lead..colon + 1 + end),
    ))
}

/// One thing a backend said.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ResponseEvent {
    /// REQ_RECEIVED: the request was read; from here on it must not be retried elsewhere.
    ReqReceived,
    /// The `"\0PID"` stderr packet: a prefork child with this pid took the connection. Like
    /// REQ_RECEIVED it acknowledges the request; it is not log text.
    Pid(u32),
    /// STDERR_STREAM: log text for the application log.
    Stderr(Bytes),
    /// RESP_HEADER.
    Header(ResponseHead),
    /// RESP_STREAM: body bytes.
    Stream(Bytes),
    /// RESP_END: the response is complete and the connection may carry the next request.
    End,
    /// CONN_CLOSE: the backend closes the connection; do not reuse it.
    ConnClose,
}

/// What [`ResponseDecoder::decode_text`] gives.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TextEvent {
    /// RESP_HEADER: `m_status` (0: see a `Status:` line) and the lines as a CGI head,
    /// `Name: value` LF each, then LF.
    Head {
        /// `m_status`, as in [`ResponseHead::status`].
        status: u16,
        /// The head's text, ending in the blank line.
        text: Bytes,
    },
    /// Any other packet, as [`ResponseDecoder::decode`] gives it.
    Event(ResponseEvent),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Between responses or before the RESP_HEADER of one.
    AwaitHeader,
    /// After RESP_HEADER, before RESP_END.
    Body,
    /// After CONN_CLOSE.
    Closed,
}

/// Decodes backend packets for one connection (requests follow each other on it).
#[derive(Debug, Clone)]
pub struct ResponseDecoder {
    limits: Limits,
    rule: FlagRule,
    state: State,
    /// [`ResponseDecoder::partial_streams`]: RESP_STREAM payloads handed out as they come.
    partial: bool,
    /// Payload bytes of the RESP_STREAM packet being handed out that have not come yet.
    stream_left: usize,
}

impl ResponseDecoder {
    /// A decoder reading flags under [`FlagRule::HOST`], as a LiteSpeed server would.
    pub fn new(limits: &Limits) -> ResponseDecoder {
        ResponseDecoder {
            limits: limits.clone(),
            rule: FlagRule::HOST,
            state: State::AwaitHeader,
            partial: false,
            stream_left: 0,
        }
    }

    /// Hands each RESP_STREAM payload out as its bytes come, in as many
    /// [`ResponseEvent::Stream`] events as it takes (one may be empty: the packet header
    /// alone), rather than once the whole packet is buffered (a packet wholly buffered is
    /// still one event). The packet's header is checked as before, before any of its
    /// payload is given out. A gateway reading into a buffer
    /// it hands slices of onwards then never keeps part of a packet behind in it, so the
    /// buffer is empty after each read's events and the next read needs no copy of a
    /// packet's first part into a new allocation.
    pub fn partial_streams(mut self, on: bool) -> ResponseDecoder {
        self.partial = on;
        self
    }

    /// Reads flags under `rule` instead.
    pub fn with_flag_rule(mut self, rule: FlagRule) -> ResponseDecoder {
        self.rule = rule;
        self
    }

    /// True between RESP_HEADER and RESP_END.
    pub fn in_body(&self) -> bool {
        self.state == State::Body
    }

    /// True once CONN_CLOSE arrived.
    pub fn is_closed(&self) -> bool {
        self.state == State::Closed
    }

    /// Decodes the next event; `Ok(None)` means more bytes are needed. Bytes are consumed
    /// only with a returned event.
    pub fn decode(&mut self, src: &mut BytesMut) -> Result<Option<ResponseEvent>, LsapiError> {
        let mut parsed = None;
        if let Some(part) = self.stream_part(src, &mut parsed)? {
            return Ok(part);
        }
        let Some(h) = self.whole_packet(src, parsed)? else {
            return Ok(None);
        };
        let event = match h.kind {
            PacketType::RespHeader => {
                let payload = src.get(HEADER_LEN..h.len).unwrap_or(&[]);
                let (status, count) = check_lines(payload, h.order, &self.limits, false)?;
                let payload = take_payload(src, h.len);
                ResponseEvent::Header(ResponseHead {
                    status,
                    lines: cut_lines(&payload, h.order, count),
                })
            }
            _ => self.other(src, &h)?,
        };
        self.after(&event);
        Ok(Some(event))
    }

    /// [`decode`](Self::decode) for a gateway that parses the head as CGI text: RESP_HEADER
    /// comes out as that text, rewritten inside `src` (each line's NUL becomes LF, one LF
    /// ends the head), so that no line list and no copy of the head is allocated. Lines
    /// holding a CR or LF are refused ([`LsapiError::InvalidHeaderBytes`]): in the text
    /// they would end the line early; so are empty lines, which would end the head early.
    /// Every other check is [`decode`](Self::decode)'s.
    pub fn decode_text(&mut self, src: &mut BytesMut) -> Result<Option<TextEvent>, LsapiError> {
        let mut parsed = None;
        if let Some(part) = self.stream_part(src, &mut parsed)? {
            return Ok(part.map(TextEvent::Event));
        }
        let Some(h) = self.whole_packet(src, parsed)? else {
            return Ok(None);
        };
        if h.kind != PacketType::RespHeader {
            let event = self.other(src, &h)?;
            self.after(&event);
            return Ok(Some(TextEvent::Event(event)));
        }
        let payload = src.get(HEADER_LEN..h.len).unwrap_or(&[]);
        let (status, count) = check_lines(payload, h.order, &self.limits, true)?;
        let mut packet = src.split_to(h.len);
        // The lines move one byte towards the front (over the last byte of the length
        // array, read already) and the freed last byte ends the head.
        let lines = HEADER_LEN + RESP_INFO_LEN + 2 * count;
        let start = lines - 1;
        packet.copy_within(lines..h.len, start);
        for b in packet.get_mut(start..).unwrap_or_default() {
            if *b == 0 {
                *b = b'\n';
            }
        }
        if let Some(last) = packet.last_mut() {
            *last = b'\n';
        }
        packet.advance(start);
        self.state = State::Body;
        Ok(Some(TextEvent::Head {
            status,
            text: packet.freeze(),
        }))
    }

    /// With [`partial_streams`](Self::partial_streams): the next part of a RESP_STREAM
    /// payload when one is under way or starts here without being wholly buffered (its
    /// header checked first, then consumed), as many of its bytes as are buffered; `None`
    /// for everything else, which the whole-packet path decodes. `Some(None)`: a packet is
    /// under way and none of its bytes are buffered. A part of no bytes is a header with
    /// none of its payload behind it yet (consumed, so it is an event). A header it parsed
    /// and left to the whole-packet path is put in `parsed`, so that it is not parsed twice.
    fn stream_part(
        &mut self,
        src: &mut BytesMut,
        parsed: &mut Option<PacketHeader>,
    ) -> Result<Option<Option<ResponseEvent>>, LsapiError> {
        if self.stream_left == 0 {
            if !self.partial {
                return Ok(None);
            }
            let Some(h) = PacketHeader::parse(src, self.rule)? else {
                return Ok(None);
            };
            if h.kind != PacketType::RespStream || src.len() >= h.len {
                *parsed = Some(h);
                return Ok(None);
            }
            self.check_size(&h)?;
            self.check_sequence(h.kind)?;
            src.advance(HEADER_LEN);
            self.stream_left = h.payload_len();
            let n = self.stream_left.min(src.len());
            self.stream_left -= n;
            return Ok(Some(Some(ResponseEvent::Stream(src.split_to(n).freeze()))));
        }
        let n = self.stream_left.min(src.len());
        if n == 0 {
            return Ok(Some(None));
        }
        self.stream_left -= n;
        Ok(Some(Some(ResponseEvent::Stream(src.split_to(n).freeze()))))
    }

    /// The header of the next packet once the whole packet is in `src`, its size and place
    /// in the sequence checked; `None` while bytes are missing. `parsed`: the header at the
    /// start of `src` if it was parsed already.
    fn whole_packet(
        &mut self,
        src: &mut BytesMut,
        parsed: Option<PacketHeader>,
    ) -> Result<Option<PacketHeader>, LsapiError> {
        let h = match parsed {
            Some(h) => h,
            None => match PacketHeader::parse(src, self.rule)? {
                Some(h) => h,
                None => return Ok(None),
            },
        };
        self.check_size(&h)?;
        self.check_sequence(h.kind)?;
        if src.len() < h.len {
            src.reserve(h.len - src.len());
            return Ok(None);
        }
        Ok(Some(h))
    }

    /// Any packet but RESP_HEADER, consumed from `src`.
    fn other(&mut self, src: &mut BytesMut, h: &PacketHeader) -> Result<ResponseEvent, LsapiError> {
        Ok(match h.kind {
            PacketType::RespStream => ResponseEvent::Stream(take_payload(src, h.len)),
            PacketType::StderrStream => {
                let payload = take_payload(src, h.len);
                match pid_of(&payload, h.order) {
                    Some(pid) => ResponseEvent::Pid(pid),
                    None => ResponseEvent::Stderr(payload),
                }
            }
            PacketType::ReqReceived => {
                // lsphp sends none, OpenLiteSpeed reads and ignores a payload.
                src.advance(h.len);
                ResponseEvent::ReqReceived
            }
            PacketType::RespEnd => {
                src.advance(h.len);
                ResponseEvent::End
            }
            PacketType::ConnClose => {
                src.advance(h.len);
                ResponseEvent::ConnClose
            }
            kind => {
                return Err(LsapiError::UnexpectedPacket {
                    kind,
                    direction: "backend to server",
                })
            }
        })
    }

    /// The sequence state after `event`.
    fn after(&mut self, event: &ResponseEvent) {
        self.state = match event {
            ResponseEvent::Header(_) => State::Body,
            ResponseEvent::End => State::AwaitHeader,
            ResponseEvent::ConnClose => State::Closed,
            _ => self.state,
        };
    }

    fn check_size(&self, h: &PacketHeader) -> Result<(), LsapiError> {
        let max_payload = match h.kind {
            PacketType::RespHeader => {
                if h.payload_len() < RESP_INFO_LEN {
                    return Err(LsapiError::RespHeaderSizeMismatch {
                        needed: RESP_INFO_LEN,
                        actual: h.payload_len(),
                    });
                }
                MAX_HEADER_PACKET_LEN
            }
            PacketType::RespEnd | PacketType::ConnClose => {
                if h.len != HEADER_LEN {
                    return Err(LsapiError::PayloadNotEmpty {
                        kind: h.kind,
                        len: h.len,
                    });
                }
                0
            }
            PacketType::RespStream | PacketType::StderrStream | PacketType::ReqReceived => {
                MAX_DATA_LEN
            }
            kind => {
                return Err(LsapiError::UnexpectedPacket {
                    kind,
                    direction: "backend to server",
                })
            }
        };
        let max = (HEADER_LEN + max_payload).min(self.limits.max_packet_len.max(HEADER_LEN));
        if h.len > max {
            return Err(LsapiError::PacketTooLarge {
                kind: h.kind,
                len: h.len,
                max,
            });
        }
        Ok(())
    }

    fn check_sequence(&self, kind: PacketType) -> Result<(), LsapiError> {
        match (self.state, kind) {
            (State::Closed, kind) => Err(LsapiError::PacketAfterConnClose(kind)),
            (State::AwaitHeader, PacketType::RespStream) => Err(LsapiError::StreamBeforeHeader),
            (State::AwaitHeader, PacketType::RespEnd) => Err(LsapiError::EndBeforeHeader),
            (State::Body, PacketType::RespHeader) => Err(LsapiError::HeaderTwice),
            (State::Body, PacketType::ReqReceived) => Err(LsapiError::AckDuringResponse),
            _ => Ok(()),
        }
    }
}

fn take_payload(src: &mut BytesMut, len: usize) -> Bytes {
    let mut packet = src.split_to(len);
    packet.advance(HEADER_LEN);
    packet.freeze()
}

fn pid_of(payload: &[u8], order: ByteOrder) -> Option<u32> {
    if payload.len() != 8 || payload.get(..4) != Some(&PID_MARKER[..]) {
        return None;
    }
    let pid = order.read_i32(payload, 4)?;
    Some(u32::from_ne_bytes(pid.to_ne_bytes()))
}

/// Checks a RESP_HEADER payload: `m_cntHeaders`, `m_status`, the int16 length array, then
/// the NUL-terminated lines back to back, filling the payload exactly; `no_breaks` also
/// refuses CR and LF inside a line. Returns the status and the line count; nothing is
/// allocated (the lengths are read again to cut the lines, not kept).
fn check_lines(
    payload: &[u8],
    order: ByteOrder,
    limits: &Limits,
    no_breaks: bool,
) -> Result<(u16, usize), LsapiError> {
    let actual = payload.len();
    let mismatch = |needed| LsapiError::RespHeaderSizeMismatch { needed, actual };
    let count = order.read_i32(payload, 0).ok_or(mismatch(RESP_INFO_LEN))?;
    let status = order.read_i32(payload, 4).ok_or(mismatch(RESP_INFO_LEN))?;
    let count = usize::try_from(count).map_err(|_| LsapiError::NegativeHeaderCount(count))?;
    if count > limits.max_response_headers {
        return Err(LsapiError::TooManyResponseHeaders {
            count,
            max: limits.max_response_headers,
        });
    }
    let status = match u16::try_from(status) {
        Ok(s) if s == 0 || (100..=999).contains(&s) => s,
        _ => return Err(LsapiError::BadStatus(i64::from(status))),
    };
    let lens_end = count.saturating_mul(2).saturating_add(RESP_INFO_LEN);
    if lens_end > actual {
        return Err(mismatch(lens_end));
    }
    // The lengths are read twice (to check they fill the payload, then to cut the lines)
    // rather than kept in a vector: no allocation for them.
    let line_len =
        |i: usize| usize::from(order.read_u16(payload, RESP_INFO_LEN + 2 * i).unwrap_or(0));
    let mut needed = lens_end;
    for i in 0..count {
        let len = line_len(i);
        if len == 0 {
            return Err(LsapiError::EmptyHeaderLine { index: i });
        }
        needed += len;
    }
    if needed != actual {
        return Err(mismatch(needed));
    }
    let mut at = lens_end;
    for index in 0..count {
        let len = line_len(index);
        let text = at..at + len - 1;
        let line = payload.get(text.clone()).ok_or(mismatch(needed))?;
        if payload.get(text.end) != Some(&0) {
            return Err(LsapiError::HeaderLineNotNulTerminated { index });
        }
        if line.contains(&0) {
            return Err(LsapiError::HeaderLineContainsNul { index });
        }
        if no_breaks && line.iter().any(|&b| b == b'\r' || b == b'\n') {
            return Err(LsapiError::InvalidHeaderBytes {
                what: "response header line (CR or LF)",
            });
        }
        // In the text an empty line ends the head: the lines after it would be dropped
        // unseen. No PHP SAPI sends one (PHP ignores an empty header()).
        if no_breaks && line.is_empty() {
            return Err(LsapiError::InvalidHeaderBytes {
                what: "response header line (empty)",
            });
        }
        let (name_len, value_len) = match line.iter().position(|&b| b == b':') {
            Some(colon) => (colon, line.len() - colon - 1),
            None => (0, line.len()),
        };
        if name_len > limits.max_name_len {
            return Err(LsapiError::NameTooLong {
                what: "response header",
                len: name_len,
                max: limits.max_name_len,
            });
        }
        if value_len > limits.max_value_len {
            return Err(LsapiError::ValueTooLong {
                what: "response header",
                len: value_len,
                max: limits.max_value_len,
            });
        }
        at = text.end + 1;
    }
    Ok((status, count))
}

/// The `count` lines of a RESP_HEADER payload [`check_lines`] passed, NULs left out.
fn cut_lines(payload: &Bytes, order: ByteOrder, count: usize) -> Vec<Bytes> {
    let mut lines = Vec::with_capacity(count);
    let mut at = RESP_INFO_LEN + 2 * count;
    for i in 0..count {
        let len = usize::from(order.read_u16(payload, RESP_INFO_LEN + 2 * i).unwrap_or(0));
        // Checked: every length is at least 1 and the lines fill the payload.
        let end = at + len.max(1);
        if payload.get(at..end - 1).is_some() {
            lines.push(payload.slice(at..end - 1));
        }
        at = end;
    }
    lines
}
