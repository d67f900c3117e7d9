//! The responder role of FastCGI (a front server such as nginx `fastcgi_pass` talking to
//! corral): the decoder that tracks every active request id on a connection and turns records
//! into request events, and the encoders of the application's answer.

use bytes::{Buf, Bytes, BytesMut};

use super::body::{encode_end_request, parse_abort_request, parse_begin_request};
use super::params::{ParamsCollector, ParamsDecoder};
use super::record::{
    encode_stream, encode_stream_end, Record, RecordDecoder, HEADER_LEN, VERSION_1,
};
use super::{FastCgiError, ProtocolStatus, RecordType, Role, Side};
use crate::Limits;

/// What the web server sent, one event per meaningful record. `P` is what a request's
/// FCGI_PARAMS stream comes to: owned pairs by default, [`FrontParams`](crate::cgi::FrontParams)
/// for corral's front ([`RequestDecoder::collecting`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RequestEvent<P = Vec<(Bytes, Bytes)>> {
    /// FCGI_BEGIN_REQUEST: `request_id` is now active.
    Begin {
        /// The new request's id.
        request_id: u16,
        /// The role asked for.
        role: Role,
        /// FCGI_KEEP_CONN: keep the connection open after answering; when false, close it
        /// once this request's FCGI_END_REQUEST is sent.
        keep_conn: bool,
    },
    /// FCGI_BEGIN_REQUEST the decoder refused without activating the id: answer with
    /// FCGI_END_REQUEST carrying `status` (later records for the id are ignored).
    Rejected {
        /// The refused request's id.
        request_id: u16,
        /// FCGI_KEEP_CONN of the refused request.
        keep_conn: bool,
        /// UNKNOWN_ROLE for a role FastCGI 1.0 does not define; CANT_MPX_CONN when the
        /// connection already carries its one allowed request; OVERLOADED when it carries
        /// `Limits::max_concurrent_requests` of them.
        status: ProtocolStatus,
    },
    /// The FCGI_PARAMS stream ended; these are all of its pairs.
    Params {
        /// The request id.
        request_id: u16,
        /// The name-value pairs, in the order sent.
        params: P,
    },
    /// Bytes of the FCGI_STDIN stream (the request body).
    Stdin {
        /// The request id.
        request_id: u16,
        /// The bytes, sharing the read buffer's memory.
        data: Bytes,
    },
    /// The FCGI_STDIN stream ended.
    StdinEnd {
        /// The request id.
        request_id: u16,
    },
    /// Bytes of the FCGI_DATA stream (FILTER role only).
    Data {
        /// The request id.
        request_id: u16,
        /// The bytes, sharing the read buffer's memory.
        data: Bytes,
    },
    /// The FCGI_DATA stream ended.
    DataEnd {
        /// The request id.
        request_id: u16,
    },
    /// FCGI_ABORT_REQUEST: stop the request and answer FCGI_END_REQUEST; the id stays active
    /// until [`RequestDecoder::finish`].
    Abort {
        /// The request id.
        request_id: u16,
    },
    /// A management FCGI_GET_VALUES query; answer with
    /// [`answer_get_values`](super::answer_get_values).
    GetValues {
        /// The variable names asked for (the query's values, meant to be empty, are dropped).
        names: Vec<Bytes>,
    },
    /// A record type FastCGI 1.0 does not define, on request id 0 or an active request;
    /// answer with [`encode_unknown_type`](super::encode_unknown_type).
    UnknownType {
        /// The type byte received.
        kind: u8,
    },
}

/// The FCGI_STDIN record type byte.
const STDIN_TYPE: u8 = RecordType::Stdin.as_u8();

/// A whole FCGI_BEGIN_REQUEST or FCGI_PARAMS record of a request at the start of the input:
/// the records of a request's start, whose content is read and copied, never kept.
struct InPlace {
    begin: bool,
    request_id: u16,
    /// Content bytes, after the header.
    len: usize,
    /// Header, content and padding.
    total: usize,
}

