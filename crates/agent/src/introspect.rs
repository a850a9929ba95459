//! `/debug/connections` and `/debug/agents` on the agent's admin port: this agent's server
//! streams and the connections it opened for them.
//!
//! Built only on request, from one brief look at each stream's table.

use tether_observe::time::monotonic_now;

use tether_observe::http::{Request, Response};
use tether_observe::introspect::{
    AgentsReport, ConnectionView, ConnectionsReport, Filter, StreamView,
};

use crate::clientset::ClientSet;

/// Answers `/debug/connections` and `/debug/agents`; `None` for other paths.
pub(crate) fn route(clientset: &ClientSet, req: &Request) -> Option<Response> {
    match req.path.as_str() {
        "/debug/connections" => Some(match Filter::from_query(req.query.as_deref()) {
            Ok(filter) => Response::json_of(&connections(clientset, &filter)),
            Err(e) => Response::text(400, format!("{e}\n")),
        }),
        "/debug/agents" => Some(Response::json_of(&agents(clientset))),
        _ => None,
    }
}

fn connections(clientset: &ClientSet, filter: &Filter) -> ConnectionsReport {
    let agent_id = clientset.agent_id();
    let mut out = Vec::new();
    for (session, _) in clientset.session_list() {
        let now = monotonic_now();
        out.extend(
            session
                .link
                .connection_views(|dial_id, destination, opened| ConnectionView {
                    dial_id: dial_id.0,
                    destination,
                    agent_id: agent_id.to_owned(),
                    server_id: session.server_id.clone(),
                    age_seconds: now.saturating_duration_since(opened).as_secs_f64(),
                    ..Default::default()
                }),
        );
    }
    ConnectionsReport::new("agent", out, filter)
}

fn agents(clientset: &ClientSet) -> AgentsReport {
    let now = monotonic_now();
    let mut streams: Vec<StreamView> = clientset
        .session_list()
        .into_iter()
        .map(|(session, address)| {
            let (pending_dials, connections, queued) = session.link.inspect(|t| {
                (
                    t.pending_dial_count(),
                    t.connection_count(),
                    t.queued_bytes(),
                )
            });
            StreamView {
                agent_id: clientset.agent_id().to_owned(),
                server_id: session.server_id.clone(),
                server_address: address.map(|a| a.to_string()),
                via_server: None,
                stream_id: 0,
                identifiers: clientset.identifiers().to_owned(),
                agent_version: Some(tether_observe::VERSION.to_owned()),
                server_version: session.server_version.clone(),
                transport: session.transport().to_owned(),
                draining: clientset.is_draining(),
                retiring: None,
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
    streams.sort_by(|a, b| a.server_id.cmp(&b.server_id));
    AgentsReport {
        role: "agent".into(),
        version: tether_observe::VERSION.into(),
        server_id: String::new(),
        server_count: u32::try_from(clientset.server_count()).unwrap_or(u32::MAX),
        agent_id: clientset.agent_id().to_owned(),
        streams,
        peers: Vec::new(),
        config_files: clientset.destinations().view().into_iter().collect(),
    }
}
