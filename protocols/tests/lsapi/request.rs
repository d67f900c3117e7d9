//! BEGIN_REQUEST: the packet written by hand from LSAPI.md section 2 (in `hand_request.rs`)
//! in both byte orders, the builder reproducing it byte for byte, the backend-role parser
//! reading it, and every malformed case.

use super::hand_request::*;
use super::*;

#[test]
fn builder_reproduces_hand_written_request_in_both_orders() {
    let le = hand_request_le();
    assert_eq!(le.len(), 415);
    assert_eq!(&build_hand_request(ByteOrder::Little).unwrap()[..], &le[..]);
    assert_eq!(
        &build_hand_request(ByteOrder::Big).unwrap()[..],
        &hand_request_be()[..]
    );
}

#[test]
fn restarted_builder_keeps_nothing_of_the_request_before() {
    // A first request that sets every part the hand-written one leaves different: another
    // byte order, special env, unknown headers, a known header the second lacks, a body
    // length sent as -2, and a pointed env value at other offsets.
    let mut rb = RequestBuilder::new(&Limits::DEFAULT, b"GET /other/longer/line HTTP/1.0")
        .unwrap()
        .with_byte_order(ByteOrder::Big, FlagRule::Literal);
    rb.special_env(b"\x01\x04memory_limit", b"1G").unwrap();
    rb.env(b"EXTRA", b"left over").unwrap();
    for name in POINTED_ENV {
        rb.env(name.as_bytes(), b"first").unwrap();
    }
    rb.header(b"Accept", b"*/*").unwrap();
    rb.header(b"X-One", b"1").unwrap();
    rb.header(b"X-Two", b"2").unwrap();
    rb.header(b"Content-Length", b"3000000000").unwrap();
    rb.body_len(3_000_000_000);
    rb.encode(&mut BytesMut::new()).unwrap();

    rb.restart(&Limits::DEFAULT, b"POST /a.php?x=1 HTTP/1.1")
        .unwrap();
    let again = fill_hand_request(rb.with_byte_order(ByteOrder::Little, FlagRule::Literal));
    assert_eq!(&again.unwrap()[..], &hand_request_le()[..]);
}

#[test]
fn restart_checks_the_request_line_and_the_limits_given() {
    let mut rb = builder();
    assert!(matches!(
        rb.restart(&Limits::DEFAULT, b"GET /\r\nX: y HTTP/1.1"),
        Err(LsapiError::InvalidHeaderBytes { .. })
    ));
    assert!(matches!(
        rb.restart(&Limits::DEFAULT, b""),
        Err(LsapiError::InvalidHeaderBytes { .. })
    ));
    // The limits of the restart apply, not those the builder was made with.
    let small = Limits {
        max_params_bytes: 400,
        ..Limits::DEFAULT
    };
    rb.restart(&small, b"GET / HTTP/1.1").unwrap();
    rb.env(b"A", &[b'v'; 100]).unwrap();
    assert!(rb.env(b"A", &[b'v'; 200]).is_err());
}

#[test]
fn parser_reads_hand_written_request_body_and_abort() {
    for (bytes, order) in [
        (hand_request_le(), ByteOrder::Little),
        (hand_request_be(), ByteOrder::Big),
    ] {
        // The body follows raw; ABORT_REQUEST (8 bytes) after it.
        let input = cat(&[&bytes, b"hello", &[0x4c, 0x53, 0x02, 0x00, 8, 0, 0, 0]]);
        let whole = request_events(&Limits::DEFAULT, &input, &[]).unwrap();
        assert_eq!(
            whole,
            vec![
                RequestEvent::Begin(Box::new(expected_hand_request(order))),
                RequestEvent::Body(b("hello")),
                RequestEvent::Abort,
            ]
        );
        for cut in 0..=input.len() {
            assert_eq!(
                request_events(&Limits::DEFAULT, &input, &[cut, cut + 3]).unwrap(),
                whole
            );
        }
    }
}

