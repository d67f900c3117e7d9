//! The client role of FastCGI (corral talking to a backend such as php-cgi): encoders for the
//! web server's side of one request, and the decoder of the backend's answer on a connection
//! that may carry one request after another (FCGI_KEEP_CONN).

use bytes::{Buf, Bytes, BytesMut};

use super::body::{parse_end_request, parse_unknown_type};
use super::params::ParamsDecoder;
use super::record::{encode_stream, encode_stream_end, RecordHeader, HEADER_LEN};
use super::{FastCgiError, ProtocolStatus, RecordType, Side};
use crate::Limits;

/// Appends `data` to the FCGI_STDIN stream of `request_id`, split into records as needed.
/// Empty `data` writes nothing; [`encode_stdin_end`] ends the stream.
pub fn encode_stdin(request_id: u16, data: &[u8], dst: &mut BytesMut) {
    encode_stream(RecordType::Stdin, request_id, data, dst);
}

/// Appends the empty FCGI_STDIN record that ends the request body.
pub fn encode_stdin_end(request_id: u16, dst: &mut BytesMut) {
    encode_stream_end(RecordType::Stdin, request_id, dst);
}

/// Appends `data` to the FCGI_DATA stream (FILTER role) of `request_id`. Empty `data` writes
/// nothing; [`encode_data_end`] ends the stream.
pub fn encode_data(request_id: u16, data: &[u8], dst: &mut BytesMut) {
    encode_stream(RecordType::Data, request_id, data, dst);
}

/// Appends the empty FCGI_DATA record that ends the filtered file's data.
pub fn encode_data_end(request_id: u16, dst: &mut BytesMut) {
    encode_stream_end(RecordType::Data, request_id, dst);
}

/// What the backend sent, one record at a time.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ResponseEvent {
    /// Bytes of the FCGI_STDOUT stream (the CGI response).
    Stdout(Bytes),
    /// The FCGI_STDOUT stream ended.
    StdoutEnd,
    /// Bytes of the FCGI_STDERR stream (the backend's error log).
    Stderr(Bytes),
    /// The FCGI_STDERR stream ended.
    StderrEnd,
    /// FCGI_END_REQUEST: the request is over.
    End {
        /// The application's exit status.
        app_status: u32,
        /// Whether the request completed or was refused.
        protocol_status: ProtocolStatus,
    },
    /// A management answer to FCGI_GET_VALUES.
    GetValuesResult(Vec<(Bytes, Bytes)>),
    /// A management FCGI_UNKNOWN_TYPE: the backend does not know a type corral sent.
    UnknownType {
        /// The type byte the backend did not know.
        kind: u8,
    },
}

/// Decodes a backend's records for the one request in flight on a connection. Records for any
/// other request id, or of a type only a web server sends, are errors. The backend need not
/// close FCGI_STDOUT before FCGI_END_REQUEST (nginx does not insist either).
#[derive(Debug, Clone)]
pub struct ResponseDecoder {
    limits: Limits,
    request_id: u16,
    keep_conn: bool,
    stdout_open: bool,
    stderr_open: bool,
    ended: bool,
    /// [`ResponseDecoder::partial_stdout`]: STDOUT content handed out as it comes.
    partial: bool,
    /// Content bytes of the STDOUT record being handed out that have not come yet.
    stdout_left: usize,
    /// Padding bytes of that record still to skip.
    padding_left: usize,
}

impl ResponseDecoder {
    /// A decoder for the answer to `request_id`, sent with FCGI_KEEP_CONN set if `keep_conn`.
    pub fn new(request_id: u16, keep_conn: bool, limits: &Limits) -> ResponseDecoder {
        ResponseDecoder {
            limits: limits.clone(),
            request_id,
            keep_conn,
            stdout_open: true,
            stderr_open: true,
            ended: false,
            partial: false,
            stdout_left: 0,
            padding_left: 0,
        }
    }

    /// With `on`, a STDOUT record not wholly buffered has its content handed out as its
    /// bytes come, in as many [`ResponseEvent::Stdout`] events as it takes (none empty),
    /// its padding skipped as it comes; a record wholly buffered is still one event. The
    /// record's header is checked as before (request id, place in the answer) before any of
    /// its content goes out. A gateway that hands slices of its read buffer onwards then
    /// never keeps part of a record behind in it, so the next read needs no copy of the
    /// record's first part into a new allocation. May be switched at any point (a gateway
    /// turns it on once the CGI head is read); a record under way is finished either way.
    pub fn partial_stdout(&mut self, on: bool) {
        self.partial = on;
    }

