//! A stream's deadlines on tokio's paused clock, over each transport: the dial deadline,
//! the close deadline, a legacy peer's stall, a native link's keepalive and the resume
//! window each fire at the instant their setting names (not a millisecond early), and leave
//! both tables as they should be. Time moves only when every task waits, so a 10 s
//! deadline costs no real time and the test can check when each thing happened.
//!
//! The driver can be tested this way because it reads time through tokio's clock
//! (`clippy.toml` forbids `std::time::Instant::now`).

#[macro_use]
mod common;

use std::time::Duration;

use common::{
    Kind, LIMIT, Pair, Side, assert_same, credit, default_flow, name, native_against_raw, payload,
    peer_of, recv_closed, recv_exact, send, transports, within,
};
use tether_grpc::Keepalive;
use tether_link::LinkError;
use tether_observe::metrics::Registry;
use tether_tunnel::{
    CloseError, ConnEvent, DialError, FlowConfig, ResumeMetrics, Role, TransportEnd, TunnelDown,
};
use tokio::sync::oneshot;
use tokio::time::Instant;

paused_on_both_transports!(
    a_dial_nobody_answers_fails_at_the_dial_deadline,
    a_close_the_answerer_never_confirms_ends_at_the_close_deadline,
    a_full_connection_of_a_legacy_peer_is_reset_after_the_stall,
    a_stream_resumed_just_inside_its_window_loses_nothing,
    a_stream_not_resumed_ends_when_its_window_closes,
);

/// Tokio's timer fires on millisecond ticks: a deadline is met at its instant or within
/// the tick after it.
const TICK: Duration = Duration::from_millis(1);

/// Panics unless `since.elapsed()` is `want` (within one timer tick after it).
fn assert_elapsed(since: Instant, want: Duration, what: &str) {
    let elapsed = since.elapsed();
    assert!(
        elapsed >= want && elapsed <= want + TICK,
        "{what} after {elapsed:?}, not at {want:?}"
    );
}

/// A dial the agent's owner holds without answering fails at the server with a timeout at
/// exactly the dial deadline; the agent's table gives its side up at its own deadline (the
/// owner's handle sees the dial abandoned), and both tables are empty after.
async fn a_dial_nobody_answers_fails_at_the_dial_deadline(kind: Kind) {
    const DIAL: Duration = Duration::from_secs(7);
    let mut pair = Pair::with_config(kind, default_flow(), |c| c.dial_timeout = DIAL).await;
    let start = Instant::now();
    let mut pending = pair.dial("held.test:80");
    let held = pair.agent.next_dial().await;
    assert_eq!(held.address, "held.test:80");
    let answer = within("the dial's deadline", pending.answer()).await;
    assert_eq!(answer.err(), Some(DialError::Timeout));
    assert_elapsed(start, DIAL, "the server's dial failed");
    within("the agent's side of the dial", held.dial.abandoned()).await;
    assert_elapsed(start, DIAL, "the agent gave its side up");
    assert_eq!(held.dial.accept().map(|t| t.connect_id()), None);
    pair.assert_idle().await;
    pair.shutdown().await;
}

/// The server asks to close a connection whose agent owner hears it and never lets go: the
/// server's owner sees the close time out at exactly the close deadline, while the agent's
/// table keeps the connection for its owner. Once that owner lets go, both are empty.
async fn a_close_the_answerer_never_confirms_ends_at_the_close_deadline(kind: Kind) {
    const CLOSE: Duration = Duration::from_secs(5);
    let mut pair = Pair::with_config(kind, default_flow(), |c| c.close_timeout = CLOSE).await;
    let (mut server, mut agent) = pair.open().await;
    let start = Instant::now();
    server.up.close_request();
    assert_eq!(
        recv_closed(&mut agent.down).await,
        None,
        "the agent hears it"
    );
    assert_eq!(start.elapsed(), Duration::ZERO, "at once");
    assert_eq!(
        recv_closed(&mut server.down).await,
        Some(CloseError::CloseTimeout)
    );
    assert_elapsed(start, CLOSE, "the close timed out");
    drop(server);
    assert_eq!(pair.server.link.inspect(|s| s.connection_count()), 0);
    assert_eq!(pair.agent.link.inspect(|s| s.connection_count()), 1);
    // Its CLOSE_RSP, late, is absorbed by the server.
    agent.finish(None);
    pair.assert_idle().await;
    assert_eq!(pair.server.rec.bad_packets(), 0);
    pair.shutdown().await;
}

