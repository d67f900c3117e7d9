//! `max_pool_memory` and `max_surge` of a spawned pool: the memory budget of the whole pool
//! and how far a rolling restart may go above the pool's size (ARCHITECTURE.md,
//! "Generations and reload" and "The state machine").

use toml::Spanned;

use super::file::FilePool;
use super::units::parse_size;
use super::validate::Errors;
use super::Sizing;

/// Smallest `max_pool_memory` that is not a typo: no pool of interpreters fits in less.
const MIN_POOL_MEMORY: u64 = 1 << 20;

/// `max_pool_memory` in bytes (`None` when unset or "0"; errors recorded in `e`).
pub(super) fn max_pool_memory(e: &mut Errors, p: &FilePool) -> Option<u64> {
    let m = p.max_pool_memory.as_ref()?;
    let bytes = e.check(m.span(), parse_size(&m.get_ref().0))?;
    if bytes > 0 && bytes < MIN_POOL_MEMORY {
        e.at(
            m.span(),
            format!(
                "max_pool_memory of {bytes} bytes is smaller than any pool of workers; did you mean MiB?"
            ),
        );
    }
    Some(bytes).filter(|&b| b > 0)
}

/// `max_surge`: at most `max` (a restart never needs more replacements at once than the
/// pool has workers). `None` when unset (one replacement at a time, see
/// [`super::Recycle::max_surge`]).
pub(super) fn max_surge(e: &mut Errors, p: &FilePool, sizing: &Sizing) -> Option<u32> {
    let s = p.max_surge.as_ref()?;
    let surge = *s.get_ref();
    let max = sizing.max();
    if surge > max {
        e.at(
            Spanned::span(s),
            format!("max_surge {surge} is more than max ({max}): a rolling restart replaces at most every worker at once"),
        );
        return Some(max);
    }
    Some(surge)
}

#[cfg(test)]
mod tests {
    use super::super::{parse, Backend, Config, Recycle};

    const BASE: &str = r#"
[[listen]]
address = "127.0.0.1:8080"
protocol = "http"

[pools.app]
app = "wsgi:app:application"
mode = "static"
max = 4
"#;

    fn recycle_of(c: &Config) -> Recycle {
        match &c.pools[0].backend {
            Backend::Spawned(s) => s.recycle,
            Backend::External { .. } => panic!("spawned"),
        }
    }

    fn errors(src: &str) -> String {
        match parse(src, "t.toml") {
            Ok(_) => String::new(),
            Err(errors) => errors.iter().map(|e| e.to_string() + "\n").collect(),
        }
    }

    #[test]
    fn both_are_off_unless_set() {
        let r = recycle_of(&parse(BASE, "t.toml").unwrap());
        assert_eq!((r.max_pool_memory, r.max_surge), (None, None));
        let src = format!("{BASE}max_pool_memory = \"512MiB\"\nmax_surge = 0\n");
        let r = recycle_of(&parse(&src, "t.toml").unwrap());
        assert_eq!((r.max_pool_memory, r.max_surge), (Some(512 << 20), Some(0)));
        let src = format!("{BASE}max_pool_memory = \"0\"\nmax_surge = 4\n");
        let r = recycle_of(&parse(&src, "t.toml").unwrap());
        assert_eq!((r.max_pool_memory, r.max_surge), (None, Some(4)));
    }

    #[test]
    fn bad_values_are_refused_at_their_line() {
        for (line, message) in [
            ("max_pool_memory = \"12XB\"", "12XB"),
            ("max_pool_memory = \"4096\"", "did you mean MiB?"),
            ("max_surge = 5", "max_surge 5 is more than max (4)"),
            ("max_surge = -1", "max_surge"),
        ] {
            let got = errors(&format!("{BASE}{line}\n"));
            assert!(
                got.contains("t.toml:10:") && got.contains(message),
                "{line}: {got}"
            );
        }
        let external = BASE
            .replace(
                "app = \"wsgi:app:application\"",
                "servers = [\"127.0.0.1:9000\"]",
            )
            .replace("mode = \"static\"\nmax = 4\n", "");
        for key in ["max_pool_memory = \"1GiB\"", "max_surge = 1"] {
            let got = errors(&format!("{external}{key}\n"));
            assert!(
                got.contains("applies to pools corral spawns"),
                "{key}: {got}"
            );
        }
    }
}