    /// The request id of the request in flight (or last ended).
    pub fn request_id(&self) -> u16 {
        self.request_id
    }

    /// Whether FCGI_END_REQUEST has arrived for the request.
    pub fn is_ended(&self) -> bool {
        self.ended
    }

    /// Whether the connection may carry another request: the request ended and was sent with
    /// FCGI_KEEP_CONN, so the backend keeps the connection open.
    pub fn is_reusable(&self) -> bool {
        self.ended && self.keep_conn
    }

    /// Starts decoding the answer to the next request on the same connection; refused unless
    /// [`is_reusable`](Self::is_reusable).
    pub fn reuse(&mut self, request_id: u16, keep_conn: bool) -> Result<(), FastCgiError> {
        if !self.is_reusable() {
            return Err(FastCgiError::NotReusable { request_id });
        }
        self.request_id = request_id;
        self.keep_conn = keep_conn;
        self.stdout_open = true;
        self.stderr_open = true;
        self.ended = false;
        Ok(())
    }

    /// Takes the next event from `src`; `Ok(None)` until a whole record has arrived (a
    /// record is taken once all of its bytes, padding included, are in `src`, as
    /// `RecordDecoder` does), but for STDOUT content under
    /// [`partial_stdout`](Self::partial_stdout), whose header may be consumed with an
    /// `Ok(None)`. A record whose content the event does not carry (an empty
    /// record that ends a stream, FCGI_END_REQUEST) is read where it lies: two of the three
    /// records of a usual answer then make no `Bytes` to drop again at once.
    pub fn decode(&mut self, src: &mut BytesMut) -> Result<Option<ResponseEvent>, FastCgiError> {
        if self.stdout_left != 0 || self.padding_left != 0 {
            if let Some(part) = self.stdout_part(src) {
                return Ok(Some(part));
            }
            let skip = self.padding_left.min(src.len());
            src.advance(skip);
            self.padding_left -= skip;
            if self.stdout_left != 0 || self.padding_left != 0 {
                return Ok(None);
            }
        }
        let Some(&head) = src.first_chunk::<HEADER_LEN>() else {
            return Ok(None);
        };
        let header = RecordHeader::decode(head)?;
        let total = header.record_len();
        if src.len() < total {
            if self.partial && header.kind == RecordType::Stdout && header.content_len != 0 {
                return self.start_stdout(&header, src);
            }
            src.reserve(total - src.len());
            return Ok(None);
        }
        src.advance(HEADER_LEN);
        let len = usize::from(header.content_len);
        let content = if len == 0 || header.kind == RecordType::EndRequest {
            let here = src.get(..len).unwrap_or_default();
            let event = self.on_record(header.kind, header.request_id, Content::Here(here));
            src.advance(len);
            event
        } else {
            let shared = src.split_to(len).freeze();
            self.on_record(header.kind, header.request_id, Content::Shared(shared))
        };
        src.advance(usize::from(header.padding_len));
        content.map(Some)
    }

    /// Checks the header of a STDOUT record with content that is not wholly buffered as
    /// [`application`](Self::application) would the whole record, then consumes the header
    /// and hands out as much of the content as is buffered (`None`: none yet).
    fn start_stdout(
        &mut self,
        header: &RecordHeader,
        src: &mut BytesMut,
    ) -> Result<Option<ResponseEvent>, FastCgiError> {
        if header.request_id == 0 {
            return Err(FastCgiError::NullRequestId { kind: header.kind });
        }
        self.check_stream(header.kind, header.request_id)?;
        src.advance(HEADER_LEN);
        self.stdout_left = usize::from(header.content_len);
        self.padding_left = usize::from(header.padding_len);
        Ok(self.stdout_part(src))
    }

    /// The buffered part of the STDOUT content under way, if any.
    fn stdout_part(&mut self, src: &mut BytesMut) -> Option<ResponseEvent> {
        let n = self.stdout_left.min(src.len());
        if n == 0 {
            return None;
        }
        self.stdout_left -= n;
        Some(ResponseEvent::Stdout(src.split_to(n).freeze()))
    }

