//! Answering with a file corral opened itself, for the static files of `front::http` and the
//! files a backend names with X-Sendfile or X-Accel-Redirect (`front::sendfile`): the media
//! type by extension, Content-Length, and one byte range (RFC 9110 §14).
//!
//! Only a single range is served as 206; a multi-range request gets the whole file (a 200 is
//! always a valid answer to a Range request), and a request with If-Range gets the whole file
//! too, since corral sends no validator the condition could match. HEAD needs nothing here:
//! hyper sends the head of the GET answer without its body.
//!
//! Every read of a file's contents made for a client runs on the blocking pool through
//! [`off_thread`] or [`FileBody`], each bounded by [`FS_TIMEOUT`], so a file system that hangs
//! in a read pins a pool thread, never a request; static files are opened on the serving
//! thread (docs/decisions.md, decision 41), an X-Sendfile file in the hop that reads it. A
//! small file is read whole in one hop ([`load`]); a larger one is read a chunk at a time
//! with `pread` (the file is shared, its offset never moves).

use std::fs::File;
use std::future::Future;
use std::os::unix::fs::FileExt;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use http::header::HeaderValue;
use http::{HeaderMap, Response, StatusCode};
use http_body::Frame;
use tokio::task::JoinHandle;
use tokio::time::Sleep;

use crate::backend::BodyError;
use crate::front::http::{FrontBody, HttpBody};

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
fn known_content_type(path: &std::path::Path) -> Option<&'static str> {
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

/// How long one file-system call made for a client (an open, a read of one chunk) may take
/// on the blocking pool before the request gives up on it. A local file system answers in
/// milliseconds; this bounds a hung network mount.
pub(crate) const FS_TIMEOUT: Duration = Duration::from_secs(10);

/// Files up to this size are read whole in the same blocking-pool hop that opens them and
/// answered from memory, so a small static file costs one hop.
pub(super) const SMALL_FILE: u64 = 64 * 1024;

/// Runs `f` (blocking file-system calls made for a client) on the blocking pool and waits
/// for it at most [`FS_TIMEOUT`]: a call that never returns pins one pool thread, never the
/// request, and the error (`TimedOut`) is answered at once.
pub(super) async fn off_thread<T: Send + 'static>(
    f: impl FnOnce() -> T + Send + 'static,
) -> std::io::Result<T> {
    off_thread_within(FS_TIMEOUT, f).await
}

async fn off_thread_within<T: Send + 'static>(
    limit: Duration,
    f: impl FnOnce() -> T + Send + 'static,
) -> std::io::Result<T> {
    match tokio::time::timeout(limit, tokio::task::spawn_blocking(f)).await {
        Ok(Ok(done)) => Ok(done),
        Ok(Err(join)) => Err(std::io::Error::other(join)),
        Err(_) => Err(std::io::Error::new(
            std::io::ErrorKind::TimedOut,
            format!("the file system did not answer within {limit:?}"),
        )),
    }
}

/// An opened file's contents as the answer will take them.
pub(super) enum FileData {
    /// Read whole already (a file of at most [`SMALL_FILE`] bytes).
    Whole(Bytes),
    /// Still to read, chunk by chunk, at offsets (`pread`, so one file can serve many).
    Open(Arc<File>),
}

/// A regular file opened for an answer: its descriptor, its length, and its contents when
/// they were read whole already.
pub(super) struct Loaded {
    /// The descriptor.
    pub(super) file: Arc<File>,
    /// Its length (the bytes read, when read whole).
    pub(super) len: u64,
    /// Its contents, for a small file read whole.
    pub(super) whole: Option<Bytes>,
}

impl Loaded {
    /// A regular file of `len` bytes, opened, none of it read yet.
    pub(super) fn unread(file: File, len: u64) -> Loaded {
        Loaded {
            file: Arc::new(file),
            len,
            whole: None,
        }
    }

    /// The contents as the answer takes them, with their length.
    pub(super) fn into_data(self) -> (FileData, u64) {
        match self.whole {
            Some(bytes) => (FileData::Whole(bytes), self.len),
            None => (FileData::Open(self.file), self.len),
        }
    }
}

/// `file`, opened and found to be a regular file of `len` bytes, read whole when it is small
/// and `read` (a GET), left open otherwise. Blocking: call it off the serving thread. The
/// length is the bytes read when read whole (shorter than `len` if the file shrank).
pub(super) fn load(file: File, len: u64, read: bool) -> std::io::Result<Loaded> {
    let whole = if read && len <= SMALL_FILE {
        Some(read_at(&file, 0, len)?)
    } else {
        None
    };
    let len = whole.as_ref().map_or(len, |b| b.len() as u64);
    Ok(Loaded {
        file: Arc::new(file),
        len,
        whole,
    })
}

