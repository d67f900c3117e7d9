//! DNS names in `servers = [...]`, followed while corral runs: every address a name resolves
//! to is a server of the pool, resolved again every `resolve_every` (a Kubernetes headless
//! Service, Consul DNS). A server whose address vanished is drained: it takes no new request,
//! those in flight finish (the slot table's `remove_worker`); a new address is added at once.
//! A lookup that fails, or finds nothing, is logged and the last good set kept.
//!
//! Names go through the system resolver (tokio's `lookup_host`, getaddrinfo on the blocking
//! pool), so `/etc/hosts`, `nsswitch.conf` and the search domains apply as for any program.
//! Until a name's first lookup has answered, the name itself is the server (each connection
//! then resolves it, as a name did before it was followed). While the pool's `max_conns` is
//! its default (servers × concurrency), it grows and shrinks with the addresses found.
//!
//! One task per such pool, holding the pool only weakly: it ends once the pool is gone (a
//! reload that replaced it has drained it). ARCHITECTURE.md, "Pools of servers".

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use crate::config::BackendAddress;
use crate::pool::slots::{SlotTable, WorkerId};

use super::Connections;

/// Longest wait for one lookup: a resolver that hangs costs one period's update, not the task.
const LOOKUP_TIMEOUT: Duration = Duration::from_secs(5);

/// One `servers` entry that is a DNS name, and the servers it stands for now.
#[derive(Debug)]
struct Name {
    host: String,
    port: u16,
    /// The servers of the last good answer (at first, the name itself).
    servers: Vec<(BackendAddress, WorkerId)>,
    /// Whether the last lookup failed (its recovery is logged once).
    failing: bool,
    /// Servers taken out, until their last request is done: a connection a request in
    /// flight gives back to the idle stack afterwards is forgotten at the next round.
    draining: Vec<(BackendAddress, WorkerId)>,
}

/// The names of one pool of servers, and what they resolved to.
#[derive(Debug)]
pub struct ServerNames {
    names: Mutex<Vec<Name>>,
    every: Duration,
    concurrency: usize,
    /// Servers that are IP addresses or Unix sockets, which never change.
    fixed: usize,
    /// Whether `max_conns` follows the number of servers (it is the default).
    scale_max_conns: bool,
    started: AtomicBool,
}

/// What one pool's resolver works on.
pub trait Followed: Send + Sync + 'static {
    /// The pool's name, for logs.
    fn name(&self) -> &str;
    /// Its slot table.
    fn slots(&self) -> &Arc<SlotTable>;
    /// Its idle connections.
    fn connections(&self) -> &Connections;
    /// Its names, when `servers` has any.
    fn names(&self) -> Option<&ServerNames>;
}

impl ServerNames {
    /// The names among `servers` (whose entries were added to the slot table as `ids`, in
    /// order); `None` when there is none, so nothing is followed.
    pub fn of(
        servers: &[BackendAddress],
        ids: &[WorkerId],
        every: Duration,
        concurrency: usize,
        max_conns: usize,
    ) -> Option<ServerNames> {
        let names: Vec<Name> = servers
            .iter()
            .zip(ids)
            .filter_map(|(address, id)| match address {
                BackendAddress::Tcp { host, port } if host.parse::<std::net::IpAddr>().is_err() => {
                    Some(Name {
                        host: host.clone(),
                        port: *port,
                        servers: vec![(address.clone(), *id)],
                        failing: false,
                        draining: Vec::new(),
                    })
                }
                _ => None,
            })
            .collect();
        if names.is_empty() {
            return None;
        }
        Some(ServerNames {
            fixed: servers.len() - names.len(),
            names: Mutex::new(names),
            every,
            concurrency,
            scale_max_conns: max_conns == servers.len().saturating_mul(concurrency),
            started: AtomicBool::new(false),
        })
    }
}

/// Starts following `pool`'s names, once (later calls, for a pool a reload carried over, do
/// nothing); a pool without names has nothing to follow.
pub fn follow<P: Followed>(pool: &Arc<P>) {
    let Some(names) = pool.names() else { return };
    if names.started.swap(true, Ordering::AcqRel) {
        return;
    }
    let weak: Weak<P> = Arc::downgrade(pool);
    let every = names.every;
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            let Some(pool) = weak.upgrade() else { return };
            resolve_all(&*pool).await;
        }
    });
}

