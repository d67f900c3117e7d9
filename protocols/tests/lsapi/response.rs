//! Responses: the worked example of LSAPI.md section 7 and other packets written by hand
//! in both byte orders, decoded by the client role and reproduced by the backend-role
//! encoder.

use super::*;

/// LSAPI.md section 7: lsphp 8.2.32's answer to GET hello.php, x86-64, little-endian.
fn worked_example_response() -> Vec<u8> {
    cat(&[
        // REQ_RECEIVED: 'L' 'S', type 7, flag 0 (LE), len 8
        &[0x4c, 0x53, 0x07, 0x00, 0x08, 0x00, 0x00, 0x00],
        // RESP_HEADER: type 3, len 84
        &[0x4c, 0x53, 0x03, 0x00, 0x54, 0x00, 0x00, 0x00],
        // m_cntHeaders 2, m_status 200
        &[0x02, 0x00, 0x00, 0x00, 0xc8, 0x00, 0x00, 0x00],
        // int16 lengths 25 and 39, NUL included
        &[0x19, 0x00, 0x27, 0x00],
        b"X-Powered-By: PHP/8.2.32\0",
        b"Content-type: text/html; charset=UTF-8\0",
        // RESP_STREAM: type 4, len 43
        &[0x4c, 0x53, 0x04, 0x00, 0x2b, 0x00, 0x00, 0x00],
        b"Hello, world from litespeed 8.2.32\n",
        // RESP_END: type 5, len 8
        &[0x4c, 0x53, 0x05, 0x00, 0x08, 0x00, 0x00, 0x00],
    ])
}

#[test]
fn worked_example_response_decodes() {
    let bytes = worked_example_response();
    assert_eq!(bytes.len(), 143);
    let events = decode_response(&bytes).unwrap();
    assert_eq!(
        events,
        vec![
            ResponseEvent::ReqReceived,
            ResponseEvent::Header(ResponseHead {
                status: 200,
                lines: vec![
                    b("X-Powered-By: PHP/8.2.32"),
                    b("Content-type: text/html; charset=UTF-8"),
                ],
            }),
            ResponseEvent::Stream(b("Hello, world from litespeed 8.2.32\n")),
            ResponseEvent::End,
        ]
    );
    let fields: Vec<_> = head(&events[1]).fields().collect();
    assert_eq!(
        fields,
        vec![
            (b("X-Powered-By"), b("PHP/8.2.32")),
            (b("Content-type"), b("text/html; charset=UTF-8")),
        ]
    );
}

#[test]
fn worked_example_response_every_split_point() {
    let bytes = worked_example_response();
    let whole = decode_response(&bytes).unwrap();
    for i in 0..=bytes.len() {
        for j in i..=bytes.len() {
            let mut dec = ResponseDecoder::new(&Limits::DEFAULT).with_flag_rule(FlagRule::Literal);
            assert_eq!(response_events(&mut dec, &bytes, &[i, j]).unwrap(), whole);
        }
    }
}

/// A big-endian backend (flag 1): the PID packet, stderr before the header, a 404 with two
/// Set-Cookie lines (one in the `Name:value` form of LSAPI_AppendRespHeader2_r), a body,
/// RESP_END and CONN_CLOSE.
fn big_endian_response() -> Vec<u8> {
    cat(&[
        // STDERR_STREAM, flag 1, len 16 (BE): "\0PID" + pid 0x00012345 (BE)
        &[0x4c, 0x53, 0x06, 0x01, 0x00, 0x00, 0x00, 0x10],
        &[0x00, b'P', b'I', b'D', 0x00, 0x01, 0x23, 0x45],
        // STDERR_STREAM, len 8 + 5
        &[0x4c, 0x53, 0x06, 0x01, 0x00, 0x00, 0x00, 0x0d],
        b"oops\n",
        // RESP_HEADER, len 8 + 8 + 2*2 + 15 + 16 = 51 = 0x33
        &[0x4c, 0x53, 0x03, 0x01, 0x00, 0x00, 0x00, 0x33],
        // m_cntHeaders 2, m_status 404 (0x194), big-endian
        &[0x00, 0x00, 0x00, 0x02, 0x00, 0x00, 0x01, 0x94],
        // line lengths 15 and 16 (NUL included), big-endian
        &[0x00, 0x0f, 0x00, 0x10],
        b"Set-Cookie:a=1\0",
        b"Set-Cookie: b=2\0",
        // RESP_STREAM, len 8 + 3
        &[0x4c, 0x53, 0x04, 0x01, 0x00, 0x00, 0x00, 0x0b],
        b"404",
        // RESP_END, then CONN_CLOSE
        &[0x4c, 0x53, 0x05, 0x01, 0x00, 0x00, 0x00, 0x08],
        &[0x4c, 0x53, 0x08, 0x01, 0x00, 0x00, 0x00, 0x08],
    ])
}

