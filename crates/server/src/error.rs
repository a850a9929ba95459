//! Why a dial produced no connection: the vocabulary frontends answer clients with, agent
//! streams count and audit records name. It sits below dialing, so those can name a failure
//! without depending on `dial`.

use tether_proto::DialId;

/// Why a dial did not produce a connection.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum DialError {
    #[error("No agent available")]
    NoAgent,
    /// The agent tried and failed; the text is the agent's dial error.
    #[error("{0}")]
    Endpoint(String),
    #[error("agent disconnected: {0}")]
    AgentGone(String),
    #[error("timed out waiting for backend dial")]
    Timeout,
    #[error("dial closed by agent")]
    DialClosed,
    #[error("dial ID {0} is already pending")]
    Duplicate(DialId),
    #[error("too many pending dials on this agent (limit {0})")]
    TooManyPending(usize),
    #[error("frontend went away")]
    FrontendGone,
    /// The client's identity maps to no tenant (or to several).
    #[error("{0}")]
    NoTenant(String),
    /// The client's tenant is over one of its limits.
    #[error("{0}")]
    TenantLimit(String),
    /// The server's destination policy refused the client's request (`policy: ...`).
    #[error("{0}")]
    Policy(String),
}

impl From<tether_tunnel::DialError> for DialError {
    fn from(e: tether_tunnel::DialError) -> Self {
        use tether_tunnel::DialError as E;
        match e {
            E::Endpoint(text) => Self::Endpoint(text),
            E::StreamLost(reason) => Self::AgentGone(reason),
            E::Timeout => Self::Timeout,
            E::ClosedByPeer => Self::DialClosed,
            E::Duplicate(random) => Self::Duplicate(random),
            E::TooManyPending { limit } => Self::TooManyPending(limit),
        }
    }
}