/// One round: every name looked up, and the slot table brought in line with the answers.
async fn resolve_all<P: Followed>(pool: &P) {
    let Some(names) = pool.names() else { return };
    let wanted: Vec<(String, u16)> = lock(names)
        .iter()
        .map(|n| (n.host.clone(), n.port))
        .collect();
    let mut answers = Vec::with_capacity(wanted.len());
    for (host, port) in &wanted {
        answers.push(lookup(host, *port).await);
    }
    let mut list = lock(names);
    for name in list.iter_mut() {
        forget_drained(pool, name);
    }
    for (name, answer) in list.iter_mut().zip(answers) {
        match answer {
            Ok(found) => {
                if name.failing {
                    tracing::info!(pool = pool.name(), name = %name.host, addresses = found.len(), "server name resolves again");
                    name.failing = false;
                }
                update(pool, names.concurrency, name, &found);
            }
            Err(reason) => {
                let level_warn = !name.failing;
                name.failing = true;
                let kept = name.servers.len();
                if level_warn {
                    tracing::warn!(pool = pool.name(), name = %name.host, error = %reason, "cannot resolve a server name; keeping its last {kept} server(s)");
                } else {
                    tracing::debug!(pool = pool.name(), name = %name.host, error = %reason, "server name still does not resolve");
                }
            }
        }
    }
    if names.scale_max_conns {
        let servers = names.fixed + list.iter().map(|n| n.servers.len()).sum::<usize>();
        pool.slots()
            .set_max_conns(servers.max(1).saturating_mul(names.concurrency));
    }
}

/// The addresses `host:port` resolves to, each once, in the resolver's order; an empty
/// answer is an error (the last good set is kept rather than emptied).
async fn lookup(host: &str, port: u16) -> Result<Vec<SocketAddr>, String> {
    let found = tokio::time::timeout(LOOKUP_TIMEOUT, tokio::net::lookup_host((host, port)))
        .await
        .map_err(|_| format!("no answer within {LOOKUP_TIMEOUT:?}"))?
        .map_err(|e| e.to_string())?;
    let mut unique: Vec<SocketAddr> = Vec::new();
    for a in found {
        if !unique.contains(&a) {
            unique.push(a);
        }
    }
    if unique.is_empty() {
        return Err("the name has no address".to_owned());
    }
    Ok(unique)
}

/// Makes `name`'s servers the addresses `found`: new ones added (taking requests at once),
/// vanished ones drained.
fn update<P: Followed>(pool: &P, concurrency: usize, name: &mut Name, found: &[SocketAddr]) {
    let found: Vec<BackendAddress> = found
        .iter()
        .map(|a| BackendAddress::Tcp {
            host: a.ip().to_string(),
            port: a.port(),
        })
        .collect();
    let slots = pool.slots();
    for address in &found {
        if name.servers.iter().any(|(a, _)| a == address) {
            continue;
        }
        let id = slots.add_worker(concurrency, address.clone(), None);
        slots.set_accepting(id, true);
        tracing::info!(pool = pool.name(), name = %name.host, server = %address, "server added: the name resolves to it");
        name.servers.push((address.clone(), id));
    }
    name.servers.retain(|(address, id)| {
        if found.contains(address) {
            return true;
        }
        slots.remove_worker(*id);
        pool.connections().forget(address);
        tracing::info!(pool = pool.name(), name = %name.host, server = %address, "server removed (draining): the name no longer resolves to it");
        name.draining.push((address.clone(), *id));
        false
    });
}

/// Forgets the idle connections of `name`'s drained servers (unless the address is a server
/// again), and stops watching those whose last request is done.
fn forget_drained<P: Followed>(pool: &P, name: &mut Name) {
    let Name {
        servers, draining, ..
    } = name;
    draining.retain(|(address, id)| {
        let done = pool.slots().worker_in_flight(*id) == 0;
        if !servers.iter().any(|(a, _)| a == address) {
            pool.connections().forget(address);
        }
        !done
    });
}

