//! A server-role `Link` and an agent-role `Link` back to back, each test run over both
//! transport kinds (the native link and gRPC, on an in-memory duplex): dials, data, closes,
//! and how a stream ends. The native link's own behaviour (PING, a silent peer, bad frames)
//! is tested against it alone, with a peer driven by hand where needed.

#[macro_use]
mod common;

use std::time::Duration;

use bytes::BytesMut;
use common::{
    EchoServer, Kind, LIMIT, Pair, Side, Wire, answer_tcp, assert_same, credit, default_flow,
    eventually, name, native_against_raw, payload, peer_of, raw_frame, recv_closed, recv_exact,
    send, transports, within,
};
use tether_grpc::Keepalive;
use tether_link::LinkError;
use tether_proto::link::{self, Close, Frame};
use tether_proto::{ConnectId, Packet};
use tether_tunnel::{
    CloseError, Closed, Direction, Initiator, MAX_CHUNK, Outcome, Role, TransportEnd, Tunnel,
};

on_both_transports!(
    a_dial_carries_bytes_exactly_both_ways,
    closing_from_either_end_ends_both_sides,
    a_final_stop_is_a_clean_end_at_the_peer,
    an_abort_is_a_cancelled_stream_at_the_peer,
);

/// A dial from the server is answered by the agent, which relays it to a TCP echo server:
/// 8 MiB go there and back byte for byte through a 128 KiB credit window (so each direction
/// needed dozens of grants), and the server's close then ends the connection at both ends.
async fn a_dial_carries_bytes_exactly_both_ways(kind: Kind) {
    const WINDOW: u32 = 128 * 1024;
    const LEN: usize = 8 * 1024 * 1024;
    let echo = EchoServer::start().await;
    let mut pair = Pair::with_flow(kind, credit(WINDOW)).await;
    let mut pending = pair.dial(&echo.addr.to_string());
    let agent_relay = answer_tcp(pair.agent.next_dial().await, std::future::pending());
    let mut tunnel = within("the dial's answer", pending.answer())
        .await
        .expect("the agent reached the echo server");

    let sent = payload(LEN, 1);
    let (up, down) = (&tunnel.up, &mut tunnel.down);
    let (delivered, echoed) = within("8 MiB there and back", async {
        tokio::join!(up.send(sent.clone()), recv_exact(down, LEN))
    })
    .await;
    delivered.expect("the connection takes all of it");
    assert_same(&echoed, &sent, "the echo");
    let windows = LEN / WINDOW as usize;
    for (who, side) in [("server", &pair.server), ("agent", &pair.agent)] {
        let grants = side.rec.packets_in("CREDIT");
        assert!(
            grants >= windows,
            "{who} heard {grants} grants for {windows} windows"
        );
        assert!(
            side.rec.packets_in("DATA") >= LEN / MAX_CHUNK,
            "{who}: DATA packets"
        );
        let info = side
            .link
            .inspect(|s| s.connections().next().expect("one connection"));
        assert_eq!(
            (info.bytes_to_peer, info.bytes_from_peer),
            (LEN as u64, LEN as u64),
            "{who}'s byte counts"
        );
    }

    tunnel.up.close_request();
    assert_eq!(recv_closed(&mut tunnel.down).await, None);
    drop(tunnel);
    let outcome = within("the agent's relay", agent_relay).await.unwrap();
    assert_eq!(outcome, None, "the agent's relay ended normally");
    pair.assert_idle().await;
    let ended = &pair.server.rec.ended()[0];
    assert_eq!(
        (ended.bytes_to_peer, ended.bytes_from_peer),
        (LEN as u64, LEN as u64)
    );
    pair.shutdown().await;
}

/// How a test ends a connection.
#[derive(Clone, Copy, Debug)]
enum CloseBy {
    /// The server (the dialer) asks the agent to close.
    ServerRequest,
    /// The server drops its tunnel, which asks the same.
    ServerDrop,
    /// The agent (the answerer) ends its side normally.
    AgentFinish,
    /// The agent drops its tunnel without ending it: an error for the server.
    AgentDrop,
}

