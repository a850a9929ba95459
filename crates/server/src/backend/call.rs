//! An agent's request for a stream, on whichever transport it came: what admission and the
//! resume hand-over read (its metadata, its peer, its connection's keepalive) and how they
//! answer it. Two kinds: gRPC's `AgentService.Connect`, and the native link's HELLO.

use std::sync::Arc;

use tether_conn::{Heard, PartialMessageBudget};
use tether_grpc::server::IncomingCall;
use tether_grpc::{Code, LastPong, PeerIdentity, Status};
use tether_link::PendingLink;
use tether_proto::link::Hello;
use tether_proto::metadata::Metadata;
use tether_tunnel::{Transport, TransportError};

use crate::net::Io;

/// The byte stream under a native link on the agent port: TLS, its reads stamped as signs
/// of the agent's life.
pub(crate) type NativeIo = Heard<Box<dyn Io>>;

/// An agent's request for a stream.
#[derive(Debug)]
pub(crate) enum AgentCall {
    Grpc {
        call: IncomingCall,
        metadata: Metadata,
    },
    Native(NativeCall),
}

/// A native link's HELLO, read and not yet answered.
#[derive(Debug)]
pub(crate) struct NativeCall {
    pub(crate) link: PendingLink<NativeIo>,
    /// The version the link runs at: the agent's, or this server's if lower.
    pub(crate) version: u8,
    pub(crate) metadata: Metadata,
    pub(crate) peer: Arc<PeerIdentity>,
    pub(crate) liveness: Arc<LastPong>,
    /// The listener's budget for large incomplete frames.
    pub(crate) budget: Option<Arc<PartialMessageBudget>>,
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
            Self::Grpc { .. } | Self::Native(_) => Ok(()),
        }
    }

    pub(crate) fn metadata(&self) -> &Metadata {
        match self {
            Self::Grpc { metadata, .. } => metadata,
            Self::Native(native) => &native.metadata,
        }
    }

    /// Who made the request, as the listener verified it.
    pub(crate) fn peer(&self) -> &Arc<PeerIdentity> {
        match self {
            Self::Grpc { call, .. } => call.peer(),
            Self::Native(native) => &native.peer,
        }
    }

    /// When the agent last answered its connection's keepalive.
    pub(crate) fn liveness(&self) -> &Arc<LastPong> {
        match self {
            Self::Grpc { call, .. } => call.last_pong(),
            Self::Native(native) => &native.liveness,
        }
    }

    /// Which transport the stream runs on, for logs and the debug views.
    pub(crate) fn transport_name(&self) -> &'static str {
        match self {
            Self::Grpc { .. } => "grpc",
            Self::Native(native) => native.link.transport_name(),
        }
    }

    /// Accepts the request with `answer` (upstream agents need `serverid` and
    /// `servercount` before the first packet).
    pub(crate) async fn accept(
        self,
        answer: &[(&'static str, String)],
    ) -> Result<Transport, TransportError> {
        match self {
            Self::Grpc { call, .. } => {
                let (sender, receiver) = call.accept(answer)?;
                Ok(Transport::grpc(sender, receiver))
            }
            Self::Native(native) => {
                let hello = Hello {
                    version: native.version,
                    capabilities: Vec::new(),
                    metadata: answer
                        .iter()
                        .map(|(key, value)| (*key, bytes::Bytes::from(value.clone())))
                        .collect(),
                };
                // Boxed, as below: the futures awaiting these hold only a pointer, so a stream's
                // task does not carry the native link's handshake state for its whole life.
                let link = Box::pin(native.link.accept(&hello, native.budget)).await?;
                Ok(Transport::native(link.reader, link.writer))
            }
        }
    }

    /// Refuses the request with `status`.
    pub(crate) async fn reject(self, status: &Status) {
        match self {
            Self::Grpc { call, .. } => call.reject(status),
            Self::Native(native) => {
                Box::pin(native.link.refuse(status.code, &status.message)).await;
            }
        }
    }
}
