//! The first stage's errors, every one of them: unknown keys and values of the wrong type
//! anywhere in the file, each located, in source order, with the nearest valid name
//! suggested for a misspelt key or value ("did you mean `spare_min`?").
//!
//! serde stops at the first error, so the file is parsed once into toml's span-keeping tree
//! and deserialized into [`FileConfig`] again and again: after each error the key it points
//! at (the innermost one whose name or value holds the error's span) is taken out of the
//! tree and the next error is looked for. The key sets are the serde structs' own, so
//! nothing here repeats them. Each round removes a key, so the rounds end.

use std::ops::Range;

use serde::Deserialize;
use toml::de::{DeArray, DeTable, DeValue};
use toml::Spanned;

use super::diagnostic::ConfigError;
use super::file::FileConfig;

/// Most errors reported from one file: past this the file is likely not corral's at all.
const MAX_ERRORS: usize = 50;

/// Reads the TOML into [`FileConfig`]; a syntax error comes back alone, key and type errors
/// all together.
pub fn read(src: &str, origin: &str) -> Result<FileConfig, Vec<ConfigError>> {
    let mut root = DeTable::parse(src).map_err(|e| {
        vec![ConfigError::new(
            src,
            origin,
            e.span(),
            e.message().to_owned(),
        )]
    })?;
    let mut errors: Vec<(Option<Range<usize>>, String)> = Vec::new();
    // Keys taken out so far, with the span of the table they were in: a table then missing
    // a required key only because it was taken out is not reported again, only dropped.
    let mut removed: Vec<(Range<usize>, String)> = Vec::new();
    while errors.len() < MAX_ERRORS {
        let e = match FileConfig::deserialize(toml::de::Deserializer::from(root.clone())) {
            Ok(file) if errors.is_empty() => return Ok(file),
            Ok(_) => break,
            Err(e) => e,
        };
        let Some(span) = e.span() else {
            errors.push((None, message(e.message())));
            break;
        };
        let follow_on = missing_field(e.message())
            .is_some_and(|name| removed.iter().any(|(t, k)| *t == span && k == name));
        if !follow_on {
            errors.push((Some(span.clone()), message(e.message())));
        }
        let root_span = root.span();
        match remove_at(root.get_mut(), &root_span, &span) {
            Some(taken) => removed.push(taken),
            None => break,
        }
    }
    errors.sort_by_key(|(span, _)| span.as_ref().map_or(usize::MAX, |s| s.start));
    Err(errors
        .into_iter()
        .map(|(span, m)| ConfigError::new(src, origin, span, m))
        .collect())
}

/// serde's message, for a person writing TOML: what fits rather than Rust's type names,
/// and the nearest valid name for an unknown one.
fn message(serde: &str) -> String {
    let text = serde
        .replace(
            "expected u32",
            "expected a whole number from 0 to 4294967295",
        )
        .replace("expected u64", "expected a whole number of 0 or more");
    match suggestion(&text) {
        // The list of every valid key is long; with a near one, that one says enough.
        Some(near) if text.starts_with("unknown field ") => {
            let unknown = text.split(", expected").next().unwrap_or(&text);
            format!("{unknown}; did you mean `{near}`?")
        }
        Some(near) => format!("{text}; did you mean `{near}`?"),
        None => text,
    }
}

/// For serde's "unknown field `x`, expected one of `a`, `b`" (and "unknown variant"), the
/// expected name nearest to `x`, when it is near enough to be a typo.
fn suggestion(text: &str) -> Option<&str> {
    if !(text.starts_with("unknown field ") || text.starts_with("unknown variant ")) {
        return None;
    }
    let mut quoted = text.split('`').skip(1).step_by(2);
    let unknown = quoted.next()?;
    // A typo is a few edits away: one in a short name, about a third of a long one.
    let allowed = (unknown.chars().count() / 3).max(1);
    quoted
        .map(|candidate| (distance(unknown, candidate), candidate))
        .filter(|(d, _)| *d <= allowed)
        .min_by_key(|(d, _)| *d)
        .map(|(_, c)| c)
}

/// Edits (insert, delete, substitute, swap two neighbours) from `a` to `b`, by characters,
/// ignoring letter case.
fn distance(a: &str, b: &str) -> usize {
    let a: Vec<char> = a.to_lowercase().chars().collect();
    let b: Vec<char> = b.to_lowercase().chars().collect();
    // Three rows of the optimal-string-alignment table: two back, one back, this one.
    let mut before: Vec<usize> = vec![0; b.len() + 1];
    let mut last: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.iter().enumerate() {
        let mut row = vec![i + 1; b.len() + 1];
        for (j, cb) in b.iter().enumerate() {
            let cost = usize::from(ca != cb);
            let mut best = (last[j] + cost).min(last[j + 1] + 1).min(row[j] + 1);
            if i > 0 && j > 0 && a[i - 1] == *cb && b[j - 1] == *ca {
                best = best.min(before[j - 1] + 1);
            }
            row[j + 1] = best;
        }
        before = std::mem::replace(&mut last, row);
    }
    last[b.len()]
}

