//! `corral convert php-fpm` as the tests run it: the conversion, `corral check` on its
//! output, the lines and the pool tables of that output, and the output run by corral with
//! only its paths moved.

use std::path::Path;

use super::server::Corral;
use super::{corral, Outcome};

/// `corral convert php-fpm ARGS...`.
pub fn convert(args: &[&str]) -> Outcome {
    let mut all = vec!["convert", "php-fpm"];
    all.extend_from_slice(args);
    corral(&all)
}

/// Converts and returns the TOML, failing the test with corral's stderr otherwise.
#[track_caller]
pub fn converted(args: &[&str]) -> String {
    let out = convert(args);
    assert_eq!(
        out.code,
        Some(0),
        "convert {args:?} failed:\n{}",
        out.stderr
    );
    out.stdout
}

/// `corral check` on `toml` passes.
#[track_caller]
pub fn assert_checks(toml: &str) {
    let file = super::config_file(toml);
    let out = corral(&["check", "-c", file.path().to_str().unwrap()]);
    assert_eq!(
        out.code,
        Some(0),
        "check failed:\n{}\n---\n{toml}",
        out.stderr
    );
}

/// Whether a line of `toml` sets `line` (`key = value`; a comment after it allowed).
pub fn has_line(toml: &str, line: &str) -> bool {
    toml.lines()
        .any(|l| l == line || l.strip_prefix(line).is_some_and(|r| r.starts_with(' ')))
}

#[track_caller]
pub fn assert_line(toml: &str, line: &str) {
    assert!(has_line(toml, line), "no line {line:?} in:\n{toml}");
}

/// The `[pools.NAME]` table of `toml`, its header to the blank line that ends it (the
/// converter ends every table with one).
#[track_caller]
pub fn pool_table<'t>(toml: &'t str, name: &str) -> &'t str {
    let header = format!("[pools.{name}]\n");
    let start = toml
        .find(&header)
        .unwrap_or_else(|| panic!("no {header:?} in:\n{toml}"));
    let rest = &toml[start..];
    &rest[..rest.find("\n\n").map_or(rest.len(), |end| end + 1)]
}

/// The keys a table sets, in order (comment lines left out).
pub fn keys(table: &str) -> Vec<&str> {
    table
        .lines()
        .skip(1)
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| l.split_once(" = ").map(|(k, _)| k))
        .collect()
}

/// Runs `toml` with only its paths moved (each `(from, to)`, which must be in it) and its
/// runtime directory in `dir`, after `corral check` has accepted it; waits for `listeners`.
pub fn run_moved(toml: &str, dir: &Path, moves: &[(&str, String)], listeners: usize) -> Corral {
    let mut toml = toml.to_owned();
    for (from, to) in moves {
        assert!(toml.contains(from), "{from} is not in:\n{toml}");
        toml = toml.replace(from, to);
    }
    let run = dir.join("run");
    let toml = toml.replacen(
        "[server]\n",
        &format!("[server]\nruntime_dir = \"{}\"\n", run.display()),
        1,
    );
    assert_checks(&toml);
    Corral::start(&toml, listeners)
}

/// Converting `text` fails with exit 64 and a message naming `FILE:LINE`.
#[track_caller]
pub fn assert_refused(text: &[u8], line: usize, needle: &str) {
    let dir = tempfile::tempdir().unwrap();
    let conf = dir.path().join("bad.conf");
    std::fs::write(&conf, text).unwrap();
    let out = convert(&[conf.to_str().unwrap()]);
    assert_eq!(out.code, Some(64), "{}", out.stderr);
    let at = format!("{}:{line}:", conf.display());
    assert!(out.stderr.contains(&at), "{at} not in:\n{}", out.stderr);
    assert!(
        out.stderr.contains(needle),
        "{needle} not in:\n{}",
        out.stderr
    );
    assert!(out.stdout.is_empty());
}