#[test]
fn big_endian_response_decodes() {
    let bytes = big_endian_response();
    let mut dec = ResponseDecoder::new(&Limits::DEFAULT).with_flag_rule(FlagRule::Literal);
    let events = response_events(&mut dec, &bytes, &[]).unwrap();
    assert_eq!(
        events,
        vec![
            ResponseEvent::Pid(0x12345),
            ResponseEvent::Stderr(b("oops\n")),
            ResponseEvent::Header(ResponseHead {
                status: 404,
                lines: vec![b("Set-Cookie:a=1"), b("Set-Cookie: b=2")],
            }),
            ResponseEvent::Stream(b("404")),
            ResponseEvent::End,
            ResponseEvent::ConnClose,
        ]
    );
    assert!(dec.is_closed());
    let fields: Vec<_> = head(&events[2]).fields().collect();
    assert_eq!(
        fields,
        vec![(b("Set-Cookie"), b("a=1")), (b("Set-Cookie"), b("b=2"))]
    );
    // Under the inverted rule (LiteSpeed built for a little-endian CPU other than x86)
    // flag 1 means little-endian, so the same first packet declares 0x10000000 bytes.
    let mut inv = ResponseDecoder::new(&Limits::DEFAULT).with_flag_rule(FlagRule::Inverted);
    let err = inv.decode(&mut BytesMut::from(&bytes[..])).unwrap_err();
    assert!(
        matches!(
            err,
            LsapiError::PacketTooLarge {
                len: 0x1000_0000,
                ..
            }
        ),
        "{err:?}"
    );
}

#[test]
fn inverted_flag_rule_reads_flag_one_as_little_endian() {
    // What an aarch64 lsphp sends: flag 1 (its compile-time "BIG"), native little-endian.
    let bytes = cat(&[
        // RESP_HEADER, flag 1, len 16 (LE), no lines, status 200 (LE)
        &[0x4c, 0x53, 0x03, 0x01, 0x10, 0x00, 0x00, 0x00],
        &[0, 0, 0, 0, 200, 0, 0, 0],
        // RESP_STREAM, flag 1, len 10 (LE)
        &[0x4c, 0x53, 0x04, 0x01, 0x0a, 0x00, 0x00, 0x00],
        b"hi",
    ]);
    let mut dec = ResponseDecoder::new(&Limits::DEFAULT).with_flag_rule(FlagRule::Inverted);
    let events = response_events(&mut dec, &bytes, &[]).unwrap();
    assert_eq!(head(&events[0]).status, 200);
    assert_eq!(events[1], ResponseEvent::Stream(b("hi")));
    assert_eq!(FlagRule::Inverted.order_of(1), ByteOrder::Little);
    assert_eq!(FlagRule::Literal.order_of(1), ByteOrder::Big);
    assert_eq!(FlagRule::Literal.flag_for(ByteOrder::Little), 0);
    assert_eq!(FlagRule::Inverted.flag_for(ByteOrder::Little), 1);
    #[cfg(target_arch = "x86_64")]
    assert_eq!(FlagRule::HOST, FlagRule::Literal);
}

