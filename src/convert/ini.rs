//! One line of php-fpm's INI syntax, as php-fpm reads it: it hands each line to PHP's INI
//! parser on its own (normal scanner mode), so a line is a section header, a `name = value`,
//! a `name[key] = value`, or nothing (blank, or a `;` comment).
//!
//! Values follow PHP's rules: `;` starts a comment outside quotes; `"..."` takes the escapes
//! `\"`, `\\` and `\$` (any other backslash stays) and expands `${VAR}`; `'...'` is taken as
//! written; `${VAR}` outside quotes expands too; a bare `yes`/`on`/`true` reads as `1` and
//! `no`/`off`/`false`/`none`/`null` as the empty string. Nothing here panics on any input:
//! every failure is a [`LineError`] with the byte column it is about.

/// What one line holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Line {
    /// Blank or a comment.
    Blank,
    /// `[name]`.
    Section(String),
    /// `name = value` (`index` is `None`) or `name[index] = value`.
    Entry {
        /// The directive's name as written.
        name: String,
        /// The key between brackets, unquoted and trimmed.
        index: Option<String>,
        /// The value.
        value: Value,
    },
}

/// A value after PHP's INI parser has read it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Value {
    /// Quotes removed, escapes and `${VAR}` resolved; bare booleans left as written.
    pub text: String,
    /// Written as one unquoted run without `${...}`: PHP's INI parser reads the same text
    /// the same way again (what `php-cgi -d` gets).
    pub plain: bool,
    /// The `${VAR}` names expanded, in order.
    pub expanded: Vec<String>,
}

impl Value {
    /// What a php-fpm directive receives: a bare boolean word already turned into `1` or
    /// the empty string, as the INI scanner does.
    pub fn fpm(&self) -> &str {
        if !self.plain {
            return &self.text;
        }
        match self.text.to_ascii_lowercase().as_str() {
            "true" | "on" | "yes" => "1",
            "false" | "off" | "no" | "none" | "null" => "",
            _ => &self.text,
        }
    }
}

/// Why a line could not be read, and where in it (a byte offset).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LineError {
    /// Byte offset of the problem in the line.
    pub column: usize,
    /// What is wrong, as a sentence.
    pub message: String,
}

fn fail<T>(column: usize, message: impl Into<String>) -> Result<T, LineError> {
    Err(LineError {
        column,
        message: message.into(),
    })
}

/// Reads one line (without its newline; a trailing `\r` is dropped). `env` resolves
/// `${VAR}` (PHP gives the empty string for an unset one).
pub fn parse_line(line: &str, env: &dyn Fn(&str) -> Option<String>) -> Result<Line, LineError> {
    let line = line.strip_suffix('\r').unwrap_or(line);
    let start = line.len() - line.trim_start_matches([' ', '\t']).len();
    let body = &line[start..];
    if body.is_empty() || body.starts_with(';') || body.trim_end().is_empty() {
        return Ok(Line::Blank);
    }
    if body.starts_with('#') {
        return fail(
            start,
            "'#' does not start a comment in php-fpm's INI syntax (PHP 7 removed it): use ';'",
        );
    }
    if let Some(rest) = body.strip_prefix('[') {
        let Some(end) = rest.find(']') else {
            return fail(start, "a section header needs its closing ']'");
        };
        let after = rest[end + 1..].trim_start_matches([' ', '\t']);
        if !(after.is_empty() || after.starts_with(';')) {
            return fail(
                start + end + 2,
                "nothing but a ';' comment may follow a section header",
            );
        }
        let name = unquote(rest[..end].trim());
        if name.is_empty() {
            return fail(start, "a section needs a name: [global] or [POOL]");
        }
        return Ok(Line::Section(name.to_owned()));
    }
    let Some(eq) = body.find('=') else {
        return fail(start, "expected `name = value`");
    };
    let (name, index) = split_name(&body[..eq], start)?;
    let value = parse_value(&body[eq + 1..], start + eq + 1, env)?;
    Ok(Line::Entry { name, index, value })
}

/// `name` or `name[index]` (the part before `=`), checked.
fn split_name(text: &str, at: usize) -> Result<(String, Option<String>), LineError> {
    let text = text.trim_end();
    let (name, index) = match text.find('[') {
        None => (text, None),
        Some(open) => {
            let Some(inner) = text[open + 1..].strip_suffix(']') else {
                return fail(at + open, "an array directive is written name[key] = value");
            };
            if inner.contains(['[', ']']) {
                return fail(at + open, "an array key cannot hold '[' or ']'");
            }
            (
                text[..open].trim_end(),
                Some(unquote(inner.trim()).to_owned()),
            )
        }
    };
    let valid = !name.is_empty()
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-'));
    if !valid {
        return fail(
            at,
            format!("{name:?} is not a directive name (letters, digits, '_', '.', '-')"),
        );
    }
    Ok((name.to_owned(), index))
}

