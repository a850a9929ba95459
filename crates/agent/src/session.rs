//! One `AgentService.Connect` stream: the connections a server asked this agent to open.

use std::collections::HashMap;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use bytes::{BufMut, Bytes, BytesMut};
use tether_grpc::{GrpcError, PacketReceiver};
use tether_proto::{ConnectId, DialId, Packet};
use tether_tunnel::{ConnEvent, Flow, Full, Inbound, InboundQueue, Outbound, Overflow, SendWindow};
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::destination::Destinations;
use crate::metrics::AgentMetrics;

/// Largest DATA payload sent to the server.
const MAX_CHUNK: usize = 64 * 1024;

/// A server stream and its connections.
#[derive(Debug)]
pub(crate) struct ServerSession {
    pub(crate) server_id: String,
    flow: Flow,
    outbound: Outbound,
    next_connect_id: AtomicI64,
    tables: Mutex<Tables>,
    metrics: Arc<AgentMetrics>,
    destinations: Arc<Destinations>,
    dial_timeout: Duration,
    /// Connection tasks; the session waits for them when it ends.
    tasks: TaskTracker,
}

#[derive(Debug, Default)]
struct Tables {
    open: bool,
    /// In-flight dials, cancelled by DIAL_CLS.
    dials: HashMap<DialId, CancellationToken>,
    conns: HashMap<ConnectId, Inbound>,
}

impl ServerSession {
    pub(crate) fn new(
        server_id: String,
        flow: Flow,
        outbound: Outbound,
        metrics: Arc<AgentMetrics>,
        destinations: Arc<Destinations>,
        dial_timeout: Duration,
    ) -> Self {
        Self {
            server_id,
            flow,
            outbound,
            next_connect_id: AtomicI64::new(1),
            tables: Mutex::new(Tables {
                open: true,
                ..Tables::default()
            }),
            metrics,
            destinations,
            dial_timeout,
            tasks: TaskTracker::new(),
        }
    }

    fn tables(&self) -> MutexGuard<'_, Tables> {
        self.tables.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn send(&self, packet: Packet) {
        let _ = self.outbound.send(packet);
    }

    /// Tells the server this agent is going away.
    pub(crate) fn drain(&self) {
        self.send(Packet::Drain);
    }

    /// Reads the server's packets until the stream ends; returns why it ended.
    pub(crate) async fn read(self: &Arc<Self>, mut receiver: PacketReceiver) -> String {
        loop {
            match receiver.next().await {
                Some(Ok(packet)) => {
                    self.metrics.packet(false, packet.type_name());
                    if let Some(blocked) = self.handle(packet) {
                        self.unblock(blocked).await;
                    }
                }
                Some(Err(e)) if e.is_bad_packet() => {
                    tracing::warn!(error = %e, "dropping a malformed packet from the server");
                }
                Some(Err(e)) => {
                    self.metrics.stream_error(false, e.code_name());
                    return format!("server stream failed: {e}");
                }
                None => return "server closed the stream".to_owned(),
            }
        }
    }

    /// Handles one packet without waiting; returns data whose connection's queue was full.
    fn handle(self: &Arc<Self>, packet: Packet) -> Option<(ConnectId, Inbound, Bytes)> {
        match packet {
            Packet::DialRequest {
                protocol,
                address,
                random,
            } => self.start_dial(protocol, address, random),
            Packet::Data { connect_id, data } => {
                let t = self.tables();
                let Some(inbound) = t.conns.get(&connect_id) else {
                    drop(t);
                    self.send(Packet::CloseResponse {
                        connect_id,
                        error: Some("unrecognized connectID".into()),
                    });
                    return None;
                };
                if let Err(Full(data)) = inbound.push(data) {
                    return Some((connect_id, inbound.clone(), data));
                }
            }
            Packet::CloseRequest { connect_id } => {
                let known = self
                    .tables()
                    .conns
                    .get(&connect_id)
                    .map(|c| c.close(None))
                    .is_some();
                if !known {
                    self.send(Packet::CloseResponse {
                        connect_id,
                        error: Some("Unknown connectID".into()),
                    });
                }
            }
            Packet::CloseDial { random } => {
                if let Some(cancel) = self.tables().dials.remove(&random) {
                    tracing::debug!(dial.id = %random, "server cancelled the dial");
                    cancel.cancel();
                }
            }
            Packet::Credit { connect_id, bytes } => {
                if let Some(c) = self.tables().conns.get(&connect_id) {
                    c.grant(bytes);
                }
            }
            Packet::DialResponse { .. } | Packet::CloseResponse { .. } | Packet::Drain => {}
        }
        None
    }

    /// Settles data that met a full queue: waits for room where the flow allows it, else
    /// closes that one connection with an error (its relay then reports it in CLOSE_RSP).
    async fn unblock(&self, (connect_id, inbound, data): (ConnectId, Inbound, Bytes)) {
        let overflow = match inbound.wait_for_room(data.len()).await {
            Ok(()) => match inbound.push(data) {
                Ok(()) => return,
                Err(_) => Overflow { limit: 0 },
            },
            Err(overflow) => overflow,
        };
        tracing::warn!(connect.id = %connect_id, %overflow, "closing a connection whose destination stopped taking data");
        if let Some(inbound) = self.tables().conns.remove(&connect_id) {
            inbound.close(Some(overflow.to_string()));
        }
    }

    fn start_dial(self: &Arc<Self>, protocol: String, address: String, random: DialId) {
        let connect_id = ConnectId(self.next_connect_id.fetch_add(1, Ordering::Relaxed));
        let cancel = CancellationToken::new();
        {
            let mut t = self.tables();
            if !t.open {
                return;
            }
            t.dials.insert(random, cancel.clone());
        }
        let session = self.clone();
        self.tasks.spawn(async move {
            session
                .serve_connection(protocol, address, random, connect_id, cancel)
                .await;
        });
    }

