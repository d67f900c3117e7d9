//! The sockets of a configuration: each `[[listen]]` (its address, Unix mode and owner,
//! `allow`, trusted proxies, timeouts and per-client limit) and `[status]`; the rule that a
//! `fastcgi`, `scgi` or status socket reachable from other hosts needs `allow`; and that no
//! two sockets take the same address. Called by `validate.rs`.

use std::net::SocketAddr;
use std::ops::Range;

use toml::Spanned;

use super::file::{FileConfig, FileListen, FileStatus, SpannedList};
use super::units::parse_mode;
use super::validate::{front_timeouts, Errors};
use super::{
    Bind, Cidr, ForwardedHeader, ForwardedTrust, FrontProtocol, ListenAddress, ListenerConfig,
    ServerConfig, StatusConfig, UnixPermissions,
};

/// Default `max_connections_per_client`: room for a browser's six parallel connections many
/// times over, and for a front server on another host keeping a modest keep-alive pool.
const DEFAULT_PER_CLIENT: u32 = 128;

/// The access keys shared by `[[listen]]` and `[status]`.
struct SocketKeys<'f> {
    address: &'f Spanned<String>,
    mode: Option<&'f Spanned<String>>,
    owner: Option<&'f Spanned<String>>,
    group: Option<&'f Spanned<String>>,
    allow: Option<&'f SpannedList>,
}

fn bind(e: &mut Errors, keys: SocketKeys) -> Option<Bind> {
    let address = e.check(
        keys.address.span(),
        ListenAddress::parse(keys.address.get_ref()),
    );
    match address? {
        ListenAddress::Tcp(addr) => {
            for (key, span) in [
                ("mode", keys.mode),
                ("owner", keys.owner),
                ("group", keys.group),
            ]
            .into_iter()
            .filter_map(|(k, v)| Some((k, v?.span())))
            {
                e.at(
                    span,
                    format!("{key} applies to unix: sockets only; {addr} is TCP"),
                );
            }
            let allow = cidrs(e, keys.allow);
            Some(Bind::Tcp { addr, allow })
        }
        ListenAddress::Unix(path) => {
            if let Some(allow) = keys.allow {
                e.at(
                    allow.span(),
                    "allow applies to TCP sockets only; on a unix: socket, mode, owner and \
                     group decide who may connect",
                );
            }
            let mode = match keys.mode {
                None => 0o660,
                Some(m) => e.check(m.span(), parse_mode(m.get_ref())).unwrap_or(0o660),
            };
            let perms = UnixPermissions {
                mode,
                owner: e.account(keys.owner, "owner"),
                group: e.account(keys.group, "group"),
            };
            Some(Bind::Unix { path, perms })
        }
    }
}

fn cidrs(e: &mut Errors, list: Option<&SpannedList>) -> Vec<Cidr> {
    list.map(|l| l.get_ref().as_slice())
        .unwrap_or_default()
        .iter()
        .filter_map(|c| e.check(c.span(), Cidr::parse(c.get_ref())))
        .collect()
}