/// The record at the start of `src`, when it is one a collector that copies takes where it
/// lies ([`ParamsCollector::COPIES`]): no `Bytes` is cut off the input for it. The header
/// checks are the general path's (a version or reserved byte it refuses is left to it, as
/// is any other record and one not wholly in).
fn in_place(src: &BytesMut) -> Option<InPlace> {
    let &[VERSION_1, kind, id_hi, id_lo, len_hi, len_lo, padding, 0] = src.get(..HEADER_LEN)?
    else {
        return None;
    };
    let request_id = u16::from_be_bytes([id_hi, id_lo]);
    let begin = match RecordType::from_u8(kind) {
        RecordType::BeginRequest => true,
        RecordType::Params => false,
        _ => return None,
    };
    let len = usize::from(u16::from_be_bytes([len_hi, len_lo]));
    let total = HEADER_LEN + len + usize::from(padding);
    (request_id != 0 && src.len() >= total).then_some(InPlace {
        begin,
        request_id,
        len,
        total,
    })
}

/// Per-request stream state of one active request id.
#[derive(Debug, Clone)]
struct Active<C> {
    request_id: u16,
    role: Role,
    params: C,
    params_done: bool,
    stdin_done: bool,
    data_done: bool,
}

/// Decodes a web server's records on one connection, multiplexed or not. A request id is
/// active from its FCGI_BEGIN_REQUEST until the caller [`finish`](Self::finish)es it (after
/// sending its FCGI_END_REQUEST); records for inactive ids are consumed and ignored, as the
/// specification says. FCGI_PARAMS must end before FCGI_STDIN or FCGI_DATA begins.
#[derive(Debug, Clone)]
pub struct RequestDecoder<C: ParamsCollector = ParamsDecoder> {
    records: RecordDecoder,
    limits: Limits,
    /// The active requests: usually one (a front server that does not multiplex), kept in
    /// `first` with no allocation; any others in `more`, few at a time, so a vector searched
    /// linearly beats a map. `first` is searched first; an id is in one of them at most.
    first: Option<Active<C>>,
    more: Vec<Active<C>>,
    /// The collector of the last request finished, kept for the next (its buffers too).
    spare: Option<C>,
}

impl RequestDecoder {
    /// A decoder at the start of a connection, bounded by `limits`, whose FCGI_PARAMS
    /// streams come as owned pairs.
    pub fn new(limits: &Limits) -> RequestDecoder {
        RequestDecoder::collecting(limits)
    }
}

impl<C: ParamsCollector> RequestDecoder<C> {
    /// A decoder at the start of a connection, bounded by `limits`, collecting FCGI_PARAMS
    /// streams with `C`.
    pub fn collecting(limits: &Limits) -> RequestDecoder<C> {
        RequestDecoder {
            records: RecordDecoder::new(),
            limits: limits.clone(),
            first: None,
            more: Vec::new(),
            spare: None,
        }
    }

    /// Whether `request_id` is active.
    pub fn is_active(&self, request_id: u16) -> bool {
        self.first
            .as_ref()
            .is_some_and(|a| a.request_id == request_id)
            || self.more.iter().any(|a| a.request_id == request_id)
    }

    /// How many request ids are active.
    pub fn active_count(&self) -> usize {
        usize::from(self.first.is_some()) + self.more.len()
    }

    /// Forgets `request_id` once its FCGI_END_REQUEST is sent; true if it was active.
    pub fn finish(&mut self, request_id: u16) -> bool {
        let done = if self
            .first
            .as_ref()
            .is_some_and(|a| a.request_id == request_id)
        {
            self.first.take()
        } else {
            self.more
                .iter()
                .position(|a| a.request_id == request_id)
                .map(|at| self.more.swap_remove(at))
        };
        match done {
            Some(done) => {
                if done.params_done {
                    // A finished stream left the collector empty: the next request reuses it.
                    self.spare = Some(done.params);
                }
                true
            }
            None => false,
        }
    }

    /// Takes the next record of `src` when it is, wholly in `src`, the empty FCGI_STDIN record
    /// that ends the body of `request_id`, whose FCGI_PARAMS has ended and whose FCGI_STDIN has
    /// not: what a front server sends right after the parameters of a request without a body.
    /// True when it took it; `decode` would have returned
    /// [`RequestEvent::StdinEnd`] for it. Nothing is consumed otherwise.
    pub fn take_stdin_end(&mut self, src: &mut BytesMut, request_id: u16) -> bool {
        let [id_hi, id_lo] = request_id.to_be_bytes();
        let Some(&[VERSION_1, STDIN_TYPE, hi, lo, 0, 0, padding, 0]) = src.get(..HEADER_LEN) else {
            return false;
        };
        if (hi, lo) != (id_hi, id_lo) || src.len() < HEADER_LEN + usize::from(padding) {
            return false;
        }
        let Some(active) = self.find(request_id) else {
            return false;
        };
        if !active.params_done || active.stdin_done {
            return false;
        }
        active.stdin_done = true;
        src.advance(HEADER_LEN + usize::from(padding));
        true
    }

