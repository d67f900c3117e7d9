//! Malformed backend packets: every broken rule with the error variant it must produce,
//! and no bytes consumed on error.

use super::*;

fn packet(ty: u8, payload: &[u8]) -> Vec<u8> {
    let len = (8 + payload.len()) as u32;
    cat(&[&[0x4c, 0x53, ty, 0x00], &len.to_le_bytes(), payload])
}

/// A little-endian RESP_HEADER: count, status, int16 lengths, lines.
fn resp_header(count: i32, status: i32, lens: &[u16], lines: &[u8]) -> Vec<u8> {
    let mut p = cat(&[&count.to_le_bytes(), &status.to_le_bytes()]);
    for l in lens {
        p.extend_from_slice(&l.to_le_bytes());
    }
    p.extend_from_slice(lines);
    packet(3, &p)
}

fn ok_header() -> Vec<u8> {
    resp_header(1, 200, &[5], b"A: b\0")
}

#[test]
fn malformed_packet_headers() {
    let d = Limits::DEFAULT;
    assert_eq!(
        response_error(&[0x4c, 0x54, 7, 0, 8, 0, 0, 0], &d),
        LsapiError::BadMagic(0x4c, 0x54)
    );
    assert_eq!(
        response_error(&[0x4c, 0x53, 0, 0, 8, 0, 0, 0], &d),
        LsapiError::UnknownPacketType(0)
    );
    assert_eq!(
        response_error(&[0x4c, 0x53, 10, 0, 8, 0, 0, 0], &d),
        LsapiError::UnknownPacketType(10)
    );
    assert_eq!(
        response_error(&[0x4c, 0x53, 7, 0, 7, 0, 0, 0], &d),
        LsapiError::PacketLengthTooSmall(7)
    );
    assert_eq!(
        response_error(&[0x4c, 0x53, 7, 0, 0xff, 0xff, 0xff, 0xff], &d),
        LsapiError::PacketLengthTooSmall(-1)
    );
    // A big-endian length 8 under flag 0 reads as 0x08000000.
    assert!(matches!(
        response_error(&[0x4c, 0x53, 7, 0, 0, 0, 0, 8], &d),
        LsapiError::PacketTooLarge {
            kind: PacketType::ReqReceived,
            len: 0x0800_0000,
            ..
        }
    ));
}

#[test]
fn malformed_packet_sizes() {
    let d = Limits::DEFAULT;
    let end9 = cat(&[&ok_header(), &[0x4c, 0x53, 5, 0, 9, 0, 0, 0, 0]]);
    assert_eq!(
        response_error(&end9, &d),
        LsapiError::PayloadNotEmpty {
            kind: PacketType::RespEnd,
            len: 9
        }
    );
    assert_eq!(
        response_error(&[0x4c, 0x53, 8, 0, 12, 0, 0, 0], &d),
        LsapiError::PayloadNotEmpty {
            kind: PacketType::ConnClose,
            len: 12
        }
    );
    // Payloads above 16384 are refused from the 8 header bytes alone.
    let big = cat(&[&ok_header(), &[0x4c, 0x53, 4, 0, 0x09, 0x40, 0, 0]]);
    assert_eq!(
        response_error(&big, &d),
        LsapiError::PacketTooLarge {
            kind: PacketType::RespStream,
            len: 16393,
            max: 16392
        }
    );
    for (ty, kind) in [(6, PacketType::StderrStream), (7, PacketType::ReqReceived)] {
        assert_eq!(
            response_error(&[0x4c, 0x53, ty, 0, 0x09, 0x40, 0, 0], &d),
            LsapiError::PacketTooLarge {
                kind,
                len: 16393,
                max: 16392
            }
        );
    }
    // RESP_HEADER payload above 65535: total 65544 = 0x10008.
    assert_eq!(
        response_error(&[0x4c, 0x53, 3, 0, 0x08, 0x00, 0x01, 0], &d),
        LsapiError::PacketTooLarge {
            kind: PacketType::RespHeader,
            len: 65544,
            max: 65543
        }
    );
    assert_eq!(
        response_error(&packet(3, &[0; 4]), &d),
        LsapiError::RespHeaderSizeMismatch {
            needed: 8,
            actual: 4
        }
    );
    let small = Limits {
        max_packet_len: 100,
        ..Limits::DEFAULT
    };
    let stream = cat(&[&ok_header(), &packet(4, &[b'x'; 93])]);
    assert_eq!(
        response_error(&stream, &small),
        LsapiError::PacketTooLarge {
            kind: PacketType::RespStream,
            len: 101,
            max: 100
        }
    );
}

#[test]
fn malformed_sequences() {
    let d = Limits::DEFAULT;
    assert_eq!(
        response_error(&packet(4, b"x"), &d),
        LsapiError::StreamBeforeHeader
    );
    assert_eq!(
        response_error(&packet(5, b""), &d),
        LsapiError::EndBeforeHeader
    );
    assert_eq!(
        response_error(&cat(&[&ok_header(), &ok_header()]), &d),
        LsapiError::HeaderTwice
    );
    assert_eq!(
        response_error(&cat(&[&ok_header(), &packet(7, b"")]), &d),
        LsapiError::AckDuringResponse
    );
    assert_eq!(
        response_error(&cat(&[&packet(8, b""), &packet(7, b"")]), &d),
        LsapiError::PacketAfterConnClose(PacketType::ReqReceived)
    );
    for (ty, kind) in [
        (1, PacketType::BeginRequest),
        (2, PacketType::AbortRequest),
        (9, PacketType::InternalError),
    ] {
        assert_eq!(
            response_error(&packet(ty, b""), &d),
            LsapiError::UnexpectedPacket {
                kind,
                direction: "backend to server"
            }
        );
    }
}

