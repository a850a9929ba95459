//! HTTP/2 PING as a connection's keepalive: [`tether_conn::keep_alive`] over h2's ping-pong.

use std::sync::Arc;

use tether_conn::{Keepalive, KeepaliveEnd, LastPong, Pinger};

use crate::error::GrpcError;

struct H2Pinger(h2::PingPong);

impl Pinger for H2Pinger {
    type Error = h2::Error;

    async fn ping(&mut self) -> Result<(), h2::Error> {
        self.0.ping(h2::Ping::opaque()).await.map(|_pong| ())
    }
}

/// PINGs the connection until a PING goes unanswered; the error says why.
pub(crate) async fn keep_alive(
    ping_pong: h2::PingPong,
    keepalive: Keepalive,
    last_pong: Arc<LastPong>,
) -> GrpcError {
    match tether_conn::keep_alive(H2Pinger(ping_pong), keepalive, last_pong).await {
        KeepaliveEnd::Failed(e) => GrpcError::H2(e),
        KeepaliveEnd::Unanswered(timeout) => GrpcError::PeerUnresponsive(timeout),
    }
}
