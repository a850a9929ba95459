//! `/debug/connections`, `/debug/agents` and `/debug/config` on the admin port: what every agent stream's
//! table holds right now, with the client behind each dial.
//!
//! Built only on request: the registry is locked long enough to copy its list of streams,
//! then each stream's table for one pass over its entries. The data path keeps no extra
//! state for this beyond the request recorded per dial ([`Requests`](crate::backend::session::Requests)).

use std::sync::Arc;
use std::time::Instant;
use tether_observe::time::monotonic_now;

use tether_observe::http::{Request, Response};
use tether_observe::introspect::{
    AgentsReport, ConfigFileView, ConnectionView, ConnectionsReport, Filter, StreamView,
};
use tether_proto::Identifiers;
use tether_reload::Reloader;

use crate::backend::route::Route;
use crate::backend::session::AgentSession;
use crate::dial::Hub;
use crate::request::{Hop, RequestContext, Requests};
use crate::routing::RoutingConfig;

/// Who this server is, for the reports.
#[derive(Clone, Debug)]
pub(crate) struct Membership {
    pub(crate) server_id: String,
    pub(crate) server_count: u32,
    /// The watched routing file, for `/debug/config` and the agents report's header.
    pub(crate) routing: Option<Arc<Reloader<RoutingConfig>>>,
}

impl Membership {
    /// The routing file's generation in force and its last refusal.
    fn config(&self) -> Option<ConfigFileView> {
        Some(self.routing.as_ref()?.view("routing-config"))
    }
}

/// Answers `/debug/connections` and `/debug/agents`; `None` for other paths.
pub(crate) fn route(hub: &Hub, membership: &Membership, req: &Request) -> Option<Response> {
    match req.path.as_str() {
        "/debug/connections" => Some(match Filter::from_query(req.query.as_deref()) {
            Ok(filter) => Response::json_of(&connections(hub, membership, &filter)),
            Err(e) => Response::text(400, format!("{e}\n")),
        }),
        "/debug/agents" => Some(Response::json_of(&agents(hub, membership))),
        "/debug/config" => Some(match membership.config() {
            Some(view) => Response::json_of(&view),
            None => Response::text(
                404,
                "no watched configuration file: the server runs without --routing-config\n",
            ),
        }),
        _ => None,
    }
}

/// Every agent stream of every tenant: those dials can reach, and those a reload retired
/// (taken out of their registries at once), which keep their connections until the grace
/// period ends, also of the tenants it removed.
fn streams(hub: &Hub) -> Vec<Arc<AgentSession>> {
    let running = hub.running();
    let states = running
        .tenants
        .all()
        .map(|tenant| tenant.state())
        .chain(&running.leaving);
    let mut streams = Vec::new();
    for state in states {
        streams.extend(state.registry().streams().filter_map(Route::local).cloned());
        streams.extend(
            state
                .streams_now()
                .into_iter()
                .filter(|session| session.retiring().is_some()),
        );
    }
    streams
}

pub(crate) fn connections(
    hub: &Hub,
    membership: &Membership,
    filter: &Filter,
) -> ConnectionsReport {
    let mut out = Vec::new();
    for session in streams(hub) {
        if filter
            .agent
            .as_ref()
            .is_some_and(|a| *a != session.agent_id)
        {
            continue;
        }
        let now = monotonic_now();
        // Called after the table's lock is released, so the two locks are never nested.
        let base = |dial_id: tether_proto::DialId, destination: String, opened: Instant| {
            let request = requested(&session.requests, dial_id);
            let request = request.as_deref();
            ConnectionView {
                agent_id: session.agent_id.clone(),
                from_server: request.and_then(|r| match &r.hop {
                    Some(Hop::From(server)) => Some(server.to_string()),
                    _ => None,
                }),
                ..row(request, dial_id, destination, membership, now, opened)
            }
        };
        out.extend(session.link.connection_views(base));
    }
    // Server peering: the connections this server's clients have through a peer.
    for via in hub.peer_links.inbound() {
        let now = monotonic_now();
        let base = |dial_id: tether_proto::DialId, destination: String, opened: Instant| {
            let request = requested(&via.requests, dial_id);
            let agent_id = via
                .routes()
                .get(&dial_id)
                .map(|entry| entry.agent.agent_id.clone())
                .unwrap_or_default();
            ConnectionView {
                agent_id,
                via_server: Some(via.server_id.to_string()),
                ..row(
                    request.as_deref(),
                    dial_id,
                    destination,
                    membership,
                    now,
                    opened,
                )
            }
        };
        out.extend(
            via.link
                .connection_views(base)
                .into_iter()
                .filter(|c| filter.agent.as_ref().is_none_or(|a| *a == c.agent_id)),
        );
    }
    ConnectionsReport::new("server", out, filter)
}

