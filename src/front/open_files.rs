//! The static files' open-file cache: each serving thread keeps the descriptors of the files
//! it served, by root and normalised path, and serves them again from the descriptor for
//! [`VALID_FOR`] before it opens the file afresh, as nginx's `open_file_cache` does with its
//! `open_file_cache_valid` (60 s by default; 2 s here, as the script guard remembers a pass).
//!
//! An entry is made only for a file `static_file` opened beneath its root and found to be a
//! regular file, so what is cached passed the checks of ARCHITECTURE.md invariant 17; the
//! rules that depend on the context (source extensions, hidden names) are judged again on
//! every hit from the real name kept with the descriptor, since they cost no system call.
//! A hit costs no blocking-pool hop: one `fstat` of the descriptor on the serving thread (a
//! file deleted or renamed over since, which has no link left, or written to another length,
//! is opened afresh: so a deploy's atomic rename is seen at once, unlike nginx's cache), then
//! a small file is read with one `pread`, a larger one streams from the descriptor.
//!
//! What a cached descriptor can miss within [`VALID_FOR`] is a file moved away (it keeps its
//! link) or rewritten in place to the same length mid-read. Per thread,
//! so a hit takes no lock; looked up by borrowed bytes, so a hit allocates nothing. At most
//! [`MAX_OPEN`] descriptors per thread and root; stale entries are swept whenever one is added.

use std::cell::RefCell;
use std::collections::HashMap;
use std::fs::File;
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use crate::front::file::{self, Loaded, SMALL_FILE};

/// How long a thread serves a file from its cached descriptor.
pub(super) const VALID_FOR: Duration = Duration::from_secs(2);
/// Descriptors one thread keeps per root at most; when full it starts over.
const MAX_OPEN: usize = 256;

/// A cached file.
#[derive(Clone)]
pub(super) struct Cached {
    /// The descriptor, opened beneath the root.
    pub(super) file: Arc<File>,
    /// Its length when it was opened.
    pub(super) len: u64,
    /// Its real path under the real root, when a symlink led to it.
    pub(super) real: Option<Arc<Path>>,
}

struct Entry {
    cached: Cached,
    at: Instant,
}

type Files = HashMap<Vec<u8>, HashMap<Vec<u8>, Entry>>;

thread_local! {
    /// The open files, by root and then normalised path.
    static OPEN: RefCell<Files> = RefCell::default();
}

/// The file `norm` under `root` as this thread cached it within [`VALID_FOR`] of `now`,
/// ready to answer (read whole when `read` and small); `None` when there is none, or when
/// the cached descriptor no longer fits (then the entry is dropped).
pub(super) fn get(root: &[u8], norm: &[u8], now: Instant, read: bool) -> Option<(Loaded, Cached)> {
    let cached = OPEN.with(|open| {
        open.borrow()
            .get(root)
            .and_then(|files| files.get(norm))
            .filter(|e| now.duration_since(e.at) < VALID_FOR)
            .map(|e| e.cached.clone())
    })?;
    // One fstat: a file deleted or renamed over since (a deploy's atomic rename) has no
    // link left, and one written to another length is not what was opened.
    let current = cached.file.metadata().ok();
    if current.is_none_or(|m| m.nlink() == 0 || m.len() != cached.len) {
        forget(root, norm);
        return None;
    }
    let whole = if read && cached.len <= SMALL_FILE {
        match file::read_at(&cached.file, 0, cached.len) {
            Ok(bytes) if bytes.len() as u64 == cached.len => Some(bytes),
            _ => {
                forget(root, norm);
                return None;
            }
        }
    } else {
        None
    };
    let loaded = Loaded {
        file: Arc::clone(&cached.file),
        len: cached.len,
        whole,
    };
    Some((loaded, cached))
}

/// Remembers `cached` for `norm` under `root` from `now`.
pub(super) fn put(root: &[u8], norm: &[u8], cached: Cached, now: Instant) {
    OPEN.with(|open| {
        let mut open = open.borrow_mut();
        // A root no longer served (a symlink deploy moved the generation to the next
        // release's real root, src/deploy/links.rs) keeps no descriptor past its validity.
        open.retain(|r, files| {
            r.as_slice() == root || files.values().any(|e| now.duration_since(e.at) < VALID_FOR)
        });
        let files = match open.get_mut(root) {
            Some(files) => files,
            None => open.entry(root.to_vec()).or_default(),
        };
        // Swept here, where a blocking-pool hop was just paid, so a deleted file's
        // descriptor is not held long past its validity.
        files.retain(|_, e| now.duration_since(e.at) < VALID_FOR);
        if files.len() >= MAX_OPEN {
            files.clear();
        }
        files.insert(norm.to_vec(), Entry { cached, at: now });
    });
}

fn forget(root: &[u8], norm: &[u8]) {
    OPEN.with(|open| {
        if let Some(files) = open.borrow_mut().get_mut(root) {
            files.remove(norm);
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cache(path: &Path, now: Instant) {
        let file = File::open(path).unwrap();
        let len = file.metadata().unwrap().len();
        let cached = Cached {
            file: Arc::new(file),
            len,
            real: None,
        };
        put(b"/r", b"/a.txt", cached, now);
    }

    #[tokio::test(start_paused = true)]
    async fn a_descriptor_serves_for_its_period_and_a_changed_length_is_noticed() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("a.txt");
        std::fs::write(&path, "one").unwrap();
        cache(&path, Instant::now());
        let (hit, _) = get(b"/r", b"/a.txt", Instant::now(), true).unwrap();
        assert_eq!(hit.whole.as_deref(), Some(&b"one"[..]));
        // A HEAD reads nothing.
        let (head, _) = get(b"/r", b"/a.txt", Instant::now(), false).unwrap();
        assert!(head.whole.is_none());
        // Written in place to another length: not served from the descriptor.
        std::fs::write(&path, "longer").unwrap();
        assert!(get(b"/r", b"/a.txt", Instant::now(), true).is_none());
        // Renamed over (a deploy): the cached file has no link left.
        cache(&path, Instant::now());
        std::fs::write(dir.path().join("new"), "si").unwrap();
        std::fs::rename(dir.path().join("new"), &path).unwrap();
        assert!(get(b"/r", b"/a.txt", Instant::now(), true).is_none());
        // Expired after VALID_FOR.
        cache(&path, Instant::now());
        assert!(get(b"/r", b"/a.txt", Instant::now(), true).is_some());
        tokio::time::advance(VALID_FOR).await;
        assert!(get(b"/r", b"/a.txt", Instant::now(), true).is_none());
        assert!(get(b"/other", b"/a.txt", Instant::now(), true).is_none());
    }

    #[tokio::test(start_paused = true)]
    async fn a_root_no_longer_served_keeps_no_descriptor() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("a.txt");
        std::fs::write(&path, "one").unwrap();
        cache(&path, Instant::now());
        let roots = || OPEN.with(|open| open.borrow().len());
        assert_eq!(roots(), 1);
        tokio::time::advance(VALID_FOR).await;
        // The next release's root caches its first file: the old root's descriptors go.
        let file = Arc::new(File::open(&path).unwrap());
        let cached = Cached {
            file,
            len: 3,
            real: None,
        };
        put(b"/releases/2", b"/a.txt", cached, Instant::now());
        assert_eq!(roots(), 1);
        assert!(OPEN.with(|open| open.borrow().contains_key(&b"/releases/2"[..])));
    }
}
