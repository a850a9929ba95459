//! Resumable sessions over a transport that breaks: random sends, reads, partial deliveries
//! and cuts (every packet in flight at a cut is lost, after the peer got a random prefix of
//! them), with both ends suspending and resuming on a new transport. Every byte arrives
//! once and in order, every close arrives, the replay log stays within the credit windows,
//! and a resume the log cannot serve is refused.

mod support;

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use bytes::Bytes;
use proptest::prelude::*;
use support::{config, credit};
use tether_proto::{ConnectId, DialId, Packet};
use tether_session::{Event, Initiator, Recv, ResumeError, Role, Session, SessionConfig};

const RESUME_WINDOW: Duration = Duration::from_secs(30);

fn resumable(role: Role) -> SessionConfig {
    SessionConfig {
        resumable: true,
        ..config(role, credit())
    }
}

/// The byte at `offset` of one direction of one connection: a reordering, loss or
/// duplicate shows as a mismatch.
fn pattern(conn: usize, to_agent: bool, offset: u64) -> u8 {
    (offset.wrapping_mul(31) + conn as u64 * 7 + u64::from(to_agent)) as u8
}

/// One end and what it has sent and verified per connection.
struct End {
    session: Session,
    /// Written to the transport, not yet delivered to the peer.
    wire: VecDeque<Packet>,
    sent: Vec<u64>,
    received: Vec<u64>,
    closed: Vec<bool>,
    ended: Vec<u32>,
}

impl End {
    fn new(role: Role, conns: usize) -> Self {
        Self {
            session: Session::new(resumable(role)),
            wire: VecDeque::new(),
            sent: vec![0; conns],
            received: vec![0; conns],
            closed: vec![false; conns],
            ended: vec![0; conns],
        }
    }

    fn write(&mut self, max_bytes: usize) {
        let mut batch = Vec::new();
        if self.session.poll_transmit(&mut batch, max_bytes) {
            self.wire.extend(batch.into_iter().map(|o| o.packet));
        }
    }

    fn send(&mut self, ids: &[ConnectId], conn: usize, len: usize, to_agent: bool) {
        let start = self.sent[conn];
        let data: Vec<u8> = (0..len as u64)
            .map(|i| pattern(conn, to_agent, start + i))
            .collect();
        if self.session.send_data(ids[conn], Bytes::from(data)).is_ok() {
            self.sent[conn] += len as u64;
        }
    }

    /// Reads everything queued on `conn` and checks it against the pattern.
    fn read(&mut self, ids: &[ConnectId], conn: usize, to_agent: bool, now: Instant) {
        loop {
            match self.session.recv(now, ids[conn]) {
                Recv::Data(d) => {
                    for (i, byte) in d.iter().enumerate() {
                        let offset = self.received[conn] + i as u64;
                        assert_eq!(
                            *byte,
                            pattern(conn, to_agent, offset),
                            "conn {conn} byte {offset}"
                        );
                    }
                    self.received[conn] += d.len() as u64;
                    self.session.consumed(ids[conn]);
                }
                Recv::Closed(error) => {
                    assert_eq!(error, None, "conn {conn} closed with an error");
                    self.closed[conn] = true;
                    return;
                }
                Recv::Empty => return,
            }
        }
    }

    fn collect(&mut self, ids: &[ConnectId]) {
        while let Some(event) = self.session.poll_event() {
            if let Event::Ended(ended) = event {
                let conn = ids.iter().position(|id| *id == ended.id).expect("known");
                assert_eq!(ended.outcome.error, None, "{ended:?}");
                self.ended[conn] += 1;
            }
        }
    }
}

/// Delivers up to `n` packets from `from`'s wire to `to`.
fn deliver(from: &mut End, to: &mut End, n: usize, now: Instant) {
    for _ in 0..n {
        let Some(packet) = from.wire.pop_front() else {
            return;
        };
        to.session
            .handle_packet(now, packet)
            .expect("no violation between two correct ends");
    }
}

#[derive(Clone, Debug)]
enum Op {
    Send {
        agent: bool,
        conn: usize,
        len: u16,
    },
    Write {
        agent: bool,
    },
    Deliver {
        agent: bool,
        n: u8,
    },
    Read {
        agent: bool,
        conn: usize,
    },
    /// The transport breaks after the agent got `to_agent` and the server `to_server` of
    /// the packets in flight; the rest is lost.
    Cut {
        to_agent: u8,
        to_server: u8,
    },
    Close {
        conn: usize,
    },
}