    /// Takes the next event from `src`; `Ok(None)` when more bytes are needed. Records that
    /// produce no event (the spec says to ignore them, or a PARAMS record mid-stream) are
    /// consumed along the way.
    #[inline]
    pub fn decode(
        &mut self,
        src: &mut BytesMut,
    ) -> Result<Option<RequestEvent<C::Block>>, FastCgiError> {
        loop {
            if C::COPIES {
                if let Some(record) = in_place(src) {
                    if let Some(event) = self.on_in_place(record, src)? {
                        return Ok(Some(event));
                    }
                    continue;
                }
            }
            let Some(record) = self.records.decode(src)? else {
                return Ok(None);
            };
            if let Some(event) = self.on_record(record)? {
                return Ok(Some(event));
            }
        }
    }

    /// [`on_record`](Self::on_record) for a record [`in_place`] found, its content read where
    /// it lies in `src`; the record is consumed whatever comes of it, as the general path
    /// consumes it before handling it (an error ends the connection).
    fn on_in_place(
        &mut self,
        record: InPlace,
        src: &mut BytesMut,
    ) -> Result<Option<RequestEvent<C::Block>>, FastCgiError> {
        let content = src
            .get(HEADER_LEN..HEADER_LEN + record.len)
            .unwrap_or_default();
        let event = if record.begin {
            self.begin(record.request_id, content).map(Some)
        } else {
            self.params_with(record.request_id, content.is_empty(), |c| {
                c.push_slice(content)
            })
        };
        src.advance(record.total.min(src.len()));
        event
    }

    fn on_record(
        &mut self,
        record: Record,
    ) -> Result<Option<RequestEvent<C::Block>>, FastCgiError> {
        let Record {
            kind,
            request_id,
            content,
        } = record;
        match (kind, request_id) {
            (RecordType::GetValues, 0) => {
                let pairs = ParamsDecoder::decode_block(content, &self.limits)?;
                let names = pairs.into_iter().map(|(name, _)| name).collect();
                Ok(Some(RequestEvent::GetValues { names }))
            }
            (RecordType::GetValues, _) => {
                Err(FastCgiError::ManagementRequestId { kind, request_id })
            }
            (RecordType::Other(byte), _) => {
                let answer = request_id == 0 || self.is_active(request_id);
                Ok(answer.then_some(RequestEvent::UnknownType { kind: byte }))
            }
            (
                RecordType::EndRequest
                | RecordType::Stdout
                | RecordType::Stderr
                | RecordType::GetValuesResult
                | RecordType::UnknownType,
                _,
            ) => Err(FastCgiError::WrongDirection {
                kind,
                sender: Side::WebServer,
            }),
            (
                RecordType::BeginRequest
                | RecordType::AbortRequest
                | RecordType::Params
                | RecordType::Stdin
                | RecordType::Data,
                0,
            ) => Err(FastCgiError::NullRequestId { kind }),
            (RecordType::BeginRequest, _) => self.begin(request_id, &content).map(Some),
            (RecordType::AbortRequest, _) => {
                parse_abort_request(&content)?;
                Ok(self
                    .is_active(request_id)
                    .then_some(RequestEvent::Abort { request_id }))
            }
            (RecordType::Params, _) => self.params(request_id, content),
            (RecordType::Stdin | RecordType::Data, _) => self.input(kind, request_id, content),
        }
    }

    fn begin(
        &mut self,
        request_id: u16,
        content: &[u8],
    ) -> Result<RequestEvent<C::Block>, FastCgiError> {
        let (role, keep_conn) = parse_begin_request(content)?;
        if self.is_active(request_id) {
            return Err(FastCgiError::RequestAlreadyActive { request_id });
        }
        let Some(role) = Role::from_u16(role) else {
            return Ok(RequestEvent::Rejected {
                request_id,
                keep_conn,
                status: ProtocolStatus::UnknownRole,
            });
        };
        let max = self.limits.max_concurrent_requests;
        if self.active_count() >= max {
            let status = if max <= 1 {
                ProtocolStatus::CantMpxConn
            } else {
                ProtocolStatus::Overloaded
            };
            return Ok(RequestEvent::Rejected {
                request_id,
                keep_conn,
                status,
            });
        }
        let active = Active {
            request_id,
            role,
            params: self.spare.take().unwrap_or_else(|| C::new(&self.limits)),
            params_done: false,
            stdin_done: false,
            data_done: false,
        };
        if self.first.is_none() {
            self.first = Some(active);
        } else {
            self.more.push(active);
        }
        Ok(RequestEvent::Begin {
            request_id,
            role,
            keep_conn,
        })
    }

