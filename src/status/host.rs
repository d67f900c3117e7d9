//! Which Host names the status listener answers: the defence against DNS rebinding.
//!
//! A page on any web site can make a browser on the operator's machine resolve the site's
//! own name to 127.0.0.1 (or to the status listener's address) and then read the answers,
//! which name every pool, worker, script and client. The browser sends the attacker's name
//! as Host, so the listener answers only Hosts that cannot be such a name: loopback names
//! (`localhost`, `*.localhost`) and addresses, the address the client reached the listener
//! on, and what `[status] allowed_hosts` lists (`*` for every Host). A request without a Host
//! (HTTP/1.0 from a script) comes from no browser and is answered, and so is `/ping`, which
//! tells nothing. Anything else gets 421 Misdirected Request.

use std::net::IpAddr;

/// Whether a request with this `Host` header (`None`: none sent), reaching the listener on
/// `local` (`None` for a Unix socket), is answered.
pub fn allowed(host: Option<&[u8]>, local: Option<IpAddr>, allowed_hosts: &[String]) -> bool {
    let Some(raw) = host else {
        return true;
    };
    if allowed_hosts.iter().any(|h| h == "*") {
        return true;
    }
    let Ok(text) = std::str::from_utf8(raw) else {
        return false;
    };
    let lower = text.trim().to_ascii_lowercase();
    let name = name_of(&lower);
    if name.is_empty() {
        return false;
    }
    if name == "localhost" || name.ends_with(".localhost") {
        return true;
    }
    if let Ok(ip) = name.parse::<IpAddr>() {
        // A dual-stack listener sees an IPv4 client's address as ::ffff:a.b.c.d.
        let local = local.map(|l| l.to_canonical());
        if ip.is_loopback() || Some(ip.to_canonical()) == local {
            return true;
        }
    }
    allowed_hosts.iter().any(|h| name_of(h) == name)
}

/// The host part of a Host value or a configured entry: without a port, the brackets of an
/// IPv6 literal or a final dot.
fn name_of(host: &str) -> &str {
    let name = if let Some(rest) = host.strip_prefix('[') {
        // An opening bracket without its closing one is no address.
        rest.split_once(']').map_or("", |(ip, _)| ip)
    } else {
        match host.rsplit_once(':') {
            // One colon: a name or IPv4 address with a port. More: a bare IPv6 literal.
            Some((name, port))
                if !name.contains(':') && port.bytes().all(|b| b.is_ascii_digit()) =>
            {
                name
            }
            _ => host,
        }
    };
    name.strip_suffix('.').unwrap_or(name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_the_listeners_own_address_and_listed_names_are_answered() {
        let local: Option<IpAddr> = Some("192.0.2.7".parse().unwrap());
        let none: &[String] = &[];
        for host in [
            "localhost",
            "LOCALHOST:9180",
            "localhost.",
            "app.localhost",
            "127.0.0.1:9180",
            "127.8.9.1",
            "[::1]:9180",
            "::1",
            "192.0.2.7:9180",
        ] {
            assert!(allowed(Some(host.as_bytes()), local, none), "{host}");
        }
        assert!(allowed(None, local, none), "no Host: not a browser");
        let mapped: Option<IpAddr> = Some("::ffff:192.0.2.7".parse().unwrap());
        assert!(allowed(Some(b"192.0.2.7:9180"), mapped, none));
        for host in [
            "evil.example",
            "evil.example:9180",
            "localhost.evil.example",
            "192.0.2.8",
            "",
            "[::1",
            "corral",
        ] {
            assert!(!allowed(Some(host.as_bytes()), local, none), "{host}");
        }
        assert!(!allowed(Some(b"\xff"), local, none));
        let listed = ["status.example".to_owned(), "[2001:db8::1]".to_owned()];
        assert!(allowed(Some(b"Status.Example:9180"), None, &listed));
        assert!(allowed(Some(b"[2001:db8::1]:80"), None, &listed));
        assert!(!allowed(Some(b"other.example"), None, &listed));
        assert!(allowed(Some(b"other.example"), None, &["*".to_owned()]));
    }
}
