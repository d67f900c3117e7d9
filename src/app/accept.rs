//! The accept loop of a front listener: admission by the connection caps, then a task per
//! HTTP connection, or a task of the listener's crew for a CGI front's (`crew`).

pub(super) mod crew;

use std::sync::Arc;

use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::config::{FrontProtocol, ListenerConfig};
use crate::front::http::{self, ConnInfo};
use crate::front::limits::{Admission, Client};
use crate::front::listener::{Listener, Peer};
use crate::gateway::Gateway;
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
    // The listener's SERVER_ADDR and SERVER_PORT, encoded once for all its connections.
    let server_vars = Arc::new(http::server_vars(local));
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
        let info = ConnInfo {
            listener: address.clone(),
            local,
            peer,
            forwarded: config.forwarded.clone(),
            timeouts: config.timeouts,
            server_vars: Arc::clone(&server_vars),
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
