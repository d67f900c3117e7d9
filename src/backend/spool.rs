//! Spooling a request body of unknown length (a chunked upload) to learn its length, for the
//! protocols that must announce it before the body (SCGI's CONTENT_LENGTH, LSAPI's
//! BEGIN_REQUEST): small bodies stay in memory, larger ones go to an unlinked temporary file,
//! and a body over the limit is refused, so memory stays bounded (ARCHITECTURE.md invariant 4).

use std::io::SeekFrom;
use std::path::Path;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};

use bytes::{Bytes, BytesMut};
use tokio::fs::File;
use tokio::io::{AsyncRead, AsyncSeekExt, AsyncWriteExt, ReadBuf};

use super::{BackendError, BodyError, BodySource, RequestBody, SpoolConfig};

/// Bytes read back from the spool file per chunk.
const READ_CHUNK: usize = 64 * 1024;

/// Bytes gathered in memory before one write to the spool file. Each write to a
/// `tokio::fs::File` is a trip to the blocking pool: one per chunk made a body sent in 1-byte
/// chunks cost 2 s of CPU per 128 KiB; gathered, a chunk costs a copy, whatever its size.
const WRITE_BUFFER: usize = 64 * 1024;

/// Makes spool file names unique within this process.
static SPOOL_COUNTER: AtomicU64 = AtomicU64::new(0);

/// Returns `body` unchanged if its length is known, else a body of known length holding the
/// same bytes, read to its end first. SCGI and LSAPI call it themselves; a front that wants
/// a FastCGI backend to see a `CONTENT_LENGTH` for a chunked body (php-cgi reads no body
/// without one) calls it before building the parameters.
pub async fn spool_body(
    body: RequestBody,
    config: &SpoolConfig,
) -> Result<RequestBody, BackendError> {
    if body.len().is_some() {
        return Ok(body);
    }
    buffer_body(body, config).await
}

/// Reads all of `body` before anything is sent on, whether or not its length is known (the
/// request buffering nginx does), so that a slow client uploads into corral's spool rather
/// than into a worker it would hold for as long as the upload takes. A declared length is
/// held to: fewer or more bytes is [`BackendError::BodyLength`].
pub async fn buffer_body(
    mut body: RequestBody,
    config: &SpoolConfig,
) -> Result<RequestBody, BackendError> {
    let declared = body.len();
    if declared == Some(0) {
        return Ok(body);
    }
    let mut memory = BytesMut::new();
    let mut file: Option<SpoolFile> = None;
    let mut total = 0u64;
    while let Some(chunk) = body.next_chunk().await {
        let chunk = chunk.map_err(|source| BackendError::ClientBody { source })?;
        total += chunk.len() as u64;
        if total > config.max_bytes {
            return Err(BackendError::BodyTooLarge {
                limit: config.max_bytes,
            });
        }
        if let Some(expected) = declared.filter(|&d| total > d) {
            return Err(BackendError::BodyLength {
                declared: expected,
                actual: total,
            });
        }
        match file.as_mut() {
            Some(spool) => {
                spool.held.take(chunk.len() as u64)?;
                spool.push(&chunk, &config.dir).await?;
            }
            None if memory.len() + chunk.len() <= config.memory_bytes => {
                memory.extend_from_slice(&chunk);
            }
            None => {
                let mut held = Reservation::new(&config.budget);
                held.take((memory.len() + chunk.len()) as u64)?;
                let mut spool = SpoolFile {
                    file: create(&config.dir).await?,
                    buf: BytesMut::with_capacity(WRITE_BUFFER),
                    held,
                };
                spool.push(&memory, &config.dir).await?;
                spool.push(&chunk, &config.dir).await?;
                memory = BytesMut::new();
                file = Some(spool);
            }
        }
    }
    if let Some(expected) = declared.filter(|&d| total != d) {
        return Err(BackendError::BodyLength {
            declared: expected,
            actual: total,
        });
    }
    let Some(SpoolFile {
        mut file,
        buf,
        held,
    }) = file
    else {
        return Ok(RequestBody::full(memory.freeze()));
    };
    let rewind = async {
        file.write_all(&buf).await?;
        file.flush().await?;
        file.seek(SeekFrom::Start(0)).await
    };
    rewind.await.map_err(|e| spool_error(&config.dir, e))?;
    let source = FileBody {
        file,
        remaining: total,
        buf: BytesMut::new(),
        _held: held,
    };
    Ok(RequestBody::from_source(source, Some(total)))
}

