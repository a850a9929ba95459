//! The table of one multiplexed stream: pending dials, established connections, the packets
//! to send, and the deadlines, driven by explicit calls and answering with [`Event`]s.

use std::collections::{HashMap, VecDeque};
use std::time::{Duration, Instant};

use bytes::Bytes;
use tether_proto::{ConnectId, DialId, Forward, Packet, PeerAgents};

use crate::conn::{Conn, Owner};
use crate::fair::{self, FairQueue};
use crate::flow::{Flow, chunk_cost};
use crate::outcome::{CloseError, DialCancel, DialError, Ended, Initiator, Outcome};
use crate::outgoing::Outgoing;
use crate::resume::{Replay, Replayed, ResumeError, data_len};
use crate::timers::{Timer, Timers};

/// Which end of the stream this table is.
///
/// A dial's two ends are its *dialer* (sends the dial request, closes with CLOSE_REQ and
/// hears CLOSE_RSP) and its *answerer* (dials the destination, allocates the connection ID,
/// answers CLOSE_REQ with CLOSE_RSP). Forward dials are the server's; reverse dials (a
/// tether extension, toward the control plane) are the agent's, on their own packet types
/// and with negative connection IDs, so one table holds both without ambiguity.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    /// The proxy server: dialer of forward dials (DIAL_REQ out, DIAL_RSP in), answerer of
    /// reverse ones (REVERSE_DIAL_REQ in, REVERSE_DIAL_RSP out).
    Server,
    /// The agent: answerer of forward dials, dialer of reverse ones.
    Agent,
}

/// Bounds that keep one peer from growing the table without limit.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    /// Dials pending at once on this stream (server: awaiting the agent; agent: dialing).
    pub max_pending_dials: usize,
    /// Packets for unknown connections or dials the peer may send over the stream's life;
    /// past it the stream is a [`Violation`]. Races after a close produce a few; a flood is
    /// an attack or a broken peer.
    pub max_unknown_packets: u64,
    /// Replies to the peer's packets that may wait unsent because the peer does not read.
    pub max_reply_backlog: usize,
    /// Longest error text kept from the peer (DIAL_RSP, CLOSE_RSP), in bytes.
    pub max_error_text: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_pending_dials: 4096,
            max_unknown_packets: 10_000,
            max_reply_backlog: 4096,
            max_error_text: 1024,
        }
    }
}

#[derive(Clone, Copy, Debug)]
pub struct SessionConfig {
    pub role: Role,
    pub flow: Flow,
    /// As dialer: how long a dial waits for the peer's answer. As answerer: how long
    /// dialing a destination may take before the table answers with a timeout.
    pub dial_timeout: Duration,
    /// As dialer: how long, after a local close, the peer's CLOSE_RSP may take.
    pub close_timeout: Duration,
    pub limits: Limits,
    /// Both ends announced `tether-resume`: packets are numbered and logged until
    /// acknowledged, so the session can [`suspend`](Session::suspend) when its transport
    /// breaks and [`resume`](Session::resume) on a new one.
    pub resumable: bool,
    /// A peer link between two servers of one fleet: the agent side announces its agents
    /// (PEER_AGENTS) and answers dials forwarded to them (PEER_DIAL_REQ); an agent stream
    /// ignores both.
    pub peering: bool,
}

/// The peer broke the protocol badly enough that the stream must end.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Violation {
    TooManyUnknown {
        limit: u64,
    },
    ReplyBacklog {
        limit: usize,
    },
    /// A RESUME_ACK for packets never written, or going back.
    BadAck {
        received: u64,
    },
}

impl std::fmt::Display for Violation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::TooManyUnknown { limit } => write!(
                f,
                "peer sent more than {limit} packets for unknown connections or dials"
            ),
            Self::ReplyBacklog { limit } => write!(
                f,
                "peer left more than {limit} replies unread (it does not read its stream)"
            ),
            Self::BadAck { received } => write!(
                f,
                "peer acknowledged {received} packets, which is not what this end wrote"
            ),
        }
    }
}

impl std::error::Error for Violation {}

/// What the driver must act on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Event {
    /// Dialer: the dial's answer can be taken with [`Session::take_dial`]. `latency` is set
    /// when the agent answered; `result` names the connection it opened (for records that
    /// follow the connection, such as audit) or why there is none.
    DialSettled {
        random: DialId,
        latency: Option<Duration>,
        result: Result<ConnectId, DialError>,
    },
    /// Dialer: the peer answered a dial nobody waits for (any connection it opened is
    /// being closed).
    StrayDialResponse {
        random: DialId,
    },
    /// Answerer: dial `address`, then report with [`Session::dial_succeeded`] or
    /// [`Session::dial_failed`]. On the server this is a reverse dial (an empty `address`
    /// asks for its default control-plane endpoint).
    DialRequested {
        random: DialId,
        protocol: String,
        address: String,
        /// On a peer link: the agent to dial through, and who asked.
        forward: Option<Box<Forward>>,
    },
    /// Answerer: stop dialing; any answer is no longer wanted.
    DialCancelled {
        random: DialId,
        why: DialCancel,
    },
    /// A connection was established (counted until its [`Event::Ended`]).
    Opened(ConnectId),
    /// The connection's owner may [`recv`](Session::recv) again.
    Readable(ConnectId),
    /// The connection's owner may [`send_data`](Session::send_data) again.
    Writable(ConnectId),
    Ended(Ended),
    /// The writer may [`poll_transmit`](Session::poll_transmit) again.
    Transmit,
    /// The parked packet was settled: the reader may hand over the next one.
    Unparked,
    /// The agent announced it is going away (server role).
    PeerDraining,
    /// A peer server's agents joined, changed or left (server role, on a peer link).
    PeerAgents(Box<PeerAgents>),
    /// The earliest deadline moved earlier: re-arm the timer.
    TimerChanged,
    /// A packet this role never receives; ignored.
    Ignored {
        packet: &'static str,
    },
}

/// Where a connection is in its life.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ConnState {
    Open,
    /// A close was asked for (server: CLOSE_REQ sent; agent: CLOSE_REQ received).
    Closing,
    /// Its outcome is decided; its owner may still be taking the last data or the close.
    Ended,
}

