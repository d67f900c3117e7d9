//! Spooling a request body of unknown length (a chunked upload) to learn its length, for the
//! protocols that must announce it before the body (SCGI's CONTENT_LENGTH, LSAPI's
//! BEGIN_REQUEST): small bodies stay in memory, larger ones go to an unlinked temporary file,
//! and a body over the limit is refused, so memory stays bounded (DESIGN decision 4).

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

/// Makes spool file names unique within this process.
static SPOOL_COUNTER: AtomicU64 = AtomicU64::new(0);

/// Returns `body` unchanged if its length is known, else a body of known length holding the
/// same bytes, read to its end first. SCGI and LSAPI call it themselves; a front that wants
/// a FastCGI backend to see a `CONTENT_LENGTH` for a chunked body (php-cgi reads no body
/// without one) calls it before building the parameters.
pub async fn spool_body(
    mut body: RequestBody,
    config: &SpoolConfig,
) -> Result<RequestBody, BackendError> {
    if body.len().is_some() {
        return Ok(body);
    }
    let mut memory = BytesMut::new();
    let mut file: Option<File> = None;
    let mut total = 0u64;
    while let Some(chunk) = body.next_chunk().await {
        let chunk = chunk.map_err(|source| BackendError::ClientBody { source })?;
        total += chunk.len() as u64;
        if total > config.max_bytes {
            return Err(BackendError::BodyTooLarge {
                limit: config.max_bytes,
            });
        }
        match file.as_mut() {
            Some(f) => write(f, &chunk, &config.dir).await?,
            None if memory.len() + chunk.len() <= config.memory_bytes => {
                memory.extend_from_slice(&chunk);
            }
            None => {
                let mut f = create(&config.dir).await?;
                write(&mut f, &memory, &config.dir).await?;
                write(&mut f, &chunk, &config.dir).await?;
                memory = BytesMut::new();
                file = Some(f);
            }
        }
    }
    let Some(mut file) = file else {
        return Ok(RequestBody::full(memory.freeze()));
    };
    let rewind = async {
        file.flush().await?;
        file.seek(SeekFrom::Start(0)).await
    };
    rewind.await.map_err(|e| spool_error(&config.dir, e))?;
    let source = FileBody {
        file,
        remaining: total,
        buf: BytesMut::new(),
    };
    Ok(RequestBody::from_source(source, Some(total)))
}

fn spool_error(dir: &Path, source: std::io::Error) -> BackendError {
    BackendError::Spool {
        dir: dir.display().to_string(),
        source,
    }
}

async fn write(file: &mut File, bytes: &[u8], dir: &Path) -> Result<(), BackendError> {
    file.write_all(bytes).await.map_err(|e| spool_error(dir, e))
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
