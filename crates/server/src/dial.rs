//! Dialing through an agent: choosing one, waiting for its answer, bounding the wait.

use std::future::Future;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tether_proto::{DialId, Packet};
use tokio::sync::oneshot;

use crate::backend::registry::Registry;
use crate::backend::session::{AgentSession, ServerTunnel};
use crate::metrics::{DialFailure, ServerMetrics};

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
    #[error("frontend went away")]
    FrontendGone,
}

/// State shared by every frontend and agent stream of one server.
#[derive(Debug)]
pub(crate) struct Hub {
    registry: Mutex<Registry<Arc<AgentSession>>>,
    pub(crate) metrics: Arc<ServerMetrics>,
    dial_timeout: Duration,
}

impl Hub {
    pub(crate) fn new(
        registry: Registry<Arc<AgentSession>>,
        metrics: Arc<ServerMetrics>,
        dial_timeout: Duration,
    ) -> Self {
        Self {
            registry: Mutex::new(registry),
            metrics,
            dial_timeout,
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
    /// passed, or `frontend_gone` resolved; in the last two cases the agent is told to stop
    /// dialing (DIAL_CLS), and a late answer is cleaned up by the session.
    pub(crate) async fn dial(
        &self,
        protocol: String,
        address: String,
        random: DialId,
        frontend_gone: impl Future<Output = ()>,
    ) -> Result<ServerTunnel, DialError> {
        let Some(session) = self.registry().select(&address) else {
            self.metrics.dial_failure(DialFailure::NoAgent);
            return Err(DialError::NoAgent);
        };
        let (reply_tx, reply_rx) = oneshot::channel();
        session.add_pending(random, reply_tx)?;
        tracing::debug!(agent.id = %session.agent_id, dial.id = %random, %address, "dialing");
        let request = Packet::DialRequest {
            protocol,
            address,
            random,
        };
        if session.outbound.send(request).is_err() {
            session.remove_pending(random);
            self.metrics.dial_failure(DialFailure::SendRsp);
            return Err(DialError::AgentGone("agent stream closed".into()));
        }
        let mut reply_rx = reply_rx;
        let outcome = tokio::select! {
            reply = &mut reply_rx => reply.unwrap_or_else(|_| Err(DialError::AgentGone("agent stream closed".into()))),
            () = tokio::time::sleep(self.dial_timeout) => Err(DialError::Timeout),
            () = frontend_gone => Err(DialError::FrontendGone),
        };
        match outcome {
            Ok(parts) => Ok(ServerTunnel::new(session, parts)),
            Err(e @ (DialError::Timeout | DialError::FrontendGone)) => {
                if session.remove_pending(random) {
                    self.metrics.dial_failure(match e {
                        DialError::Timeout => DialFailure::BackendDialTimeout,
                        _ => DialFailure::FrontendClose,
                    });
                    let _ = session.outbound.send(Packet::CloseDial { random });
                } else if let Ok(Ok(parts)) = reply_rx.try_recv() {
                    // The answer won the race: dropping the tunnel closes it at the agent.
                    drop(ServerTunnel::new(session, parts));
                }
                Err(e)
            }
            Err(e) => Err(e),
        }
    }
}
