//! Configuration errors located in their source: a TOML byte span becomes `LINE:COL`, and the
//! error is rendered with the offending line and a caret under the bad part.
//!
//! A config error is a message for a person at a place in a file; nothing branches on which
//! rule failed, so this is one struct carrying a sentence rather than an enum of dozens of
//! rules (the sentences live next to the checks, in `validate` and `pool`).

use std::fmt;
use std::ops::Range;

/// One problem in a configuration, with where it is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError {
    origin: String,
    message: String,
    location: Option<Location>,
}

/// A point in the source and the line it is on.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Location {
    /// 1-based line number.
    line: usize,
    /// 1-based column, counted in characters.
    column: usize,
    /// The whole source line, without its newline.
    text: String,
    /// Characters to underline, at least 1.
    width: usize,
}

impl ConfigError {
    /// An error at `span` (byte offsets into `src`); `None` = about the file as a whole.
    pub(crate) fn new(
        src: &str,
        origin: &str,
        span: Option<Range<usize>>,
        message: impl Into<String>,
    ) -> Self {
        ConfigError {
            origin: origin.to_owned(),
            message: message.into(),
            location: span.map(|s| locate(src, s)),
        }
    }

    /// The name of the configuration (usually its path).
    pub fn origin(&self) -> &str {
        &self.origin
    }

    /// The sentence saying what is wrong.
    pub fn message(&self) -> &str {
        &self.message
    }

    /// 1-based line, if the error is about one place.
    pub fn line(&self) -> Option<usize> {
        self.location.as_ref().map(|l| l.line)
    }

    /// 1-based column in characters, if the error is about one place.
    pub fn column(&self) -> Option<usize> {
        self.location.as_ref().map(|l| l.column)
    }
}

/// `FILE:LINE:COL: message`, then the source line and a caret; or `FILE: message`.
impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let Some(loc) = &self.location else {
            return write!(f, "{}: {}", self.origin, self.message);
        };
        writeln!(
            f,
            "{}:{}:{}: {}",
            self.origin, loc.line, loc.column, self.message
        )?;
        let number = loc.line.to_string();
        let gutter = " ".repeat(number.len());
        // Keep tabs in the padding so the caret lines up under tab-indented text.
        let pad: String = loc
            .text
            .chars()
            .take(loc.column.saturating_sub(1))
            .map(|c| if c == '\t' { '\t' } else { ' ' })
            .collect();
        writeln!(f, " {number} | {}", loc.text)?;
        write!(f, " {gutter} | {pad}{}", "^".repeat(loc.width))
    }
}

impl std::error::Error for ConfigError {}

/// Turns a byte span into a location. Spans that run past the end of the text or split a
/// character are clamped rather than trusted.
fn locate(src: &str, span: Range<usize>) -> Location {
    let start = floor_char_boundary(src, span.start);
    let end = floor_char_boundary(src, span.end.max(start));
    let before = src.get(..start).unwrap_or_default();
    let line_start = before.rfind('\n').map_or(0, |i| i + 1);
    let line_end = src
        .get(start..)
        .and_then(|rest| rest.find('\n'))
        .map_or(src.len(), |i| start + i);
    let text = src
        .get(line_start..line_end)
        .unwrap_or_default()
        .trim_end_matches('\r');
    let column = before.get(line_start..).unwrap_or_default().chars().count() + 1;
    let underlined = src
        .get(start..end.min(line_end))
        .unwrap_or_default()
        .chars()
        .count();
    Location {
        line: before.matches('\n').count() + 1,
        column,
        text: text.to_owned(),
        width: underlined.max(1),
    }
}

/// The largest char boundary of `s` at or below `i`.
fn floor_char_boundary(s: &str, i: usize) -> usize {
    let mut i = i.min(s.len());
    while !s.is_char_boundary(i) {
        i -= 1;
    }
    i
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn locates_line_and_column_in_characters() {
        let src = "a = 1\nnamé = \"x\"\nbad = 2\n";
        let start = src.find("bad").unwrap();
        let e = ConfigError::new(src, "f.toml", Some(start..start + 3), "no");
        assert_eq!((e.line(), e.column()), (Some(3), Some(1)));
        let start = src.find("\"x\"").unwrap();
        let e = ConfigError::new(src, "f.toml", Some(start..start + 3), "no");
        assert_eq!((e.line(), e.column()), (Some(2), Some(8)));
        assert_eq!(
            e.to_string(),
            "f.toml:2:8: no\n 2 | namé = \"x\"\n   |        ^^^"
        );
    }

    #[test]
    fn empty_span_at_end_of_text_still_gets_a_caret() {
        let src = "[pools.php";
        let e = ConfigError::new(src, "f", Some(10..10), "unclosed");
        assert_eq!(
            e.to_string(),
            "f:1:11: unclosed\n 1 | [pools.php\n   |           ^"
        );
    }

    #[test]
    fn multi_line_span_underlines_to_end_of_first_line() {
        let src = "x = [\n  1,\n]\n";
        let e = ConfigError::new(src, "f", Some(4..12), "bad");
        assert!(e.to_string().ends_with("\n   |     ^"));
    }

    #[test]
    fn out_of_range_span_is_clamped() {
        let e = ConfigError::new("é", "f", Some(1..99), "m");
        assert_eq!((e.line(), e.column()), (Some(1), Some(1)));
    }

    #[test]
    fn whole_file_error_has_no_location() {
        let e = ConfigError::new("", "f.toml", None, "no pools");
        assert_eq!(e.to_string(), "f.toml: no pools");
        assert_eq!(e.line(), None);
    }
}
