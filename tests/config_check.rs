//! `corral check -c FILE` on the real binary: every error is printed as FILE:LINE:COL with the
//! offending line and a caret, the exit code is 64 (EX_USAGE); a valid file prints "FILE: ok".

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing,
    missing_docs
)]

mod support;

use support::{config_file, corral, Outcome};

/// A valid file the broken ones are made from.
const VALID: &str = r#"[[listen]]
address = "127.0.0.1:8080"
protocol = "http"

[pools.php]
command = ["php-cgi"]
min = 2
max = 4
queue_timeout = "5s"

[[contexts]]
extension = "php"
root = "/var/www/html"
pool = "php"
"#;

/// Runs `corral check` on `text`; gives the file's path and the outcome.
fn check(text: &str) -> (String, Outcome) {
    let file = config_file(text);
    let path = file.path().display().to_string();
    let out = corral(&["check", "-c", &path]);
    (path, out)
}

/// Asserts the check failed with EX_USAGE, printing each `LINE:COL: message` given.
fn assert_errors(text: &str, expected: &[&str]) -> String {
    let (path, out) = check(text);
    assert_eq!(out.code, Some(64), "{out:?}");
    assert_eq!(out.stdout, "", "errors go to stderr only");
    for e in expected {
        let line = format!("{path}:{e}");
        assert!(
            out.stderr.lines().any(|l| l.starts_with(&line)),
            "missing {line:?} in:\n{}",
            out.stderr
        );
    }
    let count = format!(
        "{path}: {} error{}",
        expected.len(),
        if expected.len() == 1 { "" } else { "s" }
    );
    assert_eq!(
        out.stderr.lines().last(),
        Some(count.as_str()),
        "{}",
        out.stderr
    );
    out.stderr
}

#[test]
fn valid_file_is_ok() {
    let (path, out) = check(VALID);
    assert_eq!(out.code, Some(0), "{out:?}");
    assert_eq!(out.stdout, format!("{path}: ok\n"));
    assert_eq!(out.stderr, "");
}

#[test]
fn annotated_example_checks_clean() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/conf/corral.toml");
    let out = corral(&["check", "-c", path]);
    assert_eq!(out.code, Some(0), "{out:?}");
    assert_eq!(out.stdout, format!("{path}: ok\n"));
}

#[test]
fn unknown_key_at_root() {
    let stderr = assert_errors(
        &format!("workers = 4\n{VALID}"),
        &["1:1: unknown field `workers`, expected one of `server`, `listen`"],
    );
    // The offending line and a caret under the key.
    assert!(
        stderr.contains("\n 1 | workers = 4\n   | ^^^^^^^\n"),
        "{stderr}"
    );
}

#[test]
fn unknown_key_nested() {
    let text = VALID.replace("max = 4", "max = 4\npm.max_children = 5");
    assert_errors(
        &text,
        &["9:1: unknown field `pm`, expected one of `protocol`"],
    );
    let text = VALID.replace("protocol = \"http\"", "protocol = \"http\"\nbacklogg = 10");
    assert_errors(&text, &["4:1: unknown field `backlogg`"]);
}

#[test]
fn wrong_type_and_syntax_error() {
    assert_errors(
        &VALID.replace("max = 4", "max = \"4\""),
        &["8:7: invalid type: string \"4\", expected a whole number"],
    );
    assert_errors(
        &VALID.replace("[pools.php]", "[pools.php"),
        &["5:11: unclosed table, expected `]`"],
    );
}

#[test]
fn bad_duration() {
    let stderr = assert_errors(
        &VALID.replace("\"5s\"", "\"5 fortnights\""),
        &["9:17: duration \"5 fortnights\" is not valid: unknown time unit"],
    );
    assert!(
        stderr.contains(
            "\n 9 | queue_timeout = \"5 fortnights\"\n   |                 ^^^^^^^^^^^^^^\n"
        ),
        "{stderr}"
    );
}

#[test]
fn context_naming_an_unknown_pool() {
    assert_errors(
        &VALID.replace("pool = \"php\"", "pool = \"pph\""),
        &[
            "5:8: pool \"php\" is not used by any [[contexts]]",
            "14:8: pool \"pph\" is not defined: add a [pools.pph] table",
        ],
    );
}

