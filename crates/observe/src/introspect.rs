//! The live view of a server or an agent that `/debug/connections` and `/debug/agents` on
//! the admin port serve, and that `tether connections`, `tether agents` and `tether top`
//! read back: one set of JSON types for both ends and both sides of the wire.
//!
//! A report is built only when requested, from a brief look at each stream's table; nothing
//! here is kept up to date on the data path.

use serde::{Deserialize, Serialize};

/// `GET /debug/connections`: the live and pending connections of one process.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ConnectionsReport {
    /// `server` or `agent`: which end answered.
    pub role: String,
    pub connections: Vec<ConnectionView>,
}

/// One connection, or one dial still waiting for its answer (`state` = `pending`).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ConnectionView {
    /// The connection ID the agent assigned; `None` while the dial is pending.
    pub connect_id: Option<i64>,
    /// The dial's `random`, shared by the frontend's, the server's and the agent's logs.
    pub dial_id: i64,
    /// `pending`, `open`, `closing` or `ended` (its outcome is decided, the last data or
    /// close is still being handed over).
    pub state: String,
    /// Server: the frontend it came through (`grpc`, `http-connect`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub frontend: Option<String>,
    /// Server: the client as its listener proved it (certificate names, Unix uid).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client: Option<String>,
    /// The dialed `host:port`.
    pub destination: String,
    pub agent_id: String,
    pub server_id: String,
    /// Server peering, on the client's server: the peer server that holds the agent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub via_server: Option<String>,
    /// Server peering, on the agent's server: the peer server the client is connected to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub from_server: Option<String>,
    pub age_seconds: f64,
    /// Payload bytes received over the tunnel stream (server: from the agent; agent: from
    /// the server).
    pub bytes_received: u64,
    /// Payload bytes sent over the tunnel stream.
    pub bytes_sent: u64,
    /// Bytes this end may still send: the peer's credit, or the local window with an
    /// upstream peer.
    pub credit: u64,
    /// Received bytes queued for the local end (by chunk cost) and that queue's limit.
    pub queued_bytes: u64,
    pub queue_limit: u64,
}

/// `GET /debug/agents`: the tunnel streams of one process and the server membership.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct AgentsReport {
    /// `server` or `agent`: which end answered.
    pub role: String,
    /// The tether release of the end that answered.
    #[serde(default)]
    pub version: String,
    /// Server: its own ID. Agent: empty (each stream names its server).
    pub server_id: String,
    /// Server: `--server-count`. Agent: the last count a server announced.
    pub server_count: u32,
    /// Agent: its own ID. Server: empty (each stream names its agent).
    pub agent_id: String,
    pub streams: Vec<StreamView>,
    /// Server peering: this server's links to its peers, both ways.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub peers: Vec<PeerView>,
    /// The configuration files this process reads while running (agent: its destination
    /// policy), with the generation in force; empty when there are none.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub config_files: Vec<ConfigFileView>,
}

/// One link between two servers of a fleet (server peering).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct PeerView {
    pub peer_server_id: String,
    /// `in`: the peer offers its agents to this server, whose dials go out over it; `out`:
    /// this server offers its agents, and the peer's dials come in over it.
    pub direction: String,
    /// The peer's address as this end sees it.
    pub address: String,
    pub age_seconds: f64,
    /// `in`: the agents the peer announced; `out`: those this server announced.
    pub agents: u64,
    pub pending_dials: u64,
    pub connections: u64,
}

/// A configuration file read while running: the generation in force and the last content
/// refused since start.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ConfigFileView {
    /// What the file is, as its flag says it (`destination-policy`, `routing-config`).
    pub name: String,
    pub path: String,
    /// 1 for the file read at start, one more per applied change.
    pub generation: u64,
    /// The hex SHA-256 of the content in force, as `sha256sum` prints it.
    pub sha256: String,
    /// When the generation in force was applied (RFC 3339, UTC).
    pub applied_at: String,
    /// The last content refused since start (the generation in force stayed); cleared when a
    /// later one applies.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_refusal: Option<RefusalView>,
}

