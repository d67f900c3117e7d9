//! Every citation of the design documents in the repository names something that exists:
//! "invariant N" an invariant of ARCHITECTURE.md, "decision N" a decision of
//! docs/decisions.md, `ARCHITECTURE.md, "Section"` a section of ARCHITECTURE.md or one its
//! table "Where each topic is" places in a page of docs/, and `docs/PAGE.md, "Section"` a
//! section of that page. Comments wrap, so a citation split over two comment lines is read as
//! one. ARCHITECTURE.md explains the scheme.

use std::path::{Path, PathBuf};

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The files that may cite: sources, tests, scripts, configuration and the documents.
fn citing_files() -> Vec<PathBuf> {
    let root = repo();
    let mut out = vec![root.join("README.md"), root.join("ARCHITECTURE.md")];
    for dir in [
        "src",
        "protocols",
        "tests",
        "benches",
        "scripts",
        "conf",
        "docs",
        "packaging",
    ] {
        walk(&root.join(dir), &mut out);
    }
    out
}

fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        let name = entry.file_name();
        let name = name.to_string_lossy();
        if path.is_dir() {
            if name != "target" && name != "corpus" && name != "artifacts" && !name.starts_with('.')
            {
                walk(&path, out);
            }
        } else if [
            ".rs", ".md", ".sh", ".toml", ".conf", ".py", ".rb", ".yaml", ".service", ".socket",
        ]
        .iter()
        .any(|ext| name.ends_with(ext))
        {
            out.push(path);
        }
    }
}

/// The file's text with line breaks, indentation and comment leaders folded into single
/// spaces, so that a citation wrapped over comment lines reads as one phrase.
fn folded(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for line in text.lines() {
        let line = line.trim_start();
        let line = ["//!", "///", "//", "#", "* ", ">"]
            .iter()
            .find_map(|lead| line.strip_prefix(lead))
            .unwrap_or(line);
        out.push_str(line.trim());
        out.push(' ');
    }
    out
}

/// The headings of a Markdown page, without their leading `#`s.
fn headings(page: &str) -> Vec<String> {
    page.lines()
        .filter(|l| l.starts_with('#'))
        .map(|l| l.trim_start_matches('#').trim().to_string())
        .collect()
}

/// Whether a cited section name is a heading, or a heading less the files it describes in
/// parentheses ("Direct pools" for "Direct pools (`accept = \"direct\"`: ...)").
fn has_section(headings: &[String], name: &str) -> bool {
    headings
        .iter()
        .any(|h| h == name || h.starts_with(&format!("{name} (")))
}

/// How many numbered items ("N. **...") the section headed `heading` of a page has.
fn numbered_items(page: &str, heading: &str) -> usize {
    let mut inside = false;
    let mut count = 0;
    for line in page.lines() {
        if line.starts_with('#') {
            inside = line.trim_start_matches('#').trim() == heading;
            continue;
        }
        if inside {
            if let Some((number, rest)) = line.split_once(". ") {
                if rest.starts_with("**") && number.parse::<usize>() == Ok(count + 1) {
                    count += 1;
                }
            }
        }
    }
    count
}

/// The rows of ARCHITECTURE.md's "Where each topic is": every quoted section name with the
/// page it is on.
fn topic_index(architecture: &str) -> Vec<(String, String)> {
    let mut inside = false;
    let mut out = Vec::new();
    for line in architecture.lines() {
        if line.starts_with('#') {
            inside = line.trim_start_matches('#').trim() == "Where each topic is";
            continue;
        }
        if !inside || !line.starts_with('|') {
            continue;
        }
        let cells: Vec<&str> = line.split('|').map(str::trim).collect();
        let [_, names, page, _] = cells[..] else {
            continue;
        };
        let page = page.trim_matches('`');
        if !page.ends_with(".md") {
            continue;
        }
        for (i, name) in names.split('"').enumerate() {
            if i % 2 == 1 {
                out.push((name.to_string(), page.to_string()));
            }
        }
    }
    out
}

/// Every `word N` (also `words N-M` and `words N and M`) in a folded text, with its numbers.
fn numbered_citations(text: &str, word: &str) -> Vec<(usize, String)> {
    let mut out = Vec::new();
    let lower = text.to_ascii_lowercase();
    let mut from = 0;
    while let Some(at) = lower[from..].find(word) {
        let start = from + at;
        from = start + word.len();
        let before = lower[..start].chars().next_back();
        if before.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_') {
            continue;
        }
        let mut rest = &lower[from..];
        rest = rest.strip_prefix('s').unwrap_or(rest);
        let Some(rest) = rest.strip_prefix(' ') else {
            continue;
        };
        let phrase: String = rest
            .chars()
            .take_while(|c| c.is_ascii_digit() || matches!(c, '-' | ',' | ' ' | '–'))
            .collect();
        let phrase = phrase.replace(" and ", ",");
        for part in phrase.split([',', ' ']).filter(|p| !p.is_empty()) {
            let mut ends = part
                .split(['-', '–'])
                .filter_map(|n| n.parse::<usize>().ok());
            if let Some(first) = ends.next() {
                out.push((first, format!("{word} {part}")));
                if let Some(last) = ends.next() {
                    out.push((last, format!("{word} {part}")));
                }
            }
        }
    }
    out
}

