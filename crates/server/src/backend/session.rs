//! One agent stream on the server: its pending dials and established connections.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

use bytes::Bytes;
use tether_observe::metrics::Gauge;
use tether_proto::{ConnectId, DialId, Identifiers, Packet};
use tether_tunnel::flow::WindowClosed;
use tether_tunnel::{
    ConnEvent, Flow, Full, Inbound, InboundQueue, Outbound, Overflow, QueueObserver, SendWindow,
};
use tokio::sync::oneshot;

use super::registry::Backend;
use crate::dial::DialError;
use crate::metrics::{DialFailure, ServerMetrics};

/// Largest DATA payload sent to an agent; also the frontends' read size.
pub(crate) const MAX_CHUNK: usize = 64 * 1024;

/// What a pending dial receives when the agent answers.
pub(crate) type DialReply = Result<(ConnectId, InboundQueue, Arc<SendWindow>), DialError>;

#[derive(Debug)]
struct PendingDial {
    reply: oneshot::Sender<DialReply>,
    started: Instant,
}

#[derive(Debug, Default)]
struct Tables {
    /// False once the stream ended: nothing new may be added.
    open: bool,
    pending: HashMap<DialId, PendingDial>,
    conns: HashMap<ConnectId, Inbound>,
}

/// Data that met a full connection queue, held by the stream reader until it is settled.
#[derive(Debug)]
pub(crate) struct Blocked {
    id: ConnectId,
    inbound: Inbound,
    data: Bytes,
}

/// A connected agent stream.
#[derive(Debug)]
pub(crate) struct AgentSession {
    pub(crate) agent_id: String,
    pub(crate) stream_id: u64,
    pub(crate) identifiers: Identifiers,
    pub(crate) flow: Flow,
    pub(crate) outbound: Outbound,
    draining: AtomicBool,
    tables: Mutex<Tables>,
    metrics: Arc<ServerMetrics>,
    /// This agent's series of `tether_server_agent_pending_dials`.
    pending_gauge: Arc<Gauge>,
    /// This agent's series of `tether_server_agent_queued_bytes`, fed by every connection.
    queued_gauge: Arc<Gauge>,
}

impl Backend for Arc<AgentSession> {
    fn agent_id(&self) -> &str {
        &self.agent_id
    }
    fn stream_id(&self) -> u64 {
        self.stream_id
    }
    fn is_draining(&self) -> bool {
        self.draining.load(Ordering::Acquire)
    }
}

impl AgentSession {
    pub(crate) fn new(
        agent_id: String,
        stream_id: u64,
        identifiers: Identifiers,
        flow: Flow,
        outbound: Outbound,
        metrics: Arc<ServerMetrics>,
    ) -> Self {
        Self {
            pending_gauge: metrics.agent_pending_dials.with(&[&agent_id]),
            queued_gauge: metrics.agent_queued_bytes.with(&[&agent_id]),
            agent_id,
            stream_id,
            identifiers,
            flow,
            outbound,
            draining: AtomicBool::new(false),
            tables: Mutex::new(Tables {
                open: true,
                ..Tables::default()
            }),
            metrics,
        }
    }

    fn tables(&self) -> MutexGuard<'_, Tables> {
        // A panic while holding this lock is a bug elsewhere; the tables stay consistent
        // because every critical section is a single map operation.
        self.tables.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(crate) fn set_draining(&self) {
        self.draining.store(true, Ordering::Release);
    }

    /// Registers a dial awaiting this agent's answer.
    pub(crate) fn add_pending(
        &self,
        random: DialId,
        reply: oneshot::Sender<DialReply>,
    ) -> Result<(), DialError> {
        let mut t = self.tables();
        if !t.open {
            return Err(DialError::AgentGone("agent disconnected".into()));
        }
        if t.pending.contains_key(&random) {
            return Err(DialError::Duplicate(random));
        }
        t.pending.insert(
            random,
            PendingDial {
                reply,
                started: Instant::now(),
            },
        );
        self.metrics.pending_dials.inc();
        self.pending_gauge.inc();
        Ok(())
    }

    /// Withdraws a pending dial (timeout or frontend gone). False if the agent's answer
    /// already claimed it.
    pub(crate) fn remove_pending(&self, random: DialId) -> bool {
        let removed = self.tables().pending.remove(&random).is_some();
        if removed {
            self.metrics.pending_dials.dec();
            self.pending_gauge.dec();
        }
        removed
    }

    fn take_pending(&self, random: DialId) -> Option<PendingDial> {
        let taken = self.tables().pending.remove(&random);
        if taken.is_some() {
            self.metrics.pending_dials.dec();
            self.pending_gauge.dec();
        }
        taken
    }