#[test]
fn stderr_that_only_looks_like_pid_is_text() {
    // A 12-byte payload starting with "\0PID" is not the 8-byte pid form.
    let bytes = cat(&[
        &[0x4c, 0x53, 0x06, 0x00, 0x14, 0x00, 0x00, 0x00],
        b"\0PID\x01\x00\x00\x00more",
    ]);
    assert_eq!(
        decode_response(&bytes).unwrap(),
        vec![ResponseEvent::Stderr(Bytes::from_static(
            b"\0PID\x01\x00\x00\x00more"
        ))]
    );
    // The little-endian pid form: pid 12345 = 0x3039.
    let pid = [
        0x4c, 0x53, 0x06, 0x00, 0x10, 0, 0, 0, //
        0, b'P', b'I', b'D', 0x39, 0x30, 0, 0,
    ];
    assert_eq!(
        decode_response(&pid).unwrap(),
        vec![ResponseEvent::Pid(12345)]
    );
}

#[test]
fn req_received_payload_is_skipped_and_lone_conn_close_is_accepted() {
    // OpenLiteSpeed reads and ignores a REQ_RECEIVED payload; a prefork lsphp may send a
    // lone CONN_CLOSE between requests.
    let bytes = [
        0x4c, 0x53, 0x07, 0x00, 0x0a, 0x00, 0x00, 0x00, 0xaa, 0xbb, //
        0x4c, 0x53, 0x08, 0x00, 0x08, 0x00, 0x00, 0x00,
    ];
    assert_eq!(
        decode_response(&bytes).unwrap(),
        vec![ResponseEvent::ReqReceived, ResponseEvent::ConnClose]
    );
}

#[test]
fn partial_packets_consume_nothing() {
    let bytes = worked_example_response();
    let mut dec = ResponseDecoder::new(&Limits::DEFAULT).with_flag_rule(FlagRule::Literal);
    let mut src = BytesMut::from(&bytes[..8 + 20]);
    assert_eq!(
        dec.decode(&mut src).unwrap(),
        Some(ResponseEvent::ReqReceived)
    );
    assert_eq!(dec.decode(&mut src).unwrap(), None);
    assert_eq!(src.len(), 20);
    assert!(!dec.in_body());
    let mut hdr_only = BytesMut::from(&bytes[..5]);
    assert_eq!(dec.decode(&mut hdr_only).unwrap(), None);
    assert_eq!(hdr_only.len(), 5);
}

#[test]
fn encoder_reproduces_the_worked_example() {
    let enc = ResponseEncoder::new(ByteOrder::Little, FlagRule::Literal);
    let mut out = BytesMut::new();
    enc.req_received(&mut out);
    enc.header(
        200,
        &[
            ("X-Powered-By", "PHP/8.2.32"),
            ("Content-type", "text/html; charset=UTF-8"),
        ],
        &mut out,
    )
    .unwrap();
    enc.stream(b"Hello, world from litespeed 8.2.32\n", &mut out);
    enc.end(&mut out);
    assert_eq!(&out[..], &worked_example_response()[..]);
}

#[test]
fn encoder_big_endian_pid_and_close() {
    let enc = ResponseEncoder::new(ByteOrder::Big, FlagRule::Literal);
    let mut out = BytesMut::new();
    enc.pid(0x12345, &mut out);
    enc.stderr(b"oops\n", &mut out);
    enc.header::<&str, &str>(404, &[], &mut out).unwrap();
    enc.end(&mut out);
    enc.conn_close(&mut out);
    assert_eq!(
        &out[..],
        &cat(&[
            &big_endian_response()[..16 + 13],
            // RESP_HEADER, len 16, 0 lines, status 404
            &[0x4c, 0x53, 0x03, 0x01, 0, 0, 0, 0x10, 0, 0, 0, 0, 0, 0, 0x01, 0x94],
            &[0x4c, 0x53, 0x05, 0x01, 0x00, 0x00, 0x00, 0x08],
            &[0x4c, 0x53, 0x08, 0x01, 0x00, 0x00, 0x00, 0x08],
        ])[..]
    );
}

