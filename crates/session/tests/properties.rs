//! Random operation sequences on a server/agent pair, with forward dials (the server dials)
//! and reverse dials (the agent dials) mixed on the same stream, their dial IDs drawn from
//! the same small numbers. Whatever the order, no connection outlives its stream, every
//! pending dial ends, windows and queues stay within their bounds, and every connection gets
//! exactly one outcome.

mod support;

use std::collections::HashSet;
use std::time::Duration;

use bytes::Bytes;
use proptest::prelude::*;
use support::{Log, Pair, credit, legacy};
use tether_proto::{ConnectId, DialId, Packet};
use tether_session::{CloseError, Flow, Session};

#[derive(Clone, Debug)]
enum Op {
    OpenDial,
    AgentAnswer { pick: usize, ok: bool },
    ServerTake { pick: usize },
    Abandon { pick: usize },
    ServerSend { pick: usize, len: u16 },
    AgentSend { pick: usize, len: u16 },
    ServerRecv { pick: usize },
    AgentRecv { pick: usize },
    ServerClose { pick: usize },
    AgentFinish { pick: usize, error: bool },
    ServerRelease { pick: usize },
    Drain,
    Junk { id: i64 },
    Pump,
    Advance { millis: u16 },
}

fn op() -> impl Strategy<Value = Op> {
    let pick = any::<usize>();
    prop_oneof![
        3 => Just(Op::OpenDial),
        3 => (pick, any::<bool>()).prop_map(|(pick, ok)| Op::AgentAnswer { pick, ok }),
        2 => pick.prop_map(|pick| Op::ServerTake { pick }),
        1 => pick.prop_map(|pick| Op::Abandon { pick }),
        4 => (pick, any::<u16>()).prop_map(|(pick, len)| Op::ServerSend { pick, len }),
        4 => (pick, any::<u16>()).prop_map(|(pick, len)| Op::AgentSend { pick, len }),
        3 => pick.prop_map(|pick| Op::ServerRecv { pick }),
        3 => pick.prop_map(|pick| Op::AgentRecv { pick }),
        1 => pick.prop_map(|pick| Op::ServerClose { pick }),
        1 => (pick, any::<bool>()).prop_map(|(pick, error)| Op::AgentFinish { pick, error }),
        1 => pick.prop_map(|pick| Op::ServerRelease { pick }),
        1 => Just(Op::Drain),
        1 => (1i64..1000).prop_map(|id| Op::Junk { id }),
        5 => Just(Op::Pump),
        2 => (0u16..40_000).prop_map(|millis| Op::Advance { millis }),
    ]
}

fn pick<T: Copy>(items: &[T], i: usize) -> Option<T> {
    (!items.is_empty()).then(|| items[i % items.len()])
}

/// The model's view of one direction: who holds what. "Server" ops act on the dialer
/// (the server forward, the agent reverse), "agent" ops on the answerer.
#[derive(Default)]
struct Holders {
    next_dial: i64,
    /// Dials the dialer opened and has neither taken nor abandoned.
    server_dials: Vec<DialId>,
    /// Connections the dialer took.
    server_conns: Vec<ConnectId>,
    /// Connections the answerer's relays hold.
    agent_conns: Vec<ConnectId>,
    /// Dials the answerer already answered.
    answered: HashSet<DialId>,
}

/// (dialer, answerer) of a direction.
fn ends(p: &mut Pair, reverse: bool) -> (&mut Session, &mut Session) {
    if reverse {
        (&mut p.agent, &mut p.server)
    } else {
        (&mut p.server, &mut p.agent)
    }
}

fn answerer_log(p: &Pair, reverse: bool) -> &Log {
    if reverse { &p.server_log } else { &p.agent_log }
}

fn check_bounds(side: &Session) {
    let mut total = 0;
    for c in side.connections() {
        // A queue may exceed its limit only by the one chunk an empty queue always takes.
        assert!(c.queued <= c.limit.max(64 * 1024), "{c:?}");
        assert!(c.window <= 1 << 40, "{c:?}");
        total += c.queued;
    }
    assert_eq!(side.queued_bytes(), total, "queued bytes add up");
}

