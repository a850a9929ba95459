//! Dialing through an agent: choosing one, waiting for its answer, bounding the wait.

use std::future::Future;
use std::sync::{Arc, Mutex, MutexGuard};

use tether_proto::DialId;
use tether_tunnel::{Abandoned, Tunnel};

use crate::audit::Audit;
use crate::backend::registry::Registry;
use crate::backend::session::AgentSession;
use crate::metrics::{DialFailure, ServerMetrics};
use crate::request::RequestContext;

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

/// State shared by every frontend and agent stream of one server.
#[derive(Debug)]
pub(crate) struct Hub {
    registry: Mutex<Registry<Arc<AgentSession>>>,
    pub(crate) metrics: Arc<ServerMetrics>,
    /// Set when the audit log is on.
    pub(crate) audit: Option<Arc<Audit>>,
}

impl Hub {
    pub(crate) fn new(
        registry: Registry<Arc<AgentSession>>,
        metrics: Arc<ServerMetrics>,
        audit: Option<Arc<Audit>>,
    ) -> Self {
        Self {
            registry: Mutex::new(registry),
            metrics,
            audit,
        }
    }

    /// Records a dial the frontend refused before asking any agent.
    pub(crate) fn refused(&self, request: &RequestContext, reason: &str) {
        if let Some(audit) = &self.audit {
            audit.refused(request, reason);
        }
    }

    pub(crate) fn registry(&self) -> MutexGuard<'_, Registry<Arc<AgentSession>>> {
        self.registry.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Publishes registry-derived gauges after a change.
    pub(crate) fn refresh_backend_gauges(&self) {
        let registry = self.registry();
        self.metrics
            .ready_backend_connections
            .set(registry.agent_count() as i64);
        for (strategy, keys) in registry.key_counts() {
            self.metrics.set_ready_backends(strategy.as_str(), keys);
        }
    }

    /// Dials `address` through an agent. Returns when the agent answered, the dial deadline
    /// (the agent stream's table holds it) passed, or `frontend_gone` resolved; in the last
    /// case the agent is told to stop dialing, or to close what it already opened.
    pub(crate) async fn dial(
        &self,
        request: &RequestContext,
        frontend_gone: impl Future<Output = ()>,
    ) -> Result<Tunnel, DialError> {
        let Some(session) = self.registry().select(request) else {
            self.metrics.dial_failure(DialFailure::NoAgent);
            self.refused(request, &DialError::NoAgent.to_string());
            return Err(DialError::NoAgent);
        };
        let random = request.dial_id;
        tracing::debug!(
            agent.id = %session.agent_id,
            dial.id = %random,
            address = %request.address,
            frontend = request.frontend.as_str(),
            peer = %request.peer.principal(),
            "dialing"
        );
        // Counted (and its client recorded) before DIAL_REQ leaves: the answer's hook may
        // run before this returns.
        self.metrics.pending_dials.inc();
        session.pending_gauge.inc();
        let recorded = session.requests.insert(request);
        if let Some(audit) = &session.audit {
            audit.dialing(request);
        }
        let mut pending =
            match session
                .link
                .dial(random, request.protocol.clone(), request.address.clone())
            {
                Ok(pending) => pending,
                Err(e) => {
                    if recorded {
                        session.requests.remove(random);
                    }
                    self.metrics.pending_dials.dec();
                    session.pending_gauge.dec();
                    if let tether_tunnel::DialError::StreamLost(_) = e {
                        self.metrics.dial_failure(DialFailure::SendRsp);
                    }
                    let error = DialError::from(e);
                    if let Some(audit) = &session.audit {
                        audit.unanswered(random, &error.to_string());
                    }
                    return Err(error);
                }
            };
        tokio::select! {
            answer = pending.answer() => answer.map_err(DialError::from),
            () = frontend_gone => {
                match pending.abandon() {
                    Abandoned::Pending => {
                        session.requests.remove(random);
                        self.metrics.pending_dials.dec();
                        session.pending_gauge.dec();
                        self.metrics.dial_failure(DialFailure::FrontendClose);
                        if let Some(audit) = &session.audit {
                            audit.unanswered(random, &DialError::FrontendGone.to_string());
                        }
                    }
                    Abandoned::Answered => self.metrics.dial_failure(DialFailure::FrontendClose),
                    Abandoned::Nothing => {}
                }
                Err(DialError::FrontendGone)
            }
        }
    }
}
