//! The addresses of a Node object, which prove a token agent's `ipv4=`/`ipv6=` identifiers
//! (`--agent-identity-binding`): a token bound to a pod names the pod's node, and the
//! node's `status.addresses` are the addresses that node's agent may claim.
//!
//! Each lookup is one `GET /api/v1/nodes/NAME` within the client's shared rate limit
//! (`--kubeconfig-qps`/`--kubeconfig-burst`) and a deadline; answers are kept for a minute
//! in a bounded cache, so an agent reconnecting (or opening a stream to each server of its
//! fleet through the same server) costs no request. Node addresses rarely change; one that
//! did is seen within the minute.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Mutex;
use std::time::Duration;
use tokio::time::Instant;

use k8s_openapi::api::core::v1::Node;
use kube::api::Api;
use tether_server::{NodeAddresses, NodeFuture, NodeLookupError};

use crate::KubeApi;

/// How long a Node's addresses are used without reading the Node again.
const TTL: Duration = Duration::from_secs(60);
/// Most Nodes remembered: above the largest clusters' node counts (GKE: 15,000).
const MAX_ENTRIES: usize = 20_000;
/// Longest a lookup may take, waiting for the rate limit included.
const LOOKUP_TIMEOUT: Duration = Duration::from_secs(10);

/// Reads Nodes' addresses from the Kubernetes API, with a small TTL cache.
#[derive(Debug)]
pub struct NodeAddressLookup {
    api: KubeApi,
    cache: Mutex<Cache>,
}

#[derive(Debug)]
struct Cache {
    entries: HashMap<String, Entry>,
    max_entries: usize,
}

#[derive(Debug)]
struct Entry {
    addresses: Vec<IpAddr>,
    until: Instant,
}

impl NodeAddressLookup {
    pub fn new(api: KubeApi) -> Self {
        Self {
            api,
            cache: Mutex::new(Cache::new(MAX_ENTRIES)),
        }
    }

    fn cache(&self) -> std::sync::MutexGuard<'_, Cache> {
        self.cache.lock().unwrap_or_else(|e| e.into_inner())
    }

    async fn lookup(&self, node: &str) -> Result<Vec<IpAddr>, NodeLookupError> {
        if let Some(addresses) = self.cache().get(node, Instant::now()) {
            return Ok(addresses);
        }
        let started = tokio::time::Instant::now();
        if self.api.throttle(LOOKUP_TIMEOUT).await.is_err() {
            return Err(NodeLookupError::Unavailable(format!(
                "too many requests to the Kubernetes API: the Node could not be read within \
                 {LOOKUP_TIMEOUT:?} (--kubeconfig-qps/--kubeconfig-burst)"
            )));
        }
        let nodes: Api<Node> = Api::all(self.api.client().clone());
        let remaining = LOOKUP_TIMEOUT.saturating_sub(started.elapsed());
        let node_object = match tokio::time::timeout(remaining, nodes.get(node)).await {
            Ok(Ok(object)) => object,
            Ok(Err(e)) => return Err(describe(&self.api, &e)),
            Err(_) => {
                return Err(NodeLookupError::Unavailable(format!(
                    "reading the Node got no answer within {LOOKUP_TIMEOUT:?}"
                )));
            }
        };
        let addresses = addresses_of(&node_object);
        self.cache()
            .insert(node, addresses.clone(), Instant::now() + TTL);
        Ok(addresses)
    }
}

impl NodeAddresses for NodeAddressLookup {
    fn addresses<'a>(&'a self, node: &'a str) -> NodeFuture<'a> {
        Box::pin(self.lookup(node))
    }
}

/// Every IP address among the Node's `status.addresses` (InternalIP and ExternalIP; the
/// Hostname and DNS entries are names, not addresses).
fn addresses_of(node: &Node) -> Vec<IpAddr> {
    let listed = node.status.as_ref().and_then(|s| s.addresses.as_ref());
    listed
        .into_iter()
        .flatten()
        .filter(|a| a.type_ == "InternalIP" || a.type_ == "ExternalIP")
        .filter_map(|a| a.address.parse().ok())
        .collect()
}

