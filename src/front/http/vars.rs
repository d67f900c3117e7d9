//! The CGI variables of an HTTP request: the connection's addresses encoded once at accept,
//! and the per-request variables encoded from the borrowed head.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};

use http::request::Parts;

use crate::backend::RequestBody;
use crate::front::listener::Peer;
use crate::front::sendfile;
use crate::gateway::{Gateway, GatewayError, Routed};
use crate::protocols::cgi::{
    dropped_headers, encode_prepared, CgiParams, CgiRequest, RemoteVars, RequestPath, ServerVars,
};

use super::head::{forwarded_client, forwarded_https};
use super::ConnInfo;

/// The peer's address as CGI variables (REMOTE_ADDR, left out on a Unix listener, and
/// REMOTE_PORT), encoded once per connection: formatting an address costs more than the rest
/// of REMOTE_ADDR's handling. Used unless a trusted proxy names the client. SERVER_ADDR and
/// SERVER_PORT come encoded with the connection ([`ConnInfo::server_vars`]).
pub(super) fn remote_vars(info: &ConnInfo) -> RemoteVars {
    match info.peer {
        Peer::Tcp(a) => with_ip_text(a.ip(), |ip| RemoteVars::new(ip, Some(a.port()))),
        Peer::Unix => RemoteVars::new(b"", None),
    }
}

/// SERVER_ADDR and SERVER_PORT of a listener whose local address is `local` (`None` on a
/// Unix socket), for every connection it accepts.
pub fn server_vars(local: Option<SocketAddr>) -> ServerVars {
    let port = local.map(|a| a.port());
    match local {
        Some(a) => with_ip_text(a.ip(), |ip| ServerVars::new(ip, port)),
        None => ServerVars::new(b"127.0.0.1", port),
    }
}

/// Calls `f` with `ip` as text, written on the stack.
fn with_ip_text<R>(ip: IpAddr, f: impl FnOnce(&[u8]) -> R) -> R {
    // The longest IPv6 text (an IPv4-mapped one in full) is 45 bytes.
    let mut buf = [0u8; 64];
    let n = match ip {
        // By hand: `Display` for an IPv4 address, through the formatting machinery, cost
        // about 1k instructions per connection.
        IpAddr::V4(v4) => ipv4_text(v4, &mut buf),
        IpAddr::V6(_) => {
            use std::io::Write;
            let mut cursor = std::io::Cursor::new(&mut buf[..]);
            match write!(cursor, "{ip}") {
                Ok(()) => cursor.position() as usize,
                Err(_) => return f(ip.to_string().as_bytes()),
            }
        }
    };
    f(buf.get(..n).unwrap_or_default())
}

/// `ip` in dotted decimal at the start of `buf`; the length written.
fn ipv4_text(ip: Ipv4Addr, buf: &mut [u8; 64]) -> usize {
    let mut n = 0;
    for (i, octet) in ip.octets().into_iter().enumerate() {
        if i > 0 {
            buf[n] = b'.';
            n += 1;
        }
        if octet >= 100 {
            buf[n] = b'0' + octet / 100;
            n += 1;
        }
        if octet >= 10 {
            buf[n] = b'0' + octet / 10 % 10;
            n += 1;
        }
        buf[n] = b'0' + octet % 10;
        n += 1;
    }
    n
}

/// The CGI variables of one request for the context it was routed to.
#[allow(clippy::too_many_arguments)]
pub(super) fn cgi_params(
    gateway: &Gateway,
    routed: &Routed,
    info: &ConnInfo,
    remote_vars: &RemoteVars,
    parts: &Parts,
    method: &[u8],
    target: &[u8],
    path: &RequestPath<'_>,
    host: &str,
    body: &RequestBody,
) -> Result<CgiParams, GatewayError> {
    // A client's X-Sendfile-Type and X-Accel-Mapping are the proxy's word, not the
    // client's: corral sends its own (front::sendfile).
    // On the stack for the usual request; more fields than that (up to hyper's 100)
    // in a vector.
    const ON_STACK: usize = 32;
    let mut fields: [(&[u8], &[u8]); ON_STACK] = [(&[], &[]); ON_STACK];
    let many: Vec<(&[u8], &[u8])>;
    let client_fields = parts
        .headers
        .iter()
        .map(|(n, v)| (n.as_str().as_bytes(), v.as_bytes()))
        .filter(|(n, _)| !sendfile::is_proxy_request_header(n));
    let headers: &[(&[u8], &[u8])] = if parts.headers.len() <= ON_STACK {
        let mut count = 0;
        for (slot, field) in fields.iter_mut().zip(client_fields) {
            *slot = field;
            count += 1;
        }
        fields.get(..count).unwrap_or_default()
    } else {
        many = client_fields.collect();
        &many
    };
    // The client is the one a trusted proxy names, else the TCP peer; a Unix peer with no
    // trusted header is a front server whose client is unknown, and REMOTE_ADDR is then left
    // out rather than filled with a loopback placeholder that an app would trust.
    // The connection's own addresses were encoded when it was accepted (`remote_vars`).
    let forwarded = forwarded_client(info, &parts.headers).map(|ip| ip.to_string());
    let (remote_addr, remote) = match &forwarded {
        Some(ip) => (ip.as_str(), None),
        None => ("", Some(remote_vars)),
    };
    let protocol = match parts.version {
        http::Version::HTTP_10 => &b"HTTP/1.0"[..],
        _ => b"HTTP/1.1",
    };
    let req = CgiRequest {
        method,
        target,
        protocol,
        headers,
        body_length: body.len(),
        remote_addr: remote_addr.as_bytes(),
        remote_port: None,
        server_addr: b"",
        server_port: None,
        server_name: host.as_bytes(),
        https: forwarded_https(info, &parts.headers),
    };
    let mut vars = encode_prepared(
        &req,
        path,
        &routed.context.cgi,
        remote,
        Some(&*info.server_vars),
        &gateway.limits,
    )?;
    if tracing::enabled!(tracing::Level::DEBUG) {
        for d in dropped_headers(headers) {
            tracing::debug!(header = %crate::logs::escaped(&d.name), reason = ?d.reason, "left a header out of the CGI variables");
        }
    }
    for (name, value) in sendfile::backend_vars(&routed.context.config) {
        vars.push(&name, &value)?;
    }
    Ok(vars)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_ipv4_address_is_written_as_display_writes_it() {
        let octets = [0u8, 1, 9, 10, 42, 99, 100, 109, 110, 199, 200, 250, 255];
        for &a in &octets {
            for &b in &octets {
                let ip = Ipv4Addr::new(a, b, 255 - b, 100 - a % 100);
                let got = with_ip_text(IpAddr::V4(ip), |t| t.to_vec());
                assert_eq!(got, ip.to_string().as_bytes(), "{ip}");
            }
        }
        let v6: IpAddr = "2001:db8::7".parse().unwrap();
        assert_eq!(with_ip_text(v6, |t| t.to_vec()), b"2001:db8::7");
    }
}
