//! Whether the script a classic-mode request names is a regular file, so that a missing one
//! is answered 404 "No input file specified." (php-cgi's answer) without starting PHP.
//!
//! The answer "it is a file" is remembered for [`SEEN_FOR_MS`] for the last path asked about:
//! a request for the same script within that time makes no stat(2) (strace: it was one of
//! the worker's 14 system calls per request, and the only one PHP did not make). That window
//! is OPcache's own: with `opcache.revalidate_freq` at its default of 2 s, PHP itself runs a
//! cached script for up to 2 s after its file was removed, and corral's script guard in front
//! remembers a path that passed for as long (ARCHITECTURE.md invariant 2). A script removed
//! within the window is then run by PHP as it would be without this check (the cached copy,
//! or PHP's own error); a missing file is never remembered, so it is answered 404 at once,
//! and so is every request for it after the window.

use std::cell::RefCell;
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;

/// How long a path found to be a file is taken to still be one, in milliseconds.
pub const SEEN_FOR_MS: u64 = 2_000;

/// The last path found to be a file, and when (milliseconds on the monotonic clock).
#[derive(Default)]
pub struct Seen {
    path: Vec<u8>,
    at: Option<u64>,
}

impl Seen {
    /// Whether `path` is a regular file: remembered if it was found to be one at most
    /// [`SEEN_FOR_MS`] before `now`, else asked of `is_file` (and remembered when it is).
    /// Without a time (`None`: no clock) nothing is remembered and every call asks.
    pub fn is_file(
        &mut self,
        path: &[u8],
        now: Option<u64>,
        is_file: impl FnOnce(&[u8]) -> bool,
    ) -> bool {
        if let (Some(at), Some(now)) = (self.at, now) {
            // A clock that went back (it cannot) is taken for one past the window.
            let fresh = now.checked_sub(at).is_some_and(|age| age <= SEEN_FOR_MS);
            if fresh && self.path == path {
                return true;
            }
        }
        if !is_file(path) {
            return false;
        }
        self.path.clear();
        self.path.extend_from_slice(path);
        self.at = now;
        true
    }
}

thread_local! {
    static SEEN: RefCell<Seen> = RefCell::new(Seen::default());
}

/// Whether the script `path` is a regular file (see the module's note on what is
/// remembered).
pub fn exists(path: &[u8]) -> bool {
    if path.is_empty() {
        return false;
    }
    SEEN.with(|seen| match seen.try_borrow_mut() {
        Ok(mut seen) => seen.is_file(path, now_ms(), stat_is_file),
        Err(_) => stat_is_file(path),
    })
}

fn stat_is_file(path: &[u8]) -> bool {
    std::fs::metadata(OsStr::from_bytes(path)).is_ok_and(|m| m.is_file())
}

/// Milliseconds on the coarse monotonic clock (read from the vDSO: no system call; its
/// few milliseconds of resolution are nothing beside the window); `None` without one.
fn now_ms() -> Option<u64> {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime(2) writes one timespec, which `ts` is.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC_COARSE, &mut ts) };
    if rc != 0 {
        return None;
    }
    let secs = u64::try_from(ts.tv_sec).ok()?;
    let millis = u64::try_from(ts.tv_nsec).ok()? / 1_000_000;
    Some(secs.saturating_mul(1000).saturating_add(millis))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::Cell;

    /// A checker that answers `answer` and counts its calls.
    fn checker<'c>(calls: &'c Cell<u32>, answer: bool) -> impl FnOnce(&[u8]) -> bool + 'c {
        move |_| {
            calls.set(calls.get() + 1);
            answer
        }
    }

    #[test]
    fn a_file_is_remembered_for_the_window_only() {
        let calls = Cell::new(0);
        let mut seen = Seen::default();
        assert!(seen.is_file(b"/w/a.php", Some(1_000), checker(&calls, true)));
        assert_eq!(calls.get(), 1);
        // Within the window: not asked again, whatever the file system would say.
        assert!(seen.is_file(
            b"/w/a.php",
            Some(1_000 + SEEN_FOR_MS),
            checker(&calls, false)
        ));
        assert_eq!(calls.get(), 1);
        // Past it: asked, and a file gone is gone.
        assert!(!seen.is_file(
            b"/w/a.php",
            Some(1_001 + SEEN_FOR_MS),
            checker(&calls, false)
        ));
        assert_eq!(calls.get(), 2);
        // A miss is not remembered: asked again at once.
        assert!(!seen.is_file(
            b"/w/a.php",
            Some(1_002 + SEEN_FOR_MS),
            checker(&calls, false)
        ));
        assert_eq!(calls.get(), 3);
    }

    #[test]
    fn another_path_is_always_asked() {
        let calls = Cell::new(0);
        let mut seen = Seen::default();
        assert!(seen.is_file(b"/w/a.php", Some(5), checker(&calls, true)));
        assert!(!seen.is_file(b"/w/b.php", Some(6), checker(&calls, false)));
        // A prefix or an extension of the path remembered is another path.
        assert!(!seen.is_file(b"/w/a.ph", Some(7), checker(&calls, false)));
        assert!(!seen.is_file(b"/w/a.php/x", Some(8), checker(&calls, false)));
        assert_eq!(calls.get(), 4);
        // The path remembered is still the last file found.
        assert!(seen.is_file(b"/w/a.php", Some(9), checker(&calls, false)));
        assert_eq!(calls.get(), 4);
    }

    #[test]
    fn no_clock_means_every_request_asks() {
        let calls = Cell::new(0);
        let mut seen = Seen::default();
        assert!(seen.is_file(b"/w/a.php", Some(10), checker(&calls, true)));
        assert!(!seen.is_file(b"/w/a.php", None, checker(&calls, false)));
        // A file found without a time is not remembered, not even for a later clock.
        assert!(seen.is_file(b"/w/b.php", None, checker(&calls, true)));
        assert!(!seen.is_file(b"/w/b.php", Some(11), checker(&calls, false)));
        // A clock gone back is past the window.
        assert!(seen.is_file(b"/w/c.php", Some(100), checker(&calls, true)));
        assert!(!seen.is_file(b"/w/c.php", Some(99), checker(&calls, false)));
        assert_eq!(calls.get(), 6);
    }

    #[test]
    fn the_real_check_finds_files_only() {
        let dir = std::env::temp_dir();
        let file = dir.join(format!("corral-script-test-{}", std::process::id()));
        std::fs::write(&file, b"<?php").unwrap();
        assert!(stat_is_file(file.as_os_str().as_bytes()));
        assert!(!stat_is_file(dir.as_os_str().as_bytes()));
        std::fs::remove_file(&file).unwrap();
        assert!(!stat_is_file(file.as_os_str().as_bytes()));
        assert!(!exists(b""));
    }
}