/// With a peer that grants no credit (upstream's), a connection whose owner stops reading
/// fills its buffer and parks the stream's reader: the other connection's bytes wait
/// behind it. At exactly the stall period the full connection is reset with an overflow,
/// the reader goes on, and the other connection's bytes arrive whole.
async fn a_full_connection_of_a_legacy_peer_is_reset_after_the_stall(kind: Kind) {
    const BUFFER: usize = 64 * 1024;
    const STALL: Duration = Duration::from_secs(3);
    let legacy = FlowConfig {
        legacy_buffer: BUFFER,
        legacy_stall: STALL,
        ..FlowConfig::default()
    }
    .negotiate(None);
    assert!(!legacy.is_credit());
    let mut pair = Pair::with_flow(kind, legacy).await;
    let (stuck_server, mut stuck_agent) = pair.open().await;
    let (other_server, mut other_agent) = pair.open().await;
    let start = Instant::now();
    send(&stuck_server.up, payload(4 * BUFFER, 1))
        .await
        .unwrap();
    // Sleeping lets every task run to a standstill first; the reader parked at the start.
    tokio::time::sleep(TICK).await;
    assert!(
        pair.agent.link.inspect(|s| s.is_parked()),
        "the reader waits"
    );
    let behind = payload(1000, 2);
    send(&other_server.up, behind.clone()).await.unwrap();
    let got = recv_exact(&mut other_agent.down, behind.len()).await;
    assert_elapsed(start, STALL, "the other connection's bytes arrived");
    assert_eq!(got, behind);
    // What the stuck connection had queued is dropped with it.
    assert_eq!(
        recv_closed(&mut stuck_agent.down).await,
        Some(CloseError::Overflow { limit: BUFFER })
    );
    drop((stuck_server, stuck_agent, other_server, other_agent));
    pair.assert_idle().await;
    pair.shutdown().await;
}

/// The window every resume test uses.
const WINDOW: Duration = Duration::from_secs(10);

/// Both ends of a resumable stream lose their transport in the middle of a transfer and
/// suspend; what the server sends meanwhile waits in its table. A new transport comes a
/// tick before the window closes: both ends resume from what the other received, and the
/// agent's owner gets every byte once, in order, with no error.
async fn a_stream_resumed_just_inside_its_window_loses_nothing(kind: Kind) {
    let mut pair = Pair::with_config(kind, credit(256 * 1024), |c| c.resumable = true).await;
    let metrics = ResumeMetrics::register(&Registry::default(), "test");
    let (server, mut agent) = pair.open().await;
    let before = payload(300 * 1024, 3);
    let (sent, mut got) = tokio::join!(
        send(&server.up, before.clone()),
        recv_at_least(&mut agent.down, 100 * 1024)
    );
    sent.unwrap();

    let cut_at = Instant::now();
    pair.server.stop(TransportEnd::Broken("cut".into()));
    assert_eq!(
        pair.server.ended().await,
        TransportEnd::Broken("cut".into())
    );
    assert!(matches!(pair.agent.ended().await, TransportEnd::Broken(_)));
    let server_suspended = pair.server.link.suspend(WINDOW, &metrics).unwrap();
    let agent_suspended = pair.agent.link.suspend(WINDOW, &metrics).unwrap();
    let during = payload(8 * 1024, 4);
    send(&server.up, during.clone()).await.unwrap();

    let (agent_next, agent_takes) = oneshot::channel();
    let (server_side, agent_side) = tokio::join!(
        pair.server.link.wait_resumed(async {
            tokio::time::sleep_until(cut_at + WINDOW - TICK).await;
            let t = transports(kind).await;
            agent_next.send(t.agent).unwrap();
            (t.server, t.wire)
        }),
        pair.agent.link.wait_resumed(agent_takes),
    );
    let (server_transport, wire) = server_side.expect("resumed inside the window");
    let agent_transport = agent_side.expect("resumed inside the window").unwrap();
    let (server_received, agent_received) = (
        pair.server.link.resume_point().unwrap(),
        pair.agent.link.resume_point().unwrap(),
    );
    pair.server
        .link
        .resume(agent_received, server_suspended, &metrics)
        .unwrap();
    pair.agent
        .link
        .resume(server_received, agent_suspended, &metrics)
        .unwrap();
    pair.server.run(server_transport);
    pair.agent.run(agent_transport);
    let old_wire = std::mem::replace(&mut pair.wire, wire);
    old_wire.finished().await;

    let rest = before.len() + during.len() - got.len();
    got.extend(recv_exact(&mut agent.down, rest).await);
    assert_same(
        &got,
        &[before, during].concat(),
        "what the agent's owner got",
    );
    assert!(agent.down.try_recv().is_none(), "nothing more, no end");
    drop((server, agent));
    pair.assert_idle().await;
    pair.shutdown().await;
}