fn run(server_flow: Flow, agent_flow: Flow, ops: Vec<(bool, Op)>) {
    let mut p = Pair::new(server_flow, agent_flow);
    let mut both = [Holders::default(), Holders::default()];
    for (reverse, op) in ops {
        let h = &mut both[usize::from(reverse)];
        let now = p.now;
        match op {
            Op::OpenDial => {
                h.next_dial += 1;
                let random = DialId(h.next_dial);
                let (dialer, _) = ends(&mut p, reverse);
                if dialer
                    .open_dial(now, random, "tcp".into(), "127.0.0.1:1".into(), None)
                    .is_ok()
                {
                    h.server_dials.push(random);
                }
            }
            Op::AgentAnswer { pick: i, ok } => {
                let requested = answerer_log(&p, reverse).dial_requests();
                let (_, answerer) = ends(&mut p, reverse);
                let wanted: Vec<DialId> = requested
                    .into_iter()
                    .filter(|r| !h.answered.contains(r) && answerer.dial_wanted(*r))
                    .collect();
                if let Some(random) = pick(&wanted, i) {
                    h.answered.insert(random);
                    if ok {
                        h.agent_conns.extend(answerer.dial_succeeded(now, random));
                    } else {
                        answerer.dial_failed(random, "dial tcp: refused".into());
                    }
                }
            }
            Op::ServerTake { pick: i } => {
                let (dialer, _) = ends(&mut p, reverse);
                if let Some(random) = pick(&h.server_dials, i)
                    && let Some(result) = dialer.take_dial(random)
                {
                    h.server_dials.retain(|r| *r != random);
                    h.server_conns.extend(result.ok());
                }
            }
            Op::Abandon { pick: i } => {
                if let Some(random) = pick(&h.server_dials, i) {
                    h.server_dials.retain(|r| *r != random);
                    ends(&mut p, reverse).0.abandon_dial(now, random);
                }
            }
            Op::ServerSend { pick: i, len } => {
                if let Some(id) = pick(&h.server_conns, i) {
                    let _ = ends(&mut p, reverse)
                        .0
                        .send_data(id, Bytes::from(vec![1; usize::from(len) + 1]));
                }
            }
            Op::AgentSend { pick: i, len } => {
                if let Some(id) = pick(&h.agent_conns, i) {
                    let _ = ends(&mut p, reverse)
                        .1
                        .send_data(id, Bytes::from(vec![2; usize::from(len) + 1]));
                }
            }
            Op::ServerRecv { pick: i } => {
                if let Some(id) = pick(&h.server_conns, i) {
                    let dialer = ends(&mut p, reverse).0;
                    Pair::drain(dialer, now, id);
                    dialer.consumed(id);
                }
            }
            Op::AgentRecv { pick: i } => {
                if let Some(id) = pick(&h.agent_conns, i) {
                    let answerer = ends(&mut p, reverse).1;
                    Pair::drain(answerer, now, id);
                    answerer.consumed(id);
                }
            }
            Op::ServerClose { pick: i } => {
                if let Some(id) = pick(&h.server_conns, i) {
                    ends(&mut p, reverse).0.close(now, id);
                }
            }
            Op::AgentFinish { pick: i, error } => {
                if let Some(id) = pick(&h.agent_conns, i) {
                    h.agent_conns.retain(|c| *c != id);
                    let error = error.then(|| CloseError::Local("write to destination".into()));
                    ends(&mut p, reverse).1.finish(now, id, error);
                }
            }
            Op::ServerRelease { pick: i } => {
                if let Some(id) = pick(&h.server_conns, i) {
                    h.server_conns.retain(|c| *c != id);
                    ends(&mut p, reverse).0.release(now, id);
                }
            }
            Op::Drain => p.agent.drain(),
            Op::Junk { id } => {
                if !p.server.is_parked() {
                    let junk = Packet::Data {
                        connect_id: ConnectId(1_000_000 + id),
                        data: Bytes::from_static(b"junk"),
                    };
                    let _ = p.server.handle_packet(p.now, junk);
                }
            }
            Op::Pump => p.pump(),
            Op::Advance { millis } => p.advance(Duration::from_millis(u64::from(millis))),
        }
        check_bounds(&p.server);
        check_bounds(&p.agent);
    }

    // The stream ends; every holder lets go.
    p.pump();
    p.cut("stream cut");
    let now = p.now;
    for (reverse, h) in [false, true].into_iter().zip(&mut both) {
        let (dialer, answerer) = ends(&mut p, reverse);
        for random in std::mem::take(&mut h.server_dials) {
            match dialer.take_dial(random) {
                Some(Ok(id)) => dialer.release(now, id),
                Some(Err(_)) => {}
                None => {
                    dialer.abandon_dial(now, random);
                }
            }
        }
        for id in std::mem::take(&mut h.agent_conns) {
            answerer.finish(now, id, None);
        }
    }
    // Taken-on-cleanup connections are released like the rest.
    for side in [&mut p.server, &mut p.agent] {
        let leftover: Vec<ConnectId> = side
            .connections()
            .filter(|c| c.attached)
            .map(|c| c.id)
            .collect();
        for id in leftover {
            side.release(now, id);
        }
    }
    p.advance(Duration::from_secs(60));

    assert_eq!(
        p.server.connection_count(),
        0,
        "no connection outlives its stream"
    );
    assert_eq!(
        p.agent.connection_count(),
        0,
        "no connection outlives its stream"
    );
    assert_eq!(p.server.pending_dial_count(), 0, "every pending dial ended");
    assert_eq!(p.agent.pending_dial_count(), 0, "every pending dial ended");
    assert_eq!(p.server.queued_bytes(), 0);
    assert_eq!(p.agent.queued_bytes(), 0);
    p.assert_one_outcome_each();
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn credit_peers(ops in proptest::collection::vec((any::<bool>(), op()), 1..300)) {
        run(credit(), credit(), ops);
    }

    /// Both ends in upstream mode: no credit, local windows, a parking reader.
    #[test]
    fn legacy_peers(ops in proptest::collection::vec((any::<bool>(), op()), 1..300)) {
        run(legacy(), legacy(), ops);
    }
}
