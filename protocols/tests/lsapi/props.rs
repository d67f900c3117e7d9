//! Property tests: decode(encode(x)) == x for requests and responses in every byte order
//! and flag rule, and the same events for any chunking of the bytes.

use super::*;

fn orders() -> impl Strategy<Value = (ByteOrder, FlagRule)> {
    (
        prop_oneof![Just(ByteOrder::Little), Just(ByteOrder::Big)],
        prop_oneof![Just(FlagRule::Literal), Just(FlagRule::Inverted)],
    )
}

fn cuts(max_len: usize) -> impl Strategy<Value = Vec<usize>> {
    proptest::collection::vec(0..max_len.max(1), 0..12).prop_map(|mut v| {
        v.sort_unstable();
        v
    })
}

// ---------------------------------------------------------------------------------------
// responses

#[derive(Debug, Clone)]
enum Part {
    Ack,
    Pid(u32),
    Stderr(Vec<u8>),
    Header(u16, Vec<(String, String)>),
    Stream(Vec<u8>),
    End,
    ConnClose,
}

fn stderr_text() -> impl Strategy<Value = Vec<u8>> {
    proptest::collection::vec(any::<u8>(), 1..40)
        .prop_filter("8 bytes starting \\0PID read as the pid packet", |v| {
            !(v.len() == 8 && v.starts_with(b"\0PID"))
        })
}

fn header_part() -> impl Strategy<Value = Part> {
    let status = prop_oneof![Just(0u16), 100u16..=999];
    let field = ("[A-Za-z][A-Za-z0-9-]{0,15}", "([!-~]([ -~]{0,30}[!-~])?)?");
    (status, proptest::collection::vec(field, 0..6)).prop_map(|(s, f)| Part::Header(s, f))
}

fn exchange() -> impl Strategy<Value = Vec<Part>> {
    let ack = prop_oneof![
        Just(None),
        Just(Some(Part::Ack)),
        any::<u32>().prop_map(|p| Some(Part::Pid(p))),
    ];
    let body_part = prop_oneof![
        3 => proptest::collection::vec(any::<u8>(), 1..300).prop_map(Part::Stream),
        1 => stderr_text().prop_map(Part::Stderr),
    ];
    (
        ack,
        proptest::collection::vec(stderr_text().prop_map(Part::Stderr), 0..2),
        header_part(),
        proptest::collection::vec(body_part, 0..5),
    )
        .prop_map(|(ack, pre, hdr, body)| {
            let mut v: Vec<Part> = ack.into_iter().collect();
            v.extend(pre);
            v.push(hdr);
            v.extend(body);
            v.push(Part::End);
            v
        })
}

fn conversation() -> impl Strategy<Value = Vec<Part>> {
    (proptest::collection::vec(exchange(), 1..4), any::<bool>()).prop_map(|(ex, close)| {
        let mut v: Vec<Part> = ex.into_iter().flatten().collect();
        if close {
            v.push(Part::ConnClose);
        }
        v
    })
}

fn encode_parts(enc: &ResponseEncoder, parts: &[Part]) -> BytesMut {
    let mut out = BytesMut::new();
    for p in parts {
        match p {
            Part::Ack => enc.req_received(&mut out),
            Part::Pid(pid) => enc.pid(*pid, &mut out),
            Part::Stderr(t) => enc.stderr(t, &mut out),
            Part::Header(s, f) => enc.header(*s, f, &mut out).unwrap(),
            Part::Stream(b) => enc.stream(b, &mut out),
            Part::End => enc.end(&mut out),
            Part::ConnClose => enc.conn_close(&mut out),
        }
    }
    out
}

fn expected_events(parts: &[Part]) -> Vec<ResponseEvent> {
    parts
        .iter()
        .map(|p| match p {
            Part::Ack => ResponseEvent::ReqReceived,
            Part::Pid(pid) => ResponseEvent::Pid(*pid),
            Part::Stderr(t) => ResponseEvent::Stderr(Bytes::from(t.clone())),
            Part::Header(s, f) => ResponseEvent::Header(ResponseHead {
                status: *s,
                lines: f.iter().map(|(n, v)| b(&format!("{n}: {v}"))).collect(),
            }),
            Part::Stream(b) => ResponseEvent::Stream(Bytes::from(b.clone())),
            Part::End => ResponseEvent::End,
            Part::ConnClose => ResponseEvent::ConnClose,
        })
        .collect()
}