#[test]
fn body_chunks_never_exceed_the_declared_length() {
    // Body bytes and the next packet arrive in one read: only 5 bytes are body.
    let input = cat(&[&hand_request_le(), b"helloLS"]);
    let mut dec = RequestDecoder::new(&Limits::DEFAULT).with_flag_rule(FlagRule::Literal);
    let mut src = BytesMut::from(&input[..]);
    assert!(matches!(
        dec.decode(&mut src),
        Ok(Some(RequestEvent::Begin(_)))
    ));
    assert_eq!(dec.body_remaining(), 5);
    assert_eq!(
        dec.decode(&mut src).unwrap(),
        Some(RequestEvent::Body(b("hello")))
    );
    assert_eq!(dec.body_remaining(), 0);
    assert_eq!(dec.decode(&mut src).unwrap(), None);
    assert_eq!(&src[..], b"LS");

    // decode_body gives the same body bytes and nothing else: before a request and once
    // the body is complete it consumes nothing.
    let mut dec = RequestDecoder::new(&Limits::DEFAULT).with_flag_rule(FlagRule::Literal);
    let mut view = RequestView::new();
    let mut src = BytesMut::from(&input[..]);
    assert_eq!(dec.decode_body(&mut src), None);
    assert_eq!(src.len(), input.len());
    assert_eq!(
        dec.decode_into(&mut src, &mut view),
        Ok(Some(ViewEvent::Begin))
    );
    let mut part = src.split_off(3);
    assert_eq!(dec.decode_body(&mut src), Some(b("hel")));
    assert_eq!(dec.decode_body(&mut src), None, "nothing buffered");
    assert_eq!(dec.body_remaining(), 2);
    assert_eq!(dec.decode_body(&mut part), Some(b("lo")));
    assert_eq!(dec.decode_body(&mut part), None);
    assert_eq!(&part[..], b"LS");
}

#[test]
fn malformed_begin_request_sizes_and_fields() {
    let d = Limits::DEFAULT;
    assert_eq!(
        request_error(&with_i32(4, 43), &d),
        LsapiError::BeginRequestTooShort(43)
    );
    assert_eq!(
        request_error(&with_i32(4, 65536), &d),
        LsapiError::PacketTooLarge {
            kind: PacketType::BeginRequest,
            len: 65536,
            max: 65535
        }
    );
    let small = Limits {
        max_params_bytes: 400,
        ..Limits::DEFAULT
    };
    assert_eq!(
        request_error(&hand_request_le(), &small),
        LsapiError::PacketTooLarge {
            kind: PacketType::BeginRequest,
            len: 415,
            max: 400
        }
    );
    assert_eq!(
        request_error(&with_i32(8, -1), &d),
        LsapiError::NegativeField {
            field: "m_httpHeaderLen",
            value: -1
        }
    );
    assert_eq!(
        request_error(&with_i32(36, -1), &d),
        LsapiError::NegativeField {
            field: "m_cntEnv",
            value: -1
        }
    );
    assert_eq!(
        request_error(&with_i32(36, 8193), &d),
        LsapiError::TooManyPairs {
            what: "env pairs",
            count: 8194,
            max: 1000
        }
    );
    let four = Limits {
        max_params_count: 4,
        ..Limits::DEFAULT
    };
    assert_eq!(
        request_error(&hand_request_le(), &four),
        LsapiError::TooManyPairs {
            what: "env pairs",
            count: 5,
            max: 4
        }
    );
    assert_eq!(
        request_error(&with_i32(32, 1001), &d),
        LsapiError::TooManyPairs {
            what: "unknown headers",
            count: 1001,
            max: 1000
        }
    );
    // m_httpHeaderLen one too many: the blocks end one byte after the packet.
    assert_eq!(
        request_error(&with_i32(8, 72), &d),
        LsapiError::RequestSizeMismatch {
            declared: 415,
            actual: 416
        }
    );
    assert_eq!(
        request_error(&with_byte(172, 1), &d),
        LsapiError::NonZeroPadding
    );
}