/// Bytes of the spool budget held by one spooled body, given back when it is dropped.
struct Reservation {
    budget: std::sync::Arc<super::SpoolBudget>,
    bytes: u64,
}

impl Reservation {
    fn new(budget: &std::sync::Arc<super::SpoolBudget>) -> Reservation {
        Reservation {
            budget: std::sync::Arc::clone(budget),
            bytes: 0,
        }
    }

    fn take(&mut self, n: u64) -> Result<(), BackendError> {
        if !self.budget.reserve(n) {
            return Err(BackendError::SpoolBudget {
                limit: self.budget.limit,
            });
        }
        self.bytes += n;
        Ok(())
    }
}

impl Drop for Reservation {
    fn drop(&mut self) {
        self.budget.release(self.bytes);
    }
}

fn spool_error(dir: &Path, source: std::io::Error) -> BackendError {
    BackendError::Spool {
        dir: dir.display().to_string(),
        source,
    }
}

/// The spool file of one body, the bytes not yet written to it, and the budget it holds.
struct SpoolFile {
    file: File,
    buf: BytesMut,
    held: Reservation,
}

impl SpoolFile {
    /// Appends `bytes`, writing to the file only when [`WRITE_BUFFER`] bytes are gathered.
    async fn push(&mut self, bytes: &[u8], dir: &Path) -> Result<(), BackendError> {
        self.buf.extend_from_slice(bytes);
        if self.buf.len() >= WRITE_BUFFER {
            self.file
                .write_all(&self.buf)
                .await
                .map_err(|e| spool_error(dir, e))?;
            self.buf.clear();
        }
        Ok(())
    }
}

/// A new file only this process can read, unlinked at once so that nothing is left behind
/// whatever happens to the request or the process.
async fn create(dir: &Path) -> Result<File, BackendError> {
    let name = format!(
        "corral-spool-{}-{}",
        std::process::id(),
        SPOOL_COUNTER.fetch_add(1, Ordering::Relaxed)
    );
    let path = dir.join(name);
    let file = tokio::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&path)
        .await
        .map_err(|e| spool_error(dir, e))?;
    tokio::fs::remove_file(&path)
        .await
        .map_err(|e| spool_error(dir, e))?;
    Ok(file)
}

/// Reads a spool file back in chunks.
struct FileBody {
    file: File,
    remaining: u64,
    buf: BytesMut,
    _held: Reservation,
}

impl BodySource for FileBody {
    fn poll_chunk(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Bytes, BodyError>>> {
        let this = self.get_mut();
        if this.remaining == 0 {
            return Poll::Ready(None);
        }
        let want = usize::try_from(this.remaining).map_or(READ_CHUNK, |r| r.min(READ_CHUNK));
        this.buf.resize(want, 0);
        let mut read = ReadBuf::new(&mut this.buf);
        match Pin::new(&mut this.file).poll_read(cx, &mut read) {
            Poll::Ready(Ok(())) => {
                let n = read.filled().len();
                if n == 0 {
                    return Poll::Ready(Some(Err("the spool file ended before the body".into())));
                }
                this.remaining -= n as u64;
                Poll::Ready(Some(Ok(this.buf.split_to(n).freeze())))
            }
            Poll::Ready(Err(e)) => Poll::Ready(Some(Err(e.into()))),
            Poll::Pending => Poll::Pending,
        }
    }
}
