//! Resumable agent streams: a loopback relay between the agent and the server is cut (every
//! connection through it reset), and the tunnelled connections go on as if nothing happened,
//! byte-exact, or, when the server lost its state or the agent restarted, end with an error
//! at once. The tests take turns (`SERIAL`): each moves gigabytes or hundreds of connections
//! on 2 cores. The cut that outlasts the window, with its descriptor count, is its own binary
//! (`tests/resume_window.rs`).

mod setup;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;
use tokio::time::Instant;

use setup::*;
use tether_agent::{ControlPlaneConfig, ControlPlaneProtocol, ListenAddr};
use tether_client::{GrpcClient, Transport};
use tether_server::ControlPlaneEndpoints;
use tether_testkit::http::metric_value;
use tether_testkit::targets::EchoServer;
use tether_testkit::{AgentOptions, ServerOptions, TestAgent, TestServer};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gib_each_way_stays_byte_exact_across_five_cuts() {
    let _serial = SERIAL.lock().await;
    let s = Setup::start(Duration::from_secs(30)).await;
    let tunnel = s.client.dial(&s.echo.addr.to_string()).await.unwrap();
    let progress = Arc::new(AtomicU64::new(0));
    let transfer = tokio::spawn(echo_pattern(tunnel, GIB, progress.clone()));
    // Five cuts at random points of the transfer, each once the last one resumed.
    let mut points: Vec<u64> = (0..5)
        .map(|_| tether_proto::random_u64() % (GIB - GIB / 8))
        .collect();
    points.sort_unstable();
    // The transfer's pace is the machine's: one deadline for all of it, not one per cut.
    let deadline = Instant::now() + Duration::from_secs(300);
    for point in points {
        eventually_by(
            "the transfer reaches the next cut point",
            deadline,
            || async { progress.load(Ordering::Relaxed) >= point },
        )
        .await;
        s.cut_and_wait().await;
    }
    tokio::time::timeout_at(deadline, transfer)
        .await
        .expect("the transfer ends")
        .expect("byte-exact both ways");
    assert_eq!(s.agent_metric(RESUMES_AGENT).await, 5.0);
    assert_eq!(s.server_metric(RESUMES_SERVER).await, 5.0);
    for (side, text) in [
        ("agent", s.agent.metrics().await.unwrap()),
        ("server", s.server.metrics().await.unwrap()),
    ] {
        assert!(no_resume_failure(&text), "{side} reports a failed resume");
        eprintln!(
            "{side}: replayed {} bytes in {} packets over 5 resumes, pause sum {:.1} ms",
            metric_value(&text, &format!("tether_{side}_resume_replayed_bytes_total")).unwrap(),
            metric_value(
                &text,
                &format!("tether_{side}_resume_replayed_packets_total")
            )
            .unwrap(),
            metric_value(&text, &format!("tether_{side}_resume_pause_seconds_sum")).unwrap()
                * 1000.0
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ping_pong_keeps_going_across_cuts() {
    let _serial = SERIAL.lock().await;
    let s = Setup::start(Duration::from_secs(30)).await;
    let mut tunnel = s.client.dial(&s.echo.addr.to_string()).await.unwrap();
    let mut round_trips = Vec::new();
    let mut cut_rounds = Vec::new();
    let mut ping = [0u8; 64];
    let mut pong = [0u8; 64];
    for round in 0..600u32 {
        if round % 100 == 50 {
            s.relay.cut().await;
            cut_rounds.push(round_trips.len());
        }
        ping[..4].copy_from_slice(&round.to_be_bytes());
        let started = Instant::now();
        tunnel.write_all(&ping).await.unwrap();
        tokio::time::timeout(STEP, tunnel.read_exact(&mut pong))
            .await
            .expect("the pong arrives")
            .unwrap();
        round_trips.push(started.elapsed());
        assert_eq!(pong, ping, "round {round}");
    }
    assert_eq!(s.agent_metric(RESUMES_AGENT).await, 6.0);
    let mut pauses: Vec<Duration> = cut_rounds.iter().map(|&i| round_trips[i]).collect();
    pauses.sort_unstable();
    let mut all = round_trips.clone();
    all.sort_unstable();
    eprintln!(
        "ping-pong across 6 cuts: the round trip at a cut p50 {:?}, max {:?}; all rounds p50 {:?}",
        pauses[pauses.len() / 2],
        pauses[pauses.len() - 1],
        all[all.len() / 2]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_hundred_connections_all_survive_a_cut() {
    let _serial = SERIAL.lock().await;
    let s = Setup::start(Duration::from_secs(30)).await;
    let mut tunnels = Vec::new();
    for _ in 0..200 {
        tunnels.push(s.client.dial(&s.echo.addr.to_string()).await.unwrap());
    }
    async fn exchange(tunnels: &mut [tether_client::TunnelStream], seed: u64) {
        for (i, t) in tunnels.iter_mut().enumerate() {
            let data = tether_testkit::targets::pattern(seed + i as u64, 1024);
            t.write_all(&data).await.unwrap();
        }
        for (i, t) in tunnels.iter_mut().enumerate() {
            read_pattern(
                t,
                seed + i as u64,
                &format!("connection {i} after seed {seed}"),
            )
            .await;
        }
    }
    /// Reads back the 1 KiB pattern of `seed` and checks it.
    async fn read_pattern(t: &mut tether_client::TunnelStream, seed: u64, what: &str) {
        let data = tether_testkit::targets::pattern(seed, 1024);
        let mut got = vec![0u8; data.len()];
        tokio::time::timeout(STEP, t.read_exact(&mut got))
            .await
            .expect("echo in time")
            .unwrap();
        assert!(got == data, "{what}");
    }
    exchange(&mut tunnels, 1).await;
    assert_eq!(
        s.agent_metric("konnectivity_network_proxy_agent_open_endpoint_connections")
            .await,
        200.0
    );
    // Half of them have bytes in flight when the stream is cut, and the agent cannot
    // reconnect at once: both ends hold every connection, suspended.
    s.relay.set_refusing(true);
    for (i, t) in tunnels.iter_mut().enumerate().step_by(2) {
        t.write_all(&tether_testkit::targets::pattern(1000 + i as u64, 1024))
            .await
            .unwrap();
    }
    s.relay.cut().await;
    eventually("both ends suspended all 200 connections", || async {
        s.agent_metric("tether_agent_suspended_connections").await == 200.0
            && s.server_metric("tether_server_suspended_connections").await == 200.0
    })
    .await;
    let replay = (
        s.server_metric("tether_server_suspended_replay_bytes")
            .await,
        s.agent_metric("tether_agent_suspended_replay_bytes").await,
    );
    eprintln!(
        "200 suspended connections (100 with 1 KiB in flight): replay logs hold {} bytes on the server, {} on the agent: {:.0} and {:.0} bytes per connection",
        replay.0,
        replay.1,
        replay.0 / 200.0,
        replay.1 / 200.0
    );
    // What was unacknowledged at the cut is at most the 100 KiB in flight, each way.
    assert!(
        replay.0 <= 100.0 * 1024.0 && replay.1 <= 100.0 * 1024.0,
        "{replay:?}"
    );
    let before = s.agent_metric(RESUMES_AGENT).await;
    s.relay.set_refusing(false);
    eventually("the agent resumed the stream", || async {
        s.agent_metric(RESUMES_AGENT).await > before
    })
    .await;
    for (i, t) in tunnels.iter_mut().enumerate().step_by(2) {
        read_pattern(
            t,
            1000 + i as u64,
            &format!("connection {i}'s bytes in flight at the cut"),
        )
        .await;
    }
    exchange(&mut tunnels, 2).await;
    assert_eq!(
        s.server_metric("konnectivity_network_proxy_server_established_connections")
            .await,
        200.0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_that_lost_the_stream_ends_its_connections_at_once() {
    let _serial = SERIAL.lock().await;
    let mut s = Setup::start(Duration::from_secs(30)).await;
    // The destination is a listener here, to see when the agent lets go of it.
    let target = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let tunnel = s
        .client
        .dial(&target.local_addr().unwrap().to_string())
        .await
        .unwrap();
    let (mut far_end, _) = target.accept().await.unwrap();
    // The server goes away while the agent cannot reach it; a new one (same ID, same
    // port, none of the old one's state) takes its place.
    s.relay.set_refusing(true);
    s.relay.cut().await;
    let agent_addr = s.server.agent_addr;
    drop(tunnel);
    s.server.stop().await;
    s.server = TestServer::start(
        &s.pki,
        ServerOptions {
            agent_addr: Some(agent_addr),
            ..Default::default()
        },
    )
    .await
    .unwrap();
    let back = Instant::now();
    s.relay.set_refusing(false);
    let mut buf = [0u8; 1];
    let read = tokio::time::timeout(STEP, far_end.read(&mut buf))
        .await
        .expect("the agent closes the destination connection");
    assert!(matches!(read, Ok(0) | Err(_)), "{read:?}");
    let took = back.elapsed();
    assert!(
        took < Duration::from_secs(15),
        "the agent held the connection {took:?}, as if waiting out its 30 s window"
    );
    assert_eq!(
        s.agent_metric("tether_agent_resume_failures_total{reason=\"unknown_session\"}")
            .await,
        1.0
    );
    s.server.wait_ready().await.unwrap();
}

/// A setup whose server's one control-plane endpoint is an echo server (kept alive by the
/// caller), and the agent's TCP control-plane listener's address.
async fn with_control_plane() -> (Setup, EchoServer, String) {
    let endpoint = EchoServer::start().await.unwrap();
    let s = Setup::start_with(
        ServerOptions {
            control_plane: ControlPlaneEndpoints::new(vec![endpoint.addr.to_string()]),
            ..Default::default()
        },
        AgentOptions {
            control_plane: Some(ControlPlaneConfig {
                listen: ListenAddr::Tcp("127.0.0.1:0".parse().unwrap()),
                endpoint: String::new(),
                max_connections: 10,
                protocol: ControlPlaneProtocol::Tcp,
            }),
            ..Default::default()
        },
    )
    .await;
    let listen = s.agent.control_plane_addr.clone().unwrap();
    (s, endpoint, listen)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_control_plane_connection_from_the_node_survives_a_cut() {
    let _serial = SERIAL.lock().await;
    let (s, _endpoint, listen) = with_control_plane().await;
    let stream = TcpStream::connect(&listen).await.unwrap();
    // A long-lived stream, as a watch is: 64 MiB echoed, cut twice on the way.
    let progress = Arc::new(AtomicU64::new(0));
    let transfer = tokio::spawn(echo_pattern(stream, 64 << 20, progress.clone()));
    for point in [16 << 20, 40 << 20] {
        eventually("the transfer reaches the cut point", || async {
            progress.load(Ordering::Relaxed) >= point
        })
        .await;
        s.cut_and_wait().await;
    }
    tokio::time::timeout(Duration::from_secs(120), transfer)
        .await
        .expect("the transfer ends")
        .expect("byte-exact both ways");
}

/// Found by the soak: a node's connection made while the agent's only stream was suspended
/// was refused at once (reset), though the stream came back within the resume window.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_control_plane_connection_made_during_a_cut_waits_for_the_resume() {
    let _serial = SERIAL.lock().await;
    let (s, _endpoint, listen) = with_control_plane().await;
    // Cut, and keep the link down for a second: the agent's stream stays suspended.
    s.relay.set_refusing(true);
    s.relay.cut().await;
    s.wait_ready_backends(0, "the server saw the stream break")
        .await;
    let stream = TcpStream::connect(&listen).await.unwrap();
    let progress = Arc::new(AtomicU64::new(0));
    let transfer = tokio::spawn(echo_pattern(stream, 64 << 10, progress));
    tokio::time::sleep(Duration::from_secs(1)).await;
    s.relay.set_refusing(false);
    tokio::time::timeout(Duration::from_secs(30), transfer)
        .await
        .expect("the transfer ends")
        .expect("carried once the stream resumed, byte-exact");
    s.cut_settled().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dials_racing_a_cut_all_succeed() {
    let _serial = SERIAL.lock().await;
    let s = Setup::start(Duration::from_secs(30)).await;
    let target = s.echo.addr.to_string();
    let mut carried = 0;
    for round in 0..20u64 {
        // The DIAL_REQ or its answer is in flight (or just through) when the stream breaks.
        let dial = s.client.dial(&target);
        let cut = async {
            tokio::time::sleep(Duration::from_micros(round * 150)).await;
            s.relay.cut().await;
        };
        let (tunnel, ()) = tokio::join!(dial, cut);
        match tunnel {
            Ok(tunnel) => {
                echo_once(tunnel, round).await;
                carried += 1;
            }
            // A dial that reached the server after the break finds no live stream, by design
            // (new dials skip a suspended one); one already sent is never lost.
            Err(tether_client::DialError::NoAgent) => {}
            Err(e) => panic!("dial {round} failed across a cut: {e}"),
        }
        s.cut_settled().await;
    }
    assert!(carried >= 10, "only {carried} of 20 dials were carried");
    assert!(
        no_resume_failure(&s.agent.metrics().await.unwrap()),
        "every cut was resumed"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forged_or_malformed_resume_never_touches_another_agents_stream() {
    use tether_grpc::{Code, GrpcError};
    use tether_proto::metadata;

    let _serial = SERIAL.lock().await;
    let s = Setup::start(Duration::from_secs(30)).await;
    let mut tunnel = s.echoed_tunnel(1).await;
    // The real agent's stream is suspended: it cannot reach the server.
    s.cut_and_hold_off().await;
    // Another agent (same CA, another agent ID) guesses tokens and sends junk.
    let channel = s.server.agent_channel(&s.pki).await.unwrap();
    let connect = async |resume_from: &str| {
        bare_stream(&channel, "intruder", Some(resume_from))
            .await
            .map(|(headers, ..)| headers)
    };
    let guessed = format!("{}:0", "0123456789abcdef".repeat(2));
    let headers = connect(&guessed)
        .await
        .expect("a new stream, not a refusal");
    assert!(
        headers.get(metadata::TETHER_RESUMED).is_none(),
        "a guessed token resumed nothing"
    );
    assert!(headers.get(metadata::TETHER_RESUME).is_some());
    for junk in ["nonsense", "abc:1", &format!("{}:x", "ab".repeat(16))] {
        match connect(junk).await {
            Err(GrpcError::Status(status)) => {
                assert_eq!(status.code, Code::INVALID_ARGUMENT, "{junk:?}: {status:?}");
            }
            other => panic!("{junk:?} was not refused: {other:?}"),
        }
    }
    // The real agent resumes its stream as if nothing happened.
    s.relay.set_refusing(false);
    eventually("the agent resumed", || async {
        s.agent_metric(RESUMES_AGENT).await == 1.0
    })
    .await;
    tunnel = echo_once(tunnel, 2).await;
    drop(tunnel);
    assert!(no_resume_failure(&s.server.metrics().await.unwrap()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resume_the_log_cannot_serve_never_ends_a_stream_that_works() {
    use tether_grpc::{Code, GrpcError};
    use tether_proto::{Packet, metadata};

    let _serial = SERIAL.lock().await;
    tether_testkit::init_logging();
    let pki = tether_testkit::Pki::generate().unwrap();
    let server = TestServer::start(
        &pki,
        ServerOptions {
            resume_window: Duration::from_secs(30),
            ..Default::default()
        },
    )
    .await
    .unwrap();
    // A bare agent stream that offers resumes: the server answers with its token.
    let channel = server.agent_channel(&pki).await.unwrap();
    let (headers, _tx, mut rx) = bare_stream(&channel, "bare", None).await.unwrap();
    let token = headers
        .get(metadata::TETHER_RESUME)
        .expect("a resumable stream")
        .to_str()
        .unwrap()
        .to_owned();
    // A second connection asks to continue it, counting packets the server never sent: an
    // agent's request made before its stream moved on would be as far off.
    match bare_stream(&channel, "bare", Some(&format!("{token}:7"))).await {
        Err(GrpcError::Status(status)) => {
            assert_eq!(status.code, Code::FAILED_PRECONDITION, "{status:?}");
            assert!(
                status
                    .message
                    .contains("goes on over its current connection"),
                "{status:?}"
            );
        }
        other => panic!("the request was not refused: {:?}", other.map(|(h, ..)| h)),
    }
    // The stream still carries the next dial.
    let client = GrpcClient::connect(&Transport::Unix(server.uds.clone().unwrap()))
        .await
        .unwrap();
    let dial = tokio::spawn(async move { client.dial("127.0.0.1:9").await.map(drop) });
    let packet = tokio::time::timeout(STEP, rx.next())
        .await
        .expect("the server writes on the stream")
        .expect("the stream is open")
        .expect("a packet");
    assert!(matches!(packet, Packet::DialRequest { .. }), "{packet:?}");
    assert!(no_resume_failure(&server.metrics().await.unwrap()));
    dial.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_that_restarted_ends_its_old_streams_connections_at_once() {
    let _serial = SERIAL.lock().await;
    let s = Setup::start(Duration::from_secs(30)).await;
    let mut tunnel = s.echoed_tunnel(1).await;
    // The stream breaks, and the agent goes away before it can resume it.
    s.cut_and_hold_off().await;
    s.agent.stop().await;
    // The agent comes back (same ID, none of its old state) and connects directly.
    let restarted = Instant::now();
    let agent = TestAgent::start(
        &s.pki,
        s.server.agent_addr,
        AgentOptions {
            agent_id: AGENT_ID.into(),
            ..Default::default()
        },
    )
    .await
    .unwrap();
    ends_with_error(&mut tunnel).await;
    let took = restarted.elapsed();
    assert!(
        took < Duration::from_secs(15),
        "the server held the old stream {took:?}, as if waiting out its 30 s window"
    );
    let text = s.server.metrics().await.unwrap();
    assert_eq!(
        metric_value(
            &text,
            "tether_server_resume_failures_total{reason=\"unknown_session\"}"
        ),
        Some(1.0)
    );
    agent.wait_ready().await.unwrap();
    let t = s.client.dial(&s.echo.addr.to_string()).await.unwrap();
    echo_once(t, 2).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_draining_agents_broken_stream_is_not_waited_for() {
    let _serial = SERIAL.lock().await;
    let s = Setup::start(Duration::from_secs(30)).await;
    let mut tunnel = s.echoed_tunnel(1).await;
    // The agent says it is going away (a SIGTERM), then its stream breaks (its exit).
    s.agent.drain();
    eventually("the server knows the agent is draining", || async {
        let agents = tether_testkit::http::get(s.server.admin_addr, "/debug/agents").await;
        agents.is_ok_and(|(_, body)| body.replace([' ', '\n'], "").contains("\"draining\":true"))
    })
    .await;
    s.relay.set_refusing(true);
    let cut_at = Instant::now();
    s.relay.cut().await;
    ends_with_error(&mut tunnel).await;
    let took = cut_at.elapsed();
    assert!(
        took < Duration::from_secs(15),
        "the server held a draining agent's connection {took:?}, as if to resume it"
    );
    assert_eq!(s.server_metric("tether_server_resumes_total").await, 0.0);
    assert!(no_resume_failure(&s.server.metrics().await.unwrap()));
}