fn lock(names: &ServerNames) -> std::sync::MutexGuard<'_, Vec<Name>> {
    names.names.lock().unwrap_or_else(|p| p.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pool::slots::SlotLimits;

    struct TestPool {
        slots: Arc<SlotTable>,
        connections: Connections,
        names: Option<ServerNames>,
    }

    impl Followed for TestPool {
        fn name(&self) -> &str {
            "t"
        }
        fn slots(&self) -> &Arc<SlotTable> {
            &self.slots
        }
        fn connections(&self) -> &Connections {
            &self.connections
        }
        fn names(&self) -> Option<&ServerNames> {
            self.names.as_ref()
        }
    }

    fn pool(servers: &[&str]) -> TestPool {
        let slots = SlotTable::new(
            SlotLimits {
                max_conns: servers.len(),
                queue_size: 0,
                queue_timeout: Duration::from_secs(1),
            },
            &[None],
        );
        let servers: Vec<BackendAddress> = servers
            .iter()
            .map(|s| BackendAddress::parse(s).unwrap())
            .collect();
        let ids: Vec<WorkerId> = servers
            .iter()
            .map(|s| {
                let id = slots.add_worker(1, s.clone(), None);
                slots.set_accepting(id, true);
                id
            })
            .collect();
        let names = ServerNames::of(&servers, &ids, Duration::from_secs(5), 1, servers.len());
        TestPool {
            slots,
            connections: Connections::new(1),
            names,
        }
    }

    fn addresses(p: &TestPool) -> Vec<String> {
        let mut a: Vec<String> = p
            .slots
            .workers()
            .iter()
            .filter(|w| w.accepting)
            .map(|w| w.address.to_string())
            .collect();
        a.sort();
        a
    }

    fn sock(s: &str) -> SocketAddr {
        s.parse().unwrap()
    }

    #[test]
    fn only_names_are_followed() {
        assert!(pool(&["127.0.0.1:9000", "unix:/run/a.sock"])
            .names
            .is_none());
        let p = pool(&["127.0.0.1:9000", "app.internal:9000"]);
        let names = p.names.as_ref().unwrap();
        assert_eq!(names.fixed, 1);
        assert_eq!(lock(names).len(), 1);
    }

    #[test]
    fn a_name_becomes_its_addresses_and_vanished_ones_are_drained() {
        let p = pool(&["127.0.0.1:9000", "app.internal:9000"]);
        let names = p.names.as_ref().unwrap();
        let mut list = lock(names);
        let name = list.first_mut().unwrap();
        update(&p, 1, name, &[sock("10.0.0.2:9000"), sock("10.0.0.3:9000")]);
        assert_eq!(
            addresses(&p),
            ["10.0.0.2:9000", "10.0.0.3:9000", "127.0.0.1:9000"]
        );
        update(&p, 1, name, &[sock("10.0.0.3:9000"), sock("10.0.0.4:9000")]);
        assert_eq!(
            addresses(&p),
            ["10.0.0.3:9000", "10.0.0.4:9000", "127.0.0.1:9000"]
        );
        // The same answer again changes nothing.
        let before = p.slots.workers().len();
        update(&p, 1, name, &[sock("10.0.0.3:9000"), sock("10.0.0.4:9000")]);
        assert_eq!(p.slots.workers().len(), before);
        // The drained servers had nothing in flight: the next round stops watching them.
        assert_eq!(name.draining.len(), 2);
        forget_drained(&p, name);
        assert!(name.draining.is_empty());
    }

    #[tokio::test]
    async fn a_name_that_does_not_resolve_keeps_its_last_servers() {
        let p = pool(&["name-that-does-not-exist.invalid:9000"]);
        resolve_all(&p).await;
        assert_eq!(addresses(&p), ["name-that-does-not-exist.invalid:9000"]);
        assert!(lock(p.names.as_ref().unwrap())
            .first()
            .is_some_and(|n| n.failing));
    }

    #[tokio::test]
    async fn localhost_resolves_through_the_system_resolver() {
        let p = pool(&["localhost:9000"]);
        resolve_all(&p).await;
        let found = addresses(&p);
        assert!(
            found
                .iter()
                .any(|a| a == "127.0.0.1:9000" || a == "[::1]:9000"),
            "{found:?}"
        );
        assert!(
            !found.iter().any(|a| a.starts_with("localhost")),
            "{found:?}"
        );
    }
}
