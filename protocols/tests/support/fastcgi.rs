//! What the FastCGI tests share (`fastcgi_records`, `fastcgi_pairs`, `fastcgi_request`,
//! `fastcgi_response`): feeding a decoder in any chunking, the request decoder run whole and a
//! byte at a time, the records written by hand from the specification, and the strategies for
//! generated names and values.

use bytes::{Bytes, BytesMut};
use corral_protocols::fastcgi::*;
use corral_protocols::Limits;
use proptest::prelude::*;

pub fn cat(parts: &[&[u8]]) -> Vec<u8> {
    parts.concat()
}

/// Feeds `bytes` to a decoder in pieces cut at `cuts` (positions taken modulo the length),
/// collecting every event; the first error ends the run.
pub fn feed<T>(
    bytes: &[u8],
    cuts: &[usize],
    mut step: impl FnMut(&mut BytesMut) -> Result<Option<T>, FastCgiError>,
) -> Result<Vec<T>, FastCgiError> {
    let mut points: Vec<usize> = cuts.iter().map(|c| c % (bytes.len() + 1)).collect();
    points.push(0);
    points.push(bytes.len());
    points.sort_unstable();
    let mut buf = BytesMut::new();
    let mut out = Vec::new();
    for pair in points.windows(2) {
        buf.extend_from_slice(&bytes[pair[0]..pair[1]]);
        while let Some(event) = step(&mut buf)? {
            out.push(event);
        }
    }
    assert!(buf.is_empty(), "{} bytes left undecoded", buf.len());
    Ok(out)
}

pub fn respond(bytes: &[u8], limits: &Limits) -> Result<Vec<RequestEvent>, FastCgiError> {
    let mut decoder = RequestDecoder::new(limits);
    let whole = feed(bytes, &[], |b| decoder.decode(b));
    // The same bytes one at a time must give the same answer.
    let mut decoder = RequestDecoder::new(limits);
    let cuts: Vec<usize> = (0..bytes.len()).collect();
    assert_eq!(whole, feed(bytes, &cuts, |b| decoder.decode(b)));
    whole
}

pub fn b(s: &[u8]) -> Bytes {
    Bytes::copy_from_slice(s)
}

// ---- hand-written records (header: version, type, id B1 B0, length B1 B0, padding, reserved)

/// {FCGI_BEGIN_REQUEST, 1, {FCGI_RESPONDER, FCGI_KEEP_CONN}}
pub const BEGIN_1_RESPONDER_KEEP: &[u8] = &[
    1, 1, 0, 1, 0, 8, 0, 0, // version 1, BEGIN_REQUEST, id 1, 8 content bytes, no padding
    0, 1, 1, 0, 0, 0, 0, 0, // role 1 RESPONDER, flags KEEP_CONN, 5 reserved
];
/// {FCGI_PARAMS, 1, "SCRIPT_NAME" = "/i.php"}: 19 content bytes padded by 5.
pub fn params_1_script_name() -> Vec<u8> {
    cat(&[
        &[1, 4, 0, 1, 0, 19, 5, 0], // PARAMS, id 1, 19 content bytes, 5 padding
        &[11, 6],                   // name length 11, value length 6 (1-byte forms)
        b"SCRIPT_NAME",
        b"/i.php",
        &[0, 0, 0, 0, 0], // padding
    ])
}
/// {FCGI_PARAMS, 1, ""}: end of the PARAMS stream.
pub const PARAMS_1_END: &[u8] = &[1, 4, 0, 1, 0, 0, 0, 0];
/// {FCGI_STDIN, 1, "hello"}: 5 content bytes padded by 3.
pub const STDIN_1_HELLO: &[u8] = &[
    1, 5, 0, 1, 0, 5, 3, 0, b'h', b'e', b'l', b'l', b'o', 0, 0, 0,
];
/// {FCGI_STDIN, 1, ""}: end of the request body.
pub const STDIN_1_END: &[u8] = &[1, 5, 0, 1, 0, 0, 0, 0];
/// {FCGI_STDOUT, 1, "Status: 200\r\n\r\nhi!\n"}: 19 content bytes padded by 5.
pub fn stdout_1() -> Vec<u8> {
    cat(&[
        &[1, 6, 0, 1, 0, 19, 5, 0], // STDOUT, id 1, 19 content bytes, 5 padding
        b"Status: 200\r\n\r\nhi!\n",
        &[0, 0, 0, 0, 0], // padding
    ])
}
/// {FCGI_STDERR, 1, "oops"}: 4 content bytes padded by 4.
pub const STDERR_1: &[u8] = &[1, 7, 0, 1, 0, 4, 4, 0, b'o', b'o', b'p', b's', 0, 0, 0, 0];
pub const STDOUT_1_END: &[u8] = &[1, 6, 0, 1, 0, 0, 0, 0];
pub const STDERR_1_END: &[u8] = &[1, 7, 0, 1, 0, 0, 0, 0];
/// {FCGI_END_REQUEST, 1, {0, FCGI_REQUEST_COMPLETE}}
pub const END_1_COMPLETE: &[u8] = &[
    1, 3, 0, 1, 0, 8, 0, 0, // END_REQUEST, id 1, 8 content bytes
    0, 0, 0, 0, // appStatus 0
    0, 0, 0, 0, // protocolStatus REQUEST_COMPLETE, 3 reserved
];
/// {FCGI_GET_VALUES, 0, {FCGI_MAX_CONNS, FCGI_MAX_REQS, FCGI_MPXS_CONNS}} with empty values.
pub fn get_values() -> Vec<u8> {
    cat(&[
        &[1, 9, 0, 0, 0, 48, 0, 0], // GET_VALUES, id 0, 48 content bytes, no padding
        &[14, 0],                   // name length 14, value length 0
        b"FCGI_MAX_CONNS",
        &[13, 0],
        b"FCGI_MAX_REQS",
        &[15, 0],
        b"FCGI_MPXS_CONNS",
    ])
}
/// {FCGI_GET_VALUES_RESULT, 0, {MAX_CONNS=1, MAX_REQS=1, MPXS_CONNS=0}}: 51 bytes + 5 padding.
pub fn get_values_result() -> Vec<u8> {
    cat(&[
        &[1, 10, 0, 0, 0, 51, 5, 0], // GET_VALUES_RESULT, id 0, 51 content bytes, 5 padding
        &[14, 1],                    // name length 14, value length 1
        b"FCGI_MAX_CONNS1",
        &[13, 1],
        b"FCGI_MAX_REQS1",
        &[15, 1],
        b"FCGI_MPXS_CONNS0",
        &[0, 0, 0, 0, 0], // padding
    ])
}
/// {FCGI_UNKNOWN_TYPE, 0, {12}}
pub const UNKNOWN_TYPE_12: &[u8] = &[1, 11, 0, 0, 0, 8, 0, 0, 12, 0, 0, 0, 0, 0, 0, 0];

// ---- strategies for the property tests

/// Limits wide enough for the generated names and values.
pub fn roomy() -> Limits {
    Limits {
        max_params_bytes: 1 << 20,
        max_name_len: 4096,
        ..Limits::DEFAULT
    }
}

pub fn bytes_up_to(max: usize) -> impl Strategy<Value = Vec<u8>> {
    prop::collection::vec(any::<u8>(), 0..max)
}

/// Field lengths around the 1-byte/4-byte boundary, occasionally long.
pub fn field() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![bytes_up_to(4), bytes_up_to(200), bytes_up_to(3000)]
}