#[test]
fn malformed_env_lists() {
    let d = Limits::DEFAULT;
    // Special env key length 0.
    let mut r = hand_request_le();
    r[44..46].copy_from_slice(&[0, 0]);
    assert_eq!(
        request_error(&r, &d),
        LsapiError::EnvLengthZero {
            list: "special env"
        }
    );
    // The NUL after the special env key (offset 44 + 4 + 16) replaced.
    assert_eq!(
        request_error(&with_byte(64, b'x'), &d),
        LsapiError::EnvNotNulTerminated {
            list: "special env"
        }
    );
    // First env key length 0xffff runs past the packet.
    let mut r = hand_request_le();
    r[71..73].copy_from_slice(&[0xff, 0xff]);
    assert_eq!(
        request_error(&r, &d),
        LsapiError::EnvListTruncated { list: "env" }
    );
    // Env terminator not zero.
    assert_eq!(
        request_error(&with_byte(168, 1), &d),
        LsapiError::EnvListNotTerminated { list: "env" }
    );
    let short = Limits {
        max_name_len: 15,
        ..Limits::DEFAULT
    };
    assert_eq!(
        request_error(&hand_request_le(), &short),
        LsapiError::NameTooLong {
            what: "special env",
            len: 16,
            max: 15
        }
    );
    let short = Limits {
        max_value_len: 7,
        ..Limits::DEFAULT
    };
    assert_eq!(
        request_error(&hand_request_le(), &short),
        LsapiError::ValueTooLong {
            what: "env",
            len: 8,
            max: 7
        }
    );
}

#[test]
fn malformed_offsets_and_header_tables() {
    let d = Limits::DEFAULT;
    for (at, field) in [(16, "m_scriptFileOff"), (28, "m_requestMethodOff")] {
        for bad in [415, -4] {
            assert_eq!(
                request_error(&with_i32(at, bad), &d),
                LsapiError::BadStringOffset {
                    field,
                    offset: bad,
                    len: 415
                }
            );
        }
    }
    // Offset of the last head byte: no NUL after it inside the packet.
    assert_eq!(
        request_error(&with_i32(24, 414), &d),
        LsapiError::BadStringOffset {
            field: "m_queryStringOff",
            offset: 414,
            len: 415
        }
    );
    // m_headerOff[H_HOST] (at 176 + 52 + 40) = 71: 71 + 1 > 71.
    for bad in [71, -1] {
        assert_eq!(
            request_error(&with_i32(268, bad), &d),
            LsapiError::KnownHeaderOutOfRange {
                index: 10,
                offset: bad,
                len: 1,
                block: 71
            }
        );
    }
    // Unknown header valueLen (at 328 + 12) = 30: 45 + 30 > 71; nameOff -1.
    for (at, v) in [(340, 30), (328, -1)] {
        assert_eq!(
            request_error(&with_i32(at, v), &d),
            LsapiError::UnknownHeaderOutOfRange {
                index: 0,
                block: 71
            }
        );
    }
    // m_headerLen[H_HOST] (at 176 + 20) = 9 ("a\r\nX-Cust", still inside the block) is
    // longer than max_value_len, which every env value passes.
    let mut r = hand_request_le();
    r[196..198].copy_from_slice(&9u16.to_le_bytes());
    let limits = Limits {
        max_value_len: 8,
        ..Limits::DEFAULT
    };
    assert_eq!(
        request_error(&r, &limits),
        LsapiError::ValueTooLong {
            what: "request header",
            len: 9,
            max: 8
        }
    );
}

#[test]
fn body_length_rules() {
    let d = Limits::DEFAULT;
    // -2: "2 GiB or more", resolved through Content-Length (here "5").
    let events = request_events(&d, &cat(&[&with_i32(12, -2), b"hello"]), &[]).unwrap();
    assert_eq!(begin(&events[0]).body_len, 5);
    // -2 without an indexed Content-Length (m_headerOff[7] at 176 + 52 + 28 cleared).
    let mut r = with_i32(12, -2);
    r[256..260].copy_from_slice(&[0, 0, 0, 0]);
    assert_eq!(request_error(&r, &d), LsapiError::MissingContentLength);
    // Any other negative length means no body, as in lsphp.
    let events = request_events(&d, &with_i32(12, -1), &[]).unwrap();
    assert_eq!(begin(&events[0]).body_len, 0);
    assert_eq!(events.len(), 1);
}

