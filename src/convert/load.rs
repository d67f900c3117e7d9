//! Reading php-fpm's configuration files as php-fpm does: line by line, an `include = GLOB`
//! read where it stands (relative patterns taken from php-fpm's prefix, the files it matches
//! in sorted order, directories skipped, a pattern matching nothing only noted, as php-fpm
//! warns and goes on), at most five files deep (php-fpm's own bound, which also ends an
//! include loop).
//!
//! Everything read is bounded: a file's size, a line's length, the number of files. A NUL
//! byte, text that is not UTF-8 or a line PHP's INI parser would refuse is an error naming
//! `FILE:LINE`; nothing panics.

use std::io::Read;
use std::ops::Range;
use std::path::{Path, PathBuf};

use super::ini::{parse_line, Line};

/// Largest configuration file read.
pub const MAX_FILE: u64 = 4 << 20;
/// Longest line read.
pub const MAX_LINE: usize = 64 << 10;
/// Most files read in all (includes counted).
pub const MAX_FILES: usize = 512;
/// Most bytes read in all.
pub const MAX_TOTAL: usize = 32 << 20;
/// php-fpm refuses to include more than 5 files recursively.
pub const MAX_DEPTH: usize = 5;

/// A file that was read, kept for error messages.
#[derive(Debug)]
pub struct Source {
    /// Its path as given or as the include pattern matched it.
    pub path: PathBuf,
    /// Its whole text.
    pub text: String,
}

/// Where something is: a source and a byte range in its text (one line).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct At {
    /// Index into [`Loaded::sources`].
    pub source: usize,
    /// The byte range of the line (or of the part an error is about).
    pub span: Range<usize>,
}

/// One thing read, in the order php-fpm meets it.
#[derive(Debug)]
pub enum Item {
    /// A section header or an entry (never `Line::Blank`, never an include).
    Line(Line),
    /// An include, with the files it matched (empty: it matched nothing).
    Include {
        /// The pattern after the prefix was applied.
        pattern: String,
        /// The files read for it, in order.
        files: Vec<PathBuf>,
    },
}

/// Everything read.
#[derive(Debug, Default)]
pub struct Loaded {
    /// Every file read, in the order it was opened.
    pub sources: Vec<Source>,
    /// Every section, entry and include, in order, with where it is.
    pub items: Vec<(At, Item)>,
}

/// A failure to read the configuration: where (if in a file) and why.
#[derive(Debug)]
pub struct LoadError {
    /// The place, when the error is about one; else about `path` as a whole.
    pub at: Option<At>,
    /// The file it is about.
    pub path: PathBuf,
    /// That file's text when `at` points into it (else empty).
    pub text: String,
    /// What went wrong.
    pub message: String,
}

/// How to read: php-fpm's prefix for relative include patterns and how `${VAR}` resolves.
pub struct Reader<'a> {
    /// php-fpm's global prefix (`-p`, else its install prefix).
    pub prefix: PathBuf,
    /// `${VAR}` lookups.
    pub env: &'a dyn Fn(&str) -> Option<String>,
}

