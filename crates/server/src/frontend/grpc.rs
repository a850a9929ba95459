//! The gRPC frontend: `ProxyService.Proxy`, one tunnelled connection per stream.

use std::pin::pin;
use std::sync::Arc;
use std::time::Duration;
use tether_observe::time::monotonic_now;

use tether_grpc::server::IncomingCall;
use tether_grpc::{Code, GrpcError, PacketReceiver, PacketSender, PeerIdentity, Status};
use tether_proto::{ConnectId, Packet};
use tether_tunnel::{ConnEvent, Tunnel, TunnelDown, TunnelUp};
use tracing::Instrument as _;

use super::log_span;
use crate::byte_rate::ByteRate;
use crate::dial::{Dialed, Hub};
use crate::error::DialError;
use crate::limits::{Limit, LimitMetrics};
use crate::metrics::{Initiator, Segment};
use crate::request::{FrontendKind, RequestContext};

/// How long to wait, after the last packet, for the client to end the stream. Go clients
/// act on the last packet and then close; ending the call first would race with that.
const LINGER: Duration = Duration::from_secs(10);
/// Largest batch of DATA written to the client in one flush.
const BATCH_BYTES: usize = 256 * 1024;

/// Serves one call on the frontend listener, its log lines in its connection span.
/// `first_packet_timeout` bounds the wait for the DIAL_REQ.
///
/// Not an `async fn`, and the stream's halves are borrowed by what serves them: an async fn
/// keeps room for each argument for its whole life beside the copy its body moves on, and a
/// call's state passed down three levels cost 1.9 KB per tunnelled connection.
pub(crate) fn serve(
    hub: Arc<Hub>,
    limits: LimitMetrics,
    first_packet_timeout: Duration,
    tenant: Option<Arc<str>>,
    call: IncomingCall,
) -> impl Future<Output = ()> + Send + 'static {
    let accepted = if call.path() != tether_proto::path::PROXY {
        let path = call.path().to_owned();
        call.reject(&Status::new(
            Code::UNIMPLEMENTED,
            format!("unknown method {path}"),
        ));
        None
    } else {
        let peer = call.peer().clone();
        match call.accept(&[]) {
            Ok((tx, rx)) => Some((peer, tx, rx)),
            Err(e) => {
                tracing::debug!(error = %e, "could not answer proxy stream");
                None
            }
        }
    };
    async move {
        let Some((peer, mut tx, mut rx)) = accepted else {
            return;
        };
        let gauge = hub.metrics.grpc_stream("Proxy");
        gauge.inc();
        let span = log_span::connection(&hub.server_id);
        async {
            let served = proxy(
                &hub,
                &limits,
                first_packet_timeout,
                (peer, tenant),
                &mut tx,
                &mut rx,
            )
            .await;
            let status = match served {
                Ok(Some(status)) => finish_after_client(tx, rx, &status).await,
                Ok(None) => Ok(()),
                Err(e) => Err(e),
            };
            if let Err(e) = status {
                tracing::debug!(error = %e, "proxy stream ended with an error");
                hub.metrics
                    .stream_error(Segment::ToClient, e.code_name(), "Unknown");
            }
        }
        .instrument(span)
        .await;
        gauge.dec();
    }
}

