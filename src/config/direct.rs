//! `accept = "direct"` on a php-cgi pool (ARCHITECTURE.md, "Direct pools"): the pool names
//! a FastCGI `[[listen]]` block with `listener = "ADDRESS"`, corral binds that socket and
//! hands it to every worker as fd 0, and php-cgi accepts the front server's connections
//! itself, as php-fpm's children do. Such a listener is taken out of the front listeners
//! (corral's front never serves it) and such a pool is routed to by no context.

use std::collections::BTreeSet;

use super::file::{FileConfig, FilePool};
use super::validate::Errors;
use super::{Backend, Bind, FrontProtocol, ListenAddress, ListenerConfig, PoolConfig};

/// The listening socket a direct pool's workers accept on.
#[derive(Debug, Clone, PartialEq)]
pub struct DirectListener {
    /// Address, mode and owner, as the `[[listen]]` block wrote them.
    pub bind: Bind,
    /// Its kernel accept backlog.
    pub backlog: u32,
    /// With `php_children`: the pool's `max_memory`, applied by the driver to each php-cgi
    /// child between two of its requests (the child is sent SIGTERM while it is blocked in
    /// accept, and its parent forks a replacement that shares the warm OPcache), instead of
    /// by the state machine to the whole group.
    pub child_max_memory: Option<u64>,
}

/// What the rest of validation must know: the direct pools and their listeners.
#[derive(Debug, Default)]
pub(super) struct Direct {
    pub(super) pools: BTreeSet<String>,
    pub(super) addresses: Vec<ListenAddress>,
}

/// Checks every pool's `accept` and `listener`; moves each direct pool's listener out of
/// `listeners` into the pool's [`DirectListener`].
pub(super) fn resolve(
    e: &mut Errors,
    file: &FileConfig,
    listeners: &mut Vec<ListenerConfig>,
    pools: &mut [PoolConfig],
) -> Direct {
    let mut out = Direct::default();
    for (name, p) in &file.pools {
        let (n, p) = (name.get_ref(), p.get_ref());
        let direct = match &p.accept {
            None => false,
            Some(a) if a.get_ref() == "gateway" => false,
            Some(a) if a.get_ref() == "direct" => true,
            Some(a) => {
                e.at(
                    a.span(),
                    format!(
                        "accept must be \"gateway\" or \"direct\", not \"{}\"",
                        a.get_ref()
                    ),
                );
                false
            }
        };
        if !direct {
            if let Some(l) = &p.listener {
                e.at(
                    l.span(),
                    "listener applies to accept = \"direct\" pools only (a gateway pool is \
                     reached through [[contexts]])",
                );
            }
            continue;
        }
        out.pools.insert(n.clone());
        rules(e, n, p);
        let Some(text) = &p.listener else {
            let span = p.accept.as_ref().map(|a| a.span()).unwrap_or_default();
            e.at(
                span,
                format!(
                    "pool \"{n}\" has accept = \"direct\" but no listener: add listener = \
                     \"ADDRESS\" naming the fastcgi [[listen]] block its workers accept on"
                ),
            );
            continue;
        };
        let Some(addr) = e.check(text.span(), ListenAddress::parse(text.get_ref())) else {
            continue;
        };
        for c in &file.contexts {
            let c = c.get_ref();
            if c.pool.get_ref() == n {
                e.at(
                    c.pool.span(),
                    format!(
                        "pool \"{n}\" accepts directly on {addr}: corral routes no request to \
                         it, so no [[contexts]] may name it"
                    ),
                );
            }
            let names_it = c
                .listen
                .as_ref()
                .is_some_and(|l| ListenAddress::parse(l.get_ref()).is_ok_and(|a| a == addr));
            if let (true, Some(l)) = (names_it, &c.listen) {
                e.at(
                    l.span(),
                    format!("listener {addr} belongs to the direct pool \"{n}\": corral's front does not serve it"),
                );
            }
        }
        if out.addresses.contains(&addr) {
            e.at(
                text.span(),
                format!("listener {addr} is already taken by another direct pool"),
            );
            continue;
        }
        let Some(i) = listeners.iter().position(|l| l.bind.address() == addr) else {
            // A [[listen]] that failed to validate has been reported already.
            if !file
                .listen
                .iter()
                .any(|l| ListenAddress::parse(l.address.get_ref()).is_ok_and(|a| a == addr))
            {
                e.at(
                    text.span(),
                    format!("listener \"{addr}\" is not the address of any [[listen]] block"),
                );
            }
            continue;
        };
        out.addresses.push(addr.clone());
        let l = listeners.remove(i);
        listener_rules(e, text.span(), &addr, &l);
        let spawned = pools
            .iter_mut()
            .find(|c| c.name == *n)
            .map(|c| &mut c.backend);
        if let Some(Backend::Spawned(s)) = spawned {
            // Per child, not per group: see `DirectListener::child_max_memory`.
            let child_max_memory = s
                .php_children
                .is_some()
                .then(|| s.recycle.max_memory.take())
                .flatten();
            s.direct = Some(DirectListener {
                bind: l.bind,
                backlog: l.backlog,
                child_max_memory,
            });
        }
    }
    out
}

