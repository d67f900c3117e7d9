//! Answering with a file corral opened itself, for the static files of `front::http` and the
//! files a backend names with X-Sendfile or X-Accel-Redirect (`front::sendfile`): the media
//! type by extension, Content-Length, and one byte range (RFC 9110 §14).
//!
//! Only a single range is served as 206; a multi-range request gets the whole file (a 200 is
//! always a valid answer to a Range request), and a request with If-Range gets the whole file
//! too, since corral sends no validator the condition could match. HEAD needs nothing here:
//! hyper sends the head of the GET answer without its body.

use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::{Bytes, BytesMut};
use http::header::HeaderValue;
use http::{HeaderMap, Response, StatusCode};
use http_body::Frame;
use tokio::io::AsyncSeekExt;

use crate::backend::BodyError;
use crate::front::http::{plain, FrontBody, HttpBody};

/// Bytes read from a file at a time.
const FILE_CHUNK: usize = 64 * 1024;

/// The part of a file to send.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Part {
    /// The whole file.
    Whole,
    /// Bytes `start..=end`, both within the file.
    Range { start: u64, end: u64 },
    /// A range that starts past the end: 416.
    Unsatisfiable,
}

/// Which part of a file of `len` bytes the request's `Range` asks for. Anything but one
/// well-formed `bytes=` range is answered with the whole file, as the RFC allows.
pub(super) fn requested_part(headers: &HeaderMap, len: u64) -> Part {
    if headers.contains_key(http::header::IF_RANGE) {
        return Part::Whole;
    }
    let mut ranges = headers.get_all(http::header::RANGE).iter();
    let (Some(value), None) = (ranges.next(), ranges.next()) else {
        return Part::Whole;
    };
    let Some(spec) = value
        .to_str()
        .ok()
        .and_then(|v| v.trim().strip_prefix("bytes="))
    else {
        return Part::Whole;
    };
    if spec.contains(',') {
        return Part::Whole;
    }
    let Some((first, last)) = spec.trim().split_once('-') else {
        return Part::Whole;
    };
    let number = |s: &str| {
        (!s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()))
            .then(|| s.parse::<u64>().ok())
            .flatten()
    };
    let (first, last) = (first.trim(), last.trim());
    if first.is_empty() {
        // `bytes=-N`: the last N bytes.
        return match number(last) {
            None => Part::Whole,
            Some(0) => Part::Unsatisfiable,
            Some(_) if len == 0 => Part::Unsatisfiable,
            Some(n) => Part::Range {
                start: len.saturating_sub(n),
                end: len - 1,
            },
        };
    }
    // `bytes=A-` and `bytes=A-B`.
    let Some(start) = number(first) else {
        return Part::Whole;
    };
    let end = match (last.is_empty(), number(last)) {
        (true, _) => None,
        (false, Some(end)) => Some(end),
        (false, None) => return Part::Whole,
    };
    if start >= len {
        return Part::Unsatisfiable;
    }
    match end {
        Some(end) if end < start => Part::Whole,
        Some(end) => Part::Range {
            start,
            end: end.min(len - 1),
        },
        None => Part::Range {
            start,
            end: len - 1,
        },
    }
}

/// The status and headers for sending `part` of a file of `len` bytes, on top of `status`
/// (the status the whole file would be sent with): 206 with Content-Range for a range of a
/// 200, 416 for an unsatisfiable one. A range of any other status is sent whole: a 404 page
/// or a 403 is not partial content.
pub(super) fn part_head(
    status: StatusCode,
    part: Part,
    len: u64,
    headers: &mut HeaderMap,
) -> (StatusCode, Option<(u64, u64)>) {
    headers.insert(
        http::header::ACCEPT_RANGES,
        HeaderValue::from_static("bytes"),
    );
    if status != StatusCode::OK {
        headers.insert(http::header::CONTENT_LENGTH, HeaderValue::from(len));
        return (status, None);
    }
    match part {
        Part::Whole => {
            headers.insert(http::header::CONTENT_LENGTH, HeaderValue::from(len));
            (status, None)
        }
        Part::Range { start, end } => {
            let count = end - start + 1;
            headers.insert(http::header::CONTENT_LENGTH, HeaderValue::from(count));
            if let Ok(v) = HeaderValue::from_str(&format!("bytes {start}-{end}/{len}")) {
                headers.insert(http::header::CONTENT_RANGE, v);
            }
            (StatusCode::PARTIAL_CONTENT, Some((start, count)))
        }
        Part::Unsatisfiable => {
            headers.insert(http::header::CONTENT_LENGTH, HeaderValue::from(0u64));
            if let Ok(v) = HeaderValue::from_str(&format!("bytes */{len}")) {
                headers.insert(http::header::CONTENT_RANGE, v);
            }
            (StatusCode::RANGE_NOT_SATISFIABLE, Some((0, 0)))
        }
    }
}

/// The media type of a file, from its extension; `None` for an extension corral does not
/// know.
pub(super) fn known_content_type(path: &std::path::Path) -> Option<&'static str> {
    let ext = path
        .extension()
        .and_then(|e| e.to_str())
        .unwrap_or("")
        .to_ascii_lowercase();
    Some(match ext.as_str() {
        "html" | "htm" => "text/html; charset=utf-8",
        "css" => "text/css; charset=utf-8",
        "js" | "mjs" => "text/javascript; charset=utf-8",
        "json" => "application/json",
        "txt" => "text/plain; charset=utf-8",
        "svg" => "image/svg+xml",
        "png" => "image/png",
        "jpg" | "jpeg" => "image/jpeg",
        "gif" => "image/gif",
        "webp" => "image/webp",
        "ico" => "image/x-icon",
        "woff2" => "font/woff2",
        "pdf" => "application/pdf",
        "zip" => "application/zip",
        "mp4" => "video/mp4",
        _ => return None,
    })
}