/// Serves the call's dial and its connection; `Some(status)`: end the call with it once the
/// client ended its side, `None`: the client is gone.
async fn proxy(
    hub: &Hub,
    limits: &LimitMetrics,
    first_packet_timeout: Duration,
    (peer, tenant): (Arc<PeerIdentity>, Option<Arc<str>>),
    tx: &mut PacketSender,
    rx: &mut PacketReceiver,
) -> Result<Option<Status>, GrpcError> {
    // Wait for the dial request. Upstream answers stray packets before it this way too. One
    // deadline for all of them: stray packets do not buy the client more time.
    let first_packet_deadline = tokio::time::Instant::now() + first_packet_timeout;
    let (protocol, address, random) = loop {
        let next = tokio::time::timeout_at(first_packet_deadline, rx.next()).await;
        let Ok(Some(next)) = next else {
            return Ok(None);
        };
        match next {
            Ok(packet) => {
                hub.metrics.packet(Segment::FromClient, &packet);
                match packet {
                    Packet::DialRequest {
                        protocol,
                        address,
                        random,
                    } => break (protocol, address, random),
                    Packet::Data { connect_id, .. } => {
                        let reply = close_response(connect_id, Some("backend not initialized"));
                        send(hub, tx, &reply).await?;
                        return Ok(Some(Status::ok()));
                    }
                    Packet::CloseRequest { connect_id } => {
                        let reply = close_response(connect_id, Some("backend uninitialized"));
                        send(hub, tx, &reply).await?;
                    }
                    _ => {}
                }
            }
            Err(e) if e.is_bad_packet() => {
                tracing::debug!(error = %e, "dropping a malformed packet")
            }
            Err(_) => return Ok(None),
        }
    };

    log_span::record_dial(random);
    let request = RequestContext::new(FrontendKind::Grpc, peer, protocol, address, random, tenant);
    if let Err(error) = super::address::check_dial_address(&request.address) {
        limits.hit(Limit::BadDialAddress);
        hub.refused(&request, None, &error);
        let reply = Packet::DialResponse {
            random,
            result: Err(error),
        };
        send(hub, tx, &reply).await?;
        return Ok(Some(Status::ok()));
    }

    // Dial, while watching the client for DIAL_CLS or a vanished stream.
    let frontend_gone = async {
        loop {
            match rx.next().await {
                Some(Ok(Packet::CloseDial { .. })) | Some(Err(_)) | None => return,
                Some(Ok(_)) => {}
            }
        }
    };
    // Boxed: the dial's state is the largest this call ever holds, and only for the dial;
    // inline, a connection would keep room for it for its whole life.
    let dialed = Box::pin(hub.dial(&request, frontend_gone)).await;
    let (mut tunnel, byte_rate) = match dialed {
        Ok(Dialed { tunnel, byte_rate }) => (tunnel, byte_rate),
        Err(DialError::FrontendGone) => return Ok(None),
        Err(DialError::DialClosed) => {
            send(hub, tx, &Packet::CloseDial { random }).await?;
            return Ok(Some(Status::ok()));
        }
        Err(e) => {
            let reply = Packet::DialResponse {
                random,
                result: Err(e.to_string()),
            };
            send(hub, tx, &reply).await?;
            return Ok(Some(Status::ok()));
        }
    };
    let id = tunnel.connect_id();
    log_span::record_connection(id);
    let reply = Packet::DialResponse {
        random,
        result: Ok(id),
    };
    send(hub, tx, &reply).await?;
    relay(hub, &mut tunnel, tx, rx, (id, byte_rate.as_deref())).await
}

/// Why the client → agent direction stopped.
enum ClientSide {
    Gone,
    CloseRequested,
    AgentClosed,
    Mismatch(ConnectId),
}

/// Relays until the connection ends; the status to end the call with, as [`proxy`].
async fn relay(
    hub: &Hub,
    tunnel: &mut Tunnel,
    tx: &mut PacketSender,
    rx: &mut PacketReceiver,
    (id, byte_rate): (ConnectId, Option<&ByteRate>),
) -> Result<Option<Status>, GrpcError> {
    let (initiator, closed) = {
        let Tunnel { up, down, .. } = tunnel;
        let mut to_agent = pin!(client_to_agent(hub, up, rx, (id, byte_rate)));
        let mut to_client = pin!(agent_to_client(hub, down, tx, (id, byte_rate)));
        tokio::select! {
            closed = &mut to_client => (Initiator::Agent, closed?),
            side = &mut to_agent => match side {
                ClientSide::Gone => {
                    hub.metrics.connection_closed(Initiator::Client, true);
                    return Ok(None);
                }
                ClientSide::Mismatch(other) => {
                    up.close_request();
                    (Initiator::Client, Some(format!("mismatched connection IDs {id} and {other}")))
                }
                ClientSide::CloseRequested | ClientSide::AgentClosed => {
                    let initiator = match side {
                        ClientSide::CloseRequested => Initiator::Client,
                        _ => Initiator::Agent,
                    };
                    // The agent's CLOSE_RSP, or the table's close deadline, ends it.
                    (initiator, to_client.await?)
                }
            },
        }
    };
    hub.metrics.connection_closed(initiator, closed.is_some());
    let status = match &closed {
        None => Status::ok(),
        Some(error) => Status::new(Code::UNAVAILABLE, error.clone()),
    };
    send(hub, tx, &close_response(id, closed.as_deref())).await?;
    Ok(Some(status))
}