    /// Forgets a connection. Returns its inbound handle if it was still known.
    pub(crate) fn remove_conn(&self, id: ConnectId) -> Option<Inbound> {
        let removed = self.tables().conns.remove(&id);
        if removed.is_some() {
            self.metrics.established.dec();
        }
        removed
    }

    /// Handles one packet from the agent without waiting. Returns data whose connection's
    /// queue was full; the reader settles it with [`unblock`](Self::unblock).
    #[must_use]
    pub(crate) fn handle(&self, packet: Packet) -> Option<Blocked> {
        match packet {
            Packet::DialResponse { random, result } => self.on_dial_response(random, result),
            Packet::Data { connect_id, data } => return self.on_data(connect_id, data),
            Packet::CloseResponse { connect_id, error } => {
                if let Some(inbound) = self.remove_conn(connect_id) {
                    inbound.close(error);
                } else {
                    tracing::debug!(agent.id = %self.agent_id, connect.id = %connect_id, "close response for an unknown connection");
                }
            }
            Packet::CloseDial { random } => {
                if let Some(p) = self.take_pending(random) {
                    self.metrics.dial_failure(DialFailure::BackendClose);
                    let _ = p.reply.send(Err(DialError::DialClosed));
                }
            }
            Packet::Drain => {
                tracing::info!(agent.id = %self.agent_id, "agent is draining");
                self.set_draining();
            }
            Packet::Credit { connect_id, bytes } => {
                if let Some(inbound) = self.tables().conns.get(&connect_id) {
                    inbound.grant(bytes);
                }
            }
            other @ (Packet::DialRequest { .. } | Packet::CloseRequest { .. }) => {
                tracing::warn!(agent.id = %self.agent_id, packet = other.type_name(), "ignoring a packet agents do not send");
            }
        }
        None
    }

    fn on_dial_response(&self, random: DialId, result: Result<ConnectId, String>) {
        let Some(pending) = self.take_pending(random) else {
            // The dialer gave up (timeout or frontend gone): close what the agent opened.
            self.metrics.dial_failure(DialFailure::UnrecognizedResponse);
            if let Ok(id) = result {
                let _ = self.outbound.send(Packet::CloseRequest { connect_id: id });
            }
            return;
        };
        self.metrics
            .dial_duration
            .observe(pending.started.elapsed().as_secs_f64());
        let id = match result {
            Ok(id) => id,
            Err(error) => {
                self.metrics.dial_failure(DialFailure::ErrorResponse);
                let _ = pending.reply.send(Err(DialError::Endpoint(error)));
                return;
            }
        };
        let queued = self.queued_gauge.clone();
        let observer: QueueObserver = Arc::new(move |delta| queued.add(delta));
        let (inbound, queue, window) = self.flow.new_observed_connection(Some(observer));
        {
            let mut t = self.tables();
            if t.conns.insert(id, inbound).is_some() {
                tracing::warn!(agent.id = %self.agent_id, connect.id = %id, "agent reused a live connectID; the older connection is dropped");
                self.metrics.established.dec();
            }
        }
        self.metrics.established.inc();
        if pending.reply.send(Ok((id, queue, window))).is_err() {
            self.metrics.dial_failure(DialFailure::FrontendClose);
            self.remove_conn(id);
            let _ = self.outbound.send(Packet::CloseRequest { connect_id: id });
        }
    }

    fn on_data(&self, id: ConnectId, data: Bytes) -> Option<Blocked> {
        let t = self.tables();
        let Some(inbound) = t.conns.get(&id) else {
            drop(t);
            // Upstream's answer to data for an unknown connection.
            let _ = self.outbound.send(Packet::CloseRequest { connect_id: id });
            return None;
        };
        match inbound.push(data) {
            Ok(()) => None,
            Err(Full(data)) => Some(Blocked {
                id,
                inbound: inbound.clone(),
                data,
            }),
        }
    }

    /// Settles data that found its connection's queue full: waits for room where the flow
    /// allows it, else closes that one connection with an error.
    pub(crate) async fn unblock(&self, blocked: Blocked) {
        let Blocked { id, inbound, data } = blocked;
        let overflow = match inbound.wait_for_room(data.len()).await {
            Ok(()) => match inbound.push(data) {
                Ok(()) => return,
                Err(_) => Overflow { limit: 0 },
            },
            Err(overflow) => overflow,
        };
        tracing::warn!(agent.id = %self.agent_id, connect.id = %id, %overflow, "closing a connection whose reader stopped taking data");
        self.metrics.overflow_closes.inc();
        if let Some(inbound) = self.remove_conn(id) {
            inbound.close(Some(overflow.to_string()));
        }
        let _ = self.outbound.send(Packet::CloseRequest { connect_id: id });
    }