/// The request a dial recorded; `None` once its connection ended. Read after the table's
/// lock is released, so the two locks are never nested.
fn requested(requests: &Requests, dial_id: tether_proto::DialId) -> Option<Arc<RequestContext>> {
    requests
        .lock()
        .get(&dial_id)
        .map(|followed| followed.request.clone())
}

/// A connection's row from what its request recorded, its agent and hop left to the caller.
fn row(
    request: Option<&RequestContext>,
    dial_id: tether_proto::DialId,
    destination: String,
    membership: &Membership,
    now: Instant,
    opened: Instant,
) -> ConnectionView {
    ConnectionView {
        dial_id: dial_id.0,
        frontend: request.map(|r| r.frontend.as_str().to_owned()),
        client: request.map(|r| r.peer.principal().to_string()),
        destination: request.map_or(destination, |r| r.address.clone()),
        server_id: membership.server_id.clone(),
        age_seconds: now.saturating_duration_since(opened).as_secs_f64(),
        ..Default::default()
    }
}

pub(crate) fn agents(hub: &Hub, membership: &Membership) -> AgentsReport {
    let now = monotonic_now();
    let mut streams: Vec<StreamView> = streams(hub)
        .into_iter()
        .map(|session| {
            let (pending_dials, connections, queued) = session.link.inspect(|t| {
                (
                    t.pending_dial_count(),
                    t.connection_count(),
                    t.queued_bytes(),
                )
            });
            StreamView {
                agent_id: session.agent_id.clone(),
                server_id: membership.server_id.clone(),
                server_address: None,
                via_server: None,
                stream_id: session.stream_id,
                identifiers: identifiers_query(&session.identifiers),
                agent_version: session.version.clone(),
                server_version: Some(tether_observe::VERSION.to_owned()),
                transport: session.transport().to_owned(),
                draining: session.is_draining(),
                retiring: session.retiring().map(str::to_owned),
                credit_flow: session.link.flow().is_credit(),
                age_seconds: now
                    .saturating_duration_since(session.connected_at)
                    .as_secs_f64(),
                last_ping_seconds: session
                    .keepalive
                    .get()
                    .map(|at| now.saturating_duration_since(at).as_secs_f64()),
                pending_dials: pending_dials as u64,
                connections: connections as u64,
                queued_bytes: queued as u64,
            }
        })
        .collect();
    streams.extend(remote_agents(hub, membership, now));
    streams.sort_by(|a, b| (&a.agent_id, a.stream_id).cmp(&(&b.agent_id, b.stream_id)));
    AgentsReport {
        role: "server".into(),
        version: tether_observe::VERSION.into(),
        server_id: membership.server_id.clone(),
        server_count: membership.server_count,
        agent_id: String::new(),
        streams,
        peers: hub.peer_links.views(),
        config_files: membership.config().into_iter().collect(),
    }
}

/// Server peering: the agents peers hold that this server can dial, with what it sent
/// through them.
fn remote_agents(hub: &Hub, membership: &Membership, now: Instant) -> Vec<StreamView> {
    let running = hub.running();
    let mut rows = Vec::new();
    for tenant in running.tenants.all() {
        let remotes: Vec<_> = tenant
            .registry()
            .streams()
            .filter_map(|route| match route {
                Route::Remote(remote) => Some(remote.clone()),
                Route::Local(_) => None,
            })
            .collect();
        for remote in remotes {
            let (pending, open) = remote.health.counts();
            rows.push(StreamView {
                agent_id: remote.agent_id.clone(),
                server_id: membership.server_id.clone(),
                server_address: None,
                via_server: Some(remote.via.server_id.to_string()),
                stream_id: remote.stream_id,
                identifiers: identifiers_query(&remote.identifiers),
                agent_version: remote.version.clone(),
                server_version: Some(tether_observe::VERSION.to_owned()),
                transport: "peer".into(),
                draining: crate::backend::registry::Backend::is_draining(&remote),
                retiring: None,
                credit_flow: true,
                age_seconds: now.saturating_duration_since(remote.since).as_secs_f64(),
                last_ping_seconds: None,
                pending_dials: pending,
                connections: open,
                queued_bytes: 0,
            });
        }
    }
    rows
}

/// The identifiers in `--agent-identifiers` syntax.
fn identifiers_query(ids: &Identifiers) -> String {
    let mut parts: Vec<String> = Vec::new();
    for (key, values) in [
        ("host", &ids.hosts),
        ("ipv4", &ids.ipv4),
        ("ipv6", &ids.ipv6),
        ("cidr", &ids.cidrs),
    ] {
        parts.extend(values.iter().map(|v| format!("{key}={v}")));
    }
    if ids.default_route {
        parts.push("default-route=true".into());
    }
    parts.join("&")
}