/// A refused configuration content.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct RefusalView {
    /// When it was refused (RFC 3339, UTC).
    pub at: String,
    /// The refused content's SHA-256 (empty when the file could not be read).
    #[serde(default)]
    pub sha256: String,
    /// Why: the file, the line and what is wrong with it.
    pub message: String,
}

/// One agent stream (`AgentService.Connect`), seen from either end.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct StreamView {
    pub agent_id: String,
    pub server_id: String,
    /// Agent: the server's own address the stream was opened to, when the agent discovers
    /// its servers (`--server-discovery`, `--proxy-server-addresses`); `None` through a
    /// balancer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub server_address: Option<String>,
    /// Server peering: the agent is held by this peer server and dialed through it; the
    /// row's figures are this server's own (what it sent through the peer).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub via_server: Option<String>,
    /// Server: distinguishes several streams of one agent ID.
    pub stream_id: u64,
    /// Server: the identifiers the agent advertised, in `--agent-identifiers` syntax.
    pub identifiers: String,
    /// The agent's tether release; `None` for an upstream agent (it announces none).
    #[serde(default)]
    pub agent_version: Option<String>,
    /// The server's tether release; `None` for an upstream server.
    #[serde(default)]
    pub server_version: Option<String>,
    /// What the stream runs on: `grpc` (gRPC over HTTP/2, every upstream peer) or `native`
    /// (tether's native link); empty from an older tether.
    #[serde(default)]
    pub transport: String,
    /// The agent announced DRAIN.
    pub draining: bool,
    /// Server: why a configuration reload ends this stream (its tenant was removed, or its
    /// identity moved to another); it takes no new dial and is closed, with its connections,
    /// when `--graceful-shutdown-timeout` has passed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retiring: Option<String>,
    /// Per-connection credit was negotiated (tether peers); `false` with upstream peers.
    pub credit_flow: bool,
    /// How long the stream has been up.
    pub age_seconds: f64,
    /// Seconds since the last answered HTTP/2 keepalive PING; `None` before the first one or
    /// without keepalive.
    #[serde(default)]
    pub last_ping_seconds: Option<f64>,
    pub pending_dials: u64,
    pub connections: u64,
    pub queued_bytes: u64,
}

/// The query parameters `/debug/connections` filters on; an absent one matches everything.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Filter {
    /// The agent ID, exactly.
    pub agent: Option<String>,
    /// The destination `host:port` exactly, or its host alone.
    pub destination: Option<String>,
    /// Part of the client identity (`CN=kube-apiserver`, `unix uid 0`).
    pub client: Option<String>,
    /// The state, exactly.
    pub state: Option<String>,
}

impl ConnectionsReport {
    /// The connections `filter` selects, oldest first (a stable order keeps `--watch`
    /// readable).
    pub fn new(role: &str, mut connections: Vec<ConnectionView>, filter: &Filter) -> Self {
        connections.retain(|c| filter.matches(c));
        connections.sort_by(|a, b| {
            b.age_seconds
                .total_cmp(&a.age_seconds)
                .then(a.dial_id.cmp(&b.dial_id))
        });
        Self {
            role: role.into(),
            connections,
        }
    }
}

impl Filter {
    /// Reads `agent`, `destination`, `client` and `state` from a raw query string; unknown
    /// keys are an error, so a misspelt filter does not silently match everything.
    pub fn from_query(query: Option<&str>) -> Result<Self, String> {
        let mut filter = Self::default();
        for pair in query.unwrap_or("").split('&').filter(|p| !p.is_empty()) {
            let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
            let value = percent_decode(value)?;
            let slot = match key {
                "agent" => &mut filter.agent,
                "destination" => &mut filter.destination,
                "client" => &mut filter.client,
                "state" => &mut filter.state,
                other => {
                    return Err(format!(
                        "unknown filter {other:?} (expected agent, destination, client or state)"
                    ));
                }
            };
            *slot = Some(value);
        }
        Ok(filter)
    }