#[test]
fn malformed_resp_header_contents() {
    let d = Limits::DEFAULT;
    assert_eq!(
        response_error(&resp_header(-1, 200, &[], b""), &d),
        LsapiError::NegativeHeaderCount(-1)
    );
    let one = Limits {
        max_response_headers: 1,
        ..Limits::DEFAULT
    };
    assert_eq!(
        response_error(&resp_header(2, 200, &[2, 2], b"a\0b\0"), &one),
        LsapiError::TooManyResponseHeaders { count: 2, max: 1 }
    );
    for status in [42, -1, 1000, 99] {
        assert_eq!(
            response_error(&resp_header(0, status, &[], b""), &d),
            LsapiError::BadStatus(i64::from(status))
        );
    }
    assert_eq!(
        response_error(&resp_header(1, 200, &[0], b""), &d),
        LsapiError::EmptyHeaderLine { index: 0 }
    );
    assert_eq!(
        response_error(&resp_header(2, 200, &[5, 3], b"A: b\0C:d"), &d),
        LsapiError::HeaderLineNotNulTerminated { index: 1 }
    );
    assert_eq!(
        response_error(&resp_header(1, 200, &[5], b"A\0 b\0"), &d),
        LsapiError::HeaderLineContainsNul { index: 0 }
    );
    // One byte more than the lines need; lengths running past the packet; a length array
    // running past the packet.
    assert_eq!(
        response_error(&resp_header(1, 200, &[5], b"A: b\0\0"), &d),
        LsapiError::RespHeaderSizeMismatch {
            needed: 15,
            actual: 16
        }
    );
    assert_eq!(
        response_error(&resp_header(1, 200, &[9], b"A: b\0"), &d),
        LsapiError::RespHeaderSizeMismatch {
            needed: 19,
            actual: 15
        }
    );
    assert_eq!(
        response_error(&resp_header(3, 200, &[5], b""), &d),
        LsapiError::RespHeaderSizeMismatch {
            needed: 14,
            actual: 10
        }
    );
    let short = Limits {
        max_name_len: 3,
        max_value_len: 4,
        ..Limits::DEFAULT
    };
    assert_eq!(
        response_error(&resp_header(1, 200, &[8], b"Name: v\0"), &short),
        LsapiError::NameTooLong {
            what: "response header",
            len: 4,
            max: 3
        }
    );
    assert_eq!(
        response_error(&resp_header(1, 200, &[9], b"N: value\0"), &short),
        LsapiError::ValueTooLong {
            what: "response header",
            len: 6,
            max: 4
        }
    );
}

/// With partial streams a RESP_STREAM packet's payload goes out before the packet is whole,
/// so its header's checks must come first: an oversized packet, and one before RESP_HEADER,
/// are refused with only their header and a few payload bytes buffered, nothing handed out
/// and nothing consumed.
#[test]
fn a_partial_stream_is_checked_before_its_first_byte_goes_out() {
    let mut oversized = ok_header();
    oversized.extend_from_slice(&cat(&[&[0x4c, 0x53, 4, 0], &(8 + 16385u32).to_le_bytes()]));
    oversized.extend_from_slice(b"abc");
    let mut dec = ResponseDecoder::new(&Limits::DEFAULT)
        .with_flag_rule(FlagRule::Literal)
        .partial_streams(true);
    let mut src = BytesMut::from(&oversized[..]);
    assert!(matches!(
        dec.decode(&mut src),
        Ok(Some(ResponseEvent::Header(_)))
    ));
    let err = dec.decode(&mut src).unwrap_err();
    assert!(
        matches!(err, LsapiError::PacketTooLarge { len: 16393, .. }),
        "{err:?}"
    );
    assert_eq!(src.len(), 11);

    let early = cat(&[&[0x4c, 0x53, 4, 0], &(8 + 100u32).to_le_bytes(), b"abc"]);
    let mut dec = ResponseDecoder::new(&Limits::DEFAULT)
        .with_flag_rule(FlagRule::Literal)
        .partial_streams(true);
    let mut src = BytesMut::from(&early[..]);
    assert_eq!(
        dec.decode_text(&mut src).unwrap_err(),
        LsapiError::StreamBeforeHeader
    );
    assert_eq!(src.len(), 11);
}

/// A partial stream ends at its packet's length: the bytes after it are the next packet's,
/// decoded as such, whatever they look like.
#[test]
fn a_partial_stream_stops_at_its_packets_end() {
    let mut bytes = ok_header();
    bytes.extend_from_slice(&packet(4, b"0123456789"));
    bytes.extend_from_slice(&packet(5, b""));
    let mut dec = ResponseDecoder::new(&Limits::DEFAULT)
        .with_flag_rule(FlagRule::Literal)
        .partial_streams(true);
    let head_len = ok_header().len();
    // The header and 4 payload bytes, then the rest and RESP_END in one read.
    let mut src = BytesMut::from(&bytes[..head_len + 8 + 4]);
    assert!(matches!(
        dec.decode(&mut src),
        Ok(Some(ResponseEvent::Header(_)))
    ));
    assert_eq!(
        dec.decode(&mut src).unwrap(),
        Some(ResponseEvent::Stream(Bytes::from_static(b"0123")))
    );
    assert_eq!(dec.decode(&mut src).unwrap(), None);
    assert!(src.is_empty());
    src.extend_from_slice(&bytes[head_len + 12..]);
    assert_eq!(
        dec.decode(&mut src).unwrap(),
        Some(ResponseEvent::Stream(Bytes::from_static(b"456789")))
    );
    assert_eq!(dec.decode(&mut src).unwrap(), Some(ResponseEvent::End));
    assert!(src.is_empty());
}
