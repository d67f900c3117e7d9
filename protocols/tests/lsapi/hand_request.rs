//! The BEGIN_REQUEST written by hand from LSAPI.md section 2, in both byte orders: its bytes,
//! the builder calls that must reproduce them, the request the parser must read from them, and
//! the little-endian packet with one field replaced. The cases of `request.rs` start from it,
//! and `view_error` in `lsapi.rs` decodes it first so that a stale view would show.

use super::*;

// Layout of the hand-written request (offsets from the packet start):
//   0..44    request header           44..67   special env (1 pair)   67..71  terminator
//   71..168  env (4 pairs)            168..172 terminator             172..176 padding
//   176..328 known-header index       328..344 one unknown-header entry
//   344..415 raw head (71 bytes)      then the 5-byte body "hello"

/// `"\x01\x01display_errors" = "1"`: key length 16+1, value length 1+1, always big-endian.
const SPECIAL_ENV: &[u8] = b"\x00\x11\x00\x02\x01\x01display_errors\x001\x00";
const ENV: [&[u8]; 4] = [
    // SCRIPT_FILENAME=/t/a.php: lengths 15+1, 8+1; value at 71+4+16 = 91
    b"\x00\x10\x00\x09SCRIPT_FILENAME\0/t/a.php\0",
    // SCRIPT_NAME=/a.php: lengths 12, 7; pair at 100, value at 116
    b"\x00\x0c\x00\x07SCRIPT_NAME\0/a.php\0",
    // QUERY_STRING=x=1: lengths 13, 4; pair at 123, value at 140
    b"\x00\x0d\x00\x04QUERY_STRING\0x=1\0",
    // REQUEST_METHOD=POST: lengths 15, 5; pair at 144, value at 163; ends at 168
    b"\x00\x0f\x00\x05REQUEST_METHOD\0POST\0",
];
/// 71 bytes. Offsets inside: Host value 32 (len 1); X-Custom name 35 (len 8), value 45
/// (len 3); Content-Length value 66 (len 1).
const HEAD: &[u8] =
    b"POST /a.php?x=1 HTTP/1.1\r\nHost: a\r\nX-Custom: yes\r\nContent-Length: 5\r\n\r\n";

pub(crate) fn hand_request_le() -> Vec<u8> {
    let mut lens = [0u8; 50];
    lens[7 * 2] = 1; // m_headerLen[H_CONTENT_LENGTH] = 1 (LE)
    lens[10 * 2] = 1; // m_headerLen[H_HOST] = 1 (LE)
    let mut offs = [0u8; 100];
    offs[7 * 4] = 66; // m_headerOff[H_CONTENT_LENGTH] = 66 (LE)
    offs[10 * 4] = 32; // m_headerOff[H_HOST] = 32 (LE)
    cat(&[
        // 'L' 'S', BEGIN_REQUEST, flag 0, m_packetLen 415 = 0x19f
        &[0x4c, 0x53, 0x01, 0x00, 0x9f, 0x01, 0x00, 0x00],
        &[71, 0, 0, 0],  // m_httpHeaderLen
        &[5, 0, 0, 0],   // m_reqBodyLen
        &[91, 0, 0, 0],  // m_scriptFileOff
        &[116, 0, 0, 0], // m_scriptNameOff
        &[140, 0, 0, 0], // m_queryStringOff
        &[163, 0, 0, 0], // m_requestMethodOff
        &[1, 0, 0, 0],   // m_cntUnknownHeaders
        &[4, 0, 0, 0],   // m_cntEnv
        &[1, 0, 0, 0],   // m_cntSpecialEnv
        SPECIAL_ENV,
        &[0, 0, 0, 0],
        ENV[0],
        ENV[1],
        ENV[2],
        ENV[3],
        &[0, 0, 0, 0], // env terminator (ends at 172)
        &[0, 0, 0, 0], // padding to 176
        &lens,
        &[0, 0], // alignment pad inside the index
        &offs,
        // unknown header: nameOff 35, nameLen 8, valueOff 45, valueLen 3
        &[35, 0, 0, 0, 8, 0, 0, 0, 45, 0, 0, 0, 3, 0, 0, 0],
        HEAD,
    ])
}