impl Reader<'_> {
    /// Reads `files` one after another (as if each were included by the one before) into one
    /// [`Loaded`].
    pub fn read_all(&self, files: &[PathBuf]) -> Result<Loaded, LoadError> {
        let mut loaded = Loaded::default();
        for f in files {
            self.read(f, 1, &mut loaded)?;
        }
        Ok(loaded)
    }

    fn read(&self, path: &Path, depth: usize, out: &mut Loaded) -> Result<(), LoadError> {
        let whole = |message: String| LoadError {
            at: None,
            path: path.to_owned(),
            text: String::new(),
            message,
        };
        if out.sources.len() >= MAX_FILES {
            return Err(whole(format!(
                "more than {MAX_FILES} configuration files: refusing to read more"
            )));
        }
        let text = read_text(path).map_err(whole)?;
        let total: usize = out.sources.iter().map(|s| s.text.len()).sum::<usize>() + text.len();
        if total > MAX_TOTAL {
            return Err(whole(format!(
                "the configuration files read come to more than {MAX_TOTAL} bytes: refusing to read more"
            )));
        }
        let source = out.sources.len();
        out.sources.push(Source {
            path: path.to_owned(),
            text,
        });
        let mut offset = 0;
        // Lines are parsed off a copy of the text so the source can stay in `out`.
        let text = out.sources[source].text.clone();
        for line in text.split_inclusive('\n') {
            let start = offset;
            offset += line.len();
            let content = line.strip_suffix('\n').unwrap_or(line);
            let at = At {
                source,
                span: start..start + content.len(),
            };
            let err = |column: usize, message: String| LoadError {
                at: Some(At {
                    source,
                    span: start + column.min(content.len())..start + content.len().max(1),
                }),
                path: path.to_owned(),
                text: text.clone(),
                message,
            };
            if content.len() > MAX_LINE {
                return Err(err(0, format!("line longer than {MAX_LINE} bytes")));
            }
            if let Some(nul) = content.find('\0') {
                return Err(err(nul, "a NUL byte in the line".to_owned()));
            }
            let parsed = parse_line(content, self.env).map_err(|e| err(e.column, e.message))?;
            match parsed {
                Line::Blank => {}
                Line::Entry {
                    name,
                    index: None,
                    value,
                } if name == "include" => {
                    let pattern = self.prefixed(value.fpm());
                    let files = glob(&pattern).map_err(|m| err(0, m))?;
                    out.items.push((
                        at.clone(),
                        Item::Include {
                            pattern,
                            files: files.clone(),
                        },
                    ));
                    for f in files {
                        if depth >= MAX_DEPTH {
                            return Err(err(
                                0,
                                format!(
                                    "including {} would nest more than {MAX_DEPTH} files deep, \
                                     which php-fpm refuses (an include loop?)",
                                    f.display()
                                ),
                            ));
                        }
                        self.read(&f, depth + 1, out)?;
                    }
                }
                line => out.items.push((at, Item::Line(line))),
            }
        }
        Ok(())
    }

    /// A relative path taken from the prefix, as php-fpm does for include patterns.
    fn prefixed(&self, path: &str) -> String {
        if path.starts_with('/') {
            path.to_owned()
        } else {
            format!("{}/{path}", self.prefix.display())
        }
    }
}

/// A whole configuration file as text, within [`MAX_FILE`].
fn read_text(path: &Path) -> Result<String, String> {
    use std::os::unix::fs::OpenOptionsExt;
    // Non-blocking, so a named pipe cannot hold the open; it is refused below.
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)
        .map_err(|e| format!("cannot open: {e}"))?;
    let meta = file.metadata().map_err(|e| format!("cannot stat: {e}"))?;
    if meta.is_dir() {
        return Err("is a directory, not a configuration file".to_owned());
    }
    if !meta.is_file() {
        return Err("is not a regular file".to_owned());
    }
    let mut bytes = Vec::new();
    file.take(MAX_FILE + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| format!("cannot read: {e}"))?;
    if bytes.len() as u64 > MAX_FILE {
        return Err(format!("larger than {MAX_FILE} bytes"));
    }
    String::from_utf8(bytes).map_err(|e| {
        let good = e.utf8_error().valid_up_to();
        let line = e.as_bytes()[..good].iter().filter(|&&b| b == b'\n').count() + 1;
        format!("line {line} is not UTF-8")
    })
}

/// The files an absolute glob pattern (`*`, `?`, `[...]` in any component) matches, sorted,
/// directories left out; empty when nothing matches. A directory that cannot be read is an
/// error, as php-fpm's `GLOB_ERR` makes it.
pub fn glob(pattern: &str) -> Result<Vec<PathBuf>, String> {
    let mut found = vec![PathBuf::from("/")];
    for part in pattern.split('/').filter(|p| !p.is_empty()) {
        let mut next = Vec::new();
        for dir in &found {
            if !part.contains(['*', '?', '[']) {
                next.push(dir.join(part.replace('\\', "")));
                continue;
            }
            let entries = match std::fs::read_dir(dir) {
                Ok(entries) => entries,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
                Err(e) if e.raw_os_error() == Some(libc::ENOTDIR) => continue,
                Err(e) => return Err(format!("cannot read {}: {e}", dir.display())),
            };
            let mut names: Vec<String> = entries
                .filter_map(|e| e.ok()?.file_name().into_string().ok())
                .filter(|name| matches(part.as_bytes(), name.as_bytes()))
                .collect();
            names.sort();
            next.extend(names.into_iter().map(|n| dir.join(n)));
            if next.len() > MAX_FILES {
                return Err(format!("matches more than {MAX_FILES} files"));
            }
        }
        found = next;
    }
    found.retain(|p| std::fs::metadata(p).is_ok_and(|m| !m.is_dir()));
    Ok(found)
}

