//! A pool's `listen` and its access directives as a corral `[[listen]]`: the address
//! (a port alone, `*:PORT`, `IP:PORT`, `[IPv6]:PORT`, a host name resolved when converting,
//! or a unix socket path taken from the prefix when relative), `listen.owner/group/mode` on a
//! unix socket and `listen.allowed_clients` as a TCP allow list.

use std::collections::BTreeSet;
use std::net::{IpAddr, SocketAddr, ToSocketAddrs};

use super::emit::{array, string, Table};
use super::fpm::{Directive, Pool};

/// A php-fpm `listen` value as a corral address, whether it is TCP, and how it was read.
pub fn listen_address(
    text: &str,
    full: &dyn Fn(&str) -> String,
) -> Result<(String, bool, String), String> {
    if !text.is_empty() && text.bytes().all(|b| b.is_ascii_digit()) {
        let port: u16 = text
            .parse()
            .map_err(|_| format!("port {text} is out of range"))?;
        return Ok((format!("0.0.0.0:{port}"), true, ": every address (php-fpm also takes IPv6 here; add a [[listen]] on \"[::]:PORT\" with its context for it)".to_owned()));
    }
    let Some(colon) = text.rfind(':') else {
        return Ok((format!("unix:{}", full(text)), false, String::new()));
    };
    let (host, port) = (&text[..colon], &text[colon + 1..]);
    let port: u16 = port
        .parse()
        .map_err(|_| format!("listen = {text}: '{port}' is not a port"))?;
    let host = host
        .strip_prefix('[')
        .and_then(|h| h.strip_suffix(']'))
        .unwrap_or(host);
    if host == "*" || host.is_empty() {
        return Ok((
            format!("0.0.0.0:{port}"),
            true,
            ": every address".to_owned(),
        ));
    }
    if let Ok(ip) = host.parse::<IpAddr>() {
        return Ok((SocketAddr::new(ip, port).to_string(), true, String::new()));
    }
    let resolved = (host, port)
        .to_socket_addrs()
        .map_err(|e| format!("listen = {text}: cannot resolve {host}: {e}"))?
        .min_by_key(|a| a.is_ipv6())
        .ok_or_else(|| format!("listen = {text}: {host} has no address"))?;
    Ok((
        resolved.to_string(),
        true,
        format!(": {host} resolved when converting"),
    ))
}

/// `listen.owner/group/mode` (unix) or `listen.allowed_clients` (TCP) on `listen`.
pub fn listen_access<'p>(
    pool: &'p Pool,
    address: &str,
    tcp: bool,
    listen: &mut Table,
    used: &mut BTreeSet<&str>,
) -> Result<(), (&'p Directive, String)> {
    used.extend([
        "listen.owner",
        "listen.group",
        "listen.mode",
        "listen.allowed_clients",
    ]);
    let clients = pool
        .get("listen.allowed_clients")
        .filter(|d| !d.text().trim().is_empty());
    if tcp {
        for key in ["listen.owner", "listen.group", "listen.mode"] {
            if let Some(d) = pool.get(key) {
                listen.note(&format!(
                    "{}: not mapped: php-fpm uses it for unix sockets only",
                    d.written()
                ));
            }
        }
        match clients {
            Some(d) => {
                let mut allow = Vec::new();
                for ip in d.text().split(',').map(str::trim).filter(|s| !s.is_empty()) {
                    let ip: IpAddr = ip.parse().map_err(|_| {
                        (
                            d,
                            format!("'{ip}' in listen.allowed_clients is not an IP address"),
                        )
                    })?;
                    allow.push(format!("{ip}/{}", if ip.is_ipv4() { 32 } else { 128 }));
                }
                listen.set("allow", &array(&allow), "listen.allowed_clients");
            }
            None => {
                let loopback = address
                    .parse::<SocketAddr>()
                    .is_ok_and(|a| a.ip().is_loopback());
                if !loopback {
                    listen.set("allow", &array(&["0.0.0.0/0".to_owned()]), "listen.allowed_clients not set: php-fpm takes every client here, and corral wants that said; narrow it");
                }
            }
        }
        return Ok(());
    }
    if let Some(d) = clients {
        listen.note(&format!(
            "{}: not mapped: php-fpm ignores it on a unix socket (owner, group and mode decide)",
            d.written()
        ));
    }
    match pool.get("listen.mode").filter(|d| !d.text().is_empty()) {
        Some(d) => {
            let text = d.text();
            let digits = text.trim_start_matches('0');
            let valid = digits.len() <= 3 && digits.bytes().all(|b| (b'0'..=b'7').contains(&b));
            if !valid {
                return Err((
                    d,
                    format!("listen.mode '{text}' is not an octal permission like 0660"),
                ));
            }
            listen.set("mode", &string(&format!("0{digits:0>3}")), "listen.mode");
        }
        None => listen.set("mode", &string("0660"), "php-fpm's default listen.mode"),
    }
    let set = |key: &str| pool.get(key).map(Directive::text).filter(|t| !t.is_empty());
    match set("listen.owner") {
        Some(owner) => listen.set("owner", &string(&owner), "listen.owner"),
        None => listen.note("listen.owner: not set; php-fpm's default is its own user, corral's is the same (its own)"),
    }
    match (set("listen.group"), set("listen.owner")) {
        (Some(group), _) => listen.set("group", &string(&group), "listen.group"),
        (None, Some(owner)) => match super::pool::primary_group(&owner) {
            Some(group) => listen.set("group", &string(&group), "php-fpm's default listen.group: the owner's primary group"),
            None => listen.note("listen.group: php-fpm takes the owner's primary group; that user is not on this machine, so say group = \"...\""),
        },
        (None, None) => listen.note("listen.group: not set; php-fpm's default is its own group, corral's is the same (its own)"),
    }
    Ok(())
}

/// What a unix socket's directory needs: corral binds the socket but does not create the
/// directory it is in; on Debian, /run/php comes from php-fpm's tmpfiles.d entry, and
/// php-fpm's unit keeps the /run/php/php-fpm.sock symlink only while php-fpm runs.
pub fn socket_dir_note(path: &str) -> String {
    let dir = std::path::Path::new(path)
        .parent()
        .map_or_else(|| "/".to_owned(), |d| d.display().to_string());
    let mut note = format!(
        "corral does not create {dir}: it must exist when corral starts (a php-fpm still \
         listening here makes corral refuse the address: stop php-fpm first)"
    );
    if dir == "/run/php" {
        note.push_str(
            "; Debian makes /run/php from php-fpm's tmpfiles.d entry, and php-fpm's unit \
             removes the /run/php/php-fpm.sock symlink when it stops: point fastcgi_pass \
             at this path itself",
        );
    }
    note
}