    /// Dials, reports the outcome, relays until either side closes, and cleans up.
    async fn serve_connection(
        self: Arc<Self>,
        protocol: String,
        address: String,
        random: DialId,
        connect_id: ConnectId,
        cancel: CancellationToken,
    ) {
        let started = Instant::now();
        let dialed = tokio::select! {
            dialed = self.destinations.dial(&protocol, &address, self.dial_timeout) => Some(dialed),
            () = cancel.cancelled() => None,
        };
        let registered = {
            let mut t = self.tables();
            t.dials.remove(&random);
            t.open
        };
        let stream = match dialed {
            None => {
                self.metrics.dials_cancelled.inc();
                return;
            }
            Some(Err((reason, error))) => {
                tracing::debug!(%address, %error, "dial failed");
                self.metrics.endpoint_dial_failure(reason);
                self.send(Packet::DialResponse {
                    random,
                    result: Err(error),
                });
                return;
            }
            Some(Ok(stream)) if registered => stream,
            Some(Ok(_)) => return,
        };
        self.metrics
            .dial_duration
            .observe(started.elapsed().as_secs_f64());
        let (inbound, queue, window) = self.flow.new_connection();
        self.tables().conns.insert(connect_id, inbound);
        self.metrics.open_endpoint_connections.inc();
        self.send(Packet::DialResponse {
            random,
            result: Ok(connect_id),
        });
        let close_error = self.relay(connect_id, stream, queue, window).await;
        self.tables().conns.remove(&connect_id);
        self.metrics.open_endpoint_connections.dec();
        self.send(Packet::CloseResponse {
            connect_id,
            error: close_error,
        });
    }

    /// Relays between the destination and the server. Returns the error to report in
    /// CLOSE_RSP, `None` for a normal close.
    async fn relay(
        &self,
        connect_id: ConnectId,
        stream: TcpStream,
        mut queue: InboundQueue,
        window: Arc<SendWindow>,
    ) -> Option<String> {
        let (rd, mut wr) = stream.into_split();
        let to_server = async {
            let mut buf = BytesMut::new();
            loop {
                buf.reserve(MAX_CHUNK);
                match rd.try_read_buf(&mut (&mut buf).limit(MAX_CHUNK)) {
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                        // Going idle: let go of the buffer (its rest would stay allocated).
                        buf = BytesMut::new();
                        if let Err(e) = rd.readable().await {
                            return Err(Some(format!("read from destination: {e}")));
                        }
                        continue;
                    }
                    Ok(0) => return Ok(()),
                    Ok(n) => {
                        let cost = window.acquire(n).await.map_err(|_| None)?;
                        let packet = Packet::Data {
                            connect_id,
                            data: tether_tunnel::take_read(&mut buf),
                        };
                        let sent = if self.flow.is_credit() {
                            self.outbound.send(packet)
                        } else {
                            self.outbound.send_releasing(packet, window.clone(), cost)
                        };
                        sent.map_err(|_| None)?;
                    }
                    Err(e) => return Err(Some(format!("read from destination: {e}"))),
                }
            }
        };
        let to_destination = async {
            loop {
                match queue.recv().await {
                    Some(ConnEvent::Data(data)) => {
                        if let Err(e) = wr.write_all(&data).await {
                            return Err(Some(format!("write to destination: {e}")));
                        }
                        if let Some(bytes) = queue.grant_due() {
                            self.send(Packet::Credit { connect_id, bytes });
                        }
                    }
                    Some(ConnEvent::Closed(None)) => return Ok(()),
                    Some(ConnEvent::Closed(Some(e))) => return Err(Some(e)),
                    None => return Err(Some("connection dropped".to_owned())),
                }
            }
        };
        // Whichever side ends first ends the connection: there is no half-close on the wire.
        let outcome: Result<(), Option<String>> = tokio::select! {
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
                    reset_on_close(&stream);
                }
                Some(error.unwrap_or_else(|| "connection closed by server".to_owned()))
            }
        }
    }

    /// The stream ended: cancel dials, end connections with an error, wait for their tasks.
    pub(crate) async fn shut_down(&self, reason: &str) {
        let (dials, conns) = {
            let mut t = self.tables();
            t.open = false;
            (std::mem::take(&mut t.dials), std::mem::take(&mut t.conns))
        };
        for cancel in dials.into_values() {
            cancel.cancel();
        }
        for inbound in conns.into_values() {
            inbound.close(Some(reason.to_owned()));
        }
        self.tasks.close();
        self.tasks.wait().await;
    }
}

/// SO_LINGER 0: the close sends RST. A zero linger never blocks, unlike what tokio's
/// deprecation of `set_linger` warns about.
#[allow(deprecated)]
fn reset_on_close(stream: &TcpStream) {
    let _ = stream.set_linger(Some(Duration::ZERO));
}

/// Runs `session`'s writer until the stream ends. Errors are counted.
pub(crate) async fn write(
    queue: tether_tunnel::writer::OutboundQueue,
    sender: tether_grpc::PacketSender,
    metrics: Arc<AgentMetrics>,
) -> Result<(), GrpcError> {
    let observer = metrics.clone();
    let result = tether_tunnel::run_writer(queue, sender, tether_grpc::Status::ok(), move |p| {
        observer.packet(true, p.type_name());
    })
    .await;
    if let Err(e) = &result {
        metrics.stream_error(true, e.code_name());
    }
    result
}
