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
pub const MAX_VERSION_BYTES: usize = 64;

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

/// A stream's metadata, whatever transport carries it (gRPC headers today). Keys are lower
/// case; a key may repeat, and admission counts repeats (one `agentid`, not two).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Metadata(Vec<(String, bytes::Bytes)>);

impl Metadata {
    /// Adds a value for `key`, after any it already has.
    pub fn push(&mut self, key: &str, value: impl Into<bytes::Bytes>) {
        self.0.push((key.to_ascii_lowercase(), value.into()));
    }

    /// Every value of `key`, in order.
    pub fn get_all<'a>(&'a self, key: &'a str) -> impl Iterator<Item = &'a [u8]> + 'a {
        self.0
            .iter()
            .filter(move |(k, _)| k == key)
            .map(|(_, v)| v.as_ref())
    }

    /// Every pair, in order.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &[u8])> {
        self.0.iter().map(|(k, v)| (k.as_str(), v.as_ref()))
    }

    /// The first value of `key`, when it is [`text`].
    pub fn get(&self, key: &str) -> Option<&str> {
        self.0
            .iter()
            .find(|(k, _)| k == key)
            .and_then(|(_, v)| text(v))
    }
}

impl<'a> FromIterator<(&'a str, bytes::Bytes)> for Metadata {
    fn from_iter<I: IntoIterator<Item = (&'a str, bytes::Bytes)>>(pairs: I) -> Self {
        let mut metadata = Self::default();
        for (key, value) in pairs {
            metadata.push(key, value);
        }
        metadata
    }
}

/// `value` as text under HTTP header values' rule, visible ASCII and tab only; `None`
/// otherwise (the "not text" refusals).
pub fn text(value: &[u8]) -> Option<&str> {
    value
        .iter()
        .all(|&b| b == b'\t' || (0x20..0x7f).contains(&b))
        .then(|| std::str::from_utf8(value).ok())
        .flatten()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metadata_keeps_repeats_in_order_and_reads_text_only() {
        let mut m = Metadata::default();
        m.push("AgentID", "a");
        m.push("agentid", "b");
        m.push("tether-labels", &b"zone=\x01"[..]);
        assert_eq!(m.get_all(AGENT_ID).collect::<Vec<_>>(), [b"a", b"b"]);
        assert_eq!(m.get(AGENT_ID), Some("a"));
        assert_eq!(m.get(TETHER_LABELS), None, "a control byte is not text");
        assert_eq!(m.get(SERVER_ID), None);
        assert_eq!(text(b"Bearer x\ty"), Some("Bearer x\ty"));
        assert_eq!(text("é".as_bytes()), None);
    }
}