/// Whether `name` matches the glob component `pat` (fnmatch without flags but a leading
/// dot matched only by a dot, as glob(3) does). Iterative, so no pattern is exponential.
pub fn matches(pat: &[u8], name: &[u8]) -> bool {
    if name.first() == Some(&b'.') && pat.first() != Some(&b'.') {
        return false;
    }
    let (mut p, mut n) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while n < name.len() {
        let step = match pat.get(p) {
            Some(b'*') => {
                star = Some((p, n));
                p += 1;
                continue;
            }
            Some(b'?') => Some(p + 1),
            Some(b'[') => match class(pat, p, name[n]) {
                Some(next) => next,
                None => (name[n] == b'[').then_some(p + 1),
            },
            Some(b'\\') if p + 1 < pat.len() => (pat[p + 1] == name[n]).then_some(p + 2),
            Some(&c) => (c == name[n]).then_some(p + 1),
            None => None,
        };
        match (step, star) {
            (Some(next), _) => {
                p = next;
                n += 1;
            }
            (None, Some((sp, sn))) => {
                p = sp + 1;
                n = sn + 1;
                star = Some((sp, sn + 1));
            }
            (None, None) => return false,
        }
    }
    pat[p.min(pat.len())..].iter().all(|&c| c == b'*')
}