    /// The stream ended: fail every pending dial and end every connection with an error, so
    /// no frontend waits for a timeout or mistakes the loss for a normal close.
    pub(crate) fn shut_down(&self, reason: &str) {
        let (pending, conns) = {
            let mut t = self.tables();
            t.open = false;
            (std::mem::take(&mut t.pending), std::mem::take(&mut t.conns))
        };
        for (_, p) in pending {
            self.metrics.pending_dials.dec();
            self.pending_gauge.dec();
            self.metrics.dial_failure(DialFailure::BackendClose);
            let _ = p.reply.send(Err(DialError::AgentGone(reason.to_owned())));
        }
        for (_, inbound) in conns {
            self.metrics.established.dec();
            inbound.close(Some(reason.to_owned()));
        }
    }
}

/// A frontend's handle on one established connection through an agent, in two halves that
/// can be driven concurrently: [`TunnelUp`] toward the agent, [`TunnelDown`] from it.
///
/// Dropping it before the agent closed the connection sends CLOSE_REQ, so a frontend that
/// goes away for any reason releases the agent side too.
#[derive(Debug)]
pub(crate) struct ServerTunnel {
    pub(crate) up: TunnelUp,
    pub(crate) down: TunnelDown,
    established_at: Instant,
}

/// Frontend → agent half.
#[derive(Debug)]
pub(crate) struct TunnelUp {
    session: Arc<AgentSession>,
    connect_id: ConnectId,
    window: Arc<SendWindow>,
    close_requested: AtomicBool,
}

/// Agent → frontend half.
#[derive(Debug)]
pub(crate) struct TunnelDown {
    session: Arc<AgentSession>,
    connect_id: ConnectId,
    queue: InboundQueue,
    closed: bool,
}

impl ServerTunnel {
    pub(crate) fn new(
        session: Arc<AgentSession>,
        (connect_id, queue, window): (ConnectId, InboundQueue, Arc<SendWindow>),
    ) -> Self {
        Self {
            up: TunnelUp {
                session: session.clone(),
                connect_id,
                window,
                close_requested: AtomicBool::new(false),
            },
            down: TunnelDown {
                session,
                connect_id,
                queue,
                closed: false,
            },
            established_at: Instant::now(),
        }
    }

    pub(crate) fn connect_id(&self) -> ConnectId {
        self.up.connect_id
    }
}

impl Drop for ServerTunnel {
    fn drop(&mut self) {
        if !self.down.closed {
            self.up.close_request();
            self.up.session.remove_conn(self.up.connect_id);
        }
        self.up
            .session
            .metrics
            .connection_duration
            .observe(self.established_at.elapsed().as_secs_f64());
    }
}

impl TunnelUp {
    /// Sends data to the agent, waiting for this connection's window only. `Err` once the
    /// connection is closed.
    pub(crate) async fn send(&self, mut data: Bytes) -> Result<(), WindowClosed> {
        while !data.is_empty() {
            let chunk = data.split_to(data.len().min(MAX_CHUNK));
            let cost = self.window.acquire(chunk.len()).await?;
            let packet = Packet::Data {
                connect_id: self.connect_id,
                data: chunk,
            };
            let outbound = &self.session.outbound;
            let sent = if self.session.flow.is_credit() {
                outbound.send(packet)
            } else {
                outbound.send_releasing(packet, self.window.clone(), cost)
            };
            sent.map_err(|_| WindowClosed)?;
        }
        Ok(())
    }

    /// Asks the agent to close; its CLOSE_RSP arrives as [`ConnEvent::Closed`]. Idempotent.
    pub(crate) fn close_request(&self) {
        if !self.close_requested.swap(true, Ordering::AcqRel) {
            let _ = self.session.outbound.send(Packet::CloseRequest {
                connect_id: self.connect_id,
            });
        }
    }
}

impl TunnelDown {
    /// Next event from the agent. A vanished queue counts as an abnormal close. Cancel-safe.
    pub(crate) async fn recv(&mut self) -> ConnEvent {
        let event = self
            .queue
            .recv()
            .await
            .unwrap_or_else(|| ConnEvent::Closed(Some("connection dropped by server".into())));
        self.closed |= matches!(event, ConnEvent::Closed(_));
        event
    }

    /// An event if one is waiting.
    pub(crate) fn try_recv(&mut self) -> Option<ConnEvent> {
        let event = self.queue.try_recv()?;
        self.closed |= matches!(event, ConnEvent::Closed(_));
        Some(event)
    }

    /// Call after writing to the frontend: returns credit to a tether agent once a batch
    /// was taken.
    pub(crate) fn grant_credit(&mut self) {
        if let Some(bytes) = self.queue.grant_due() {
            let _ = self.session.outbound.send(Packet::Credit {
                connect_id: self.connect_id,
                bytes,
            });
        }
    }
}