#[test]
fn server_name_is_one_host_name() {
    let with = |name: &str| {
        VALID.replace(
            "pool = \"php\"\n",
            &format!("pool = \"php\"\nserver_name = \"{name}\"\n"),
        )
    };
    let (_, out) = check(&with("www.example.com"));
    assert_eq!(out.code, Some(0), "{out:?}");
    assert_errors(
        &with("a/b"),
        &["15:15: server_name: host \"a/b\" is not a host name"],
    );
    assert_errors(
        &with("*.example.com"),
        &["15:15: server_name \"*.example.com\" must be one host name, not a wildcard"],
    );
}

#[test]
fn min_greater_than_max() {
    assert_errors(
        &VALID.replace("min = 2", "min = 6"),
        &["7:7: pool \"php\": min 6 is greater than max 4"],
    );
}

#[test]
fn every_error_in_a_file_is_reported() {
    let text = VALID
        .replace("min = 2", "min = 6")
        .replace("\"5s\"", "\"soon\"")
        .replace("extension = \"php\"", "extension = \".php\"")
        .replace(
            "address = \"127.0.0.1:8080\"",
            "address = \"localhost:8080\"",
        );
    assert_errors(
        &text,
        &[
            "2:11: address \"localhost:8080\" is not an IP address and port",
            "7:7: pool \"php\": min 6 is greater than max 4",
            "9:17: duration \"soon\" is not valid",
            "12:13: extension is written without the dot: \"php\", not \".php\"",
        ],
    );
}

#[test]
fn errors_about_the_whole_file_have_no_position() {
    let (path, out) = check("# nothing here\n");
    assert_eq!(out.code, Some(64));
    assert_eq!(
        out.stderr,
        format!(
            "{path}: no front listener is configured: add a [[listen]] block\n\n\
             {path}: no pool is configured: add a [pools.NAME] table\n\n\
             {path}: 2 errors\n"
        )
    );
}

#[test]
fn missing_file_is_an_io_error() {
    let out = corral(&["check", "-c", "/nonexistent/corral.toml"]);
    assert_eq!(out.code, Some(74), "{out:?}");
    assert!(out
        .stderr
        .starts_with("cannot read /nonexistent/corral.toml: "));
}

#[test]
fn run_refuses_a_broken_file() {
    let file = config_file("[server]\n");
    let out = corral(&["run", "-c", &file.path().display().to_string()]);
    assert_eq!(out.code, Some(64), "{out:?}");
}

#[test]
fn version_and_usage() {
    let out = corral(&["--version"]);
    assert_eq!(out.code, Some(0));
    assert!(out.stdout.starts_with("corral "), "{}", out.stdout);
    let out = corral(&["check"]);
    assert_eq!(out.code, Some(64), "{out:?}");
}

/// `VALID` with one more front listener (served by the catch-all pool context) or a status
/// section, written as `extra`.
fn exposed(extra: &str) -> String {
    format!("{VALID}\n[[contexts]]\npool = \"php\"\nroot = \"/var/www/html\"\n\n{extra}\n")
}

/// Line of `needle` in `text`, 1-based.
fn line_of(text: &str, needle: &str) -> usize {
    text.lines().position(|l| l.contains(needle)).unwrap() + 1
}

#[test]
fn fastcgi_and_scgi_fronts_on_other_hosts_need_an_allow_list() {
    for protocol in ["fastcgi", "scgi"] {
        let open = exposed(&format!(
            "[[listen]]\naddress = \"0.0.0.0:9000\"\nprotocol = \"{protocol}\"\n"
        ));
        let line = line_of(&open, "0.0.0.0:9000");
        let err = assert_errors(&open, &[&format!("{line}:11: 0.0.0.0:9000 is reachable")]);
        assert!(err.contains("SCRIPT_FILENAME"), "{err}");
        assert!(err.contains("allow = [\"0.0.0.0/0\"]"), "{err}");
        // The exposed listener with `allow = LIST` added (and nothing else changed).
        let with_allow = |allow: &str| {
            let listener = format!("protocol = \"{protocol}\"\n\n");
            assert_eq!(open.matches(&listener).count(), 1, "{protocol}: {open}");
            open.replace(
                &listener,
                &format!("protocol = \"{protocol}\"\nallow = {allow}\n\n"),
            )
        };
        // An empty list is no answer either.
        let empty = with_allow("[]");
        assert!(empty.contains("allow = []"), "{protocol}: {empty}");
        assert_errors(&empty, &[&format!("{line}:11: 0.0.0.0:9000 is reachable")]);

        for allow in ["[\"0.0.0.0/0\"]", "[\"10.0.0.0/8\"]"] {
            let (path, out) = check(&with_allow(allow));
            assert_eq!(
                out.code,
                Some(0),
                "{protocol} with allow = {allow}: {out:?}"
            );
            assert_eq!(out.stdout, format!("{path}: ok\n"));
        }
        // Loopback needs no list; [::] has its own explicit word.
        let (_, out) = check(&open.replace("0.0.0.0:9000", "127.0.0.1:9000"));
        assert_eq!(out.code, Some(0), "{out:?}");
        let v6 = assert_errors(
            &open.replace("0.0.0.0:9000", "[::]:9000"),
            &[&format!("{line}:11: [::]:9000 is reachable")],
        );
        assert!(v6.contains("allow = [\"::/0\"]"), "{v6}");
    }
    // HTTP serves whoever comes; nothing is required there.
    let (_, out) = check(&VALID.replace("127.0.0.1:8080", "0.0.0.0:8080"));
    assert_eq!(out.code, Some(0), "{out:?}");
}