fn op(conns: usize) -> impl Strategy<Value = Op> {
    let conn = 0..conns;
    prop_oneof![
        6 => (any::<bool>(), conn.clone(), 1..40_000u16)
            .prop_map(|(agent, conn, len)| Op::Send { agent, conn, len }),
        4 => any::<bool>().prop_map(|agent| Op::Write { agent }),
        4 => (any::<bool>(), any::<u8>()).prop_map(|(agent, n)| Op::Deliver { agent, n }),
        4 => (any::<bool>(), conn.clone()).prop_map(|(agent, conn)| Op::Read { agent, conn }),
        1 => (any::<u8>(), any::<u8>())
            .prop_map(|(to_agent, to_server)| Op::Cut { to_agent, to_server }),
        1 => conn.prop_map(|conn| Op::Close { conn }),
    ]
}

/// Opens `conns` connections over a working transport.
fn open(server: &mut End, agent: &mut End, conns: usize, now: Instant) -> Vec<ConnectId> {
    let mut ids = Vec::new();
    for n in 0..conns {
        let random = DialId(n as i64 + 1);
        server
            .session
            .open_dial(now, random, "tcp".into(), "127.0.0.1:80".into(), None)
            .unwrap();
        server.write(usize::MAX);
        deliver(server, agent, usize::MAX, now);
        let id = agent.session.dial_succeeded(now, random).unwrap();
        agent.write(usize::MAX);
        deliver(agent, server, usize::MAX, now);
        assert_eq!(server.session.take_dial(random), Some(Ok(id)));
        ids.push(id);
    }
    ids
}

fn cut(server: &mut End, agent: &mut End, to_agent: usize, to_server: usize, now: Instant) {
    deliver(server, agent, to_agent, now);
    deliver(agent, server, to_server, now);
    server.wire.clear();
    agent.wire.clear();
    assert!(server.session.suspend(now, RESUME_WINDOW));
    assert!(agent.session.suspend(now, RESUME_WINDOW));
    let at_server = server.session.resume_point().unwrap();
    let at_agent = agent.session.resume_point().unwrap();
    server
        .session
        .resume(at_agent)
        .expect("the server can replay");
    agent
        .session
        .resume(at_server)
        .expect("the agent can replay");
}

fn run(conns: usize, ops: Vec<Op>) {
    let now = support::base_instant();
    let mut server = End::new(Role::Server, conns);
    let mut agent = End::new(Role::Agent, conns);
    let ids = open(&mut server, &mut agent, conns, now);
    let window = u64::from(credit().initial_send_window());
    let mut closing = vec![false; conns];
    let mut finished = vec![false; conns];
    for op in ops {
        match op {
            Op::Send {
                agent: true,
                conn,
                len,
            } if !agent.closed[conn] => {
                agent.send(&ids, conn, len.into(), false);
            }
            Op::Send {
                agent: false,
                conn,
                len,
            } if !closing[conn] => {
                server.send(&ids, conn, len.into(), true);
            }
            Op::Send { .. } => {}
            Op::Write { agent: true } => agent.write(64 * 1024),
            Op::Write { agent: false } => server.write(64 * 1024),
            Op::Deliver { agent: true, n } => deliver(&mut agent, &mut server, n.into(), now),
            Op::Deliver { agent: false, n } => deliver(&mut server, &mut agent, n.into(), now),
            Op::Read { agent: true, conn } => agent.read(&ids, conn, true, now),
            Op::Read { agent: false, conn } => server.read(&ids, conn, false, now),
            Op::Cut {
                to_agent,
                to_server,
            } => {
                cut(
                    &mut server,
                    &mut agent,
                    to_agent.into(),
                    to_server.into(),
                    now,
                );
            }
            Op::Close { conn } => {
                server.session.close(now, ids[conn]);
                closing[conn] = true;
            }
        }
        server.collect(&ids);
        agent.collect(&ids);
        // The log holds at most each connection's window of DATA, plus packet overhead.
        for end in [&server, &agent] {
            let (bytes, _) = end.session.replay_log();
            assert!(
                bytes as u64 <= window * conns as u64,
                "{bytes} bytes logged for {conns} windows of {window}"
            );
        }
    }
    // Everything still open is closed; then the transport runs until both are quiet.
    for (conn, id) in ids.iter().enumerate() {
        if !closing[conn] {
            server.session.close(now, *id);
        }
    }
    for _ in 0..10_000 {
        server.write(64 * 1024);
        agent.write(64 * 1024);
        let moving = !server.wire.is_empty() || !agent.wire.is_empty();
        deliver(&mut server, &mut agent, usize::MAX, now);
        deliver(&mut agent, &mut server, usize::MAX, now);
        for (conn, id) in ids.iter().enumerate() {
            server.read(&ids, conn, false, now);
            if !agent.closed[conn] {
                agent.read(&ids, conn, true, now);
            }
            if agent.closed[conn] && !finished[conn] {
                agent.session.finish(now, *id, None);
                finished[conn] = true;
            }
        }
        server.collect(&ids);
        agent.collect(&ids);
        if !moving && server.closed.iter().all(|c| *c) {
            break;
        }
    }
    for conn in 0..conns {
        assert_eq!(
            agent.received[conn], server.sent[conn],
            "conn {conn} to agent"
        );
        assert_eq!(
            server.received[conn], agent.sent[conn],
            "conn {conn} to server"
        );
        assert!(
            server.closed[conn] && agent.closed[conn],
            "conn {conn} closed"
        );
        assert_eq!(
            (server.ended[conn], agent.ended[conn]),
            (1, 1),
            "conn {conn}"
        );
    }
    for id in &ids {
        server.session.release(now, *id);
    }
    assert_eq!(server.session.connection_count(), 0);
    assert_eq!(agent.session.connection_count(), 0);
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn bytes_and_closes_survive_cuts(
        (conns, ops) in (1..4usize).prop_flat_map(|n| (Just(n), proptest::collection::vec(op(n), 1..400)))
    ) {
        run(conns, ops);
    }
}