/// What a direct pool must be: php-cgi spawned by corral (static, dynamic or ondemand: the
/// sizing works on the kernel's view of its workers, `pool::state::kernel`). With
/// `php_children` (php-fpm's own model: each worker is a php-cgi parent whose children
/// accept on the listener and share its OPcache) the pool must be static: a parent keeps
/// its N children whatever the load, so there is nothing for corral to grow or shrink
/// but whole groups, which the kernel's view of one child cannot drive.
fn rules(e: &mut Errors, n: &str, p: &FilePool) {
    let span = p.accept.as_ref().map(|a| a.span()).unwrap_or_default();
    let php_cgi = p.command.is_some()
        && p.protocol
            .is_none_or(|pr| pr == super::BackendProtocol::Fastcgi);
    if !php_cgi {
        e.at(
            span.clone(),
            format!(
                "pool \"{n}\": accept = \"direct\" applies to a spawned php-cgi pool \
                 (command = [\"php-cgi\", ...], protocol fastcgi)"
            ),
        );
    }
    // php-cgi's options that print something and exit 0 without serving: in a direct pool,
    // an exit 0 is taken for php-cgi's own recycling, so these would respawn without pause.
    let informational = ["-h", "-?", "-i", "-l", "-m", "-s", "-v", "-w"];
    if let Some(cmd) = &p.command {
        for arg in cmd.get_ref() {
            if informational.contains(&arg.get_ref().as_str()) {
                e.at(
                    arg.span(),
                    format!(
                        "php-cgi {} prints and exits instead of serving; leave it out of a \
                         direct pool's command",
                        arg.get_ref()
                    ),
                );
            }
        }
    }
    let mode = p.mode.as_ref().map(|m| (*m.get_ref(), m.span()));
    let sized = !matches!(mode, Some((super::file::FileMode::Static, _)));
    if let (Some(c), true) = (&p.php_children, sized) {
        let span = mode.map_or_else(|| c.span(), |(_, s)| s);
        e.at(
            span,
            format!(
                "pool \"{n}\": php_children on a direct pool needs mode = \"static\" (each php-cgi \
                 parent keeps its {} children, as php-fpm's pm = static); for a pool that grows and \
                 shrinks with the load, leave php_children out (one php-cgi per worker, dynamic or \
                 ondemand) or use the gateway (accept = \"gateway\")",
                c.get_ref()
            ),
        );
    }
    for (key, set) in [
        ("max_conns", p.max_conns.as_ref().map(|v| v.span())),
        ("concurrency", p.concurrency.as_ref().map(|v| v.span())),
        ("health_check", p.health_check.as_ref().map(|v| v.span())),
    ] {
        if let Some(span) = set {
            e.at(
                span,
                format!(
                    "{key} has no effect on a direct pool: its workers take connections \
                     from the kernel, not from corral"
                ),
            );
        }
    }
}

/// What the listener of a direct pool must be: FastCGI, with nothing corral would have to
/// apply to its connections.
fn listener_rules(
    e: &mut Errors,
    span: std::ops::Range<usize>,
    addr: &ListenAddress,
    l: &ListenerConfig,
) {
    if l.protocol != FrontProtocol::Fastcgi {
        e.at(
            span.clone(),
            format!("listener {addr} of a direct pool must have protocol = \"fastcgi\" (php-cgi speaks FastCGI)"),
        );
    }
    if matches!(&l.bind, Bind::Tcp { allow, .. } if !allow.is_empty()) {
        e.at(
            span.clone(),
            format!("listener {addr}: allow cannot apply to a direct pool's listener, whose connections php-cgi accepts, not corral"),
        );
    }
    if l.status_path.is_some() || l.ping_path.is_some() {
        e.at(
            span,
            format!("listener {addr}: status_path and ping_path are answered by corral's front, which does not serve a direct pool's listener; use [status]"),
        );
    }
}

#[cfg(test)]
mod tests {
    use crate::config::{parse, Backend};

    const BASE: &str = r#"
[[listen]]
address = "unix:/run/php/www.sock"
protocol = "fastcgi"

[pools.www]
command = ["php-cgi"]
accept = "direct"
listener = "unix:/run/php/www.sock"
mode = "static"
max = 3
"#;

    fn errors(src: &str) -> String {
        parse(src, "t.toml")
            .expect_err("expected errors")
            .iter()
            .map(|e| e.to_string())
            .collect::<Vec<_>>()
            .join("\n")
    }