    fn find(&mut self, request_id: u16) -> Option<&mut Active<C>> {
        match &mut self.first {
            Some(a) if a.request_id == request_id => Some(a),
            _ => self.more.iter_mut().find(|a| a.request_id == request_id),
        }
    }

    fn params(
        &mut self,
        request_id: u16,
        content: Bytes,
    ) -> Result<Option<RequestEvent<C::Block>>, FastCgiError> {
        self.params_with(request_id, content.is_empty(), |c| c.push(content))
    }

    /// [`params`](Self::params) with the content fed by `push` (called only when the record
    /// is not `empty`).
    fn params_with(
        &mut self,
        request_id: u16,
        empty: bool,
        push: impl FnOnce(&mut C) -> Result<(), FastCgiError>,
    ) -> Result<Option<RequestEvent<C::Block>>, FastCgiError> {
        let Some(active) = self.find(request_id) else {
            return Ok(None);
        };
        if active.params_done {
            return Err(FastCgiError::StreamAfterEnd {
                kind: RecordType::Params,
                request_id,
            });
        }
        if !empty {
            push(&mut active.params)?;
            return Ok(None);
        }
        active.params_done = true;
        let params = active.params.finish()?;
        Ok(Some(RequestEvent::Params { request_id, params }))
    }

    /// Handles FCGI_STDIN and FCGI_DATA for a non-null request id.
    fn input(
        &mut self,
        kind: RecordType,
        request_id: u16,
        data: Bytes,
    ) -> Result<Option<RequestEvent<C::Block>>, FastCgiError> {
        let Some(active) = self.find(request_id) else {
            return Ok(None);
        };
        if !active.params_done {
            return Err(FastCgiError::StreamBeforeParams { kind, request_id });
        }
        let done = if kind == RecordType::Data {
            if active.role != Role::Filter {
                return Err(FastCgiError::DataWithoutFilterRole {
                    request_id,
                    role: active.role,
                });
            }
            &mut active.data_done
        } else {
            &mut active.stdin_done
        };
        if *done {
            return Err(FastCgiError::StreamAfterEnd { kind, request_id });
        }
        let ended = data.is_empty();
        *done = ended;
        Ok(Some(match (kind == RecordType::Data, ended) {
            (false, false) => RequestEvent::Stdin { request_id, data },
            (false, true) => RequestEvent::StdinEnd { request_id },
            (true, false) => RequestEvent::Data { request_id, data },
            (true, true) => RequestEvent::DataEnd { request_id },
        }))
    }
}

/// Appends `data` to the FCGI_STDOUT stream of `request_id`, split into records as needed.
/// Empty `data` writes nothing; [`encode_stdout_end`] ends the stream.
pub fn encode_stdout(request_id: u16, data: &[u8], dst: &mut BytesMut) {
    encode_stream(RecordType::Stdout, request_id, data, dst);
}

/// Appends the empty FCGI_STDOUT record that ends the response.
pub fn encode_stdout_end(request_id: u16, dst: &mut BytesMut) {
    encode_stream_end(RecordType::Stdout, request_id, dst);
}

/// Appends `data` to the FCGI_STDERR stream of `request_id`. Empty `data` writes nothing;
/// [`encode_stderr_end`] ends the stream.
pub fn encode_stderr(request_id: u16, data: &[u8], dst: &mut BytesMut) {
    encode_stream(RecordType::Stderr, request_id, data, dst);
}

/// Appends the empty FCGI_STDERR record that ends the error stream.
pub fn encode_stderr_end(request_id: u16, dst: &mut BytesMut) {
    encode_stream_end(RecordType::Stderr, request_id, dst);
}

/// Appends the usual end of a response in one reserve: the empty FCGI_STDOUT record, then
/// FCGI_END_REQUEST with `app_status` and REQUEST_COMPLETE.
pub fn encode_request_complete(request_id: u16, app_status: u32, dst: &mut BytesMut) {
    dst.reserve(3 * HEADER_LEN);
    encode_stdout_end(request_id, dst);
    encode_end_request(request_id, app_status, ProtocolStatus::RequestComplete, dst);
}