proptest! {
    #[test]
    fn response_round_trip_any_order_any_chunking(
        parts in conversation(),
        (order, rule) in orders(),
        cuts in cuts(4000),
    ) {
        let bytes = encode_parts(&ResponseEncoder::new(order, rule), &parts);
        let expected = expected_events(&parts);
        let mut whole = ResponseDecoder::new(&Limits::DEFAULT).with_flag_rule(rule);
        prop_assert_eq!(&response_events(&mut whole, &bytes, &[]).unwrap(), &expected);
        let mut chunked = ResponseDecoder::new(&Limits::DEFAULT).with_flag_rule(rule);
        prop_assert_eq!(&response_events(&mut chunked, &bytes, &cuts).unwrap(), &expected);
        // Field splitting gives back the names and values that were encoded.
        for (p, e) in parts.iter().zip(&expected) {
            if let (Part::Header(_, f), ResponseEvent::Header(h)) = (p, e) {
                let got: Vec<(Bytes, Bytes)> = h.fields().collect();
                let want: Vec<(Bytes, Bytes)> = f.iter().map(|(n, v)| (b(n), b(v))).collect();
                prop_assert_eq!(got, want);
            }
        }
    }

    #[test]
    fn response_decoder_never_panics_on_garbage(
        bytes in proptest::collection::vec(any::<u8>(), 0..200),
        cuts in cuts(200),
    ) {
        let mut dec = ResponseDecoder::new(&Limits::DEFAULT);
        let mut src = BytesMut::new();
        let mut at = 0;
        'outer: for &cut in cuts.iter().chain(std::iter::once(&bytes.len())) {
            let cut = cut.clamp(at, bytes.len());
            src.extend_from_slice(&bytes[at..cut]);
            at = cut;
            loop {
                match dec.decode(&mut src) {
                    Ok(Some(_)) => {}
                    Ok(None) => break,
                    Err(_) => break 'outer,
                }
            }
        }
    }
}

/// Feeds `bytes` cut at `cuts` to `decode` and to `decode_text` side by side: they agree on
/// every event but RESP_HEADER, whose text is decode's lines, LF after each, then LF; and
/// decode_text refuses exactly what decode refuses plus a line holding CR or LF and an empty
/// line.
fn text_agrees(bytes: &[u8], cuts: &[usize], rule: FlagRule) -> Result<(), TestCaseError> {
    let mut lines_dec = ResponseDecoder::new(&Limits::DEFAULT).with_flag_rule(rule);
    let mut text_dec = ResponseDecoder::new(&Limits::DEFAULT).with_flag_rule(rule);
    let (mut a, mut b) = (BytesMut::new(), BytesMut::new());
    let mut at = 0;
    for &cut in cuts.iter().chain(std::iter::once(&bytes.len())) {
        let cut = cut.clamp(at, bytes.len());
        a.extend_from_slice(&bytes[at..cut]);
        b.extend_from_slice(&bytes[at..cut]);
        at = cut;
        loop {
            let (x, y) = (lines_dec.decode(&mut a), text_dec.decode_text(&mut b));
            match (x, y) {
                (Ok(None), Ok(None)) => break,
                (Ok(Some(ResponseEvent::Header(h))), got) => {
                    let broken = h
                        .lines
                        .iter()
                        .any(|l| l.is_empty() || l.contains(&b'\r') || l.contains(&b'\n'));
                    if broken {
                        let refused = matches!(got, Err(LsapiError::InvalidHeaderBytes { .. }));
                        prop_assert!(refused, "{:?}", got);
                        return Ok(());
                    }
                    let mut want = Vec::new();
                    for l in &h.lines {
                        want.extend_from_slice(l);
                        want.push(b'\n');
                    }
                    want.push(b'\n');
                    prop_assert_eq!(
                        got.unwrap(),
                        Some(TextEvent::Head {
                            status: h.status,
                            text: Bytes::from(want)
                        })
                    );
                }
                (Ok(Some(e)), got) => prop_assert_eq!(got.unwrap(), Some(TextEvent::Event(e))),
                (Err(e), got) => {
                    prop_assert_eq!(got.unwrap_err(), e);
                    return Ok(());
                }
                (Ok(None), got) => prop_assert!(false, "decode wants more, decode_text {:?}", got),
            }
            prop_assert_eq!(&a, &b);
        }
    }
    Ok(())
}