/// At least `len` bytes from the peer on `down`, in the chunks they came in.
async fn recv_at_least(down: &mut TunnelDown, len: usize) -> Vec<u8> {
    let mut got = Vec::new();
    while got.len() < len {
        match within("data from the peer", down.recv()).await {
            ConnEvent::Data(data) => got.extend_from_slice(&data),
            ConnEvent::Closed(error) => panic!("closed ({error:?}) after {} bytes", got.len()),
        }
        down.consumed();
    }
    got
}

/// Both ends suspend and no transport comes: at exactly the window the tables end the
/// stream, and each owner sees its connection lost with it (not a clean end).
async fn a_stream_not_resumed_ends_when_its_window_closes(kind: Kind) {
    let mut pair = Pair::with_config(kind, default_flow(), |c| c.resumable = true).await;
    let metrics = ResumeMetrics::register(&Registry::default(), "test");
    let (mut server, mut agent) = pair.open().await;
    let cut_at = Instant::now();
    pair.agent.stop(TransportEnd::Broken("cut".into()));
    pair.agent.ended().await;
    pair.server.ended().await;
    let _suspended = (
        pair.server.link.suspend(WINDOW, &metrics).unwrap(),
        pair.agent.link.suspend(WINDOW, &metrics).unwrap(),
    );
    let never = std::future::pending::<()>;
    let (server_side, agent_side) = tokio::join!(
        pair.server.link.wait_resumed(never()),
        pair.agent.link.wait_resumed(never()),
    );
    assert_eq!((server_side, agent_side), (None, None));
    assert_elapsed(cut_at, WINDOW, "the window closed");
    for (who, down) in [("server", &mut server.down), ("agent", &mut agent.down)] {
        match within("the connection's end", down.recv()).await {
            ConnEvent::Closed(Some(CloseError::StreamLost(why))) => {
                assert!(why.contains("--resume-window"), "{who}: {why}");
            }
            other => panic!("{who}: {other:?}"),
        }
    }
    drop((server, agent));
    pair.assert_idle().await;
    let wire = pair.wire;
    wire.finished().await;
}

/// A native link whose peer stops reading (the bytes stay open, nobody reads them) is
/// given up by its keepalive at exactly one interval (the first PING) plus the timeout, at
/// either end, with the unanswered PING as the stream's error. (gRPC's keepalive is h2's.)
#[tokio::test(start_paused = true)]
async fn native_a_silent_peer_is_given_up_at_interval_plus_timeout() {
    const INTERVAL: Duration = Duration::from_secs(4);
    const TIMEOUT: Duration = Duration::from_secs(6);
    assert!(INTERVAL + TIMEOUT < LIMIT);
    for role in [Role::Agent, Role::Server] {
        let (transport, handle, silent_peer) = native_against_raw(role).await;
        let mut side = Side::new(role, default_flow());
        side.run(transport);
        let start = Instant::now();
        let pinger = tokio::spawn(handle.clone().keep_alive(Keepalive {
            interval: INTERVAL,
            timeout: TIMEOUT,
        }));
        let unresponsive = LinkError::Unresponsive(TIMEOUT).to_string();
        assert_eq!(
            side.ended().await,
            TransportEnd::Broken(format!(
                "{} stream failed: {unresponsive}",
                name(peer_of(role))
            ))
        );
        assert_elapsed(start, INTERVAL + TIMEOUT, "given up");
        assert_eq!(handle.liveness().get(), None, "no PONG ever came");
        within("the keepalive to end", pinger).await.unwrap();
        drop(silent_peer);
    }
}
