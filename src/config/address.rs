//! Addresses written in the configuration: where a listener binds (`host:port`,
//! `[v6]:port`, `unix:/path`), where an external backend lives (which may be a host name),
//! and client networks in CIDR form.

use std::fmt;
use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;

/// Longest Unix socket path: `sun_path` holds 108 bytes on Linux, including the final NUL.
const MAX_UNIX_PATH: usize = 107;

/// A socket address corral binds: an IP literal and port, or a Unix socket path.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ListenAddress {
    /// `127.0.0.1:8080`, `[::1]:8080`; port 0 picks a free port.
    Tcp(SocketAddr),
    /// `unix:/run/corral/php.sock`.
    Unix(PathBuf),
}

impl ListenAddress {
    /// Parses `host:port`, `[v6]:port` or `unix:/absolute/path`.
    pub fn parse(text: &str) -> Result<Self, String> {
        if let Some(path) = text.strip_prefix("unix:") {
            return unix_path(text, path).map(ListenAddress::Unix);
        }
        if let Ok(addr) = text.parse::<SocketAddr>() {
            return Ok(ListenAddress::Tcp(addr));
        }
        if text.parse::<IpAddr>().is_ok() || !text.contains(':') {
            return Err(format!(
                "address \"{text}\" has no port; write host:port, [v6]:port or unix:/path"
            ));
        }
        Err(format!(
            "address \"{text}\" is not an IP address and port; a listener binds an IP \
             (127.0.0.1:8080, [::1]:8080, 0.0.0.0:8080) or a unix:/path, not a host name"
        ))
    }
}

impl fmt::Display for ListenAddress {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ListenAddress::Tcp(addr) => write!(f, "{addr}"),
            ListenAddress::Unix(path) => write!(f, "unix:{}", path.display()),
        }
    }
}

/// Where an external backend listens: a host (IP or DNS name) and port, or a Unix socket.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum BackendAddress {
    /// A TCP endpoint; `host` is an IP literal (without brackets) or a DNS name.
    Tcp {
        /// IP literal or DNS name.
        host: String,
        /// Port, 1-65535.
        port: u16,
    },
    /// `unix:/path`.
    Unix(PathBuf),
}

impl BackendAddress {
    /// Parses `host:port`, `[v6]:port`, `name:port` or `unix:/absolute/path`.
    pub fn parse(text: &str) -> Result<Self, String> {
        if let Some(path) = text.strip_prefix("unix:") {
            return unix_path(text, path).map(BackendAddress::Unix);
        }
        if let Ok(addr) = text.parse::<SocketAddr>() {
            if addr.port() == 0 {
                return Err(format!("server \"{text}\" has port 0"));
            }
            return Ok(BackendAddress::Tcp {
                host: addr.ip().to_string(),
                port: addr.port(),
            });
        }
        let Some((host, port)) = text.rsplit_once(':') else {
            return Err(format!(
                "server \"{text}\" has no port; write host:port, [v6]:port or unix:/path"
            ));
        };
        let port = match port.parse::<u16>() {
            Ok(p) if p != 0 => p,
            _ => return Err(format!("server \"{text}\" has an invalid port \"{port}\"")),
        };
        if !is_host_name(host) {
            return Err(format!(
                "server \"{text}\": \"{host}\" is neither an IP address nor a host name \
                 (IPv6 addresses go in brackets: [::1]:9000)"
            ));
        }
        Ok(BackendAddress::Tcp {
            host: host.to_ascii_lowercase(),
            port,
        })
    }
}

impl fmt::Display for BackendAddress {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            BackendAddress::Tcp { host, port } if host.contains(':') => {
                write!(f, "[{host}]:{port}")
            }
            BackendAddress::Tcp { host, port } => write!(f, "{host}:{port}"),
            BackendAddress::Unix(path) => write!(f, "unix:{}", path.display()),
        }
    }
}

/// A network in CIDR form, used to say which clients may connect or be trusted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Cidr {
    network: IpAddr,
    prefix_len: u8,
}

impl Cidr {
    /// Parses `10.0.0.0/8`, `fd00::/8`, or a bare address (a single host). Host bits must be
    /// zero, so a typo like `10.0.0.1/8` is caught instead of silently widened.
    pub fn parse(text: &str) -> Result<Self, String> {
        let (addr, len) = match text.split_once('/') {
            Some((addr, len)) => (addr, Some(len)),
            None => (text, None),
        };
        let network: IpAddr = addr
            .parse()
            .map_err(|_| format!("\"{text}\" is not an IP network like 10.0.0.0/8 or ::1/128"))?;
        let max = if network.is_ipv4() { 32 } else { 128 };
        let prefix_len = match len.map(str::parse::<u8>) {
            None => max,
            Some(Ok(n)) if n <= max => n,
            Some(_) => {
                return Err(format!(
                    "\"{text}\" has an invalid prefix length; it must be 0-{max}"
                ))
            }
        };
        let cidr = Cidr {
            network,
            prefix_len,
        };
        if cidr.mask(network) != network {
            return Err(format!(
                "\"{text}\" has host bits set; did you mean {}/{prefix_len}?",
                cidr.mask(network)
            ));
        }
        Ok(cidr)
    }

    /// Whether `ip` is inside this network. IPv4 clients seen as IPv4-mapped IPv6
    /// (`::ffff:a.b.c.d`, as on a dual-stack socket) match IPv4 networks.
    pub fn contains(&self, ip: IpAddr) -> bool {
        let ip = match ip {
            IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
            v4 => v4,
        };
        ip.is_ipv4() == self.network.is_ipv4() && self.mask(ip) == self.network
    }