fn holds(outer: &Range<usize>, inner: &Range<usize>) -> bool {
    outer.start <= inner.start && inner.end <= outer.end
}

/// The key serde's "missing field `x`" names.
fn missing_field(text: &str) -> Option<&str> {
    text.strip_prefix("missing field `")?.split('`').next()
}

/// Takes out of `table` (whose span is `table_span`) the innermost key whose name or value
/// holds `span`, or the table of an array of tables that is that span (a required key
/// missing from it); the span of the table it was taken from and its name.
fn remove_at(
    table: &mut DeTable<'_>,
    table_span: &Range<usize>,
    span: &Range<usize>,
) -> Option<(Range<usize>, String)> {
    let mut hit = None;
    for (key, value) in table.iter_mut() {
        let value_span = value.span();
        // Deeper first: a table's own span may be its header only.
        let inside = match value.get_mut() {
            DeValue::Table(inner) => remove_at(inner, &value_span, span),
            DeValue::Array(items) => remove_in_array(items, span),
            _ => None,
        };
        if inside.is_some() {
            return inside;
        }
        if holds(&key.span(), span) || holds(&value_span, span) {
            hit = Some(key.get_ref().to_string());
            break;
        }
    }
    let name = hit?;
    table.remove(name.as_str());
    Some((table_span.clone(), name))
}

/// [`remove_at`] inside the tables of an array; an element that is itself `span` is taken
/// out of the array.
fn remove_in_array(items: &mut DeArray<'_>, span: &Range<usize>) -> Option<(Range<usize>, String)> {
    let mut whole = None;
    for (i, item) in items.iter_mut().enumerate() {
        let item_span = item.span();
        if let DeValue::Table(inner) = item.get_mut() {
            let inside = remove_at(inner, &item_span, span);
            if inside.is_some() {
                return inside;
            }
            if item_span == *span {
                whole = Some(i);
                break;
            }
        }
    }
    let i = whole?;
    let mut kept = DeArray::new();
    for (j, item) in items.iter().enumerate() {
        if j != i {
            kept.push(Spanned::new(item.span(), item.get_ref().clone()));
        }
    }
    *items = kept;
    Some((span.clone(), format!("[{i}]")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn typos_are_a_few_edits_away() {
        assert_eq!(distance("spare_mim", "spare_min"), 1);
        assert_eq!(distance("grce", "grace"), 1);
        assert_eq!(distance("sgci", "scgi"), 1, "a swap is one edit");
        assert_eq!(distance("Max", "max"), 0);
        assert_eq!(distance("", "abc"), 3);
        assert_eq!(
            suggestion("unknown field `spare_mim`, expected one of `spare_min`, `spare_max`"),
            Some("spare_min")
        );
        assert_eq!(
            suggestion("unknown field `workers`, expected one of `server`, `listen`"),
            None
        );
        assert_eq!(
            suggestion("unknown variant `sgci`, expected one of `fastcgi`, `scgi`, `http`"),
            Some("scgi")
        );
        assert_eq!(suggestion("invalid type: string \"4\", expected u32"), None);
    }

    #[test]
    fn every_key_and_type_error_is_reported_in_source_order() {
        let src = "[server]\ngrce = \"30s\"\nthreads = -2\n\n\
                   [[listen]]\naddress = \"127.0.0.1:8080\"\nprotocol = \"sgci\"\n\n\
                   [[listen]]\naddress = 8080\nprotocol = \"http\"\nbacklogg = 10\n\n\
                   [pools.php]\ncommand = [\"php-cgi\"]\nspare_mim = 1\n\n\
                   [[contexts]]\npool = \"php\"\nroot = 5\n";
        let errors = read(src, "t.toml").unwrap_err();
        let got: Vec<(usize, usize, &str)> = errors
            .iter()
            .map(|e| (e.line().unwrap(), e.column().unwrap(), e.message()))
            .collect();
        assert_eq!(got.len(), 7, "{got:#?}");
        let expect = [
            (2, 1, "unknown field `grce`; did you mean `grace`?"),
            (
                3,
                11,
                "invalid value: integer `-2`, expected a whole number",
            ),
            (7, 12, "unknown variant `sgci`"),
            (10, 11, "invalid type: integer `8080`, expected a string"),
            (12, 1, "unknown field `backlogg`; did you mean `backlog`?"),
            (
                16,
                1,
                "unknown field `spare_mim`; did you mean `spare_min`?",
            ),
            (20, 8, "invalid type: integer `5`, expected a string"),
        ];
        for ((line, col, msg), (l, c, m)) in got.iter().zip(expect) {
            assert_eq!((*line, *col), (l, c), "{msg}");
            assert!(msg.starts_with(m), "{msg:?} is not {m:?}");
        }
    }

    #[test]
    fn a_syntax_error_is_reported_alone() {
        let errors = read("[server\ngrce = 1\n", "t.toml").unwrap_err();
        assert_eq!(errors.len(), 1, "{errors:?}");
    }
}
