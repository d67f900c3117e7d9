//! The six tests every cell of the front-server matrix gets (`matrix.rs` builds the matrix):
//! what each checks through the cell's front server, and [`front_matrix!`], which writes them
//! as one module per cell.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::thread;
use std::time::Duration;

use super::front::{curl, Response};
use super::matrix::{Matrix, TEN_MIB};
use super::server::parse_response;

/// GET with a query string: PHP sees the decoded parameter and the raw QUERY_STRING.
pub fn get_with_query(m: &Matrix, name: &str) {
    let c = m.get(name);
    let r = curl(&c.url("/query.php?q=hello%20world&lang=fr"), &[]);
    assert_eq!(r.status, 200, "{r:?}\n{}", m.logs(c));
    assert!(
        r.header("server").is_some_and(|s| s.starts_with(c.server)),
        "not answered by {}: {:?}",
        c.server,
        r.headers
    );
    assert_eq!(
        r.text(),
        "q=hello world qs=q=hello%20world&lang=fr method=GET",
        "{}",
        m.logs(c)
    );
}

/// A 10 MiB POST reaches PHP whole: PHP's md5 of php://input is the md5 of the bytes sent.
pub fn post_ten_mib(m: &Matrix, name: &str) {
    let c = m.get(name);
    let r = curl(
        &c.url("/upload.php"),
        &[
            "-H",
            "Content-Type: application/octet-stream",
            "--data-binary",
            &format!("@{}", m.site.upload.display()),
        ],
    );
    assert_eq!(r.status, 200, "{r:?}\n{}", m.logs(c));
    assert_eq!(
        r.text(),
        format!("{} {TEN_MIB}", m.site.upload_md5),
        "{}",
        m.logs(c)
    );
}

/// A 404 set by PHP reaches the client with PHP's body, and a missing script is a 404.
pub fn not_found(m: &Matrix, name: &str) {
    let c = m.get(name);
    let r = curl(&c.url("/gone.php"), &[]);
    assert_eq!(r.status, 404, "{r:?}\n{}", m.logs(c));
    assert_eq!(r.text(), "php says 404");
    let r = curl(&c.url("/missing.php"), &[]);
    assert_eq!(r.status, 404, "{r:?}\n{}", m.logs(c));
}

/// PHP's redirect reaches the client as a 302 with its Location, which leads to the page.
pub fn redirect(m: &Matrix, name: &str) {
    let c = m.get(name);
    let r = curl(&c.url("/redirect.php"), &[]);
    assert_eq!(r.status, 302, "{r:?}\n{}", m.logs(c));
    let location = r
        .header("location")
        .unwrap_or_else(|| panic!("no Location: {r:?}"));
    let target = if location.starts_with('/') {
        c.url(location)
    } else {
        location.to_owned()
    };
    assert!(
        target.starts_with(&c.url("/query.php?q=redirected")),
        "Location {location:?} leads elsewhere"
    );
    let r = curl(&target, &[]);
    assert_eq!(r.status, 200, "{r:?}\n{}", m.logs(c));
    assert!(r.text().starts_with("q=redirected "), "{}", r.text());
}

/// Both Set-Cookie headers reach the client, and the client's cookies reach PHP.
pub fn cookies(m: &Matrix, name: &str) {
    let c = m.get(name);
    let r = curl(
        &c.url("/cookies.php"),
        &["-b", "flavour=oatmeal; size=large"],
    );
    assert_eq!(r.status, 200, "{r:?}\n{}", m.logs(c));
    assert_eq!(r.text(), "flavour=oatmeal size=large");
    let set = r.all("set-cookie");
    assert_eq!(set.len(), 2, "{:?}", r.headers);
    assert!(set[0].starts_with("first=one"), "{set:?}");
    assert!(set[1].starts_with("second=two"), "{set:?}");
    assert!(set[1].to_ascii_lowercase().contains("httponly"), "{set:?}");
}

/// 100 GETs from 4 threads, a connection each: every one answered 200 with its own query.
pub fn load(m: &Matrix, name: &str) {
    let c = m.get(name);
    let addr = c.addr;
    let workers: Vec<_> = (0..4)
        .map(|t| {
            thread::spawn(move || {
                let mut errors = Vec::new();
                for i in 0..25 {
                    let q = format!("load-{t}-{i}");
                    match get(addr, &format!("/query.php?q={q}")) {
                        Ok(r) if r.status == 200 && r.text().starts_with(&format!("q={q} ")) => {}
                        Ok(r) => errors.push(format!("{q}: {} {:?}", r.status, r.text())),
                        Err(e) => errors.push(format!("{q}: {e}")),
                    }
                }
                errors
            })
        })
        .collect();
    let errors: Vec<String> = workers
        .into_iter()
        .flat_map(|w| w.join().expect("load thread"))
        .collect();
    assert!(errors.is_empty(), "{errors:#?}\n{}", m.logs(c));
}

/// One GET on a connection of its own.
fn get(addr: SocketAddr, target: &str) -> std::io::Result<Response> {
    let mut s = TcpStream::connect(addr)?;
    s.set_read_timeout(Some(Duration::from_secs(30)))?;
    write!(
        s,
        "GET {target} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )?;
    let mut raw = Vec::new();
    s.read_to_end(&mut raw)?;
    let r = parse_response(&raw);
    Ok(Response {
        status: r.status,
        headers: r.headers,
        body: r.body,
    })
}

/// The six tests of every cell, one module per cell: `front_matrix!(build; a, b)` after
/// `fn build() -> Matrix` that adds cells `a` and `b`.
#[allow(unused_macros)]
macro_rules! front_matrix {
    ($build:path; $($cell:ident),+ $(,)?) => {
        static MATRIX: std::sync::OnceLock<Result<crate::support::matrix::Matrix, String>> =
            std::sync::OnceLock::new();

        fn matrix() -> &'static crate::support::matrix::Matrix {
            crate::support::matrix::kept(&MATRIX, $build)
        }

        $(
            mod $cell {
                use crate::support::matrix_checks as m;

                #[test]
                fn get_with_query() {
                    m::get_with_query(super::matrix(), stringify!($cell));
                }

                #[test]
                fn post_ten_mib() {
                    m::post_ten_mib(super::matrix(), stringify!($cell));
                }

                #[test]
                fn not_found() {
                    m::not_found(super::matrix(), stringify!($cell));
                }

                #[test]
                fn redirect() {
                    m::redirect(super::matrix(), stringify!($cell));
                }

                #[test]
                fn cookies() {
                    m::cookies(super::matrix(), stringify!($cell));
                }

                #[test]
                fn load() {
                    m::load(super::matrix(), stringify!($cell));
                }
            }
        )+
    };
}
#[allow(unused_imports)]
pub(crate) use front_matrix;
