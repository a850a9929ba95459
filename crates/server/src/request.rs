//! What the server knows about one dial request, carried from accept to dial.
//!
//! Agent selection reads it today; destination policy per client, audit records and tenancy
//! key on the same value, so nothing downstream has to reconstruct who asked for what.

use std::sync::Arc;

use tether_grpc::PeerIdentity;
use tether_proto::DialId;

use crate::tenant::Tenant;

/// Which frontend a request came through.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum FrontendKind {
    Grpc,
    HttpConnect,
}

impl FrontendKind {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Self::Grpc => "grpc",
            Self::HttpConnect => "http-connect",
        }
    }
}

/// One dial request: the frontend and transport it arrived on, the peer as the listener
/// proved it (certificate names or Unix credentials), and what it asked for.
#[derive(Clone, Debug)]
pub(crate) struct RequestContext {
    pub(crate) frontend: FrontendKind,
    pub(crate) peer: Arc<PeerIdentity>,
    pub(crate) protocol: String,
    /// The requested `host:port`, already checked by the frontend.
    pub(crate) address: String,
    pub(crate) dial_id: DialId,
    /// The tenant whose own frontend the request arrived on; `None` on the main frontend,
    /// where the tenant is resolved from `peer`.
    pub(crate) tenant: Option<Arc<Tenant>>,
}

impl RequestContext {
    pub(crate) fn new(
        frontend: FrontendKind,
        peer: Arc<PeerIdentity>,
        protocol: String,
        address: String,
        dial_id: DialId,
        tenant: Option<Arc<Tenant>>,
    ) -> Self {
        Self {
            frontend,
            peer,
            protocol,
            address,
            dial_id,
            tenant,
        }
    }

    /// A request from a peer that proved nothing, for tests of selection.
    #[cfg(test)]
    pub(crate) fn to(address: &str) -> Self {
        Self::new(
            FrontendKind::Grpc,
            Arc::new(PeerIdentity::unknown()),
            "tcp".into(),
            address.into(),
            DialId(1),
            None,
        )
    }
}
