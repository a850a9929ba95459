//! A peer link between two servers: the holder of agents announces them and answers dials
//! forwarded to them; the same packets on an agent stream are ignored, never acted on.

mod support;

use tether_proto::{DialId, Forward, Packet, PeerAgents, pb};
use tether_session::Event;

use support::Pair;

fn announcement() -> PeerAgents {
    PeerAgents {
        up: vec![pb::PeerAgent {
            agent_id: "node-1".into(),
            tenant: "default".into(),
            ..Default::default()
        }],
        down: vec!["node-2".into()],
    }
}

fn forward() -> Forward {
    Forward {
        agent_id: "node-1".into(),
        origin: pb::Origin {
            server_id: "server-b".into(),
            frontend: "grpc".into(),
            dial_id: 42,
            ..Default::default()
        },
    }
}

#[test]
fn a_peer_link_carries_announcements_and_forwarded_dials() {
    let mut p = Pair::peers(true);
    p.agent.announce_agents(announcement());
    p.server
        .open_dial(
            p.now,
            DialId(7),
            "tcp".into(),
            "10.0.0.1:10250".into(),
            Some(Box::new(forward())),
        )
        .unwrap();
    p.pump();
    assert!(
        p.server_log
            .events
            .contains(&Event::PeerAgents(Box::new(announcement())))
    );
    assert!(p.agent_log.events.contains(&Event::DialRequested {
        random: DialId(7),
        protocol: "tcp".into(),
        address: "10.0.0.1:10250".into(),
        forward: Some(Box::new(forward())),
    }));
    // Answered as any dial: the connection opens on both ends.
    p.agent.dial_succeeded(p.now, DialId(7)).unwrap();
    p.pump();
    assert_eq!(p.server.connection_count(), 1);
}

#[test]
fn an_agent_stream_ignores_peer_packets() {
    let mut p = Pair::peers(false);
    // Neither end sends them on an agent stream...
    p.agent.announce_agents(announcement());
    p.server
        .open_dial(
            p.now,
            DialId(7),
            "tcp".into(),
            "10.0.0.1:10250".into(),
            Some(Box::new(forward())),
        )
        .unwrap();
    p.pump();
    assert!(
        !p.server_log
            .sent
            .iter()
            .chain(&p.agent_log.sent)
            .any(|packet| matches!(
                packet,
                Packet::PeerAgents(_) | Packet::PeerDialRequest { .. }
            )),
        "a plain DIAL_REQ goes out instead"
    );
    // ...and a peer that sends them anyway is ignored.
    p.server
        .handle_packet(p.now, Packet::PeerAgents(Box::new(announcement())))
        .unwrap();
    p.agent
        .handle_packet(
            p.now,
            Packet::PeerDialRequest {
                protocol: "tcp".into(),
                address: "10.0.0.1:1".into(),
                random: DialId(8),
                forward: Box::new(forward()),
            },
        )
        .unwrap();
    p.pump();
    assert!(p.server_log.events.contains(&Event::Ignored {
        packet: "PEER_AGENTS"
    }));
    assert!(p.agent_log.events.contains(&Event::Ignored {
        packet: "PEER_DIAL_REQ"
    }));
    assert!(!p.agent_log.events.iter().any(|e| matches!(
        e,
        Event::DialRequested {
            random: DialId(8),
            ..
        }
    )));
}