#[test]
fn offset_zero_means_absent_string() {
    let events =
        request_events(&Limits::DEFAULT, &cat(&[&with_i32(16, 0), b"hello"]), &[]).unwrap();
    assert_eq!(begin(&events[0]).script_filename, None);
}

#[test]
fn malformed_server_packets() {
    let d = Limits::DEFAULT;
    assert_eq!(
        request_error(&[0x4c, 0x53, 0x02, 0x00, 9, 0, 0, 0, 0], &d),
        LsapiError::PayloadNotEmpty {
            kind: PacketType::AbortRequest,
            len: 9
        }
    );
    assert_eq!(
        request_error(&[0x4c, 0x53, 0x05, 0x00, 8, 0, 0, 0], &d),
        LsapiError::UnexpectedPacket {
            kind: PacketType::RespEnd,
            direction: "server to backend"
        }
    );
    assert_eq!(
        request_error(&[b'G', b'E', b'T', b' ', b'/', 0, 0, 0], &d),
        LsapiError::BadMagic(b'G', b'E')
    );
}

#[test]
fn abort_encoding() {
    let mut out = BytesMut::new();
    encode_abort(ByteOrder::Little, FlagRule::Literal, &mut out);
    encode_abort(ByteOrder::Big, FlagRule::Literal, &mut out);
    assert_eq!(
        &out[..],
        &[
            0x4c, 0x53, 0x02, 0x00, 8, 0, 0, 0, //
            0x4c, 0x53, 0x02, 0x01, 0, 0, 0, 8
        ]
    );
}

// ---------------------------------------------------------------------------------------
// builder errors

fn builder() -> RequestBuilder {
    RequestBuilder::new(&Limits::DEFAULT, b"GET / HTTP/1.1")
        .unwrap()
        .with_byte_order(ByteOrder::Little, FlagRule::Literal)
}

fn with_pointed(mut rb: RequestBuilder) -> RequestBuilder {
    for name in POINTED_ENV {
        rb.env(name.as_bytes(), b"v").unwrap();
    }
    rb
}

#[test]
fn builder_refuses_what_lsapi_cannot_carry() {
    let mut rb = builder();
    rb.header(b"Cookie", b"a=1").unwrap();
    assert_eq!(
        rb.header(b"cookie", b"b=2"),
        Err(LsapiError::RepeatedKnownHeader("Cookie"))
    );
    assert_eq!(
        rb.header(b"Transfer-Encoding", b"chunked"),
        Err(LsapiError::TransferEncodingHeader)
    );
    for (name, value, what) in [
        (&b"A:B"[..], &b"v"[..], "header name"),
        (b"", b"v", "header name"),
        (b"A B\r", b"v", "header name"),
        (b"A", b"x\r\ny", "header value"),
        (b"A", b"nul\0", "header value"),
    ] {
        assert_eq!(
            rb.header(name, value),
            Err(LsapiError::InvalidHeaderBytes { what })
        );
    }
    assert_eq!(
        RequestBuilder::new(&Limits::DEFAULT, b"GET /\r\n").err(),
        Some(LsapiError::InvalidHeaderBytes {
            what: "request line"
        })
    );
    assert_eq!(
        rb.encode(&mut BytesMut::new()),
        Err(LsapiError::MissingEnv("SCRIPT_FILENAME"))
    );
    let mut rb = builder();
    rb.env(b"SCRIPT_FILENAME", b"/x").unwrap();
    assert_eq!(
        rb.encode(&mut BytesMut::new()),
        Err(LsapiError::MissingEnv("SCRIPT_NAME"))
    );
}

