//! FastCGI management records: the FCGI_GET_VALUES query a web server sends on request id 0,
//! the FCGI_GET_VALUES_RESULT answer, and the three variables FastCGI 1.0 defines for them.

use bytes::{BufMut, Bytes, BytesMut};

use super::params::{encode_pair, encoded_pair_len};
use super::record::{RecordHeader, HEADER_LEN, NULL_REQUEST_ID};
use super::{FastCgiError, RecordType};

/// FCGI_MAX_CONNS: transport connections the application accepts at once.
pub const MAX_CONNS: &[u8] = b"FCGI_MAX_CONNS";
/// FCGI_MAX_REQS: requests the application serves at once, over all connections.
pub const MAX_REQS: &[u8] = b"FCGI_MAX_REQS";
/// FCGI_MPXS_CONNS: "1" if the application multiplexes requests on one connection, else "0".
pub const MPXS_CONNS: &[u8] = b"FCGI_MPXS_CONNS";

/// The values of the three FastCGI 1.0 management variables; `None` means unknown (omitted
/// from an answer, or absent from a result).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Capabilities {
    /// FCGI_MAX_CONNS.
    pub max_conns: Option<u32>,
    /// FCGI_MAX_REQS.
    pub max_reqs: Option<u32>,
    /// FCGI_MPXS_CONNS.
    pub mpxs_conns: Option<bool>,
}

impl Capabilities {
    /// Reads the variables out of a FCGI_GET_VALUES_RESULT; names it does not know, and values
    /// that are not decimal numbers, are skipped (the result is advisory).
    pub fn from_pairs(pairs: &[(Bytes, Bytes)]) -> Capabilities {
        let mut caps = Capabilities::default();
        for (name, value) in pairs {
            let number = std::str::from_utf8(value)
                .ok()
                .and_then(|text| text.parse::<u32>().ok());
            match name.as_ref() {
                MAX_CONNS => caps.max_conns = number.or(caps.max_conns),
                MAX_REQS => caps.max_reqs = number.or(caps.max_reqs),
                MPXS_CONNS => caps.mpxs_conns = number.map(|n| n != 0).or(caps.mpxs_conns),
                _ => {}
            }
        }
        caps
    }

    /// The decimal value of one variable, or `None` if the name is not one of the three or its
    /// value is unknown.
    pub fn value_of(&self, name: &[u8]) -> Option<String> {
        match name {
            MAX_CONNS => self.max_conns.map(|n| n.to_string()),
            MAX_REQS => self.max_reqs.map(|n| n.to_string()),
            MPXS_CONNS => self.mpxs_conns.map(|b| u8::from(b).to_string()),
            _ => None,
        }
    }
}

/// Appends one management record whose content is the given pairs, with one reserve.
fn encode_pairs_record<N: AsRef<[u8]>, V: AsRef<[u8]>>(
    kind: RecordType,
    pairs: &[(N, V)],
    dst: &mut BytesMut,
) -> Result<(), FastCgiError> {
    let len = pairs.iter().fold(0usize, |sum, (name, value)| {
        sum.saturating_add(encoded_pair_len(name.as_ref().len(), value.as_ref().len()))
    });
    // A management record is discrete: it must fit one record.
    let Ok(content_len) = u16::try_from(len) else {
        return Err(FastCgiError::ContentTooLong { kind, len });
    };
    let header = RecordHeader::new(kind, NULL_REQUEST_ID, content_len);
    dst.reserve(HEADER_LEN + len + usize::from(header.padding_len));
    header.encode(dst);
    for (name, value) in pairs {
        encode_pair(name.as_ref(), value.as_ref(), dst)?;
    }
    dst.put_bytes(0, usize::from(header.padding_len));
    Ok(())
}

/// Appends FCGI_GET_VALUES asking for `names` (sent with empty values).
pub fn encode_get_values<N: AsRef<[u8]>>(
    names: &[N],
    dst: &mut BytesMut,
) -> Result<(), FastCgiError> {
    let pairs: Vec<(&[u8], &[u8])> = names.iter().map(|n| (n.as_ref(), &b""[..])).collect();
    encode_pairs_record(RecordType::GetValues, &pairs, dst)
}

/// Appends FCGI_GET_VALUES_RESULT carrying `values`.
pub fn encode_get_values_result<N: AsRef<[u8]>, V: AsRef<[u8]>>(
    values: &[(N, V)],
    dst: &mut BytesMut,
) -> Result<(), FastCgiError> {
    encode_pairs_record(RecordType::GetValuesResult, values, dst)
}

/// Appends the FCGI_GET_VALUES_RESULT answering a query for `names`: each name `caps` knows,
/// in the order asked, and none it does not (as the specification says).
pub fn answer_get_values<N: AsRef<[u8]>>(
    names: &[N],
    caps: &Capabilities,
    dst: &mut BytesMut,
) -> Result<(), FastCgiError> {
    let values: Vec<(&[u8], String)> = names
        .iter()
        .filter_map(|name| {
            let name = name.as_ref();
            caps.value_of(name).map(|value| (name, value))
        })
        .collect();
    encode_get_values_result(&values, dst)
}
