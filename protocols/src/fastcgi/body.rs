//! The fixed-size bodies of FastCGI's discrete records (BEGIN_REQUEST, END_REQUEST,
//! UNKNOWN_TYPE, ABORT_REQUEST) and the role and protocol-status values they carry.

use bytes::{BufMut, BytesMut};

use super::record::{RecordHeader, HEADER_LEN};
use super::{FastCgiError, RecordType};

/// Content bytes of FCGI_BEGIN_REQUEST: role (2), flags (1), reserved (5).
pub const BEGIN_REQUEST_BODY_LEN: usize = 8;
/// Content bytes of FCGI_END_REQUEST: appStatus (4), protocolStatus (1), reserved (3).
pub const END_REQUEST_BODY_LEN: usize = 8;
/// Content bytes of FCGI_UNKNOWN_TYPE: type (1), reserved (7).
pub const UNKNOWN_TYPE_BODY_LEN: usize = 8;
/// Content bytes of FCGI_ABORT_REQUEST: none.
pub const ABORT_REQUEST_BODY_LEN: usize = 0;
/// The flags bit of FCGI_BEGIN_REQUEST asking the application to keep the connection open
/// after the request (FCGI_KEEP_CONN).
pub const KEEP_CONN: u8 = 1;

/// The role a FCGI_BEGIN_REQUEST asks the application to play.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Role {
    /// FCGI_RESPONDER (1): answer an HTTP request, like a CGI/1.1 program.
    Responder,
    /// FCGI_AUTHORIZER (2): decide whether a request is authorized.
    Authorizer,
    /// FCGI_FILTER (3): answer with a filtered version of the FCGI_DATA stream.
    Filter,
}

impl Role {
    /// The role for a wire value, or `None` for a role FastCGI 1.0 does not define.
    pub const fn from_u16(value: u16) -> Option<Role> {
        match value {
            1 => Some(Role::Responder),
            2 => Some(Role::Authorizer),
            3 => Some(Role::Filter),
            _ => None,
        }
    }

    /// The wire value.
    pub const fn as_u16(self) -> u16 {
        match self {
            Role::Responder => 1,
            Role::Authorizer => 2,
            Role::Filter => 3,
        }
    }
}

impl std::fmt::Display for Role {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Role::Responder => "RESPONDER",
            Role::Authorizer => "AUTHORIZER",
            Role::Filter => "FILTER",
        })
    }
}

/// How a request ended, from FCGI_END_REQUEST's protocolStatus.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ProtocolStatus {
    /// FCGI_REQUEST_COMPLETE (0): the request ran to its end.
    RequestComplete,
    /// FCGI_CANT_MPX_CONN (1): refused, the application serves one request per connection.
    CantMpxConn,
    /// FCGI_OVERLOADED (2): refused, the application ran out of some resource.
    Overloaded,
    /// FCGI_UNKNOWN_ROLE (3): refused, the application does not play the requested role.
    UnknownRole,
}

impl ProtocolStatus {
    /// The status for a wire value, or `None` for one FastCGI 1.0 does not define.
    pub const fn from_u8(value: u8) -> Option<ProtocolStatus> {
        match value {
            0 => Some(ProtocolStatus::RequestComplete),
            1 => Some(ProtocolStatus::CantMpxConn),
            2 => Some(ProtocolStatus::Overloaded),
            3 => Some(ProtocolStatus::UnknownRole),
            _ => None,
        }
    }

    /// The wire value.
    pub const fn as_u8(self) -> u8 {
        match self {
            ProtocolStatus::RequestComplete => 0,
            ProtocolStatus::CantMpxConn => 1,
            ProtocolStatus::Overloaded => 2,
            ProtocolStatus::UnknownRole => 3,
        }
    }
}

impl std::fmt::Display for ProtocolStatus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            ProtocolStatus::RequestComplete => "REQUEST_COMPLETE",
            ProtocolStatus::CantMpxConn => "CANT_MPX_CONN",
            ProtocolStatus::Overloaded => "OVERLOADED",
            ProtocolStatus::UnknownRole => "UNKNOWN_ROLE",
        })
    }
}

