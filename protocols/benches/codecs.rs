//! Codec throughput on a realistic request (about 30 CGI variables, 1 KiB of headers) and a
//! small response, per protocol and per role.
//! It informs: whether any codec is a measurable share of a request's cost next to a
//! backend hop (tens of microseconds), and which one to tune first if so.

// A bench is not peer-facing: a bad fixture should stop it loudly.
#![allow(missing_docs, clippy::expect_used)]

use bytes::BytesMut;
use corral_protocols::cgi::{build_cgi_vars, CgiContext, CgiRequest, ScriptMode};
use corral_protocols::cgi_response::CgiResponseDecoder;
use corral_protocols::fastcgi::{
    encode_begin_request, encode_params, encode_request_complete, encode_stdin_end, encode_stdout,
    RequestDecoder, RequestEvent, ResponseDecoder, ResponseEvent, Role,
};
use corral_protocols::lsapi::{self, ByteOrder, FlagRule, ResponseEncoder};
use corral_protocols::scgi::{encode_request_head, ScgiRequestDecoder, ScgiRequestEvent};
use corral_protocols::Limits;
use criterion::{black_box, criterion_group, criterion_main, Criterion, Throughput};

/// Request headers of a browser behind a proxy: about 1 KiB in 12 fields.
const HEADERS: &[(&str, &str)] = &[
    ("Host", "shop.example.com"),
    ("User-Agent", "Mozilla/5.0 (X11; Linux x86_64; rv:128.0) Gecko/20100101 Firefox/128.0"),
    ("Accept", "text/html,application/xhtml+xml,application/xml;q=0.9,image/avif,image/webp,*/*;q=0.8"),
    ("Accept-Language", "en-GB,en;q=0.7,fr;q=0.3"),
    ("Accept-Encoding", "gzip, deflate, br, zstd"),
    ("Referer", "https://shop.example.com/catalog/shoes/running?page=2&sort=price"),
    ("Cookie", "session=8f14e45fceea167a5a36dedd4bea2543; cart=3f2a9c; theme=dark; consent=analytics%3D0%26ads%3D0; _ga=GA1.2.1234567890.1700000000; _gid=GA1.2.987654321.1700000000; recently_viewed=1201%2C1187%2C1032%2C998"),
    ("X-Forwarded-For", "203.0.113.195, 70.41.3.18"),
    ("X-Forwarded-Proto", "https"),
    ("X-Request-Id", "c7ad4f3e-5b1a-4c8e-9f2d-0a6b3e1d7c44"),
    ("Sec-Fetch-Mode", "navigate"),
    ("Upgrade-Insecure-Requests", "1"),
];

fn cgi_context() -> CgiContext {
    CgiContext {
        document_root: b"/var/www/shop/public".to_vec(),
        mode: ScriptMode::Files {
            extensions: vec![b"php".to_vec()],
            index: vec![b"index.php".to_vec()],
        },
        server_software: bytes::Bytes::from_static(b"corral/0.1.0"),
        extra_env: Vec::new(),
        allow_php_ini_params: false,
    }
}

fn cgi_request<'a>(headers: &'a [(&'a [u8], &'a [u8])]) -> CgiRequest<'a> {
    CgiRequest {
        method: b"GET",
        target: b"/index.php/catalog/shoes/running?page=2&sort=price&size=44",
        protocol: b"HTTP/1.1",
        headers,
        body_length: None,
        remote_addr: b"203.0.113.195",
        remote_port: Some(51334),
        server_addr: b"10.0.0.5",
        server_port: Some(443),
        server_name: b"shop.example.com",
        https: true,
    }
}

/// The CGI variables of the realistic request, as every backend codec receives them.
fn params() -> Vec<(bytes::Bytes, bytes::Bytes)> {
    let headers: Vec<(&[u8], &[u8])> = HEADERS
        .iter()
        .map(|(n, v)| (n.as_bytes(), v.as_bytes()))
        .collect();
    build_cgi_vars(&cgi_request(&headers), &cgi_context(), &Limits::DEFAULT)
        .expect("the realistic request builds")
        .vars
}

const RESPONSE_HEAD: &[u8] = b"Status: 200 OK\r\nX-Powered-By: PHP/8.2.32\r\nSet-Cookie: session=8f14e45fceea167a5a36dedd4bea2543; path=/; HttpOnly\r\nCache-Control: no-store, no-cache, must-revalidate\r\nContent-Type: text/html; charset=UTF-8\r\n\r\n";
const RESPONSE_BODY: &[u8] = &[b'x'; 4096];

fn bench_cgi(c: &mut Criterion) {
    let headers: Vec<(&[u8], &[u8])> = HEADERS
        .iter()
        .map(|(n, v)| (n.as_bytes(), v.as_bytes()))
        .collect();
    let ctx = cgi_context();
    let mut g = c.benchmark_group("cgi");
    g.throughput(Throughput::Elements(1));
    g.bench_function("build_vars", |b| {
        b.iter(|| build_cgi_vars(black_box(&cgi_request(&headers)), &ctx, &Limits::DEFAULT))
    });
    g.throughput(Throughput::Bytes(RESPONSE_HEAD.len() as u64));
    g.bench_function("parse_response_head", |b| {
        b.iter(|| {
            let mut src = BytesMut::from(RESPONSE_HEAD);
            CgiResponseDecoder::new(&Limits::DEFAULT).decode(black_box(&mut src))
        })
    });
    g.finish();
}