pub(super) fn listener(
    e: &mut Errors,
    l: &FileListen,
    server: &ServerConfig,
) -> Option<ListenerConfig> {
    let bind = bind(
        e,
        SocketKeys {
            address: &l.address,
            mode: l.mode.as_ref(),
            owner: l.owner.as_ref(),
            group: l.group.as_ref(),
            allow: l.allow.as_ref(),
        },
    );
    let backlog = match &l.backlog {
        None => 511,
        Some(b) if *b.get_ref() == 0 => {
            e.at(b.span(), "backlog must be at least 1");
            511
        }
        Some(b) => *b.get_ref(),
    };
    let forwarded = forwarded(e, l, bind.as_ref());
    if l.protocol != FrontProtocol::Http {
        let protocol = if l.protocol == FrontProtocol::Fastcgi {
            "FastCGI"
        } else {
            "SCGI"
        };
        let why = format!(
            "a {protocol} front server is trusted with every parameter it sends \
             (SCRIPT_FILENAME picks the script to run, PHP_VALUE changes PHP's settings)"
        );
        exposure(e, bind.as_ref(), &l.address, &why);
    }
    let timeouts = front_timeouts(
        e,
        server.front_timeouts,
        [
            l.header_timeout.as_ref(),
            l.idle_timeout.as_ref(),
            l.body_timeout.as_ref(),
            l.send_timeout.as_ref(),
            l.body_deadline.as_ref(),
        ],
    );
    let max_connections_per_client =
        match l.max_connections_per_client.unwrap_or(DEFAULT_PER_CLIENT) {
            0 => None,
            n => Some(n),
        };
    let mut fpm_path = |key: &str, value: Option<&Spanned<String>>| {
        let v = value?;
        let path = v.get_ref();
        if l.protocol != FrontProtocol::Fastcgi {
            e.at(
                v.span(),
                format!(
                    "{key} applies to fastcgi listeners only (php-fpm's status and ping paths)"
                ),
            );
            return None;
        }
        if !path.starts_with('/') || path.contains(['?', '#', ' ']) {
            e.at(
                v.span(),
                format!(
                    "{key} \"{path}\" must be a path starting with '/', without '?', '#' or spaces"
                ),
            );
            return None;
        }
        Some(path.clone())
    };
    let status_path = fpm_path("status_path", l.status_path.as_ref());
    let ping_path = fpm_path("ping_path", l.ping_path.as_ref());
    Some(ListenerConfig {
        bind: bind?,
        protocol: l.protocol,
        backlog,
        forwarded,
        max_connections_per_client,
        timeouts,
        status_path,
        ping_path,
    })
}

/// `forwarded` + `trusted_proxies`: which proxies may tell corral the client used HTTPS.
fn forwarded(e: &mut Errors, l: &FileListen, bind: Option<&Bind>) -> Option<ForwardedTrust> {
    let header = l.forwarded.as_ref();
    let trusted = l.trusted_proxies.as_ref();
    if l.protocol != FrontProtocol::Http {
        for span in [header.map(Spanned::span), trusted.map(Spanned::span)]
            .into_iter()
            .flatten()
        {
            e.at(
                span,
                "forwarded and trusted_proxies apply to http listeners only; a FastCGI or \
                 SCGI front server passes HTTPS itself",
            );
        }
        return None;
    }
    let proxies = cidrs(e, trusted);
    let unix = matches!(bind, Some(Bind::Unix { .. }));
    match (header.map(|h| (*h.get_ref(), h.span())), trusted) {
        (None | Some((ForwardedHeader::None, _)), Some(t)) => {
            e.at(
                t.span(),
                "trusted_proxies has no effect unless forwarded = \"x-forwarded\" or \
                 \"forwarded\" says which header to read",
            );
            None
        }
        (None | Some((ForwardedHeader::None, _)), None) => None,
        (Some((_, _)), Some(t)) if unix => {
            e.at(
                t.span(),
                "trusted_proxies does not apply to a unix: listener: its peers have no IP \
                 address, and the socket's mode, owner and group decide who is trusted",
            );
            None
        }
        (Some((h, span)), t) => {
            if !unix && t.is_none_or(|t| t.get_ref().is_empty()) {
                e.at(
                    span,
                    "forwarded on a TCP listener needs trusted_proxies, or any client could \
                     claim to be on HTTPS",
                );
            }
            Some(ForwardedTrust {
                header: h,
                trusted_proxies: proxies,
            })
        }
    }
}

