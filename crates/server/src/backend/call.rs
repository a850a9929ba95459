//! An agent's request for a stream, on whichever transport it came: what admission and the
//! resume hand-over read (its metadata, its peer, its connection's keepalive) and how they
//! answer it. gRPC's `AgentService.Connect` is the one kind today.

use std::sync::Arc;

use tether_grpc::server::IncomingCall;
use tether_grpc::{Code, LastPong, PeerIdentity, Status};
use tether_proto::metadata::Metadata;
use tether_tunnel::{Transport, TransportError};

/// An agent's request for a stream.
#[derive(Debug)]
pub(crate) enum AgentCall {
    Grpc {
        call: IncomingCall,
        metadata: Metadata,
    },
}

impl AgentCall {
    pub(crate) fn grpc(call: IncomingCall) -> Self {
        let metadata = tether_grpc::metadata_of(call.metadata());
        Self::Grpc { call, metadata }
    }

    /// Refuses a gRPC call for any method but `AgentService.Connect`.
    pub(crate) fn check_method(&self) -> Result<(), Status> {
        match self {
            Self::Grpc { call, .. } if call.path() != tether_proto::path::CONNECT => {
                Err(Status::new(
                    Code::UNIMPLEMENTED,
                    format!("unknown method {}", call.path()),
                ))
            }
            Self::Grpc { .. } => Ok(()),
        }
    }

    pub(crate) fn metadata(&self) -> &Metadata {
        match self {
            Self::Grpc { metadata, .. } => metadata,
        }
    }

    /// Who made the request, as the listener verified it.
    pub(crate) fn peer(&self) -> &Arc<PeerIdentity> {
        match self {
            Self::Grpc { call, .. } => call.peer(),
        }
    }

    /// When the agent last answered its connection's keepalive.
    pub(crate) fn liveness(&self) -> &Arc<LastPong> {
        match self {
            Self::Grpc { call, .. } => call.last_pong(),
        }
    }

    /// Accepts the request with `answer` (upstream agents need `serverid` and
    /// `servercount` before the first packet).
    pub(crate) fn accept(
        self,
        answer: &[(&'static str, String)],
    ) -> Result<Transport, TransportError> {
        match self {
            Self::Grpc { call, .. } => {
                let (sender, receiver) = call.accept(answer)?;
                Ok(Transport::grpc(sender, receiver))
            }
        }
    }

    /// Refuses the request with `status`.
    pub(crate) fn reject(self, status: &Status) {
        match self {
            Self::Grpc { call, .. } => call.reject(status),
        }
    }
}
