//! `health_check` and `health_timeout` of a spawned pool: the path corral asks a new worker
//! for before it gets traffic (ARCHITECTURE.md, "Generations and reload").

use std::time::Duration;

use toml::Spanned;

use super::file::FilePool;
use super::validate::Errors;
use super::HealthCheck;

/// Longest health-check path: a request line, not a document.
const MAX_PATH: usize = 1024;
/// `health_timeout` when not set.
const DEFAULT_TIMEOUT: Duration = Duration::from_secs(2);

/// The pool's health check, or `None` (errors recorded in `e`).
pub(super) fn health_check(e: &mut Errors, p: &FilePool) -> Option<HealthCheck> {
    let timeout = e.timeout(p.health_timeout.as_ref(), "health_timeout", DEFAULT_TIMEOUT);
    let Some(path) = &p.health_check else {
        if let Some(t) = &p.health_timeout {
            e.at(
                t.span(),
                "health_timeout needs health_check = \"/path\" (the path corral asks a new worker for)",
            );
        }
        return None;
    };
    let text = path.get_ref();
    let why = if !text.starts_with('/') {
        Some("must start with '/' (a path on the worker, such as \"/healthz\")".to_owned())
    } else if text.len() > MAX_PATH {
        Some(format!("must be at most {MAX_PATH} bytes"))
    } else if text
        .bytes()
        .any(|b| !(0x21..0x7f).contains(&b) || b == b'#')
    {
        Some(
            "must be printable ASCII without spaces or '#' (percent-encode other bytes)".to_owned(),
        )
    } else {
        None
    };
    if let Some(why) = why {
        e.at(Spanned::span(path), format!("health_check {why}"));
        return None;
    }
    Some(HealthCheck {
        path: text.clone(),
        timeout,
    })
}

#[cfg(test)]
mod tests {
    use super::super::{parse, Backend, Config};
    use std::time::Duration;

    /// The configuration tests' smallest valid file, whose pool keys come last.
    const BASE: &str = super::super::tests::MINIMAL;

    fn check_of(c: &Config) -> Option<super::HealthCheck> {
        match &c.pools[0].backend {
            Backend::Spawned(s) => s.health_check.clone(),
            Backend::External { .. } => None,
        }
    }

    fn errors(src: &str) -> String {
        match parse(src, "t.toml") {
            Ok(_) => String::new(),
            Err(errors) => errors.iter().map(|e| e.to_string() + "\n").collect(),
        }
    }

    #[test]
    fn a_health_check_is_a_path_with_a_timeout_of_2s_by_default() {
        let c = parse(BASE, "t.toml").unwrap();
        assert_eq!(check_of(&c), None);
        let c = parse(
            &format!("{BASE}health_check = \"/healthz?deep=1\"\n"),
            "t.toml",
        )
        .unwrap();
        let check = check_of(&c).unwrap();
        assert_eq!(check.path, "/healthz?deep=1");
        assert_eq!(check.timeout, Duration::from_secs(2));
        let src = format!("{BASE}health_check = \"/up\"\nhealth_timeout = \"500ms\"\n");
        let c = parse(&src, "t.toml").unwrap();
        assert_eq!(check_of(&c).unwrap().timeout, Duration::from_millis(500));
    }

    #[test]
    fn bad_health_checks_are_refused_at_their_line() {
        for (value, message) in [
            ("healthz", "must start with '/'"),
            ("/a b", "printable ASCII without spaces"),
            ("/a#b", "printable ASCII without spaces"),
        ] {
            let got = errors(&format!("{BASE}health_check = \"{value}\"\n"));
            assert!(
                got.contains("t.toml:12:") && got.contains(message),
                "{value}: {got}"
            );
        }
        let got = errors(&format!("{BASE}health_timeout = \"1s\"\n"));
        assert!(
            got.contains("t.toml:12:") && got.contains("health_timeout needs health_check"),
            "{got}"
        );
        let got = errors(&format!(
            "{BASE}health_check = \"/up\"\nhealth_timeout = \"0s\"\n"
        ));
        assert!(
            got.contains("health_timeout must be greater than zero"),
            "{got}"
        );
        let external = BASE.replace("command = [\"php-cgi\"]", "servers = [\"127.0.0.1:9000\"]");
        let got = errors(&format!("{external}health_check = \"/up\"\n"));
        assert!(
            got.contains("health_check applies to pools corral spawns"),
            "{got}"
        );
    }
}