pub(super) fn status(e: &mut Errors, s: &FileStatus) -> Option<StatusConfig> {
    let bind = bind(
        e,
        SocketKeys {
            address: &s.address,
            mode: s.mode.as_ref(),
            owner: s.owner.as_ref(),
            group: s.group.as_ref(),
            allow: s.allow.as_ref(),
        },
    )?;
    exposure(
        e,
        Some(&bind),
        &s.address,
        "the status pages show every pool, worker and request in progress",
    );
    let allowed_hosts = s
        .allowed_hosts
        .as_ref()
        .map(|l| l.get_ref().as_slice())
        .unwrap_or_default()
        .iter()
        .filter_map(|h| {
            let name = h.get_ref().trim().to_ascii_lowercase();
            let fine = name == "*"
                || (!name.is_empty()
                    && name
                        .bytes()
                        .all(|b| b.is_ascii_alphanumeric() || b"-._:[]".contains(&b)));
            if !fine {
                e.at(
                    h.span(),
                    format!(
                        "allowed_hosts: {:?} is not a host name or address (or \"*\" for every \
                         Host)",
                        h.get_ref()
                    ),
                );
            }
            fine.then_some(name)
        })
        .collect();
    Some(StatusConfig {
        bind,
        allowed_hosts,
    })
}

/// A TCP socket that other hosts can reach must say who may connect: `allow` naming the
/// clients, or `allow = ["0.0.0.0/0"]` (`["::/0"]`) as the explicit word that everyone may.
/// Loopback addresses and Unix sockets (guarded by their mode) need no list.
fn exposure(e: &mut Errors, bind: Option<&Bind>, address: &Spanned<String>, why: &str) {
    let Some(Bind::Tcp { addr, allow }) = bind else {
        return;
    };
    if addr.ip().is_loopback() || !allow.is_empty() {
        return;
    }
    let everyone = if addr.is_ipv4() { "0.0.0.0/0" } else { "::/0" };
    e.at(
        address.span(),
        format!(
            "{addr} is reachable from other hosts and has no allow list, and {why}: add \
             allow = [...] naming the clients that may connect, or allow = [\"{everyone}\"] \
             to say explicitly that every client may"
        ),
    );
}

/// No two sockets may bind the same address, and an unspecified address (0.0.0.0, [::])
/// takes its port on every interface of its family ([::] on both, as Linux binds it
/// dual-stack by default).
pub(super) fn check_distinct_sockets(e: &mut Errors, file: &FileConfig) {
    // Addresses that failed to parse were reported already and take no part.
    let mut seen: Vec<(ListenAddress, Range<usize>)> = Vec::new();
    let addresses = file
        .listen
        .iter()
        .map(|l| &l.address)
        .chain(file.status.as_ref().map(|s| &s.address));
    for spanned in addresses {
        let Ok(addr) = ListenAddress::parse(spanned.get_ref()) else {
            continue;
        };
        if let Some((other, first)) = seen.iter().find(|(other, _)| clash(other, &addr)) {
            let line = e.line_of(first.start);
            let message = if *other == addr {
                format!("address {addr} is already used on line {line}")
            } else {
                format!(
                    "address {addr} takes the same port as {other} on line {line} \
                     (0.0.0.0 and [::] bind every interface)"
                )
            };
            e.at(spanned.span(), message);
        }
        seen.push((addr, spanned.span()));
    }
}

/// Whether two sockets cannot both be bound.
fn clash(a: &ListenAddress, b: &ListenAddress) -> bool {
    match (a, b) {
        (ListenAddress::Unix(p), ListenAddress::Unix(q)) => p == q,
        (ListenAddress::Tcp(x), ListenAddress::Tcp(y)) => tcp_clash(x, y),
        _ => false,
    }
}

fn tcp_clash(x: &SocketAddr, y: &SocketAddr) -> bool {
    // Port 0 asks the kernel for a free port, a different one for each socket.
    if x.port() == 0 || y.port() == 0 {
        return false;
    }
    if x.port() != y.port() {
        return false;
    }
    let wide = |a: &SocketAddr, b: &SocketAddr| {
        a.ip().is_unspecified() && (a.is_ipv6() || a.is_ipv4() == b.is_ipv4())
    };
    x.ip() == y.ip() || wide(x, y) || wide(y, x)
}
