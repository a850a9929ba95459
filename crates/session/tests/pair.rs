//! Dial, close, cancel, credit, drain and deadline sequences between a server table and an
//! agent table wired back to back, with a controlled clock.

mod support;

use std::time::Duration;

use bytes::Bytes;
use support::{AGENT_DIAL_TIMEOUT, CLOSE_TIMEOUT, DIAL_TIMEOUT, Pair, legacy};
use tether_proto::{ConnectId, DialId, Packet};
use tether_session::{
    CloseError, DialCancel, DialError, Event, Initiator, Recv, SendError, Violation,
};

#[test]
fn a_connection_carries_data_both_ways_and_ends_once_at_each_end() {
    let mut p = Pair::credit();
    let id = p.connect(7);
    p.server.send_data(id, Bytes::from_static(b"ping")).unwrap();
    p.agent.send_data(id, Bytes::from_static(b"pong")).unwrap();
    p.pump();
    assert_eq!(Pair::drain(&mut p.agent, p.now, id).0, b"ping");
    assert_eq!(Pair::drain(&mut p.server, p.now, id).0, b"pong");

    // The frontend closes; the agent's relay sees a normal close and answers.
    p.server.close(p.now, id);
    p.pump();
    assert_eq!(
        Pair::drain(&mut p.agent, p.now, id).1,
        Some(Recv::Closed(None))
    );
    p.agent.finish(p.now, id, None);
    p.pump();
    assert_eq!(
        Pair::drain(&mut p.server, p.now, id).1,
        Some(Recv::Closed(None))
    );
    p.server.release(p.now, id);
    assert_eq!(p.server.connection_count(), 0);
    assert_eq!(p.agent.connection_count(), 0);
    let ended = p.server_log.ended();
    assert_eq!(ended[0].outcome.initiator, Initiator::Local);
    assert_eq!(ended[0].outcome.error, None);
    assert_eq!((ended[0].bytes_to_peer, ended[0].bytes_from_peer), (4, 4));
    assert_eq!(p.agent_log.ended()[0].outcome.initiator, Initiator::Peer);
    p.assert_one_outcome_each();
}

#[test]
fn a_destination_error_reaches_the_frontend_as_the_agents_close_error() {
    let mut p = Pair::credit();
    let id = p.connect(1);
    p.agent.finish(
        p.now,
        id,
        Some(CloseError::Local("read from destination: reset".into())),
    );
    p.pump();
    let (_, closed) = Pair::drain(&mut p.server, p.now, id);
    assert_eq!(
        closed,
        Some(Recv::Closed(Some(CloseError::Peer(
            "read from destination: reset".into()
        ))))
    );
    assert_eq!(p.server_log.ended()[0].outcome.initiator, Initiator::Peer);
}

#[test]
fn a_dial_the_agent_never_answers_times_out_and_a_late_answer_is_closed() {
    let mut p = Pair::credit();
    let random = p.open(42);
    // The DIAL_REQ is held back (a slow agent): only the server's clock moves.
    p.now += DIAL_TIMEOUT - Duration::from_millis(1);
    p.server.handle_timeout(p.now);
    assert_eq!(p.server.take_dial(random), None, "still pending");
    p.now += Duration::from_millis(1);
    p.server.handle_timeout(p.now);
    assert_eq!(p.server.take_dial(random), Some(Err(DialError::Timeout)));
    assert_eq!(p.server.pending_dial_count(), 0);
    // The agent gets DIAL_REQ and DIAL_CLS together, connects anyway, and answers.
    p.pump();
    assert_eq!(p.agent_log.dial_requests(), [random]);
    assert!(p.agent_log.events.contains(&Event::DialCancelled {
        random,
        why: DialCancel::ByPeer
    }));
    assert_eq!(p.agent.dial_succeeded(p.now, random), None, "dropped");
    assert_eq!(p.agent.connection_count(), 0);
}

