//! `refork_after = [N1, N2, ...]` of a preloading app pool: after a worker forked from the
//! current template has served N1 requests, it is promoted to be the template the next
//! workers are forked from, and so on for N2 with the next generation (docs/pools.md,
//! "Reforking").

use toml::Spanned;

use super::file::FilePool;
use super::validate::Errors;
use super::Program;

/// Most steps: each promotion keeps the template it came from alive (its parent), so the
/// chain of templates is as long as the list plus one.
pub const MAX_REFORK_STEPS: usize = 8;

/// The steps of `refork_after`, a small copyable list (the pool's spec is `Copy`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ReforkSteps {
    steps: [u64; MAX_REFORK_STEPS],
    len: usize,
}

impl ReforkSteps {
    /// No reforking.
    pub const NONE: ReforkSteps = ReforkSteps {
        steps: [0; MAX_REFORK_STEPS],
        len: 0,
    };

    /// The steps as written (at most [`MAX_REFORK_STEPS`]; more are dropped).
    pub fn new(steps: &[u64]) -> ReforkSteps {
        let mut s = ReforkSteps::NONE;
        for (slot, &n) in s.steps.iter_mut().zip(steps) {
            *slot = n;
            s.len += 1;
        }
        s
    }

    /// The requests a worker of template generation `generation` (0: the preloader corral
    /// started) must serve before it is promoted; `None` once the list is used up.
    pub fn after(&self, generation: usize) -> Option<u64> {
        self.as_slice().get(generation).copied()
    }

    /// The steps.
    pub fn as_slice(&self) -> &[u64] {
        self.steps.get(..self.len).unwrap_or_default()
    }

    /// Whether reforking is off.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

/// `refork_after`, checked: a pool that preloads through an embedded launcher, at most
/// [`MAX_REFORK_STEPS`] steps, each at least 1 and larger than the one before. Errors are
/// recorded in `e` and give no steps.
pub(super) fn refork_after(
    e: &mut Errors,
    p: &FilePool,
    preload: bool,
    program: Option<&Program>,
) -> ReforkSteps {
    let Some(list) = p.refork_after.as_ref() else {
        return ReforkSteps::NONE;
    };
    let span = Spanned::span(list);
    let launcher = matches!(program, Some(Program::Rack { .. }))
        || matches!(program, Some(Program::Wsgi { native: None, .. }));
    if matches!(program, Some(Program::PhpNative { .. }))
        || matches!(
            program,
            Some(Program::Wsgi {
                native: Some(_),
                ..
            })
        )
    {
        e.at(
            span,
            "refork_after is not supported with worker = \"native\" yet: only the embedded \
             WSGI and Rack launchers can promote a worker to be the template; drop \
             refork_after or the worker key",
        );
        return ReforkSteps::NONE;
    }
    if program.is_some() && !launcher {
        e.at(
            span,
            "refork_after needs app = \"wsgi:...\" or \"rack:...\": only the embedded \
             launchers preload and fork",
        );
        return ReforkSteps::NONE;
    }
    if !preload {
        e.at(
            span,
            "refork_after needs preload: a worker can become the template only when workers \
             are forked from one (remove preload = false, or refork_after)",
        );
        return ReforkSteps::NONE;
    }
    let steps = list.get_ref();
    if steps.is_empty() {
        e.at(
            span,
            "refork_after is empty: list the request counts, e.g. [100, 1000], or remove it",
        );
        return ReforkSteps::NONE;
    }
    if steps.len() > MAX_REFORK_STEPS {
        e.at(
            span,
            format!(
                "refork_after has {} steps; at most {MAX_REFORK_STEPS} (each promotion keeps \
                 one more template alive)",
                steps.len()
            ),
        );
        return ReforkSteps::NONE;
    }
    let mut ok = true;
    let mut before = 0u64;
    for step in steps {
        let n = *step.get_ref();
        if n == 0 {
            e.at(
                step.span(),
                "refork_after steps count requests and must be at least 1",
            );
            ok = false;
        } else if n <= before {
            e.at(
                step.span(),
                format!(
                    "refork_after must increase: {n} follows {before} (each generation's \
                     workers serve more before the next promotion)"
                ),
            );
            ok = false;
        }
        before = before.max(n);
    }
    if !ok {
        return ReforkSteps::NONE;
    }
    let values: Vec<u64> = steps.iter().map(|s| *s.get_ref()).collect();
    ReforkSteps::new(&values)
}

#[cfg(test)]
mod tests {
    use crate::config::{parse, Backend, Config};

    const BASE: &str = r#"
[[listen]]
address = "127.0.0.1:8080"
protocol = "http"

[[contexts]]
pool = "app"

[pools.app]
app = "wsgi:app:application"
mode = "static"
max = 4
"#;

    fn steps_of(c: &Config) -> Vec<u64> {
        match &c.pools[0].backend {
            Backend::Spawned(s) => s.recycle.refork_after.as_slice().to_vec(),
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
    fn steps_are_kept_in_order_and_off_unless_set() {
        assert!(steps_of(&parse(BASE, "t.toml").unwrap()).is_empty());
        let src = format!("{BASE}refork_after = [50, 100, 1000]\n");
        assert_eq!(steps_of(&parse(&src, "t.toml").unwrap()), [50, 100, 1000]);
        let rack = BASE.replace("wsgi:app:application", "rack:config.ru");
        let src = format!("{rack}refork_after = [10]\n");
        assert_eq!(steps_of(&parse(&src, "t.toml").unwrap()), [10]);
    }

    #[test]
    fn bad_lists_and_pools_that_cannot_refork_are_refused_at_their_line() {
        for (lines, message) in [
            (
                "refork_after = [100, 50]",
                "refork_after must increase: 50 follows 100",
            ),
            (
                "refork_after = [100, 100]",
                "refork_after must increase: 100 follows 100",
            ),
            ("refork_after = [0, 5]", "at least 1"),
            ("refork_after = []", "refork_after is empty"),
            ("refork_after = [1, 2, 3, 4, 5, 6, 7, 8, 9]", "at most 8"),
            ("refork_after = [-1]", "refork_after"),
            (
                "preload = false\nrefork_after = [10]",
                "refork_after needs preload",
            ),
            (
                "worker = \"native\"\nrefork_after = [10]",
                "not supported with worker = \"native\"",
            ),
        ] {
            let got = errors(&format!("{BASE}{lines}\n"));
            assert!(
                got.contains("t.toml:1") && got.contains(message),
                "{lines}: {got}"
            );
        }
        let command = BASE.replace("app = \"wsgi:app:application\"", "command = [\"php-cgi\"]");
        let got = errors(&format!("{command}refork_after = [10]\n"));
        assert!(got.contains("refork_after needs app"), "{got}");
    }
}