pub(crate) fn hand_request_be() -> Vec<u8> {
    let mut lens = [0u8; 50];
    lens[7 * 2 + 1] = 1;
    lens[10 * 2 + 1] = 1;
    let mut offs = [0u8; 100];
    offs[7 * 4 + 3] = 66;
    offs[10 * 4 + 3] = 32;
    cat(&[
        // flag 1: big-endian; m_packetLen 415
        &[0x4c, 0x53, 0x01, 0x01, 0x00, 0x00, 0x01, 0x9f],
        &[0, 0, 0, 71],
        &[0, 0, 0, 5],
        &[0, 0, 0, 91],
        &[0, 0, 0, 116],
        &[0, 0, 0, 140],
        &[0, 0, 0, 163],
        &[0, 0, 0, 1],
        &[0, 0, 0, 4],
        &[0, 0, 0, 1],
        SPECIAL_ENV,
        &[0, 0, 0, 0],
        ENV[0],
        ENV[1],
        ENV[2],
        ENV[3],
        &[0, 0, 0, 0],
        &[0, 0, 0, 0],
        &lens,
        &[0, 0],
        &offs,
        &[0, 0, 0, 35, 0, 0, 0, 8, 0, 0, 0, 45, 0, 0, 0, 3],
        HEAD,
    ])
}

pub(crate) fn build_hand_request(order: ByteOrder) -> Result<BytesMut, LsapiError> {
    let rb = RequestBuilder::new(&Limits::DEFAULT, b"POST /a.php?x=1 HTTP/1.1")?;
    fill_hand_request(rb.with_byte_order(order, FlagRule::Literal))
}

/// Pushes the hand-written request into `rb` (started with its request line) and encodes it.
pub(crate) fn fill_hand_request(mut rb: RequestBuilder) -> Result<BytesMut, LsapiError> {
    // Env first, special env after: the builder still puts the special list first.
    rb.env(b"SCRIPT_FILENAME", b"/t/a.php")?;
    rb.env(b"SCRIPT_NAME", b"/a.php")?;
    rb.header(b"Host", b"a")?;
    rb.env(b"QUERY_STRING", b"x=1")?;
    rb.env(b"REQUEST_METHOD", b"POST")?;
    rb.header(b"X-Custom", b"yes")?;
    rb.header(b"Content-Length", b"5")?;
    rb.special_env(b"\x01\x01display_errors", b"1")?;
    rb.body_len(5);
    let mut out = BytesMut::new();
    rb.encode(&mut out)?;
    Ok(out)
}

pub(crate) fn expected_hand_request(order: ByteOrder) -> BeginRequest {
    BeginRequest {
        order,
        special_env: vec![(b("\x01\x01display_errors"), b("1"))],
        env: vec![
            (b("SCRIPT_FILENAME"), b("/t/a.php")),
            (b("SCRIPT_NAME"), b("/a.php")),
            (b("QUERY_STRING"), b("x=1")),
            (b("REQUEST_METHOD"), b("POST")),
        ],
        script_filename: Some(b("/t/a.php")),
        script_name: Some(b("/a.php")),
        query_string: Some(b("x=1")),
        request_method: Some(b("POST")),
        head: Bytes::from_static(HEAD),
        headers: vec![
            (b("Host"), b("a")),
            (b("X-Custom"), b("yes")),
            (b("Content-Length"), b("5")),
        ],
        body_len: 5,
    }
}

/// The LE hand request with the int32 at `at` replaced.
pub(crate) fn with_i32(at: usize, v: i32) -> Vec<u8> {
    let mut r = hand_request_le();
    r[at..at + 4].copy_from_slice(&v.to_le_bytes());
    r
}

pub(crate) fn with_byte(at: usize, v: u8) -> Vec<u8> {
    let mut r = hand_request_le();
    r[at] = v;
    r
}