proptest! {
    #[test]
    fn head_text_agrees_with_the_lines(
        parts in conversation(),
        (order, rule) in orders(),
        cuts in cuts(4000),
    ) {
        let bytes = encode_parts(&ResponseEncoder::new(order, rule), &parts);
        text_agrees(&bytes, &cuts, rule)?;
    }

    #[test]
    fn head_text_agrees_on_garbage_and_broken_lines(
        bytes in proptest::collection::vec(any::<u8>(), 0..200),
        line in proptest::collection::vec(prop_oneof![Just(b'\r'), Just(b'\n'), Just(b'a'), Just(b':'), Just(0u8)], 0..12),
        cuts in cuts(200),
    ) {
        text_agrees(&bytes, &cuts, FlagRule::HOST)?;
        // A RESP_HEADER of one line built by hand (the encoder refuses CR and LF).
        let mut packet = Vec::new();
        let payload_len = 8 + 2 + line.len() + 1;
        packet.extend_from_slice(b"LS");
        packet.push(3); // RESP_HEADER
        let mut head = BytesMut::new();
        ResponseEncoder::default().req_received(&mut head);
        packet.push(head[3]);
        packet.extend_from_slice(&i32::try_from(8 + payload_len).unwrap().to_ne_bytes());
        packet.extend_from_slice(&1i32.to_ne_bytes());
        packet.extend_from_slice(&200i32.to_ne_bytes());
        packet.extend_from_slice(&u16::try_from(line.len() + 1).unwrap().to_ne_bytes());
        packet.extend_from_slice(&line);
        packet.push(0);
        text_agrees(&packet, &cuts, FlagRule::HOST)?;
    }
}

/// `bytes` cut at `cuts` through `dec`: its events, runs of RESP_STREAM bytes joined into
/// one event (empty ones dropped), and the error that ended them, if any. After each cut's
/// events, `check` sees what is left buffered.
fn joined_events(
    dec: &mut ResponseDecoder,
    bytes: &[u8],
    cuts: &[usize],
    check: impl Fn(&BytesMut) -> Result<(), TestCaseError>,
) -> Result<(Vec<ResponseEvent>, Option<LsapiError>), TestCaseError> {
    let mut src = BytesMut::new();
    let mut out: Vec<ResponseEvent> = Vec::new();
    let mut at = 0;
    for &cut in cuts.iter().chain(std::iter::once(&bytes.len())) {
        let cut = cut.clamp(at, bytes.len());
        src.extend_from_slice(&bytes[at..cut]);
        at = cut;
        loop {
            match dec.decode(&mut src) {
                Ok(Some(ResponseEvent::Stream(part))) => match out.last_mut() {
                    Some(ResponseEvent::Stream(run)) => {
                        let mut joined = BytesMut::from(&run[..]);
                        joined.extend_from_slice(&part);
                        *run = joined.freeze();
                    }
                    _ if part.is_empty() => {}
                    _ => out.push(ResponseEvent::Stream(part)),
                },
                Ok(Some(event)) => out.push(event),
                Ok(None) => break,
                Err(e) => return Ok((out, Some(e))),
            }
        }
        check(&src)?;
    }
    Ok((out, None))
}