/// Lets the client end the stream first (bounded by [`LINGER`]), then ends the call. A
/// client that reset the stream (as `tether dial` does once it has its answer) is gone, and
/// trailers to it would only fail: the call is over, with nothing to report.
async fn finish_after_client(
    tx: PacketSender,
    mut rx: PacketReceiver,
    status: &Status,
) -> Result<(), GrpcError> {
    let client_reset = tokio::time::timeout(LINGER, async {
        loop {
            match rx.next().await {
                None => return false,
                Some(Err(e)) if !e.is_bad_packet() => return true,
                Some(_) => {}
            }
        }
    })
    .await
    .unwrap_or(false);
    if client_reset {
        return Ok(());
    }
    tx.finish(status)
}

async fn client_to_agent(
    hub: &Hub,
    up: &TunnelUp,
    rx: &mut PacketReceiver,
    (id, byte_rate): (ConnectId, Option<&ByteRate>),
) -> ClientSide {
    loop {
        match rx.next().await {
            Some(Ok(packet)) => {
                hub.metrics.packet(Segment::FromClient, &packet);
                match packet {
                    Packet::Data { connect_id, data } if connect_id == id => {
                        let len = data.len();
                        let sent = up.send(data).await;
                        if sent.is_err() {
                            return ClientSide::AgentClosed;
                        }
                        // Over the tenant's rate: read no more from the client until the
                        // bucket refills.
                        if let Some(rate) = byte_rate {
                            rate.take(len).await;
                        }
                    }
                    Packet::Data { connect_id, .. } => return ClientSide::Mismatch(connect_id),
                    Packet::CloseRequest { .. } => {
                        up.close_request();
                        return ClientSide::CloseRequested;
                    }
                    _ => {}
                }
            }
            Some(Err(e)) if e.is_bad_packet() => {
                tracing::debug!(error = %e, "dropping a malformed packet");
            }
            Some(Err(_)) | None => return ClientSide::Gone,
        }
    }
}

/// Forwards agent data to the client until the connection closes; returns the close error.
async fn agent_to_client(
    hub: &Hub,
    down: &mut TunnelDown,
    tx: &mut PacketSender,
    (id, byte_rate): (ConnectId, Option<&ByteRate>),
) -> Result<Option<String>, GrpcError> {
    loop {
        let mut event = Some(down.recv().await);
        let mut closed = None;
        let mut batch = 0;
        while let Some(e) = event.take() {
            match e {
                ConnEvent::Data(data) => {
                    batch += data.len();
                    let packet = Packet::Data {
                        connect_id: id,
                        data,
                    };
                    tx.buffer(&packet);
                    hub.metrics.packet(Segment::ToClient, &packet);
                    if tx.buffered() < BATCH_BYTES {
                        event = down.try_recv();
                    }
                }
                ConnEvent::Closed(error) => closed = Some(error.map(|e| e.to_string())),
            }
        }
        let started = monotonic_now();
        tx.flush().await?;
        hub.metrics
            .frontend_write_duration
            .observe(started.elapsed().as_secs_f64());
        // Over the tenant's rate: return the agent's credit only once the bucket refills.
        if let Some(rate) = byte_rate {
            rate.take(batch).await;
        }
        down.consumed();
        if let Some(error) = closed {
            return Ok(error);
        }
    }
}

fn close_response(connect_id: ConnectId, error: Option<&str>) -> Packet {
    Packet::CloseResponse {
        connect_id,
        error: error.map(str::to_owned),
    }
}

async fn send(hub: &Hub, tx: &mut PacketSender, packet: &Packet) -> Result<(), GrpcError> {
    hub.metrics.packet(Segment::ToClient, packet);
    tx.send(packet).await
}
