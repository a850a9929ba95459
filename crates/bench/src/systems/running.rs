//! A started system: its processes and what is measured on them. The constructors that start
//! each system stay in the parent module, which dispatches to the systems' modules; those
//! build a `Running` from here without using the parent.

use std::time::Duration;
use tokio::time::Instant;

use anyhow::{Context as _, bail};

use super::dialer::Dialer;
use super::loopback::http_get;
use super::system::System;
use crate::procs::Proc;
use crate::target;

/// A started system.
#[derive(Debug)]
pub struct Running {
    pub system: System,
    pub dialer: Dialer,
    /// The proxy server (or sshd, or relay A); `None` for direct.
    pub server: Option<Proc>,
    /// The agents (or the ssh client, or relay B): one, except none for direct and for a lone
    /// server, and several in the scale workload.
    pub agents: Vec<Proc>,
    /// Health port of a Konnectivity server, for its metrics.
    pub server_health: Option<u16>,
    /// Agent port of a Konnectivity server (fake agents connect there).
    pub agent_port: Option<u16>,
    /// The relay between agent and server that [`cut`](Self::cut) cuts (resume workload).
    pub cut_relay: Option<Proc>,
    /// With a peer hop (`tether-peer`): the second server, which holds the agents; `server`
    /// is then the client's, which holds none. The server figures (RSS, CPU) are both
    /// servers' together; the agents are counted on this one.
    pub holder: Option<Holder>,
}

/// The server holding the agents behind a peer hop, and its health port.
#[derive(Debug)]
pub struct Holder {
    pub server: Proc,
    pub health: u16,
}

impl Running {
    /// Closes every connection through the agent's relay, as a middlebox dropping flows.
    pub fn cut(&self) -> anyhow::Result<()> {
        let relay = self.cut_relay.as_ref().context("no relay to cut")?;
        let pid = rustix::process::Pid::from_raw(relay.pid as i32).context("relay pid")?;
        rustix::process::kill_process(pid, rustix::process::Signal::USR1)
            .context("signalling the relay")?;
        Ok(())
    }

    /// One echo through the system, retried for a few seconds: an agent may be ready a
    /// moment after its health endpoint says so.
    pub(super) async fn check_end_to_end(&self) -> anyhow::Result<()> {
        let deadline = Instant::now() + Duration::from_secs(15);
        loop {
            let attempt = async {
                let mut s = self.dialer.dial_timeout(Duration::from_secs(5)).await?;
                target::echo_start(&mut s, b"ready?").await
            };
            match tokio::time::timeout(Duration::from_secs(5), attempt).await {
                Ok(Ok(())) => return Ok(()),
                Ok(Err(e)) if Instant::now() > deadline => {
                    return Err(e).context(format!("{} does not tunnel", self.system.name()));
                }
                Err(_) if Instant::now() > deadline => {
                    bail!("{} does not tunnel (echo timed out)", self.system.name())
                }
                _ => tokio::time::sleep(Duration::from_millis(200)).await,
            }
        }
    }

    /// Fails if a process of the system has died.
    pub fn check_alive(&mut self) -> anyhow::Result<()> {
        if let Some(p) = &mut self.server {
            p.check_alive()?;
        }
        if let Some(h) = &mut self.holder {
            h.server.check_alive()?;
        }
        for p in &mut self.agents {
            p.check_alive()?;
        }
        Ok(())
    }

    /// The server processes: the client's, and the one holding the agents behind a peer hop.
    fn servers(&self) -> impl Iterator<Item = &Proc> {
        self.server
            .iter()
            .chain(self.holder.as_ref().map(|h| &h.server))
    }

    /// Of the server, or of both servers of a peer hop together.
    pub fn server_rss(&self) -> Option<u64> {
        self.server
            .is_some()
            .then(|| self.servers().map(Proc::rss).sum())
    }

    /// Of the server, or of both servers of a peer hop together.
    pub fn server_rss_anon(&self) -> Option<u64> {
        self.server
            .is_some()
            .then(|| self.servers().map(Proc::rss_anon).sum())
    }

    /// Of every agent together.
    pub fn agent_rss_anon(&self) -> Option<u64> {
        (!self.agents.is_empty()).then(|| self.agents.iter().map(Proc::rss_anon).sum())
    }

    /// Of every agent together.
    pub fn agent_rss(&self) -> Option<u64> {
        (!self.agents.is_empty()).then(|| self.agents.iter().map(Proc::rss).sum())
    }

