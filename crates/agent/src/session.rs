//! One `AgentService.Connect` stream: the connections a server asked this agent to open.
//! The stream's state is a [`Link`] (the shared sans-IO table); this module dials and
//! relays what the table asks for.

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::{BufMut, BytesMut};
use tether_grpc::{GrpcError, PacketReceiver, PacketSender};
use tether_proto::Packet;
use tether_tunnel::{
    CloseError, ConnEvent, DialCancel, Direction, Event, Flow, Hooks, IncomingDial, Limits, Link,
    MAX_CHUNK, Role, SessionConfig, Tunnel,
};
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;
use tokio_util::task::TaskTracker;

use crate::audit::{DialFacts, StreamAudit};
use crate::destination::Destinations;
use crate::metrics::{AgentMetrics, DialFailure};

/// A server stream and its connections.
#[derive(Debug)]
pub(crate) struct ServerSession {
    pub(crate) server_id: String,
    pub(crate) link: Arc<Link>,
    pub(crate) connected_at: Instant,
    /// The server connection's keepalive answers, for `/debug/agents`.
    pub(crate) keepalive: Arc<tether_grpc::LastPong>,
    /// Dial-and-relay tasks; the session waits for them when it ends.
    tasks: TaskTracker,
}

impl ServerSession {
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn new(
        agent_id: &str,
        server_id: String,
        flow: Flow,
        metrics: Arc<AgentMetrics>,
        destinations: Arc<Destinations>,
        dial_timeout: Duration,
        keepalive: Arc<tether_grpc::LastPong>,
        audit: Option<Arc<StreamAudit>>,
    ) -> Self {
        let tasks = TaskTracker::new();
        let config = SessionConfig {
            role: Role::Agent,
            flow,
            dial_timeout,
            // The agent answers closes; it never waits for one.
            close_timeout: dial_timeout,
            limits: Limits::default(),
        };
        let hooks = AgentHooks {
            ids: Arc::new(StreamIds {
                agent_id: agent_id.to_owned(),
                server_id: server_id.clone(),
            }),
            metrics,
            destinations,
            tasks: tasks.clone(),
            dial_timeout,
            audit,
        };
        Self {
            server_id,
            link: Link::new(config, hooks),
            connected_at: Instant::now(),
            keepalive,
            tasks,
        }
    }

    /// Tells the server this agent is going away.
    pub(crate) fn drain(&self) {
        self.link.update(|s, _| s.drain());
    }

    /// Whether no connection or dial is left on this stream.
    pub(crate) fn is_idle(&self) -> bool {
        self.link
            .update(|s, _| s.connection_count() == 0 && s.pending_dial_count() == 0)
    }

    /// Runs the stream until it ends or `stop` resolves, then waits for its connections'
    /// tasks (each ends promptly: the table ended their dials and connections). Returns why
    /// the stream ended.
    pub(crate) async fn run(
        &self,
        receiver: PacketReceiver,
        sender: PacketSender,
        stop: impl Future<Output = String>,
    ) -> String {
        let reason = self.link.drive(receiver, sender, stop).await;
        self.tasks.close();
        self.tasks.wait().await;
        reason
    }
}

/// Who is at each end of the stream, for every log line about its connections.
#[derive(Debug)]
struct StreamIds {
    agent_id: String,
    server_id: String,
}

/// The agent's reading of a server stream's events.
#[derive(Debug)]
struct AgentHooks {
    ids: Arc<StreamIds>,
    metrics: Arc<AgentMetrics>,
    destinations: Arc<Destinations>,
    tasks: TaskTracker,
    dial_timeout: Duration,
    audit: Option<Arc<StreamAudit>>,
}

impl Hooks for AgentHooks {
    fn on_event(&self, link: &Arc<Link>, event: Event) {
        match event {
            Event::DialRequested {
                random,
                protocol,
                address,
            } => {
                let dial = link.incoming_dial(random);
                self.tasks.spawn(serve_connection(
                    dial,
                    self.ids.clone(),
                    protocol,
                    address,
                    self.dial_timeout,
                    self.destinations.clone(),
                    self.metrics.clone(),
                    self.audit.clone(),
                ));
            }
            Event::DialCancelled { random, why } => {
                tracing::debug!(
                    dial.id = %random,
                    agent.id = %self.ids.agent_id,
                    server.id = %self.ids.server_id,
                    ?why,
                    "dial no longer wanted"
                );
                if why == DialCancel::ByPeer {
                    self.metrics.dials_cancelled.inc();
                }
            }
            Event::Opened(_) => self.metrics.open_endpoint_connections.inc(),
            Event::Ended(ended) => {
                self.metrics.open_endpoint_connections.dec();
                tether_tunnel::log_ended(&ended, &self.ids.agent_id, &self.ids.server_id);
                if let Some(audit) = &self.audit {
                    audit.ended(ended);
                }
            }
            _ => {}
        }
    }

