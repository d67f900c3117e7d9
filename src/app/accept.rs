//! The accept loop of a front listener: admission by the connection caps, then a task per
//! HTTP connection, or a task of the listener's crew for a CGI front's (`crew`).

pub(super) mod crew;

use std::net::SocketAddr;
use std::sync::Arc;

use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::config::{FrontProtocol, ListenerConfig};
use crate::front::http::{self, ConnInfo};
use crate::front::limits::{Admission, Client};
use crate::front::listener::{Listener, Peer};
use crate::gateway::Gateway;
use crate::net::Stream;
use crate::protocols::cgi::ServerVars;
use crew::{Crew, Front};

/// Accepts on `listener` until `shutdown`, serving each client in a task of the runtime it
/// runs in. `announce`: log the "listening" line (once per listener, whatever the number of
/// serving threads accepting on it).
#[allow(clippy::too_many_arguments)]
pub(super) async fn accept_loop(
    listener: Arc<Listener>,
    config: ListenerConfig,
    index: usize,
    admission: Arc<Admission>,
    gateway: Arc<Gateway>,
    connections: TaskTracker,
    shutdown: CancellationToken,
    announce: bool,
) {
    let address = config.bind.address();
    let local = match &*listener {
        Listener::Tcp { listener, .. } => listener.local_addr().ok(),
        Listener::Unix { .. } => None,
    };
    // The bound address (with the real port when the configuration said 0) is what a test
    // or an operator needs to connect.
    // Shared by the CGI fronts' connections: a Unix socket's path, cloned for each, would be
    // an allocation per connection.
    let shared_address = Arc::new(address.clone());
    let bound_address = listener
        .local_address()
        .map_or_else(|_| address.to_string(), |a| a.to_string());
    if announce {
        tracing::info!(listener = %bound_address, protocol = ?config.protocol, "listening");
    }
    // The CGI fronts' connections are served by long-lived tasks, handed one connection
    // after another; dropped when this loop ends, which ends the idle ones.
    let crew = |front| {
        Crew::new(
            front,
            Arc::clone(&shared_address),
            config.timeouts,
            Arc::clone(&gateway),
            shutdown.clone(),
            connections.clone(),
        )
    };
    let crew = match config.protocol {
        FrontProtocol::Http => None,
        FrontProtocol::Fastcgi => Some(crew(Front::Fastcgi)),
        FrontProtocol::Scgi => Some(crew(Front::Scgi)),
    };
    // SERVER_ADDR and SERVER_PORT: the listener's, encoded once for all its connections. On
    // a listener bound to a wildcard address (0.0.0.0, ::) they are each connection's own
    // local address, the one its client reached (getsockname, as nginx's `$server_addr`),
    // encoded once per address seen.
    let server_vars = Arc::new(http::server_vars(local));
    let wildcard = local.is_some_and(|a| a.ip().is_unspecified());
    let mut reached = Vec::new();
    // Made once: a wait made at every turn would join the token's waiters and leave them
    // again for each connection.
    let stopping = shutdown.cancelled();
    tokio::pin!(stopping);
    // A floor under the first deadline of every HTTP connection. Each connection's watch
    // arms a timer `header_timeout` after its accept. tokio's time driver, told of a timer
    // earlier than the one its thread will next wake for, writes to its eventfd to wake
    // itself, even from that thread while it runs: a system call for every connection
    // when nothing earlier is armed, as for a client that connects per request (strace: a
    // `write` per request). This timer of the loop's own, armed at or before the accept of
    // every connection since, is never later than their first deadlines, so theirs are
    // never the earliest. Re-armed when it fires only if connections came meanwhile: a
    // listener nobody uses arms nothing.
    let floor_period = config.timeouts.header;
    let floor = tokio::time::sleep(floor_period);
    tokio::pin!(floor);
    let mut floor_armed = false;
    let mut accepted_since_floor = false;
    let http = matches!(config.protocol, FrontProtocol::Http);
    loop {
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            () = &mut floor, if floor_armed => {
                floor_armed = std::mem::take(&mut accepted_since_floor);
                if floor_armed {
                    floor.as_mut().reset(tokio::time::Instant::now() + floor_period);
                }
                continue;
            }
            () = &mut stopping => return,
        };
        if http {
            accepted_since_floor = true;
            if !floor_armed {
                floor
                    .as_mut()
                    .reset(tokio::time::Instant::now() + floor_period);
                floor_armed = true;
            }
        }
        let (stream, peer) = match accepted {
            Ok(Some(client)) => client,
            Ok(None) => continue,
            Err(e) => {
                // EMFILE and friends: say so, pause briefly rather than spin, go on.
                tracing::warn!(listener = %address, error = %e, "accept failed");
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                continue;
            }
        };
        let client = Client {
            listener: index,
            addr: match peer {
                Peer::Tcp(a) => Some(a.ip()),
                Peer::Unix => None,
            },
            cap: config.max_connections_per_client,
        };
        // Beyond a cap with every connection busy: dropping the stream closes it at once
        // (the table logs that, rate-limited).
        let Some(ticket) = admission.admit(client) else {
            continue;
        };
        if let Some(crew) = &crew {
            crew.serve(stream, ticket);
            continue;
        }
        // An HTTP connection's future is boxed before it is spawned: a task moves its future
        // whole into its cell and its output over it, kilobytes each time, a box once.
        let server_vars = match &stream {
            Stream::Tcp(s) if wildcard => s.local_addr().map_or_else(
                |_| Arc::clone(&server_vars),
                |at| reached_vars(&mut reached, at),
            ),
            _ => Arc::clone(&server_vars),
        };
        let info = ConnInfo {
            listener: address.clone(),
            peer,
            forwarded: config.forwarded.clone(),
            timeouts: config.timeouts,
            server_vars,
        };
        connections.spawn(Box::pin(http::serve_connection(
            stream,
            info,
            ticket,
            Arc::clone(&gateway),
            shutdown.clone(),
        )));
    }
}