/// Each way to close a connection, from either end, ends it at both: both owners see the
/// end (an error only when the agent dropped its tunnel), neither can send after, each end
/// records one outcome naming who closed, and both tables are empty again, one connection
/// after another on the same stream.
async fn closing_from_either_end_ends_both_sides(kind: Kind) {
    let mut pair = Pair::new(kind).await;
    let ways = [
        CloseBy::ServerRequest,
        CloseBy::ServerDrop,
        CloseBy::AgentFinish,
        CloseBy::AgentDrop,
    ];
    for (n, how) in ways.into_iter().enumerate() {
        let (mut server, mut agent) = pair.open().await;
        exchange(&mut server, &mut agent).await;
        let dropped = CloseError::Local("connection closed by agent".into());
        let (server_saw, agent_saw) = match how {
            CloseBy::ServerRequest => {
                server.up.close_request();
                assert_eq!(recv_closed(&mut agent.down).await, None, "{how:?}");
                assert_eq!(send(&agent.up, "late").await, Err(Closed));
                agent.finish(None);
                assert_eq!(recv_closed(&mut server.down).await, None, "{how:?}");
                assert_eq!(send(&server.up, "late").await, Err(Closed));
                drop(server);
                (normal(Initiator::Local), normal(Initiator::Peer))
            }
            CloseBy::ServerDrop => {
                drop(server);
                assert_eq!(recv_closed(&mut agent.down).await, None, "{how:?}");
                agent.finish(None);
                (normal(Initiator::Local), normal(Initiator::Peer))
            }
            CloseBy::AgentFinish => {
                agent.finish(None);
                assert_eq!(recv_closed(&mut server.down).await, None, "{how:?}");
                assert_eq!(send(&server.up, "late").await, Err(Closed));
                drop(server);
                (normal(Initiator::Peer), normal(Initiator::Local))
            }
            CloseBy::AgentDrop => {
                drop(agent);
                let error = CloseError::Peer(dropped.to_string());
                assert_eq!(recv_closed(&mut server.down).await, Some(error.clone()));
                drop(server);
                (
                    failed(Initiator::Peer, error),
                    failed(Initiator::Local, dropped),
                )
            }
        };
        pair.assert_idle().await;
        for (who, side, want) in [
            ("server", &pair.server, server_saw),
            ("agent", &pair.agent, agent_saw),
        ] {
            let ended = side.rec.ended();
            assert_eq!(ended.len(), n + 1, "{how:?}: {who} records one end each");
            assert_eq!(ended[n].outcome, want, "{how:?}: {who}'s outcome");
        }
    }
    pair.shutdown().await;
}

/// A normal close's outcome, closed by `initiator`.
fn normal(initiator: Initiator) -> Outcome {
    Outcome {
        initiator,
        error: None,
    }
}

/// An abnormal close's outcome.
fn failed(initiator: Initiator, error: CloseError) -> Outcome {
    Outcome {
        initiator,
        error: Some(error),
    }
}

/// A few bytes each way on a fresh connection.
async fn exchange(server: &mut Tunnel, agent: &mut Tunnel) {
    send(&server.up, "ping").await.unwrap();
    assert_eq!(recv_exact(&mut agent.down, 4).await, b"ping");
    send(&agent.up, "pong").await.unwrap();
    assert_eq!(recv_exact(&mut server.down, 4).await, b"pong");
}

/// A stream its owner stops on purpose (`stop` resolves with `Final`) ends cleanly at the
/// peer, from either end: the peer's `run_transport` returns `Final("... closed the
/// stream")` with no stream error, and once the owners close their tables the open
/// connection ends at both as lost with the stream.
async fn a_final_stop_is_a_clean_end_at_the_peer(kind: Kind) {
    for stopping in [Role::Server, Role::Agent] {
        let mut pair = Pair::new(kind).await;
        let (mut server, mut agent) = pair.open().await;
        exchange(&mut server, &mut agent).await;
        let (stopper, peer) = pair.sides(stopping);
        stopper.stop(TransportEnd::Final("done here".into()));
        assert_eq!(
            stopper.ended().await,
            TransportEnd::Final("done here".into())
        );
        assert_eq!(
            peer.ended().await,
            TransportEnd::Final(format!("{} closed the stream", name(stopping)))
        );
        for side in [&pair.server, &pair.agent] {
            let errors = side.rec.stream_errors();
            assert!(errors.is_empty(), "{stopping:?} stopped: {errors:?}");
            side.link.close("stream over");
        }
        let lost = Some(CloseError::StreamLost("stream over".into()));
        assert_eq!(recv_closed(&mut server.down).await, lost);
        assert_eq!(recv_closed(&mut agent.down).await, lost);
        drop((server, agent));
        pair.assert_idle().await;
        pair.wire.finished().await;
    }
}

/// How a test gives a transport up without ending it.
#[derive(Clone, Copy, Debug)]
enum GiveUp {
    /// `stop` resolves with `Broken`: `run_transport` drops its writer unfinished.
    Stop,
    /// `Transport::abort` on a transport never run.
    Abort,
    /// The transport dropped, never run.
    Drop,
    /// `run_transport`'s future dropped while it runs (its owner's task aborted): its
    /// writer task ends with it, rather than holding the stream open.
    DropRunning,
}

