//! tether-kube's Lease tasks beside the server (controller and garbage collector) and the
//! agent (counter). Built only when their flags ask, so nothing about Kubernetes starts
//! otherwise; they run on their own tracker until told to stop, and stopping waits for them
//! (the controller deletes its Lease then) within a deadline.

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tether_agent::{LeaseCounting, ServerLeases};
use tether_kube::lease::api::{CALL_TIMEOUT, Leases};
use tether_kube::lease::count::count_valid;
use tether_kube::lease::metrics::{CounterMetrics, GcMetrics};
use tether_kube::lease::record::LeaseIdentity;
use tether_kube::lease::{controller, counter, gc, lease_name};
use tether_kube::{KubeApi, KubeApiOptions};
use tether_observe::metrics::Registry;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::cli::agent::AgentLeases;
use crate::cli::server::ServerLeases as ServerLeaseSettings;

/// Running Lease tasks.
#[derive(Debug)]
pub(crate) struct LeaseTasks {
    tasks: TaskTracker,
    stop: CancellationToken,
}

impl LeaseTasks {
    /// The server's controller (its own Lease) and garbage collector (expired Leases), on
    /// the server's one Kubernetes client.
    pub(crate) fn server(
        kube: &KubeApi,
        settings: &ServerLeaseSettings,
        server_id: &str,
        registry: &Registry,
    ) -> Self {
        let leases = Leases::new(kube, &settings.namespace);
        let identity = LeaseIdentity {
            name: lease_name(server_id),
            namespace: settings.namespace.clone(),
            holder: server_id.to_owned(),
            duration: settings.duration,
            labels: settings.labels.clone(),
            agent_address: settings.agent_address.map(|a| a.to_string()),
            peer_address: settings.peer_address.map(|a| a.to_string()),
        };
        let this = Self::new();
        this.tasks.spawn(controller::run(
            leases.clone(),
            identity,
            settings.renew_interval,
            this.stop.clone(),
        ));
        if let Some(peers) = &settings.peers {
            this.tasks.spawn(follow_peers(
                leases.clone(),
                settings.labels.selector(),
                settings.renew_interval,
                peers.clone(),
                this.stop.clone(),
            ));
        }
        this.tasks.spawn(gc::run(
            leases,
            settings.labels.selector(),
            settings.renew_interval,
            GcMetrics::register(registry),
            this.stop.clone(),
        ));
        this
    }

    /// The agent's counter, and the counting it feeds. Its client has client-go's default
    /// rate limit (5 QPS, burst 10), as upstream's agent, which has no flags for it.
    pub(crate) async fn agent(
        settings: &AgentLeases,
        registry: &Registry,
    ) -> anyhow::Result<(Self, LeaseCounting)> {
        let kube = KubeApi::connect(&KubeApiOptions {
            kubeconfig: settings.kubeconfig.clone(),
            ..KubeApiOptions::default()
        })
        .await?;
        let (sender, receiver) = tokio::sync::watch::channel(None);
        let this = Self::new();
        this.tasks.spawn(counter::run(
            Leases::new(&kube, &settings.namespace),
            settings.selector.clone(),
            settings.poll_interval,
            CounterMetrics::register(registry),
            move |count| {
                sender.send_replace(Some(ServerLeases {
                    count: count.count,
                    holders: count.holders,
                    addresses: count.addresses.into_values().collect(),
                    without_address: count.without_address,
                }));
            },
            this.stop.clone(),
        ));
        let counting = LeaseCounting {
            source: settings.source,
            leases: receiver,
        };
        Ok((this, counting))
    }

    fn new() -> Self {
        Self {
            tasks: TaskTracker::new(),
            stop: CancellationToken::new(),
        }
    }

    /// Stops the tasks and waits for them: at most one API call (the Lease's deletion).
    pub(crate) async fn stop(self) {
        self.stop.cancel();
        self.tasks.close();
        if tokio::time::timeout(CALL_TIMEOUT + Duration::from_secs(1), self.tasks.wait())
            .await
            .is_err()
        {
            tracing::warn!("Lease tasks did not end in time");
        }
    }
}

/// Server peering by Lease: lists the fleet's Leases every `interval` and publishes the
/// peer addresses the valid ones carry, until `stop`. A failed or empty listing keeps the
/// peers known before.
async fn follow_peers(
    leases: Leases,
    selector: String,
    interval: Duration,
    peers: Arc<watch::Sender<BTreeSet<SocketAddr>>>,
    stop: CancellationToken,
) {
    let mut failing = false;
    let listing = async {
        loop {
            match leases.list(&selector, true).await {
                Ok(all) => {
                    failing = false;
                    let found: BTreeSet<SocketAddr> =
                        count_valid(&all, tether_observe::time::wall_clock())
                            .peer_addresses
                            .into_values()
                            .collect();
                    if !found.is_empty() {
                        peers.send_if_modified(|known| {
                            let changed = *known != found;
                            if changed {
                                tracing::info!(peers = ?found, "peer servers found in the Leases");
                                *known = found;
                            }
                            changed
                        });
                    }
                }
                Err(e) if !failing => {
                    failing = true;
                    tracing::warn!(error = %e, "could not list the server Leases for peers; keeping the peers known");
                }
                Err(_) => {}
            }
            tokio::time::sleep(interval).await;
        }
    };
    tokio::select! {
        () = stop.cancelled() => {}
        () = listing => {}
    }
}