/// Local addresses a wildcard listener's clients reached, with their SERVER_ADDR and
/// SERVER_PORT; a host has few, and at most this many are kept.
const REACHED_KEPT: usize = 16;

/// SERVER_ADDR and SERVER_PORT for a connection whose local address is `at`: from `known`, or
/// encoded and kept there. An IPv4 address reached on a dual-stack socket (`::ffff:a.b.c.d`)
/// is written as IPv4, as the client used it.
fn reached_vars(known: &mut Vec<(SocketAddr, Arc<ServerVars>)>, at: SocketAddr) -> Arc<ServerVars> {
    let at = SocketAddr::new(at.ip().to_canonical(), at.port());
    if let Some((_, vars)) = known.iter().find(|(a, _)| *a == at) {
        return Arc::clone(vars);
    }
    let vars = Arc::new(http::server_vars(Some(at)));
    if known.len() < REACHED_KEPT {
        known.push((at, Arc::clone(&vars)));
    }
    vars
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reached_address_is_encoded_once_and_an_ipv4_mapped_one_as_ipv4() {
        let mut known = Vec::new();
        let at: SocketAddr = "[::ffff:10.0.0.7]:8080".parse().unwrap();
        let first = reached_vars(&mut known, at);
        assert_eq!(
            *first,
            http::server_vars(Some("10.0.0.7:8080".parse().unwrap()))
        );
        let again = reached_vars(&mut known, "10.0.0.7:8080".parse().unwrap());
        assert!(Arc::ptr_eq(&first, &again), "encoded once");
        // Kept up to REACHED_KEPT addresses; past that, encoded per connection.
        for i in 0..40u8 {
            let v = reached_vars(&mut known, SocketAddr::from(([10, 1, 0, i], 80)));
            assert_eq!(
                *v,
                http::server_vars(Some(SocketAddr::from(([10, 1, 0, i], 80))))
            );
        }
        assert_eq!(known.len(), REACHED_KEPT);
    }
}
