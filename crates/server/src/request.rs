//! What the server knows about one dial request, carried from accept to dial, and then
//! followed by its agent stream until the connection ends ([`Requests`]).
//!
//! Agent selection reads it today; destination policy per client, audit records and tenancy
//! key on the same value, so nothing downstream has to reconstruct who asked for what.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tether_grpc::PeerIdentity;
use tether_proto::DialId;

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

/// Server peering: how a request crossed between two servers of the fleet.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Hop {
    /// Dialed through an agent this peer server holds, over the peer link to it.
    Via(Arc<str>),
    /// Forwarded by this peer server, which the client is connected to.
    From(Arc<str>),
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
    /// The name of the tenant whose own frontend the request arrived on; `None` on the main
    /// frontend, where the tenant is resolved from `peer`.
    pub(crate) tenant: Option<Arc<str>>,
    /// Set when the request crossed a peer link, or is about to.
    pub(crate) hop: Option<Hop>,
}

impl RequestContext {
    pub(crate) fn new(
        frontend: FrontendKind,
        peer: Arc<PeerIdentity>,
        protocol: String,
        address: String,
        dial_id: DialId,
        tenant: Option<Arc<str>>,
    ) -> Self {
        Self {
            frontend,
            peer,
            protocol,
            address,
            dial_id,
            tenant,
            hop: None,
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

/// Who asked for each of a stream's dials and connections, by dial ID: the client and
/// frontend introspection shows, and the request, configuration generation and dial latency
/// the audit records carry. Written when a dial starts, when it is answered (only while
/// auditing) and when it ends, never per packet.
#[derive(Debug, Default)]
pub(crate) struct Requests(Mutex<HashMap<DialId, Followed>>);

/// One dial's request, and once answered, how long the agent took.
#[derive(Debug)]
pub(crate) struct Followed {
    pub(crate) request: Arc<RequestContext>,
    pub(crate) latency: Option<Duration>,
    /// The configuration generation in force when the dial started.
    pub(crate) generation: u64,
    /// The connection's opening was recorded (audit): it is recorded once, by whichever of
    /// the dial's answer and the connection's end is seen first.
    pub(crate) opened: bool,
}

impl Requests {
    pub(crate) fn lock(&self) -> MutexGuard<'_, HashMap<DialId, Followed>> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Records `request`, dialed under configuration `generation`, unless its dial ID is
    /// taken (the table then refuses the dial).
    pub(crate) fn insert(&self, request: &RequestContext, generation: u64) -> bool {
        match self.lock().entry(request.dial_id) {
            std::collections::hash_map::Entry::Occupied(_) => false,
            std::collections::hash_map::Entry::Vacant(slot) => {
                slot.insert(Followed {
                    request: Arc::new(request.clone()),
                    latency: None,
                    generation,
                    opened: false,
                });
                true
            }
        }
    }

    /// The agent answered `dial_id` with a connection after `latency`: `open` records its
    /// opening unless its end already did. It runs under the lock, so the opening is
    /// recorded before the end whatever the order the two events are handled in.
    pub(crate) fn answered(
        &self,
        dial_id: DialId,
        latency: Option<Duration>,
        open: impl FnOnce(&Followed),
    ) {
        let mut requests = self.lock();
        if let Some(followed) = requests.get_mut(&dial_id) {
            followed.latency = latency;
            if !std::mem::replace(&mut followed.opened, true) {
                open(followed);
            }
        }
    }

    pub(crate) fn contains(&self, dial_id: DialId) -> bool {
        self.lock().contains_key(&dial_id)
    }

    pub(crate) fn remove(&self, dial_id: DialId) -> Option<Followed> {
        self.lock().remove(&dial_id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_opening_is_recorded_once_and_never_after_the_end() {
        let requests = Requests::default();
        let request = RequestContext::to("10.0.0.5:10250");
        assert!(requests.insert(&request, 4));
        assert!(!requests.insert(&request, 4), "the dial ID is taken");
        let mut opened = Vec::new();
        let latency = Some(Duration::from_millis(3));
        requests.answered(request.dial_id, latency, |f| {
            opened.push((f.generation, f.latency));
        });
        requests.answered(request.dial_id, latency, |_| panic!("opened twice"));
        assert_eq!(opened, [(4, latency)]);
        let ended = requests.remove(request.dial_id).unwrap();
        assert!(ended.opened);
        // The end seen first: the answer, handled later, finds nothing to open.
        assert!(requests.insert(&request, 5));
        assert!(!requests.remove(request.dial_id).unwrap().opened);
        requests.answered(request.dial_id, latency, |_| panic!("opened after its end"));
    }
}