    /// Refuses an application record for another request, or after END_REQUEST.
    fn check_request(&self, kind: RecordType, request_id: u16) -> Result<(), FastCgiError> {
        if request_id != self.request_id {
            return Err(FastCgiError::WrongRequestId {
                kind,
                expected: self.request_id,
                got: request_id,
            });
        }
        if self.ended {
            return Err(FastCgiError::RecordAfterEnd { kind, request_id });
        }
        Ok(())
    }

    /// Refuses a STDOUT or STDERR record for another request, after END_REQUEST, or after
    /// its stream ended.
    fn check_stream(&self, kind: RecordType, request_id: u16) -> Result<(), FastCgiError> {
        self.check_request(kind, request_id)?;
        let open = match kind {
            RecordType::Stderr => self.stderr_open,
            _ => self.stdout_open,
        };
        if !open {
            return Err(FastCgiError::StreamAfterEnd { kind, request_id });
        }
        Ok(())
    }

    fn on_record(
        &mut self,
        kind: RecordType,
        request_id: u16,
        content: Content<'_>,
    ) -> Result<ResponseEvent, FastCgiError> {
        match (kind, request_id) {
            (RecordType::GetValuesResult, 0) => Ok(ResponseEvent::GetValuesResult(
                ParamsDecoder::decode_block(content.into_bytes(), &self.limits)?,
            )),
            (RecordType::UnknownType, 0) => Ok(ResponseEvent::UnknownType {
                kind: parse_unknown_type(content.as_slice())?,
            }),
            (RecordType::GetValuesResult | RecordType::UnknownType, _) => {
                Err(FastCgiError::ManagementRequestId { kind, request_id })
            }
            (RecordType::Stdout | RecordType::Stderr | RecordType::EndRequest, 0) => {
                Err(FastCgiError::NullRequestId { kind })
            }
            (RecordType::Stdout | RecordType::Stderr | RecordType::EndRequest, _) => {
                self.application(kind, request_id, content)
            }
            (RecordType::Other(byte), _) => Err(FastCgiError::UnknownRecordType { kind: byte }),
            (
                RecordType::BeginRequest
                | RecordType::AbortRequest
                | RecordType::Params
                | RecordType::Stdin
                | RecordType::Data
                | RecordType::GetValues,
                _,
            ) => Err(FastCgiError::WrongDirection {
                kind,
                sender: Side::Application,
            }),
        }
    }

    /// Handles FCGI_STDOUT, FCGI_STDERR and FCGI_END_REQUEST for a non-null request id.
    fn application(
        &mut self,
        kind: RecordType,
        request_id: u16,
        content: Content<'_>,
    ) -> Result<ResponseEvent, FastCgiError> {
        if kind == RecordType::EndRequest {
            self.check_request(kind, request_id)?;
            let (app_status, protocol_status) = parse_end_request(content.as_slice())?;
            self.ended = true;
            return Ok(ResponseEvent::End {
                app_status,
                protocol_status,
            });
        }
        self.check_stream(kind, request_id)?;
        let stdout = kind == RecordType::Stdout;
        if content.as_slice().is_empty() {
            return Ok(if stdout {
                self.stdout_open = false;
                ResponseEvent::StdoutEnd
            } else {
                self.stderr_open = false;
                ResponseEvent::StderrEnd
            });
        }
        let bytes = content.into_bytes();
        Ok(if stdout {
            ResponseEvent::Stdout(bytes)
        } else {
            ResponseEvent::Stderr(bytes)
        })
    }
}

/// A record's content: shared with the input buffer, or read where it lies (an empty record,
/// FCGI_END_REQUEST), for a decoder that needs no `Bytes` of it.
enum Content<'a> {
    Shared(Bytes),
    Here(&'a [u8]),
}

impl Content<'_> {
    fn as_slice(&self) -> &[u8] {
        match self {
            Content::Shared(bytes) => bytes,
            Content::Here(here) => here,
        }
    }

    /// The content as `Bytes` (a copy of bytes read in place: empty ones, in practice).
    fn into_bytes(self) -> Bytes {
        match self {
            Content::Shared(bytes) => bytes,
            Content::Here(here) => Bytes::copy_from_slice(here),
        }
    }
}
