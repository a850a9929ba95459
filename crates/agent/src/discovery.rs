//! Where the proxy servers are. Upstream's agent dials one address, normally a load
//! balancer, until chance has landed a stream on every server. With discovery the agent
//! learns each server's own address and holds one stream to each, whatever a balancer in
//! front would do.

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::time::Duration;

use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::server_count::ServerLeases;

/// How long one lookup of the servers' name may take before it counts as failed.
const LOOKUP_TIMEOUT: Duration = Duration::from_secs(5);

/// `--server-discovery` and `--proxy-server-addresses`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Discovery {
    /// Dial `--proxy-server-host` until as many servers are held as are counted (upstream's
    /// way).
    Balancer,
    /// Every A and AAAA record of `name` (`--server-discovery-name`, by default
    /// `--proxy-server-host`; a headless Service), looked up again every `interval`.
    Dns { name: String, interval: Duration },
    /// These addresses, as given.
    List(BTreeSet<SocketAddr>),
    /// The agent addresses the servers' valid Leases publish (`--count-server-leases`
    /// lists them; servers publish with `--lease-agent-address`).
    Leases,
}

/// The servers' addresses as last found, sorted and without duplicates.
pub(crate) type Endpoints = BTreeSet<SocketAddr>;

/// Keeps a watch of the servers' addresses current until `stop`: a list once, a name at
/// every interval, Leases at every listing (`leases`). A failed or empty lookup keeps the
/// addresses found before, so that a resolver's blip lets go of no server; only an answer
/// that leaves an address out does.
pub(crate) async fn keep_current(
    discovery: Discovery,
    port: u16,
    leases: Option<watch::Receiver<Option<ServerLeases>>>,
    found: watch::Sender<Endpoints>,
    stop: CancellationToken,
) {
    let (host, interval) = match discovery {
        Discovery::Balancer => return,
        Discovery::List(addresses) => {
            found.send_replace(addresses);
            return;
        }
        Discovery::Leases => {
            if let Some(leases) = leases {
                follow_leases(leases, found, stop).await;
            }
            return;
        }
        Discovery::Dns { name, interval } => (name, interval),
    };
    let mut failing = false;
    loop {
        match lookup(&host, port).await {
            Ok(addresses) => {
                if failing {
                    tracing::info!(
                        host,
                        servers = addresses.len(),
                        "looking up the proxy servers works again"
                    );
                    failing = false;
                }
                publish(&found, &addresses);
            }
            Err(why) if !failing => {
                failing = true;
                tracing::warn!(
                    host,
                    error = %why,
                    "cannot look up the proxy servers (--server-discovery-name, or --proxy-server-host, with --server-discovery=dns); keeping the addresses found before"
                );
            }
            Err(_) => {}
        }
        tokio::select! {
            () = stop.cancelled() => return,
            () = tokio::time::sleep(interval) => {}
        }
    }
}

/// Publishes the addresses of every Lease listing until `stop`. A listing that names no
/// address keeps the addresses before it, as a failed lookup does.
async fn follow_leases(
    mut leases: watch::Receiver<Option<ServerLeases>>,
    found: watch::Sender<Endpoints>,
    stop: CancellationToken,
) {
    let mut unpublished = BTreeMap::new();
    loop {
        if let Some(listed) = leases.borrow_and_update().clone() {
            if listed.without_address != unpublished {
                unpublished = listed.without_address.clone();
                if !unpublished.is_empty() {
                    let servers: Vec<String> = unpublished
                        .iter()
                        .map(|(server, annotation)| match annotation {
                            None => format!("{server} (no agent-address annotation)"),
                            Some(text) => format!("{server} (unreadable agent address {text:?})"),
                        })
                        .collect();
                    tracing::warn!(
                        ?servers,
                        "valid server Leases without an agent address (upstream servers, or tether servers without --lease-agent-address): --server-discovery=leases cannot reach them"
                    );
                }
            }
            if !listed.addresses.is_empty() {
                publish(&found, &listed.addresses);
            }
        }
        tokio::select! {
            () = stop.cancelled() => return,
            changed = leases.changed() => {
                if changed.is_err() {
                    return;
                }
            }
        }
    }
}

/// Replaces the published addresses when `addresses` differ, waking the agent's sync loop.
fn publish(found: &watch::Sender<Endpoints>, addresses: &Endpoints) {
    found.send_if_modified(|current| {
        let changed = current != addresses;
        if changed {
            tracing::info!(servers = ?addresses, "proxy server addresses changed");
            current.clone_from(addresses);
        }
        changed
    });
}

/// Every address `host` resolves to, on `port`.
async fn lookup(host: &str, port: u16) -> Result<Endpoints, String> {
    let resolved = tokio::time::timeout(LOOKUP_TIMEOUT, tokio::net::lookup_host((host, port)))
        .await
        .map_err(|_| format!("no answer within {LOOKUP_TIMEOUT:?}"))?
        .map_err(|e| e.to_string())?;
    let addresses: Endpoints = resolved.collect();
    if addresses.is_empty() {
        return Err("the name has no address".to_owned());
    }
    Ok(addresses)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_list_is_published_once_and_a_literal_address_resolves_to_itself() {
        let (found, current) = watch::channel(Endpoints::new());
        let list: Endpoints = ["127.0.0.2:8091".parse().unwrap()].into();
        keep_current(
            Discovery::List(list.clone()),
            0,
            None,
            found,
            CancellationToken::new(),
        )
        .await;
        assert_eq!(*current.borrow(), list);
        assert_eq!(
            lookup("127.0.0.3", 8091).await.unwrap(),
            ["127.0.0.3:8091".parse().unwrap()].into()
        );
    }

    #[tokio::test]
    async fn a_failed_lookup_keeps_what_was_found() {
        let before: Endpoints = ["127.0.0.2:8091".parse().unwrap()].into();
        let (found, current) = watch::channel(before.clone());
        let stop = CancellationToken::new();
        let task = tokio::spawn(keep_current(
            Discovery::Dns {
                // A NUL byte: refused before the system resolver is asked, so no query leaves.
                name: "tether\0servers".to_owned(),
                interval: Duration::from_millis(10),
            },
            8091,
            None,
            found,
            stop.clone(),
        ));
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert_eq!(*current.borrow(), before);
        stop.cancel();
        task.await.unwrap();
    }
}
