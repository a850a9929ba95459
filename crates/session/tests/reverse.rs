//! Reverse dials (agent → control plane) in the same table as forward ones: the agent is the
//! dialer, the server the answerer, on tether-only packet types and negative connection IDs.

mod support;

use bytes::Bytes;
use support::{AGENT_DIAL_TIMEOUT, Pair};
use tether_proto::{ConnectId, DialId, Packet};
use tether_session::{CloseError, DialCancel, DialError, Event, Initiator, Recv};

/// Opens a reverse dial at the agent and lets the server connect at once.
fn reverse_connect(p: &mut Pair, random: i64) -> ConnectId {
    let random = DialId(random);
    p.agent
        .open_dial(p.now, random, "tcp".into(), String::new(), None)
        .expect("dial opens");
    p.pump();
    let id = p.server.dial_succeeded(p.now, random).expect("dial wanted");
    p.pump();
    assert_eq!(p.agent.take_dial(random).expect("settled"), Ok(id));
    id
}

#[test]
fn a_reverse_connection_carries_data_and_closes_like_a_forward_one() {
    let mut p = Pair::credit();
    let id = reverse_connect(&mut p, 11);
    assert!(id.is_reverse(), "the server allocates negative IDs: {id}");
    assert!(matches!(
        p.agent_log.sent[0],
        Packet::ReverseDialRequest { ref address, .. } if address.is_empty()
    ));
    assert!(matches!(
        p.server_log.sent[0],
        Packet::ReverseDialResponse { result: Ok(got), .. } if got == id
    ));
    assert!(
        p.server_log.dial_requests() == [DialId(11)],
        "the server is asked to dial"
    );

    p.agent
        .send_data(id, Bytes::from_static(b"GET /api"))
        .unwrap();
    p.server
        .send_data(id, Bytes::from_static(b"200 OK"))
        .unwrap();
    p.pump();
    assert_eq!(Pair::drain(&mut p.server, p.now, id).0, b"GET /api");
    assert_eq!(Pair::drain(&mut p.agent, p.now, id).0, b"200 OK");

    // The node-side client leaves: the agent (dialer) asks to close, the server's relay
    // sees a normal close and confirms.
    p.agent.close(p.now, id);
    p.pump();
    assert!(
        p.agent_log
            .sent
            .contains(&Packet::CloseRequest { connect_id: id })
    );
    assert_eq!(
        Pair::drain(&mut p.server, p.now, id).1,
        Some(Recv::Closed(None))
    );
    p.server.finish(p.now, id, None);
    p.pump();
    assert_eq!(
        Pair::drain(&mut p.agent, p.now, id).1,
        Some(Recv::Closed(None))
    );
    p.agent.release(p.now, id);
    assert_eq!(p.server.connection_count(), 0);
    assert_eq!(p.agent.connection_count(), 0);
    let agent_end = p.agent_log.ended()[0];
    assert_eq!(agent_end.outcome.initiator, Initiator::Local);
    assert_eq!(agent_end.bytes_to_peer, 8);
    assert_eq!(p.server_log.ended()[0].outcome.initiator, Initiator::Peer);
    p.assert_one_outcome_each();
}

#[test]
fn forward_and_reverse_connections_share_the_table_without_colliding() {
    let mut p = Pair::credit();
    let forward = p.connect(1);
    let reverse = reverse_connect(&mut p, 1);
    assert_eq!(forward, ConnectId(1));
    assert_eq!(reverse, ConnectId(-1));
    p.server
        .send_data(forward, Bytes::from_static(b"f"))
        .unwrap();
    p.agent
        .send_data(reverse, Bytes::from_static(b"r"))
        .unwrap();
    p.pump();
    assert_eq!(Pair::drain(&mut p.agent, p.now, forward).0, b"f");
    assert_eq!(Pair::drain(&mut p.server, p.now, reverse).0, b"r");

    // The server's relay of the reverse connection fails; the forward one is untouched.
    p.server.finish(
        p.now,
        reverse,
        Some(CloseError::Local("connection refused".into())),
    );
    p.pump();
    assert!(matches!(
        Pair::drain(&mut p.agent, p.now, reverse).1,
        Some(Recv::Closed(Some(CloseError::Peer(text)))) if text == "connection refused"
    ));
    p.agent.release(p.now, reverse);
    assert_eq!(p.agent.connection_count(), 1);
    assert_eq!(p.server.connection_count(), 1);
    p.server
        .send_data(forward, Bytes::from_static(b"still"))
        .unwrap();
    p.pump();
    assert_eq!(Pair::drain(&mut p.agent, p.now, forward).0, b"still");
}

