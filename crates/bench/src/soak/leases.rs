//! The soak's Leases (`--leases`): a real etcd and kube-apiserver, servers that publish their
//! Leases with a short duration, and agents that count servers by them, so that a server
//! frozen past its Lease's duration drops out of every agent's count while its streams are
//! suspended, and comes back when it renews.

use std::ffi::OsString;
use std::time::Duration;

use tether_testkit::control_plane::{ControlPlane, ControlPlaneOptions};
use tokio::time::Instant;

use crate::systems::flag;

/// A Lease is valid this long after each renewal, renewed every second: a server frozen for
/// longer loses it.
pub const LEASE_DURATION: Duration = Duration::from_secs(4);
/// The Leases of the fleet's servers: upstream's namespace and label.
const NAMESPACE: &str = "kube-system";
const LABEL: &str = "k8s-app=konnectivity-server";

/// The control plane the Leases live in.
#[derive(Debug)]
pub struct Leases {
    plane: ControlPlane,
}

impl Leases {
    /// Starts etcd and kube-apiserver (from `$TETHER_K8S_BIN`, or `interop/k8s/build.sh`).
    pub async fn start() -> anyhow::Result<Leases> {
        Ok(Leases {
            plane: ControlPlane::start(ControlPlaneOptions::default()).await?,
        })
    }

    /// A server's flags: publish its Lease, renewed every second.
    pub fn server_flags(&self) -> Vec<OsString> {
        vec![
            "--enable-lease-controller".into(),
            flag("kubeconfig", &self.plane.kubeconfig),
            flag("lease-duration", format!("{}s", LEASE_DURATION.as_secs())),
            "--lease-renew-interval=1s".into(),
        ]
    }

    /// A tether agent's flags: count servers by their valid Leases, listed twice a second.
    pub fn agent_flags(&self) -> Vec<OsString> {
        vec![
            "--count-server-leases".into(),
            flag("kubeconfig", &self.plane.kubeconfig),
            "--lease-poll-interval=500ms".into(),
        ]
    }

    /// The server IDs whose Lease is valid now (renewed within its duration).
    pub async fn valid_holders(&self) -> anyhow::Result<Vec<String>> {
        let args = ["get", "leases", "-n", NAMESPACE, "-l", LABEL, "-o", "json"];
        let listed: serde_json::Value =
            serde_json::from_str(&self.plane.kubectl(&args, None).await?)?;
        let now = tether_observe::time::wall_clock();
        let mut holders: Vec<String> = listed["items"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|lease| {
                let spec = &lease["spec"];
                let renewed = spec["renewTime"]
                    .as_str()
                    .and_then(|t| t.parse::<jiff::Timestamp>().ok())
                    .map(std::time::SystemTime::from);
                let duration = spec["leaseDurationSeconds"].as_u64().unwrap_or(0);
                renewed.is_some_and(|at| at + Duration::from_secs(duration) > now)
            })
            .filter_map(|lease| lease["spec"]["holderIdentity"].as_str().map(str::to_owned))
            .collect();
        holders.sort_unstable();
        Ok(holders)
    }

    /// Waits at most `within` until `done(valid holders)` holds; the last list if it never
    /// did.
    pub async fn wait_for(
        &self,
        within: Duration,
        done: impl Fn(&[String]) -> bool,
    ) -> Result<(), Vec<String>> {
        let deadline = Instant::now() + within;
        loop {
            let holders = self.valid_holders().await.unwrap_or_default();
            if done(&holders) {
                return Ok(());
            }
            if Instant::now() > deadline {
                return Err(holders);
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }
}
