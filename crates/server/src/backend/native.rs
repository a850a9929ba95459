//! An agent connection that chose the native link (ALPN `tether/1`), or the native link in
//! WebSocket messages (ALPN `http/1.1`): its HELLO (or upgrade) read by the setup deadline,
//! the stream handed to the agent service like a gRPC `Connect` call, and the connection's
//! keepalive for as long as the link lasts.

use std::sync::Arc;

use tether_conn::{Heard, Keepalive, LastPong, PartialMessageBudget, PeerIdentity};
use tether_link::LinkError;
use tether_proto::link;

use super::call::{AgentCall, NativeCall};
use super::service::AgentService;
use crate::limits::SlotAdmission;
use crate::net::Io;

/// What the agent listener gives every native link.
#[derive(Clone, Debug)]
pub(crate) struct NativeSettings {
    pub(crate) keepalive: Option<Keepalive>,
    pub(crate) budget: Option<Arc<PartialMessageBudget>>,
    pub(crate) opening: Opening,
}

/// How the agent opens its link, as TLS chose it.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Opening {
    /// A HELLO frame on TLS.
    Hello,
    /// An HTTP/1.1 WebSocket upgrade whose headers carry the HELLO.
    WebSocket,
}

/// Opens one native link: its HELLO (or upgrade) by the setup deadline, then the agent's
/// call built. Returns what the link runs for the rest of its life: the stream's admission
/// (which hands the stream to its own task) beside the connection's keepalive. Only that is
/// held while the link lasts; the opening's state is gone once this returns.
pub(crate) async fn open(
    service: Arc<AgentService>,
    io: Box<dyn Io>,
    peer: PeerIdentity,
    deadline: tokio::time::Instant,
    admission: SlotAdmission,
    settings: NativeSettings,
) -> Result<impl Future<Output = std::io::Result<()>> + Send + 'static, LinkError> {
    // Every byte read is a sign of the agent's life (see `LastPong::heard`).
    let liveness = Arc::new(LastPong::default());
    let io = Heard::new(io, liveness.clone());
    let (hello, pending) = match settings.opening {
        Opening::Hello => tether_link::read_hello(io, deadline, liveness.clone()).await?,
        Opening::WebSocket => tether_link::read_upgrade(io, deadline, liveness.clone()).await?,
    };
    let handle = pending.handle();
    let call = AgentCall::Native(NativeCall {
        link: pending,
        version: hello.version.min(link::VERSION),
        metadata: hello.metadata,
        peer: Arc::new(peer),
        liveness,
        budget: settings.budget,
    });
    // Boxed, so admission's state is freed once it is done, not held for the link's life.
    let served = Box::pin(service.serve(call, admission));
    let keepalive = settings.keepalive;
    Ok(async move {
        match keepalive {
            Some(keepalive) => {
                tokio::join!(served, handle.keep_alive(keepalive));
            }
            None => {
                served.await;
                handle.ended().await;
            }
        }
        Ok(())
    })
}