/// Every quoted section name cited after `prefix` (`ARCHITECTURE.md` or `docs/PAGE.md`),
/// with or without a comma between them.
fn section_citations(text: &str, prefix: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut from = 0;
    while let Some(at) = text[from..].find(prefix) {
        from += at + prefix.len();
        let rest = text[from..].strip_prefix(',').unwrap_or(&text[from..]);
        let Some(rest) = rest.strip_prefix(" \"") else {
            continue;
        };
        if let Some(end) = rest.find('"') {
            out.push(rest[..end].to_string());
        }
    }
    out
}

#[test]
fn every_cited_invariant_decision_and_section_exists() {
    let root = repo();
    let architecture = read(&root.join("ARCHITECTURE.md"));
    let decisions = read(&root.join("docs/decisions.md"));
    let invariant_count = numbered_items(&architecture, "Invariants");
    let decision_count = numbered_items(&decisions, "Decisions");
    assert!(
        invariant_count >= 18,
        "ARCHITECTURE.md lists {invariant_count} invariants"
    );
    assert!(
        decision_count >= 29,
        "docs/decisions.md lists {decision_count} decisions"
    );

    let arch_headings = headings(&architecture);
    let index = topic_index(&architecture);
    assert!(
        !index.is_empty(),
        "ARCHITECTURE.md has no table \"Where each topic is\""
    );
    let mut errors = Vec::new();
    for (name, page) in &index {
        let page_text = read(&root.join(page));
        if !has_section(&headings(&page_text), name) {
            errors.push(format!(
                "ARCHITECTURE.md places \"{name}\" in {page}, which has no such section"
            ));
        }
    }

    let mut cited = 0;
    for file in citing_files() {
        if file.ends_with("tests/doc_citations.rs") {
            continue; // its own examples are placeholders
        }
        let text = folded(&read(&file));
        let shown = file
            .strip_prefix(&root)
            .unwrap_or(&file)
            .display()
            .to_string();
        for (n, phrase) in numbered_citations(&text, "invariant") {
            cited += 1;
            if n == 0 || n > invariant_count {
                errors.push(format!(
                    "{shown}: \"{phrase}\": ARCHITECTURE.md has invariants 1-{invariant_count}"
                ));
            }
        }
        for (n, phrase) in numbered_citations(&text, "decision") {
            cited += 1;
            if n == 0 || n > decision_count {
                errors.push(format!(
                    "{shown}: \"{phrase}\": docs/decisions.md has decisions 1-{decision_count}"
                ));
            }
        }
        for name in section_citations(&text, "ARCHITECTURE.md") {
            cited += 1;
            if !has_section(&arch_headings, &name) && !index.iter().any(|(n, _)| *n == name) {
                errors.push(format!("{shown}: ARCHITECTURE.md, \"{name}\": no such section, nor in its \"Where each topic is\""));
            }
        }
        for page in [
            "request-path",
            "pools",
            "operations",
            "testing",
            "decisions",
        ] {
            let page = format!("docs/{page}.md");
            for name in section_citations(&text, &page) {
                cited += 1;
                if !has_section(&headings(&read(&root.join(&page))), &name) {
                    errors.push(format!("{shown}: {page}, \"{name}\": no such section"));
                }
            }
        }
    }
    assert!(
        cited > 50,
        "only {cited} citations found: the scan is broken"
    );
    assert!(
        errors.is_empty(),
        "citations of things that do not exist:\n{}",
        errors.join("\n")
    );
}

#[test]
fn the_scanners_read_what_the_code_writes() {
    let text =
        folded("// see ARCHITECTURE.md,\n    // \"Direct pools\" and invariants 1-2, decision 7\n");
    assert_eq!(
        section_citations(&text, "ARCHITECTURE.md"),
        ["Direct pools"]
    );
    let numbers: Vec<usize> = numbered_citations(&text, "invariant")
        .into_iter()
        .map(|(n, _)| n)
        .collect();
    assert_eq!(numbers, [1, 2]);
    let numbers: Vec<usize> = numbered_citations(&text, "decision")
        .into_iter()
        .map(|(n, _)| n)
        .collect();
    assert_eq!(numbers, [7]);
    assert!(numbered_citations("an invariant of the table", "invariant").is_empty());
    let headings = vec!["Direct pools (`accept = \"direct\"`)".to_string()];
    assert!(has_section(&headings, "Direct pools"));
    assert!(!has_section(&headings, "Direct"));
    assert!(!has_section(&headings, "Direct pools and more"));
    let page = "## Invariants\n\n1. **one**\n   text\n2. **two**\n## Other\n3. **no**\n";
    assert_eq!(numbered_items(page, "Invariants"), 2);
}