fn unquote(s: &str) -> &str {
    for q in ['"', '\''] {
        if let Some(inner) = s.strip_prefix(q).and_then(|r| r.strip_suffix(q)) {
            return inner;
        }
    }
    s
}

/// One part of a value: raw text, or what a quoted string or `${VAR}` gave.
enum Piece {
    Raw(String),
    Resolved(String),
}

/// The text after `=`; `at` is its byte offset in the line.
fn parse_value(
    text: &str,
    at: usize,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<Value, LineError> {
    let bytes = text.as_bytes();
    let mut pieces: Vec<Piece> = Vec::new();
    let mut raw = String::new();
    let mut expanded = Vec::new();
    let mut i = 0;
    let flush = |raw: &mut String, pieces: &mut Vec<Piece>| {
        if !raw.is_empty() {
            pieces.push(Piece::Raw(std::mem::take(raw)));
        }
    };
    while let Some(&b) = bytes.get(i) {
        match b {
            b';' => break,
            b'"' => {
                flush(&mut raw, &mut pieces);
                let (s, next) = double_quoted(text, i, at, env, &mut expanded)?;
                pieces.push(Piece::Resolved(s));
                i = next;
            }
            b'\'' => {
                flush(&mut raw, &mut pieces);
                let Some(len) = text[i + 1..].find('\'') else {
                    return fail(at + i, "a single-quoted value is not closed");
                };
                pieces.push(Piece::Resolved(text[i + 1..i + 1 + len].to_owned()));
                i += len + 2;
            }
            b'$' if bytes.get(i + 1) == Some(&b'{') => {
                flush(&mut raw, &mut pieces);
                let (s, next) = variable(text, i, at, env, &mut expanded)?;
                pieces.push(Piece::Resolved(s));
                i = next;
            }
            _ => {
                // Whole characters: `i` only ever lands on a char boundary.
                let ch = text[i..].chars().next().unwrap_or(' ');
                raw.push(ch);
                i += ch.len_utf8();
            }
        }
    }
    flush(&mut raw, &mut pieces);
    // Spaces around the value are not part of it; spaces between parts are.
    if let Some(Piece::Raw(first)) = pieces.first_mut() {
        *first = first.trim_start_matches([' ', '\t']).to_owned();
    }
    if let Some(Piece::Raw(last)) = pieces.last_mut() {
        *last = last.trim_end_matches([' ', '\t']).to_owned();
    }
    let plain = pieces.iter().all(|p| matches!(p, Piece::Raw(_)));
    let text = pieces
        .into_iter()
        .map(|p| match p {
            Piece::Raw(s) | Piece::Resolved(s) => s,
        })
        .collect();
    Ok(Value {
        text,
        plain,
        expanded,
    })
}

/// A `"..."` starting at `open`; its text and the offset after the closing quote.
fn double_quoted(
    text: &str,
    open: usize,
    at: usize,
    env: &dyn Fn(&str) -> Option<String>,
    expanded: &mut Vec<String>,
) -> Result<(String, usize), LineError> {
    let bytes = text.as_bytes();
    let mut out = String::new();
    let mut i = open + 1;
    loop {
        match bytes.get(i) {
            None => return fail(at + open, "a double-quoted value is not closed"),
            Some(b'"') => return Ok((out, i + 1)),
            Some(b'\\') => match bytes.get(i + 1) {
                Some(&c @ (b'"' | b'\\' | b'$')) => {
                    out.push(char::from(c));
                    i += 2;
                }
                _ => {
                    out.push('\\');
                    i += 1;
                }
            },
            Some(b'$') if bytes.get(i + 1) == Some(&b'{') => {
                let (s, next) = variable(text, i, at, env, expanded)?;
                out.push_str(&s);
                i = next;
            }
            Some(_) => {
                let ch = text[i..].chars().next().unwrap_or(' ');
                out.push(ch);
                i += ch.len_utf8();
            }
        }
    }
}

/// A `${VAR}` starting at `dollar`; its value and the offset after the `}`.
fn variable(
    text: &str,
    dollar: usize,
    at: usize,
    env: &dyn Fn(&str) -> Option<String>,
    expanded: &mut Vec<String>,
) -> Result<(String, usize), LineError> {
    let Some(len) = text[dollar + 2..].find('}') else {
        return fail(at + dollar, "a ${...} reference is not closed");
    };
    let name = &text[dollar + 2..dollar + 2 + len];
    if name.is_empty() || name.contains(['"', '\'', '$', '{']) {
        return fail(at + dollar, format!("${{{name}}} does not name a variable"));
    }
    expanded.push(name.to_owned());
    Ok((env(name).unwrap_or_default(), dollar + 3 + len))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(name: &str) -> Option<String> {
        (name == "HOME_DIR").then(|| "/home/site".to_owned())
    }

    fn entry(line: &str) -> (String, Option<String>, Value) {
        match parse_line(line, &env) {
            Ok(Line::Entry { name, index, value }) => (name, index, value),
            other => panic!("{line:?} read as {other:?}"),
        }
    }

    fn error(line: &str) -> LineError {
        parse_line(line, &env).expect_err(line)
    }

    #[test]
    fn comments_blanks_and_sections() {
        for line in ["", "   ", "\t", "; pm = static", "  ;x", "\r"] {
            assert_eq!(parse_line(line, &env), Ok(Line::Blank), "{line:?}");
        }
        assert_eq!(parse_line("[www]", &env), Ok(Line::Section("www".into())));
        assert_eq!(
            parse_line("  [ global ] ; the globals\r", &env),
            Ok(Line::Section("global".into()))
        );
        assert_eq!(
            error("[www").message,
            "a section header needs its closing ']'"
        );
        assert!(error("[]").message.contains("needs a name"));
        assert!(error("[www] pm = static").message.contains("may follow"));
    }

    #[test]
    fn values_as_php_reads_them() {
        let (name, index, v) = entry("listen = /run/php/php8.2-fpm.sock ; the socket");
        assert_eq!((name.as_str(), index), ("listen", None));
        assert_eq!(v.text, "/run/php/php8.2-fpm.sock");
        assert!(v.plain);
        let (_, _, v) = entry(r#"access.format = "%R - %u \"%m %r\" \\ \$x \n""#);
        assert_eq!(v.text, r#"%R - %u "%m %r" \ $x \n"#);
        assert!(!v.plain);
        let (_, _, v) = entry("x = 'a ; b \\\" ${HOME_DIR}'");
        assert_eq!(v.text, "a ; b \\\" ${HOME_DIR}");
        let (_, _, v) = entry("chdir = ${HOME_DIR}/www");
        assert_eq!(v.text, "/home/site/www");
        assert_eq!(v.expanded, vec!["HOME_DIR".to_owned()]);
        let (_, _, v) = entry("x = \"${HOME_DIR}\" and ${UNSET}!");
        assert_eq!(v.text, "/home/site and !");
        let (_, _, v) = entry("x=");
        assert_eq!((v.text.as_str(), v.plain), ("", true));
        let (_, _, v) = entry("x = café");
        assert_eq!(v.text, "café");
    }

    #[test]
    fn booleans_turn_into_one_or_empty_only_when_bare() {
        for (line, fpm) in [
            ("catch_workers_output = yes", "1"),
            ("clear_env = Off", ""),
            ("clear_env = none", ""),
            ("x = TRUE", "1"),
            ("x = \"yes\"", "yes"),
            ("x = 0", "0"),
        ] {
            assert_eq!(entry(line).2.fpm(), fpm, "{line}");
        }
    }

    #[test]
    fn array_directives() {
        let (name, index, v) = entry("php_admin_value[error_log] = /var/log/$pool.log");
        assert_eq!(name, "php_admin_value");
        assert_eq!(index.as_deref(), Some("error_log"));
        assert_eq!(v.text, "/var/log/$pool.log");
        let (_, index, _) = entry("env[\"TMP\"] = /tmp");
        assert_eq!(index.as_deref(), Some("TMP"));
        let (_, index, _) = entry("access.suppress_path[] = /ping");
        assert_eq!(index.as_deref(), Some(""));
    }

    #[test]
    fn malformed_lines_are_errors_with_a_column() {
        assert!(error("# a shell comment").message.contains("use ';'"));
        assert_eq!(error("pm static").message, "expected `name = value`");
        assert!(error("x = \"open").message.contains("not closed"));
        assert!(error("x = 'open").message.contains("not closed"));
        let e = error("  x = ${OPEN");
        assert!(e.message.contains("not closed"));
        assert_eq!(e.column, 6);
        assert!(error("x = ${}").message.contains("does not name"));
        assert!(error("p m = 1").message.contains("not a directive name"));
        assert!(error("env[X = 1").message.contains("name[key]"));
        assert!(error("env[a[b]] = 1").message.contains("cannot hold"));
        assert!(error("= 1").message.contains("not a directive name"));
    }

    #[test]
    fn hostile_lines_never_panic() {
        let huge = format!("x = {}", "a".repeat(1 << 20));
        assert_eq!(entry(&huge).2.text.len(), 1 << 20);
        let mut seeds = vec![
            "x = \"\\".to_owned(),
            "x = \"a\\\"".to_owned(),
            "x = ${".to_owned(),
            "x = $".to_owned(),
            "[".to_owned(),
            "x[".to_owned(),
            "é[é]=é\"é'é${é}".to_owned(),
            "x = \"\u{0}\"".to_owned(),
        ];
        // Every prefix of every seed, cut at each character boundary.
        let cut: Vec<String> = seeds
            .iter()
            .flat_map(|s| s.char_indices().map(|(i, _)| s[..i].to_owned()))
            .collect();
        seeds.extend(cut);
        for s in seeds {
            let _ = parse_line(&s, &env);
        }
    }
}
