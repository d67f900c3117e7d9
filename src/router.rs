//! The router: a request's listener, host and path in, the context that serves it out.
//!
//! Pure: built from a validated configuration alone, with no pools, sockets or files behind
//! it, so a configuration can be routed (and checked, and swapped on reload) without running
//! anything. A context names its pool by [`PoolId`], the pool's position in the
//! configuration; the pool registry built from the same configuration keeps that order
//! (ARCHITECTURE.md, "Generations and reload").

use std::sync::Arc;

use bytes::Bytes;

use crate::config::{Config, ContextConfig, ListenAddress};
use crate::protocols::cgi::{CgiContext, PreparedContext, ScriptMode};

/// A pool's position in the configuration (and in the registry built from it).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct PoolId(pub usize);

/// One context, as a request is served by it.
#[derive(Debug)]
pub struct Context {
    /// As configured.
    pub config: ContextConfig,
    /// Its pool.
    pub pool: PoolId,
    /// Its index among its pool's contexts, for the per-context cap in the slot table.
    pub slot_context: usize,
    /// How CGI variables are built for it, with its constant variables encoded once.
    pub cgi: PreparedContext,
}

/// What the router looks at.
#[derive(Debug, Clone, Copy)]
pub struct RouteKey<'a> {
    /// The listener the request came in on.
    pub listener: &'a ListenAddress,
    /// The host name, lowercase, without port, as bytes: compared with the contexts' host
    /// names byte for byte, with no UTF-8 check on the way.
    pub host: &'a [u8],
    /// The decoded, normalised path (no query), as bytes: matched against the contexts'
    /// prefixes and extensions byte for byte, with no UTF-8 check on the way.
    pub path: &'a [u8],
}

/// Every context of one configuration, in file order.
#[derive(Debug, Default)]
pub struct Router {
    contexts: Vec<Arc<Context>>,
}

impl Router {
    /// The router of `config`. Every context's pool exists: validation saw to that, and a
    /// context whose pool is missing anyway is left out (it could never be served).
    pub fn new(config: &Config) -> Router {
        let mut per_pool = vec![0usize; config.pools.len()];
        let mut contexts = Vec::with_capacity(config.contexts.len());
        for c in &config.contexts {
            let Some(pool) = config.pools.iter().position(|p| p.name == c.pool) else {
                continue;
            };
            let slot_context = per_pool[pool];
            per_pool[pool] += 1;
            contexts.push(Arc::new(Context {
                cgi: PreparedContext::new(cgi_context(c)),
                config: c.clone(),
                pool: PoolId(pool),
                slot_context,
            }));
        }
        Router { contexts }
    }

    /// Every context, in file order.
    pub fn contexts(&self) -> &[Arc<Context>] {
        &self.contexts
    }

    /// The per-context caps of the pool `pool`, in the order of its slot-table contexts.
    pub fn caps_of(&self, pool: PoolId) -> Vec<Option<usize>> {
        self.contexts
            .iter()
            .filter(|c| c.pool == pool)
            .map(|c| Some(c.config.max_conns as usize))
            .collect()
    }

    /// The context for a request: among those whose listener, host, prefix and extension
    /// match, the most specific (a listener named, then an exact host over a wildcard, then
    /// the longest prefix, then an extension); the first in the file on a tie.
    pub fn route(&self, key: RouteKey<'_>) -> Option<&Arc<Context>> {
        // (listener named, host rank, prefix length, extension named): larger is better.
        type Rank = (bool, u8, usize, bool);
        let mut best: Option<(&Arc<Context>, Rank)> = None;
        for ctx in &self.contexts {
            let c = &ctx.config;
            if c.listen.as_ref().is_some_and(|l| l != key.listener) {
                continue;
            }
            let Some(host_rank) = host_rank(c.host.as_deref(), key.host) else {
                continue;
            };
            if !prefix_matches(&c.prefix, key.path) {
                continue;
            }
            if let Some(ext) = &c.extension {
                if !has_extension(key.path, ext, &c.index) {
                    continue;
                }
            }
            let rank = (
                c.listen.is_some(),
                host_rank,
                c.prefix.len(),
                c.extension.is_some(),
            );
            if best.as_ref().is_none_or(|(_, r)| rank > *r) {
                best = Some((ctx, rank));
            }
        }
        best.map(|(c, _)| c)
    }
}

/// How well a context's `host` matches: any host 0, a `*.` wildcard 1, the exact name 2;
/// `None` when it does not match.
fn host_rank(wanted: Option<&str>, host: &[u8]) -> Option<u8> {
    let Some(h) = wanted else {
        return Some(0);
    };
    if h.as_bytes() == host {
        return Some(2);
    }
    let suffix = h.strip_prefix("*.")?.as_bytes();
    let boundary = host.len().checked_sub(suffix.len() + 1)?;
    (host.ends_with(suffix) && host.get(boundary) == Some(&b'.')).then_some(1)
}

/// Whether `path` lies under `prefix` on a segment boundary (`/app` matches `/app` and
/// `/app/x`, not `/apple`).
fn prefix_matches(prefix: &str, path: &[u8]) -> bool {
    if prefix == "/" || prefix.is_empty() {
        return true;
    }
    let prefix = prefix.trim_end_matches('/');
    path.strip_prefix(prefix.as_bytes())
        .is_some_and(|rest| rest.is_empty() || rest.starts_with(b"/"))
}

