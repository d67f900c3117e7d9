//! A request body, read whole from the connection before PHP runs (so the connection is in
//! step for the next request whatever the script reads): in memory up to [`MEMORY_BODY`],
//! above that in an unlinked temporary file.

use std::fs::File;
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::os::unix::fs::OpenOptionsExt;

use bytes::Bytes;

/// Bodies above this go to an unlinked temporary file.
pub const MEMORY_BODY: u64 = 1 << 20;

/// Where one request's body is.
pub enum Body {
    /// In memory, with how much PHP has read.
    Memory(Bytes, usize),
    /// Spooled to an unlinked file, read from its start.
    File(File),
}

impl Body {
    /// No body.
    pub fn empty() -> Body {
        Body::Memory(Bytes::new(), 0)
    }

    /// An unlinked file in the temporary directory for a body of more than [`MEMORY_BODY`].
    pub fn spool() -> io::Result<File> {
        std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .mode(0o600)
            .custom_flags(libc::O_TMPFILE | libc::O_CLOEXEC)
            .open(std::env::temp_dir())
    }

    /// The spooled body, rewound for PHP.
    pub fn from_file(mut file: File) -> io::Result<Body> {
        file.flush()?;
        file.seek(SeekFrom::Start(0))?;
        Ok(Body::File(file))
    }

    /// Up to `dst.len()` next bytes; 0 at the end.
    pub fn read(&mut self, dst: &mut [u8]) -> io::Result<usize> {
        match self {
            Body::Memory(bytes, at) => {
                let rest = bytes.get(*at..).unwrap_or_default();
                let n = rest.len().min(dst.len());
                if let (Some(to), Some(from)) = (dst.get_mut(..n), rest.get(..n)) {
                    to.copy_from_slice(from);
                }
                *at += n;
                Ok(n)
            }
            Body::File(file) => file.read(dst),
        }
    }
}