    /// `ip` with every bit past the prefix cleared.
    fn mask(&self, ip: IpAddr) -> IpAddr {
        match ip {
            IpAddr::V4(v4) => {
                let bits = u32::from(v4)
                    & u32::MAX
                        .checked_shl(32 - u32::from(self.prefix_len))
                        .unwrap_or(0);
                IpAddr::V4(bits.into())
            }
            IpAddr::V6(v6) => {
                let bits = u128::from(v6)
                    & u128::MAX
                        .checked_shl(128 - u32::from(self.prefix_len))
                        .unwrap_or(0);
                IpAddr::V6(bits.into())
            }
        }
    }
}

impl fmt::Display for Cidr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.network, self.prefix_len)
    }
}

/// Checks the path of a `unix:` address (`whole` is the address, for the message).
fn unix_path(whole: &str, path: &str) -> Result<PathBuf, String> {
    if !path.starts_with('/') {
        return Err(format!(
            "socket path in \"{whole}\" must be absolute (unix:/run/corral/x.sock)"
        ));
    }
    if path.contains('\0') {
        return Err(format!("socket path in \"{whole}\" contains a NUL byte"));
    }
    if path.len() > MAX_UNIX_PATH {
        return Err(format!(
            "socket path in \"{whole}\" is {} bytes; Unix sockets allow at most {MAX_UNIX_PATH}",
            path.len()
        ));
    }
    Ok(PathBuf::from(path))
}

/// A DNS host name: dot-separated labels of ASCII letters, digits and inner hyphens.
fn is_host_name(host: &str) -> bool {
    !host.is_empty()
        && host.len() <= 253
        && host.split('.').all(|label| {
            !label.is_empty()
                && label.len() <= 63
                && !label.starts_with('-')
                && !label.ends_with('-')
                && label.chars().all(|c| c.is_ascii_alphanumeric() || c == '-')
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn listen_addresses() {
        assert_eq!(
            ListenAddress::parse("127.0.0.1:8080").unwrap().to_string(),
            "127.0.0.1:8080"
        );
        assert_eq!(
            ListenAddress::parse("[::1]:80").unwrap().to_string(),
            "[::1]:80"
        );
        assert_eq!(
            ListenAddress::parse("[0:0::1]:80"),
            ListenAddress::parse("[::1]:80")
        );
        assert_eq!(
            ListenAddress::parse("unix:/run/corral/php.sock").unwrap(),
            ListenAddress::Unix("/run/corral/php.sock".into())
        );
        assert!(ListenAddress::parse("127.0.0.1")
            .unwrap_err()
            .contains("no port"));
        assert!(ListenAddress::parse("8080")
            .unwrap_err()
            .contains("no port"));
        assert!(ListenAddress::parse("localhost:8080")
            .unwrap_err()
            .contains("not a host name"));
        assert!(ListenAddress::parse("unix:php.sock")
            .unwrap_err()
            .contains("absolute"));
        let long = format!("unix:/{}", "x".repeat(107));
        assert!(ListenAddress::parse(&long)
            .unwrap_err()
            .contains("at most 107"));
    }

    #[test]
    fn backend_addresses() {
        assert_eq!(
            BackendAddress::parse("App1.internal:9000").unwrap(),
            BackendAddress::Tcp {
                host: "app1.internal".into(),
                port: 9000
            }
        );
        assert_eq!(
            BackendAddress::parse("[::1]:9000").unwrap().to_string(),
            "[::1]:9000"
        );
        assert!(BackendAddress::parse("app1")
            .unwrap_err()
            .contains("no port"));
        assert!(BackendAddress::parse("app1:0")
            .unwrap_err()
            .contains("invalid port"));
        assert!(BackendAddress::parse("10.0.0.1:0")
            .unwrap_err()
            .contains("port 0"));
        assert!(BackendAddress::parse("a_b:9000")
            .unwrap_err()
            .contains("host name"));
        assert!(BackendAddress::parse("::1:9000")
            .unwrap_err()
            .contains("brackets"));
    }

    #[test]
    fn cidrs() {
        let net = Cidr::parse("10.0.0.0/8").unwrap();
        assert!(net.contains("10.1.2.3".parse().unwrap()));
        assert!(net.contains("::ffff:10.1.2.3".parse().unwrap()));
        assert!(!net.contains("11.0.0.1".parse().unwrap()));
        assert!(!net.contains("::1".parse().unwrap()));
        let host = Cidr::parse("127.0.0.1").unwrap();
        assert_eq!(host.to_string(), "127.0.0.1/32");
        assert!(host.contains("127.0.0.1".parse().unwrap()));
        assert!(!host.contains("127.0.0.2".parse().unwrap()));
        let all = Cidr::parse("0.0.0.0/0").unwrap();
        assert!(all.contains("203.0.113.9".parse().unwrap()));
        let v6 = Cidr::parse("fd00::/8").unwrap();
        assert!(v6.contains("fd12::1".parse().unwrap()));
        assert!(Cidr::parse("10.0.0.1/8")
            .unwrap_err()
            .contains("did you mean 10.0.0.0/8"));
        assert!(Cidr::parse("10.0.0.0/33").unwrap_err().contains("0-32"));
        assert!(Cidr::parse("example.com/24")
            .unwrap_err()
            .contains("not an IP network"));
    }
}