#[test]
fn a_cut_with_everything_in_flight_lost_replays_it() {
    let now = support::base_instant();
    let mut server = End::new(Role::Server, 1);
    let mut agent = End::new(Role::Agent, 1);
    let ids = open(&mut server, &mut agent, 1, now);
    server.send(&ids, 0, 30_000, true);
    server.write(usize::MAX);
    assert_eq!(server.session.replay_log().0, 30_000);
    cut(&mut server, &mut agent, 0, 0, now);
    server.write(usize::MAX);
    assert!(
        matches!(server.wire.front(), Some(Packet::Data { data, .. }) if data.len() == 30_000),
        "the lost DATA is written again first: {:?}",
        server.wire.front().map(Packet::type_name)
    );
    deliver(&mut server, &mut agent, usize::MAX, now);
    agent.read(&ids, 0, true, now);
    assert_eq!(agent.received[0], 30_000);
    // The agent's next batch acknowledges it; the server's log empties.
    agent.send(&ids, 0, 10, false);
    agent.write(usize::MAX);
    deliver(&mut agent, &mut server, usize::MAX, now);
    assert_eq!(server.session.replay_log(), (0, 0));
}

#[test]
fn a_resume_from_another_history_is_refused_and_the_window_ends_the_session() {
    let mut now = support::base_instant();
    let mut server = End::new(Role::Server, 1);
    let mut agent = End::new(Role::Agent, 1);
    let ids = open(&mut server, &mut agent, 1, now);
    assert!(server.session.suspend(now, RESUME_WINDOW));
    // The server wrote one packet (DIAL_REQ), which the agent's DIAL_RSP batch acknowledged.
    assert_eq!(
        server.session.resume(6),
        Err(ResumeError::OutOfRange {
            peer_received: 6,
            acked: 1,
            sent: 1
        })
    );
    assert!(
        server.session.is_suspended(),
        "a refused resume changes nothing"
    );
    now += RESUME_WINDOW;
    server.session.handle_timeout(now);
    assert!(!server.session.is_open());
    let mut ended = Vec::new();
    while let Some(event) = server.session.poll_event() {
        if let Event::Ended(e) = event {
            ended.push(e);
        }
    }
    assert_eq!(ended.len(), 1);
    assert_eq!(ended[0].id, ids[0]);
    assert_eq!(ended[0].outcome.initiator, Initiator::Stream);
    assert!(
        ended[0]
            .outcome
            .error
            .as_ref()
            .is_some_and(|e| e.to_string().contains("--resume-window")),
        "{:?}",
        ended[0].outcome
    );
    assert_eq!(server.session.resume(0), Err(ResumeError::NotResumable));
}

#[test]
fn an_acknowledgement_beyond_what_was_written_is_a_violation() {
    let now = support::base_instant();
    let mut server = End::new(Role::Server, 1);
    let mut agent = End::new(Role::Agent, 1);
    open(&mut server, &mut agent, 1, now);
    let err = server
        .session
        .handle_packet(now, Packet::ResumeAck { received: 99 })
        .unwrap_err();
    assert!(err.to_string().contains("acknowledged 99"), "{err}");
}

#[test]
fn a_session_whose_agent_is_going_away_is_not_suspended() {
    let now = support::base_instant();
    let mut server = End::new(Role::Server, 0);
    let mut agent = End::new(Role::Agent, 0);
    agent.session.drain();
    agent.write(usize::MAX);
    deliver(&mut agent, &mut server, usize::MAX, now);
    assert!(server.session.peer_draining());
    assert!(
        !server.session.suspend(now, RESUME_WINDOW),
        "the peer said DRAIN"
    );
    assert!(
        !agent.session.suspend(now, RESUME_WINDOW),
        "this end said DRAIN"
    );
}