proptest! {
    /// Partial streams carry the same bytes as whole packets, with every other event and
    /// every error the same, for any cuts; and they leave no RESP_STREAM payload behind in
    /// the buffer (what a gateway relies on to refill it without a copy): what stays is
    /// less than a packet header, or the start of another kind of packet.
    #[test]
    fn partial_streams_carry_the_same_bytes(
        parts in conversation(),
        (order, rule) in orders(),
        cuts in cuts(4000),
    ) {
        let bytes = encode_parts(&ResponseEncoder::new(order, rule), &parts);
        let mut whole = ResponseDecoder::new(&Limits::DEFAULT).with_flag_rule(rule);
        let want = joined_events(&mut whole, &bytes, &cuts, |_| Ok(()))?;
        let mut partial = ResponseDecoder::new(&Limits::DEFAULT)
            .with_flag_rule(rule)
            .partial_streams(true);
        let got = joined_events(&mut partial, &bytes, &cuts, |left| {
            prop_assert!(left.len() < 8 || left[2] != 4, "stream bytes left: {:?}", left);
            Ok(())
        })?;
        prop_assert_eq!(got, want);
    }

    #[test]
    fn partial_streams_never_panic_on_garbage(
        bytes in proptest::collection::vec(any::<u8>(), 0..200),
        cuts in cuts(200),
    ) {
        for text in [false, true] {
            let mut dec = ResponseDecoder::new(&Limits::DEFAULT).partial_streams(true);
            let mut src = BytesMut::new();
            let mut at = 0;
            'outer: for &cut in cuts.iter().chain(std::iter::once(&bytes.len())) {
                let cut = cut.clamp(at, bytes.len());
                src.extend_from_slice(&bytes[at..cut]);
                at = cut;
                loop {
                    let more = if text {
                        dec.decode_text(&mut src).map(|e| e.is_some())
                    } else {
                        dec.decode(&mut src).map(|e| e.is_some())
                    };
                    match more {
                        Ok(true) => {}
                        Ok(false) => break,
                        Err(_) => break 'outer,
                    }
                }
            }
        }
    }
}

// ---------------------------------------------------------------------------------------
// requests

#[derive(Debug, Clone)]
struct Req {
    pointed: [Vec<u8>; 4],
    env: Vec<(Vec<u8>, Vec<u8>)>,
    special: Vec<(Vec<u8>, Vec<u8>)>,
    /// (known index or None, unknown name, value)
    headers: Vec<(Option<usize>, String, String)>,
    body: Vec<u8>,
}

fn request() -> impl Strategy<Value = Req> {
    let no_nul = proptest::collection::vec(1u8..=255, 0..30);
    let pointed = [no_nul.clone(), no_nul.clone(), no_nul.clone(), no_nul];
    let env = proptest::collection::vec(
        (
            "E_[A-Z0-9_]{0,10}".prop_map(String::into_bytes),
            proptest::collection::vec(any::<u8>(), 0..40),
        ),
        0..8,
    );
    let special = proptest::collection::vec(
        (
            proptest::collection::vec(any::<u8>(), 1..20),
            proptest::collection::vec(any::<u8>(), 0..33),
        ),
        0..3,
    );
    let header = (
        proptest::option::of(0usize..24),
        "X-[A-Za-z0-9]{1,10}",
        "[ -~]{0,40}",
    );
    (
        pointed,
        env,
        special,
        proptest::collection::vec(header, 0..12),
        proptest::collection::vec(any::<u8>(), 0..100),
    )
        .prop_map(|(pointed, env, special, headers, body)| Req {
            pointed,
            env,
            special,
            headers,
            body,
        })
}

/// Pushes everything; returns the packet and the headers as they should parse back.
fn build(req: &Req, order: ByteOrder, rule: FlagRule) -> (BytesMut, Vec<(Bytes, Bytes)>) {
    let mut rb = RequestBuilder::new(&Limits::DEFAULT, b"GET /p?q HTTP/1.1")
        .unwrap()
        .with_byte_order(order, rule);
    for (n, v) in &req.env {
        rb.env(n, v).unwrap();
    }
    for (name, value) in POINTED_ENV.iter().zip(&req.pointed) {
        rb.env(name.as_bytes(), value).unwrap();
    }
    for (n, v) in &req.special {
        rb.special_env(n, v).unwrap();
    }
    let mut seen = [false; 25];
    let mut headers = Vec::new();
    for (known, unknown, value) in &req.headers {
        let name = match known {
            Some(i) if !seen[*i] => {
                seen[*i] = true;
                KNOWN_HEADERS[*i].to_string()
            }
            _ => unknown.clone(),
        };
        rb.header(name.as_bytes(), value.as_bytes()).unwrap();
        headers.push((b(&name), b(value)));
    }
    rb.body_len(req.body.len() as u64);
    let mut out = BytesMut::new();
    rb.encode(&mut out).unwrap();
    (out, headers)
}