/// A `[...]` class at `pat[open]` tested on `c`: `Some(Some(offset after it))` if `c` is
/// in it, `Some(None)` if not, `None` for a `[` without its `]` (which matches itself).
fn class(pat: &[u8], open: usize, c: u8) -> Option<Option<usize>> {
    let mut i = open + 1;
    let negate = matches!(pat.get(i), Some(b'!' | b'^'));
    if negate {
        i += 1;
    }
    let mut hit = false;
    let mut first = true;
    loop {
        let lo = *pat.get(i)?;
        if lo == b']' && !first {
            break;
        }
        first = false;
        if pat.get(i + 1) == Some(&b'-') && pat.get(i + 2).is_some_and(|&h| h != b']') {
            let hi = pat[i + 2];
            hit |= lo <= c && c <= hi;
            i += 3;
        } else {
            hit |= lo == c;
            i += 1;
        }
    }
    Some((hit != negate).then_some(i + 1))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn no_env(_: &str) -> Option<String> {
        None
    }

    fn reader(prefix: &Path) -> Reader<'static> {
        Reader {
            prefix: prefix.to_owned(),
            env: &no_env,
        }
    }

    #[test]
    fn glob_components() {
        assert!(matches(b"*.conf", b"www.conf"));
        assert!(!matches(b"*.conf", b".hidden.conf"));
        assert!(matches(b".*", b".hidden"));
        assert!(matches(b"w?w.conf", b"www.conf"));
        assert!(matches(b"[a-c]*", b"blog"));
        assert!(!matches(b"[!a-c]*", b"blog"));
        assert!(matches(b"[]]x", b"]x"));
        assert!(matches(b"\\*", b"*"));
        assert!(!matches(b"\\*", b"a"));
        assert!(matches(b"[", b"["));
        assert!(!matches(b"*.conf", b"www.conf.dpkg-old"));
        // Pathological patterns stay fast.
        let pat = "*a".repeat(40);
        assert!(!matches(pat.as_bytes(), "a".repeat(39).as_bytes()));
    }

    #[test]
    fn includes_are_read_in_place_sorted_and_relative_to_the_prefix() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("pool.d")).unwrap();
        std::fs::create_dir(dir.path().join("pool.d/sub.conf")).unwrap();
        std::fs::write(dir.path().join("pool.d/b.conf"), "[b]\nuser = b\n").unwrap();
        std::fs::write(dir.path().join("pool.d/a.conf"), "[a]\nuser = a\n").unwrap();
        let main = dir.path().join("php-fpm.conf");
        std::fs::write(&main, "[global]\ninclude = pool.d/*.conf\n[global]\n").unwrap();
        let loaded = reader(dir.path()).read_all(&[main]).unwrap();
        let names: Vec<String> = loaded
            .sources
            .iter()
            .map(|s| s.path.file_name().unwrap().to_string_lossy().into_owned())
            .collect();
        assert_eq!(names, ["php-fpm.conf", "a.conf", "b.conf"]);
        let sections: Vec<&str> = loaded
            .items
            .iter()
            .filter_map(|(_, i)| match i {
                Item::Line(Line::Section(s)) => Some(s.as_str()),
                _ => None,
            })
            .collect();
        assert_eq!(sections, ["global", "a", "b", "global"]);
    }

    #[test]
    fn an_include_matching_nothing_is_kept_as_a_note() {
        let dir = tempfile::tempdir().unwrap();
        let main = dir.path().join("php-fpm.conf");
        std::fs::write(&main, "include=/nonexistent/corral-test/*.conf\n").unwrap();
        let loaded = reader(dir.path()).read_all(&[main]).unwrap();
        assert!(matches!(
            &loaded.items[0].1,
            Item::Include { files, .. } if files.is_empty()
        ));
    }

    fn load_error(text: &[u8]) -> LoadError {
        let dir = tempfile::tempdir().unwrap();
        let main = dir.path().join("php-fpm.conf");
        std::fs::write(&main, text).unwrap();
        reader(dir.path()).read_all(&[main]).unwrap_err()
    }

    fn line_of(e: &LoadError, text: &[u8]) -> usize {
        let at = e.at.as_ref().expect("located");
        text[..at.span.start]
            .iter()
            .filter(|&&b| b == b'\n')
            .count()
            + 1
    }

    #[test]
    fn hostile_files_are_errors_never_panics() {
        let nul = b"[www]\nuser = a\0b\n";
        let e = load_error(nul);
        assert!(e.message.contains("NUL"), "{}", e.message);
        assert_eq!(line_of(&e, nul), 2);

        let mut huge = b"[www]\nuser = ".to_vec();
        huge.extend(std::iter::repeat_n(b'x', MAX_LINE + 1));
        let e = load_error(&huge);
        assert!(e.message.contains("longer than"), "{}", e.message);
        assert_eq!(line_of(&e, &huge), 2);

        let mut big = b"[www]\n".to_vec();
        big.resize(usize::try_from(MAX_FILE).unwrap() + 1, b';');
        let e = load_error(&big);
        assert!(e.at.is_none() && e.message.contains("larger than"), "{e:?}");

        let e = load_error(b"[www]\n\xff\xfe = 1\n");
        assert!(e.message.contains("line 2 is not UTF-8"), "{}", e.message);

        let bad = b"[www]\nlisten\n";
        let e = load_error(bad);
        assert!(e.message.contains("name = value"), "{}", e.message);
        assert_eq!(line_of(&e, bad), 2);

        let dir = tempfile::tempdir().unwrap();
        let e = reader(dir.path())
            .read_all(&[dir.path().join("missing.conf")])
            .unwrap_err();
        assert!(
            e.at.is_none() && e.message.starts_with("cannot open"),
            "{e:?}"
        );
        let e = reader(dir.path())
            .read_all(&[dir.path().to_owned()])
            .unwrap_err();
        assert!(e.message.contains("directory"), "{e:?}");
        // A named pipe nobody writes to is refused, not waited on.
        let fifo = dir.path().join("fifo.conf");
        nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
        let e = reader(dir.path()).read_all(&[fifo]).unwrap_err();
        assert!(e.message.contains("not a regular file"), "{e:?}");
        let e = reader(dir.path())
            .read_all(&["/dev/zero".into()])
            .unwrap_err();
        assert!(e.message.contains("not a regular file"), "{e:?}");
    }

    #[test]
    fn include_loops_end_at_php_fpms_depth() {
        let dir = tempfile::tempdir().unwrap();
        let main = dir.path().join("loop.conf");
        std::fs::write(&main, format!("[www]\ninclude = {}\n", main.display())).unwrap();
        let e = reader(dir.path()).read_all(&[main]).unwrap_err();
        assert!(
            e.message.contains("more than 5 files deep"),
            "{}",
            e.message
        );
        // Two files including each other, too.
        let a = dir.path().join("a.conf");
        let b = dir.path().join("b.conf");
        std::fs::write(&a, "include = b.conf\n").unwrap();
        std::fs::write(&b, "include = a.conf\n").unwrap();
        let e = reader(dir.path()).read_all(&[a]).unwrap_err();
        assert!(e.message.contains("include loop"), "{}", e.message);
    }
}
