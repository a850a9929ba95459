//! Reverse dials (a tether extension): an agent carries a connection from its node to the
//! control plane, and this server dials the control-plane side. It dials only the endpoints
//! of `--control-plane-endpoints`; any other address is refused with the reason, counted and
//! audited, so the reverse direction can never reach arbitrary control-plane hosts.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use tether_observe::time::monotonic_now;

use tether_grpc::LogText;
use tether_tunnel::{DialFacts, IncomingDial, StreamAudit};
use tokio::net::TcpStream;

use crate::metrics::{ReverseDial, ServerMetrics};
use crate::tenant_config::TenantConfig;
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

    /// Checks a list of `HOST:PORT` (IPv6 literals in brackets); `None` for an empty list.
    /// The text is what gets dialed: it is never resolved here.
    pub fn parse<'a>(list: impl IntoIterator<Item = &'a str>) -> Result<Option<Self>, String> {
        let endpoints = list
            .into_iter()
            .map(|endpoint| check_host_port(endpoint).map(|()| endpoint.to_owned()))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Self::new(endpoints))
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
                format!(
                    "{} is not an allowed control-plane endpoint (--control-plane-endpoints, or the tenant's control_plane_endpoints)",
                    LogText(requested)
                )
            })
    }
}

/// Checks a `HOST:PORT` that is dialed, never resolved here (IPv6 literals in brackets): a
/// non-empty host without whitespace or control characters and a port from 1 to 65535.
pub fn check_host_port(text: &str) -> Result<(), String> {
    let (host, port) = text
        .rsplit_once(':')
        .ok_or_else(|| format!("{text:?} is not HOST:PORT"))?;
    let bare = host.trim_start_matches('[').trim_end_matches(']');
    if bare.is_empty() || host.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err(format!("{text:?} has no host"));
    }
    if bare.contains(':') && !(host.starts_with('[') && host.ends_with(']')) {
        return Err(format!(
            "{text:?}: write an IPv6 host in brackets, as [::1]:6443"
        ));
    }
    match port.parse::<u16>() {
        Ok(p) if p > 0 => Ok(()),
        _ => Err(format!("{text:?} has no valid port")),
    }
}

/// Where each tenant's agents may dial: a tenant's own `control_plane_endpoints` from the
/// routing file, else the server's `--control-plane-endpoints`; and how many reverse
/// connections one agent stream may hold.
#[derive(Debug)]
pub(crate) struct ReversePolicy {
    server: Option<Arc<ControlPlaneEndpoints>>,
    /// Tenants that name their own list (an empty list: none for that tenant).
    tenants: HashMap<String, Option<Arc<ControlPlaneEndpoints>>>,
    pub(crate) max_connections_per_stream: usize,
}

impl ReversePolicy {
    pub(crate) fn new(
        server: Option<ControlPlaneEndpoints>,
        tenants: &[TenantConfig],
        max_connections_per_stream: usize,
    ) -> Self {
        let tenants = tenants
            .iter()
            .filter_map(|tenant| {
                let own = tenant.control_plane_endpoints.clone()?;
                Some((
                    tenant.name.clone(),
                    ControlPlaneEndpoints::new(own).map(Arc::new),
                ))
            })
            .collect();
        Self {
            server: server.map(Arc::new),
            tenants,
            max_connections_per_stream,
        }
    }

    /// The same server list and cap with another generation's tenants.
    pub(crate) fn next(&self, tenants: &[TenantConfig]) -> Self {
        let mut next = Self::new(None, tenants, self.max_connections_per_stream);
        next.server = self.server.clone();
        next
    }

    /// The allowlist of `tenant`'s agents; `None`: reverse dials are off for them.
    pub(crate) fn for_tenant(&self, tenant: &str) -> Option<Arc<ControlPlaneEndpoints>> {
        match self.tenants.get(tenant) {
            Some(own) => own.clone(),
            None => self.server.clone(),
        }
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
    /// Reverse dials of this stream being dialed or connected, at most `max_connections`.
    pub(crate) slots: Slots,
}

/// A count with a ceiling; a taken slot is given back when its [`Slot`] drops.
#[derive(Debug)]
pub(crate) struct Slots {
    taken: Arc<AtomicUsize>,
    max: usize,
}

impl Slots {
    pub(crate) fn new(max: usize) -> Self {
        Self {
            taken: Arc::default(),
            max,
        }
    }

    fn take(&self) -> Option<Slot> {
        self.taken
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < self.max).then_some(n + 1)
            })
            .ok()
            .map(|_| Slot(self.taken.clone()))
    }
}

/// One reverse dial's place in its stream's [`Slots`].
#[derive(Debug)]
struct Slot(Arc<AtomicUsize>);