impl ConnState {
    /// The name introspection shows.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Open => "open",
            Self::Closing => "closing",
            Self::Ended => "ended",
        }
    }
}

/// One connection as [`Session::connections`] sees it.
#[derive(Clone, Debug)]
pub struct ConnInfo {
    pub id: ConnectId,
    /// The dial that opened it (the DIAL_REQ's `random`).
    pub dial_id: DialId,
    /// The `host:port` it was dialed to.
    pub address: String,
    pub state: ConnState,
    /// A local owner holds it.
    pub attached: bool,
    /// Inbound bytes queued (by chunk cost) and the queue's limit.
    pub queued: usize,
    pub limit: usize,
    /// Bytes this end may still send.
    pub window: u64,
    pub bytes_from_peer: u64,
    pub bytes_to_peer: u64,
    pub opened_at: Instant,
}

/// One dial as [`Session::pending_dials`] sees it.
#[derive(Clone, Debug)]
pub struct PendingDialInfo {
    pub dial_id: DialId,
    pub address: String,
    pub started: Instant,
}

/// What [`Session::recv`] found.
#[derive(Debug, PartialEq, Eq)]
pub enum Recv {
    Data(Bytes),
    /// The connection ended; `None` for a normal close. Nothing follows.
    Closed(Option<CloseError>),
    /// Nothing yet: [`Event::Readable`] follows.
    Empty,
}

/// Why [`Session::send_data`] did not queue the data.
#[derive(Debug, PartialEq, Eq)]
pub enum SendError {
    /// No window: [`Event::Writable`] follows. The data is handed back.
    Blocked(Bytes),
    /// The connection is closing or gone.
    Closed,
}

/// What [`Session::abandon_dial`] found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Abandoned {
    /// Still waiting for the agent: DIAL_CLS is sent.
    Pending,
    /// The agent had answered with a connection: it is closed.
    Answered,
    /// Already failed, or unknown.
    Nothing,
}

/// A dial this end opened (server: forward; agent: reverse).
#[derive(Debug)]
enum OutDial {
    Pending {
        started: Instant,
        deadline: Instant,
        address: String,
    },
    Settled(Result<ConnectId, DialError>),
}

/// A dial the peer asked this end to make (agent: forward; server: reverse).
#[derive(Debug)]
struct InDial {
    started: Instant,
    deadline: Instant,
    address: String,
}

/// DATA that met a full connection queue from a peer without credit: the reader holds it
/// (and reads nothing else) until the connection makes room or stalls.
#[derive(Debug)]
struct Parked {
    id: ConnectId,
    data: Bytes,
    deadline: Instant,
}

/// One stream's dials and connections. Does no I/O, spawns nothing, reads no clock.
#[derive(Debug)]
pub struct Session {
    cfg: SessionConfig,
    /// `Some(reason)` once the stream ended.
    closed: Option<String>,
    dials_out: HashMap<DialId, OutDial>,
    dials_in: HashMap<DialId, InDial>,
    conns: HashMap<ConnectId, Conn>,
    /// The last connection ID this end allocated as an answerer (counting away from 0).
    last_connect_id: i64,
    /// Packets for the writer, served by deficit round robin across connections.
    outbox: FairQueue,
    transmit_waiting: bool,
    replies_queued: usize,
    unknown_packets: u64,
    violation: Option<Violation>,
    parked: Option<Parked>,
    /// Payload bytes queued inbound over all connections.
    queued: usize,
    timers: Timers,
    events: VecDeque<Event>,
    peer_draining: bool,
    /// Agent: this end announced it is going away (DRAIN sent).
    draining: bool,
    /// Numbering, acknowledgements and the replay log, on a resumable session.
    replay: Option<Replay>,
    /// Suspended: the transport is gone and the session waits for a new one until then.
    suspended: Option<Instant>,
}

impl Session {
    pub fn new(cfg: SessionConfig) -> Self {
        Self {
            cfg,
            closed: None,
            dials_out: HashMap::new(),
            dials_in: HashMap::new(),
            conns: HashMap::new(),
            last_connect_id: 0,
            outbox: FairQueue::default(),
            transmit_waiting: false,
            replies_queued: 0,
            unknown_packets: 0,
            violation: None,
            parked: None,
            queued: 0,
            timers: Timers::default(),
            events: VecDeque::new(),
            peer_draining: false,
            draining: false,
            replay: cfg.resumable.then(Replay::default),
            suspended: None,
        }
    }

    pub fn role(&self) -> Role {
        self.cfg.role
    }

    pub fn flow(&self) -> Flow {
        self.cfg.flow
    }

    pub fn is_open(&self) -> bool {
        self.closed.is_none()
    }

    pub fn peer_draining(&self) -> bool {
        self.peer_draining
    }

    /// The next thing the driver must act on.
    pub fn poll_event(&mut self) -> Option<Event> {
        self.events.pop_front()
    }

    /// When [`handle_timeout`](Self::handle_timeout) is next due.
    pub fn next_timeout(&self) -> Option<Instant> {
        self.timers.next()
    }

    /// The reader holds a packet the table could not take yet: hand over nothing more
    /// until [`Event::Unparked`].
    pub fn is_parked(&self) -> bool {
        self.parked.is_some()
    }

    /// Connections in the table, including those closing.
    pub fn connection_count(&self) -> usize {
        self.conns.len()
    }

    /// Dials awaiting the peer's answer or being dialed here.
    pub fn pending_dial_count(&self) -> usize {
        self.dials_out
            .values()
            .filter(|d| matches!(d, OutDial::Pending { .. }))
            .count()
            + self.dials_in.len()
    }

    /// Inbound payload queued over all connections (by [`chunk_cost`]).
    pub fn queued_bytes(&self) -> usize {
        self.queued
    }