/// Up to `count` bytes of `file` from `offset`, fewer only at its end.
pub(super) fn read_at(file: &File, offset: u64, count: u64) -> std::io::Result<Bytes> {
    let want = usize::try_from(count).unwrap_or(usize::MAX);
    let mut buf = BytesMut::zeroed(want);
    let mut got = 0;
    while let Some(rest) = buf.get_mut(got..).filter(|r| !r.is_empty()) {
        match file.read_at(rest, offset + got as u64) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    buf.truncate(got);
    Ok(buf.freeze())
}

/// A file (`len` bytes long) as the answer, with `status` and `headers` (which get
/// Content-Length, Accept-Ranges and, for one byte range of a 200, Content-Range and 206).
pub(super) fn file_answer(
    data: FileData,
    len: u64,
    status: StatusCode,
    request: &HeaderMap,
    mut headers: HeaderMap,
) -> Response<HttpBody> {
    let part = requested_part(request, len);
    let (status, slice) = part_head(status, part, len, &mut headers);
    let (start, count) = slice.unwrap_or((0, len));
    let body = match data {
        _ if count == 0 => FrontBody::full(Bytes::new()),
        FileData::Whole(bytes) => {
            let start = usize::try_from(start).unwrap_or(usize::MAX);
            let end = start.saturating_add(usize::try_from(count).unwrap_or(usize::MAX));
            FrontBody::full(bytes.slice(start.min(bytes.len())..end.min(bytes.len())))
        }
        FileData::Open(file) => FrontBody::file(FileBody {
            file,
            offset: start,
            remaining: count,
            pending: None,
            timer: None,
        }),
    };
    let mut resp = Response::new(body);
    *resp.status_mut() = status;
    *resp.headers_mut() = headers;
    resp
}

/// One chunk's read on the blocking pool.
type ReadChunk = JoinHandle<std::io::Result<Bytes>>;

/// The bytes of an open file still to send, read [`FILE_CHUNK`] at a time on the blocking
/// pool, each read bounded by [`FS_TIMEOUT`].
pub(super) struct FileBody {
    file: Arc<File>,
    offset: u64,
    remaining: u64,
    pending: Option<ReadChunk>,
    timer: Option<Pin<Box<Sleep>>>,
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
        if self.pending.is_none() {
            let (file, offset) = (Arc::clone(&self.file), self.offset);
            let count = self.remaining.min(FILE_CHUNK as u64);
            let deadline = tokio::time::Instant::now() + FS_TIMEOUT;
            match &mut self.timer {
                Some(t) => t.as_mut().reset(deadline),
                None => self.timer = Some(Box::pin(tokio::time::sleep_until(deadline))),
            }
            self.pending = Some(tokio::task::spawn_blocking(move || {
                read_at(&file, offset, count)
            }));
        }
        let Some(pending) = self.pending.as_mut() else {
            return Poll::Ready(None);
        };
        let read = match Pin::new(pending).poll(cx) {
            Poll::Ready(read) => read,
            Poll::Pending => {
                if self
                    .timer
                    .as_mut()
                    .is_some_and(|t| t.as_mut().poll(cx).is_ready())
                {
                    self.pending = None;
                    self.remaining = 0;
                    return Poll::Ready(Some(Err(format!(
                        "a read of the file took longer than {FS_TIMEOUT:?}"
                    )
                    .into())));
                }
                return Poll::Pending;
            }
        };
        self.pending = None;
        match read {
            Ok(Ok(chunk)) if chunk.is_empty() => {
                // The file shrank under us: end early rather than hang.
                self.remaining = 0;
                Poll::Ready(Some(Err("static file shrank while it was sent".into())))
            }
            Ok(Ok(chunk)) => {
                self.offset += chunk.len() as u64;
                self.remaining = self.remaining.saturating_sub(chunk.len() as u64);
                Poll::Ready(Some(Ok(Frame::data(chunk))))
            }
            Ok(Err(e)) => {
                self.remaining = 0;
                Poll::Ready(Some(Err(e.into())))
            }
            Err(join) => {
                self.remaining = 0;
                Poll::Ready(Some(Err(join.into())))
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

    #[tokio::test]
    async fn a_file_system_call_that_never_returns_is_given_up_on() {
        let (release, wait) = std::sync::mpsc::channel::<()>();
        let got = off_thread_within(Duration::from_millis(50), move || wait.recv()).await;
        assert_eq!(got.unwrap_err().kind(), std::io::ErrorKind::TimedOut);
        // The pool thread is released; the request did not wait for it.
        drop(release);
        let quick = off_thread_within(Duration::from_secs(5), || 7).await;
        assert_eq!(quick.unwrap(), 7);
    }

    #[test]
    fn a_small_file_is_read_whole_and_a_range_sliced_from_it() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("a.txt");
        std::fs::write(&path, "0123456789").unwrap();
        let (data, len) = load(File::open(&path).unwrap(), 10, true)
            .unwrap()
            .into_data();
        assert!(matches!(&data, FileData::Whole(b) if &b[..] == b"0123456789"));
        let mut h = HeaderMap::new();
        h.insert(http::header::RANGE, HeaderValue::from_static("bytes=2-4"));
        let resp = file_answer(data, len, StatusCode::OK, &h, HeaderMap::new());
        assert_eq!(resp.status(), StatusCode::PARTIAL_CONTENT);
        assert_eq!(resp.headers()[http::header::CONTENT_LENGTH], "3");
        // A HEAD leaves it unread; a large one too.
        let (data, _) = load(File::open(&path).unwrap(), 10, false)
            .unwrap()
            .into_data();
        assert!(matches!(data, FileData::Open(_)));
    }
}