#[test]
fn the_agent_answers_a_destination_that_takes_too_long_with_a_go_worded_timeout() {
    let mut p = Pair::credit();
    let random = p.open(43);
    p.pump();
    p.advance(AGENT_DIAL_TIMEOUT);
    assert!(p.agent_log.events.contains(&Event::DialCancelled {
        random,
        why: DialCancel::Timeout
    }));
    assert_eq!(
        p.server.take_dial(random),
        Some(Err(DialError::Endpoint(
            "dial tcp 127.0.0.1:9: i/o timeout".into()
        )))
    );
    assert_eq!(p.agent.dial_succeeded(p.now, random), None);
}

#[test]
fn an_answer_that_loses_the_race_with_the_dialer_giving_up_is_closed() {
    let mut p = Pair::credit();
    let random = p.open(5);
    p.pump();
    // The agent connected, but its DIAL_RSP is still in flight when the client leaves.
    let id = p.agent.dial_succeeded(p.now, random).unwrap();
    let mut batch = Vec::new();
    assert!(p.agent.poll_transmit(&mut batch, usize::MAX));
    assert_eq!(
        p.server.abandon_dial(p.now, random),
        tether_session::Abandoned::Pending
    );
    for item in batch {
        p.server.handle_packet(p.now, item.packet).unwrap();
    }
    p.pump();
    // DIAL_CLS came too late for the agent; the server's CLOSE_REQ closes what it opened.
    assert_eq!(
        Pair::drain(&mut p.agent, p.now, id).1,
        Some(Recv::Closed(None))
    );
    p.agent.finish(p.now, id, None);
    p.pump();
    assert_eq!(p.server.connection_count(), 0, "the orphan left");
    assert!(
        p.server_log.opened().is_empty(),
        "never a connection of the server's"
    );
}

/// Before the shared table, the agent checked that its stream was open, dropped the lock,
/// dialed, and inserted the connection without checking again: a stream that ended in
/// between left a connection nobody would close.
#[test]
fn a_dial_that_completes_after_its_stream_ended_is_not_registered() {
    let mut p = Pair::credit();
    let random = p.open(9);
    p.pump();
    p.cut("server stream failed");
    assert!(p.agent_log.events.contains(&Event::DialCancelled {
        random,
        why: DialCancel::StreamLost
    }));
    assert_eq!(p.agent.dial_succeeded(p.now, random), None);
    assert_eq!(p.agent.connection_count(), 0);
    assert_eq!(
        p.server.take_dial(random),
        Some(Err(DialError::StreamLost("server stream failed".into())))
    );
}

/// Before the shared table, a second DIAL_REQ with the same `random` replaced the first
/// dial's cancel token: the server's DIAL_CLS then cancelled only one of two dials.
#[test]
fn a_repeated_dial_id_is_refused_and_cancelling_reaches_the_first_dial() {
    let mut p = Pair::credit();
    let random = DialId(3);
    let request = || Packet::DialRequest {
        protocol: "tcp".into(),
        address: "127.0.0.1:9".into(),
        random,
    };
    p.agent.handle_packet(p.now, request()).unwrap();
    p.agent.handle_packet(p.now, request()).unwrap();
    assert_eq!(p.agent.pending_dial_count(), 1);
    let mut batch = Vec::new();
    assert!(p.agent.poll_transmit(&mut batch, usize::MAX));
    assert!(matches!(
        &batch[0].packet,
        Packet::DialResponse { random: r, result: Err(e) } if *r == random && e.contains("already being dialed")
    ));
    p.agent
        .handle_packet(p.now, Packet::CloseDial { random })
        .unwrap();
    assert!(!p.agent.dial_wanted(random));
    assert_eq!(p.agent.pending_dial_count(), 0);
}