/// Whether some segment of `path` ends with `.ext`, or `path` names a directory whose index
/// file has that extension (so `/` reaches the PHP context through `index.php`).
fn has_extension(path: &[u8], ext: &str, index: &[String]) -> bool {
    let ext = ext.as_bytes();
    let dotted = |s: &[u8]| {
        s.len() > ext.len() && s.ends_with(ext) && s.get(s.len() - ext.len() - 1) == Some(&b'.')
    };
    if path.split(|&b| b == b'/').any(dotted) {
        return true;
    }
    path.ends_with(b"/") && index.iter().any(|i| dotted(i.as_bytes()))
}

/// The CGI settings of a context: a document root means script files (PHP style, the
/// context's extension or `php`), no root means an application mounted at the prefix.
fn cgi_context(c: &ContextConfig) -> CgiContext {
    let mode = match &c.root {
        Some(_) => ScriptMode::Files {
            extensions: vec![c
                .extension
                .clone()
                .unwrap_or_else(|| "php".to_owned())
                .into_bytes()],
            index: c.index.iter().map(|i| i.clone().into_bytes()).collect(),
        },
        None => ScriptMode::App {
            mount: c.prefix.trim_end_matches('/').as_bytes().to_vec(),
        },
    };
    CgiContext {
        // An application context has no document root of its own; DOCUMENT_ROOT is `/` so
        // that frameworks reading it get an absolute path.
        document_root: c.root.as_ref().map_or_else(
            || b"/".to_vec(),
            |r| r.as_os_str().as_encoded_bytes().to_vec(),
        ),
        mode,
        server_software: Bytes::from(concat!("corral/", env!("CARGO_PKG_VERSION"))),
        // A pinned server_name goes last of the context's variables, which replace the
        // built ones on every front.
        extra_env: c
            .params
            .iter()
            .map(|(k, v)| (Bytes::from(k.clone()), Bytes::from(v.clone())))
            .chain(
                c.server_name
                    .iter()
                    .map(|n| (Bytes::from_static(b"SERVER_NAME"), Bytes::from(n.clone()))),
            )
            .collect(),
        allow_php_ini_params: c.allow_php_value,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefixes_match_on_segment_boundaries() {
        assert!(prefix_matches("/", b"/anything"));
        assert!(prefix_matches("/app", b"/app"));
        assert!(prefix_matches("/app/", b"/app/x"));
        assert!(!prefix_matches("/app", b"/apple"));
        assert!(
            prefix_matches("/app", b"/app/\xff"),
            "bytes past the prefix are not text"
        );
    }

    #[test]
    fn extensions_match_a_segment_or_the_index() {
        let index = vec!["index.php".to_owned()];
        assert!(has_extension(b"/a/b.php", "php", &index));
        assert!(has_extension(b"/b.php/extra/info", "php", &index));
        assert!(has_extension(b"/dir/", "php", &index));
        assert!(!has_extension(b"/b.phps", "php", &index));
        assert!(!has_extension(b"/php", "php", &index));
        assert!(!has_extension(b"/dir/", "php", &[]));
        assert!(has_extension(b"/\xff/b.php", "php", &[]));
    }

    #[test]
    fn wildcard_hosts_need_a_subdomain() {
        assert_eq!(host_rank(None, b"x"), Some(0));
        assert_eq!(host_rank(Some("a.b"), b"a.b"), Some(2));
        assert_eq!(host_rank(Some("*.b"), b"a.b"), Some(1));
        assert_eq!(host_rank(Some("*.b"), b"b"), None);
        assert_eq!(host_rank(Some("*.b"), b".b"), Some(1));
        assert_eq!(host_rank(Some("*.b"), b"ab"), None);
        assert_eq!(host_rank(Some("*.example.com"), b""), None);
    }

    #[test]
    fn the_most_specific_context_wins() {
        let config = crate::config::parse(
            r#"
            [[listen]]
            address = "127.0.0.1:8080"
            protocol = "http"
            [pools.php]
            servers = ["unix:/tmp/php.sock"]
            [pools.app]
            protocol = "scgi"
            servers = ["unix:/tmp/app.sock"]
            [[contexts]]
            prefix = "/"
            pool = "app"
            [[contexts]]
            prefix = "/"
            extension = "php"
            root = "/var/www"
            pool = "php"
            [[contexts]]
            prefix = "/api"
            pool = "app"
            host = "*.example.com"
            "#,
            "test.toml",
        )
        .unwrap();
        let router = Router::new(&config);
        let l: ListenAddress = ListenAddress::parse("127.0.0.1:8080").unwrap();
        let route = |host: &str, path: &str| {
            router
                .route(RouteKey {
                    listener: &l,
                    host: host.as_bytes(),
                    path: path.as_bytes(),
                })
                .map(|c| {
                    router
                        .contexts()
                        .iter()
                        .position(|x| Arc::ptr_eq(x, c))
                        .unwrap()
                })
        };
        assert_eq!(route("x", "/index.php"), Some(1));
        assert_eq!(route("x", "/"), Some(1), "the index file is PHP");
        assert_eq!(route("x", "/static/a.css"), Some(0));
        assert_eq!(route("api.example.com", "/api/v1"), Some(2));
        assert_eq!(route("example.com", "/api/v1"), Some(0), "no subdomain");
        // Pools are named by their position in the configuration; app's two contexts are
        // its slot-table contexts 0 and 1.
        let app_pool = PoolId(config.pools.iter().position(|p| p.name == "app").unwrap());
        let app = &router.contexts()[2];
        assert_eq!((app.pool, app.slot_context), (app_pool, 1));
        assert_eq!(router.caps_of(app_pool).len(), 2);
    }
}