/// A transport given up rather than ended, from either end and in each way, is a broken
/// stream at the peer: its `run_transport` returns `Broken` saying the other end cancelled
/// the stream, and the cancellation is the one stream error it records.
async fn an_abort_is_a_cancelled_stream_at_the_peer(kind: Kind) {
    for aborting in [Role::Server, Role::Agent] {
        for how in [
            GiveUp::Stop,
            GiveUp::Abort,
            GiveUp::Drop,
            GiveUp::DropRunning,
        ] {
            let t = transports(kind).await;
            let (aborted, kept) = match aborting {
                Role::Server => (t.server, t.agent),
                Role::Agent => (t.agent, t.server),
            };
            let mut peer = Side::new(peer_of(aborting), default_flow());
            peer.run(kept);
            match how {
                GiveUp::Stop => {
                    let mut side = Side::new(aborting, default_flow());
                    side.run(aborted);
                    side.stop(TransportEnd::Broken("given up".into()));
                    assert_eq!(side.ended().await, TransportEnd::Broken("given up".into()));
                }
                GiveUp::Abort => aborted.abort(),
                GiveUp::Drop => drop(aborted),
                GiveUp::DropRunning => {
                    let mut side = Side::new(aborting, default_flow());
                    side.run(aborted);
                    side.abort_run().await;
                }
            }
            let end = peer.ended().await;
            assert_eq!(
                end,
                TransportEnd::Broken(format!(
                    "{} cancelled the stream (it stopped, restarted or gave it up)",
                    name(aborting)
                )),
                "{aborting:?} {how:?}"
            );
            let errors = peer.rec.stream_errors();
            assert_eq!(errors.len(), 1, "{aborting:?} {how:?}: {errors:?}");
            assert_eq!(errors[0].0, Direction::In);
            t.wire.finished().await;
        }
    }
}

/// A PING from either end of a native link is answered by the other's stream writer: each
/// end's keepalive records a PONG, and ends with the link.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn native_a_ping_is_answered_at_either_end() {
    let pair = Pair::new(Kind::Native).await;
    let Wire::Native { server, agent } = &pair.wire else {
        unreachable!("a native pair")
    };
    let keepalive = Keepalive {
        interval: Duration::from_millis(50),
        timeout: LIMIT,
    };
    let mut pingers = Vec::new();
    for (who, handle) in [("agent", agent), ("server", server)] {
        let liveness = handle.liveness();
        assert_eq!(liveness.get(), None, "{who}: no PING yet");
        pingers.push(tokio::spawn(handle.clone().keep_alive(keepalive)));
        eventually(&format!("the {who}'s PING answered"), || {
            liveness.get().is_some()
        })
        .await;
    }
    pair.shutdown().await;
    for pinger in pingers {
        within("the keepalive to end with its link", pinger)
            .await
            .unwrap();
    }
}

/// On a native link, a PACKET frame that is not a packet (undecodable, or of an unknown
/// packet type) and a DATA frame for connection 0 are each counted as one bad packet and
/// dropped; the stream goes on, and the packet after them arrives.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn native_a_bad_packet_is_counted_and_the_stream_goes_on() {
    let (transport, _handle, mut agent) = native_against_raw(Role::Server).await;
    let mut server = Side::new(Role::Server, default_flow());
    server.run(transport);

    let packet = link::Kind::Packet as u8;
    agent.write(&raw_frame(packet, &[0xff; 4])).await;
    // Field 1, the packet type, as 99.
    agent.write(&raw_frame(packet, &[0x08, 99])).await;
    let mut data = BytesMut::new();
    link::encode_data_header(ConnectId(0), 3, &mut data);
    data.extend_from_slice(b"abc");
    agent.write(&data).await;
    agent.send(&Frame::Packet(Packet::Drain)).await;

    eventually("the DRAIN after the bad packets", || {
        server.rec.packets_in("DRAIN") == 1
    })
    .await;
    assert_eq!(server.rec.bad_packets(), 3);
    assert!(server.link.inspect(|s| s.peer_draining()));
    assert!(server.is_running(), "the stream goes on");
    assert!(server.rec.stream_errors().is_empty());

    agent
        .send(&Frame::Close(Close {
            code: 0,
            message: String::new(),
        }))
        .await;
    assert_eq!(
        server.ended().await,
        TransportEnd::Final("agent closed the stream".into())
    );
}

/// On a native link, a frame of a type nobody announced ends the stream at either end, and
/// what came before it was taken.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn native_an_unknown_frame_type_ends_the_stream() {
    for role in [Role::Agent, Role::Server] {
        let (transport, _handle, mut peer) = native_against_raw(role).await;
        let mut side = Side::new(role, default_flow());
        side.run(transport);
        let credit = Packet::Credit {
            connect_id: ConnectId(9),
            bytes: 1,
        };
        peer.send(&Frame::Packet(credit)).await;
        peer.write(&raw_frame(0x7f, b"from a later version")).await;
        let unknown = LinkError::Frame(link::LinkError::UnknownKind(0x7f)).to_string();
        assert_eq!(
            side.ended().await,
            TransportEnd::Broken(format!("{} stream failed: {unknown}", name(peer_of(role))))
        );
        assert_eq!(side.rec.packets_in("CREDIT"), 1, "{role:?}");
        assert_eq!(side.rec.stream_errors(), [(Direction::In, unknown)]);
    }
}
