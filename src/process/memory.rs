//! The memory a worker costs: PSS summed over the worker and every process it forked, read
//! from `/proc` (ARCHITECTURE.md decision 7, `max_memory`).
//!
//! PSS (proportional set size, `/proc/PID/smaps_rollup`) charges each shared page to the
//! processes sharing it in equal parts, so a pool's workers sum to what they really cost,
//! where RSS would count php's shared opcode pages once per worker. When a process's PSS
//! cannot be read (a kernel before 4.14, or a process we may not inspect) the total PSS is
//! unknown and callers fall back to the RSS sum (`VmRSS` in `/proc/PID/status`).
//!
//! The file parsers are pure functions of the file text; only [`process_tree_pss`] reads.

use std::collections::HashMap;
use std::io;
use std::path::Path;

/// Memory used by one worker's process tree.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MemoryUsage {
    /// Sum of PSS over the tree; `None` when any process's PSS could not be read.
    pub pss_bytes: Option<u64>,
    /// Sum of resident set sizes over the tree (pages shared between them count repeatedly).
    pub rss_bytes: u64,
    /// How many processes the tree held (the worker itself included).
    pub processes: usize,
    /// Sum of private memory (USS: `Private_Clean` + `Private_Dirty` in smaps_rollup) over
    /// the tree: what ending the tree would give back; `None` when any process's could not
    /// be read.
    pub uss_bytes: Option<u64>,
}

impl MemoryUsage {
    /// The figure recycling compares with `max_memory`: PSS, or RSS where PSS is unknown.
    pub fn bytes(&self) -> u64 {
        self.pss_bytes.unwrap_or(self.rss_bytes)
    }
}

/// Reads the memory of `pid` and all its descendants.
///
/// Descendants are found by one pass over `/proc/*/stat` (parent pids), which needs no
/// kernel option, unlike `/proc/PID/task/TID/children`. Processes that exit during the walk
/// are skipped. Fails with `NotFound` when `pid` itself does not exist.
pub fn process_tree_pss(pid: u32) -> io::Result<MemoryUsage> {
    memory_of(pid, &process_tree(pid)?)
}

/// `pid` and all its descendants, by one pass over `/proc/*/stat`.
pub fn process_tree(pid: u32) -> io::Result<Vec<u32>> {
    Ok(descendants_of(pid, &parent_map(Path::new("/proc"))?))
}

/// Reads the memory of the processes `tree` (a tree found by [`process_tree`], rooted at
/// `pid`), without walking `/proc` again: two small reads per process, cheap enough to do
/// after a request. Members that have exited are skipped; `NotFound` when `pid` has.
pub fn memory_of(pid: u32, tree: &[u32]) -> io::Result<MemoryUsage> {
    let mut usage = MemoryUsage {
        pss_bytes: Some(0),
        rss_bytes: 0,
        processes: 0,
        uss_bytes: Some(0),
    };
    for &member in tree {
        let dir = Path::new("/proc").join(member.to_string());
        let status = match std::fs::read_to_string(dir.join("status")) {
            Ok(text) => text,
            Err(e) if member != pid && e.kind() == io::ErrorKind::NotFound => continue,
            Err(e) => return Err(e),
        };
        usage.processes += 1;
        usage.rss_bytes += parse_status_rss(&status).unwrap_or(0);
        let rollup = std::fs::read_to_string(dir.join("smaps_rollup")).ok();
        let pss = rollup.as_deref().map(parse_smaps_rollup_pss);
        usage.pss_bytes = match (usage.pss_bytes, pss) {
            (Some(sum), Some(pss)) => Some(sum + pss),
            _ => None,
        };
        let uss = rollup.as_deref().map(parse_smaps_rollup_uss);
        usage.uss_bytes = match (usage.uss_bytes, uss) {
            (Some(sum), Some(uss)) => Some(sum + uss),
            _ => None,
        };
    }
    Ok(usage)
}

/// Parent pid of every process listed in `proc_root` (normally `/proc`).
fn parent_map(proc_root: &Path) -> io::Result<HashMap<u32, u32>> {
    let mut parents = HashMap::new();
    for entry in std::fs::read_dir(proc_root)? {
        let Ok(entry) = entry else { continue };
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<u32>().ok())
        else {
            continue;
        };
        // A process may exit between read_dir and this read: skip it.
        let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else {
            continue;
        };
        if let Some(ppid) = parse_stat_ppid(&stat) {
            parents.insert(pid, ppid);
        }
    }
    Ok(parents)
}

/// `root` followed by every process whose chain of parents reaches `root`.
fn descendants_of(root: u32, parents: &HashMap<u32, u32>) -> Vec<u32> {
    let mut children: HashMap<u32, Vec<u32>> = HashMap::new();
    for (&pid, &ppid) in parents {
        children.entry(ppid).or_default().push(pid);
    }
    let mut tree = vec![root];
    let mut next = 0;
    while let Some(&pid) = tree.get(next) {
        if let Some(kids) = children.get(&pid) {
            // pid 0 is the kernel's parent of init and kthreadd, never a worker's child.
            tree.extend(kids.iter().filter(|&&k| k != root && k != 0));
        }
        next += 1;
    }
    tree
}

