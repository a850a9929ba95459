//! gRPC metadata keys. gRPC lower-cases keys on the wire, so these are the only spellings.

/// Agent → server: the agent's ID; exactly one is required.
pub const AGENT_ID: &str = "agentid";
/// Agent → server: URL-query-encoded identifiers (`host=..&ipv4=..&default-route=true`).
pub const AGENT_IDENTIFIERS: &str = "agentidentifiers";
/// Agent → server: `Bearer <token>` when the server authenticates agents by token.
pub const AUTHORIZATION: &str = "authorization";
/// Server → agent response header: the server's ID.
pub const SERVER_ID: &str = "serverid";
/// Server → agent response header: how many servers the agent should connect to.
pub const SERVER_COUNT: &str = "servercount";
/// tether extension, both directions: announces per-connection credit flow control. The value
/// is the initial window in bytes the sender grants for each connection. Present in a request
/// and in its response means both ends use [`crate::Packet::Credit`] on that stream.
pub const TETHER_FLOW: &str = "tether-flow";
/// tether extension, both directions: the sender's tether release (`0.1.0`), for following a
/// fleet through an upgrade or a migration. A tether server counts and lists agents that do
/// not send it as upstream's; upstream peers ignore it, as every unknown key.
pub const TETHER_VERSION: &str = "tether-version";
/// The longest [`TETHER_VERSION`] value taken as one.
const MAX_VERSION_BYTES: usize = 64;

/// Whether a [`TETHER_VERSION`] value looks like a release (`0.1.0-rc.1+abc`): short, of
/// version characters only. It is shown in reports and logs, so nothing else is.
pub fn is_version(value: &str) -> bool {
    !value.is_empty()
        && value.len() <= MAX_VERSION_BYTES
        && value
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b".-+_".contains(&b))
}
/// tether extension, agent → server: the agent's labels (`zone=..,region=..`), read by tether
/// servers for topology-aware routing and ignored by upstream servers.
pub const TETHER_LABELS: &str = "tether-labels";
/// tether extension, both directions: reverse dials (agent → control plane). An agent with a
/// control-plane listener sends it in its request; a tether server that accepts reverse
/// dials on the stream answers with it in its response headers. Only then does either end
/// send the `REVERSE_DIAL_*` packets. The value is the extension's version,
/// [`TETHER_REVERSE_VERSION`].
pub const TETHER_REVERSE: &str = "tether-reverse";
/// The version of the reverse-dial extension this build speaks.
pub const TETHER_REVERSE_VERSION: &str = "1";
/// tether extension, both directions: resumable streams (sessions that outlive their
/// transport). In a request, the agent offers them with [`TETHER_RESUME_VERSION`]; in the
/// response, a server that keeps the stream resumable names its session with a token
/// (32 lower-case hex digits). Only on such a stream are packets numbered and
/// acknowledged (`RESUME_ACK`).
pub const TETHER_RESUME: &str = "tether-resume";
/// The version of the resume extension this build speaks.
pub const TETHER_RESUME_VERSION: &str = "1";
/// tether extension, agent → server: the suspended sessions the agent asks to continue on
/// this stream, as `token:received` pairs separated by commas, where `received` is how many
/// of the server's numbered packets the agent received in that session.
pub const TETHER_RESUME_FROM: &str = "tether-resume-from";
/// tether extension, server → agent: present when the stream continues the session named by
/// the response's [`TETHER_RESUME`] token; the value is how many of the agent's numbered
/// packets the server received in it.
pub const TETHER_RESUMED: &str = "tether-resumed";