    /// The query string for this filter, percent-encoded.
    pub fn to_query(&self) -> String {
        [
            ("agent", &self.agent),
            ("destination", &self.destination),
            ("client", &self.client),
            ("state", &self.state),
        ]
        .iter()
        .filter_map(|(k, v)| v.as_ref().map(|v| format!("{k}={}", percent_encode(v))))
        .collect::<Vec<_>>()
        .join("&")
    }

    pub fn matches(&self, c: &ConnectionView) -> bool {
        let host = destination_host(&c.destination);
        self.agent.as_ref().is_none_or(|a| *a == c.agent_id)
            && self
                .destination
                .as_ref()
                .is_none_or(|d| *d == c.destination || d == host)
            && self.client.as_ref().is_none_or(|w| {
                c.client
                    .as_ref()
                    .is_some_and(|have| have.contains(w.as_str()))
            })
            && self.state.as_ref().is_none_or(|s| *s == c.state)
    }
}

/// `host` of `host:port` or `[v6]:port`.
fn destination_host(address: &str) -> &str {
    if let Some(rest) = address.strip_prefix('[') {
        return rest.split(']').next().unwrap_or(rest);
    }
    match address.rsplit_once(':') {
        Some((host, _)) if !host.contains(':') => host,
        _ => address,
    }
}

fn percent_decode(s: &str) -> Result<String, String> {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'%' => {
                let hex = s
                    .get(i + 1..i + 3)
                    .and_then(|h| u8::from_str_radix(h, 16).ok())
                    .ok_or_else(|| format!("bad percent escape in {s:?}"))?;
                out.push(hex);
                i += 3;
            }
            b'+' => {
                out.push(b' ');
                i += 1;
            }
            b => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8(out).map_err(|_| format!("filter value {s:?} is not UTF-8"))
}

fn percent_encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~:[]".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn conn(agent: &str, destination: &str, client: Option<&str>, state: &str) -> ConnectionView {
        ConnectionView {
            agent_id: agent.into(),
            destination: destination.into(),
            client: client.map(Into::into),
            state: state.into(),
            ..Default::default()
        }
    }

    #[test]
    fn filters_round_trip_and_select() {
        let filter = Filter {
            agent: Some("node 1".into()),
            destination: Some("10.0.0.1".into()),
            client: Some("CN=kube-apiserver".into()),
            state: None,
        };
        let query = filter.to_query();
        assert_eq!(
            query,
            "agent=node%201&destination=10.0.0.1&client=CN%3Dkube-apiserver"
        );
        assert_eq!(Filter::from_query(Some(&query)).unwrap(), filter);

        let c = conn(
            "node 1",
            "10.0.0.1:10250",
            Some("certificate CN=kube-apiserver"),
            "open",
        );
        assert!(filter.matches(&c), "host alone matches host:port");
        assert!(!filter.matches(&conn(
            "node 2",
            "10.0.0.1:10250",
            Some("CN=kube-apiserver"),
            "open"
        )));
        assert!(!filter.matches(&conn(
            "node 1",
            "10.0.0.10:1",
            Some("CN=kube-apiserver"),
            "open"
        )));
        assert!(
            !filter.matches(&conn("node 1", "10.0.0.1:1", None, "open")),
            "no client known"
        );
        assert!(Filter::default().matches(&c));
        let pending = Filter::from_query(Some("state=pending")).unwrap();
        assert!(!pending.matches(&c));
    }

    #[test]
    fn bad_queries_are_errors() {
        assert!(
            Filter::from_query(Some("agnet=a"))
                .unwrap_err()
                .contains("agnet")
        );
        assert!(Filter::from_query(Some("agent=%zz")).is_err());
        assert_eq!(Filter::from_query(None).unwrap(), Filter::default());
    }
}
