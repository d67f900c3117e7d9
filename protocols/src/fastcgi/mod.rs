//! FastCGI 1.0, both roles: the record layer ([`RecordDecoder`], [`RecordHeader`]), name-value
//! pairs ([`ParamsDecoder`], [`encode_params`]), the client role that corral plays towards a
//! backend ([`ResponseDecoder`] and the `encode_*` functions for BEGIN_REQUEST, PARAMS, STDIN,
//! ABORT_REQUEST), the responder role it plays towards a front server ([`RequestDecoder`] and
//! the encoders for STDOUT, STDERR, END_REQUEST), and the management records (GET_VALUES,
//! GET_VALUES_RESULT, UNKNOWN_TYPE).
//!
//! Records are checked the way the specification states them: version 1, a zero reserved
//! byte, fixed body sizes for discrete records, request id 0 for management records only,
//! each record type sent by one side only, and streams that end with one empty record and
//! carry nothing after it. Encoders pad every record to an 8-byte boundary and split streams
//! into records of at most [`STREAM_CHUNK_LEN`] content bytes.

mod body;
mod client;
mod error;
mod front_params;
mod management;
mod params;
mod record;
mod responder;

pub use body::{
    encode_abort_request, encode_begin_request, encode_end_request, encode_unknown_type,
    ProtocolStatus, Role, ABORT_REQUEST_BODY_LEN, BEGIN_REQUEST_BODY_LEN, END_REQUEST_BODY_LEN,
    KEEP_CONN, UNKNOWN_TYPE_BODY_LEN,
};
pub use client::{
    encode_data, encode_data_end, encode_stdin, encode_stdin_end, ResponseDecoder, ResponseEvent,
};
pub use error::{FastCgiError, Side};
pub use front_params::FrontParamsDecoder;
pub use management::{
    answer_get_values, encode_get_values, encode_get_values_result, Capabilities, MAX_CONNS,
    MAX_REQS, MPXS_CONNS,
};
pub use params::{
    encode_pair, encode_params, encode_params_block, encoded_pair_len, ParamsCollector,
    ParamsDecoder, ParamsWriter, MAX_PAIR_FIELD_LEN, MAX_SHORT_LEN,
};
pub use record::{
    encode_record, encode_stream, encode_stream_end, padding_for, stream_encoded_len, Record,
    RecordDecoder, RecordHeader, RecordType, ALIGNMENT, HEADER_LEN, MAX_CONTENT_LEN,
    MAX_PADDING_LEN, MAX_RECORD_LEN, NULL_REQUEST_ID, STREAM_CHUNK_LEN, VERSION_1,
};
pub use responder::{
    encode_request_complete, encode_stderr, encode_stderr_end, encode_stdout, encode_stdout_end,
    RequestDecoder, RequestEvent,
};