#[test]
fn a_status_listener_on_other_hosts_needs_an_allow_list() {
    let open = format!("{VALID}\n[status]\naddress = \"0.0.0.0:9180\"\n");
    let line = line_of(&open, "0.0.0.0:9180");
    let err = assert_errors(&open, &[&format!("{line}:11: 0.0.0.0:9180 is reachable")]);
    assert!(err.contains("allow = [\"0.0.0.0/0\"]"), "{err}");
    let (_, out) = check(&format!("{open}allow = [\"0.0.0.0/0\"]\n"));
    assert_eq!(out.code, Some(0), "{out:?}");
    let (_, out) = check(&open.replace("0.0.0.0:9180", "127.0.0.1:9180"));
    assert_eq!(out.code, Some(0), "{out:?}");
}

#[test]
fn a_missing_or_unrunnable_interpreter_fails_the_check() {
    // The issue's case: a php-cgi that is not installed.
    assert_errors(
        &VALID.replace("[\"php-cgi\"]", "[\"/usr/bin/php-cgi9\"]"),
        &["6:12: pool \"php\": \"/usr/bin/php-cgi9\" does not exist: its workers could not start"],
    );
    // A name is looked up in PATH, as the spawn does.
    assert_errors(
        &VALID.replace("[\"php-cgi\"]", "[\"php-cgi9\"]"),
        &["6:12: pool \"php\": \"php-cgi9\" is not found in PATH ("],
    );
    // A file that exists but cannot be executed.
    let dir = tempfile::tempdir().unwrap();
    let script = dir.path().join("php-cgi");
    std::fs::write(&script, "#!/bin/sh\n").unwrap();
    let text = VALID.replace("[\"php-cgi\"]", &format!("[\"{}\"]", script.display()));
    let stderr = assert_errors(&text, &["6:12: pool \"php\": "]);
    assert!(stderr.contains("is not executable (mode 0"), "{stderr}");
    // The interpreter of a WSGI app, named or the default one.
    let wsgi = "[[listen]]\naddress = \"127.0.0.1:8080\"\nprotocol = \"http\"\n\n\
                [pools.app]\napp = \"wsgi:hello\"\npython = \"/opt/nowhere/bin/python\"\n";
    assert_errors(
        wsgi,
        &["7:10: pool \"app\": \"/opt/nowhere/bin/python\" does not exist"],
    );
    let venv = wsgi.replace(
        "python = \"/opt/nowhere/bin/python\"",
        "virtualenv = \"/opt/nowhere\"",
    );
    assert_errors(
        &venv,
        &["7:14: pool \"app\": \"/opt/nowhere/bin/python\" does not exist"],
    );
}

#[test]
fn three_typos_are_three_errors_each_with_the_key_meant() {
    let text = VALID
        .replace("[[listen]]", "[server]\ngrce = \"30s\"\n\n[[listen]]")
        .replace("protocol = \"http\"", "protocol = \"sgci\"")
        .replace("max = 4", "max = 4\nspare_mim = 1");
    let stderr = assert_errors(
        &text,
        &[
            "2:1: unknown field `grce`; did you mean `grace`?",
            "6:12: unknown variant `sgci`, expected one of `http`, `fastcgi`, `scgi`; did you mean `scgi`?",
            "12:1: unknown field `spare_mim`; did you mean `spare_min`?",
        ],
    );
    // A required key whose value was wrong is not reported missing as well.
    assert!(!stderr.contains("missing field"), "{stderr}");
}
