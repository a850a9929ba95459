//! What a dial can be routed to: a stream one of this server's agents holds, or (server
//! peering) an agent a peer server holds.

use std::sync::Arc;
use std::time::Instant;

use super::registry::Backend;
use super::remote::RemoteAgent;
use super::selection::Candidate;
use super::session::AgentSession;

#[derive(Clone, Debug)]
pub(crate) enum Route {
    Local(Arc<AgentSession>),
    Remote(Arc<RemoteAgent>),
}

impl Route {
    /// The stream, when it is this server's own.
    pub(crate) fn local(&self) -> Option<&Arc<AgentSession>> {
        match self {
            Self::Local(session) => Some(session),
            Self::Remote(_) => None,
        }
    }

    /// The agent, when a peer server holds it.
    pub(crate) fn remote(&self) -> Option<&Arc<RemoteAgent>> {
        match self {
            Self::Local(_) => None,
            Self::Remote(remote) => Some(remote),
        }
    }
}

impl Backend for Route {
    fn agent_id(&self) -> &str {
        match self {
            Self::Local(s) => s.agent_id(),
            Self::Remote(r) => r.agent_id(),
        }
    }
    fn stream_id(&self) -> u64 {
        match self {
            Self::Local(s) => s.stream_id(),
            Self::Remote(r) => r.stream_id(),
        }
    }
    fn is_draining(&self) -> bool {
        match self {
            Self::Local(s) => Backend::is_draining(s),
            Self::Remote(r) => r.is_draining(),
        }
    }
    fn is_tether(&self) -> bool {
        match self {
            Self::Local(s) => s.is_tether(),
            Self::Remote(r) => r.is_tether(),
        }
    }
    fn is_local(&self) -> bool {
        matches!(self, Self::Local(_))
    }
    fn candidate(&self, now: Instant) -> Candidate<'_> {
        match self {
            Self::Local(s) => s.candidate(now),
            Self::Remote(r) => r.candidate(now),
        }
    }
    fn mark_picked(&self, seq: u64) {
        match self {
            Self::Local(s) => s.mark_picked(seq),
            Self::Remote(r) => r.mark_picked(seq),
        }
    }
}