    /// A snapshot of every connection, for introspection and invariant checks.
    pub fn connections(&self) -> impl Iterator<Item = ConnInfo> + '_ {
        self.conns.iter().map(|(id, c)| ConnInfo {
            id: *id,
            dial_id: c.dial_id,
            address: c.address.clone(),
            state: if c.ended {
                ConnState::Ended
            } else if c.closing.is_some() || c.close_requested {
                ConnState::Closing
            } else {
                ConnState::Open
            },
            attached: c.owner == Owner::Attached,
            queued: c.queued,
            limit: c.limit,
            window: c.window,
            bytes_from_peer: c.bytes_from_peer,
            bytes_to_peer: c.bytes_to_peer,
            opened_at: c.opened_at,
        })
    }

    /// A snapshot of the dials not answered yet by the peer or still being dialed here.
    pub fn pending_dials(&self) -> Vec<PendingDialInfo> {
        let out = self.dials_out.iter().filter_map(|(random, d)| match d {
            OutDial::Pending {
                started, address, ..
            } => Some(PendingDialInfo {
                dial_id: *random,
                address: address.clone(),
                started: *started,
            }),
            OutDial::Settled(_) => None,
        });
        let dialing = self.dials_in.iter().map(|(random, d)| PendingDialInfo {
            dial_id: *random,
            address: d.address.clone(),
            started: d.started,
        });
        out.chain(dialing).collect()
    }

    /// Packets waiting for the writer.
    pub fn outbox_len(&self) -> usize {
        self.outbox.len()
    }

    // ---- resuming on a new transport ---------------------------------------------------

    pub fn is_resumable(&self) -> bool {
        self.replay.is_some() && self.closed.is_none()
    }

    pub fn is_suspended(&self) -> bool {
        self.suspended.is_some() && self.closed.is_none()
    }

    /// What this end tells the peer when resuming: how many of its packets arrived here.
    pub fn resume_point(&self) -> Option<u64> {
        self.replay.as_ref().map(Replay::received)
    }

    /// DATA payload bytes and packets kept until the peer acknowledges them.
    pub fn replay_log(&self) -> (usize, usize) {
        self.replay
            .as_ref()
            .map_or((0, 0), |r| (r.log_bytes(), r.log_len()))
    }

    /// The transport broke. A resumable session keeps every dial and connection as it is
    /// (owners see only a pause: their queues drain, their windows fill) for at most
    /// `window`; then [`handle_timeout`](Self::handle_timeout) ends it as
    /// [`close_stream`](Self::close_stream) would. False (nothing changed) if the session
    /// is not resumable, or the agent announced it is going away (DRAIN, either end's
    /// view): then a break is most likely its exit, and the caller closes the session.
    pub fn suspend(&mut self, now: Instant, window: Duration) -> bool {
        if !self.is_resumable() || self.peer_draining || self.draining {
            return false;
        }
        if self.suspended.is_none() {
            let deadline = now + window;
            self.suspended = Some(deadline);
            self.arm(deadline, Timer::Resume);
        }
        true
    }

    /// Whether [`resume`](Self::resume) with `peer_received` would succeed, asked before
    /// giving up a transport that still works for one that may not.
    pub fn can_resume(&self, peer_received: u64) -> Result<(), ResumeError> {
        if self.closed.is_some() {
            return Err(ResumeError::NotResumable);
        }
        let replay = self.replay.as_ref().ok_or(ResumeError::NotResumable)?;
        replay.can_resume(peer_received)
    }

    /// The session continues on a new transport, whose peer received `peer_received` of
    /// this end's packets: the rest of the log is written again, first.
    pub fn resume(&mut self, peer_received: u64) -> Result<Replayed, ResumeError> {
        if self.closed.is_some() {
            return Err(ResumeError::NotResumable);
        }
        let replay = self.replay.as_mut().ok_or(ResumeError::NotResumable)?;
        let replayed = replay.resume(peer_received)?;
        self.suspended = None;
        Ok(replayed)
    }

    /// A message from the peer did not decode. It still counts as received: the peer
    /// numbered it.
    pub fn count_undecodable(&mut self) {
        if let Some(replay) = &mut self.replay {
            replay.on_received(0);
        }
    }

    // ---- the peer's packets ------------------------------------------------------------

    /// Takes one packet from the peer. Must not be called while [`is_parked`](Self::is_parked).
    pub fn handle_packet(&mut self, now: Instant, packet: Packet) -> Result<(), Violation> {
        debug_assert!(self.parked.is_none(), "a packet handed over while parked");
        if self.closed.is_some() {
            return Ok(());
        }
        if let Packet::ResumeAck { received } = packet {
            return match &mut self.replay {
                Some(replay) => match replay.on_ack(received) {
                    true => Ok(()),
                    false => Err(Violation::BadAck { received }),
                },
                None => {
                    self.events.push_back(Event::Ignored {
                        packet: "RESUME_ACK",
                    });
                    Ok(())
                }
            };
        }
        if let Some(replay) = &mut self.replay
            && replay.on_received(data_len(&packet))
        {
            self.wake_transmit();
        }
        match (self.cfg.role, packet) {
            (_, Packet::Data { connect_id, data }) => self.on_data(now, connect_id, data),
            (_, Packet::Credit { connect_id, bytes }) => self.on_credit(connect_id, bytes),
            (Role::Server, Packet::DialResponse { random, result })
            | (Role::Agent, Packet::ReverseDialResponse { random, result }) => {
                self.on_dial_response(now, random, result)
            }
            (_, Packet::CloseResponse { connect_id, error }) if !self.answers(connect_id) => {
                self.on_close_response(now, connect_id, error)
            }
            (Role::Server, Packet::CloseDial { random })
            | (Role::Agent, Packet::ReverseCloseDial { random }) => self.on_peer_close_dial(random),
            (Role::Server, Packet::Drain) => {
                if !self.peer_draining {
                    self.peer_draining = true;
                    self.events.push_back(Event::PeerDraining);
                }
            }
            (
                Role::Agent,
                Packet::DialRequest {
                    protocol,
                    address,
                    random,
                },
            )
            | (
                Role::Server,
                Packet::ReverseDialRequest {
                    protocol,
                    address,
                    random,
                },
            ) => self.on_dial_request(now, protocol, address, random, None),
            (
                Role::Agent,
                Packet::PeerDialRequest {
                    protocol,
                    address,
                    random,
                    forward,
                },
            ) if self.cfg.peering => {
                self.on_dial_request(now, protocol, address, random, Some(forward));
            }
            (Role::Server, Packet::PeerAgents(agents)) if self.cfg.peering => {
                self.events.push_back(Event::PeerAgents(agents));
            }
            (_, Packet::CloseRequest { connect_id }) if self.answers(connect_id) => {
                self.on_close_request(connect_id)
            }
            (Role::Agent, Packet::CloseDial { random })
            | (Role::Server, Packet::ReverseCloseDial { random }) => {
                if self.dials_in.remove(&random).is_some() {
                    self.events.push_back(Event::DialCancelled {
                        random,
                        why: DialCancel::ByPeer,
                    });
                }
            }
            (_, other) => self.events.push_back(Event::Ignored {
                packet: other.type_name(),
            }),
        }
        match self.violation.take() {
            Some(v) => Err(v),
            None => Ok(()),
        }
    }

    fn on_data(&mut self, now: Instant, id: ConnectId, data: Bytes) {
        let Some(c) = self.conns.get_mut(&id) else {
            self.unknown();
            // Upstream's answers to data for a connection the receiver does not know: the
            // dialer asks to close, the answerer says it is closed.
            let reply = if self.answers(id) {
                Packet::CloseResponse {
                    connect_id: id,
                    error: Some("unrecognized connectID".into()),
                }
            } else {
                Packet::CloseRequest { connect_id: id }
            };
            self.reply(reply);
            return;
        };
        // Closing, closed for its owner, or without one: late data is absorbed.
        if c.owner == Owner::Released || c.notice.is_some() || c.notified {
            return;
        }
        if c.fits(data.len()) {
            self.queued += chunk_cost(data.len());
            c.push(data);
            wake_reader(c, id, &mut self.events);
        } else if let Some(stall) = self.cfg.flow.stall() {
            let deadline = now + stall;
            self.parked = Some(Parked { id, data, deadline });
            self.arm(deadline, Timer::Stall(id));
        } else {
            let limit = c.limit;
            self.overflow(now, id, limit);
        }
    }

    fn on_credit(&mut self, id: ConnectId, bytes: u32) {
        // Credit for a connection that already ended is normal; it is not counted.
        if let Some(c) = self.conns.get_mut(&id) {
            // Bounded far above any real window, so a peer cannot overflow the count.
            c.window = (c.window + u64::from(bytes)).min(1 << 40);
            wake_writer(c, id, &mut self.events);
        }
    }

    fn on_dial_response(
        &mut self,
        now: Instant,
        random: DialId,
        result: Result<ConnectId, String>,
    ) {
        let (started, address) = match self.dials_out.get_mut(&random) {
            Some(OutDial::Pending {
                started, address, ..
            }) => (*started, std::mem::take(address)),
            _ => {
                self.unknown();
                self.events.push_back(Event::StrayDialResponse { random });
                if let Ok(id) = result
                    && !self.answers(id)
                {
                    self.close_orphan(now, random, id);
                }
                return;
            }
        };
        let latency = Some(now.saturating_duration_since(started));
        let result = match result {
            Ok(id) if self.answers(id) => {
                self.unknown();
                Err(DialError::Endpoint(format!(
                    "peer answered with connectID {id}, outside the range it allocates from"
                )))
            }
            Ok(id) if self.conns.contains_key(&id) => {
                self.unknown();
                Err(DialError::Endpoint(format!(
                    "agent answered with connectID {id}, which is already in use"
                )))
            }
            Ok(id) => {
                let conn = Conn::new(self.cfg.flow, Owner::Unclaimed, now, random, address);
                self.conns.insert(id, conn);
                self.events.push_back(Event::Opened(id));
                Ok(id)
            }
            Err(text) => Err(DialError::Endpoint(self.truncate(text))),
        };
        self.settle(random, latency, result);
    }

    /// The agent opened a connection for a dial nobody waits for: close it, and absorb what
    /// it sends until it confirms. Never reported as a connection: it was never handed out.
    fn close_orphan(&mut self, now: Instant, random: DialId, id: ConnectId) {
        if self.conns.contains_key(&id) {
            return;
        }
        let mut conn = Conn::new(self.cfg.flow, Owner::Released, now, random, String::new());
        conn.ended = true;
        let deadline = now + self.cfg.close_timeout;
        conn.closing = Some(deadline);
        self.conns.insert(id, conn);
        self.arm(deadline, Timer::Close(id));
        self.queue(Packet::CloseRequest { connect_id: id }, None);
    }

    fn on_close_response(&mut self, now: Instant, id: ConnectId, error: Option<String>) {
        let error = error.map(|e| CloseError::Peer(self.truncate(e)));
        let Some(c) = self.conns.get_mut(&id) else {
            self.unknown();
            return;
        };
        let initiator = if c.closing.take().is_some() {
            Initiator::Local
        } else {
            Initiator::Peer
        };
        if !c.ended {
            c.notify(error.clone());
            wake_reader(c, id, &mut self.events);
            self.end(now, id, initiator, error);
        }
        self.remove_if_done(id);
    }

    /// The answerer closed a dial this end opened (DIAL_CLS to the server, REVERSE_DIAL_CLS
    /// to the agent).
    fn on_peer_close_dial(&mut self, random: DialId) {
        if matches!(self.dials_out.get(&random), Some(OutDial::Pending { .. })) {
            self.settle(random, None, Err(DialError::ClosedByPeer));
        } else {
            self.unknown();
        }
    }

    fn on_dial_request(
        &mut self,
        now: Instant,
        protocol: String,
        address: String,
        random: DialId,
        forward: Option<Box<Forward>>,
    ) {
        let refusal = if self.dials_in.contains_key(&random) {
            Some(format!("dial ID {random} is already being dialed"))
        } else if self.dials_in.len() >= self.cfg.limits.max_pending_dials {
            Some(format!(
                "too many concurrent dials on this stream (limit {})",
                self.cfg.limits.max_pending_dials
            ))
        } else {
            None
        };
        if let Some(error) = refusal {
            let answer = self.dial_response(random, Err(error));
            self.reply(answer);
            return;
        }
        let deadline = now + self.cfg.dial_timeout;
        self.dials_in.insert(
            random,
            InDial {
                started: now,
                deadline,
                address: address.clone(),
            },
        );
        self.arm(deadline, Timer::Dial(random));
        self.events.push_back(Event::DialRequested {
            random,
            protocol,
            address,
            forward,
        });
    }

    fn on_close_request(&mut self, id: ConnectId) {
        let Some(c) = self.conns.get_mut(&id) else {
            self.unknown();
            self.reply(Packet::CloseResponse {
                connect_id: id,
                error: Some("Unknown connectID".into()),
            });
            return;
        };
        c.close_requested = true;
        c.notify(None);
        wake_reader(c, id, &mut self.events);
    }

    // ---- deadlines and the stream's end ------------------------------------------------

    /// Acts on every deadline due at `now`.
    pub fn handle_timeout(&mut self, now: Instant) {
        while let Some((at, timer)) = self.timers.pop_due(now) {
            match timer {
                Timer::Dial(random) => self.dial_deadline(at, random),
                Timer::Close(id) => {
                    let Some(c) = self.conns.get_mut(&id) else {
                        continue;
                    };
                    if c.closing != Some(at) {
                        continue;
                    }
                    c.closing = None;
                    if !c.ended {
                        c.notify(Some(CloseError::CloseTimeout));
                        wake_reader(c, id, &mut self.events);
                        self.end(now, id, Initiator::Local, Some(CloseError::CloseTimeout));
                    }
                    self.remove_if_done(id);
                }
                Timer::Resume => {
                    if self.suspended == Some(at) {
                        self.close_stream(now, "not resumed within --resume-window");
                    }
                }
                Timer::Stall(id) => {
                    let stalled = self
                        .parked
                        .as_ref()
                        .is_some_and(|p| p.id == id && p.deadline == at);
                    if stalled {
                        self.unpark();
                        let limit = self.conns.get(&id).map_or(0, |c| c.limit);
                        self.overflow(now, id, limit);
                    }
                }
            }
        }
    }

    fn dial_deadline(&mut self, at: Instant, random: DialId) {
        if matches!(self.dials_out.get(&random), Some(OutDial::Pending { deadline, .. }) if *deadline == at)
        {
            self.settle(random, None, Err(DialError::Timeout));
            let forget = self.close_dial(random);
            self.queue(forget, None);
        }
        if self.dials_in.get(&random).is_some_and(|d| d.deadline == at) {
            let dial = self.dials_in.remove(&random);
            let address = dial.map(|d| d.address).unwrap_or_default();
            // Go's wording: the server maps it to 504 by "i/o timeout".
            let answer =
                self.dial_response(random, Err(format!("dial tcp {address}: i/o timeout")));
            self.queue(answer, None);
            self.events.push_back(Event::DialCancelled {
                random,
                why: DialCancel::Timeout,
            });
        }
    }

    /// The stream ended: every pending dial fails and every connection ends with an error,
    /// at once, so nobody waits for a deadline or mistakes the loss for a normal close.
    pub fn close_stream(&mut self, now: Instant, reason: &str) {
        if self.closed.is_some() {
            return;
        }
        self.closed = Some(reason.to_owned());
        let pending: Vec<DialId> = self
            .dials_out
            .iter()
            .filter(|(_, d)| matches!(d, OutDial::Pending { .. }))
            .map(|(r, _)| *r)
            .collect();
        for random in pending {
            self.settle(random, None, Err(DialError::StreamLost(reason.to_owned())));
        }
        for random in std::mem::take(&mut self.dials_in).into_keys() {
            self.events.push_back(Event::DialCancelled {
                random,
                why: DialCancel::StreamLost,
            });
        }
        if self.parked.is_some() {
            self.unpark();
        }
        let ids: Vec<ConnectId> = self.conns.keys().copied().collect();
        for id in ids {
            let Some(c) = self.conns.get_mut(&id) else {
                continue;
            };
            c.closing = None;
            if !c.ended {
                let error = CloseError::StreamLost(reason.to_owned());
                c.notify(Some(error.clone()));
                wake_reader(c, id, &mut self.events);
                self.end(now, id, Initiator::Stream, Some(error));
            }
            self.remove_if_done(id);
        }
        self.outbox.clear();
        self.replies_queued = 0;
        self.timers.clear();
        self.suspended = None;
        if let Some(replay) = &mut self.replay {
            replay.clear();
        }
    }

    // ---- the dialer: server (forward) or agent (reverse) ---------------------------------

    /// Sends DIAL_REQ (agent: REVERSE_DIAL_REQ; with `forward`, on a peer link:
    /// PEER_DIAL_REQ); the answer arrives as [`Event::DialSettled`].
    pub fn open_dial(
        &mut self,
        now: Instant,
        random: DialId,
        protocol: String,
        address: String,
        forward: Option<Box<Forward>>,
    ) -> Result<(), DialError> {
        if let Some(reason) = &self.closed {
            return Err(DialError::StreamLost(reason.clone()));
        }
        if self.dials_out.contains_key(&random) {
            return Err(DialError::Duplicate(random));
        }
        let limit = self.cfg.limits.max_pending_dials;
        if self.dials_out.len() >= limit {
            return Err(DialError::TooManyPending { limit });
        }
        let deadline = now + self.cfg.dial_timeout;
        self.dials_out.insert(
            random,
            OutDial::Pending {
                started: now,
                deadline,
                address: address.clone(),
            },
        );
        self.arm(deadline, Timer::Dial(random));
        let request = match (self.cfg.role, forward) {
            (Role::Server, Some(forward)) if self.cfg.peering => Packet::PeerDialRequest {
                protocol,
                address,
                random,
                forward,
            },
            (Role::Server, _) => Packet::DialRequest {
                protocol,
                address,
                random,
            },
            (Role::Agent, _) => Packet::ReverseDialRequest {
                protocol,
                address,
                random,
            },
        };
        self.queue(request, None);
        Ok(())
    }

    /// The dial's result once settled; an `Ok` connection now belongs to the caller.
    pub fn take_dial(&mut self, random: DialId) -> Option<Result<ConnectId, DialError>> {
        if !matches!(self.dials_out.get(&random)?, OutDial::Settled(_)) {
            return None;
        }
        let Some(OutDial::Settled(result)) = self.dials_out.remove(&random) else {
            return None;
        };
        if let Ok(id) = &result
            && let Some(c) = self.conns.get_mut(id)
        {
            c.owner = Owner::Attached;
        }
        Some(result)
    }

    /// The dialer gave up (its deadline, or its client left). One place settles the race
    /// with the agent's answer: a pending dial is cancelled, an answered one is closed.
    pub fn abandon_dial(&mut self, now: Instant, random: DialId) -> Abandoned {
        match self.dials_out.remove(&random) {
            Some(OutDial::Pending { .. }) => {
                let forget = self.close_dial(random);
                self.queue(forget, None);
                Abandoned::Pending
            }
            Some(OutDial::Settled(Ok(id))) => {
                if let Some(c) = self.conns.get_mut(&id) {
                    c.owner = Owner::Attached;
                }
                self.release(now, id);
                Abandoned::Answered
            }
            Some(OutDial::Settled(Err(_))) | None => Abandoned::Nothing,
        }
    }

    fn settle(
        &mut self,
        random: DialId,
        latency: Option<Duration>,
        result: Result<ConnectId, DialError>,
    ) {
        self.dials_out
            .insert(random, OutDial::Settled(result.clone()));
        self.events.push_back(Event::DialSettled {
            random,
            latency,
            result,
        });
    }

    // ---- the answerer: agent (forward) or server (reverse) -------------------------------

    /// The destination answered: registers the connection and queues DIAL_RSP. `None` if
    /// the dial was cancelled, timed out or its stream ended meanwhile (drop the socket).
    pub fn dial_succeeded(&mut self, now: Instant, random: DialId) -> Option<ConnectId> {
        if self.closed.is_some() {
            return None;
        }
        let dial = self.dials_in.remove(&random)?;
        let id = self.allocate_connect_id();
        self.conns.insert(
            id,
            Conn::new(self.cfg.flow, Owner::Attached, now, random, dial.address),
        );
        self.events.push_back(Event::Opened(id));
        let answer = self.dial_response(random, Ok(id));
        self.queue(answer, None);
        Some(id)
    }

    /// The dial failed: queues DIAL_RSP with `error`, unless the dial is no longer wanted.
    pub fn dial_failed(&mut self, random: DialId, error: String) -> bool {
        if self.closed.is_some() || self.dials_in.remove(&random).is_none() {
            return false;
        }
        let answer = self.dial_response(random, Err(error));
        self.queue(answer, None);
        true
    }

    /// Whether a dial the peer asked for is still wanted (not cancelled, timed out or
    /// answered).
    pub fn dial_wanted(&self, random: DialId) -> bool {
        self.dials_in.contains_key(&random)
    }

    /// Agent: tells the server this agent is going away.
    pub fn drain(&mut self) {
        if self.closed.is_none() {
            self.draining = true;
            self.queue(Packet::Drain, None);
        }
    }

    /// Agent side of a peer link: tells the other server which agents joined, changed or
    /// left. The caller bounds how many wait unsent ([`outbox_len`](Self::outbox_len)).
    pub fn announce_agents(&mut self, agents: PeerAgents) {
        if self.closed.is_none() && self.cfg.peering && self.cfg.role == Role::Agent {
            self.queue(Packet::PeerAgents(Box::new(agents)), None);
        }
    }

    // ---- a connection's owner ----------------------------------------------------------

    /// Queues DATA if the connection's window allows the whole chunk (at most
    /// [`MIN_WINDOW`](crate::MIN_WINDOW) / 2 bytes).
    pub fn send_data(&mut self, id: ConnectId, data: Bytes) -> Result<(), SendError> {
        let Some(c) = self.conns.get_mut(&id) else {
            return Err(SendError::Closed);
        };
        if self.closed.is_some()
            || c.ended
            || c.closing.is_some()
            || c.close_requested
            || c.owner == Owner::Released
        {
            return Err(SendError::Closed);
        }
        let cost = chunk_cost(data.len()) as u64;
        if c.window < cost {
            c.write_waiting = true;
            return Err(SendError::Blocked(data));
        }
        c.window -= cost;
        c.bytes_to_peer += data.len() as u64;
        let release = (!self.cfg.flow.is_credit()).then_some((id, cost as u32));
        self.queue(
            Packet::Data {
                connect_id: id,
                data,
            },
            release,
        );
        Ok(())
    }

    /// Takes the next chunk received on the connection, or its close once the data is taken.
    pub fn recv(&mut self, now: Instant, id: ConnectId) -> Recv {
        let Some(c) = self.conns.get_mut(&id) else {
            return Recv::Closed(Some(CloseError::Local("connection dropped".into())));
        };
        if let Some(data) = c.pop() {
            self.queued -= chunk_cost(data.len());
            self.progress(now, id);
            return Recv::Data(data);
        }
        if let Some(notice) = c.notice.take() {
            c.notified = true;
            return Recv::Closed(notice);
        }
        c.read_waiting = true;
        Recv::Empty
    }

    /// The owner wrote what it received to its destination: with a tether peer, returns the
    /// credit once a batch (a quarter window) was consumed.
    pub fn consumed(&mut self, id: ConnectId) {
        let Some(threshold) = self.cfg.flow.grant_threshold() else {
            return;
        };
        let Some(c) = self.conns.get_mut(&id) else {
            return;
        };
        if c.ended || c.ungranted < u64::from(threshold) {
            return;
        }
        let bytes = u32::try_from(std::mem::take(&mut c.ungranted)).unwrap_or(u32::MAX);
        self.queue(
            Packet::Credit {
                connect_id: id,
                bytes,
            },
            None,
        );
    }

    /// The dialer asks the answerer to close (CLOSE_REQ); its CLOSE_RSP, or the close
    /// deadline, ends the connection. Idempotent.
    pub fn close(&mut self, now: Instant, id: ConnectId) {
        let Some(c) = self.conns.get_mut(&id) else {
            return;
        };
        if c.ended || c.closing.is_some() || self.closed.is_some() {
            return;
        }
        let deadline = now + self.cfg.close_timeout;
        c.closing = Some(deadline);
        self.arm(deadline, Timer::Close(id));
        self.queue(Packet::CloseRequest { connect_id: id }, None);
    }

    /// The answerer's relay ended; tells the dialer (CLOSE_RSP) and forgets the connection.
    pub fn finish(&mut self, now: Instant, id: ConnectId, error: Option<CloseError>) {
        let Some(c) = self.conns.get(&id) else {
            return;
        };
        let initiator = if c.close_requested {
            Initiator::Peer
        } else {
            Initiator::Local
        };
        let ended = c.ended;
        if self.closed.is_none() {
            self.queue(
                Packet::CloseResponse {
                    connect_id: id,
                    error: error.as_ref().map(ToString::to_string),
                },
                None,
            );
        }
        if !ended {
            self.end(now, id, initiator, error);
        }
        self.remove(id);
    }

    /// The owner is gone. Dialer: a connection still open is closed (CLOSE_REQ) and its
    /// late packets absorbed until the answerer confirms. Answerer: as
    /// [`finish`](Self::finish).
    pub fn release(&mut self, now: Instant, id: ConnectId) {
        let answers = self.answers(id);
        let Some(c) = self.conns.get_mut(&id) else {
            return;
        };
        if answers {
            let error = (!c.close_requested && !c.notified)
                .then(|| CloseError::Local("connection closed by agent".into()));
            self.finish(now, id, error);
            return;
        }
        c.owner = Owner::Released;
        let open = !c.ended && c.closing.is_none();
        let dropped = std::mem::take(&mut c.inbound);
        c.queued = 0;
        self.queued -= dropped.iter().map(|d| chunk_cost(d.len())).sum::<usize>();
        if self.parked.as_ref().is_some_and(|p| p.id == id) {
            self.unpark();
        }
        if open {
            self.close(now, id);
        }
        self.remove_if_done(id);
    }

    // ---- the writer --------------------------------------------------------------------

    /// Moves queued packets into `batch`, about `max_bytes` of payload at most. False when
    /// nothing was queued: [`Event::Transmit`] follows.
    pub fn poll_transmit(&mut self, batch: &mut Vec<Outgoing>, max_bytes: usize) -> bool {
        let replay_work = self.replay.as_ref().is_some_and(Replay::has_work);
        if (self.outbox.is_empty() && !replay_work) || self.is_suspended() {
            self.transmit_waiting = true;
            return false;
        }
        let mut bytes = 0;
        if let Some(replay) = &mut self.replay {
            // The acknowledgement first, then what a resume writes again, then the new.
            batch.extend(replay.take_ack().map(direct));
            while bytes < max_bytes
                && let Some(packet) = replay.next_unsent()
            {
                bytes += fair::cost(&packet);
                batch.push(direct(packet));
            }
        }
        while bytes < max_bytes {
            let Some(item) = self.outbox.pop() else {
                break;
            };
            if item.reply {
                self.replies_queued -= 1;
            }
            bytes += fair::cost(&item.packet);
            if let Some(replay) = &mut self.replay {
                replay.record(&item.packet);
            }
            batch.push(item);
        }
        true
    }

    /// The writer wrote a packet whose [`Outgoing::release`] was `Some`: gives the local
    /// window back (peers without credit).
    pub fn transmitted(&mut self, id: ConnectId, cost: u32) {
        if let Some(c) = self.conns.get_mut(&id) {
            c.window += u64::from(cost);
            wake_writer(c, id, &mut self.events);
        }
    }

    // ---- internals ---------------------------------------------------------------------

    /// Whether this end answered the dial of connection `id` (allocated its ID): the agent
    /// allocates from 1 upward (as upstream's agents do), the server from -1 downward.
    fn answers(&self, id: ConnectId) -> bool {
        match self.cfg.role {
            Role::Agent => id.0 >= 0,
            Role::Server => id.0 < 0,
        }
    }

    fn allocate_connect_id(&mut self) -> ConnectId {
        loop {
            self.last_connect_id = match self.cfg.role {
                Role::Agent => self.last_connect_id + 1,
                Role::Server => self.last_connect_id - 1,
            };
            let id = ConnectId(self.last_connect_id);
            if !self.conns.contains_key(&id) {
                return id;
            }
        }
    }

    /// The answerer's DIAL_RSP (server: REVERSE_DIAL_RSP).
    fn dial_response(&self, random: DialId, result: Result<ConnectId, String>) -> Packet {
        match self.cfg.role {
            Role::Agent => Packet::DialResponse { random, result },
            Role::Server => Packet::ReverseDialResponse { random, result },
        }
    }

    /// The dialer's DIAL_CLS (agent: REVERSE_DIAL_CLS).
    fn close_dial(&self, random: DialId) -> Packet {
        match self.cfg.role {
            Role::Server => Packet::CloseDial { random },
            Role::Agent => Packet::ReverseCloseDial { random },
        }
    }

    fn queue(&mut self, packet: Packet, release: Option<(ConnectId, u32)>) {
        self.outbox.push(Outgoing {
            packet,
            release,
            reply: false,
        });
        self.wake_transmit();
    }

    /// Queues an answer the peer's own packet asked for. A peer that never reads lets these
    /// pile up; past the bound that is a [`Violation`].
    fn reply(&mut self, packet: Packet) {
        let limit = self.cfg.limits.max_reply_backlog;
        if self.replies_queued >= limit {
            self.violation = Some(Violation::ReplyBacklog { limit });
            return;
        }
        self.replies_queued += 1;
        self.outbox.push(Outgoing {
            packet,
            release: None,
            reply: true,
        });
        self.wake_transmit();
    }

    fn wake_transmit(&mut self) {
        if std::mem::take(&mut self.transmit_waiting) {
            self.events.push_back(Event::Transmit);
        }
    }

    fn unknown(&mut self) {
        self.unknown_packets += 1;
        let limit = self.cfg.limits.max_unknown_packets;
        if self.unknown_packets > limit {
            self.violation = Some(Violation::TooManyUnknown { limit });
        }
    }

    fn truncate(&self, mut text: String) -> String {
        let max = self.cfg.limits.max_error_text;
        if text.len() > max {
            let mut cut = max;
            while !text.is_char_boundary(cut) {
                cut -= 1;
            }
            text.truncate(cut);
            text.push('…');
        }
        text
    }

    fn arm(&mut self, at: Instant, timer: Timer) {
        if self.timers.arm(at, timer) {
            self.events.push_back(Event::TimerChanged);
        }
    }

    /// The owner took data from `id`: a parked packet for it may now fit, and its stall
    /// clock restarts.
    fn progress(&mut self, now: Instant, id: ConnectId) {
        let Some(parked) = &mut self.parked else {
            return;
        };
        if parked.id != id {
            return;
        }
        let Some(c) = self.conns.get_mut(&id) else {
            return;
        };
        if c.fits(parked.data.len()) {
            let data = std::mem::take(&mut parked.data);
            self.queued += chunk_cost(data.len());
            c.push(data);
            self.unpark();
        } else if let Some(stall) = self.cfg.flow.stall() {
            let deadline = now + stall;
            parked.deadline = deadline;
            self.arm(deadline, Timer::Stall(id));
        }
    }

    fn unpark(&mut self) {
        self.parked = None;
        self.events.push_back(Event::Unparked);
    }

    /// The peer sent more than the connection may queue: it ends with an error, alone.
    fn overflow(&mut self, now: Instant, id: ConnectId, limit: usize) {
        let Some(c) = self.conns.get_mut(&id) else {
            return;
        };
        if c.ended {
            return;
        }
        let dropped = std::mem::take(&mut c.inbound);
        c.queued = 0;
        self.queued -= dropped.iter().map(|d| chunk_cost(d.len())).sum::<usize>();
        let error = CloseError::Overflow { limit };
        c.notify(Some(error.clone()));
        wake_reader(c, id, &mut self.events);
        self.end(now, id, Initiator::Local, Some(error));
        if !self.answers(id) {
            // Tell the answerer; its CLOSE_RSP is absorbed.
            let deadline = now + self.cfg.close_timeout;
            if let Some(c) = self.conns.get_mut(&id)
                && c.closing.is_none()
            {
                c.closing = Some(deadline);
                self.arm(deadline, Timer::Close(id));
                self.queue(Packet::CloseRequest { connect_id: id }, None);
            }
        }
    }

    fn end(
        &mut self,
        now: Instant,
        id: ConnectId,
        initiator: Initiator,
        error: Option<CloseError>,
    ) {
        let Some(c) = self.conns.get_mut(&id) else {
            return;
        };
        debug_assert!(!c.ended, "a connection ended twice");
        c.ended = true;
        // A sender waiting for window must learn that it never comes.
        if std::mem::take(&mut c.write_waiting) {
            self.events.push_back(Event::Writable(id));
        }
        self.events.push_back(Event::Ended(Ended {
            id,
            dial_id: c.dial_id,
            outcome: Outcome { initiator, error },
            bytes_from_peer: c.bytes_from_peer,
            bytes_to_peer: c.bytes_to_peer,
            opened_at: c.opened_at,
            ended_at: now.max(c.opened_at),
        }));
    }

    /// A released connection leaves once its outcome is known and no close is awaited.
    fn remove_if_done(&mut self, id: ConnectId) {
        let done = self
            .conns
            .get(&id)
            .is_some_and(|c| c.owner == Owner::Released && c.ended && c.closing.is_none());
        if done {
            self.remove(id);
        }
    }

    fn remove(&mut self, id: ConnectId) {
        if let Some(c) = self.conns.remove(&id) {
            self.queued -= c.queued;
            if self.parked.as_ref().is_some_and(|p| p.id == id) {
                self.unpark();
            }
            shrink_when_sparse(&mut self.conns);
        }
    }
}