    #[test]
    fn a_direct_pool_takes_its_listener_out_of_the_front_and_needs_no_context() {
        let c = parse(BASE, "t.toml").unwrap();
        assert!(c.listeners.is_empty(), "{:?}", c.listeners);
        assert!(c.contexts.is_empty());
        let Backend::Spawned(s) = &c.pools[0].backend else {
            panic!("spawned");
        };
        let d = s.direct.as_ref().unwrap();
        assert_eq!(d.bind.address().to_string(), "unix:/run/php/www.sock");
        assert_eq!(d.backlog, 511);
        // Beside a gateway pool, whose listener and context stay as they were.
        let both = format!(
            "{BASE}\n[[listen]]\naddress = \"127.0.0.1:0\"\nprotocol = \"http\"\n\
             [pools.app]\nservers = [\"127.0.0.1:9\"]\n[[contexts]]\npool = \"app\"\n"
        );
        let c = parse(&both, "t.toml").unwrap();
        assert_eq!(c.listeners.len(), 1);
        assert_eq!(c.contexts.len(), 1);
    }

    #[test]
    fn a_static_direct_pool_may_have_php_children_and_their_max_memory_is_per_child() {
        let src = BASE.replace("max = 3", "max = 3\nphp_children = 4\nmax_memory = \"64M\"");
        let c = parse(&src, "t.toml").unwrap();
        let Backend::Spawned(s) = &c.pools[0].backend else {
            panic!("spawned");
        };
        assert_eq!(s.php_children.map(|g| g.children), Some(4));
        let d = s.direct.as_ref().unwrap();
        assert_eq!(d.child_max_memory, Some(64 << 20));
        assert_eq!(
            s.recycle.max_memory, None,
            "not the state machine's, per group"
        );
        // Without php_children, max_memory stays the state machine's, per worker.
        let c = parse(
            &BASE.replace("max = 3", "max = 3\nmax_memory = \"64M\""),
            "t.toml",
        )
        .unwrap();
        let Backend::Spawned(s) = &c.pools[0].backend else {
            panic!("spawned");
        };
        assert_eq!(s.direct.as_ref().unwrap().child_max_memory, None);
        assert_eq!(s.recycle.max_memory, Some(64 << 20));
    }

    #[test]
    fn a_direct_pool_may_be_dynamic_or_ondemand() {
        let modes = [
            "mode = \"dynamic\"\nmin = 1\nspare_min = 1\nspare_max = 2",
            "mode = \"ondemand\"",
        ];
        for mode in modes {
            let src = BASE.replace("mode = \"static\"", mode);
            let c = parse(&src, "t.toml").unwrap_or_else(|e| panic!("{mode}: {e:?}"));
            let Backend::Spawned(s) = &c.pools[0].backend else {
                panic!("spawned");
            };
            assert!(s.direct.is_some());
            assert_eq!(s.sizing.max(), 3);
        }
    }

    #[test]
    fn direct_pool_rules() {
        let e = errors(&BASE.replace("protocol = \"fastcgi\"", "protocol = \"http\""));
        assert!(e.contains("must have protocol = \"fastcgi\""), "{e}");
        let e = errors(&BASE.replace("accept = \"direct\"\n", ""));
        assert!(
            e.contains("listener applies to accept = \"direct\" pools only"),
            "{e}"
        );
        let e = errors(&BASE.replace("listener = \"unix:/run/php/www.sock\"\n", ""));
        assert!(e.contains("has accept = \"direct\" but no listener"), "{e}");
        let e = errors(&BASE.replace("accept = \"direct\"", "accept = \"proxy\""));
        assert!(
            e.contains("accept must be \"gateway\" or \"direct\""),
            "{e}"
        );
        let e = errors(&BASE.replace(
            "unix:/run/php/www.sock\"\nmode",
            "unix:/run/php/other.sock\"\nmode",
        ));
        assert!(e.contains("is not the address of any [[listen]]"), "{e}");
        let e = errors(&format!("{BASE}[[contexts]]\npool = \"www\"\n"));
        assert!(e.contains("no [[contexts]] may name it"), "{e}");
        let e = errors(&BASE.replace("command = [\"php-cgi\"]", "servers = [\"127.0.0.1:9\"]"));
        assert!(e.contains("applies to a spawned php-cgi pool"), "{e}");
        let e = errors(&BASE.replace("[\"php-cgi\"]", "[\"php-cgi\", \"-v\"]"));
        assert!(e.contains("php-cgi -v prints and exits"), "{e}");
        let e = errors(&BASE.replace(
            "mode = \"static\"\nmax = 3",
            "mode = \"dynamic\"\nmax = 3\nphp_children = 2",
        ));
        assert!(
            e.contains("php_children on a direct pool needs mode = \"static\""),
            "{e}"
        );
        let e = errors(&BASE.replace("mode = \"static\"\nmax = 3", "max = 3\nphp_children = 2"));
        assert!(
            e.contains("needs mode = \"static\""),
            "the default is dynamic: {e}"
        );
        let e = errors(&BASE.replace(
            "protocol = \"fastcgi\"",
            "protocol = \"fastcgi\"\nstatus_path = \"/s\"",
        ));
        assert!(e.contains("status_path and ping_path"), "{e}");
    }
}
