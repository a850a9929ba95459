//! A dial a peer server forwarded to one of this server's agents: checked here as for a
//! client of this server (its tenant, destination policy and limits), dialed through the
//! agent, and spliced onto the peer link's connection until either end closes.

use std::sync::Arc;

use tether_proto::Forward;
use tether_tunnel::{IncomingDial, Spliced, splice};

use tether_conn::LogText;

use super::{REFUSED_BY_HOLDER, origin};
use crate::dial::Hub;
use crate::error::DialError;

/// Serves one PEER_DIAL_REQ.
pub(crate) async fn serve(
    incoming: IncomingDial,
    protocol: String,
    address: String,
    forward: Box<Forward>,
    hub: Arc<Hub>,
) {
    let request = match origin::request(&forward.origin, protocol, address, incoming.random()) {
        Ok(request) => request,
        Err(why) => {
            tracing::warn!(peer.server = %LogText(&forward.origin.server_id), dial.id = %incoming.random(), "refusing a forwarded dial: {}", LogText(&why));
            incoming.fail(format!("{REFUSED_BY_HOLDER}{why}"));
            return;
        }
    };
    let dialed = hub
        .dial_forwarded(&request, &forward.agent_id, incoming.abandoned())
        .await;
    let dialed = match dialed {
        Ok(dialed) => dialed,
        Err(error) => {
            let refused = matches!(
                error,
                DialError::NoAgent
                    | DialError::NoTenant(_)
                    | DialError::TenantLimit(_)
                    | DialError::Policy(_)
            );
            incoming.fail(match refused {
                true => format!("{REFUSED_BY_HOLDER}{error}"),
                false => error.to_string(),
            });
            return;
        }
    };
    // `None`: the peer gave up meanwhile; dropping the tunnel closes the agent's connection.
    let Some(answered) = incoming.accept() else {
        return;
    };
    if let Spliced::Answerer(Some(error)) | Spliced::Dialer(Some(error)) =
        splice(answered, dialed.tunnel).await
    {
        tracing::debug!(peer.server = %LogText(&forward.origin.server_id), agent.id = %LogText(&forward.agent_id), %error, "forwarded connection ended with an error");
    }
}