/// Capacity a connection table keeps however empty it gets: small enough not to matter,
/// large enough that ordinary churn never reallocates.
const MIN_TABLE_CAPACITY: usize = 1024;

/// Gives a table's room back once three quarters of it stand empty: a hash table never
/// shrinks by itself, and a stream that once held 12,500 connections would keep room for
/// them (about 300 bytes each) for the rest of its life. Halving only below a quarter full
/// keeps the cost amortised: each shrink follows as many removals as it moves entries.
fn shrink_when_sparse<K: Eq + std::hash::Hash, V>(table: &mut HashMap<K, V>) {
    if table.capacity() > MIN_TABLE_CAPACITY && table.len() < table.capacity() / 4 {
        table.shrink_to((table.len() * 2).max(MIN_TABLE_CAPACITY));
    }
}

/// A packet for the writer from beside the outbox: an acknowledgement or a replay.
fn direct(packet: Packet) -> Outgoing {
    Outgoing {
        packet,
        release: None,
        reply: false,
    }
}

fn wake_reader(c: &mut Conn, id: ConnectId, events: &mut VecDeque<Event>) {
    if std::mem::take(&mut c.read_waiting) {
        events.push_back(Event::Readable(id));
    }
}

fn wake_writer(c: &mut Conn, id: ConnectId, events: &mut VecDeque<Event>) {
    if c.write_waiting && c.window > 0 {
        c.write_waiting = false;
        events.push_back(Event::Writable(id));
    }
}

#[cfg(test)]
mod table_tests {
    use super::*;

    #[test]
    fn a_table_gives_back_its_room_once_mostly_empty_and_keeps_its_entries() {
        let mut table: HashMap<u32, [u8; 64]> = HashMap::new();
        for i in 0..12_500 {
            table.insert(i, [1; 64]);
        }
        let full = table.capacity();
        for i in 100..12_500 {
            table.remove(&i);
            shrink_when_sparse(&mut table);
        }
        // The floor's own table: hashbrown rounds 1,024 up to 2,048 buckets.
        assert!(
            table.capacity() <= 2 * MIN_TABLE_CAPACITY,
            "{} of {full}",
            table.capacity()
        );
        assert!(table.capacity() >= MIN_TABLE_CAPACITY);
        assert!((0..100).all(|i| table.contains_key(&i)));
        // Removing the rest never goes below the floor.
        for i in 0..100 {
            table.remove(&i);
            shrink_when_sparse(&mut table);
        }
        assert!(table.is_empty() && table.capacity() >= MIN_TABLE_CAPACITY);
    }
}
