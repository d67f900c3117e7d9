//! Test helpers: what the process's epoll sets hold for a descriptor, read from
//! /proc/self/fdinfo, to check which readiness a socket is registered for.

use std::os::fd::RawFd;

/// The events the epoll sets of the process hold for descriptor `fd` of the socket
/// whose inode is `ino`, from /proc/self/fdinfo (the inode tells this test's socket
/// from a descriptor of the same number in a test running beside it). An epoll set the
/// process holds under two descriptors (mio keeps a duplicate) is counted once.
pub(crate) fn epoll_events(fd: RawFd, ino: u64) -> Vec<u32> {
    let mut found = std::collections::BTreeMap::new();
    for entry in std::fs::read_dir("/proc/self/fdinfo").unwrap().flatten() {
        let Ok(info) = std::fs::read_to_string(entry.path()) else {
            continue;
        };
        let epoll = info
            .lines()
            .find_map(|l| l.strip_prefix("ino:"))
            .map(str::trim)
            .unwrap_or_default()
            .to_owned();
        for line in info.lines().filter(|l| l.starts_with("tfd:")) {
            let words: Vec<&str> = line.split_whitespace().collect();
            let field = |name: &str| {
                words
                    .iter()
                    .position(|w| *w == name)
                    .and_then(|i| words.get(i + 1))
                    .copied()
            };
            let tfd = field("tfd:").and_then(|w| w.parse::<RawFd>().ok());
            let events = field("events:").and_then(|w| u32::from_str_radix(w, 16).ok());
            let same = words
                .iter()
                .any(|w| w.strip_prefix("ino:") == Some(&format!("{ino:x}")));
            if let (Some(t), Some(e), true) = (tfd, events, same) {
                if t == fd {
                    found.insert(epoll.clone(), e);
                }
            }
        }
    }
    found.into_values().collect()
}

/// The inode of the socket behind `fd`.
pub(crate) fn inode(fd: RawFd) -> u64 {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(format!("/proc/self/fd/{fd}"))
        .unwrap()
        .ino()
}