fn bench_fastcgi(c: &mut Criterion) {
    let params = params();
    let mut request = BytesMut::new();
    encode_begin_request(1, Role::Responder, true, &mut request);
    encode_params(1, &params, &mut request).expect("params encode");
    encode_stdin_end(1, &mut request);
    let mut response = BytesMut::new();
    encode_stdout(1, RESPONSE_HEAD, &mut response);
    encode_stdout(1, RESPONSE_BODY, &mut response);
    encode_request_complete(1, 0, &mut response);

    let mut g = c.benchmark_group("fastcgi");
    g.throughput(Throughput::Bytes(request.len() as u64));
    g.bench_function("client_encode_request", |b| {
        let mut dst = BytesMut::with_capacity(request.len());
        b.iter(|| {
            dst.clear();
            encode_begin_request(1, Role::Responder, true, &mut dst);
            encode_params(1, black_box(&params), &mut dst).expect("params encode");
            encode_stdin_end(1, &mut dst);
        })
    });
    g.bench_function("responder_decode_request", |b| {
        b.iter(|| {
            let mut src = request.clone();
            let mut dec = RequestDecoder::new(&Limits::DEFAULT);
            let mut n = 0;
            while let Some(ev) = dec.decode(&mut src).expect("valid request") {
                if let RequestEvent::Params { params, .. } = ev {
                    n += params.len();
                }
            }
            n
        })
    });
    g.throughput(Throughput::Bytes(response.len() as u64));
    g.bench_function("client_decode_response", |b| {
        b.iter(|| {
            let mut src = response.clone();
            let mut dec = ResponseDecoder::new(1, true, &Limits::DEFAULT);
            let mut n = 0;
            while let Some(ev) = dec.decode(&mut src).expect("valid response") {
                if let ResponseEvent::Stdout(data) = ev {
                    n += data.len();
                }
            }
            n
        })
    });
    g.finish();
}

fn bench_scgi(c: &mut Criterion) {
    // SCGI carries CONTENT_LENGTH itself, first; the head encoder refuses a second one.
    let params: Vec<_> = params()
        .into_iter()
        .filter(|(name, _)| &name[..] != b"CONTENT_LENGTH")
        .collect();
    let mut request = BytesMut::new();
    encode_request_head(0, &params, &Limits::DEFAULT, &mut request).expect("head encodes");
    let mut g = c.benchmark_group("scgi");
    g.throughput(Throughput::Bytes(request.len() as u64));
    g.bench_function("client_encode_head", |b| {
        let mut dst = BytesMut::with_capacity(request.len());
        b.iter(|| {
            dst.clear();
            encode_request_head(0, black_box(&params), &Limits::DEFAULT, &mut dst)
        })
    });
    g.bench_function("responder_decode_head", |b| {
        b.iter(|| {
            let mut src = request.clone();
            let mut dec = ScgiRequestDecoder::new(&Limits::DEFAULT);
            let mut n = 0;
            while let Some(ev) = dec.decode(&mut src).expect("valid head") {
                match ev {
                    ScgiRequestEvent::Head(_) => n += 1,
                    ScgiRequestEvent::End => break,
                    ScgiRequestEvent::Body(_) => {}
                }
            }
            n
        })
    });
    g.finish();
}

fn bench_lsapi(c: &mut Criterion) {
    let params = params();
    let build = |dst: &mut BytesMut| {
        let mut req = lsapi::RequestBuilder::new(
            &Limits::DEFAULT,
            b"GET /index.php/catalog/shoes/running?page=2&sort=price&size=44 HTTP/1.1",
        )
        .expect("request line");
        for (name, value) in &params {
            req.env(name, value).expect("env fits");
        }
        for (name, value) in HEADERS {
            req.header(name.as_bytes(), value.as_bytes())
                .expect("header fits");
        }
        req.body_len(0);
        req.encode(dst).expect("request encodes");
    };
    let mut request = BytesMut::new();
    build(&mut request);
    let enc = ResponseEncoder::new(ByteOrder::Little, FlagRule::HOST);
    let mut response = BytesMut::new();
    enc.req_received(&mut response);
    enc.header(
        200,
        &[
            ("X-Powered-By", "PHP/8.2.32"),
            ("Content-Type", "text/html; charset=UTF-8"),
        ],
        &mut response,
    )
    .expect("header encodes");
    enc.stream(RESPONSE_BODY, &mut response);
    enc.end(&mut response);

    let mut g = c.benchmark_group("lsapi");
    g.throughput(Throughput::Bytes(request.len() as u64));
    g.bench_function("client_encode_request", |b| {
        let mut dst = BytesMut::with_capacity(request.len());
        b.iter(|| {
            dst.clear();
            build(&mut dst);
        })
    });
    g.bench_function("backend_decode_request", |b| {
        b.iter(|| {
            let mut src = request.clone();
            lsapi::RequestDecoder::new(&Limits::DEFAULT).decode(black_box(&mut src))
        })
    });
    g.throughput(Throughput::Bytes(response.len() as u64));
    g.bench_function("client_decode_response", |b| {
        b.iter(|| {
            let mut src = response.clone();
            let mut dec = lsapi::ResponseDecoder::new(&Limits::DEFAULT);
            let mut n = 0;
            while let Some(_ev) = dec.decode(&mut src).expect("valid response") {
                n += 1;
            }
            n
        })
    });
    g.finish();
}

criterion_group!(benches, bench_cgi, bench_fastcgi, bench_scgi, bench_lsapi);
criterion_main!(benches);
