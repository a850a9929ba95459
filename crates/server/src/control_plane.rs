//! Reverse dials (a tether extension): an agent carries a connection from its node to the
//! control plane, and this server dials the control-plane side. It dials only the endpoints
//! of `--control-plane-endpoints`; any other address is refused with the reason, counted and
//! audited, so the reverse direction can never reach arbitrary control-plane hosts.

use std::sync::Arc;
use std::time::Instant;

use tether_tunnel::{DialFacts, IncomingDial, StreamAudit};
use tokio::net::TcpStream;

use crate::metrics::{ReverseDial, ServerMetrics};
use crate::warn_limit::WarnLimit;

/// The only addresses reverse dials may reach. The first is the default, which an agent asks
/// for with an empty address.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ControlPlaneEndpoints {
    endpoints: Vec<String>,
}

impl ControlPlaneEndpoints {
    /// `endpoints` are `HOST:PORT`, already checked; at least one.
    pub fn new(endpoints: Vec<String>) -> Option<Self> {
        (!endpoints.is_empty()).then_some(Self { endpoints })
    }

    pub fn endpoints(&self) -> &[String] {
        &self.endpoints
    }

    /// The endpoint to dial for `requested`, or why not.
    fn resolve(&self, requested: &str) -> Result<&str, String> {
        if requested.is_empty() {
            return Ok(&self.endpoints[0]);
        }
        self.endpoints
            .iter()
            .find(|e| e.eq_ignore_ascii_case(requested))
            .map(String::as_str)
            .ok_or_else(|| {
                format!("{requested} is not an allowed control-plane endpoint (--control-plane-endpoints)")
            })
    }
}

/// What one agent stream's reverse dials need.
#[derive(Debug)]
pub(crate) struct ReverseDials {
    /// `None`: the stream did not negotiate reverse dials (or the feature is off), and every
    /// one is refused.
    pub(crate) endpoints: Option<Arc<ControlPlaneEndpoints>>,
    pub(crate) metrics: Arc<ServerMetrics>,
    pub(crate) audit: Option<Arc<StreamAudit>>,
    pub(crate) agent_id: String,
}

/// Refused reverse dials are logged at most once a second, whoever sends them.
static REFUSALS: WarnLimit = WarnLimit::new(std::time::Duration::from_secs(1));

/// Answers one reverse dial: checks it against the allowlist, dials, relays until either
/// side ends.
pub(crate) async fn serve(
    incoming: IncomingDial,
    protocol: String,
    requested: String,
    dials: Arc<ReverseDials>,
) {
    let mut facts = DialFacts {
        dial_id: incoming.random(),
        requested,
        dialed: None,
        latency: None,
    };
    let target = match &dials.endpoints {
        None => Err(
            "this proxy server accepts no control-plane connections on this stream (--control-plane-endpoints)"
                .to_owned(),
        ),
        Some(_) if protocol != "tcp" => Err(format!("protocol {protocol:?} is not supported")),
        Some(endpoints) => endpoints.resolve(&facts.requested).map(str::to_owned),
    };
    let target = match target {
        Ok(target) => target,
        Err(reason) => {
            if let Some(suppressed) = REFUSALS.allow() {
                tracing::warn!(
                    agent.id = %dials.agent_id,
                    dial.id = %facts.dial_id,
                    requested = %facts.requested,
                    suppressed,
                    "refusing a reverse dial: {reason}"
                );
            }
            dials.metrics.control_plane_dial(ReverseDial::Refused);
            if let Some(audit) = &dials.audit {
                audit.dial_ended(&facts, true, &reason);
            }
            incoming.fail(reason);
            return;
        }
    };
    let started = Instant::now();
    let dialed = tokio::select! {
        dialed = TcpStream::connect(target.as_str()) => dialed,
        // The agent gave up, the table's dial deadline passed, or the stream ended.
        () = incoming.abandoned() => {
            dials.metrics.control_plane_dial(ReverseDial::Cancelled);
            return;
        }
    };
    facts.latency = Some(started.elapsed());
    let stream = match dialed {
        Ok(stream) => stream,
        Err(error) => {
            let reason = format!("dial tcp {target}: {error}");
            tracing::info!(agent.id = %dials.agent_id, dial.id = %facts.dial_id, "reverse dial failed: {reason}");
            dials.metrics.control_plane_dial(ReverseDial::Failed);
            if let Some(audit) = &dials.audit {
                audit.dial_ended(&facts, false, &reason);
            }
            incoming.fail(reason);
            return;
        }
    };
    let _ = stream.set_nodelay(true);
    facts.dialed = stream.peer_addr().ok().map(|a| a.to_string());
    // `None`: given up meanwhile; dropping the socket closes it.
    let Some(mut tunnel) = incoming.accept() else {
        dials.metrics.control_plane_dial(ReverseDial::Cancelled);
        return;
    };
    dials.metrics.control_plane_dial(ReverseDial::Connected);
    if let Some(audit) = &dials.audit {
        audit.connected(tunnel.connect_id(), facts);
    }
    let outcome = tether_tunnel::relay_tcp(&mut tunnel, stream).await;
    tunnel.finish(outcome);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_listed_endpoints_resolve_and_empty_means_the_first() {
        let list =
            ControlPlaneEndpoints::new(vec!["127.0.0.1:6443".into(), "API.local:443".into()])
                .unwrap();
        assert_eq!(list.resolve(""), Ok("127.0.0.1:6443"));
        assert_eq!(list.resolve("api.local:443"), Ok("API.local:443"));
        assert!(
            list.resolve("127.0.0.1:6444")
                .unwrap_err()
                .contains("not an allowed control-plane endpoint")
        );
        assert!(list.resolve("10.0.0.1:6443").is_err());
        assert!(ControlPlaneEndpoints::new(Vec::new()).is_none());
    }
}