#[test]
fn a_refused_reverse_dial_reaches_the_agent_with_the_servers_reason() {
    let mut p = Pair::credit();
    p.agent
        .open_dial(p.now, DialId(5), "tcp".into(), "10.0.0.1:22".into(), None)
        .unwrap();
    p.pump();
    assert!(p.server.dial_failed(
        DialId(5),
        "10.0.0.1:22 is not an allowed control-plane endpoint".into()
    ));
    p.pump();
    assert_eq!(
        p.agent.take_dial(DialId(5)),
        Some(Err(DialError::Endpoint(
            "10.0.0.1:22 is not an allowed control-plane endpoint".into()
        )))
    );
    assert_eq!(p.agent.pending_dial_count(), 0);
    assert_eq!(p.server.pending_dial_count(), 0);
}

#[test]
fn an_answer_outside_the_answerers_id_range_is_refused() {
    let mut p = Pair::credit();
    p.agent
        .open_dial(p.now, DialId(3), "tcp".into(), String::new(), None)
        .unwrap();
    p.pump();
    // A server answering a reverse dial with a positive (agent-range) ID.
    p.agent
        .handle_packet(
            p.now,
            Packet::ReverseDialResponse {
                random: DialId(3),
                result: Ok(ConnectId(4)),
            },
        )
        .unwrap();
    assert!(matches!(
        p.agent.take_dial(DialId(3)),
        Some(Err(DialError::Endpoint(text))) if text.contains("outside the range")
    ));
    // And an agent answering a forward dial with a negative (server-range) ID.
    p.open(8);
    p.server
        .handle_packet(
            p.now,
            Packet::DialResponse {
                random: DialId(8),
                result: Ok(ConnectId(-1)),
            },
        )
        .unwrap();
    assert!(matches!(
        p.server.take_dial(DialId(8)),
        Some(Err(DialError::Endpoint(_)))
    ));
    assert_eq!(p.server.connection_count(), 0);
    assert_eq!(p.agent.connection_count(), 0);
}

#[test]
fn an_agent_that_gives_up_a_reverse_dial_cancels_it_at_the_server() {
    let mut p = Pair::credit();
    p.agent
        .open_dial(p.now, DialId(9), "tcp".into(), String::new(), None)
        .unwrap();
    p.pump();
    p.agent.abandon_dial(p.now, DialId(9));
    p.pump();
    assert!(
        p.agent_log
            .sent
            .contains(&Packet::ReverseCloseDial { random: DialId(9) })
    );
    assert!(p.server_log.events.contains(&Event::DialCancelled {
        random: DialId(9),
        why: DialCancel::ByPeer
    }));
    assert!(!p.server.dial_wanted(DialId(9)));
}

#[test]
fn a_reverse_dial_the_server_never_answers_times_out_at_the_agent() {
    let mut p = Pair::credit();
    p.agent
        .open_dial(p.now, DialId(4), "tcp".into(), String::new(), None)
        .unwrap();
    p.pump();
    // The agent's dial timeout (the harness's agent value) passes before the server's own
    // dialing deadline (its dial timeout) does.
    p.advance(AGENT_DIAL_TIMEOUT);
    assert_eq!(p.agent.take_dial(DialId(4)), Some(Err(DialError::Timeout)));
    assert!(
        p.agent_log
            .sent
            .contains(&Packet::ReverseCloseDial { random: DialId(4) })
    );
    assert!(!p.server.dial_wanted(DialId(4)), "the server forgot it too");
}

#[test]
fn losing_the_stream_ends_reverse_connections_with_an_error_at_both_ends() {
    let mut p = Pair::credit();
    let id = reverse_connect(&mut p, 2);
    p.cut("stream reset");
    for side in [&mut p.agent, &mut p.server] {
        assert!(matches!(
            Pair::drain(side, p.now, id).1,
            Some(Recv::Closed(Some(CloseError::StreamLost(_))))
        ));
    }
    p.assert_one_outcome_each();
}