/// The body of a discrete record, checked to be exactly `expected` bytes.
fn fixed<const N: usize>(kind: RecordType, content: &[u8]) -> Result<[u8; N], FastCgiError> {
    <[u8; N]>::try_from(content).map_err(|_| FastCgiError::BodyLength {
        kind,
        len: content.len(),
        expected: N,
    })
}

/// Parses FCGI_BEGIN_REQUEST's body into the raw role value and the FCGI_KEEP_CONN flag. Flag
/// bits other than FCGI_KEEP_CONN and the reserved bytes are ignored, as senders zero them.
pub(crate) fn parse_begin_request(content: &[u8]) -> Result<(u16, bool), FastCgiError> {
    let [role_hi, role_lo, flags, ..] =
        fixed::<BEGIN_REQUEST_BODY_LEN>(RecordType::BeginRequest, content)?;
    Ok((
        u16::from_be_bytes([role_hi, role_lo]),
        flags & KEEP_CONN != 0,
    ))
}

/// Parses FCGI_END_REQUEST's body into the application status and protocol status.
pub(crate) fn parse_end_request(content: &[u8]) -> Result<(u32, ProtocolStatus), FastCgiError> {
    let [a3, a2, a1, a0, status, ..] =
        fixed::<END_REQUEST_BODY_LEN>(RecordType::EndRequest, content)?;
    let protocol_status =
        ProtocolStatus::from_u8(status).ok_or(FastCgiError::UnknownProtocolStatus { status })?;
    Ok((u32::from_be_bytes([a3, a2, a1, a0]), protocol_status))
}

/// Parses FCGI_UNKNOWN_TYPE's body into the type byte it reports.
pub(crate) fn parse_unknown_type(content: &[u8]) -> Result<u8, FastCgiError> {
    let [kind, ..] = fixed::<UNKNOWN_TYPE_BODY_LEN>(RecordType::UnknownType, content)?;
    Ok(kind)
}

/// Checks FCGI_ABORT_REQUEST's body, which is empty.
pub(crate) fn parse_abort_request(content: &[u8]) -> Result<(), FastCgiError> {
    fixed::<ABORT_REQUEST_BODY_LEN>(RecordType::AbortRequest, content).map(|_| ())
}

/// Appends a record whose body is 8 bytes (so it needs no padding).
fn put_fixed(kind: RecordType, request_id: u16, body: [u8; 8], dst: &mut BytesMut) {
    dst.reserve(HEADER_LEN + body.len());
    RecordHeader::new(kind, request_id, body.len() as u16).encode(dst);
    dst.put_slice(&body);
}

/// Appends FCGI_BEGIN_REQUEST for `request_id` (never 0) asking for `role`, with
/// FCGI_KEEP_CONN set when `keep_conn` is true.
pub fn encode_begin_request(request_id: u16, role: Role, keep_conn: bool, dst: &mut BytesMut) {
    let [role_hi, role_lo] = role.as_u16().to_be_bytes();
    let flags = if keep_conn { KEEP_CONN } else { 0 };
    let body = [role_hi, role_lo, flags, 0, 0, 0, 0, 0];
    put_fixed(RecordType::BeginRequest, request_id, body, dst);
}

/// Appends FCGI_END_REQUEST for `request_id` with the application's exit status and the
/// protocol status.
pub fn encode_end_request(
    request_id: u16,
    app_status: u32,
    protocol_status: ProtocolStatus,
    dst: &mut BytesMut,
) {
    let [a3, a2, a1, a0] = app_status.to_be_bytes();
    let body = [a3, a2, a1, a0, protocol_status.as_u8(), 0, 0, 0];
    put_fixed(RecordType::EndRequest, request_id, body, dst);
}

/// Appends the management record FCGI_UNKNOWN_TYPE reporting the type byte `kind`.
pub fn encode_unknown_type(kind: u8, dst: &mut BytesMut) {
    let body = [kind, 0, 0, 0, 0, 0, 0, 0];
    put_fixed(RecordType::UnknownType, 0, body, dst);
}

/// Appends FCGI_ABORT_REQUEST for `request_id` (an empty record).
pub fn encode_abort_request(request_id: u16, dst: &mut BytesMut) {
    RecordHeader::new(RecordType::AbortRequest, request_id, 0).encode(dst);
}