proptest! {
    #[test]
    fn request_round_trip_any_order_any_chunking(
        req in request(),
        (order, rule) in orders(),
        cuts in cuts(2000),
    ) {
        let (packet, headers) = build(&req, order, rule);
        let abort = {
            let mut a = BytesMut::new();
            encode_abort(order, rule, &mut a);
            a
        };
        let input = cat(&[&packet, &req.body, &abort]);
        let decode = |cuts: &[usize]| -> Vec<RequestEvent> {
            let mut dec = RequestDecoder::new(&Limits::DEFAULT).with_flag_rule(rule);
            let mut src = BytesMut::new();
            let mut out: Vec<RequestEvent> = Vec::new();
            let mut at = 0;
            for &cut in cuts.iter().chain(std::iter::once(&input.len())) {
                let cut = cut.clamp(at, input.len());
                src.extend_from_slice(&input[at..cut]);
                at = cut;
                while let Some(ev) = dec.decode(&mut src).unwrap() {
                    match (out.last_mut(), ev) {
                        (Some(RequestEvent::Body(prev)), RequestEvent::Body(more)) => {
                            *prev = Bytes::from([&prev[..], &more[..]].concat());
                        }
                        (_, ev) => out.push(ev),
                    }
                }
            }
            out
        };
        let whole = decode(&[]);
        prop_assert_eq!(&decode(&cuts), &whole);

        let parsed = begin(&whole[0]);
        prop_assert_eq!(parsed.order, order);
        let mut env: Vec<(Bytes, Bytes)> = req
            .env
            .iter()
            .map(|(n, v)| (Bytes::from(n.clone()), Bytes::from(v.clone())))
            .collect();
        env.extend(
            POINTED_ENV
                .iter()
                .zip(&req.pointed)
                .map(|(n, v)| (b(n), Bytes::from(v.clone()))),
        );
        prop_assert_eq!(&parsed.env, &env);
        let special: Vec<(Bytes, Bytes)> = req
            .special
            .iter()
            .map(|(n, v)| (Bytes::from(n.clone()), Bytes::from(v.clone())))
            .collect();
        prop_assert_eq!(&parsed.special_env, &special);
        prop_assert_eq!(parsed.script_filename.as_deref(), Some(&req.pointed[0][..]));
        prop_assert_eq!(parsed.script_name.as_deref(), Some(&req.pointed[1][..]));
        prop_assert_eq!(parsed.query_string.as_deref(), Some(&req.pointed[2][..]));
        prop_assert_eq!(parsed.request_method.as_deref(), Some(&req.pointed[3][..]));
        prop_assert_eq!(&parsed.headers, &headers);
        prop_assert!(parsed.head.starts_with(b"GET /p?q HTTP/1.1\r\n"));
        prop_assert!(parsed.head.ends_with(b"\r\n\r\n"));
        prop_assert_eq!(parsed.body_len, req.body.len() as u64);

        let mut rest = whole[1..].to_vec();
        if !req.body.is_empty() {
            prop_assert_eq!(rest.remove(0), RequestEvent::Body(Bytes::from(req.body.clone())));
        }
        prop_assert_eq!(rest, vec![RequestEvent::Abort]);
        // The packet obeys the alignment rule: the index starts on an 8-byte boundary, so
        // the packet length minus index, table and head is a multiple of 8.
        let head_len = parsed.head.len();
        let unknown = headers.len() - headers.iter().filter(|(n, _)| known_header_index(n).is_some()).count();
        prop_assert_eq!((packet.len() - head_len - unknown * 16 - 152) % 8, 0);
    }

    #[test]
    fn request_decoder_never_panics_on_mutations(
        req in request(),
        flips in proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..6),
    ) {
        let (packet, _) = build(&req, ByteOrder::Little, FlagRule::Literal);
        let mut bytes = packet.to_vec();
        for (at, v) in flips {
            let i = at.index(bytes.len());
            bytes[i] = v;
        }
        let mut dec = RequestDecoder::new(&Limits::DEFAULT).with_flag_rule(FlagRule::Literal);
        let mut src = BytesMut::from(&bytes[..]);
        while let Ok(Some(_)) = dec.decode(&mut src) {}
    }
}