#[test]
fn encoder_splits_large_streams_and_avoids_fake_pid() {
    let enc = ResponseEncoder::new(ByteOrder::Little, FlagRule::Literal);
    let body: Vec<u8> = (0..40_000u32).map(|i| (i % 251) as u8).collect();
    let mut out = BytesMut::new();
    enc.header::<&str, &str>(200, &[], &mut out).unwrap();
    enc.stream(&body, &mut out);
    enc.stream(b"", &mut out);
    enc.stderr(b"\0PIDabcd", &mut out);
    enc.end(&mut out);
    let events = decode_response(&out).unwrap();
    let sizes: Vec<usize> = events
        .iter()
        .filter_map(|e| match e {
            ResponseEvent::Stream(b) => Some(b.len()),
            _ => None,
        })
        .collect();
    assert_eq!(sizes, vec![16384, 16384, 40_000 - 2 * 16384]);
    let joined: Vec<u8> = events
        .iter()
        .filter_map(|e| match e {
            ResponseEvent::Stream(b) => Some(b.to_vec()),
            _ => None,
        })
        .collect::<Vec<_>>()
        .concat();
    assert_eq!(joined, body);
    let stderr: Vec<_> = events
        .iter()
        .filter(|e| matches!(e, ResponseEvent::Stderr(_) | ResponseEvent::Pid(_)))
        .collect();
    assert_eq!(
        stderr,
        vec![
            &ResponseEvent::Stderr(b("\0PID")),
            &ResponseEvent::Stderr(b("abcd"))
        ]
    );
    let mut hdr = BytesMut::new();
    enc.stream_header(16384, &mut hdr).unwrap();
    assert_eq!(&hdr[..], &[0x4c, 0x53, 0x04, 0x00, 0x08, 0x40, 0x00, 0x00]);
    assert!(matches!(
        enc.stream_header(16385, &mut hdr),
        Err(LsapiError::PacketTooLarge { .. })
    ));
}

#[test]
fn encoder_refuses_bad_headers() {
    let enc = ResponseEncoder::default();
    let mut out = BytesMut::new();
    assert_eq!(
        enc.header::<&str, &str>(42, &[], &mut out),
        Err(LsapiError::BadStatus(42))
    );
    let many = vec![("A", "b"); 1001];
    assert_eq!(
        enc.header(200, &many, &mut out),
        Err(LsapiError::TooManyResponseHeaders {
            count: 1001,
            max: 1000
        })
    );
    let long = "v".repeat(40_000);
    assert_eq!(
        enc.header(200, &[("A", long.as_str())], &mut out),
        Err(LsapiError::HeaderLineTooLong {
            len: 40_004,
            max: 32767
        })
    );
    let big = "v".repeat(30_000);
    let three = [
        ("A", big.as_str()),
        ("B", big.as_str()),
        ("C", big.as_str()),
    ];
    assert!(matches!(
        enc.header(200, &three, &mut out),
        Err(LsapiError::PacketTooLarge {
            kind: PacketType::RespHeader,
            ..
        })
    ));
    for bad in [("A:B", "v"), ("", "v"), ("A", "x\r\ny"), ("A", "nul\0")] {
        assert_eq!(
            enc.header(200, &[bad], &mut out),
            Err(LsapiError::InvalidHeaderBytes {
                what: "response header"
            })
        );
    }
    assert!(out.is_empty(), "a refused header writes nothing");
}

#[test]
fn packet_header_api() {
    let h = PacketHeader::parse(&[0x4c, 0x53, 4, 1, 0, 0, 0, 9, 0xff], FlagRule::Literal)
        .unwrap()
        .unwrap();
    assert_eq!(
        h,
        PacketHeader {
            kind: PacketType::RespStream,
            order: ByteOrder::Big,
            len: 9
        }
    );
    assert_eq!(h.payload_len(), 1);
    assert_eq!(
        h.to_bytes(FlagRule::Literal).unwrap(),
        [0x4c, 0x53, 4, 1, 0, 0, 0, 9]
    );
    assert_eq!(
        PacketHeader::parse(&[0x4c, 0x53], FlagRule::Literal),
        Ok(None)
    );
    // Flag bits other than bit 0 are ignored, as lsphp and OpenLiteSpeed mask them.
    let h = PacketHeader::parse(&[0x4c, 0x53, 5, 0xfe, 8, 0, 0, 0], FlagRule::Literal)
        .unwrap()
        .unwrap();
    assert_eq!(h.order, ByteOrder::Little);
    for t in 1..=9u8 {
        assert_eq!(PacketType::from_u8(t).unwrap().as_u8(), t);
    }
    assert_eq!(PacketType::RespHeader.to_string(), "RESP_HEADER");
}