/// Why a Node could not be read, with what to grant where that is the fix.
fn describe(api: &KubeApi, e: &kube::Error) -> NodeLookupError {
    match e {
        kube::Error::Api(status) if status.code == 404 => NodeLookupError::NotFound,
        kube::Error::Api(status) if status.code == 401 || status.code == 403 => {
            NodeLookupError::Unavailable(format!(
                "the API server refused to let this server read the Node (HTTP {}: {}); grant \
                 the server's user `get` on nodes (a ClusterRole rule: apiGroups [\"\"], \
                 resources [nodes], verbs [get])",
                status.code, status.message
            ))
        }
        kube::Error::Api(status) => NodeLookupError::Unavailable(format!(
            "the API server failed to read the Node (HTTP {}: {})",
            status.code, status.message
        )),
        other => NodeLookupError::Unavailable(crate::unreachable::describe(
            api,
            "reading the Node",
            other,
        )),
    }
}

impl Cache {
    fn new(max_entries: usize) -> Self {
        Self {
            entries: HashMap::new(),
            max_entries,
        }
    }

    fn get(&self, node: &str, now: Instant) -> Option<Vec<IpAddr>> {
        self.entries
            .get(node)
            .filter(|e| e.until > now)
            .map(|e| e.addresses.clone())
    }

    /// Keeps `addresses` until `until`; when full, the expired entries go, then the one
    /// closest to expiry.
    fn insert(&mut self, node: &str, addresses: Vec<IpAddr>, until: Instant) {
        if !self.entries.contains_key(node) && self.entries.len() >= self.max_entries {
            let now = Instant::now();
            self.entries.retain(|_, e| e.until > now);
            if self.entries.len() >= self.max_entries
                && let Some(oldest) = self
                    .entries
                    .iter()
                    .min_by_key(|(_, e)| e.until)
                    .map(|(name, _)| name.clone())
            {
                self.entries.remove(&oldest);
            }
        }
        self.entries
            .insert(node.to_owned(), Entry { addresses, until });
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::{NodeAddress, NodeStatus};

    use super::*;

    #[test]
    fn only_ip_addresses_count() {
        let address = |type_: &str, address: &str| NodeAddress {
            type_: type_.into(),
            address: address.into(),
        };
        let node = Node {
            status: Some(NodeStatus {
                addresses: Some(vec![
                    address("InternalIP", "10.0.0.1"),
                    address("InternalIP", "fd00::1"),
                    address("ExternalIP", "203.0.113.7"),
                    address("Hostname", "node-1"),
                    address("InternalDNS", "10.0.0.9"),
                ]),
                ..Default::default()
            }),
            ..Default::default()
        };
        let want: Vec<IpAddr> = ["10.0.0.1", "fd00::1", "203.0.113.7"]
            .iter()
            .map(|a| a.parse().unwrap())
            .collect();
        assert_eq!(addresses_of(&node), want);
        assert!(addresses_of(&Node::default()).is_empty());
    }

    #[test]
    fn the_cache_expires_and_stays_bounded() {
        let mut cache = Cache::new(2);
        let now = Instant::now();
        let ip: Vec<IpAddr> = vec!["10.0.0.1".parse().unwrap()];
        cache.insert("a", ip.clone(), now + Duration::from_secs(10));
        cache.insert("b", ip.clone(), now + Duration::from_secs(20));
        assert_eq!(cache.get("a", now), Some(ip.clone()));
        assert_eq!(cache.get("a", now + Duration::from_secs(11)), None);
        // Full: the entry closest to expiry makes room.
        cache.insert("c", ip.clone(), now + Duration::from_secs(30));
        assert_eq!(cache.entries.len(), 2);
        assert_eq!(cache.get("a", now), None);
        assert_eq!(cache.get("c", now), Some(ip.clone()));
        // Refreshing a known entry takes no room.
        cache.insert("c", ip, now + Duration::from_secs(40));
        assert_eq!(cache.entries.len(), 2);
    }
}