#[test]
fn a_sender_waits_for_credit_and_resumes_when_the_receiver_consumes() {
    let mut p = Pair::credit();
    let id = p.connect(1);
    let chunk = Bytes::from(vec![7u8; 64 * 1024]);
    let mut sent = 0;
    let blocked = loop {
        match p.server.send_data(id, chunk.clone()) {
            Ok(()) => sent += 1,
            Err(e) => break e,
        }
        assert!(sent < 1000, "credit never ran out");
    };
    assert!(matches!(blocked, SendError::Blocked(_)));
    assert_eq!(sent, 16, "1 MiB of credit in 64 KiB chunks");
    p.pump();
    let (bytes, _) = Pair::drain(&mut p.agent, p.now, id);
    assert_eq!(bytes.len(), 16 * 64 * 1024);
    p.agent.consumed(id);
    p.pump();
    assert!(p.server_log.events.contains(&Event::Writable(id)));
    p.server.send_data(id, chunk).expect("credit came back");
}

#[test]
fn a_tether_peer_past_its_credit_loses_that_connection_alone() {
    let mut p = Pair::credit();
    let victim = p.connect(1);
    let other = p.connect(2);
    let limit = p
        .server
        .connections()
        .find(|c| c.id == victim)
        .unwrap()
        .limit;
    let mut queued = 0;
    while queued <= limit {
        p.server
            .handle_packet(
                p.now,
                Packet::Data {
                    connect_id: victim,
                    data: Bytes::from(vec![0; 64 * 1024]),
                },
            )
            .unwrap();
        queued += 64 * 1024;
    }
    p.pump();
    let (_, closed) = Pair::drain(&mut p.server, p.now, victim);
    assert_eq!(
        closed,
        Some(Recv::Closed(Some(CloseError::Overflow { limit })))
    );
    assert_eq!(p.server.queued_bytes(), 0, "the overflowed queue was freed");
    // The agent was told (CLOSE_REQ); the other connection is untouched.
    assert!(
        p.server_log
            .sent
            .contains(&Packet::CloseRequest { connect_id: victim })
    );
    p.agent.send_data(other, Bytes::from_static(b"hi")).unwrap();
    p.pump();
    assert_eq!(Pair::drain(&mut p.server, p.now, other).0, b"hi");
}

#[test]
fn an_upstream_peer_parks_the_reader_until_the_full_connection_progresses_or_stalls() {
    let mut p = Pair::new(legacy(), legacy());
    let id = p.connect(1);
    let buffer = p.server.connections().next().unwrap().limit;
    // The agent sends more than the server's connection may queue; nobody reads.
    for _ in 0..(buffer / (64 * 1024) + 2) {
        let _ = p.agent.send_data(id, Bytes::from(vec![1; 64 * 1024]));
        p.pump();
    }
    assert!(
        p.server.is_parked(),
        "the reader waits on the full connection"
    );
    // Progress (the frontend takes a chunk) settles the parked packet.
    assert!(matches!(p.server.recv(p.now, id), Recv::Data(_)));
    assert!(!p.server.is_parked());
    p.pump();
    assert!(p.server_log.events.contains(&Event::Unparked));
    // Fill again and stop reading: after the stall period the connection is given up.
    for _ in 0..(buffer / (64 * 1024) + 2) {
        let _ = p.agent.send_data(id, Bytes::from(vec![1; 64 * 1024]));
        p.pump();
    }
    assert!(p.server.is_parked());
    p.advance(Duration::from_secs(3));
    assert!(!p.server.is_parked());
    let (_, closed) = Pair::drain(&mut p.server, p.now, id);
    assert_eq!(
        closed,
        Some(Recv::Closed(Some(CloseError::Overflow { limit: buffer })))
    );
}

#[test]
fn a_close_the_agent_never_confirms_ends_at_the_close_deadline() {
    let mut p = Pair::credit();
    let id = p.connect(1);
    p.server.close(p.now, id);
    p.advance(CLOSE_TIMEOUT);
    assert_eq!(
        Pair::drain(&mut p.server, p.now, id).1,
        Some(Recv::Closed(Some(CloseError::CloseTimeout)))
    );
    p.server.release(p.now, id);
    assert_eq!(p.server.connection_count(), 0);
}