#[test]
fn builder_enforces_limits() {
    let mut rb = builder();
    let long_name = vec![b'N'; 1025];
    assert_eq!(
        rb.env(&long_name, b"v"),
        Err(LsapiError::NameTooLong {
            what: "env",
            len: 1025,
            max: 1024
        })
    );
    let long_value = vec![b'v'; 16 * 1024 + 1];
    assert_eq!(
        rb.special_env(b"k", &long_value),
        Err(LsapiError::ValueTooLong {
            what: "special env",
            len: 16385,
            max: 16384
        })
    );
    // Four 16 KiB header values do not fit in 65535 bytes.
    let value = vec![b'v'; 16 * 1024];
    for i in 0..3 {
        rb.header(format!("X-H{i}").as_bytes(), &value).unwrap();
    }
    let before = rb.packet_len();
    assert!(matches!(
        rb.header(b"X-H3", &value),
        Err(LsapiError::RequestTooLarge { max: 65535, .. })
    ));
    assert_eq!(rb.packet_len(), before, "a refused push changes nothing");
    let two = Limits {
        max_params_count: 2,
        ..Limits::DEFAULT
    };
    let mut rb = RequestBuilder::new(&two, b"GET / HTTP/1.1").unwrap();
    rb.env(b"A", b"1").unwrap();
    rb.special_env(b"B", b"1").unwrap();
    assert_eq!(
        rb.env(b"C", b"1"),
        Err(LsapiError::TooManyPairs {
            what: "env pairs",
            count: 3,
            max: 2
        })
    );
    rb.header(b"Host", b"h").unwrap();
    rb.header(b"X-A", b"1").unwrap();
    assert_eq!(
        rb.header(b"X-B", b"1"),
        Err(LsapiError::TooManyPairs {
            what: "headers",
            count: 3,
            max: 2
        })
    );
    // A restarted builder counts its headers afresh.
    for _ in 0..3 {
        rb.restart(&two, b"GET / HTTP/1.1").unwrap();
        rb.header(b"Host", b"h").unwrap();
        rb.header(b"Accept", b"a").unwrap();
    }
    let tiny = Limits {
        max_params_bytes: 200,
        ..Limits::DEFAULT
    };
    assert_eq!(
        RequestBuilder::new(&tiny, &[b'G'; 10]).err(),
        Some(LsapiError::RequestTooLarge { len: 222, max: 200 })
    );
}

#[test]
fn large_bodies_travel_as_minus_two_with_content_length() {
    let three_gib = 3u64 << 30;
    let mut rb = with_pointed(builder());
    rb.body_len(three_gib);
    assert_eq!(
        rb.encode(&mut BytesMut::new()),
        Err(LsapiError::LargeBodyWithoutContentLength(three_gib))
    );
    rb.header(b"Content-Length", three_gib.to_string().as_bytes())
        .unwrap();
    let mut out = BytesMut::new();
    rb.encode(&mut out).unwrap();
    assert_eq!(&out[12..16], &(-2i32).to_le_bytes());
    let mut dec = RequestDecoder::new(&Limits::DEFAULT).with_flag_rule(FlagRule::Literal);
    let ev = dec.decode(&mut out).unwrap().unwrap();
    assert_eq!(begin(&ev).body_len, three_gib);
    assert_eq!(dec.body_remaining(), three_gib);
    // A body just under 2 GiB is sent as is.
    let mut rb = with_pointed(builder());
    rb.body_len(i32::MAX as u64);
    let mut out = BytesMut::new();
    rb.encode(&mut out).unwrap();
    assert_eq!(&out[12..16], &i32::MAX.to_le_bytes());
}

#[test]
fn known_header_table() {
    assert_eq!(KNOWN_HEADERS.len(), 25);
    assert_eq!(known_header_index(b"user-agent"), Some(13));
    assert_eq!(known_header_index(b"X-FORWARDED-FOR"), Some(22));
    assert_eq!(
        known_header_index(b"Content-Length"),
        Some(H_CONTENT_LENGTH)
    );
    assert_eq!(
        known_header_index(b"Transfer-Encoding"),
        Some(H_TRANSFER_ENCODING)
    );
    assert_eq!(known_header_index(b"X-Custom"), None);
}
