//! Binding the front listeners before serving (inherited sockets from socket activation
//! first), and the connection cap they all count in.

use std::sync::Arc;

use crate::config::{Config, ListenerConfig};
use crate::front::limits::{self, Admission};
use crate::front::listener::Listener;

use super::reuse_port;

/// A bound front listener with its configuration.
#[derive(Debug)]
pub struct BoundListener {
    /// The socket.
    pub listener: Listener,
    /// As configured.
    pub config: ListenerConfig,
}

/// Binds every configured front listener. The runtime directory, where front sockets
/// often live (as php-fpm's live in /run/php), must be prepared first
/// ([`crate::runtime_dir::prepare`]).
pub fn bind_all(
    config: &Config,
    inherited: Vec<crate::systemd::Inherited>,
) -> std::io::Result<Vec<BoundListener>> {
    // Socket activation: an inherited socket serves the [[listen]] block with its address.
    let mut inherited: Vec<_> = inherited
        .into_iter()
        .filter_map(|s| match s.address() {
            Ok(addr) => Some((addr, s)),
            Err(e) => {
                tracing::warn!(error = %e, "an inherited socket has no address to match; left alone");
                None
            }
        })
        .collect();
    let listeners: std::io::Result<Vec<BoundListener>> = config
        .listeners
        .iter()
        .map(|l| {
            let address = l.bind.address();
            if let Some(i) = inherited.iter().position(|(a, _)| *a == address) {
                let (_, socket) = inherited.swap_remove(i);
                tracing::info!(listener = %address, "using the socket handed over by socket activation");
                return Listener::inherited(socket, &l.bind).map(|listener| BoundListener {
                    listener,
                    config: l.clone(),
                });
            }
            Listener::bind_with(&l.bind, l.backlog, reuse_port(config))
                .map(|listener| BoundListener {
                    listener,
                    config: l.clone(),
                })
                .map_err(|e| {
                    std::io::Error::new(
                        e.kind(),
                        format!("cannot listen on {}: {e}", l.bind.address()),
                    )
                })
        })
        .collect();
    for (addr, _) in &inherited {
        tracing::warn!(address = %addr, "an inherited socket matches no [[listen]] block; closing it");
    }
    listeners
}

/// The table every front listener counts its connections in, with `max_connections` or the
/// cap derived from the file limit.
pub(super) fn front_admission(config: &Config) -> Arc<Admission> {
    let nofile = crate::process::rlimit::nofile_soft();
    let derived = limits::derived_max_connections(config, nofile);
    let max = match config.server.max_connections {
        Some(n) => {
            let n = n as usize;
            if n > derived {
                tracing::warn!(
                    max_connections = n,
                    room = derived,
                    ?nofile,
                    "max_connections is more than the file-descriptor limit leaves room for; \
                     accepts may fail with EMFILE before the cap is reached"
                );
            }
            n
        }
        None => derived,
    };
    tracing::info!(max_connections = max, ?nofile, "front connection cap");
    Admission::new("front", max)
}