    /// CPU seconds of the server (both servers of a peer hop) so far.
    pub fn server_cpu_seconds(&self) -> Option<f64> {
        self.server
            .is_some()
            .then(|| self.servers().map(Proc::cpu_seconds).sum())
    }

    /// CPU seconds of server(s) + agents so far.
    pub fn cpu_seconds(&self) -> Option<f64> {
        if self.server.is_none() && self.agents.is_empty() {
            return None;
        }
        Some(
            self.servers().map(Proc::cpu_seconds).sum::<f64>()
                + self.agents.iter().map(Proc::cpu_seconds).sum::<f64>(),
        )
    }

    /// How many agents the Konnectivity server holding them counts ready (its gauge), if it
    /// has metrics.
    pub async fn agents_counted(&self) -> Option<usize> {
        let port = match &self.holder {
            Some(h) => h.health,
            None => self.server_health?,
        };
        let body = http_get(port, "/metrics").await.ok()?.1;
        metric_sum(&body, READY_BACKENDS, "").map(|c| c as usize)
    }

    /// Waits until the server's count of ready agents satisfies `done` (`wanted` names it
    /// for the error), polling its gauge.
    pub async fn wait_for_agents(
        &self,
        done: impl Fn(usize) -> bool,
        wanted: &str,
        timeout: Duration,
    ) -> anyhow::Result<()> {
        let deadline = Instant::now() + timeout;
        loop {
            let counted = self.agents_counted().await.unwrap_or(0);
            if done(counted) {
                return Ok(());
            }
            if Instant::now() > deadline {
                bail!("the server counts {counted} agents after {timeout:?}, waiting for {wanted}");
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Reads one gauge or counter from the (client's) server's Prometheus metrics (every
    /// series of it added up).
    pub async fn server_metric(&self, name: &str) -> Option<f64> {
        self.server_metric_where(name, "").await
    }

    /// Reads one gauge or counter from the server's Prometheus metrics, adding up the series
    /// whose labels contain `label` (e.g. `service_method="Proxy"`).
    pub async fn server_metric_where(&self, name: &str, label: &str) -> Option<f64> {
        let port = self.server_health?;
        let body = http_get(port, "/metrics").await.ok()?.1;
        metric_sum(&body, name, label)
    }

    pub async fn stop(self) {
        for p in self.agents {
            p.stop().await;
        }
        if let Some(p) = self.cut_relay {
            p.stop().await;
        }
        if let Some(h) = self.holder {
            h.server.stop().await;
        }
        if let Some(p) = self.server {
            p.stop().await;
        }
    }
}

/// The Konnectivity server's gauge of connected agents (upstream's name, which tether keeps).
pub(super) const READY_BACKENDS: &str =
    "konnectivity_network_proxy_server_ready_backend_connections";

/// The Konnectivity server's gauge of open gRPC streams, by `service_method` (`Proxy` for
/// the frontend's; upstream's name, which tether keeps).
pub const GRPC_STREAMS: &str = "konnectivity_network_proxy_server_grpc_connections";

/// The sum of `name`'s series in a Prometheus text exposition whose labels contain `label`.
pub fn metric_sum(body: &str, name: &str, label: &str) -> Option<f64> {
    body.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| {
            let (key, value) = l.rsplit_once(' ')?;
            let (bare, labels) = key.split_once('{').unwrap_or((key, ""));
            (bare == name && labels.contains(label)).then(|| value.parse::<f64>().ok())?
        })
        .reduce(|a, b| a + b)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_metric_is_summed_over_the_series_with_the_label() {
        let body = "# HELP konnectivity_network_proxy_server_grpc_connections streams\n\
            konnectivity_network_proxy_server_grpc_connections{service_method=\"Connect\"} 1\n\
            konnectivity_network_proxy_server_grpc_connections{service_method=\"Proxy\"} 964\n\
            konnectivity_network_proxy_server_grpc_connections_other{service_method=\"Proxy\"} 7\n";
        let proxy = r#"service_method="Proxy""#;
        assert_eq!(metric_sum(body, GRPC_STREAMS, proxy), Some(964.0));
        assert_eq!(metric_sum(body, GRPC_STREAMS, ""), Some(965.0));
        assert_eq!(metric_sum(body, READY_BACKENDS, ""), None);
    }
}