/// The media type of a static file, from its extension (`application/octet-stream` for an
/// unknown one).
pub(super) fn content_type(path: &std::path::Path) -> &'static str {
    known_content_type(path).unwrap_or("application/octet-stream")
}

/// `file` (`len` bytes long) as the answer, with `status` and `headers` (which get
/// Content-Length, Accept-Ranges and, for one byte range of a 200, Content-Range and 206).
pub(super) async fn file_answer(
    mut file: tokio::fs::File,
    len: u64,
    status: StatusCode,
    request: &HeaderMap,
    mut headers: HeaderMap,
) -> Response<HttpBody> {
    let part = requested_part(request, len);
    let (status, slice) = part_head(status, part, len, &mut headers);
    let body = match slice {
        None => FrontBody::file(FileBody {
            file,
            remaining: len,
        }),
        Some((_, 0)) => FrontBody::full(Bytes::new()),
        Some((start, count)) => {
            if let Err(e) = file.seek(std::io::SeekFrom::Start(start)).await {
                tracing::warn!(error = %e, "cannot seek in a file to send a range of it");
                return plain(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "500 Internal Server Error\n",
                );
            }
            FrontBody::file(FileBody {
                file,
                remaining: count,
            })
        }
    };
    let mut resp = Response::new(body);
    *resp.status_mut() = status;
    *resp.headers_mut() = headers;
    resp
}

/// The bytes of an open file still to send, read [`FILE_CHUNK`] at a time.
pub(super) struct FileBody {
    file: tokio::fs::File,
    remaining: u64,
}

impl FileBody {
    /// Bytes still to send.
    pub(super) fn remaining(&self) -> u64 {
        self.remaining
    }

    /// The next chunk; `None` once every byte went out.
    pub(super) fn poll_chunk(
        &mut self,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BodyError>>> {
        if self.remaining == 0 {
            return Poll::Ready(None);
        }
        let want = usize::try_from(self.remaining)
            .unwrap_or(FILE_CHUNK)
            .min(FILE_CHUNK);
        let mut buf = BytesMut::with_capacity(want);
        match tokio_util::io::poll_read_buf(Pin::new(&mut self.file), cx, &mut buf) {
            Poll::Pending => Poll::Pending,
            Poll::Ready(Ok(n)) => {
                if n == 0 {
                    // The file shrank under us: end early rather than hang.
                    self.remaining = 0;
                    return Poll::Ready(Some(Err("static file shrank while it was sent".into())));
                }
                self.remaining = self.remaining.saturating_sub(n as u64);
                Poll::Ready(Some(Ok(Frame::data(buf.freeze()))))
            }
            Poll::Ready(Err(e)) => {
                self.remaining = 0;
                Poll::Ready(Some(Err(e.into())))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn part(range: &str, len: u64) -> Part {
        let mut h = HeaderMap::new();
        h.insert(http::header::RANGE, HeaderValue::from_str(range).unwrap());
        requested_part(&h, len)
    }

    #[test]
    fn one_byte_range_is_read_as_rfc_9110_says() {
        assert_eq!(part("bytes=0-9", 100), Part::Range { start: 0, end: 9 });
        assert_eq!(part("bytes=90-", 100), Part::Range { start: 90, end: 99 });
        assert_eq!(
            part("bytes=90-500", 100),
            Part::Range { start: 90, end: 99 }
        );
        assert_eq!(part("bytes=-10", 100), Part::Range { start: 90, end: 99 });
        assert_eq!(part("bytes=-500", 100), Part::Range { start: 0, end: 99 });
        assert_eq!(part("bytes=100-", 100), Part::Unsatisfiable);
        assert_eq!(part("bytes=-0", 100), Part::Unsatisfiable);
        assert_eq!(part("bytes=0-0", 0), Part::Unsatisfiable);
        // Anything else is the whole file.
        for whole in [
            "bytes=5-1",
            "bytes=0-1,5-6",
            "items=0-1",
            "bytes=a-b",
            "bytes=-",
            "bytes=1-2-3",
            "bytes=+1-2",
            "bytes=99999999999999999999999-",
        ] {
            assert_eq!(part(whole, 100), Part::Whole, "{whole}");
        }
        let mut h = HeaderMap::new();
        h.insert(http::header::RANGE, HeaderValue::from_static("bytes=0-1"));
        h.insert(http::header::IF_RANGE, HeaderValue::from_static("\"x\""));
        assert_eq!(requested_part(&h, 100), Part::Whole);
    }

    #[test]
    fn a_range_of_another_status_is_sent_whole() {
        let mut h = HeaderMap::new();
        let got = part_head(
            StatusCode::NOT_FOUND,
            Part::Range { start: 0, end: 1 },
            10,
            &mut h,
        );
        assert_eq!(got, (StatusCode::NOT_FOUND, None));
        assert_eq!(h[http::header::CONTENT_LENGTH], "10");
        let got = part_head(StatusCode::OK, Part::Range { start: 2, end: 5 }, 10, &mut h);
        assert_eq!(got, (StatusCode::PARTIAL_CONTENT, Some((2, 4))));
        assert_eq!(h[http::header::CONTENT_RANGE], "bytes 2-5/10");
        assert_eq!(h[http::header::CONTENT_LENGTH], "4");
    }
}