    fn on_packet(&self, direction: Direction, packet: &Packet) {
        self.metrics.packet(direction == Direction::Out, packet);
    }

    fn on_bad_packet(&self, error: &GrpcError) {
        tracing::debug!(%error, "dropping a malformed packet from the server");
    }

    fn on_stream_error(&self, direction: Direction, error: &GrpcError) {
        self.metrics
            .stream_error(direction == Direction::Out, error.code_name());
    }
}

/// Dials, reports the outcome, and relays until either side closes.
#[allow(clippy::too_many_arguments)]
async fn serve_connection(
    incoming: IncomingDial,
    ids: Arc<StreamIds>,
    protocol: String,
    address: String,
    timeout: Duration,
    destinations: Arc<Destinations>,
    metrics: Arc<AgentMetrics>,
    audit: Option<Arc<StreamAudit>>,
) {
    let started = Instant::now();
    let mut facts = DialFacts {
        dial_id: incoming.random(),
        requested: address,
        dialed: None,
        latency: None,
    };
    let dialed = tokio::select! {
        dialed = destinations.dial(&protocol, &facts.requested, timeout) => dialed,
        () = incoming.abandoned() => return,
    };
    facts.latency = Some(started.elapsed());
    let stream = match dialed {
        Ok(stream) => stream,
        Err((reason, error)) => {
            tracing::info!(
                dial.id = %incoming.random(),
                agent.id = %ids.agent_id,
                server.id = %ids.server_id,
                address = %facts.requested,
                %error,
                "dial failed"
            );
            metrics.endpoint_dial_failure(reason);
            if let Some(audit) = &audit {
                audit.dial_ended(&facts, reason == DialFailure::Policy, &error);
            }
            incoming.fail(error);
            return;
        }
    };
    // `None`: cancelled or timed out meanwhile; dropping the socket closes it.
    let Some(mut tunnel) = incoming.accept() else {
        return;
    };
    metrics
        .dial_duration
        .observe(started.elapsed().as_secs_f64());
    if let Some(audit) = &audit {
        facts.dialed = stream.peer_addr().ok().map(|a| a.to_string());
        audit.connected(tunnel.connect_id(), facts);
    }
    let outcome = relay(&mut tunnel, stream).await;
    tunnel.finish(outcome);
}

/// Relays between the destination and the server. Returns the error to report in
/// CLOSE_RSP, `None` for a normal close.
async fn relay(tunnel: &mut Tunnel, stream: TcpStream) -> Option<CloseError> {
    let (rd, mut wr) = stream.into_split();
    let Tunnel { up, down, .. } = tunnel;
    let to_server = async {
        let mut buf = BytesMut::new();
        loop {
            buf.reserve(MAX_CHUNK);
            match rd.try_read_buf(&mut (&mut buf).limit(MAX_CHUNK)) {
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                    // Going idle: let go of the buffer (its rest would stay allocated).
                    buf = BytesMut::new();
                    if let Err(e) = rd.readable().await {
                        return Err(CloseError::Local(format!("read from destination: {e}")));
                    }
                }
                Ok(0) => return Ok(()),
                Ok(_) => {
                    if up.send(tether_tunnel::take_read(&mut buf)).await.is_err() {
                        // Closing from the server's side: the other half delivers what is
                        // left and the close itself.
                        std::future::pending::<()>().await;
                    }
                }
                Err(e) => return Err(CloseError::Local(format!("read from destination: {e}"))),
            }
        }
    };
    let to_destination = async {
        loop {
            match down.recv().await {
                ConnEvent::Data(data) => {
                    if let Err(e) = wr.write_all(&data).await {
                        return Err(CloseError::Local(format!("write to destination: {e}")));
                    }
                    down.consumed();
                }
                ConnEvent::Closed(None) => return Ok(()),
                ConnEvent::Closed(Some(e)) => return Err(e),
            }
        }
    };
    // Whichever side ends first ends the connection: there is no half-close on the wire.
    let outcome = tokio::select! {
        r = to_server => r,
        r = to_destination => r,
    };
    match outcome {
        Ok(()) => {
            let _ = wr.shutdown().await;
            None
        }
        Err(error) => {
            // Make the destination see the failure too, rather than a clean end.
            if let Ok(stream) = rd.reunite(wr) {
                tether_tunnel::reset_on_close(&stream);
            }
            Some(error)
        }
    }
}