impl Drop for Slot {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Refused reverse dials are logged at most once a second, whoever sends them.
static REFUSALS: WarnLimit = WarnLimit::new(std::time::Duration::from_secs(1));

/// Answers one reverse dial: checks it against the allowlist and the stream's cap, dials,
/// relays until either side ends.
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
        None => Err((
            ReverseDial::Refused,
            "this proxy server accepts no control-plane connections on this stream (--control-plane-endpoints)"
                .to_owned(),
        )),
        Some(_) if protocol != "tcp" => Err((
            ReverseDial::Refused,
            format!("protocol {:?} is not supported", LogText(&protocol).to_string()),
        )),
        Some(endpoints) => endpoints
            .resolve(&facts.requested)
            .map(str::to_owned)
            .map_err(|reason| (ReverseDial::Refused, reason)),
    };
    // Held until the dial fails or its connection ends.
    let slot = target.and_then(|target| match dials.slots.take() {
        Some(slot) => Ok((target, slot)),
        None => Err((
            ReverseDial::OverLimit,
            format!(
                "this agent stream already holds {} control-plane connections, the proxy server's limit (--control-plane-max-connections-per-stream)",
                dials.slots.max
            ),
        )),
    });
    let (target, _slot) = match slot {
        Ok(ok) => ok,
        Err((result, reason)) => {
            if let Some(suppressed) = REFUSALS.allow() {
                tracing::warn!(
                    agent.id = %LogText(&dials.agent_id),
                    dial.id = %facts.dial_id,
                    requested = %LogText(&facts.requested),
                    suppressed,
                    "refusing a reverse dial: {reason}"
                );
            }
            dials.metrics.control_plane_dial(result);
            if let Some(audit) = &dials.audit {
                audit.dial_ended(&facts, true, &reason);
            }
            incoming.fail(reason);
            return;
        }
    };
    let started = monotonic_now();
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
            tracing::info!(agent.id = %LogText(&dials.agent_id), dial.id = %facts.dial_id, "reverse dial failed: {reason}");
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
    let outcome = tether_tunnel::relay_tcp(&mut tunnel, stream, std::future::pending()).await;
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

    #[test]
    fn a_refusal_echoes_a_bounded_escaped_address() {
        let list = ControlPlaneEndpoints::new(vec!["127.0.0.1:6443".into()]).unwrap();
        let long = format!("{}\nFORGED:1", "a".repeat(1 << 20));
        let reason = list.resolve(&long).unwrap_err();
        assert!(reason.len() < 400, "{}", reason.len());
        assert!(!reason.contains('\n'), "{reason}");
    }

    #[test]
    fn endpoint_lists_are_checked_host_port_texts() {
        let list = ControlPlaneEndpoints::parse(["127.0.0.1:6443", "[::1]:6443", "api:443"])
            .unwrap()
            .unwrap();
        assert_eq!(
            list.endpoints(),
            ["127.0.0.1:6443", "[::1]:6443", "api:443"]
        );
        assert_eq!(ControlPlaneEndpoints::parse([]), Ok(None));
        for bad in [
            "127.0.0.1",
            "127.0.0.1:0",
            ":6443",
            "::1:6443",
            "h:port",
            "a b:1",
            "kubeconfig",
        ] {
            assert!(ControlPlaneEndpoints::parse([bad]).is_err(), "{bad}");
        }
    }

    fn tenant(name: &str, own: Option<&[&str]>) -> TenantConfig {
        TenantConfig {
            name: name.into(),
            clients: Vec::new(),
            agents: Vec::new(),
            limits: Default::default(),
            frontend: None,
            weight: 1,
            control_plane_endpoints: own.map(|list| list.iter().map(|e| (*e).to_owned()).collect()),
        }
    }

    #[test]
    fn a_tenant_gets_its_own_list_else_the_servers() {
        let server = ControlPlaneEndpoints::new(vec!["10.0.0.1:6443".into()]);
        let tenants = [
            tenant("own", Some(&["10.0.0.2:6443"])),
            tenant("off", Some(&[])),
            tenant("inherits", None),
        ];
        let policy = ReversePolicy::new(server.clone(), &tenants, 8);
        assert_eq!(
            policy.for_tenant("own").unwrap().endpoints(),
            ["10.0.0.2:6443"]
        );
        assert_eq!(policy.for_tenant("off"), None);
        assert_eq!(policy.for_tenant("inherits").as_deref(), server.as_ref());
        assert_eq!(policy.for_tenant("").as_deref(), server.as_ref());
        let none = ReversePolicy::new(None, &tenants, 8);
        assert_eq!(none.for_tenant("inherits"), None);
        assert!(none.for_tenant("own").is_some());
    }

    #[test]
    fn slots_stop_at_the_ceiling_and_come_back_when_dropped() {
        let slots = Slots::new(2);
        let a = slots.take().unwrap();
        let _b = slots.take().unwrap();
        assert!(slots.take().is_none());
        drop(a);
        assert!(slots.take().is_some());
    }
}