/// The parent pid from the text of `/proc/PID/stat`.
///
/// The second field (the command name in parentheses) may itself contain spaces and `)`,
/// so fields are counted from the *last* `)`: state, then ppid.
pub fn parse_stat_ppid(stat: &str) -> Option<u32> {
    let after_comm = stat.get(stat.rfind(')')? + 1..)?;
    let mut fields = after_comm.split_ascii_whitespace();
    let _state = fields.next()?;
    fields.next()?.parse().ok()
}

/// The `Pss:` total from the text of `/proc/PID/smaps_rollup`, in bytes. A readable file
/// without the line (a zombie has no memory map) counts as zero.
pub fn parse_smaps_rollup_pss(text: &str) -> u64 {
    kib_field(text, "Pss:").unwrap_or(0)
}

/// Private memory (USS) from the text of `/proc/PID/smaps_rollup`, in bytes:
/// `Private_Clean` + `Private_Dirty` (either missing counts as zero).
pub fn parse_smaps_rollup_uss(text: &str) -> u64 {
    let clean = kib_field(text, "Private_Clean:").unwrap_or(0);
    let dirty = kib_field(text, "Private_Dirty:").unwrap_or(0);
    clean.saturating_add(dirty)
}

/// `VmRSS` from the text of `/proc/PID/status`, in bytes (absent for kernel threads and
/// zombies).
pub fn parse_status_rss(text: &str) -> Option<u64> {
    kib_field(text, "VmRSS:")
}

/// The value of a `Name:   1234 kB` line, in bytes.
fn kib_field(text: &str, name: &str) -> Option<u64> {
    text.lines().find_map(|line| {
        let rest = line.strip_prefix(name)?;
        let mut words = rest.split_ascii_whitespace();
        let kib: u64 = words.next()?.parse().ok()?;
        (words.next() == Some("kB")).then_some(kib.saturating_mul(1024))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const SMAPS_ROLLUP: &str = "\
55d0c5a4f000-7ffd6a9f5000 ---p 00000000 00:00 0                          [rollup]
Rss:               53616 kB
Pss:               51437 kB
Pss_Dirty:         51260 kB
Pss_Anon:          51236 kB
Pss_File:            201 kB
Pss_Shmem:             0 kB
Shared_Clean:       2340 kB
Private_Clean:       16 kB
Private_Dirty:     51260 kB
Swap:                  0 kB
SwapPss:               0 kB
";

    const STATUS: &str = "\
Name:\tpython3
Umask:\t0022
State:\tS (sleeping)
Pid:\t4242
PPid:\t4200
VmPeak:\t   61832 kB
VmRSS:\t   53616 kB
RssAnon:\t   51276 kB
Threads:\t1
";

    #[test]
    fn pss_is_the_pss_line_not_its_breakdown() {
        assert_eq!(parse_smaps_rollup_pss(SMAPS_ROLLUP), 51437 * 1024);
        assert_eq!(parse_smaps_rollup_pss(""), 0);
    }

    #[test]
    fn uss_is_private_clean_plus_private_dirty() {
        assert_eq!(parse_smaps_rollup_uss(SMAPS_ROLLUP), (16 + 51260) * 1024);
        assert_eq!(parse_smaps_rollup_uss("Private_Dirty:  4 kB\n"), 4096);
        assert_eq!(parse_smaps_rollup_uss(""), 0);
    }

    #[test]
    fn rss_comes_from_vmrss() {
        assert_eq!(parse_status_rss(STATUS), Some(53616 * 1024));
        assert_eq!(parse_status_rss("Name:\tkthreadd\nPPid:\t0\n"), None);
        assert_eq!(parse_status_rss("VmRSS:\t12 MB\n"), None, "unit must be kB");
    }

    #[test]
    fn ppid_is_counted_after_the_last_parenthesis() {
        assert_eq!(
            parse_stat_ppid("4242 (php-cgi) S 4200 4242 4242 0 -1 4194560 100"),
            Some(4200)
        );
        assert_eq!(
            parse_stat_ppid("77 (a) b) (c) R 1 77 77 0 -1 0"),
            Some(1),
            "a name holding ') (' must not shift the fields"
        );
        assert_eq!(parse_stat_ppid("77 (truncated"), None);
        assert_eq!(parse_stat_ppid("77 (x) S"), None);
    }

    #[test]
    fn descendants_follow_parent_links_only() {
        let parents: HashMap<u32, u32> = [
            (1, 0),
            (10, 1),
            (11, 10),
            (12, 10),
            (13, 11),
            (20, 1),
            (21, 20),
        ]
        .into();
        let mut tree = descendants_of(10, &parents);
        tree.sort_unstable();
        assert_eq!(tree, vec![10, 11, 12, 13]);
        assert_eq!(descendants_of(99, &parents), vec![99]);
    }

    #[test]
    fn this_process_has_memory() {
        let usage = process_tree_pss(std::process::id()).unwrap();
        assert!(usage.processes >= 1);
        assert!(usage.rss_bytes > 0);
        assert!(usage.bytes() > 0);
    }
}