#[test]
fn losing_the_stream_fails_dials_and_ends_connections_with_an_error_at_once() {
    let mut p = Pair::credit();
    let a = p.connect(1);
    let b = p.connect(2);
    p.server.send_data(a, Bytes::from_static(b"x")).unwrap();
    p.server
        .open_dial(p.now, DialId(3), "tcp".into(), "127.0.0.1:9".into(), None)
        .unwrap();
    p.cut("agent stream failed");
    for id in [a, b] {
        let (_, closed) = Pair::drain(&mut p.server, p.now, id);
        assert_eq!(
            closed,
            Some(Recv::Closed(Some(CloseError::StreamLost(
                "agent stream failed".into()
            ))))
        );
        p.server.release(p.now, id);
    }
    assert!(p.server.take_dial(DialId(3)).unwrap().is_err());
    assert_eq!(
        p.server.send_data(a, Bytes::from_static(b"y")),
        Err(SendError::Closed)
    );
    assert_eq!(p.server.connection_count(), 0);
    assert_eq!(p.server.outbox_len(), 0);
    for id in [a, b] {
        p.agent.release(p.now, id);
    }
    assert_eq!(p.agent.connection_count(), 0);
    p.assert_one_outcome_each();
}

#[test]
fn a_draining_agent_is_noticed_once() {
    let mut p = Pair::credit();
    p.agent.drain();
    p.agent.drain();
    p.pump();
    assert!(p.server.peer_draining());
    let notices = p
        .server_log
        .events
        .iter()
        .filter(|e| **e == Event::PeerDraining)
        .count();
    assert_eq!(notices, 1);
}

#[test]
fn a_flood_of_packets_for_unknown_connections_ends_the_stream() {
    let mut p = Pair::credit();
    let junk = |i: i64| Packet::Data {
        connect_id: ConnectId(1_000_000 + i),
        data: Bytes::from_static(b"x"),
    };
    let mut result = Ok(());
    let mut i = 0;
    while result.is_ok() && i < 20_000 {
        result = p.server.handle_packet(p.now, junk(i));
        // The peer reads its replies, so only the strike count can end this.
        let mut batch = Vec::new();
        p.server.poll_transmit(&mut batch, usize::MAX);
        i += 1;
    }
    assert_eq!(result, Err(Violation::TooManyUnknown { limit: 10_000 }));
}

#[test]
fn a_peer_that_never_reads_its_replies_ends_the_stream_before_they_pile_up() {
    let mut p = Pair::credit();
    let mut result = Ok(());
    let mut i = 0;
    while result.is_ok() && i < 20_000 {
        result = p.agent.handle_packet(
            p.now,
            Packet::CloseRequest {
                connect_id: ConnectId(i + 1),
            },
        );
        i += 1;
    }
    assert_eq!(result, Err(Violation::ReplyBacklog { limit: 4096 }));
    assert!(p.agent.outbox_len() <= 4096);
}

#[test]
fn peer_error_texts_are_truncated() {
    let mut p = Pair::credit();
    let random = p.open(1);
    p.server
        .handle_packet(
            p.now,
            Packet::DialResponse {
                random,
                result: Err("é".repeat(4096)),
            },
        )
        .unwrap();
    let Some(Err(DialError::Endpoint(text))) = p.server.take_dial(random) else {
        panic!("dial should fail");
    };
    assert!(text.len() <= 1024 + '…'.len_utf8(), "{} bytes", text.len());
}

#[test]
fn dial_limits_and_duplicates_are_refused_before_anything_is_sent() {
    let mut p = Pair::credit();
    p.server
        .open_dial(p.now, DialId(1), "tcp".into(), "a:1".into(), None)
        .unwrap();
    assert_eq!(
        p.server
            .open_dial(p.now, DialId(1), "tcp".into(), "a:1".into(), None),
        Err(DialError::Duplicate(DialId(1)))
    );
    for i in 2..=4096 {
        p.server
            .open_dial(p.now, DialId(i), "tcp".into(), "a:1".into(), None)
            .unwrap();
    }
    assert_eq!(
        p.server
            .open_dial(p.now, DialId(5000), "tcp".into(), "a:1".into(), None),
        Err(DialError::TooManyPending { limit: 4096 })
    );
    assert_eq!(p.server.pending_dial_count(), 4096);
}
